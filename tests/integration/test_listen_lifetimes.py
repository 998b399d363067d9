"""Lifetimes found by a hostile review: subscriptions/listen streams under hang-ups, readers
that never read, a drain and shutdown (no leak, no crash, the result where one is promised),
and a session kernel's death judged by the cgroup counters since its last call, not its
life's (README, docs/protocol.md)."""
import json
import os
import signal
import threading
import time

import pytest

from test_cgroups import FORKS_FOUR_60M, cg_available  # noqa: F401  (the fixture)
from test_protocol_2026 import make_http  # noqa: F401  (the fixture)
from test_protocol_2026 import MODERN, SUB, _next_message, _open_listen, listen_msg, modern_msg, mirrored
from test_http import ACCEPT_BOTH
from conftest import kill_kernels_from_outside, processes_with_marker, wait_until


def text(res):
    return res["content"][0]["text"]


def start(make_server, *args):
    s = make_server("--prestart", "off", *args)
    s.initialize()
    return s


# ---------------------------------------------------------------- stale cgroup counters


def test_kernel_death_after_an_earlier_oom_is_not_blamed_on_the_memory_limit(cg_available, make_server):
    """A call whose children the OOM killer took says so (83b8a93); a *later* call whose
    kernel simply exits must not: the death path reads the kernel's lifetime counters
    (sbx_cgroup_run_collect: oom_kill > 0), not the call's difference."""
    s = start(make_server, "--memory-limit", "160M")
    res = s.execute("keep = 1", session="new")
    sid = res["structuredContent"]["session"]["id"]
    res = s.execute(FORKS_FOUR_60M, session=sid, timeout_seconds=60)
    assert res["structuredContent"]["limit"] == "memory", text(res)
    res = s.execute("import os\nos._exit(3)", session=sid, timeout_seconds=60)
    sc = res["structuredContent"]
    assert sc["limit"] != "memory", text(res)
    assert "out-of-memory" not in text(res) and "exited with code 3" in text(res), text(res)


def test_kernel_death_between_calls_after_an_earlier_oom_is_not_blamed_on_it(cg_available, make_server):
    s = start(make_server, "--memory-limit", "160M")
    res = s.execute("keep = 1", session="new")
    sid = res["structuredContent"]["session"]["id"]
    res = s.execute(FORKS_FOUR_60M, session=sid, timeout_seconds=60)
    assert res["structuredContent"]["limit"] == "memory", text(res)
    # the kernel is killed after the call answered (between calls it is frozen: nothing of
    # its own can end it then; the OOM killer or an operator can)
    s.execute("x = 1", session=sid)
    kill_kernels_from_outside(s.proc.pid)
    res = s.execute("print('next')", session=sid)
    assert "killed by signal 9" in text(res) and "out-of-memory" not in text(res), text(res)


# ---------------------------------------------------------------- listen and the drain


def _post_async(s, msg, headers=None):
    c = s.connect()
    c.request("POST", "/mcp", json.dumps(msg).encode(),
              {"Accept": ACCEPT_BOTH, "Content-Type": "application/json",
               "MCP-Protocol-Version": MODERN, **mirrored(msg), **(headers or {})})
    return c


def _marked(marker, seconds):
    """A script that sleeps, with a child whose command line carries marker (found by
    processes_with_marker) sleeping as long."""
    return (f"import subprocess, sys, time\n"
            f"subprocess.Popen([sys.executable, '-c', 'import time; time.sleep({seconds})', '{marker}'])\n"
            f"time.sleep({seconds})\n")


def _readyz(s):
    return s.request("GET", "/readyz")[0]


def test_http_listen_opened_during_the_drain_is_refused_as_new_work(make_http):
    """docs/protocol.md: a listen stream ends "with its result ... when the server drains".
    One asked for once the drain has begun could only be cut off at once, so it is refused
    like a new call (routes.c starts_work): 503 with Retry-After and its id, while the call
    that holds the drain still finishes."""
    s = make_http("--drain-seconds", "30", "--prestart", "off")
    marker = "mps-listen-drain-%d" % os.getpid()
    call = modern_msg(1, "tools/call", {"name": "execute_python",
                                        "arguments": {"details": True, "script": _marked(marker, 4)}})
    busy = _post_async(s, call)
    assert wait_until(lambda: processes_with_marker(marker), timeout=30)  # the call runs
    s.proc.send_signal(signal.SIGTERM)
    assert wait_until(lambda: _readyz(s) == 503, timeout=10)  # the drain has begun
    msg = listen_msg("late", resourcesListChanged=True)
    c = s.connect()
    c.request("POST", "/mcp", json.dumps(msg).encode(),
              {"Accept": ACCEPT_BOTH, "Content-Type": "application/json",
               "MCP-Protocol-Version": MODERN, **mirrored(msg)})
    r = c.getresponse()
    body = r.read()
    assert r.status == 503 and int(r.getheader("Retry-After")) >= 1, (r.status, body)
    assert json.loads(body)["id"] == "late", body
    c.close()
    r = busy.getresponse()
    assert r.status == 200 and b"isError" in r.read()
    busy.close()
    assert s.proc.wait(timeout=60) == 0


# ---------------------------------------------------------------- lifetimes (ASan build)

from test_protocol_2026 import ALICE, BOB, WRITES_ARTIFACT, mpost, tokens  # noqa: E402,F401
import socket  # noqa: E402


def _raw_listen(s, req_id, headers):
    """A listen POST on a raw socket that never reads (a tiny receive buffer)."""
    msg = listen_msg(req_id, resourcesListChanged=True)
    body = json.dumps(msg).encode()
    hdrs = {"Host": f"127.0.0.1:{s.port}", "Accept": ACCEPT_BOTH, "Content-Type": "application/json",
            "MCP-Protocol-Version": MODERN, "Content-Length": str(len(body)), **mirrored(msg), **headers}
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1024)
    sock.connect(("127.0.0.1", s.port))
    sock.sendall(b"POST /mcp HTTP/1.1\r\n" + b"".join(f"{k}: {v}\r\n".encode() for k, v in hdrs.items())
                 + b"\r\n" + body)
    return sock


def test_http_listen_hangups_readers_that_never_read_and_a_drain(make_http, tokens):  # noqa: F811
    s = make_http("--auth-token-file", tokens, "--profile", "lan", "--no-warm-cache",
                  "--drain-seconds", "10")
    streams = [_open_listen(s, f"a{i}", ALICE, resourcesListChanged=True) for i in range(6)]
    for c, ev in streams:
        assert _next_message(ev)["method"] == "notifications/subscriptions/acknowledged"
    cb, eb = _open_listen(s, "b", BOB, resourcesListChanged=True)
    assert _next_message(eb)["params"]["_meta"][SUB] == "b"
    deaf = [_raw_listen(s, f"deaf{i}", ALICE) for i in range(2)]
    # the deaf ones are real listeners: alice is at her cap of eight, and a ninth ends her
    # oldest idle stream (a0) with its result instead of being refused
    c9, e9 = _open_listen(s, "ninth", ALICE, resourcesListChanged=True)
    assert _next_message(e9)["params"]["_meta"][SUB] == "ninth"
    end = _next_message(streams[0][1])
    assert end and end.get("id") == "a0" and "result" in end, end
    call = lambda i: mpost(s, modern_msg(100 + i, "tools/call", {  # noqa: E731
        "name": "execute_python", "arguments": {"details": True, "script": WRITES_ARTIFACT}}), headers=ALICE)
    # hang up half of alice's streams while her runs send on them
    threads = [threading.Thread(target=call, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for c, _ in streams[:3]:
        c.sock.shutdown(socket.SHUT_RDWR)
        c.close()
    for t in threads:
        t.join()
    for i in range(4, 30):
        st, _, body = call(i)
        assert st == 200, body
    # bob heard nothing of alice's runs
    cb.sock.settimeout(1)
    try:
        n = _next_message(eb)
    except Exception:
        n = None
    assert n is None or n.get("params", {}).get("_meta", {}).get(SUB) == "b", n
    # a drain with streams open, two of them never read
    s.proc.send_signal(signal.SIGTERM)
    for c, ev in streams[3:]:
        while True:
            m = _next_message(ev)
            if m is None or "id" in m:
                break
        assert m and m["id"].startswith("a") and "result" in m, m
    assert s.proc.wait(timeout=60) == 0
    for d in deaf:
        d.close()
    cb.close()
    c9.close()


@pytest.mark.parametrize("sig", [signal.SIGINT, "twice"])
def test_http_shutdown_with_listen_streams_open(make_http, tokens, sig):  # noqa: F811
    """Shutdown at once (SIGINT, or a second SIGTERM during the drain) with listen streams
    open, one of them never read and one opened during the drain, and a call running: the
    server exits 0 at once (not after the drain's 60 s: it waits on nothing of theirs), every
    stream read to its end ends, and the call's processes are gone (make_http: no sanitizer
    report)."""
    s = make_http("--auth-token-file", tokens, "--profile", "lan", "--no-warm-cache",
                  "--drain-seconds", "60", "--prestart", "off")
    streams = [_open_listen(s, f"a{i}", ALICE, resourcesListChanged=True) for i in range(4)]
    for c, ev in streams:
        assert _next_message(ev)["method"] == "notifications/subscriptions/acknowledged"
    deaf = _raw_listen(s, "deaf", BOB)
    marker = "mps-listen-shutdown-%d-%s" % (os.getpid(), "twice" if sig == "twice" else "int")
    busy = _post_async(s, modern_msg(1, "tools/call", {"name": "execute_python",
                                                       "arguments": {"details": True, "script": _marked(marker, 60)}}),
                       headers=ALICE)
    assert wait_until(lambda: processes_with_marker(marker), timeout=30)  # the call runs
    if sig == "twice":
        s.proc.send_signal(signal.SIGTERM)
        assert wait_until(lambda: _readyz(s) == 503, timeout=10)  # the drain has begun
        # a listen asked for during the drain (refused: 503), then the second SIGTERM
        late = _raw_listen(s, "late", ALICE)
        s.proc.send_signal(signal.SIGTERM)
    else:
        s.proc.send_signal(sig)
    # At once: the one upper bound here is the feature (a drain would wait 60 s for the call).
    assert s.proc.wait(timeout=30) == 0
    for c, ev in streams:
        while _next_message(ev) is not None:
            pass
        c.close()
    assert wait_until(lambda: not processes_with_marker(marker), timeout=10)
    deaf.close()
    busy.close()
    if sig == "twice":
        late.close()


def test_stdio_listen_cancel_reuse_and_eof(make_server):
    s = make_server()
    for round_ in range(3):
        s.send(listen_msg("L", resourcesListChanged=True))
        assert s.recv(timeout=30)["params"]["_meta"][SUB] == "L"
        # the id is in flight: a request reusing it is refused with that id
        s.send(modern_msg("L", "tools/list"))
        r = s.recv_response("L", timeout=30)
        assert r["error"]["code"] == -32600, r
        s.send({"jsonrpc": "2.0", "method": "notifications/cancelled", "params": {"requestId": "L"}})
        s.send({"jsonrpc": "2.0", "method": "notifications/cancelled", "params": {"requestId": "L"}})
    for i in range(8):
        s.send(listen_msg(f"k{i}", resourcesListChanged=True))
        s.recv(timeout=30)
    s.send(modern_msg(2, "tools/call", {"name": "execute_python", "arguments": {"details": True, "script": WRITES_ARTIFACT}}))
    # EOF with eight streams open and a run going


def test_stdio_listen_opened_during_the_drain_ends_with_its_result(make_server):
    s = make_server("--drain-seconds", "30")
    marker = "mps-stdio-listen-drain-%d" % os.getpid()
    s.send(modern_msg(1, "tools/call", {"name": "execute_python",
                                        "arguments": {"details": True, "script": _marked(marker, 3)}}))
    assert wait_until(lambda: processes_with_marker(marker), timeout=30)  # the call runs
    s.proc.send_signal(signal.SIGTERM)
    assert wait_until(lambda: "draining" in s.stderr_text(), timeout=10)  # the drain has begun
    s.send(listen_msg("late", resourcesListChanged=True))
    r = s.recv_response("late", timeout=30)
    assert "result" in r and r["result"]["_meta"][SUB] == "late", r

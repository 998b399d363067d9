"""Background runs (issue 36): execute_python(background: true) answers at once with a
run_id, wait_run(run_id, timeout_seconds) answers the result or "still running" with the new
output, cancel_run(run_id) ends it.  Runs belong to their principal, are bounded, and outlive
the client's session and stream.  In both eras, over stdio and HTTP; and the heartbeat a call
with a progress token hears while its script is silent."""
import json
import os
import re
import signal
import time

import pytest

from conftest import processes_with_marker, wait_until
from test_http import HttpServer, messages, sse_events_from_bytes
from test_tasks import ALICE, BOB, TASKS_VERSION, http_rpc, sleeper, two_tokens  # noqa: F401

MODERN = "2026-07-28"


def start(s, script, **args):
    res = s.call("execute_python", {"script": script, "background": True, **args})
    sc = res["structuredContent"]
    assert res["isError"] is False, res
    assert re.fullmatch(r"[0-9a-f]{32}", sc["run_id"]) and sc["status"] == "running", sc
    assert sc["stdout"] == "" and sc["stderr"] == "" and sc["exit_code"] is None
    assert "wait_run" in res["content"][0]["text"]
    return sc["run_id"]


def wait(s, run_id, timeout_seconds=30, **kw):
    return s.call("wait_run", {"run_id": run_id, "timeout_seconds": timeout_seconds}, timeout=90, **kw)


def test_background_then_wait_gives_the_same_result(server):

    rid = start(server, "import sys\nprint('out')\nprint('err', file=sys.stderr)\n")
    res = wait(server, rid)
    sc = res["structuredContent"]
    assert sc["status"] == "completed" and sc["run_id"] == rid
    assert sc["stdout"] == "out\n" and sc["stderr"] == "err\n" and sc["exit_code"] == 0
    plain = server.call("execute_python", {"script": "print('out')"})["structuredContent"]
    assert set(plain) | {"run_id", "status"} == set(sc)
    assert "--- stdout ---\nout\n" in res["content"][0]["text"]
    # A finished run answers again, the same.
    assert wait(server, rid, 0)["structuredContent"]["stdout"] == "out\n"
    # An error stays an error result.
    rid = start(server, "1/0")
    res = wait(server, rid)
    assert res["isError"] is True and "ZeroDivisionError" in res["structuredContent"]["error"]


def test_still_running_answers_the_new_output_then_cancel(server):

    marker = f"mps-run-{time.monotonic_ns()}"
    rid = start(server, "import time\nprint('tick 1', flush=True)\n" + sleeper(marker), timeout_seconds=120)
    seen = ""
    deadline = time.monotonic() + 60
    while "tick 1" not in seen and time.monotonic() < deadline:
        res = wait(server, rid, 1)
        sc = res["structuredContent"]
        assert sc["status"] == "running" and sc["exit_code"] is None and res["isError"] is False
        seen += sc["stdout"]
    assert "tick 1" in seen
    # The output went with that answer: the next one has only what came since.
    assert "tick 1" not in wait(server, rid, 0)["structuredContent"]["stdout"]
    assert wait_until(lambda: processes_with_marker(marker), 30)
    res = server.call("cancel_run", {"run_id": rid})
    assert res["isError"] is False and res["structuredContent"]["status"] == "cancelled"
    assert wait_until(lambda: not processes_with_marker(marker), 15)
    res = wait(server, rid, 0)
    assert res["isError"] is True and res["structuredContent"]["status"] == "cancelled"
    assert "cancel_run" in res["structuredContent"]["error"]
    # Cancelling again says it had ended.
    res = server.call("cancel_run", {"run_id": rid})
    assert "already ended" in res["content"][0]["text"]


def test_a_wait_that_is_cancelled_leaves_the_run(server):

    rid = start(server, "import time\ntime.sleep(3)\nprint('done')", timeout_seconds=60)
    server.send({"jsonrpc": "2.0", "id": 500, "method": "tools/call",
                 "params": {"name": "wait_run", "arguments": {"run_id": rid, "timeout_seconds": 50}}})
    server.notify("notifications/cancelled", {"requestId": 500})
    assert wait(server, rid)["structuredContent"]["stdout"] == "done\n"


def test_unknown_and_bad_run_ids(server):

    for tool in ("wait_run", "cancel_run"):
        res = server.call(tool, {"run_id": "0" * 32})
        assert res["isError"] is True and "Unknown run_id" in res["content"][0]["text"]
        res = server.call(tool, {})
        assert res["isError"] is True and "run_id" in res["content"][0]["text"]
    res = server.call("execute_python", {"script": "pass", "background": "yes"})
    assert res["isError"] is True and "'background' must be true or false" in res["content"][0]["text"]


def test_runs_are_bounded_per_principal(make_server):
    s = make_server("--max-tasks-per-principal", "2")
    s.initialize()
    for _ in range(2):
        start(s, "import time\ntime.sleep(60)", timeout_seconds=120)
    res = s.call("execute_python", {"script": "pass", "background": True})
    assert res["isError"] is True and "runs and tasks already" in res["content"][0]["text"]


def test_progress_heartbeat_during_a_silent_stretch(server):
    # 12 s without output: a client that resets its timeout on progress hears one (every 10 s).

    res = server.call("execute_python", {"script": "import time\ntime.sleep(12)\nprint('end')",
                                         "timeout_seconds": 60}, progress_token="hb", timeout=90)
    assert res["structuredContent"]["stdout"] == "end\n"
    beats = [n for n in server.notifications if n["method"] == "notifications/progress"
             and n["params"]["progressToken"] == "hb" and n["params"].get("message") == "still running"]
    assert beats, server.notifications


def test_tasks_and_background_share_the_principals_bound(make_server):
    # A background run is a task of its principal's: tasks/list shows it (handshake era, 2025-11-25).
    s = make_server()
    s.initialize(TASKS_VERSION)
    rid = start(s, "print(1)")
    assert wait(s, rid)["structuredContent"]["stdout"] == "1\n"
    ids = [t["taskId"] for t in s.request("tasks/list")["result"]["tasks"]]
    assert rid in ids


# ================================================================ HTTP, two principals

@pytest.fixture
def http2(two_tokens):  # noqa: F811
    h = HttpServer("--auth-token-file", two_tokens, "--no-warm-cache", "--kill-grace-seconds", "1")
    yield h
    assert h.close() == 0


def http_call(h, sid, auth, req_id, name, args):
    r = http_rpc(h, sid, auth, req_id, "tools/call", {"name": name, "arguments": args})
    return r["result"]


def test_http_run_outlives_its_session_and_is_its_principals(http2):
    h = http2
    a1 = h.initialize(TASKS_VERSION, headers=ALICE)
    res = http_call(h, a1, ALICE, 1, "execute_python",
                    {"script": "import time\ntime.sleep(2)\nprint('alice')", "background": True})
    rid = res["structuredContent"]["run_id"]
    # Alice's session ends; Bob does not see her run; her next session does.
    st, _, _ = h.request("DELETE", "/mcp", headers={**ALICE, "Mcp-Session-Id": a1})
    assert st in (200, 204)
    b = h.initialize(TASKS_VERSION, headers=BOB)
    for tool in ("wait_run", "cancel_run"):
        res = http_call(h, b, BOB, 2, tool, {"run_id": rid, "timeout_seconds": 0})
        assert res["isError"] is True and "Unknown run_id" in res["content"][0]["text"]
    a2 = h.initialize(TASKS_VERSION, headers=ALICE)
    res = http_call(h, a2, ALICE, 3, "wait_run", {"run_id": rid, "timeout_seconds": 30})
    assert res["structuredContent"]["stdout"] == "alice\n"


def test_a_removed_tokens_background_runs_end_with_it(two_tokens):  # noqa: F811
    """A token removed from the token file (SIGHUP) leaves nothing running: its principal's
    background runs outlive their requests and sessions, so the reload cancels them (their
    scripts killed); a token that stays keeps its runs."""
    h = HttpServer("--auth-token-file", two_tokens, "--no-warm-cache", "--kill-grace-seconds", "1")
    try:
        marker = f"mps-revoked-{os.getpid()}"
        a = h.initialize(TASKS_VERSION, headers=ALICE)
        b = h.initialize(TASKS_VERSION, headers=BOB)
        script = ("import subprocess, sys, time\n"
                  f"subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(300)', '{marker}'])\n"
                  "time.sleep(300)")
        ra = http_call(h, a, ALICE, 1, "execute_python", {"script": script, "background": True, "timeout_seconds": 300})
        rb = http_call(h, b, BOB, 2, "execute_python",
                       {"script": "import time\ntime.sleep(3)\nprint('bob')", "background": True})
        assert wait_until(lambda: processes_with_marker(marker), timeout=30)
        with open(two_tokens, "w") as f:
            f.write("bob: tok-bob-9876543210\n")
        h.proc.send_signal(signal.SIGHUP)
        assert wait_until(lambda: not processes_with_marker(marker), timeout=30), processes_with_marker(marker)
        res = http_call(h, b, BOB, 3, "wait_run", {"run_id": rb["structuredContent"]["run_id"], "timeout_seconds": 30})
        assert res["structuredContent"]["stdout"] == "bob\n", res
        # Alice's name back with a new token: her run is there, cancelled, saying why.
        with open(two_tokens, "w") as f:
            f.write("alice: tok-alice-new-0123456789\nbob: tok-bob-9876543210\n")
        h.proc.send_signal(signal.SIGHUP)
        new = {"Authorization": "Bearer tok-alice-new-0123456789"}
        assert wait_until(lambda: h.post({"jsonrpc": "2.0", "id": 0, "method": "ping"}, None, headers=new,
                                         version=TASKS_VERSION)[0] != 401, timeout=10)
        a2 = h.initialize(TASKS_VERSION, headers=new)
        res = http_call(h, a2, new, 4, "wait_run", {"run_id": ra["structuredContent"]["run_id"], "timeout_seconds": 5})
        assert "cancel" in json.dumps(res).lower() and "token was removed" in json.dumps(res), res
    finally:
        h.close()


def test_modern_era_background_and_wait(http2):
    h = http2

    def post(req_id, name, args, auth=ALICE):
        p = {"name": name, "arguments": args,
             "_meta": {"io.modelcontextprotocol/protocolVersion": MODERN,
                       "io.modelcontextprotocol/clientCapabilities": {}}}
        st, hd, body = h.post({"jsonrpc": "2.0", "id": req_id, "method": "tools/call", "params": p},
                              headers={**auth, "Mcp-Method": "tools/call", "Mcp-Name": name}, version=MODERN)
        assert st == 200, body
        if hd.get("content-type", "").startswith("text/event-stream"):
            return [m for m in messages(sse_events_from_bytes(body)) if m.get("id") == req_id][0]["result"]
        return json.loads(body)["result"]
    r = post(1, "execute_python", {"script": "import time\ntime.sleep(1)\nprint('modern')", "background": True})
    assert r["resultType"] == "complete"
    rid = r["structuredContent"]["run_id"]
    assert post(2, "wait_run", {"run_id": rid, "timeout_seconds": 0}, auth=BOB)["isError"] is True
    done = post(3, "wait_run", {"run_id": rid, "timeout_seconds": 30})
    assert done["resultType"] == "complete" and done["structuredContent"]["stdout"] == "modern\n"
    # cancel_run in this era too.
    r = post(4, "execute_python", {"script": "import time\ntime.sleep(60)", "background": True,
                                   "timeout_seconds": 120})
    rid = r["structuredContent"]["run_id"]
    assert post(5, "cancel_run", {"run_id": rid})["structuredContent"]["status"] == "cancelled"
    assert post(6, "wait_run", {"run_id": rid, "timeout_seconds": 0})["structuredContent"]["status"] == "cancelled"


# ================================================================ handshake era: a closed stream cancels

def test_handshake_http_closed_stream_cancels_the_call(http2):
    """The AI SDK's abort only closes the request's stream (it sends no notifications/cancelled):
    in the handshake era over HTTP that cancels the call too once no resumption comes (issue 36, 4)."""
    import socket
    from test_http import wait_for_progress
    h = http2
    sid = h.initialize(TASKS_VERSION, headers=ALICE)
    marker = f"mps-abort-{time.monotonic_ns()}"
    msg = {"jsonrpc": "2.0", "id": 9, "method": "tools/call",
           "params": {"name": "execute_python", "_meta": {"progressToken": "p"},
                      "arguments": {"script": "print('go', flush=True)\n" + sleeper(marker),
                                    "timeout_seconds": 120}}}
    c, resp = h.open_stream(msg, sid, headers={**ALICE, "MCP-Protocol-Version": TASKS_VERSION})
    assert wait_for_progress(resp, "go")
    assert wait_until(lambda: processes_with_marker(marker), 30)
    c.sock.shutdown(socket.SHUT_RDWR)
    c.close()
    assert wait_until(lambda: not processes_with_marker(marker), 30)
    # The session goes on.
    r = http_rpc(h, sid, ALICE, 10, "tools/call", {"name": "execute_python", "arguments": {"script": "print(2)"}})
    assert r["result"]["structuredContent"]["stdout"] == "2\n"

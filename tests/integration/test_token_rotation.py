"""A token owns what it opened (issue 28, part 2): a reload (SIGHUP) that removes or changes a
bearer token ends, at once, everything that token opened over HTTP: its subscriptions/listen
streams (an error with the stream's id is their last message; nothing after it), its GET
streams, its handshake sessions (their ids answer 404), its requests waiting on a task (an
error), and what it counted against its principal (listen and GET streams, sessions, unread
bytes), so the principal's new token is not refused.  Tokens the reload keeps keep their
things.  And a listen stream whose client reads nothing ends after a bound (60 s).  Only
127.0.0.1 is ever contacted; the none backend is enough (the transport's)."""
import json
import re
import signal
import socket
import threading
import time

import pytest

from conftest import wait_until
from test_http import ACCEPT_BOTH, LATEST, HttpServer, sse_events
from test_protocol_2026 import (MODERN, SUB, WRITES_ARTIFACT, _next_message, listen_msg, mirrored,
                                modern_msg, mpost)
from test_tenancy import execute, link_of, raw_post, rpc, share, writes

OLD = {"Authorization": "Bearer tok-alice-old-0123456789"}
NEW = {"Authorization": "Bearer tok-alice-new-0123456789"}
BOB = {"Authorization": "Bearer tok-bob-9876543210"}
BOTH = "alice: tok-alice-old-0123456789\nalice: tok-alice-new-0123456789\nbob: tok-bob-9876543210\n"
ROTATED = "alice: tok-alice-new-0123456789\nbob: tok-bob-9876543210\n"


@pytest.fixture
def rotation(tmp_path):
    """A server whose token file holds alice's old and new tokens and bob's; rotate() removes
    alice's old one and sends SIGHUP, and returns once the new file is in force."""
    path = tmp_path / "tokens"
    path.write_text(BOTH)
    made = []

    def make(*args):
        # (alice is the operator too: in_progress reads /metrics with her token)
        s = HttpServer("--auth-token-file", str(path), "--no-warm-cache", "--metrics-token", "alice",
                       *args)
        made.append(s)

        def rotate():
            path.write_text(ROTATED)
            s.proc.send_signal(signal.SIGHUP)
            # the old token is refused from the moment the new file is read
            assert wait_until(lambda: mpost(s, modern_msg(0, "ping"), headers=OLD)[0] == 401, 15)
        s.rotate = rotate
        return s
    yield make
    for s in made:
        assert s.close() == 0


# A stream that should end but does not fails on this read timeout: shorter than the 15 s
# between keep-alive comments, which would otherwise keep the read going for ever.
READ_TIMEOUT = 10


def open_listen(s, req_id, headers, **filt):
    msg = listen_msg(req_id, **filt)
    c = s.connect(timeout=READ_TIMEOUT)
    c.request("POST", "/mcp", json.dumps(msg).encode(),
              {"Accept": ACCEPT_BOTH, "Content-Type": "application/json",
               "MCP-Protocol-Version": MODERN, **mirrored(msg), **headers})
    r = c.getresponse()
    assert r.status == 200 and r.getheader("Content-Type") == "text/event-stream", r.read()[:500]
    events = sse_events(r)
    ack = _next_message(events)
    assert ack["method"] == "notifications/subscriptions/acknowledged" and ack["params"]["_meta"][SUB] == req_id
    return c, events


def rest_of(events):
    """Every message until the stream ends (a stream that does not end fails: its read times out)."""
    got = []
    while True:
        m = _next_message(events)
        if m is None:
            return got
        got.append(m)


def open_get(s, sid, headers):
    c = s.connect(timeout=READ_TIMEOUT)
    c.request("GET", "/mcp", headers={"Accept": "text/event-stream", "Mcp-Session-Id": sid,
                                      "MCP-Protocol-Version": LATEST, **headers})
    r = c.getresponse()
    assert r.status == 200, r.read()
    return c, r


def in_progress(s, auth):
    """Requests in progress (streams included), the one asking among them."""
    st, _, body = s.request("GET", "/metrics", headers=auth)
    assert st == 200, body
    return int(re.search(rb"(?m)^mcp_sandbox_http_connections (\d+)$", body).group(1))


def artifact_call(s, req_id, headers):
    st, _, body = mpost(s, modern_msg(req_id, "tools/call", {"name": "execute_python",
                                                             "arguments": {"script": WRITES_ARTIFACT}}),
                        headers=headers)
    assert st == 200, body


def test_listen_streams_of_a_removed_token_end_and_free_their_places(rotation):
    """Before: the old token's listen streams kept delivering after it was removed (a run's
    notification arrived on them), and its eight kept the principal at its cap, so the new
    token's streams went at the cost of the principal's others."""
    s = rotation()
    old = [open_listen(s, f"old{i}", OLD, resourcesListChanged=True) for i in range(8)]
    # One principal: alice is at her cap of eight, and a ninth (of her new token) ends her
    # oldest idle stream (old0) with its result (issue 36: the newest is not the one refused).
    c9, _ = open_listen(s, "ninth", NEW, resourcesListChanged=True)
    got = rest_of(old[0][1])
    assert got and got[-1]["id"] == "old0" and "result" in got[-1], got
    old[0][0].close()
    old = old[1:]
    c9.close()
    s.rotate()
    artifact_call(s, 1, NEW)
    for i, (c, events) in enumerate(old, 1):
        got = rest_of(events)
        # the end says why, with the stream's id, and nothing follows it
        assert got and got[-1]["id"] == f"old{i}" and "removed" in got[-1]["error"]["message"], got
        assert not [m for m in got if m.get("method")], got
        c.close()
    new = [open_listen(s, f"new{i}", NEW, resourcesListChanged=True) for i in range(8)]
    artifact_call(s, 2, NEW)
    for c, events in new:
        n = _next_message(events)
        assert n["method"] == "notifications/resources/list_changed", n
        c.close()


def test_a_get_stream_of_a_removed_token_ends(rotation):
    s = rotation("--max-streams-per-token", "1")
    sid = s.initialize(headers=OLD)
    c, r = open_get(s, sid, OLD)
    s.rotate()
    assert r.read() is not None  # the stream ends (a stream that stays open times out here)
    c.close()
    # its place is free for the principal's new token
    sid2 = s.initialize(headers=NEW)
    c2, _ = open_get(s, sid2, NEW)
    c2.close()


def test_handshake_sessions_of_a_removed_token_are_deleted(rotation):
    """Before: the old token's sessions (each with a GET stream, so none is idle) stayed, and
    kept the principal's new token at 429 on initialize; their owner could not DELETE them."""
    s = rotation("--max-sessions-per-token", "4")
    sids = [s.initialize(headers=OLD) for _ in range(4)]
    held = [open_get(s, sid, OLD) for sid in sids]
    st, _, body = s.post({"jsonrpc": "2.0", "id": 0, "method": "initialize",
                          "params": {"protocolVersion": LATEST, "capabilities": {}}}, headers=NEW)
    assert st == 429 and "--max-sessions-per-token" in json.loads(body)["error"]["message"], (st, body)
    s.rotate()
    for c, r in held:
        r.read()
        c.close()
    for sid in sids:
        st, _, body = s.post({"jsonrpc": "2.0", "id": 1, "method": "ping"}, sid, headers=NEW, version=LATEST)
        assert st == 404, (st, body)
    mine = s.initialize(headers=NEW)
    assert share(s, mine, NEW)["http"]["sessions"] == 1


def test_unread_bytes_of_a_removed_token_are_freed(rotation):
    """Before: answers the old token's clients never read kept counting against the principal,
    and its new token got 429 on every request."""
    s = rotation("--max-unread-bytes-per-token", "24M")
    sid = s.initialize(headers=OLD)
    uri = link_of(execute(s, sid, OLD, 1, writes("big.bin", 8 << 20, 5)))
    read = json.dumps({"jsonrpc": "2.0", "id": 7, "method": "resources/read", "params": {"uri": uri}}).encode()
    mine = s.initialize(headers=NEW)  # (before: an initialize is refused too once over)
    held, refused = [], []
    for i in range(12):
        status, got = raw_post(s, read, sid, OLD, "text/event-stream" if i % 2 else "application/json")
        (held if status == 200 else refused).append(got)
    assert refused and held, (len(held), len(refused))
    st, _ = rpc(s, mine, NEW, 2, "ping")
    assert st == 429  # one principal: the old token's unread answers count against the new one
    s.rotate()
    st, msg = rpc(s, mine, NEW, 3, "ping")
    assert st == 200 and msg["result"] == {}, (st, msg)
    assert share(s, mine, NEW)["http"]["unread_bytes"] == 0
    # the connections that never read are cut, not kept for ever: no request is in progress but
    # the one asking
    assert wait_until(lambda: in_progress(s, NEW) == 1, 20), in_progress(s, NEW)
    for so in held:
        so.close()


def test_a_request_waiting_on_a_task_gets_an_error(rotation):
    """Before: a tasks/result of the old token waited on after the token was removed, for as
    long as the task ran.  Now it gets a 401 error; the task is the principal's and goes on,
    reachable with the new token."""
    s = rotation("--kill-grace-seconds", "1")
    sid = s.initialize(headers=OLD)
    _, r = rpc(s, sid, OLD, 1, "tools/call", {"name": "execute_python", "task": {"ttl": 60000},
                                              "arguments": {"script": "import time\ntime.sleep(300)\n",
                                                            "timeout_seconds": 600}})
    tid = {"taskId": r["result"]["task"]["taskId"]}
    answer = {}

    def wait():
        answer["got"] = s.post({"jsonrpc": "2.0", "id": 2, "method": "tasks/result", "params": tid}, sid,
                               headers=OLD, version=LATEST)
    t = threading.Thread(target=wait)
    t.start()
    time.sleep(1)  # it waits
    assert t.is_alive()
    s.rotate()
    t.join(20)
    assert not t.is_alive(), "tasks/result of the removed token still waits"
    st, h, body = answer["got"]
    err = json.loads(body)
    assert st == 401 and err["id"] == 2 and "removed" in err["error"]["message"], (st, body)
    mine = s.initialize(headers=NEW)
    st, got = rpc(s, mine, NEW, 3, "tasks/get", tid)
    assert st == 200 and got["result"]["status"] == "working", got
    assert rpc(s, mine, NEW, 4, "tasks/cancel", tid)[1]["result"]["status"] == "cancelled"


def test_a_token_the_reload_keeps_keeps_its_streams(rotation):
    """The reload that ends the old token's streams leaves bob's (unchanged) alone: his listen
    stream hears his next run, his GET stream and session go on."""
    s = rotation()
    cb, eb = open_listen(s, "bob", BOB, resourcesListChanged=True)
    bsid = s.initialize(headers=BOB)
    gc, gr = open_get(s, bsid, BOB)
    ca, ea = open_listen(s, "old", OLD, resourcesListChanged=True)
    s.rotate()
    got = rest_of(ea)
    assert got and got[-1]["id"] == "old" and "error" in got[-1], got
    ca.close()
    artifact_call(s, 1, BOB)
    n = _next_message(eb)
    assert n["method"] == "notifications/resources/list_changed" and n["params"]["_meta"][SUB] == "bob", n
    st, _, _ = s.post({"jsonrpc": "2.0", "id": 2, "method": "ping"}, bsid, headers=BOB, version=LATEST)
    assert st == 200
    # his GET stream is still his: a second one is refused (409), the first still open
    st, _, _ = s.request("GET", "/mcp", headers={"Accept": "text/event-stream", "Mcp-Session-Id": bsid, **BOB})
    assert st == 409
    assert share(s, bsid, BOB)["http"]["streams"] == 1
    cb.close()
    gc.close()


TASKS_EXT = {"io.modelcontextprotocol/clientCapabilities": {"extensions": {"io.modelcontextprotocol/tasks": {}}}}


def test_a_listen_stream_whose_client_reads_nothing_ends(rotation):
    """A listen stream whose client never reads held its connection, its listen place and what
    waited for it for ever (GET streams had no such bound either).  Now an SSE answer whose
    client takes nothing of what waits for it for 60 s (--stall-seconds; 5 here) loses its
    connection (docs/operations.md), and the request is over."""
    s = rotation("--max-output-bytes", "8000000", "--stall-seconds", "5")
    # a task with a large result (more than the kernel's socket buffers hold) (a call allowed over a minute is a task for a client that
    # declares the extension); its DetailedTask, result inline, goes to the stream watching it
    st, _, body = mpost(s, modern_msg(1, "tools/call", {"name": "execute_python", "arguments": {
        "script": "import time\ntime.sleep(3)\nprint('x' * 6000000)\n", "timeout_seconds": 120}}, **TASKS_EXT),
        headers=NEW)
    assert st == 200, body
    tid = json.loads(body)["result"]["taskId"]
    msg = modern_msg("deaf", "subscriptions/listen", {"notifications": {"taskIds": [tid]}}, **TASKS_EXT)
    data = json.dumps(msg).encode()
    hdrs = {"Host": f"127.0.0.1:{s.port}", "Accept": ACCEPT_BOTH, "Content-Type": "application/json",
            "MCP-Protocol-Version": MODERN, "Content-Length": str(len(data)), **mirrored(msg), **NEW}
    deaf = socket.socket()
    deaf.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1024)
    deaf.connect(("127.0.0.1", s.port))
    deaf.sendall(b"POST /mcp HTTP/1.1\r\n" + b"".join(f"{k}: {v}\r\n".encode() for k, v in hdrs.items())
                 + b"\r\n" + data)
    assert wait_until(lambda: in_progress(s, NEW) == 2, 15)  # the deaf stream is open
    # the task ends, its result waits for the deaf client, which reads nothing: 5 s later
    # (and a tick) its connection goes
    assert wait_until(lambda: in_progress(s, NEW) == 1, 150), in_progress(s, NEW)
    deaf.close()


def test_a_wait_run_of_a_removed_token_ends_and_the_run_goes_on(rotation):
    """A background run (issue 36) is its principal's, as a task is: the old token's wait_run
    gets the 401 error at the reload, the run goes on, and the new token waits for it or ends it."""
    s = rotation("--kill-grace-seconds", "1")
    sid = s.initialize(headers=OLD)
    _, r = rpc(s, sid, OLD, 1, "tools/call", {"name": "execute_python", "arguments": {
        "script": "import time\ntime.sleep(300)\n", "timeout_seconds": 600, "background": True}})
    rid = r["result"]["structuredContent"]["run_id"]
    answer = {}

    def wait():
        answer["got"] = s.post({"jsonrpc": "2.0", "id": 2, "method": "tools/call",
                                "params": {"name": "wait_run", "arguments": {"run_id": rid, "timeout_seconds": 50}}},
                               sid, headers=OLD, version=LATEST)
    t = threading.Thread(target=wait)
    t.start()
    time.sleep(1)  # it waits
    assert t.is_alive()
    s.rotate()
    t.join(20)
    assert not t.is_alive(), "wait_run of the removed token still waits"
    st, _, body = answer["got"]
    assert st == 401, (st, body)
    mine = s.initialize(headers=NEW)
    st, got = rpc(s, mine, NEW, 3, "tools/call", {"name": "wait_run", "arguments": {"run_id": rid, "timeout_seconds": 0}})
    assert st == 200 and got["result"]["structuredContent"]["status"] == "running", got
    st, got = rpc(s, mine, NEW, 4, "tools/call", {"name": "cancel_run", "arguments": {"run_id": rid}})
    assert got["result"]["structuredContent"]["status"] == "cancelled", got

"""Tenants: the real binary over HTTP with two bearer tokens, alice and bob (and --profile lan
where a finding was made with it).  Each test reproduces one of the findings 5-12 of issue 14
(or item 5 of issue 16) and shows it closed: bob cannot use, list, read, download, resume,
evict, cancel, delete or starve anything of alice's; replay memory stays bounded; output
with NUL bytes arrives whole; error answers carry the request id.  Only 127.0.0.1 is ever
contacted."""
import base64
import json
import os
import re
import signal
import socket
import threading
import time

import pytest

from conftest import BACKEND, Server, wait_until
from test_http import (ACCEPT_BOTH, LATEST, HttpServer, call_msg, messages, sse_events,
                       sse_events_from_bytes)

ALICE = {"Authorization": "Bearer tok-alice-0123456789"}
BOB = {"Authorization": "Bearer tok-bob-9876543210"}
UNKNOWN_SID = "5d6b8a9e-0000-4000-8000-000000000000"


@pytest.fixture
def tokens(tmp_path):
    path = tmp_path / "tokens"
    path.write_text("alice: tok-alice-0123456789\nbob: tok-bob-9876543210\n")
    return str(path)


@pytest.fixture
def make_tenants(tokens):
    made = []

    def make(*args, lan=True, backend="none", **kwargs):
        argv = ["--auth-token-file", tokens, "--no-warm-cache", "--sandbox-backend", backend]
        if lan:
            argv += ["--profile", "lan"]
        s = HttpServer(*argv, *args, **kwargs)
        made.append(s)
        return s
    yield make
    for s in made:
        assert s.close() == 0


def result_of(h, body, req_id):
    """The response to req_id in a JSON or SSE answer."""
    if h.get("content-type", "").startswith("text/event-stream"):
        msgs = [m for m in messages(sse_events_from_bytes(body)) if m.get("id") == req_id]
        assert msgs, body[:2000]
        return msgs[0]
    return json.loads(body)


def execute(s, sid, auth, req_id, script, **args):
    # details: the run's metadata (its environment, prestart), which these tests check
    args.setdefault("details", True)
    st, h, body = s.post(call_msg(req_id, script, **args), sid, headers=auth, version=LATEST)
    assert st == 200, (st, body[:500])
    msg = result_of(h, body, req_id)
    assert "result" in msg, msg
    return msg["result"]


def rpc(s, sid, auth, req_id, method, params=None):
    msg = {"jsonrpc": "2.0", "id": req_id, "method": method}
    if params is not None:
        msg["params"] = params
    st, h, body = s.post(msg, sid, headers=auth, version=LATEST)
    return st, (result_of(h, body, req_id) if st == 200 else json.loads(body))


def not_found_like_unknown(s, method, path, auth, sid, body=None, extra=None):
    """The answer for another principal's session id is the very answer for an id that
    never existed: same status, same body (no oracle)."""
    answers = []
    for session in (sid, UNKNOWN_SID):
        hdrs = {"Accept": ACCEPT_BOTH, "Content-Type": "application/json", **auth, **(extra or {})}
        if session is not None:
            hdrs["Mcp-Session-Id"] = session
        st, h, data = s.request(method, path, body, hdrs)
        answers.append((st, data))
    assert answers[0] == answers[1], answers
    assert answers[0][0] == 404, answers
    return json.loads(answers[0][1])


WRITES_BIN = ("import os\nos.makedirs('outputs', exist_ok=True)\n"
              "open('outputs/data.bin', 'wb').write(bytes(range(256)) * 64)\n")


def link_of(result):
    links = [c for c in result["content"] if c["type"] == "resource_link"]
    assert links, result["content"]
    return links[0]["uri"]


# ================================================================ finding 5: sessions

def test_sessions_are_bound_to_their_token(make_tenants):
    s = make_tenants()
    a = s.initialize(headers=ALICE)
    s.initialize(headers=BOB)
    ping = {"jsonrpc": "2.0", "id": 1, "method": "ping"}
    # bob, with his own token and alice's session id: every method is "Session not found"
    err = not_found_like_unknown(s, "POST", "/mcp", BOB, a, json.dumps(ping).encode())
    assert err == {"jsonrpc": "2.0", "id": 1, "error": {"code": -32001, "message": "Session not found"}}
    for msg in (call_msg(2, "print('bob was here')"),
                {"jsonrpc": "2.0", "id": 3, "method": "resources/list"},
                {"jsonrpc": "2.0", "id": 4, "method": "tools/list"},
                {"jsonrpc": "2.0", "method": "notifications/initialized"}):
        not_found_like_unknown(s, "POST", "/mcp", BOB, a, json.dumps(msg).encode())
    # initialize naming her session: as for an unknown one (404), not "already initialized"
    init = {"jsonrpc": "2.0", "id": 5, "method": "initialize",
            "params": {"protocolVersion": LATEST, "capabilities": {}}}
    not_found_like_unknown(s, "POST", "/mcp", BOB, a, json.dumps(init).encode())
    # GET (standalone stream), DELETE
    not_found_like_unknown(s, "GET", "/mcp", BOB, a, extra={"Accept": "text/event-stream"})
    not_found_like_unknown(s, "DELETE", "/mcp", BOB, a)
    # ... and her session lives on, her own requests work
    st, r = rpc(s, a, ALICE, 6, "ping")
    assert st == 200 and r["result"] == {}
    c = s.connect()
    c.request("GET", "/mcp", headers={"Accept": "text/event-stream", "Mcp-Session-Id": a, **ALICE})
    resp = c.getresponse()
    assert resp.status == 200
    c.close()
    assert s.request("DELETE", "/mcp", headers={"Mcp-Session-Id": a, **ALICE})[0] == 200


def test_bob_cannot_cancel_or_resume_alices_call(make_tenants):
    s = make_tenants()
    a = s.initialize(headers=ALICE)
    b = s.initialize(headers=BOB)
    script = "import time\nfor i in range(6):\n    print('tick', i, flush=True)\n    time.sleep(0.2)\n"
    c, r = s.open_stream(call_msg(7, script, token="p"), a, headers=ALICE)
    it = sse_events(r)
    seen = []
    for ev in it:
        seen.append(ev)
        if len(messages(seen)) >= 2:
            break
    last_id = seen[-1]["id"]
    # alice's client goes away mid-stream (not a cancellation)
    c.sock.shutdown(socket.SHUT_RDWR)
    c.close()
    # bob tries to cancel her request, in her session and in his own
    cancel = {"jsonrpc": "2.0", "method": "notifications/cancelled", "params": {"requestId": 7}}
    not_found_like_unknown(s, "POST", "/mcp", BOB, a, json.dumps(cancel).encode())
    assert s.post(cancel, b, headers=BOB)[0] == 202
    # ... and to resume her stream
    not_found_like_unknown(s, "GET", "/mcp", BOB, a,
                           extra={"Accept": "text/event-stream", "Last-Event-ID": last_id})
    # alice resumes: the call ran to its end, nothing lost
    c2 = s.connect()
    c2.request("GET", "/mcp", headers={"Accept": "text/event-stream", "Mcp-Session-Id": a,
                                       "Last-Event-ID": last_id, **ALICE})
    r2 = c2.getresponse()
    assert r2.status == 200
    msgs = messages(seen + list(sse_events(r2)))
    c2.close()
    final = [m for m in msgs if m.get("id") == 7]
    assert final and final[0]["result"]["structuredContent"]["exit_code"] == 0
    text = "".join(m["params"]["message"] for m in msgs if m.get("method") == "notifications/progress")
    assert text == "".join(f"tick {i}\n" for i in range(6))


def test_legacy_sessions_are_bound_to_their_token(make_tenants):
    s = make_tenants()
    c = s.connect()
    c.request("GET", "/sse", headers={"Accept": "text/event-stream", **ALICE})
    r = c.getresponse()
    assert r.status == 200
    ev = next(sse_events(r))
    url = ev["data"]
    sid = re.fullmatch(r"/messages\?sessionId=([0-9a-f-]{36})", url).group(1)
    body = b'{"jsonrpc":"2.0","id":1,"method":"ping"}'
    hdrs = {"Content-Type": "application/json"}
    theirs = s.request("POST", url, body, {**hdrs, **BOB})
    unknown = s.request("POST", "/messages?sessionId=" + UNKNOWN_SID, body, {**hdrs, **BOB})
    assert theirs[0] == unknown[0] == 404 and theirs[2] == unknown[2]
    assert json.loads(theirs[2])["id"] == 1
    # alice's own POST is accepted and answered on her stream
    assert s.request("POST", url, json.dumps(
        {"jsonrpc": "2.0", "id": 2, "method": "initialize",
         "params": {"protocolVersion": "2024-11-05", "capabilities": {}}}).encode(),
        {**hdrs, **ALICE})[0] == 202
    assert json.loads(next(sse_events(r))["data"])["id"] == 2
    c.close()


# ================================================================ finding 6: artifacts

def test_artifacts_are_bound_to_their_token(make_tenants):
    s = make_tenants()
    a = s.initialize(headers=ALICE)
    b = s.initialize(headers=BOB)
    uri = link_of(execute(s, a, ALICE, 1, WRITES_BIN))
    fake = "sandbox://runs/" + "0" * 32 + "/outputs/data.bin"
    # resources/read: bob gets exactly what an unknown URI gets
    _, mine = rpc(s, b, BOB, 2, "resources/read", {"uri": uri})
    _, unknown = rpc(s, b, BOB, 2, "resources/read", {"uri": fake})
    assert mine["error"]["code"] == unknown["error"]["code"] == -32002
    assert mine["error"]["message"] == unknown["error"]["message"].replace(fake, uri)
    assert mine["error"]["data"] == {"uri": uri}
    # resources/list: one principal's artifacts only; its cursors tell nothing of others'
    assert rpc(s, b, BOB, 3, "resources/list")[1]["result"]["resources"] == []
    assert rpc(s, b, BOB, 3, "resources/list", {"cursor": "a1"})[1]["error"] == \
        rpc(s, b, BOB, 3, "resources/list", {"cursor": "a999"})[1]["error"]
    listed = rpc(s, a, ALICE, 4, "resources/list")[1]["result"]["resources"]
    assert [r["uri"] for r in listed] == [uri]
    # ... also in another session of alice's
    a2 = s.initialize(headers=ALICE)
    assert [r["uri"] for r in rpc(s, a2, ALICE, 5, "resources/list")[1]["result"]["resources"]] == [uri]
    # the download URL: bob's answer is the answer for a file that does not exist
    path = "/mcp/runs/" + uri[len("sandbox://runs/"):]
    theirs = s.request("GET", path, headers=BOB)
    unknown = s.request("GET", "/mcp/runs/" + fake[len("sandbox://runs/"):], headers=BOB)
    assert theirs[0] == unknown[0] == 404 and theirs[2] == unknown[2]
    st, _, data = s.request("GET", path, headers=ALICE)
    assert st == 200 and data == bytes(range(256)) * 64
    assert rpc(s, a, ALICE, 6, "resources/read", {"uri": uri})[1]["result"]["contents"][0]["uri"] == uri


# ================================================================ issue 16, item 5: error ids

def test_transport_errors_carry_the_request_id(make_tenants):
    s = make_tenants(lan=False)
    a = s.initialize(headers=ALICE)

    def post_raw(body, sid=a, headers=None, version=None):
        hdrs = {"Accept": ACCEPT_BOTH, "Content-Type": "application/json", **ALICE, **(headers or {})}
        if sid:
            hdrs["Mcp-Session-Id"] = sid
        if version:
            hdrs["MCP-Protocol-Version"] = version
        st, _, data = s.request("POST", "/mcp", body if isinstance(body, bytes) else json.dumps(body).encode(), hdrs)
        return st, json.loads(data)

    cases = [
        # (body, sid, extra headers, version) -> status
        ({"jsonrpc": "1.0", "id": 11, "method": "ping"}, a, None, None, 400),
        ({"jsonrpc": "2.0", "id": "s-12", "method": 5}, a, None, None, 400),
        ({"jsonrpc": "2.0", "id": 13}, a, None, None, 400),
        ({"jsonrpc": "2.0", "id": 14, "method": "ping"}, None, None, None, 400),
        ({"jsonrpc": "2.0", "id": 15, "method": "ping"}, UNKNOWN_SID, None, None, 404),
        ({"jsonrpc": "2.0", "id": 16, "method": "ping"}, a, None, "1999-01-01", 400),
        ({"jsonrpc": "2.0", "id": 17, "method": "ping"}, a, {"Accept": "text/html"}, None, 406),
        ({"jsonrpc": "2.0", "id": 18, "method": "initialize", "params": {"protocolVersion": LATEST}},
         a, None, None, 400),
    ]
    for body, sid, hdrs, version, want in cases:
        st, answer = post_raw(body, sid, hdrs, version)
        assert st == want, (body, st, answer)
        assert answer["id"] == body["id"], (body, answer)
        assert "error" in answer
    # nothing to read an id from: null
    st, answer = post_raw(b'{"jsonrpc":"2.0","id":19,')
    assert st == 400 and answer["id"] is None and answer["error"]["code"] == -32700
    st, answer = post_raw([{"jsonrpc": "2.0", "id": 20, "method": "ping"}])
    assert st == 400 and answer["id"] is None
    # the router's own errors too: nesting too deep for it
    deep = b'{"jsonrpc":"2.0","id":21,"method":"ping","params":{"a":' + b"[" * 80 + b"]" * 80 + b"}}"
    st, answer = post_raw(deep)
    assert st == 200 and answer["id"] == 21 and answer["error"]["code"] == -32600


def test_router_errors_carry_the_request_id_on_stdio(make_server):
    s = make_server()
    s.initialize()
    s.send_raw(b'{"jsonrpc":"2.0","id":"deep","method":"ping","params":{"a":' + b"[" * 80 + b"]" * 80 + b"}}\n")
    r = s.recv()
    assert r["id"] == "deep" and r["error"]["code"] == -32600
    for raw, rid in ((b'{"jsonrpc":"1.0","id":31,"method":"ping"}', 31),
                     (b'{"jsonrpc":"2.0","id":32,"method":"ping","params":3}', 32),
                     (b'{"jsonrpc":"2.0","id":33}', 33),
                     (b'{"jsonrpc":"2.0","id":34,"method":"nope"}', 34)):
        s.send_raw(raw + b"\n")
        r = s.recv()
        assert r["id"] == rid and "error" in r, r
    assert s.request("ping", req_id="after")["result"] == {}


# ================================================================ finding 9: execution slots

def share(s, sid, auth):
    """check_environment's view of the caller's own share."""
    st, msg = rpc(s, sid, auth, "env", "tools/call", {"name": "check_environment", "arguments": {}})
    assert st == 200, msg
    return msg["result"]["structuredContent"]["tenant"]


def cancel(s, sid, auth, req_id):
    s.post({"jsonrpc": "2.0", "method": "notifications/cancelled",
            "params": {"requestId": req_id, "reason": "test over"}}, sid, headers=auth)


@pytest.mark.parametrize("backend", [BACKEND])
def test_one_token_cannot_starve_another(make_tenants, backend):
    s = make_tenants(backend=backend)  # --profile lan: 4 slots, 2 calls per session
    a1, a2, a3 = (s.initialize(headers=ALICE) for _ in range(3))
    b = s.initialize(headers=BOB)
    sleeper = "import time\nprint('alice', flush=True)\ntime.sleep(100)\n"
    open_calls = []
    for req_id, sid in ((1, a1), (2, a1), (3, a2), (4, a2)):
        c, r = s.open_stream(call_msg(req_id, sleeper, token=f"a{req_id}", timeout_seconds=110), sid,
                             headers=ALICE)
        assert r.status == 200
        open_calls.append((req_id, sid, c, r))
    # bob is served now, while every call of alice's is still there (no answer yet); before,
    # he waited behind her four for a slot
    res = execute(s, b, BOB, 9, "print('bob')")
    assert res["structuredContent"]["stdout"] == "bob\n", res
    # alice holds two slots; her other two calls wait behind her own runs, and said so
    mine = share(s, a3, ALICE)["executions"]
    assert mine == {"calls": 4, "calls_max": 4, "running": 2, "running_max": 2, "queued": 2}, mine
    # a fifth call of hers is refused at once, naming the cap
    res = execute(s, a3, ALICE, 5, "print('too many')")
    assert res["isError"] and "--max-token-concurrent" in res["content"][0]["text"]
    notes = []
    for req_id, sid, c, r in open_calls[2:]:
        ev = next(e for e in sse_events(r) if e.get("data"))
        notes.append(json.loads(ev["data"])["params"]["message"])
    assert all("--max-token-running" in n for n in notes), notes
    for req_id, sid, c, r in open_calls:
        cancel(s, sid, ALICE, req_id)
    for req_id, sid, c, r in open_calls:
        assert not [m for m in messages(sse_events(r)) if m.get("id") == req_id]  # cancelled: no answer
        c.close()
    assert wait_until(lambda: share(s, a3, ALICE)["executions"]["calls"] == 0, 30)


def test_waiting_calls_are_admitted_in_turn(make_tenants, tmp_path):
    """One slot: alice queues three calls, then bob one; bob's runs second, not fourth."""
    s = make_tenants("--max-concurrent", "1", lan=False)
    a, b = s.initialize(headers=ALICE), s.initialize(headers=BOB)
    barrier = tmp_path / "go"
    first = ("import os, time\nprint('START', time.time(), flush=True)\n"
             f"while not os.path.exists({str(barrier)!r}):\n    time.sleep(0.02)\n")
    quick = "import time\nprint('START', time.time(), flush=True)\n"
    results = {}

    def run(req_id, sid, auth, script):
        results[req_id] = execute(s, sid, auth, req_id, script)["structuredContent"]
    threads = []

    def start(req_id, sid, auth, script):
        t = threading.Thread(target=run, args=(req_id, sid, auth, script))
        t.start()
        threads.append(t)
    start("a1", a, ALICE, first)
    assert wait_until(lambda: share(s, a, ALICE)["executions"]["running"] == 1, 30)
    start("a2", a, ALICE, quick)
    assert wait_until(lambda: share(s, a, ALICE)["executions"]["queued"] == 1, 30)
    start("a3", a, ALICE, quick)
    assert wait_until(lambda: share(s, a, ALICE)["executions"]["queued"] == 2, 30)
    start("b1", b, BOB, quick)
    assert wait_until(lambda: share(s, b, BOB)["executions"]["queued"] == 1, 30)
    barrier.write_text("")
    for t in threads:
        t.join(60)
    assert set(results) == {"a1", "a2", "a3", "b1"}
    order = sorted(results, key=lambda k: float(results[k]["stdout"].split()[1]))
    assert order == ["a1", "b1", "a2", "a3"], order


# ================================================================ finding 7: the session pool

def test_one_token_cannot_evict_anothers_idle_session(make_tenants):
    s = make_tenants("--max-sessions", "16", lan=False)
    b = s.initialize(headers=BOB)
    mine = [s.initialize(headers=ALICE) for _ in range(60)]
    # at the cap alice's own idle sessions made room, least recently used first
    assert rpc(s, b, BOB, 1, "ping")[0] == 200
    assert rpc(s, mine[-1], ALICE, 2, "ping")[0] == 200
    assert rpc(s, mine[0], ALICE, 3, "ping")[0] == 404


def test_one_token_cannot_hold_every_session(make_tenants):
    s = make_tenants("--max-sessions", "40")  # lan: 32 sessions per token
    held, refused = [], []
    for _ in range(40):
        st, h, body = s.post({"jsonrpc": "2.0", "id": 0, "method": "initialize",
                              "params": {"protocolVersion": LATEST, "capabilities": {}}}, headers=ALICE)
        if st != 200:
            refused.append((st, h, json.loads(body)))
            continue
        sid = h["mcp-session-id"]
        c = s.connect()  # a GET stream keeps the session in use: it cannot be evicted
        c.request("GET", "/mcp", headers={"Accept": "text/event-stream", "Mcp-Session-Id": sid, **ALICE})
        assert c.getresponse().status == 200
        held.append(c)
    # bob still gets in
    b = s.initialize(headers=BOB)
    assert rpc(s, b, BOB, 1, "ping")[0] == 200
    assert len(held) == 32
    st, h, answer = refused[0]
    assert st == 429 and h["retry-after"] and "--max-sessions-per-token" in answer["error"]["message"]
    assert share(s, b, BOB)["http"]["sessions"] == 1
    for c in held:
        c.close()


def test_streams_per_token(make_tenants):
    s = make_tenants("--max-streams-per-token", "2")
    sids = [s.initialize(headers=ALICE) for _ in range(3)]
    held = []
    for sid in sids[:2]:
        c = s.connect()
        c.request("GET", "/mcp", headers={"Accept": "text/event-stream", "Mcp-Session-Id": sid, **ALICE})
        assert c.getresponse().status == 200
        held.append(c)
    st, h, body = s.request("GET", "/mcp", headers={"Accept": "text/event-stream", "Mcp-Session-Id": sids[2],
                                                    **ALICE})
    assert st == 429 and "retry-after" in h and "--max-streams-per-token" in json.loads(body)["error"]["message"]
    assert share(s, sids[2], ALICE)["http"]["streams"] == 2
    # bob's are his own
    b = s.initialize(headers=BOB)
    c = s.connect()
    c.request("GET", "/mcp", headers={"Accept": "text/event-stream", "Mcp-Session-Id": b, **BOB})
    assert c.getresponse().status == 200
    held.append(c)
    # a closed stream gives its place back
    held[0].close()
    assert wait_until(lambda: share(s, sids[2], ALICE)["http"]["streams"] == 1, 10)
    c = s.connect()
    c.request("GET", "/mcp", headers={"Accept": "text/event-stream", "Mcp-Session-Id": sids[2], **ALICE})
    assert c.getresponse().status == 200
    held.append(c)
    for c in held:
        c.close()


# ================================================================ finding 8: the artifact store

def writes(name, size, seed):
    return ("import os, random\nos.makedirs('outputs', exist_ok=True)\n"
            f"random.seed({seed})\nopen('outputs/{name}', 'wb').write(random.randbytes({size}))\n")


def expected(size, seed):
    import random
    random.seed(seed)
    return random.randbytes(size)


def test_one_token_cannot_evict_anothers_artifacts(make_tenants):
    s = make_tenants("--max-artifact-store-bytes", "3M", "--max-artifact-bytes", "1M", lan=False)
    a, b = s.initialize(headers=ALICE), s.initialize(headers=BOB)
    bobs = link_of(execute(s, b, BOB, 1, writes("bob.bin", 600_000, 1)))
    alices = [link_of(execute(s, a, ALICE, 10 + i, writes("a.bin", 900_000, 10 + i))) for i in range(6)]
    # the store is over its cap at each of alice's runs from the third on: hers go, oldest first
    read = rpc(s, b, BOB, 2, "resources/read", {"uri": bobs})[1]
    assert base64.b64decode(read["result"]["contents"][0]["blob"]) == expected(600_000, 1)
    assert "error" in rpc(s, a, ALICE, 3, "resources/read", {"uri": alices[0]})[1]
    assert "result" in rpc(s, a, ALICE, 4, "resources/read", {"uri": alices[-1]})[1]
    assert share(s, a, ALICE)["artifacts"]["bytes"] <= 3 * 1024 * 1024 - 600_000


def test_a_newcomer_holding_the_most_does_not_evict_a_smaller_holder(make_tenants):
    """bob's first run alone holds more than alice's two: over the store's cap, his run is
    counted with him, so nothing of alice's goes (the store stays over by his one run)."""
    s = make_tenants("--max-artifact-store-bytes", "2M", "--max-artifact-bytes", "1500K", lan=False)
    a, b = s.initialize(headers=ALICE), s.initialize(headers=BOB)
    alices = [link_of(execute(s, a, ALICE, 10 + i, writes("a.bin", 400_000, 10 + i))) for i in range(2)]
    bobs = link_of(execute(s, b, BOB, 1, writes("bob.bin", 1_400_000, 1)))
    for i, uri in enumerate(alices):
        read = rpc(s, a, ALICE, 20 + i, "resources/read", {"uri": uri})[1]
        assert base64.b64decode(read["result"]["contents"][0]["blob"]) == expected(400_000, 10 + i)
    assert "result" in rpc(s, b, BOB, 2, "resources/read", {"uri": bobs})[1]
    # the next run over the cap takes from bob, who holds the most
    link_of(execute(s, b, BOB, 3, writes("bob2.bin", 300_000, 3)))
    assert "error" in rpc(s, b, BOB, 4, "resources/read", {"uri": bobs})[1]
    assert "result" in rpc(s, a, ALICE, 30, "resources/read", {"uri": alices[0]})[1]


def test_artifact_bytes_per_token(make_tenants):
    s = make_tenants("--max-artifact-bytes-per-token", "2M", "--max-artifact-bytes", "1M", lan=False)
    a, b = s.initialize(headers=ALICE), s.initialize(headers=BOB)
    bobs = link_of(execute(s, b, BOB, 1, writes("bob.bin", 900_000, 1)))
    results = [execute(s, a, ALICE, 10 + i, writes("a.bin", 900_000, 10 + i)) for i in range(3)]
    # her third run dropped her first (not bob's), and said so
    assert "--max-artifact-bytes-per-token" in results[2]["content"][0]["text"]
    assert "error" in rpc(s, a, ALICE, 2, "resources/read", {"uri": link_of(results[0])})[1]
    assert "result" in rpc(s, b, BOB, 3, "resources/read", {"uri": bobs})[1]
    mine = share(s, a, ALICE)["artifacts"]
    assert mine["files"] == 2 and mine["bytes"] == 1_800_000 and mine["bytes_max"] == 2 * 1024 * 1024


def test_an_artifact_being_downloaded_survives_its_eviction(make_tenants):
    s = make_tenants("--max-artifact-store-bytes", "12M", "--max-artifact-bytes", "10M", lan=False)
    a = s.initialize(headers=ALICE)
    size = 8 << 20
    uri = link_of(execute(s, a, ALICE, 1, writes("big.bin", size, 7)))
    c = s.connect()
    c.request("GET", "/mcp/runs/" + uri[len("sandbox://runs/"):], headers=ALICE)
    r = c.getresponse()
    assert r.status == 200
    head = r.read(1000)
    # the next run pushes it out of the store while the download is under way
    execute(s, a, ALICE, 2, writes("big2.bin", size, 8))
    assert "error" in rpc(s, a, ALICE, 3, "resources/read", {"uri": uri})[1]
    assert head + r.read() == expected(size, 7)
    c.close()


# ================================================================ finding 10: replay memory

BIG_ANSWER = ("import os, time\nprint('go', flush=True)\ntime.sleep(0.2)\n"
              "os.makedirs('outputs', exist_ok=True)\n"
              "for i in range(3):\n"
              "    open(f'outputs/img{i}.png', 'wb').write(b'\\x89PNG\\r\\n\\x1a\\n' + os.urandom(600000))\n")


def abandon(s, sid, auth, req_id):
    """A streamed call whose client hangs up after the first output: its answer (about
    2.4 MB: three inline images) waits for a resumption that never comes."""
    c, r = s.open_stream(call_msg(req_id, BIG_ANSWER, token=f"t{req_id}"), sid, headers=auth)
    assert r.status == 200
    last = None
    for ev in sse_events(r):
        last = ev.get("id", last)
        if ev.get("data") and "go" in json.loads(ev["data"]).get("params", {}).get("message", ""):
            break
    c.sock.shutdown(socket.SHUT_RDWR)
    c.close()
    return last


def test_abandoned_streams_keep_replay_memory_bounded(make_tenants):
    bound = 8 << 20
    s = make_tenants("--max-concurrent", "1", "--max-replay-bytes-per-session", "4M",
                     "--max-replay-bytes", "8M", lan=False)
    sanitized = s.sanitized()

    def round_(n_sessions=6, per_session=4):
        out = []
        for _ in range(n_sessions):
            sid = s.initialize(headers=ALICE)
            for k in range(per_session):
                out.append((sid, k, abandon(s, sid, ALICE, k)))
        assert wait_until(lambda: share(s, out[-1][0], ALICE)["executions"]["calls"] == 0, 60)
        return out
    round_()
    before = s.rss_kib()
    streams = round_()
    after = s.rss_kib()
    http = share(s, streams[-1][0], ALICE)["http"]
    assert http["replay_bytes"] <= bound and http["replay_bytes_max"] == bound, http
    assert "replay memory over its limit" in s.stderr_text()
    if not sanitized:
        # unbounded, the second round alone kept 24 answers of 2.4 MB (58 MB)
        assert after - before < 24 * 1024, (before, after)
    # a client resuming a stream whose answer was dropped is told so, with its request id,
    # and the stream ends (no hang)
    sid, k, last = streams[0]
    c = s.connect(timeout=20)
    c.request("GET", "/mcp", headers={"Accept": "text/event-stream", "Mcp-Session-Id": sid,
                                      "Last-Event-ID": last, **ALICE})
    r = c.getresponse()
    assert r.status == 200
    msgs = messages(list(sse_events(r)))
    c.close()
    assert len(msgs) == 1 and msgs[0]["id"] == k and "Response lost" in msgs[0]["error"]["message"], msgs
    # the newest answer is still there, whole
    sid, k, last = streams[-1]
    c = s.connect(timeout=20)
    c.request("GET", "/mcp", headers={"Accept": "text/event-stream", "Mcp-Session-Id": sid,
                                      "Last-Event-ID": last, **ALICE})
    msgs = messages(list(sse_events(c.getresponse())))
    c.close()
    final = [m for m in msgs if m.get("id") == k]
    assert final and "result" in final[0], final
    assert len([b for b in final[0]["result"]["content"] if b["type"] == "image"]) == 3


# ================================================================ finding 12: NUL bytes

NUL_SCRIPT = ("import sys\nsys.stdout.write('before\\x00after\\n')\nsys.stdout.flush()\n"
              "sys.stderr.buffer.write(b'err\\x00or \\xff tail\\n')\n")


def test_output_with_nul_bytes_arrives_whole(make_tenants):
    s = make_tenants()
    a = s.initialize(headers=ALICE)
    c, r = s.open_stream(call_msg(1, NUL_SCRIPT, token="n", details=True), a, headers=ALICE)
    msgs = messages(list(sse_events(r)))
    c.close()
    res = [m for m in msgs if m.get("id") == 1][0]["result"]
    sc = res["structuredContent"]
    assert sc["stdout"] == "before\x00after\n"
    assert sc["stderr"] == "err\x00or \ufffd tail\n"  # invalid UTF-8 is U+FFFD, as ever
    assert sc["truncated"] is False and sc["stdout_bytes"] == 13 and sc["stderr_bytes"] == 14
    text = res["content"][0]["text"]
    assert "--- stdout ---\nbefore\x00after\n" in text and "err\x00or \ufffd tail" in text
    streamed = "".join(m["params"]["message"] for m in msgs if m.get("method") == "notifications/progress")
    assert "before\x00after\n" in streamed


def test_cut_output_with_nul_bytes_keeps_its_head_and_tail(make_tenants):
    s = make_tenants()  # lan: 65536 bytes kept per stream
    a = s.initialize(headers=ALICE)
    script = ("import sys\nsys.stdout.write('HEAD\\x00' + 'x\\x00' * 100000 + '\\x00TAIL\\n')\n")
    sc = execute(s, a, ALICE, 1, script)["structuredContent"]
    assert sc["truncated"] is True and sc["stdout_bytes"] == 5 + 200000 + 6
    assert sc["stdout"].startswith("HEAD\x00x\x00") and sc["stdout"].endswith("x\x00\x00TAIL\n")
    assert "[truncated at 64KB]" in sc["stdout"] and "200011 bytes in all" in sc["stdout"]
    assert len(sc["stdout"].encode()) <= 65536


# ================================================================ finding 11: active content, origins

ACTIVE = ("import os\nos.makedirs('outputs', exist_ok=True)\n"
          "open('outputs/page.html', 'w').write('<script>fetch(\"/mcp\")</script>' + 'x' * 40000)\n"
          "open('outputs/pic.svg', 'w').write('<svg xmlns=\"http://www.w3.org/2000/svg\"><script>1</script></svg>')\n")


def test_downloads_are_attachments_in_a_sandbox(make_tenants):
    s = make_tenants()
    a = s.initialize(headers=ALICE)
    res = execute(s, a, ALICE, 1, ACTIVE)
    files = {f["path"]: f for f in res["structuredContent"]["files"]}
    # images are still recognised by their bytes for MCP content
    assert any(c["type"] == "image" and c["mimeType"] == "image/svg+xml" for c in res["content"])
    for path, name in (("outputs/page.html", "page.html"), ("outputs/pic.svg", "pic.svg")):
        uri = files[path]["uri"]
        st, h, body = s.request("GET", "/mcp/runs/" + uri[len("sandbox://runs/"):], headers=ALICE)
        assert st == 200
        assert h["content-disposition"] == f'attachment; filename="{name}"'
        assert h["x-content-type-options"] == "nosniff"
        assert h["content-security-policy"] == "sandbox; default-src 'none'"
        assert h["cache-control"] == "no-store"
    # a page from an artifact that a browser renders anyway has the opaque origin "null"
    init = {"jsonrpc": "2.0", "id": 0, "method": "initialize",
            "params": {"protocolVersion": LATEST, "capabilities": {}}}
    st, h, _ = s.post(init, headers={"Origin": "null", **ALICE})
    assert st == 403 and "access-control-allow-origin" not in h


def origin_answer(s, origin, auth=ALICE):
    st, h, _ = s.post({"jsonrpc": "2.0", "id": 0, "method": "initialize",
                       "params": {"protocolVersion": LATEST, "capabilities": {}}},
                      headers={"Origin": origin, **auth})
    return st, h.get("access-control-allow-origin")


def test_origin_rule_on_a_shared_box(make_tenants):
    s = make_tenants("--allowed-origins", "https://app.example")  # lan: loopback origins off
    own = f"http://127.0.0.1:{s.port}"
    assert origin_answer(s, own) == (200, own)
    assert origin_answer(s, f"http://localhost:{s.port}") == (200, f"http://localhost:{s.port}")
    assert origin_answer(s, "https://app.example") == (200, "https://app.example")
    for foreign in ("http://localhost:9999", "http://127.0.0.1:8080", f"https://127.0.0.1:{s.port}",
                    "http://evil.example", "null", f"ftp://127.0.0.1:{s.port}"):
        assert origin_answer(s, foreign) == (403, None), foreign
    # the download endpoint follows the same rule
    st, h, _ = s.request("GET", "/mcp/runs/" + "0" * 32 + "/outputs/x", headers={"Origin": "http://localhost:9999",
                                                                                **ALICE})
    assert st == 403 and "access-control-allow-origin" not in h


def test_loopback_origins_for_local_web_clients(make_tenants):
    s = make_tenants(lan=False)  # bound to loopback: local web clients on any port (auto)
    assert origin_answer(s, "http://localhost:6274") == (200, "http://localhost:6274")
    assert origin_answer(s, "http://[::1]:3000") == (200, "http://[::1]:3000")
    assert origin_answer(s, "http://evil.example") == (403, None)
    off = make_tenants("--loopback-origins", "off", lan=False)
    assert origin_answer(off, "http://localhost:6274") == (403, None)
    assert origin_answer(off, f"http://127.0.0.1:{off.port}") == (200, f"http://127.0.0.1:{off.port}")


def resume(s, sid, auth, last):
    c = s.connect(timeout=20)
    c.request("GET", "/mcp", headers={"Accept": "text/event-stream", "Mcp-Session-Id": sid,
                                      "Last-Event-ID": last, **auth})
    msgs = messages(list(sse_events(c.getresponse())))
    c.close()
    return msgs


def test_replay_memory_is_taken_from_the_token_keeping_the_most(make_tenants):
    s = make_tenants("--max-concurrent", "1", "--max-replay-bytes", "6M", lan=False)
    b = s.initialize(headers=BOB)
    bobs = abandon(s, b, BOB, 1)
    assert wait_until(lambda: share(s, b, BOB)["executions"]["calls"] == 0, 60)
    alices = []
    for k in range(4):
        a = s.initialize(headers=ALICE)
        alices.append((a, k, abandon(s, a, ALICE, k)))
    assert wait_until(lambda: share(s, alices[-1][0], ALICE)["executions"]["calls"] == 0, 60)
    # alice's four answers (each as large as bob's, in sessions as large as his) put the box
    # over its bound: hers went, bob's (idle the longest) is still there
    final = [m for m in resume(s, b, BOB, bobs) if m.get("id") == 1]
    assert final and "result" in final[0], final
    a, k, last = alices[0]
    assert "Response lost" in resume(s, a, ALICE, last)[0]["error"]["message"]


# ================================================================ review: what one message can cost

def test_a_batch_cannot_ask_for_unbounded_answers(make_tenants):
    """A few bytes per element of a 2025-03-26 batch asked for megabytes each (resources/read
    of one's own artifact, tools/list), all built in memory before anything was sent: a 6 KB
    batch got a 224 MB answer, and a larger one would take the box down for everyone.  A
    batch's answers now stay within --max-message-bytes (an element that does not fit gets an
    error with its id, and its file is not even read) and a batch has at most 256 elements."""
    s = make_tenants("--max-message-bytes", "4M", lan=False)
    b = s.initialize(version="2025-03-26", headers=BOB)
    st, h, body = s.post(call_msg(1, writes("big.bin", 1 << 20, 3)), b, headers=BOB, version="2025-03-26")
    uri = link_of(result_of(h, body, 1)["result"])
    batch = [{"jsonrpc": "2.0", "id": i, "method": "resources/read", "params": {"uri": uri}} for i in range(40)]
    batch.append({"jsonrpc": "2.0", "id": "p", "method": "ping"})
    st, h, body = s.post(batch, b, headers=BOB, version="2025-03-26")
    assert st == 200 and len(body) <= 4 << 20, len(body)
    answers = {m["id"]: m for m in json.loads(body)}
    assert set(answers) == set(range(40)) | {"p"}
    read = [i for i in range(40) if "result" in answers[i]]
    assert read and read == list(range(len(read))) and len(read) < 4, read
    assert base64.b64decode(answers[0]["result"]["contents"][0]["blob"]) == expected(1 << 20, 3)
    refused = answers[39]["error"]
    assert "--max-message-bytes" in refused["message"] and "on its own" in refused["message"], refused
    assert answers["p"]["result"] == {}  # what still fits is answered
    # tools/list: some 10 KB each
    batch = [{"jsonrpc": "2.0", "id": i, "method": "tools/list"} for i in range(256)]
    st, h, body = s.post(batch, b, headers=BOB, version="2025-03-26")
    assert st == 200 and len(body) <= 4 << 20 and len(json.loads(body)) == 256
    # more elements than that: refused as a whole
    st, h, body = s.post(batch + [{"jsonrpc": "2.0", "id": 999, "method": "ping"}], b, headers=BOB,
                         version="2025-03-26")
    err = json.loads(body)
    assert st == 200 and err["error"]["code"] == -32600 and "limit of 256" in err["error"]["message"], err
    # one request on its own is answered as before
    _, one = rpc(s, b, BOB, 2, "resources/read", {"uri": uri})
    assert base64.b64decode(one["result"]["contents"][0]["blob"]) == expected(1 << 20, 3)
    a = s.initialize(headers=ALICE)
    assert rpc(s, a, ALICE, 3, "ping")[1]["result"] == {}


def raw_post(s, body, sid, auth, accept):
    """POSTs body on a socket with a small receive buffer and reads only the status line and
    headers: the rest of the answer stays where the server put it (a client that never reads)."""
    so = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    so.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    so.settimeout(30)
    so.connect(("127.0.0.1", s.port))
    so.sendall((f"POST /mcp HTTP/1.1\r\nHost: 127.0.0.1:{s.port}\r\nAuthorization: {auth['Authorization']}\r\n"
                f"Mcp-Session-Id: {sid}\r\nMCP-Protocol-Version: {LATEST}\r\nContent-Type: application/json\r\n"
                f"Accept: {accept}\r\nContent-Length: {len(body)}\r\n\r\n").encode() + body)
    head = b""
    while b"\r\n\r\n" not in head:
        chunk = so.recv(1)
        assert chunk, head
        head += chunk
    status = int(head.split()[1])
    if status != 200:
        rest = head.split(b"\r\n\r\n", 1)[1]
        length = int(re.search(rb"(?i)content-length: *(\d+)", head).group(1))
        while len(rest) < length:
            rest += so.recv(length - len(rest))
        so.close()
        return status, json.loads(rest)
    return status, so


def test_a_client_that_never_reads_cannot_pin_unbounded_memory(make_tenants):
    """Answers queued for a connection whose client never reads stayed there (an SSE stream has
    no idle timeout) and counted nowhere: 20 such resources/read of an 8 MB artifact pinned
    440 MB, and 500 of a 64 MB one would take the box down for every tenant.  What a token's
    clients have yet to read is now bounded: past --max-unread-bytes-per-token its requests
    get 429 at once (cancellations still pass), other tokens are served as ever, and reading
    (or closing) gives the room back."""
    s = make_tenants("--max-unread-bytes-per-token", "24M", lan=False)
    a, b = s.initialize(headers=ALICE), s.initialize(headers=BOB)
    uri = link_of(execute(s, b, BOB, 1, writes("big.bin", 8 << 20, 5)))
    read = json.dumps({"jsonrpc": "2.0", "id": 7, "method": "resources/read", "params": {"uri": uri}}).encode()
    held, refused = [], []
    for i in range(12):
        status, got = raw_post(s, read, b, BOB, "text/event-stream" if i % 2 else "application/json")
        (held if status == 200 else refused).append(got)
    assert refused and len(held) < 6, (len(held), len(refused))
    err = refused[0]
    assert err["id"] == 7 and "--max-unread-bytes-per-token" in err["error"]["message"], err
    mine = share(s, a, ALICE)["http"]
    assert mine["unread_bytes"] == 0 and mine["unread_bytes_max"] == 24 << 20
    # bob's over his share; his cancellations pass, alice is served
    assert s.post({"jsonrpc": "2.0", "method": "notifications/cancelled", "params": {"requestId": 99}}, b,
                  headers=BOB, version=LATEST)[0] == 202
    _, answer = rpc(s, a, ALICE, 8, "resources/read", {"uri": uri})
    assert answer["error"]["code"] == -32002  # his file is not hers, as ever
    assert rpc(s, a, ALICE, 9, "ping")[1]["result"] == {}
    for so in held:
        so.close()
    assert wait_until(lambda: rpc(s, b, BOB, 10, "ping")[0] == 200, 30)
    assert wait_until(lambda: share(s, b, BOB)["http"]["unread_bytes"] == 0, 30)
    # the HTTP+SSE transport: each POST to /messages is answered 202 at once, and the answers
    # queue up in the /sse stream its client does not read
    so = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    so.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    so.settimeout(30)
    so.connect(("127.0.0.1", s.port))
    so.sendall((f"GET /sse HTTP/1.1\r\nHost: 127.0.0.1:{s.port}\r\nAccept: text/event-stream\r\n"
                f"Authorization: {BOB['Authorization']}\r\n\r\n").encode())
    got = b""
    while not re.search(rb"sessionId=[0-9a-f-]{36}", got):
        chunk = so.recv(1)
        assert chunk, got
        got += chunk
    url = "/messages?" + re.search(rb"sessionId=[0-9a-f-]{36}", got).group(0).decode()
    hdrs = {"Content-Type": "application/json", **BOB}
    assert s.request("POST", url, json.dumps({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
        "protocolVersion": "2024-11-05", "capabilities": {}}}).encode(), hdrs)[0] == 202
    statuses = [s.request("POST", url, read, hdrs) for _ in range(10)]
    codes = [st for st, _, _ in statuses]
    assert 429 in codes and codes.index(429) < 6, codes
    assert json.loads(statuses[codes.index(429)][2])["id"] == 7
    assert rpc(s, a, ALICE, 11, "ping")[1]["result"] == {}
    so.close()
    assert wait_until(lambda: rpc(s, b, BOB, 12, "ping")[0] == 200, 30)


def test_a_download_of_a_file_whose_name_is_escaped(make_tenants):
    """The download URL of a file whose URI needs percent-escapes (a space, a quote, non-ASCII,
    '%', ';') or whose name holds '..' answered 404: the path arrives decoded, the lookup
    compared it with the escaped URI.  The Content-Disposition stays a plain safe name."""
    s = make_tenants()
    a, b = s.initialize(headers=ALICE), s.initialize(headers=BOB)
    names = ["a b.html", 'q"x.txt', "\u00e9t\u00e9.svg", "a..b.txt", "semi;x.bin", "pct%41.txt", "r\u202egnp.exe"]
    script = ("import os\nos.makedirs('outputs', exist_ok=True)\n"
              f"for i, n in enumerate({names!r}):\n"
              "    open('outputs/' + n, 'w').write('<html><script>parent.x=1</script>%d</html>' % i)\n")
    files = {f["path"]: f for f in execute(s, a, ALICE, 1, script)["structuredContent"]["files"]}
    for i, name in enumerate(names):
        # (names are reported escaped: the bidi override as \u{202e})
        uri = files["outputs/" + name.replace("\u202e", "\\u{202e}")]["uri"]
        path = "/mcp/runs/" + uri[len("sandbox://runs/"):]
        st, h, body = s.request("GET", path, headers=ALICE)
        assert st == 200 and body == b"<html><script>parent.x=1</script>%d</html>" % i, (name, st, body)
        disposition = h["content-disposition"]
        assert re.fullmatch(r'attachment; filename="[A-Za-z0-9._+-]+"', disposition), disposition
        assert h["x-content-type-options"] == "nosniff" and h["content-security-policy"].startswith("sandbox")
        # still not bob's
        theirs = s.request("GET", path, headers=BOB)
        assert theirs[0] == 404
    for bad in ("/outputs/../outputs/a%20b.html", "/./outputs/a%20b.html", "/outputs/%2e%2e/x"):
        rid = files["outputs/a b.html"]["uri"][len("sandbox://runs/"):][:32]
        assert s.request("GET", "/mcp/runs/" + rid + bad, headers=ALICE)[0] == 404


def validate(s, sid, auth, req_id, script="print('hi')\n"):
    st, msg = rpc(s, sid, auth, req_id, "tools/call", {"name": "validate_script", "arguments": {"script": script}})
    assert st == 200, msg
    return msg["result"]


def test_validate_script_counts_against_the_token_share(make_tenants):
    """validate_script runs a process on the host (the interpreter's compile, up to 1 GiB, 15 s;
    or a resolution) for every call, and counted against no cap: a token at its
    --max-token-concurrent could still start any number of them.  It now counts like an
    execution."""
    s = make_tenants()  # lan: 4 calls per token, 2 per session
    b1, b2 = s.initialize(headers=BOB), s.initialize(headers=BOB)
    a = s.initialize(headers=ALICE)
    sleeper = "import time\nprint('bob', flush=True)\ntime.sleep(100)\n"
    held = []
    for req_id, sid in ((1, b1), (2, b1), (3, b2), (4, b2)):
        c, r = s.open_stream(call_msg(req_id, sleeper, token=f"b{req_id}", timeout_seconds=110), sid, headers=BOB)
        assert r.status == 200
        held.append((req_id, sid, c))
    b3 = s.initialize(headers=BOB)
    assert wait_until(lambda: share(s, b3, BOB)["executions"]["calls"] == 4, 30)
    res = validate(s, b3, BOB, 5)
    assert res["isError"] and "--max-token-concurrent" in res["content"][0]["text"], res
    assert not validate(s, a, ALICE, 6)["isError"]  # alice's share is hers
    for req_id, sid, c in held:
        cancel(s, sid, BOB, req_id)
        c.close()
    assert wait_until(lambda: share(s, b3, BOB)["executions"]["calls"] == 0, 30)
    res = validate(s, b3, BOB, 7)
    assert not res["isError"] and res["structuredContent"]["valid"], res
    assert share(s, b3, BOB)["executions"]["calls"] == 0  # and gives it back


def test_listing_cursors_tell_nothing_of_other_tokens(make_tenants):
    """resources/list's cursor was the store's running count of files ("a<seq>"): bob's second
    page told him how many files every other token had stored before his.  It now names a
    place in his own files only."""
    s = make_tenants(lan=False)
    a, b = s.initialize(headers=ALICE), s.initialize(headers=BOB)
    many = lambda n, tag: ("import os\nos.makedirs('outputs', exist_ok=True)\n"
                           f"for i in range({n}):\n    open(f'outputs/{tag}%03d.txt' % i, 'w').write('x')\n")
    execute(s, a, ALICE, 1, many(90, "a"))
    bobs = [execute(s, b, BOB, 2, many(60, "b")), execute(s, b, BOB, 3, many(60, "c"))]
    runs = [r["structuredContent"]["files"][0]["uri"][len("sandbox://runs/"):][:32] for r in bobs]
    page = rpc(s, b, BOB, 4, "resources/list")[1]["result"]
    assert len(page["resources"]) == 100
    m = re.fullmatch(r"([0-9a-f]{32}):(\d+)", page["nextCursor"])
    assert m and m.group(1) == runs[1] and int(m.group(2)) == 40, page["nextCursor"]
    rest = rpc(s, b, BOB, 5, "resources/list", {"cursor": page["nextCursor"]})[1]["result"]
    assert "nextCursor" not in rest
    names = [r["name"] for r in page["resources"] + rest["resources"]]
    assert names == [f"outputs/b{i:03d}.txt" for i in range(60)] + [f"outputs/c{i:03d}.txt" for i in range(60)]
    # a cursor naming alice's run is one naming a run that is gone: from his oldest
    hers = rpc(s, a, ALICE, 6, "resources/list")[1]["result"]["resources"][0]["uri"][len("sandbox://runs/"):][:32]
    for cursor in (hers + ":0", "0" * 32 + ":0"):
        again = rpc(s, b, BOB, 7, "resources/list", {"cursor": cursor})[1]["result"]
        assert again == page or again["resources"] == page["resources"], cursor
    assert rpc(s, b, BOB, 8, "resources/list", {"cursor": "a150"})[1]["error"]["code"] == -32602


# ================================================================ environments: each principal's share of the cache

from test_deps import wheels  # noqa: E402,F401  (the fixture: a local wheelhouse)

ENV_DEPS = {"b": ["mps-gamma"], "a1": ["mps-alpha==1.0"], "a2": ["mps-beta"], "a3": ["mps-alpha==2.0"]}


def env_key(s, sid, auth, req_id, deps):
    res = execute(s, sid, auth, req_id, "pass", dependencies=deps)
    assert res["structuredContent"]["exit_code"] == 0, res
    time.sleep(1.1)  # distinct last-use times (a manifest's mtime has a second's grain)
    return res["structuredContent"]["environment"]["key"]


def store_envs(s):
    d = os.path.join(s.state_dir, "envs")
    return {e for e in os.listdir(d) if not e.startswith(".") and "." not in e}


def env_size(s, key):
    with open(os.path.join(s.state_dir, "envs", key, "mps-manifest.json")) as f:
        return json.load(f)["size"]


@pytest.fixture
def env_sizes(make_tenants, wheels):
    """The size of each test environment, built once on a scout server (the same wheels
    make the same environments, of the same size, on the servers of the tests)."""
    s = make_tenants("--find-links", wheels, "--offline")
    sid = s.initialize(headers=ALICE)
    return {name: env_size(s, env_key(s, sid, ALICE, 10 + i, deps)) for i, (name, deps) in enumerate(ENV_DEPS.items())}


def test_a_tenant_building_a_lot_evicts_its_own_environments(make_tenants, wheels, env_sizes):
    # Room for bob's environment and two of alice's.  Least recently used alone, alice's
    # third build would evict bob's (the oldest); charged to the principal holding the most,
    # it evicts alice's own oldest.
    sizes = env_sizes
    budget = sizes["b"] + sizes["a1"] + sizes["a2"] + sizes["a3"] // 2
    s = make_tenants("--find-links", wheels, "--offline", "--max-cache-bytes", str(budget))
    bob, alice = s.initialize(headers=BOB), s.initialize(headers=ALICE)
    b = env_key(s, bob, BOB, 1, ENV_DEPS["b"])
    a1 = env_key(s, alice, ALICE, 2, ENV_DEPS["a1"])
    a2 = env_key(s, alice, ALICE, 3, ENV_DEPS["a2"])
    assert store_envs(s) == {b, a1, a2}
    a3 = env_key(s, alice, ALICE, 4, ENV_DEPS["a3"])
    assert store_envs(s) == {b, a2, a3}, (b, a1, a2, a3)
    assert f"evicted environment {a1} ({sizes['a1']} bytes, built by alice)" in s.stderr_text()
    # each sees what it is charged for
    for auth, sid, n in ((ALICE, alice, 2), (BOB, bob, 1)):
        st, msg = rpc(s, sid, auth, 9, "tools/call", {"name": "check_environment", "arguments": {}})
        envs = msg["result"]["structuredContent"]["tenant"]["environments"]
        assert envs["count"] == n and envs["store_bytes_max"] == budget, envs
    # bob's environment is a hit, untouched by alice's builds
    res = execute(s, bob, BOB, 5, "import mps_gamma\nprint('still here')", dependencies=ENV_DEPS["b"])
    assert res["structuredContent"]["environment"]["cached"] is True, res


def test_a_tenant_over_its_cache_share_loses_its_own_oldest(make_tenants, wheels, env_sizes):
    sizes = env_sizes
    cap = max(sizes["a1"], sizes["a2"], sizes["a3"]) * 2 + 1  # two of alice's fit, not three
    s = make_tenants("--find-links", wheels, "--offline", "--max-cache-bytes-per-token", str(cap))
    bob, alice = s.initialize(headers=BOB), s.initialize(headers=ALICE)
    b = env_key(s, bob, BOB, 1, ENV_DEPS["b"])
    a1 = env_key(s, alice, ALICE, 2, ENV_DEPS["a1"])
    a2 = env_key(s, alice, ALICE, 3, ENV_DEPS["a2"])
    a3 = env_key(s, alice, ALICE, 4, ENV_DEPS["a3"])
    # plenty of room in the store (10G): only alice's share made anything go, and only hers
    assert store_envs(s) == {b, a2, a3}, (b, a1, a2, a3)
    st, msg = rpc(s, alice, ALICE, 9, "tools/call", {"name": "check_environment", "arguments": {}})
    sc = msg["result"]["structuredContent"]["tenant"]["environments"]
    assert sc["count"] == 2 and sc["bytes"] == sizes["a2"] + sizes["a3"] and sc["bytes_max"] == cap, sc
    assert "environments your calls built 2" in msg["result"]["content"][0]["text"]


def test_past_the_total_a_smaller_holder_does_not_pay_for_one_whose_environments_are_in_use(
        make_tenants, wheels, env_sizes, tmp_path):
    # Room for bob's environment and one of alice's.  Alice runs a script in her first while
    # her second is built: she holds the most, and all of it is in use.  Bob, holding less,
    # must not lose his: the store stays over its cap until alice has something to give.
    sizes = env_sizes
    budget = sizes["b"] + sizes["a1"] + sizes["a2"] // 2
    s = make_tenants("--find-links", wheels, "--offline", "--max-cache-bytes", str(budget))
    bob, alice, alice2 = s.initialize(headers=BOB), s.initialize(headers=ALICE), s.initialize(headers=ALICE)
    b = env_key(s, bob, BOB, 1, ENV_DEPS["b"])
    a1 = env_key(s, alice, ALICE, 2, ENV_DEPS["a1"])
    assert store_envs(s) == {b, a1}
    barrier = tmp_path / "go"
    held = {}

    def hold():
        held["res"] = execute(s, alice, ALICE, 3, f"import os, time\nwhile not os.path.exists({str(barrier)!r}):\n"
                              "    time.sleep(0.02)\n", dependencies=ENV_DEPS["a1"])
    t = threading.Thread(target=hold)
    t.start()
    try:
        assert wait_until(lambda: share(s, alice2, ALICE)["executions"]["running"] == 1, 30)
        a2 = env_key(s, alice2, ALICE, 4, ENV_DEPS["a2"])
        assert store_envs(s) == {b, a1, a2}, (b, a1, a2)
        assert f"evicted environment {b}" not in s.stderr_text()
    finally:
        barrier.write_text("")
        t.join(60)
    assert held["res"]["structuredContent"]["exit_code"] == 0, held
    # bob's environment is a hit
    res = execute(s, bob, BOB, 5, "import mps_gamma", dependencies=ENV_DEPS["b"])
    assert res["structuredContent"]["environment"]["cached"] is True, res


def test_a_build_whose_builder_cancelled_is_charged_to_who_still_waits(make_tenants, tmp_path):
    # Bob starts a build, alice joins it, bob cancels: the build goes on for alice alone, and
    # it is hers (bob must not pay for alice's environment, nor lose his own to her build).
    import wheelhouse
    d = tmp_path / "wheels"
    d.mkdir()
    os.chmod(d, 0o755)
    barrier = tmp_path / "built"
    wheelhouse.make_sdist(str(d), "mps-slow", "1.0", hostile=(
        f"import os, time\nwhile not os.path.exists({str(barrier)!r}):\n    time.sleep(0.05)\n"))
    s = make_tenants("--find-links", str(d), "--offline")
    bob, alice = s.initialize(headers=BOB), s.initialize(headers=ALICE)
    results = {}

    def run(req_id, sid, auth):
        st, h, body = s.post(call_msg(req_id, "import mps_slow", dependencies=["mps-slow"]), sid,
                             headers=auth, version=LATEST)
        results[req_id] = (st, h, body)
    tb = threading.Thread(target=run, args=("b1", bob, BOB))
    tb.start()
    assert wait_until(lambda: share(s, bob, BOB)["executions"]["running"] == 1, 30)
    ta = threading.Thread(target=run, args=("a1", alice, ALICE))
    ta.start()
    assert wait_until(lambda: share(s, alice, ALICE)["executions"]["running"] == 1, 30)
    cancel(s, bob, BOB, "b1")
    assert wait_until(lambda: share(s, bob, BOB)["executions"]["calls"] == 0, 30)
    barrier.write_text("")
    ta.join(120)
    tb.join(30)
    st, h, body = results["a1"]
    assert st == 200, body[:500]
    res = result_of(h, body, "a1")
    assert res["result"]["structuredContent"]["exit_code"] == 0, res
    envs = {}
    for auth, sid in ((ALICE, alice), (BOB, bob)):
        envs[auth["Authorization"]] = share(s, sid, auth)["environments"]["count"]
    assert envs == {ALICE["Authorization"]: 1, BOB["Authorization"]: 0}, envs


@pytest.mark.skipif(BACKEND == "none", reason="the none backend holds nothing")
def test_a_token_at_its_running_cap_does_not_stop_the_pools_refills(make_tenants):
    """Refills of the prestarted pool wait while calls wait (issue 20), but alice's calls
    queued behind her own --max-token-running wait for nothing a refill takes: they must not
    keep bob's pool from refilling, or every call of bob's runs cold for as long as alice
    keeps her queue full."""
    s = make_tenants("--prestart", "2", "--prestart-max", "2", "--max-token-running", "1",
                     lan=False, backend="bwrap")
    a_sid, b_sid = s.initialize(headers=ALICE), s.initialize(headers=BOB)

    def pool():
        st, h, body = s.post({"jsonrpc": "2.0", "id": "ce", "method": "tools/call",
                              "params": {"name": "check_environment", "arguments": {}}},
                             b_sid, headers=BOB, version=LATEST)
        return result_of(h, body, "ce")["result"]["structuredContent"]["prestart"]

    assert wait_until(lambda: pool()["ready_interpreters"] >= 2, timeout=30), pool()
    done = []

    def alice(i):
        done.append(execute(s, a_sid, ALICE, f"a{i}", "import time; time.sleep(3)"))
    threads = [threading.Thread(target=alice, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    # One of alice's runs (in a held interpreter), three wait for her own cap: refilled anyway.
    assert wait_until(lambda: pool()["taken"] >= 1, timeout=10), pool()
    assert wait_until(lambda: pool()["ready_interpreters"] >= 2, timeout=8), pool()
    assert len(done) < 4  # (alice's queue was still there)
    got = execute(s, b_sid, BOB, "b1", "print('bob')")["structuredContent"]
    assert got["stdout"] == "bob\n" and got["prestarted"] == "interpreter", got
    for t in threads:
        t.join(60)
    assert len(done) == 4 and all(r["structuredContent"]["exit_code"] == 0 for r in done), done


# ================================================================ issue 31, item 7: the prestart pool's last other shape

def check_env(s, sid, auth, req_id="ce"):
    st, h, body = s.post({"jsonrpc": "2.0", "id": req_id, "method": "tools/call",
                          "params": {"name": "check_environment", "arguments": {}}},
                         sid, headers=auth, version=LATEST)
    assert st == 200, body[:500]
    return result_of(h, body, req_id)["result"]


def other_shapes(s, sid, auth):
    return [sh for sh in check_env(s, sid, auth)["structuredContent"]["prestart"]["shapes"]
            if sh["shape"] != "commonest"]


@pytest.mark.skipif(BACKEND == "none", reason="the none backend holds nothing")
def test_a_tenants_last_other_shape_is_its_own(make_tenants, wheels):
    """The pool's last other shape was the server's: bob's check_environment showed alice's
    interpreter, environment key (a hash of her requirements: a guess can be confirmed) and
    network, and one call of bob's of another shape evicted it, so bob could keep alice's
    calls cold.  Each principal now has its own, and sees only its own."""
    s = make_tenants("--find-links", wheels, "--offline", "--prestart", "1", lan=False,
                     backend="bwrap")
    a, b = s.initialize(headers=ALICE), s.initialize(headers=BOB)
    assert wait_until(lambda: check_env(s, b, BOB)["structuredContent"]["prestart"]["ready"] >= 1,
                      timeout=30)
    # alice's call with dependencies: her environment becomes her last other shape.
    first = execute(s, a, ALICE, "a1", "pass", dependencies=["mps-beta"])["structuredContent"]
    assert first["exit_code"] == 0, first
    key = first["environment"]["key"]
    assert wait_until(lambda: [(sh["environment"], sh["ready"]) for sh in other_shapes(s, a, ALICE)]
                      == [(key, 1)], timeout=30), other_shapes(s, a, ALICE)
    # bob sees nothing of it: not the shape, not its key, not its held sandbox in the counts.
    seen = check_env(s, b, BOB)
    assert key not in json.dumps(seen), seen["structuredContent"]["prestart"]
    p = seen["structuredContent"]["prestart"]
    assert [sh["shape"] for sh in p["shapes"]] == ["commonest"] and p["ready"] == 1, p
    # bob's call of another shape becomes his own last other shape, and evicts nothing of hers.
    got = execute(s, b, BOB, "b1", "pass", network=False)["structuredContent"]
    assert got["exit_code"] == 0 and got["prestarted"] == "no", got
    assert wait_until(lambda: [(sh["network"], sh["environment"], sh["ready"])
                               for sh in other_shapes(s, b, BOB)] == [(False, None, 1)], timeout=30)
    assert key not in json.dumps(check_env(s, b, BOB))
    assert [(sh["environment"], sh["ready"]) for sh in other_shapes(s, a, ALICE)] == [(key, 1)]
    # alice's next call of her shape is warm, and so is bob's of his.
    got = execute(s, a, ALICE, "a2", "import mps_beta", dependencies=["mps-beta"])["structuredContent"]
    assert got["exit_code"] == 0 and got["prestarted"] == "interpreter", got
    got = execute(s, b, BOB, "b2", "pass", network=False)["structuredContent"]
    assert got["exit_code"] == 0 and got["prestarted"] == "interpreter", got


@pytest.mark.skipif(BACKEND == "none", reason="the none backend holds nothing")
def test_last_other_shapes_are_kept_for_a_bounded_number_of_principals(tmp_path):
    """One last other shape per principal, for at most other_shapes_max principals: a newcomer's
    replaces the one used least recently."""
    names = [f"t{i}" for i in range(6)]
    tokens = tmp_path / "tokens"
    tokens.write_text("".join(f"{n}:tok-{n}-0123456789abcdef\n" for n in names))
    auth = {n: {"Authorization": f"Bearer tok-{n}-0123456789abcdef"} for n in names}
    s = HttpServer("--auth-token-file", str(tokens), "--no-warm-cache", "--sandbox-backend", "bwrap",
                   "--prestart", "1")
    try:
        sids = {n: s.initialize(headers=auth[n]) for n in names}
        kept = check_env(s, sids["t0"], auth["t0"])["structuredContent"]["prestart"]["other_shapes_max"]
        assert 1 <= kept < len(names), kept
        used = names[:kept + 1]
        for i, n in enumerate(used):  # each one's call of another shape, oldest first
            got = execute(s, sids[n], auth[n], f"{n}-1", "pass", network=False)["structuredContent"]
            assert got["exit_code"] == 0, got
            assert wait_until(lambda: [sh["ready"] for sh in other_shapes(s, sids[n], auth[n])] == [1],
                              timeout=30), (n, other_shapes(s, sids[n], auth[n]))
            time.sleep(0.01)  # distinct last uses
        # The first one's went when the last came; the others' are kept, each seen by its own.
        assert other_shapes(s, sids["t0"], auth["t0"]) == []
        for n in used[1:]:
            assert [sh["network"] for sh in other_shapes(s, sids[n], auth[n])] == [False], n
        assert other_shapes(s, sids[names[-1]], auth[names[-1]]) == []
        # A call of t1's (now the least recently set) uses its shape: t2's is the next to go.
        got = execute(s, sids["t1"], auth["t1"], "t1-2", "pass", network=False)["structuredContent"]
        assert got["prestarted"] == "interpreter", got
        got = execute(s, sids[names[-1]], auth[names[-1]], "last", "pass", network=False)["structuredContent"]
        assert got["exit_code"] == 0, got
        assert other_shapes(s, sids["t2"], auth["t2"]) == []
        assert [sh["network"] for sh in other_shapes(s, sids["t1"], auth["t1"])] == [False]
    finally:
        assert s.close() == 0


# ================================================================ issue 31, item 8: /metrics is the operators'

def get_path(s, path, auth=None):
    st, _, body = s.request("GET", path, None, dict(auth or {}))
    return st, body


def test_metrics_is_for_the_operators(make_tenants, tokens):
    """/metrics shows every tenant's activity live (calls, outcomes, durations, queues): with
    tokens only the principals --metrics-token names may read it; every other token gets 403.
    The probes stay open."""
    s = make_tenants("--metrics-token", "alice")
    sid = s.initialize(headers=BOB)
    assert execute(s, sid, BOB, 1, "print('bob')")["structuredContent"]["exit_code"] == 0
    st, body = get_path(s, "/metrics", ALICE)
    assert st == 200 and b"# TYPE mcp_sandbox_tool_calls_total counter" in body, (st, body[:300])
    st, body = get_path(s, "/metrics", BOB)
    assert st == 403 and b"mcp_sandbox" not in body, (st, body)
    assert b"--metrics-token" in body
    assert get_path(s, "/metrics")[0] == 401  # no token: as ever
    # /healthz and /readyz need no token (and any token will do).
    for auth in (None, BOB, ALICE):
        assert get_path(s, "/healthz", auth) == (200, b"ok\n"), auth
        assert wait_until(lambda: get_path(s, "/readyz", auth)[0] == 200, timeout=30), auth
    assert "/metrics answers 403 to every token" not in s.stderr_text()

    # None named: every token gets 403, and the start-up log says so, once.
    s = make_tenants()
    for auth in (ALICE, BOB):
        assert get_path(s, "/metrics", auth)[0] == 403, auth
    assert get_path(s, "/healthz")[0] == 200
    assert s.stderr_text().count("/metrics answers 403 to every token") == 1, s.stderr_text()

    # Several: a comma-separated list and the flag repeated; a name without a token is said.
    s = make_tenants("--metrics-token", "bob,carol", "--metrics-token", "alice")
    for auth in (ALICE, BOB):
        assert get_path(s, "/metrics", auth)[0] == 200, auth
    assert "--metrics-token carol: no token of that name" in s.stderr_text()
    # A token of that name added to the file (SIGHUP) reads it at once.
    carol = {"Authorization": "Bearer tok-carol-5555555555"}
    assert get_path(s, "/metrics", carol)[0] == 401
    with open(tokens, "a") as f:
        f.write("carol: tok-carol-5555555555\n")
    s.proc.send_signal(signal.SIGHUP)
    assert wait_until(lambda: get_path(s, "/metrics", carol)[0] == 200, timeout=10)


def test_metrics_without_tokens_stays_open():
    """No tokens (loopback, no auth): /metrics is open as the endpoint is; --metrics-token
    there changes nothing, and the log says so."""
    s = HttpServer("--no-warm-cache", "--metrics-token", "alice")
    try:
        st, body = get_path(s, "/metrics")
        assert st == 200 and b"mcp_sandbox_http_sessions" in body, (st, body[:300])
        assert "--metrics-token is for a server with bearer tokens" in s.stderr_text()
    finally:
        assert s.close() == 0

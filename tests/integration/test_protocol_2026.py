"""Protocol revision 2026-07-28 (the stateless era) beside the handshake era, over stdio and
Streamable HTTP (issue 18, docs/protocol-2026.md step 1): the era of each request, the
envelope checks and their codes (and HTTP statuses), server/discover, resultType and
serverInfo on results, tools and resources served statelessly, progress on the request's own
stream, the stdio pinning rule, and tenancy: a modern request runs as its bearer token's
principal, under its caps, and reaches nothing of another's.  Only 127.0.0.1 is contacted."""
import json
import os

import pytest

from conftest import processes_with_marker, wait_until
from test_http import ACCEPT_BOTH, HttpServer, messages, sse_events, sse_events_from_bytes

MODERN = "2026-07-28"
HANDSHAKE = ["2025-11-25", "2025-06-18", "2025-03-26", "2024-11-05"]
PV = "io.modelcontextprotocol/protocolVersion"
CAPS = "io.modelcontextprotocol/clientCapabilities"
SERVER_INFO = "io.modelcontextprotocol/serverInfo"
ALICE = {"Authorization": "Bearer tok-alice-0123456789"}
BOB = {"Authorization": "Bearer tok-bob-9876543210"}


def meta(version=MODERN, **extra):
    m = {PV: version, CAPS: {}, "io.modelcontextprotocol/clientInfo": {"name": "itest", "version": "0"}}
    m.update(extra)
    return m


def modern_msg(req_id, method, params=None, version=MODERN, **extra):
    p = dict(params or {})
    p["_meta"] = {**meta(version), **extra}
    return {"jsonrpc": "2.0", "id": req_id, "method": method, "params": p}


def assert_modern_result(result):
    assert result["resultType"] == "complete", result
    info = result["_meta"][SERVER_INFO]
    assert info["name"] == "mcp-python-exec-sandbox" and info["version"], info


def check_discover(result):
    assert_modern_result(result)
    assert result["supportedVersions"] == [MODERN, *HANDSHAKE]
    assert result["cacheScope"] == "private" and result["ttlMs"] >= 0
    caps = result["capabilities"]
    assert caps["tools"] == {"listChanged": False}
    assert "subscribe" not in caps["resources"]  # removed in 2026-07-28
    assert "prompts" not in caps  # the product has none: -32601


# ================================================================ stdio

@pytest.fixture
def stdio(make_server):
    return make_server()


def modern(s, req_id, method, params=None, **extra):
    s.send(modern_msg(req_id, method, params, **extra))
    return s.recv_response(req_id, timeout=60)


def test_stdio_discover_does_not_pin_and_initialize_pins_legacy(stdio):
    r = modern(stdio, 1, "server/discover")
    check_discover(r["result"])
    # the probe left the process free: the handshake era as ever
    res = stdio.initialize("2025-11-25")
    assert res["protocolVersion"] == "2025-11-25"
    assert "resultType" not in res
    r = stdio.request("tools/list")
    assert "resultType" not in r["result"] and "ttlMs" not in r["result"]
    # pinned to the handshake era, a modern request is a method it does not know
    r = modern(stdio, 2, "tools/list")
    assert r["error"]["code"] == -32601 and r["id"] == 2, r
    assert stdio.execute("print(6 * 7)")["structuredContent"]["stdout"] == "42\n"


def test_stdio_a_modern_request_pins_modern(stdio):
    r = modern(stdio, "a", "tools/list")
    res = r["result"]
    assert_modern_result(res)
    assert {t["name"] for t in res["tools"]} >= {"execute_python", "validate_script", "check_environment"}
    assert res["cacheScope"] == "private" and res["ttlMs"] >= 0
    # initialize is gone for this process, and says what is served
    r = stdio.request("initialize", {"protocolVersion": "2025-11-25", "capabilities": {}})
    assert r["error"]["code"] == -32601, r
    assert MODERN in r["error"]["message"] and "2025-11-25" in r["error"]["message"]
    # a request without the envelope is a modern request that lacks it
    r = stdio.request("tools/list", {})
    assert r["error"]["code"] == -32602, r
    # discover still answers
    check_discover(modern(stdio, "d", "server/discover")["result"])


def test_stdio_envelope_checks(stdio):
    """R1-R3, every answer with the request's own id."""
    cases = [
        ({}, -32602),                                            # no _meta
        ({"_meta": "x"}, -32602),                                # not an object
        ({"_meta": {CAPS: {}}}, -32602),                         # no version ... but no claim either
        ({"_meta": {PV: MODERN}}, -32602),                       # no clientCapabilities
        ({"_meta": {PV: 20260728, CAPS: {}}}, -32602),           # not a string
        ({"_meta": {PV: MODERN, CAPS: []}}, -32602),             # not an object
        ({"_meta": {PV: MODERN, CAPS: {}, "io.modelcontextprotocol/logLevel": "loud"}}, -32602),
    ]
    for i, (params, code) in enumerate(cases):
        stdio.send({"jsonrpc": "2.0", "id": 100 + i, "method": "server/discover", "params": params})
        r = stdio.recv_response(100 + i)
        assert r["error"]["code"] == code, (params, r)
    # clientInfo is optional
    stdio.send({"jsonrpc": "2.0", "id": 200, "method": "server/discover",
                "params": {"_meta": {PV: MODERN, CAPS: {}}}})
    check_discover(stdio.recv_response(200)["result"])
    r = modern(stdio, 201, "server/discover", version="v999.0.0")
    assert r["id"] == 201 and r["error"]["code"] == -32022, r
    assert r["error"]["data"]["requested"] == "v999.0.0"
    assert r["error"]["data"]["supported"] == [MODERN, *HANDSHAKE]
    for i, method in enumerate(["ping", "logging/setLevel", "resources/subscribe",
                                "resources/unsubscribe", "prompts/list", "no/such"]):
        r = modern(stdio, 300 + i, method)
        assert r["id"] == 300 + i and r["error"]["code"] == -32601, (method, r)


def test_stdio_execute_with_progress_and_cancel(stdio):
    stdio.send(modern_msg(1, "tools/call", {"name": "execute_python", "arguments": {
        "script": "print('hello', flush=True)"}}, progressToken="t1"))
    r = stdio.recv_response(1, timeout=60)
    res = r["result"]
    assert_modern_result(res)
    assert res["structuredContent"]["stdout"] == "hello\n"
    prog = [n for n in stdio.notifications if n["method"] == "notifications/progress"]
    assert prog and all(n["params"]["progressToken"] == "t1" for n in prog)
    # no logLevel asked: no notifications/message at all
    assert not [n for n in stdio.notifications if n["method"] == "notifications/message"]
    # notifications/cancelled is still stdio's cancellation, and kills the script
    stdio.send(modern_msg(2, "tools/call", {"name": "execute_python", "arguments": {
        "script": "import time\nprint('MARK-2026', flush=True)\ntime.sleep(60)",
        "timeout_seconds": 120}}, progressToken="t2"))
    assert wait_until(lambda: any("MARK-2026" in n["params"].get("message", "")
                                  for n in _drain(stdio) if n.get("method") == "notifications/progress"), 30)
    stdio.notify("notifications/cancelled", {"requestId": 2, "reason": "test"})
    r = modern(stdio, 3, "tools/list")  # the process goes on
    assert "result" in r
    assert 2 not in [m.get("id") for m in stdio.stray]


def _drain(s):
    out = []
    try:
        while True:
            m = s.recv(timeout=0.2)
            out.append(m)
            if "id" in m and "method" not in m:
                s.stray.append(m)
    except Exception:
        pass
    return out


# ================================================================ Streamable HTTP

@pytest.fixture
def make_http():
    made = []

    def make(*args, **kwargs):
        s = HttpServer(*args, **kwargs)
        made.append(s)
        return s
    yield make
    for s in made:
        assert s.close() == 0


@pytest.fixture
def tokens(tmp_path):
    path = tmp_path / "tokens"
    path.write_text("alice: tok-alice-0123456789\nbob: tok-bob-9876543210\n")
    return str(path)


# H3: the params member Mcp-Name mirrors, by method.
NAME_SOURCE = {"tools/call": "name", "prompts/get": "name", "resources/read": "uri",
               "tasks/get": "taskId", "tasks/update": "taskId", "tasks/cancel": "taskId"}


def mirrored(msg):
    """The headers a 2026-07-28 client sends for msg (H2, H3), as the reference clients do."""
    hdrs = {"Mcp-Method": msg.get("method", "")}
    value = (msg.get("params") or {}).get(NAME_SOURCE.get(msg.get("method"), ""))
    if isinstance(value, str):
        hdrs["Mcp-Name"] = value
    return hdrs


def mpost(s, msg, version=MODERN, headers=None):
    """A modern POST: no session, the version header as given (None: none), Mcp-Method and
    Mcp-Name mirrored from the body (headers given override them)."""
    hdrs = mirrored(msg)
    if version is not None:
        hdrs["MCP-Protocol-Version"] = version
    hdrs.update(headers or {})
    return s.post(msg, headers=hdrs)


def answer(h, body, req_id):
    if h.get("content-type", "").startswith("text/event-stream"):
        msgs = [m for m in messages(sse_events_from_bytes(body)) if m.get("id") == req_id]
        assert msgs, body[:2000]
        return msgs[0]
    return json.loads(body)


def test_http_served_without_a_session(make_http):
    s = make_http()
    st, h, body = mpost(s, modern_msg(1, "server/discover"))
    assert st == 200, body
    assert "mcp-session-id" not in h
    check_discover(json.loads(body)["result"])
    # an Mcp-Session-Id on a modern request is ignored (not even looked up)
    st, h, body = mpost(s, modern_msg(2, "tools/list"),
                        headers={"Mcp-Session-Id": "5d6b8a9e-0000-4000-8000-000000000000"})
    assert st == 200 and "mcp-session-id" not in h, (st, body)
    res = json.loads(body)["result"]
    assert_modern_result(res)
    assert res["cacheScope"] == "private"
    st, _, body = mpost(s, modern_msg(3, "resources/list"))
    res = json.loads(body)["result"]
    assert st == 200 and res["resources"] == [] and res["ttlMs"] == 0
    st, _, body = mpost(s, modern_msg(4, "resources/templates/list"))
    assert st == 200 and json.loads(body)["result"]["resultType"] == "complete"
    # the handshake era is untouched: a legacy request without a session is refused as ever
    st, _, body = s.post({"jsonrpc": "2.0", "id": 5, "method": "tools/list"})
    assert st == 400 and json.loads(body)["error"]["code"] == -32000
    sid = s.initialize()
    st, h, body = s.post({"jsonrpc": "2.0", "id": 6, "method": "tools/list"}, sid, version="2025-11-25")
    assert st == 200 and h["mcp-session-id"] == sid
    assert "resultType" not in json.loads(body)["result"]


def test_http_status_codes(make_http):
    """H4 and H5, each error with the request's id (R3)."""
    s = make_http()

    def check(msg, want_status, want_code, **kw):
        st, _, body = mpost(s, msg, **kw)
        j = json.loads(body)
        assert (st, j["error"]["code"], j["id"]) == (want_status, want_code, msg["id"]), (msg, st, j)
        return j

    # R1: a malformed envelope (the header says 2026-07-28, the body does not)
    check({"jsonrpc": "2.0", "id": 1, "method": "server/discover", "params": {}}, 400, -32602)
    check({"jsonrpc": "2.0", "id": 2, "method": "tools/list", "params": {"_meta": {CAPS: {}}}}, 400, -32602)
    check({"jsonrpc": "2.0", "id": 3, "method": "tools/list", "params": {"_meta": {PV: MODERN}}}, 400, -32602)
    # R2: a version not served, header and body agreeing
    j = check(modern_msg(4, "server/discover", version="v999.0.0"), 400, -32022, version="v999.0.0")
    assert j["error"]["data"] == {"supported": [MODERN, *HANDSHAKE], "requested": "v999.0.0"}
    # H5: the header must equal _meta's version, and must be there
    check(modern_msg(5, "server/discover", version="v999.0.0"), 400, -32020)
    check(modern_msg(6, "tools/list"), 400, -32020, version="2025-11-25")
    check(modern_msg(7, "tools/list"), 400, -32020, version=None)
    # R3: removed and unknown methods are 404 -32601; initialize claiming the revision too
    for i, method in enumerate(["initialize", "ping", "logging/setLevel", "resources/subscribe",
                                "resources/unsubscribe", "unknown/method"]):
        check(modern_msg(10 + i, method), 404, -32601)
    # a tool's own failure is a result (200); an unknown tool is invalid params
    check(modern_msg(20, "tools/call", {"name": "no_such_tool", "arguments": {}}), 400, -32602)
    # R7: resource not found is -32602 with data.uri in the modern era
    j = check(modern_msg(21, "resources/read", {"uri": "sandbox://runs/nope/x.txt"}), 400, -32602)
    assert j["error"]["data"]["uri"] == "sandbox://runs/nope/x.txt"


def test_http_execute_with_progress_on_its_own_stream(make_http):
    s = make_http()
    msg = modern_msg(1, "tools/call", {"name": "execute_python", "arguments": {
        "script": "import time\nfor i in range(3):\n    print('line', i, flush=True)\n    time.sleep(0.2)\n"}},
        progressToken="p")
    c = s.connect()
    c.request("POST", "/mcp", json.dumps(msg).encode(),
              {"Accept": ACCEPT_BOTH, "Content-Type": "application/json",
               "MCP-Protocol-Version": MODERN, **mirrored(msg)})
    r = c.getresponse()
    assert r.status == 200 and r.getheader("Content-Type") == "text/event-stream"
    assert r.getheader("Mcp-Session-Id") is None
    events = list(sse_events(r))
    c.close()
    assert all("id" not in e for e in events), events  # no resumption: no event ids
    msgs = messages(events)
    progress = [m for m in msgs if m.get("method") == "notifications/progress"]
    assert progress and all(m["params"]["progressToken"] == "p" for m in progress)
    final = [m for m in msgs if m.get("id") == 1]
    assert len(final) == 1 and msgs[-1] is final[0]
    assert_modern_result(final[0]["result"])
    assert final[0]["result"]["structuredContent"]["stdout"] == "line 0\nline 1\nline 2\n"


@pytest.mark.parametrize("streaming", [True, False])
def test_http_closing_the_stream_cancels_the_call(make_http, streaming):
    """H7: on 2026-07-28 closing the response stream is the cancellation (the handshake era's
    lost connection is not, test_http.py's resumption tests); the script's tree dies."""
    s = make_http()
    marker = f"mps-h7-{os.getpid()}-{int(streaming)}"
    script = ("import subprocess, sys, time\n"
              f"subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(300) # {marker}'])\n"
              "print('started', flush=True)\ntime.sleep(300)\n")
    extra = {"progressToken": "k"} if streaming else {}
    msg = modern_msg(1, "tools/call", {"name": "execute_python",
                                       "arguments": {"script": script, "timeout_seconds": 280}}, **extra)
    c = s.connect()
    c.request("POST", "/mcp", json.dumps(msg).encode(),
              {"Accept": ACCEPT_BOTH, "Content-Type": "application/json",
               "MCP-Protocol-Version": MODERN, **mirrored(msg)})
    if streaming:
        r = c.getresponse()
        assert r.status == 200
        for ev in sse_events(r):  # lazily: the stream goes on
            if ev.get("data") and json.loads(ev["data"]).get("method") == "notifications/progress":
                break
    assert wait_until(lambda: processes_with_marker(marker), 30)
    c.sock.shutdown(2)
    c.close()
    assert wait_until(lambda: not processes_with_marker(marker), 30), processes_with_marker(marker)
    # and the server goes on
    st, _, body = mpost(s, modern_msg(2, "tools/list"))
    assert st == 200, body


WRITES_ARTIFACT = ("import os\nos.makedirs('outputs', exist_ok=True)\n"
                   "open('outputs/secret.txt', 'w').write('alice only')\n")


def test_http_modern_requests_are_tenants(make_http, tokens, tmp_path):
    """A modern request runs as its token's principal: under its caps, owning what it makes,
    and reaching nothing of another's; no session is minted for it, none outlives it."""
    s = make_http("--auth-token-file", tokens, "--profile", "lan", "--no-warm-cache")
    st, h, _ = mpost(s, modern_msg(1, "server/discover"))
    assert st == 401 and "www-authenticate" in h  # the token comes first
    call = modern_msg(2, "tools/call", {"name": "execute_python", "arguments": {"script": WRITES_ARTIFACT}})
    st, h, body = mpost(s, call, headers=ALICE)
    assert st == 200, body
    res = answer(h, body, 2)["result"]
    links = [c["uri"] if c["type"] == "resource_link" else c["resource"]["uri"]
             for c in res["content"] if c["type"] in ("resource_link", "resource")]
    assert links, res
    uri = links[0]
    # alice reads it statelessly, and through a legacy session of hers too
    st, h, body = mpost(s, modern_msg(3, "resources/read", {"uri": uri}), headers=ALICE)
    assert st == 200 and answer(h, body, 3)["result"]["contents"][0]["text"] == "alice only"
    # bob neither sees nor reads it, in either era
    st, h, body = mpost(s, modern_msg(4, "resources/list"), headers=BOB)
    assert st == 200 and answer(h, body, 4)["result"]["resources"] == []
    st, _, body = mpost(s, modern_msg(5, "resources/read", {"uri": uri}), headers=BOB)
    assert st == 400 and json.loads(body)["error"]["code"] == -32602
    bob = s.initialize(headers=BOB)
    st, _, body = s.post({"jsonrpc": "2.0", "id": 6, "method": "resources/read", "params": {"uri": uri}},
                         bob, headers=BOB, version="2025-11-25")
    assert json.loads(body)["error"]["code"] == -32002
    # nothing of alice's modern requests stayed: no session of hers exists
    env = modern_msg(7, "tools/call", {"name": "check_environment", "arguments": {}})
    st, h, body = mpost(s, env, headers=ALICE)
    tenant = answer(h, body, 7)["result"]["structuredContent"]["tenant"]
    assert tenant["http"]["sessions"] == 0, tenant

    # --max-token-concurrent (4 in lan) holds across modern requests: each is no session
    # of its own to hide behind
    barrier = tmp_path / "go"
    hold = (f"import os, time\nprint('held', flush=True)\n"
            f"while not os.path.exists({str(barrier)!r}):\n    time.sleep(0.05)\n")
    held = []
    for i in range(4):
        c = s.connect()
        msg = modern_msg(100 + i, "tools/call", {"name": "execute_python",
                                                 "arguments": {"script": hold, "timeout_seconds": 60}},
                         progressToken=f"h{i}")
        c.request("POST", "/mcp", json.dumps(msg).encode(),
                  {"Accept": ACCEPT_BOTH, "Content-Type": "application/json",
                   "MCP-Protocol-Version": MODERN, **mirrored(msg), **ALICE})
        held.append((c, c.getresponse()))
    assert all(r.status == 200 for _, r in held)

    def alice_calls():
        st, h, body = mpost(s, modern_msg(8, "tools/call", {"name": "check_environment", "arguments": {}}),
                            headers=ALICE)
        return answer(h, body, 8)["result"]["structuredContent"]["tenant"]["executions"]["calls"]
    assert wait_until(lambda: alice_calls() == 4, 30)
    st, h, body = mpost(s, modern_msg(9, "tools/call", {"name": "execute_python",
                                                        "arguments": {"script": "print(1)"}}), headers=ALICE)
    res = answer(h, body, 9)["result"]
    assert res["isError"] and "--max-token-concurrent" in res["content"][0]["text"], res
    # bob's share is his
    st, h, body = mpost(s, modern_msg(10, "tools/call", {"name": "execute_python",
                                                         "arguments": {"script": "print('bob')"}}), headers=BOB)
    assert answer(h, body, 10)["result"]["structuredContent"]["stdout"] == "bob\n"
    barrier.write_text("")
    for c, r in held:
        msgs = messages(sse_events(r))
        assert any("result" in m for m in msgs), msgs
        c.close()
    assert wait_until(lambda: alice_calls() == 0, 30)


# ================================================================ mirrored headers (H2, H3, H6)

def b64(text):
    import base64
    return "=?base64?" + base64.b64encode(text.encode()).decode() + "?="


def check_mismatch(s, msg, headers):
    """A 2026-07-28 POST with exactly these mirrored headers: 400 -32020 with the request's id."""
    st, _, body = s.post(msg, headers={"MCP-Protocol-Version": MODERN, **headers})
    j = json.loads(body)
    assert (st, j["error"]["code"], j["id"]) == (400, -32020, msg["id"]), (headers, st, j)
    return j


def check_served(s, msg, headers):
    st, _, body = s.post(msg, headers={"MCP-Protocol-Version": MODERN, **headers})
    assert st < 400, (headers, st, body)
    return answer_of(body, msg["id"])


def answer_of(body, req_id):
    text = body.decode("utf-8", "replace")
    if text.lstrip().startswith("{"):
        return json.loads(text)
    return [m for m in messages(sse_events_from_bytes(body)) if m.get("id") == req_id][0]


def test_http_mcp_method_is_required_and_must_match(make_http):
    """H2: Mcp-Method on every modern POST, equal to the body's method (values are
    case-sensitive, header names are not); the handshake era does not need it."""
    s = make_http()
    msg = modern_msg(1, "tools/list")
    check_mismatch(s, msg, {})
    check_mismatch(s, msg, {"Mcp-Method": "prompts/list"})
    check_mismatch(s, msg, {"Mcp-Method": "TOOLS/LIST"})
    check_mismatch(s, msg, {"Mcp-Method": "tools/list\xe9"})  # not visible ASCII
    check_mismatch(s, msg, {"Mcp-Method": "=?base64?dG9vbHMvbGlzdA?="})  # unpadded base64
    for name in ("Mcp-Method", "mcp-method", "MCP-METHOD"):
        assert "tools" in check_served(s, msg, {name: "tools/list"})["result"]
    assert "tools" in check_served(s, msg, {"Mcp-Method": "  tools/list\t"})["result"]
    assert "tools" in check_served(s, msg, {"Mcp-Method": b64("tools/list")})["result"]
    # the handshake era: no such header, as before
    sid = s.initialize()
    st, _, body = s.post({"jsonrpc": "2.0", "id": 2, "method": "tools/list"}, sid, version="2025-11-25")
    assert st == 200 and "tools" in json.loads(body)["result"], body


def test_http_mcp_name_mirrors_the_named_thing(make_http):
    """H3: Mcp-Name = params.name of tools/call, params.uri of resources/read: present,
    missing, mismatched, in the base64 form, bad base64, non-ASCII."""
    s = make_http()
    call = modern_msg(1, "tools/call", {"name": "check_environment", "arguments": {}})
    method = {"Mcp-Method": "tools/call"}
    check_mismatch(s, call, method)
    check_mismatch(s, call, {**method, "Mcp-Name": "execute_python"})
    check_mismatch(s, call, {**method, "Mcp-Name": "Check_Environment"})
    check_mismatch(s, call, {**method, "Mcp-Name": "=?base64?Y2hlY2tfZW52aXJvbm1lbnQ?="})  # no padding
    check_mismatch(s, call, {**method, "Mcp-Name": "=?base64?Y2hl!!!Y2tf?="})  # not the alphabet
    check_mismatch(s, call, {**method, "Mcp-Name": "check_environment\xe9"})  # not visible ASCII
    # a literal that only looks half like the encoded form is a literal
    check_mismatch(s, call, {**method, "Mcp-Name": "=?base64?Y2hlY2tfZW52aXJvbm1lbnQ="})
    for value in ("check_environment", " check_environment ", b64("check_environment")):
        res = check_served(s, call, {**method, "Mcp-Name": value})["result"]
        assert res["resultType"] == "complete" and not res.get("isError"), res
    # resources/read mirrors the URI; base64 carries what a header cannot (UTF-8)
    uri = "sandbox://runs/nope/caf\u00e9.txt"
    read = modern_msg(2, "resources/read", {"uri": uri})
    rm = {"Mcp-Method": "resources/read"}
    check_mismatch(s, read, rm)
    check_mismatch(s, read, {**rm, "Mcp-Name": "sandbox://runs/nope/cafe.txt"})
    check_mismatch(s, read, {**rm, "Mcp-Name": "=?base64?/w==?="})  # decodes to a byte that is not UTF-8
    st, _, body = s.post(read, headers={"MCP-Protocol-Version": MODERN, **rm, "Mcp-Name": b64(uri)})
    j = json.loads(body)
    # past the headers, the router's own answer: not found (R7)
    assert (st, j["error"]["code"], j["error"]["data"]["uri"]) == (400, -32602, uri), j
    # a method that names nothing needs no Mcp-Name
    assert check_served(s, modern_msg(3, "resources/list"), {"Mcp-Method": "resources/list"})["result"]
    # the handshake era: tools/call without Mcp-Name, as before
    sid = s.initialize()
    st, _, body = s.post({"jsonrpc": "2.0", "id": 4, "method": "tools/call",
                          "params": {"name": "check_environment", "arguments": {}}}, sid, version="2025-11-25")
    assert st == 200 and "result" in answer_of(body, 4), body


FIXTURE = os.environ.get("MPS_CONFORMANCE_FIXTURE") or os.path.join(
    os.path.dirname(os.environ.get("MPS_BINARY") or "build/mcp-python-exec-sandbox"), "mps-conformance-fixture")


@pytest.fixture
def fixture_http(monkeypatch):
    """The conformance fixture server (the product's router and transport plus fixtures),
    whose test_custom_header marks its region argument with x-mcp-header: Region."""
    import test_http
    if not os.path.exists(FIXTURE):
        pytest.skip(f"no fixture server at {FIXTURE}")
    monkeypatch.setattr(test_http, "BINARY", os.path.abspath(FIXTURE))
    s = HttpServer()
    yield s
    assert s.close() == 0


def test_http_mcp_param_headers(fixture_http):
    """H6: a tools/call argument its tool marks with x-mcp-header travels as Mcp-Param-<Name>
    too: required when the argument is there, refused when it is not, equal after decoding."""
    s = fixture_http
    st, _, body = s.post(modern_msg(1, "tools/list"), headers={"MCP-Protocol-Version": MODERN,
                                                               "Mcp-Method": "tools/list"})
    tool = [t for t in json.loads(body)["result"]["tools"] if t["name"] == "test_custom_header"][0]
    assert tool["inputSchema"]["properties"]["region"]["x-mcp-header"] == "Region"

    def call(i, args):
        return modern_msg(i, "tools/call", {"name": "test_custom_header", "arguments": args})
    hdrs = {"Mcp-Method": "tools/call", "Mcp-Name": "test_custom_header"}
    res = check_served(s, call(2, {"region": "us-west1"}), {**hdrs, "Mcp-Param-Region": "us-west1"})
    assert res["result"]["content"][0]["text"] == "Region: us-west1", res
    res = check_served(s, call(3, {"region": "Hello"}), {**hdrs, "mcp-param-region": b64("Hello")})
    assert res["result"]["content"][0]["text"] == "Region: Hello", res
    res = check_served(s, call(4, {"region": "\u65e5\u672c"}), {**hdrs, "Mcp-Param-Region": b64("\u65e5\u672c")})
    assert res["result"]["content"][0]["text"] == "Region: \u65e5\u672c", res
    check_mismatch(s, call(5, {"region": "us-west1"}), hdrs)  # missing
    check_mismatch(s, call(6, {"region": "us-west1"}), {**hdrs, "Mcp-Param-Region": "eu-west1"})
    check_mismatch(s, call(7, {"region": "Hello"}), {**hdrs, "Mcp-Param-Region": "=?base64?SGVsbG8?="})
    check_mismatch(s, call(8, {"region": "Hello"}), {**hdrs, "Mcp-Param-Region": "=?base64?SGVs!!!bG8=?="})
    check_mismatch(s, call(9, {}), {**hdrs, "Mcp-Param-Region": "us-west1"})  # no such argument
    check_mismatch(s, call(10, {"region": None}), {**hdrs, "Mcp-Param-Region": "us-west1"})


# ================================================================ subscriptions/listen (R8)

SUB = "io.modelcontextprotocol/subscriptionId"


def listen_msg(req_id, **filt):
    return modern_msg(req_id, "subscriptions/listen", {"notifications": filt})


def test_stdio_listen_acknowledges_tags_and_ends_on_cancel(stdio):
    stdio.send(listen_msg("L", toolsListChanged=True, promptsListChanged=True,
                          resourcesListChanged=True, resourceSubscriptions=["sandbox://runs/x/y"]))
    ack = stdio.recv(timeout=30)
    assert ack["method"] == "notifications/subscriptions/acknowledged", ack
    assert ack["params"]["_meta"][SUB] == "L"
    # only what the server sends: its tools never change, it has no prompts, its artifacts
    # never change once written; the resource list does (every run that leaves outputs/)
    assert ack["params"]["notifications"] == {"resourcesListChanged": True}
    r = modern(stdio, 2, "tools/call", {"name": "execute_python", "arguments": {"script": WRITES_ARTIFACT}})
    assert r["result"]["isError"] is False, r
    changed = [m for m in stdio.notifications + _drain(stdio) if m.get("method") == "notifications/resources/list_changed"]
    assert changed and all(m["params"]["_meta"][SUB] == "L" for m in changed), changed
    # a run that leaves no artifact changes nothing
    stdio.notifications.clear()
    modern(stdio, 3, "tools/call", {"name": "execute_python", "arguments": {"script": "pass"}})
    assert not [m for m in stdio.notifications + _drain(stdio) if m.get("method", "").endswith("list_changed")]
    # cancelled, the stream says nothing more, not even a result
    stdio.send({"jsonrpc": "2.0", "method": "notifications/cancelled", "params": {"requestId": "L"}})
    stdio.notifications.clear()
    modern(stdio, 4, "tools/call", {"name": "execute_python", "arguments": {"script": WRITES_ARTIFACT}})
    late = [m for m in stdio.notifications + _drain(stdio) if m.get("method", "").endswith("list_changed") or m.get("id") == "L"]
    assert not late, late


def test_stdio_listen_checks_its_filter_and_caps_streams(make_server):
    stdio = make_server("--max-listens-local", "8")
    bad = [{}, {"notifications": "all"}, {"notifications": {"toolsListChanged": "yes"}},
           {"notifications": {"resourceSubscriptions": "sandbox://x"}},
           {"notifications": {"resourceSubscriptions": [1]}},
           {"notifications": {"resourceSubscriptions": ["u"] * 65}},
           {"notifications": {"resourceSubscriptions": ["x" * 2049]}}]
    for i, params in enumerate(bad):
        r = modern(stdio, 10 + i, "subscriptions/listen", params)
        assert r["id"] == 10 + i and r["error"]["code"] == -32602, (params, r)
    # eight streams (--max-listens-local); the ninth ends the oldest idle one (s0) with its
    # result, not itself: a client that opens one per connection keeps hearing on its newest
    for i in range(8):
        stdio.send(listen_msg(f"s{i}", resourcesListChanged=True))
        assert stdio.recv(timeout=30)["params"]["_meta"][SUB] == f"s{i}"
    stdio.send(listen_msg("s8"))
    got = [stdio.recv(timeout=30), stdio.recv(timeout=30)]
    ended = [m for m in got if m.get("id") == "s0"]
    assert ended and ended[0]["result"]["_meta"][SUB] == "s0", got
    ack = [m for m in got if m.get("method") == "notifications/subscriptions/acknowledged"]
    assert ack and ack[0]["params"]["_meta"][SUB] == "s8", got
    stdio.send({"jsonrpc": "2.0", "method": "notifications/cancelled", "params": {"requestId": "s1"}})
    stdio.send(listen_msg("s9"))
    ack = stdio.recv(timeout=30)
    assert ack["params"]["_meta"][SUB] == "s9" and ack["params"]["notifications"] == {}, ack
    # the process pinned to the modern era, a legacy client's initialize is still refused
    r = stdio.request("initialize", {"protocolVersion": "2025-11-25", "capabilities": {}})
    assert r["error"]["code"] == -32601


def _open_listen(s, req_id, headers=None, **filt):
    msg = listen_msg(req_id, **filt)
    c = s.connect()
    c.request("POST", "/mcp", json.dumps(msg).encode(),
              {"Accept": ACCEPT_BOTH, "Content-Type": "application/json",
               "MCP-Protocol-Version": MODERN, **mirrored(msg), **(headers or {})})
    r = c.getresponse()
    assert r.status == 200 and r.getheader("Content-Type") == "text/event-stream", r.read()[:500]
    return c, sse_events(r)


def _next_message(events):
    for ev in events:
        if ev.get("data"):
            return json.loads(ev["data"])
    return None


def test_http_listen_streams_belong_to_their_principal(make_http, tokens):
    s = make_http("--auth-token-file", tokens, "--profile", "lan", "--no-warm-cache")
    ca, ea = _open_listen(s, "la", ALICE, resourcesListChanged=True)
    ack = _next_message(ea)
    assert ack["method"] == "notifications/subscriptions/acknowledged" and ack["params"]["_meta"][SUB] == "la"
    cb, eb = _open_listen(s, "lb", BOB, resourcesListChanged=True)
    assert _next_message(eb)["params"]["_meta"][SUB] == "lb"
    call = modern_msg(2, "tools/call", {"name": "execute_python", "arguments": {"script": WRITES_ARTIFACT}})
    st, _, body = mpost(s, call, headers=ALICE)
    assert st == 200, body
    n = _next_message(ea)
    assert n["method"] == "notifications/resources/list_changed" and n["params"]["_meta"][SUB] == "la", n
    # bob's stream heard nothing of alice's artifacts: the next thing on it is his own
    st, _, body = mpost(s, modern_msg(3, "tools/call", {"name": "execute_python",
                                                        "arguments": {"script": WRITES_ARTIFACT}}), headers=BOB)
    assert st == 200, body
    n = _next_message(eb)
    assert n["method"] == "notifications/resources/list_changed" and n["params"]["_meta"][SUB] == "lb", n
    # closing the connection ends the subscription: eight more fit for alice afterwards
    ca.sock.shutdown(2)
    ca.close()
    conns = []
    for i in range(8):
        for _ in range(50):  # the server notices the close on its next write or poll
            c, ev = _open_listen(s, f"m{i}", ALICE)
            m = _next_message(ev)
            if m.get("method") == "notifications/subscriptions/acknowledged":
                conns.append(c)
                break
            c.close()
        else:
            raise AssertionError(f"stream {i} was refused: {m}")
    cb.close()
    for c in conns:
        c.close()


def test_http_drain_ends_listen_streams_with_their_result(make_http):
    import signal
    s = make_http("--drain-seconds", "20")
    c, events = _open_listen(s, "ld", resourcesListChanged=True)
    assert _next_message(events)["method"] == "notifications/subscriptions/acknowledged"
    s.proc.send_signal(signal.SIGTERM)
    end = _next_message(events)
    assert end["id"] == "ld" and end["result"]["_meta"][SUB] == "ld", end
    assert_modern_result(end["result"])
    c.close()
    assert s.proc.wait(timeout=30) == 0


def test_http_listen_needs_a_stream(make_http):
    """A listen whose client accepts JSON only would hold a slot and hear nothing: 406, with
    the request's id."""
    s = make_http()
    msg = listen_msg("lj", resourcesListChanged=True)
    st, _, body = mpost(s, msg, headers={"Accept": "application/json"})
    j = json.loads(body)
    assert st == 406 and j["id"] == "lj", (st, body)


def test_http_listen_hears_each_answered_question_of_a_watched_task(fixture_http):
    """The tasks extension's taskIds: a change of the questions waiting in a task's
    inputRequests is a change the stream hears, not only a change of status.  The fixture's
    multi_input asks two questions at once; the client answers one, then the other: the
    stream hears both questions, then the one left, then the task working and completed."""
    s = fixture_http
    ext = "io.modelcontextprotocol/tasks"
    declared = {CAPS: {"extensions": {ext: {}}, "elicitation": {}}}

    def post(msg):
        st, h, body = mpost(s, msg)
        assert st == 200, body
        return answer(h, body, msg["id"])

    created = post(modern_msg(1, "tools/call", {"name": "multi_input", "arguments": {}}, **declared))["result"]
    assert created["resultType"] == "task", created
    tid = created["taskId"]
    msg = modern_msg("lt", "subscriptions/listen", {"notifications": {"taskIds": [tid]}}, **declared)
    c = s.connect()
    c.request("POST", "/mcp", json.dumps(msg).encode(),
              {"Accept": ACCEPT_BOTH, "Content-Type": "application/json", "MCP-Protocol-Version": MODERN,
               **mirrored(msg)})
    r = c.getresponse()
    assert r.status == 200 and r.getheader("Content-Type") == "text/event-stream", r.read()[:500]
    events = sse_events(r)
    assert _next_message(events)["params"]["notifications"] == {"taskIds": [tid]}
    first = _next_message(events)["params"]
    assert first["status"] == "input_required" and len(first["inputRequests"]) == 2, first
    one, other = sorted(first["inputRequests"])
    yes = {"action": "accept", "content": {"confirm": True}}
    for i, key in enumerate((one, other)):
        res = post(modern_msg(10 + i, "tasks/update", {"taskId": tid, "inputResponses": {key: yes}}, **declared))
        assert "result" in res, res
    heard = []
    while not heard or heard[-1][0] not in ("completed", "failed", "cancelled"):
        n = _next_message(events)
        assert n and n["method"] == "notifications/tasks", n
        heard.append((n["params"]["status"], sorted(n["params"].get("inputRequests") or {})))
    assert heard == [("input_required", [other]), ("working", []), ("completed", [])], heard
    c.close()
    # Both answered in one update: no state in between (the one left was answered too).
    tid = post(modern_msg(2, "tools/call", {"name": "multi_input", "arguments": {}}, **declared))["result"]["taskId"]
    msg = modern_msg("lt2", "subscriptions/listen", {"notifications": {"taskIds": [tid]}}, **declared)
    c = s.connect()
    c.request("POST", "/mcp", json.dumps(msg).encode(),
              {"Accept": ACCEPT_BOTH, "Content-Type": "application/json", "MCP-Protocol-Version": MODERN,
               **mirrored(msg)})
    events = sse_events(c.getresponse())
    assert _next_message(events)["params"]["notifications"] == {"taskIds": [tid]}
    keys = sorted(_next_message(events)["params"]["inputRequests"])
    res = post(modern_msg(20, "tasks/update", {"taskId": tid, "inputResponses": {k: yes for k in keys}}, **declared))
    assert "result" in res, res
    heard = [_next_message(events)["params"]["status"] for _ in range(2)]
    assert heard == ["working", "completed"], heard
    c.close()


def test_stdio_local_principal_holds_more_listen_streams_by_default(stdio):
    # Every local client is one principal: twelve streams (a dozen Claude Code sessions) all hear.
    for i in range(12):
        stdio.send(listen_msg(f"m{i}", resourcesListChanged=True))
        m = stdio.recv(timeout=30)
        assert m.get("method") == "notifications/subscriptions/acknowledged" and m["params"]["_meta"][SUB] == f"m{i}", m

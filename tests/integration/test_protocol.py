"""JSON-RPC envelope, MCP lifecycle and router behaviour over stdio."""
import json

import pytest

from conftest import Server

VERSIONS = ["2024-11-05", "2025-03-26", "2025-06-18", "2025-11-25"]


@pytest.mark.parametrize("version", VERSIONS)
def test_initialize_echoes_supported_version(make_server, version):
    s = make_server()
    r = s.request("initialize", {"protocolVersion": version, "capabilities": {},
                                 "clientInfo": {"name": "t", "version": "1"}})
    res = r["result"]
    assert res["protocolVersion"] == version
    assert "tools" in res["capabilities"]
    assert res["capabilities"]["logging"] == {}
    assert res["serverInfo"]["name"] == "mcp-python-exec-sandbox"
    assert res["serverInfo"]["version"]


def test_initialize_unknown_version_gets_latest(make_server):
    s = make_server()
    r = s.request("initialize", {"protocolVersion": "1999-01-01", "capabilities": {}})
    assert r["result"]["protocolVersion"] == "2025-11-25"


def test_initialize_without_version_is_invalid_params(make_server):
    s = make_server()
    r = s.request("initialize", {"capabilities": {}})
    assert r["error"]["code"] == -32602
    r = s.request("initialize", {"protocolVersion": 20250618})
    assert r["error"]["code"] == -32602


def test_second_initialize_is_refused(server):
    r = server.request("initialize", {"protocolVersion": "2025-06-18", "capabilities": {}})
    assert r["error"]["code"] == -32600


def test_requests_before_initialize_get_clear_error(make_server):
    s = make_server()
    r = s.request("tools/list")
    assert r["error"]["code"] == -32600
    assert "initialize" in r["error"]["message"]
    # ping is allowed at any time
    assert s.request("ping")["result"] == {}


def test_ping_is_exactly_empty(server):
    r = server.request("ping")
    assert r == {"jsonrpc": "2.0", "id": r["id"], "result": {}}


def test_id_kept_exactly(server):
    for rid in ["abc", 0, -5, 2**53, "1"]:
        r = server.request("ping", req_id=rid)
        assert r["id"] == rid and type(r["id"]) is type(rid)


def test_tools_list(server):
    r = server.request("tools/list")
    tools = r["result"]["tools"]
    names = [t["name"] for t in tools]
    assert names[:2] == ["execute_python", "check_environment"]
    assert "nextCursor" not in r["result"]
    ex = tools[0]
    props = ex["inputSchema"]["properties"]
    assert ex["inputSchema"]["type"] == "object"
    assert set(["script", "dependencies", "timeout_seconds"]) <= set(props)
    assert ex["inputSchema"]["required"] == ["script"]
    assert props["timeout_seconds"]["default"] == 30
    assert props["timeout_seconds"]["maximum"] == 300
    assert ex["outputSchema"]["type"] == "object"
    for t in tools:
        assert t["description"]
        # close_session (a session tool), cancel_run and evict_environment change state too;
        # every other tool only reads.
        assert t["annotations"]["readOnlyHint"] == (
            t["name"] not in ("execute_python", "close_session", "evict_environment", "cancel_run"))
    assert {"wait_run", "cancel_run"} <= set(names)
    # deterministic
    assert server.request("tools/list")["result"] == r["result"]


def test_tools_list_is_small(make_server):
    # Every agent pays for the list in context in every conversation (issue 36): 4 KB in all,
    # the JSON-RPC answer as sent, on each backend's description and with MCP Apps declared.
    for backend, apps in (("none", False), ("none", True), ("bwrap", False), ("bwrap", True)):
        s = make_server(backend=backend)
        caps = {"extensions": {"io.modelcontextprotocol/ui": {"mimeTypes": ["text/html;profile=mcp-app"]}}} \
            if apps else {}
        s.request("initialize", {"protocolVersion": "2025-06-18", "capabilities": caps,
                                 "clientInfo": {"name": "t", "version": "1"}})
        s.notify("notifications/initialized")
        r = s.request("tools/list")
        wire = json.dumps(r, separators=(",", ":"))
        assert len(wire.encode()) <= 4096, len(wire)
        # Nothing in it names a method a host may not offer its model.
        assert "resources/read" not in wire
        # The cached answer is the same answer.
        assert s.request("tools/list")["result"] == r["result"]


def test_tools_list_bad_cursor(server):
    r = server.request("tools/list", {"cursor": "bogus"})
    assert r["error"]["code"] == -32602


def test_malformed_json_then_keeps_serving(server):
    server.send_raw(b'{"jsonrpc": "2.0", "id": 1, "method": "ping"\n')
    r = server.recv()
    assert r["error"]["code"] == -32700 and r["id"] is None
    server.send_raw(b"\xff\xfe garbage\n")
    assert server.recv()["error"]["code"] == -32700
    assert server.request("ping")["result"] == {}


def test_duplicate_keys_rejected(server):
    server.send_raw(b'{"jsonrpc":"2.0","id":1,"id":2,"method":"ping"}\n')
    assert server.recv()["error"]["code"] == -32700


def test_deep_nesting_rejected(server):
    server.send_raw(b'{"jsonrpc":"2.0","id":1,"method":"ping","params":{"a":' + b"[" * 100000 + b"]" * 100000 + b"}}\n")
    r = server.recv()
    assert r["error"]["code"] == -32600
    assert server.request("ping")["result"] == {}


@pytest.mark.parametrize("msg,code", [
    ({"jsonrpc": "1.0", "id": 1, "method": "ping"}, -32600),
    ({"id": 1, "method": "ping"}, -32600),
    ({"jsonrpc": "2.0", "id": 1, "method": 5}, -32600),
    ({"jsonrpc": "2.0", "id": None, "method": "ping"}, -32600),
    ({"jsonrpc": "2.0", "id": 1.5, "method": "ping"}, -32600),
    ({"jsonrpc": "2.0", "id": {"a": 1}, "method": "ping"}, -32600),
    ({"jsonrpc": "2.0", "id": 1, "method": "ping", "params": "x"}, -32600),
    ({"jsonrpc": "2.0", "id": 1}, -32600),
    ([], -32600),
    ("just a string", -32600),
    (42, -32600),
])
def test_invalid_requests(server, msg, code):
    server.send(msg)
    r = server.recv()
    assert r["error"]["code"] == code
    assert server.request("ping")["result"] == {}


def test_invalid_request_keeps_valid_id(server):
    server.send({"jsonrpc": "1.0", "id": 77, "method": "ping"})
    r = server.recv()
    assert r["id"] == 77 and r["error"]["code"] == -32600


def test_unknown_method(server):
    r = server.request("nope/nothing")
    assert r["error"]["code"] == -32601


def test_notifications_never_answered(server):
    server.notify("notifications/whatever")
    server.notify("tools/list")  # a method without an id is a notification: no answer
    server.send({"jsonrpc": "2.0", "method": "ping", "params": 5})  # invalid params, still no id...
    r = server.recv()  # ...but an invalid message gets an error with a null id
    assert r["error"]["code"] == -32600 and r["id"] is None
    assert server.request("ping", req_id="after")["id"] == "after"
    # Nothing else came back: any answer to the notifications would sit in stray.
    assert server.stray == []


def test_responses_from_client_are_ignored(server):
    # Responses to requests the server never sent (a result, an error, a string id): no
    # answer, no error, and the session goes on.  recv_response puts every message with
    # another id in stray, so an answer to any of them would show there.
    server.send({"jsonrpc": "2.0", "id": 99, "result": {}})
    server.send({"jsonrpc": "2.0", "id": "s-1", "error": {"code": -32601, "message": "no"}})
    server.send({"jsonrpc": "2.0", "id": 100, "result": {"roots": []}})
    assert server.request("ping", req_id="x")["id"] == "x"
    assert server.request("ping", req_id="y")["id"] == "y"
    assert server.stray == []


def test_wrong_param_types(server):
    r = server.request("tools/call", {"name": 5})
    assert r["error"]["code"] == -32602
    r = server.request("tools/call", {"name": "execute_python", "arguments": [1]})
    assert r["error"]["code"] == -32602
    r = server.request("tools/call", {"name": "no_such_tool", "arguments": {}})
    assert r["error"]["code"] == -32602
    r = server.request("tools/call", {})
    assert r["error"]["code"] == -32602


def test_tool_argument_errors_are_tool_results(server):
    res = server.call("execute_python", {"script": 5})
    assert res["isError"] is True and "script" in res["content"][0]["text"]
    res = server.call("execute_python", {})
    assert res["isError"] is True
    res = server.call("execute_python", {"script": "pass", "timeout_seconds": "ten"})
    assert res["isError"] is True
    res = server.call("execute_python", {"script": "pass", "timeout_seconds": 0})
    assert res["isError"] is True
    res = server.call("execute_python", {"script": "pass", "dependencies": "numpy"})
    assert res["isError"] is True
    res = server.call("execute_python", {"script": "pass", "dependencies": [1]})
    assert res["isError"] is True
    res = server.call("execute_python", {"script": "pass", "surprise": 1})
    assert res["isError"] is True and "surprise" in res["content"][0]["text"]


def test_oversize_line(make_server):
    s = make_server("--max-message-bytes", "65536")
    s.initialize()
    s.send_raw(b'{"jsonrpc":"2.0","id":1,"method":"ping","params":{"x":"' + b"a" * 300000 + b'"}}\n')
    r = s.recv()
    assert r["error"]["code"] == -32600 and "exceeds" in r["error"]["message"]
    assert s.request("ping")["result"] == {}
    # and a huge line without a newline for a while, then a newline
    s.send_raw(b"x" * 2_000_000)
    s.send_raw(b"\n")
    assert s.recv()["error"]["code"] == -32600
    assert s.request("ping")["result"] == {}


def test_crlf_and_blank_lines(server):
    server.send_raw(b'\r\n\n{"jsonrpc":"2.0","id":"crlf","method":"ping"}\r\n')
    assert server.recv()["id"] == "crlf"


def test_logging_set_level(server):
    r = server.request("logging/setLevel", {"level": "debug"})
    assert r["result"] == {}
    for bad in ["trace", "warn", 3, None]:
        r = server.request("logging/setLevel", {"level": bad})
        assert r["error"]["code"] == -32602


def test_batches_only_on_2025_03_26(make_server):
    s = make_server()
    s.initialize("2025-06-18")
    s.send([{"jsonrpc": "2.0", "id": 1, "method": "ping"}])
    r = s.recv()
    assert r["error"]["code"] == -32600

    s2 = make_server()
    s2.initialize("2025-03-26")
    s2.send([{"jsonrpc": "2.0", "id": 1, "method": "ping"},
             {"jsonrpc": "2.0", "method": "notifications/whatever"},
             {"jsonrpc": "2.0", "id": 2, "method": "tools/call",
              "params": {"name": "execute_python", "arguments": {"script": "print(42)"}}},
             {"jsonrpc": "2.0", "id": 3, "method": "nope"}])
    r = s2.recv(timeout=30)
    assert isinstance(r, list) and len(r) == 3
    by_id = {m["id"]: m for m in r}
    assert by_id[1]["result"] == {}
    assert "42" in by_id[2]["result"]["content"][0]["text"]
    assert by_id[3]["error"]["code"] == -32601
    # a batch of notifications only gets no answer at all
    s2.send([{"jsonrpc": "2.0", "method": "notifications/initialized"}])
    assert s2.request("ping", req_id="z")["id"] == "z"
    s2.send([])
    assert s2.recv()["error"]["code"] == -32600


def test_stdout_is_only_json(server):
    # A run that prints to the server's inherited fds must not corrupt the protocol stream.
    server.execute("import os\nos.write(1, b'not json\\n')\nos.write(2, b'x')")
    r = server.request("ping", req_id="after")
    assert r["result"] == {}
    assert not server.stray


def test_eof_exits_cleanly(make_server):
    s = make_server()
    s.initialize()
    assert s.close() == 0


def test_a_large_message_is_read_in_linear_memory_and_given_back(make_server):
    """A 40 MB message: the server's peak memory stays a small multiple of it (the line, the
    JSON parser's copy of its token, the value: never one per read), and once it is answered
    the input buffer's memory goes back (not kept for the server's life)."""
    s = make_server("--max-message-bytes", "64M")
    s.initialize()
    base = s.rss_kib("VmRSS") * 1024
    size = 40 * 1000 * 1000
    s.send({"jsonrpc": "2.0", "id": 77, "method": "ping", "params": {"_meta": {}, "pad": "x" * size}})
    assert "result" in s.recv_response(77, timeout=120)
    assert s.request("ping")["result"] == {}  # (the big one is wholly handled by then)
    with open(f"/proc/{s.proc.pid}/maps") as f:
        if "libasan" in f.read():
            return  # (the sanitizer's redzones and quarantine: its figures are not the server's)
    peak = s.rss_kib("VmHWM") * 1024
    assert peak < base + 3.5 * size, (base, peak)
    after = s.rss_kib("VmRSS") * 1024
    assert after < base + size / 4, (base, after)

"""The playground page on the HTTP endpoint and execute_python's MCP App (issue 23): what a
browser and a host get, judged on the wire (the browser tests in tests/browser/ drive the
page itself)."""
import json
import re

import pytest

from conftest import MODERN, modern_call
from test_http import ACCEPT_BOTH, HttpServer  # noqa: F401  (make_http's class)
from test_http import make_http  # noqa: F401  (the fixture)

APP_URI = "ui://mcp-python-exec-sandbox/run.html"
APP_MIME = "text/html;profile=mcp-app"
UI_CAPS = {"extensions": {"io.modelcontextprotocol/ui": {"mimeTypes": [APP_MIME]}}}


# ------------------------------------------------------------------ the page

@pytest.fixture
def tokened(make_http, tmp_path):
    tokens = tmp_path / "tokens"
    tokens.write_text("alice:page-token-0123456789\n")
    return make_http("--auth-token-file", str(tokens))


def test_page_and_assets_need_no_token(tokened):
    st, h, body = tokened.request("GET", "/mcp/ui")
    assert st == 200, body
    assert h["content-type"] == "text/html; charset=utf-8"
    csp = h["content-security-policy"]
    # Nothing may leave the machine: every fetch, script and image of the page is its origin's.
    for directive in ("default-src 'none'", "script-src 'self'", "connect-src 'self'",
                      "frame-ancestors 'none'"):
        assert directive in csp, csp
    assert "http:" not in csp and "https:" not in csp
    assert h["x-content-type-options"] == "nosniff"
    html = body.decode()
    assert '<meta name="mps-base" content="/mcp">' in html
    assert 'src="/mcp/ui/app.js"' in html and "@BASE@" not in html
    for asset, kind in (("app.js", "text/javascript"), ("app.css", "text/css")):
        st, h, body = tokened.request("GET", "/mcp/ui/" + asset)
        assert st == 200 and h["content-type"].startswith(kind) and body
        assert "content-security-policy" in h
    # The editor bundle is optional: there or a plain 404 the page expects.
    st, h, _ = tokened.request("GET", "/mcp/ui/editor.js")
    assert st in (200, 404)
    if st == 200:
        assert h["content-type"].startswith("text/javascript")
    st, _, _ = tokened.request("GET", "/mcp/ui/nothing.js")
    assert st == 404
    st, _, _ = tokened.request("GET", "/mcp/uix")
    assert st == 404
    st, _, _ = tokened.request("HEAD", "/mcp/ui")
    assert st == 200
    st, h, _ = tokened.request("POST", "/mcp/ui", b"{}", {"Content-Type": "application/json"})
    assert st == 405 and h["allow"] == "GET"


def test_page_on_the_endpoint_for_a_browser_only(tokened):
    st, h, body = tokened.request("GET", "/mcp", headers={
        "Accept": "text/html,application/xhtml+xml,application/xml;q=0.9,*/*;q=0.8"})
    assert st == 200 and h["content-type"].startswith("text/html"), body
    assert b'name="mps-base"' in body
    # A client of the endpoint still gets the endpoint (here: no token, so 401).
    st, _, _ = tokened.request("GET", "/mcp", headers={"Accept": "text/event-stream"})
    assert st == 401
    st, _, _ = tokened.request("GET", "/mcp", headers={"Accept": "*/*"})
    assert st == 401


def test_page_keeps_origin_and_host_checks(tokened):
    st, _, _ = tokened.request("GET", "/mcp/ui", headers={"Host": "rebound.example.com"})
    assert st == 403
    st, _, _ = tokened.request("GET", "/mcp/ui/app.js", headers={"Origin": "http://evil.example.com"})
    assert st == 403
    st, _, _ = tokened.request("GET", "/mcp/ui", headers={"Origin": f"http://127.0.0.1:{tokened.port}"})
    assert st == 200


def test_page_follows_the_path(make_http):
    s = make_http("--path", "/tools/mcp")
    st, _, body = s.request("GET", "/tools/mcp/ui")
    assert st == 200
    assert b'content="/tools/mcp"' in body and b'src="/tools/mcp/ui/app.js"' in body
    st, _, _ = s.request("GET", "/mcp/ui")
    assert st == 404


# ------------------------------------------------------------------ the MCP App

def _tools(srv):
    return {t["name"]: t for t in srv.request("tools/list")["result"]["tools"]}


def test_app_declared_only_to_a_client_that_advertises_it(make_server):
    plain = make_server()
    init = plain.request("initialize", {"protocolVersion": "2025-06-18", "capabilities": {},
                                        "clientInfo": {"name": "t", "version": "0"}})["result"]
    plain.notify("notifications/initialized")
    assert "io.modelcontextprotocol/ui" not in init["capabilities"].get("extensions", {})
    tools = _tools(plain)
    assert "_meta" not in tools["execute_python"]
    listed = plain.request("resources/list")["result"]["resources"]
    assert all(r["uri"] != APP_URI for r in listed)
    # Reading the URI is no declaration: it is served to anyone who names it.
    read = plain.request("resources/read", {"uri": APP_URI})["result"]
    assert read["contents"][0]["mimeType"] == APP_MIME
    host = make_server()
    init = host.request("initialize", {"protocolVersion": "2025-06-18", "capabilities": UI_CAPS,
                                       "clientInfo": {"name": "host", "version": "0"}})["result"]
    host.notify("notifications/initialized")
    assert init["capabilities"]["extensions"]["io.modelcontextprotocol/ui"] == {"mimeTypes": [APP_MIME]}
    tools = _tools(host)
    assert tools["execute_python"]["_meta"]["ui"] == {"resourceUri": APP_URI}
    assert all("_meta" not in t for n, t in tools.items() if n != "execute_python")
    listed = host.request("resources/list")["result"]["resources"]
    assert listed[0]["uri"] == APP_URI and listed[0]["mimeType"] == APP_MIME
    content = host.request("resources/read", {"uri": APP_URI})["result"]["contents"][0]
    assert content["uri"] == APP_URI
    html = content["text"]
    assert html.startswith("<!doctype html>") and "ui/initialize" in html
    assert "src=" not in html.split("<script>")[0]  # self-contained: nothing to fetch
    # The text fallback stays as it is: a result is the same for every client.
    r = host.call("execute_python", {"script": "print('hi')"})
    assert r["content"][0]["type"] == "text" and "hi" in r["content"][0]["text"]
    assert "_meta" not in r or "ui" not in r.get("_meta", {})


def test_app_ignores_another_mime_type(make_server):
    caps = {"extensions": {"io.modelcontextprotocol/ui": {"mimeTypes": ["text/uri-list"]}}}
    s = make_server()
    s.request("initialize", {"protocolVersion": "2025-06-18", "capabilities": caps,
                             "clientInfo": {"name": "t", "version": "0"}})
    s.notify("notifications/initialized")
    assert "_meta" not in _tools(s)["execute_python"]


def test_app_in_the_stateless_revision(make_http):
    s = make_http()

    def modern(method, params, caps):
        p = dict(params)
        p["_meta"] = {"io.modelcontextprotocol/protocolVersion": MODERN,
                      "io.modelcontextprotocol/clientCapabilities": caps}
        headers = {"MCP-Protocol-Version": MODERN, "Mcp-Method": method}
        if method == "resources/read":
            headers["Mcp-Name"] = p["uri"]
        st, _, body = s.post({"jsonrpc": "2.0", "id": 1, "method": method, "params": p},
                             headers=headers)
        assert st == 200, body
        return json.loads(body)["result"]

    tools = {t["name"]: t for t in modern("tools/list", {}, UI_CAPS)["tools"]}
    assert tools["execute_python"]["_meta"]["ui"]["resourceUri"] == APP_URI
    tools = {t["name"]: t for t in modern("tools/list", {}, {})["tools"]}
    assert "_meta" not in tools["execute_python"]
    assert modern("resources/list", {}, UI_CAPS)["resources"][0]["uri"] == APP_URI
    assert all(r["uri"] != APP_URI for r in modern("resources/list", {}, {})["resources"])
    found = modern("server/discover", {}, UI_CAPS)["capabilities"]["extensions"]
    assert "io.modelcontextprotocol/ui" in found
    assert modern("resources/read", {"uri": APP_URI}, {})["contents"][0]["mimeType"] == APP_MIME


# ------------------------------------------------------------------ recent calls

def test_recent_calls_are_the_principals_own_and_bounded(make_http, tmp_path):
    tokens = tmp_path / "tokens"
    tokens.write_text("alice:recent-alice-0123456789\nbob:recent-bob-0123456789\n")
    s = make_http("--auth-token-file", str(tokens))

    def recent(token):
        return modern_call(s, token, "check_environment", {})["structuredContent"]["recent_calls"]

    alice, bob = "recent-alice-0123456789", "recent-bob-0123456789"
    assert recent(alice) == []
    modern_call(s, alice, "execute_python", {"script": "print(1)"})
    modern_call(s, alice, "execute_python", {"script": "raise SystemExit(3)"})
    modern_call(s, alice, "validate_script", {"script": "print(1)\n"})
    got = recent(alice)
    # Newest first; check_environment itself (and list_sessions) is not among them.
    assert [(c["tool"], c["outcome"]) for c in got] == [
        ("validate_script", "ok"), ("execute_python", "tool_error"), ("execute_python", "ok")]
    for c in got:
        assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z", c["time"]), c
        assert isinstance(c["duration_ms"], int) and c["duration_ms"] >= 0
    assert recent(bob) == []  # never another principal's
    for i in range(25):
        modern_call(s, bob, "validate_script", {"script": f"x = {i}\n"})
    assert len(recent(bob)) == 20  # SRV_RECENT_PER_PRINCIPAL
    assert len(recent(alice)) == 3


# ------------------------------------------------------------------ environments: list and evict

from test_deps import wheels  # noqa: E402,F401  (the fixture: a local wheelhouse)
from test_tenancy import ALICE, BOB, execute, make_tenants, rpc, store_envs, tokens  # noqa: E402,F401


def _call(s, sid, auth, req_id, name, args):
    st, msg = rpc(s, sid, auth, req_id, "tools/call", {"name": name, "arguments": args})
    assert st == 200 and "result" in msg, msg
    return msg["result"]


def _items(s, sid, auth, req_id):
    r = _call(s, sid, auth, req_id, "check_environment", {})
    return r["structuredContent"]["tenant"]["environments"]["items"]


def test_a_principal_lists_and_evicts_only_its_own_environments(make_tenants, wheels):
    s = make_tenants("--find-links", wheels, "--offline")
    alice, bob = s.initialize(headers=ALICE), s.initialize(headers=BOB)
    a = execute(s, alice, ALICE, 1, "pass", dependencies=["mps-gamma"])["structuredContent"]["environment"]["key"]
    b = execute(s, bob, BOB, 2, "pass", dependencies=["mps-alpha==1.0"])["structuredContent"]["environment"]["key"]
    items = _items(s, alice, ALICE, 3)
    assert [i["key"] for i in items] == [a]  # never bob's
    assert items[0]["bytes"] > 0 and isinstance(items[0]["built"], int)
    assert "mps-gamma" in json.dumps(items[0].get("packages"))
    # Another principal's environment is no such environment, and stays.
    r = _call(s, alice, ALICE, 4, "evict_environment", {"key": b})
    assert r["isError"] is True and "not one of yours" in r["content"][0]["text"]
    assert b in store_envs(s)
    for bad in ({}, {"key": ""}, {"key": a, "extra": 1}, {"key": 7}):
        assert _call(s, alice, ALICE, 5, "evict_environment", bad)["isError"] is True
    r = _call(s, alice, ALICE, 6, "evict_environment", {"key": a})
    assert r["isError"] is False, r
    assert r["structuredContent"] == {"key": a, "evicted": True}
    assert a not in store_envs(s) and b in store_envs(s)
    assert _items(s, alice, ALICE, 7) == []
    assert [i["key"] for i in _items(s, bob, BOB, 8)] == [b]
    # The next call that needs it builds it again.
    again = execute(s, alice, ALICE, 9, "import mps_gamma", dependencies=["mps-gamma"])
    assert again["structuredContent"]["environment"]["cached"] is False

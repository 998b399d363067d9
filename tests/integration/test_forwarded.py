"""The client's address behind a trusted reverse proxy (--trusted-proxy, --trusted-proxy-header):
over HTTP on loopback, from trusted and untrusted peers (the client binds 127.0.0.2 or
127.0.0.3 as its source), with spoofed chains, IPv6 and a dual-stack socket.  The audit log
names both the TCP peer ("remote") and the client it determined ("client")."""
import http.client
import json
import os
import socket
import re
import subprocess

import pytest

from conftest import BINARY, wait_until
from test_http import ACCEPT_BOTH, LATEST, HttpServer, free_port, sse_events

VALIDATE = {"jsonrpc": "2.0", "id": 7, "method": "tools/call",
            "params": {"name": "validate_script", "arguments": {"script": "print(1)\n"}}}
MODERN = "2026-07-28"


def can_bind(addr, family=socket.AF_INET):
    try:
        with socket.socket(family, socket.SOCK_STREAM) as s:
            s.bind((addr, 0))
        return True
    except OSError:
        return False


@pytest.fixture(autouse=True)
def loopback_sources():
    if not can_bind("127.0.0.2") or not can_bind("127.0.0.3"):
        pytest.skip("cannot bind 127.0.0.2/127.0.0.3 as a source address")


def raw(srv, method, headers, body=None, source="127.0.0.2", host=None, path="/mcp"):
    """One request from `source`, headers a list of (name, value) pairs (a name may repeat)."""
    c = http.client.HTTPConnection(host or srv.host, srv.port, timeout=30,
                                   source_address=(source, 0))
    try:
        c.putrequest(method, path, skip_accept_encoding=True)
        data = json.dumps(body).encode() if body is not None else b""
        for k, v in headers:
            c.putheader(k, v)
        if body is not None:
            c.putheader("Content-Type", "application/json")
            c.putheader("Accept", ACCEPT_BOTH)
            c.putheader("Content-Length", str(len(data)))
        c.endheaders(data if body is not None else None)
        r = c.getresponse()
        return r.status, {k.lower(): v for k, v in r.getheaders()}, r.read()
    finally:
        c.close()


def session(srv, source, extra=(), host=None):
    """initialize + initialized from source; returns the session id."""
    init = {"jsonrpc": "2.0", "id": 0, "method": "initialize",
            "params": {"protocolVersion": LATEST, "capabilities": {},
                       "clientInfo": {"name": "xff", "version": "0"}}}
    st, h, body = raw(srv, "POST", list(extra), init, source=source, host=host)
    assert st == 200, body
    sid = h["mcp-session-id"]
    st, _, _ = raw(srv, "POST", [("Mcp-Session-Id", sid), ("MCP-Protocol-Version", LATEST), *extra],
                   {"jsonrpc": "2.0", "method": "notifications/initialized"}, source=source, host=host)
    assert st == 202
    return sid


def call(srv, source, extra=(), host=None):
    """One validate_script call in a new session, from source, with extra headers on the call."""
    sid = session(srv, source, host=host)
    st, _, body = raw(srv, "POST", [("Mcp-Session-Id", sid), ("MCP-Protocol-Version", LATEST), *extra],
                      VALIDATE, source=source, host=host)
    assert st == 200, body


def audit_lines(path, event, n, timeout=10):
    def lines():
        if not os.path.exists(path):
            return []
        with open(path) as f:
            return [l for l in map(json.loads, filter(str.strip, f)) if l.get("event") == event]
    assert wait_until(lambda: len(lines()) >= n, timeout=timeout), lines()
    return lines()


def server(tmp_path, *args, **kw):
    log = str(tmp_path / "audit.log")
    return HttpServer("--audit-log", log, "--prestart", "off", "--no-warm-cache", *args, **kw), log


def test_an_untrusted_peer_is_the_client_and_its_header_is_ignored(tmp_path):
    # A trusted proxy elsewhere; this peer (127.0.0.2) is not it.
    srv, log = server(tmp_path, "--trusted-proxy", "127.0.0.3")
    try:
        call(srv, "127.0.0.2", [("X-Forwarded-For", "203.0.113.7"), ("Forwarded", "for=198.51.100.1")])
        (line,) = audit_lines(log, "tool_call", 1)
    finally:
        assert srv.close() == 0
    assert line["remote"] == "127.0.0.2" and line["client"] == "127.0.0.2"
    assert "forwarded" not in line
    text = open(log).read()
    assert "203.0.113.7" not in text and "198.51.100.1" not in text


def test_without_trusted_proxies_the_peer_is_the_client(tmp_path):
    srv, log = server(tmp_path)
    try:
        call(srv, "127.0.0.2", [("X-Forwarded-For", "203.0.113.7")])
        (line,) = audit_lines(log, "tool_call", 1)
    finally:
        assert srv.close() == 0
    assert line["remote"] == "127.0.0.2" and line["client"] == "127.0.0.2" and "forwarded" not in line
    assert "203.0.113.7" not in open(log).read()


def test_a_trusted_proxy_names_the_client_and_a_spoofed_entry_loses(tmp_path):
    srv, log = server(tmp_path, "--trusted-proxy", "127.0.0.2", "--trusted-proxy", "10.0.0.0/8")
    try:
        # What the client sent itself is on the left; the proxy appended the real address.
        call(srv, "127.0.0.2", [("X-Forwarded-For", "6.6.6.6, 203.0.113.7")])
        # Trusted hops (10.0.0.0/8) are skipped from the right.
        call(srv, "127.0.0.2", [("X-Forwarded-For", "6.6.6.6, 198.51.100.9, 10.0.0.2, 10.9.8.7")])
        # A proxy that adds a header line of its own: the lines are one list, in order.
        call(srv, "127.0.0.2", [("X-Forwarded-For", "6.6.6.6"), ("X-Forwarded-For", "[2001:db8::77]:4711")])
        # Spoofing a trusted address on the left gains nothing either.
        call(srv, "127.0.0.2", [("X-Forwarded-For", "10.0.0.1, 192.0.2.33:8080")])
        # The walk stops at what is no address: the client is the last address it reached.
        call(srv, "127.0.0.2", [("X-Forwarded-For", "203.0.113.7, garbage")])
        call(srv, "127.0.0.2", [("X-Forwarded-For", "203.0.113.7, unknown, 10.0.0.4")])
        # No header from the trusted proxy: the proxy itself.
        call(srv, "127.0.0.2")
        # Every hop trusted: the leftmost.
        call(srv, "127.0.0.2", [("X-Forwarded-For", "10.1.1.1, 10.2.2.2")])
        lines = audit_lines(log, "tool_call", 8)
    finally:
        assert srv.close() == 0
    got = [(l["remote"], l["client"], l.get("forwarded")) for l in lines]
    assert got == [
        ("127.0.0.2", "203.0.113.7", "ok"),
        ("127.0.0.2", "198.51.100.9", "ok"),
        ("127.0.0.2", "2001:db8::77", "ok"),
        ("127.0.0.2", "192.0.2.33", "ok"),
        ("127.0.0.2", "127.0.0.2", "malformed"),
        ("127.0.0.2", "10.0.0.4", "unknown"),
        ("127.0.0.2", "127.0.0.2", "absent"),
        ("127.0.0.2", "10.1.1.1", "all-trusted"),
    ]
    assert "6.6.6.6" not in open(log).read()


def test_forwarded_rfc7239_when_chosen_and_only_then(tmp_path):
    srv, log = server(tmp_path, "--trusted-proxy", "127.0.0.2", "--trusted-proxy-header", "forwarded")
    try:
        # The other header is never read, whatever it says.
        call(srv, "127.0.0.2", [("X-Forwarded-For", "6.6.6.6"),
                                ("Forwarded", 'for=6.6.6.7, For="[2001:db8:cafe::17]:4711";proto=https')])
        call(srv, "127.0.0.2", [("Forwarded", "for=192.0.2.60;proto=http;by=203.0.113.43")])
        call(srv, "127.0.0.2", [("Forwarded", 'for="_gazonk"')])
        call(srv, "127.0.0.2", [("Forwarded", "for=[2001:db8::1]")])  # IPv6 must be quoted
        call(srv, "127.0.0.2", [("X-Forwarded-For", "203.0.113.7")])
        lines = audit_lines(log, "tool_call", 5)
    finally:
        assert srv.close() == 0
    assert [(l["client"], l["forwarded"]) for l in lines] == [
        ("2001:db8:cafe::17", "ok"), ("192.0.2.60", "ok"), ("127.0.0.2", "obfuscated"),
        ("127.0.0.2", "malformed"), ("127.0.0.2", "absent")]

    (tmp_path / "x").mkdir()
    srv, log2 = server(tmp_path / "x", "--trusted-proxy", "127.0.0.2")
    try:
        call(srv, "127.0.0.2", [("Forwarded", "for=198.51.100.1")])
        (line,) = audit_lines(log2, "tool_call", 1)
    finally:
        assert srv.close() == 0
    # x-forwarded-for is the default: a Forwarded header is not read.
    assert line["client"] == "127.0.0.2" and line["forwarded"] == "absent"


def test_auth_failures_name_the_client(tmp_path):
    tokens = tmp_path / "tokens"
    tokens.write_text("alice:alice-token-0123456789\n")
    srv, log = server(tmp_path, "--auth-token-file", str(tokens), "--trusted-proxy", "127.0.0.2")
    try:
        st, _, _ = raw(srv, "POST", [("X-Forwarded-For", "6.6.6.6, 203.0.113.7")], VALIDATE, source="127.0.0.2")
        assert st == 401
        st, _, _ = raw(srv, "POST", [("X-Forwarded-For", "198.51.100.1"), ("Authorization", "Bearer nope")],
                       VALIDATE, source="127.0.0.3")
        assert st == 401
        fails = audit_lines(log, "auth_failure", 2)
    finally:
        assert srv.close() == 0
    assert (fails[0]["remote"], fails[0]["client"], fails[0]["forwarded"], fails[0]["reason"]) == \
        ("127.0.0.2", "203.0.113.7", "ok", "missing")
    # From an untrusted peer: the peer, and nothing of what it claimed.
    assert (fails[1]["remote"], fails[1]["client"], fails[1]["reason"]) == ("127.0.0.3", "127.0.0.3", "invalid")
    assert "forwarded" not in fails[1]
    text = open(log).read()
    assert "198.51.100.1" not in text and "6.6.6.6" not in text and "alice-token" not in text


def test_stateless_requests_name_the_client(tmp_path):
    srv, log = server(tmp_path, "--trusted-proxy", "127.0.0.0/8")
    msg = json.loads(json.dumps(VALIDATE))
    msg["params"]["_meta"] = {"io.modelcontextprotocol/protocolVersion": MODERN,
                              "io.modelcontextprotocol/clientCapabilities": {},
                              "io.modelcontextprotocol/clientInfo": {"name": "xff", "version": "0"}}
    try:
        st, _, body = raw(srv, "POST", [("MCP-Protocol-Version", MODERN), ("Mcp-Method", "tools/call"),
                                        ("Mcp-Name", "validate_script"),
                                        ("X-Forwarded-For", "203.0.113.70")], msg, source="127.0.0.3")
        assert st == 200, body
        (line,) = audit_lines(log, "tool_call", 1)
    finally:
        assert srv.close() == 0
    assert line["era"] == MODERN
    assert (line["remote"], line["client"], line["forwarded"]) == ("127.0.0.3", "203.0.113.70", "ok")


def test_legacy_sse_messages_name_the_poster(tmp_path):
    """HTTP+SSE (2024-11-05): answers go to the session's stream, but each POST /messages is
    its own request, and its line names who sent that POST."""
    srv, log = server(tmp_path, "--trusted-proxy", "127.0.0.2")
    c = http.client.HTTPConnection(srv.host, srv.port, timeout=30, source_address=("127.0.0.3", 0))
    try:
        c.request("GET", "/sse", headers={"Accept": "text/event-stream"})
        r = c.getresponse()
        assert r.status == 200
        ev = next(sse_events(r))
        assert ev["event"] == "endpoint" and re.fullmatch(r"/messages\?sessionId=[0-9a-f-]{36}", ev["data"])
        url = ev["data"]
        init = {"jsonrpc": "2.0", "id": 1, "method": "initialize",
                "params": {"protocolVersion": "2024-11-05", "capabilities": {}}}
        xff = [("X-Forwarded-For", "203.0.113.50")]
        assert raw(srv, "POST", xff, init, source="127.0.0.3", path=url)[0] == 202
        assert raw(srv, "POST", xff, {"jsonrpc": "2.0", "method": "notifications/initialized"},
                   source="127.0.0.3", path=url)[0] == 202
        assert raw(srv, "POST", xff, VALIDATE, source="127.0.0.2", path=url)[0] == 202
        assert raw(srv, "POST", xff, {**VALIDATE, "id": 8}, source="127.0.0.3", path=url)[0] == 202
        lines = audit_lines(log, "tool_call", 2)
    finally:
        c.close()
        assert srv.close() == 0
    assert sorted((l["remote"], l["client"], l.get("forwarded")) for l in lines) == [
        ("127.0.0.2", "203.0.113.50", "ok"), ("127.0.0.3", "127.0.0.3", None)]


def test_ipv6_peer_and_clients(tmp_path):
    if not socket.has_ipv6 or not can_bind("::1", socket.AF_INET6):
        pytest.skip("no ::1 on this machine")
    srv, log = server(tmp_path, "--trusted-proxy", "::1", host="::1")
    try:
        call(srv, "::1", [("X-Forwarded-For", "2001:db8::bad, 2001:DB8:0::7")])
        call(srv, "::1", [("X-Forwarded-For", "::ffff:192.0.2.5")])
        lines = audit_lines(log, "tool_call", 2)
    finally:
        assert srv.close() == 0
    assert [(l["remote"], l["client"]) for l in lines] == [("::1", "2001:db8::7"), ("::1", "192.0.2.5")]


def test_a_dual_stack_socket_sees_ipv4_peers_as_ipv4(tmp_path):
    if not socket.has_ipv6 or not can_bind("::", socket.AF_INET6):
        pytest.skip("no IPv6 wildcard socket")
    # An IPv4 range trusts an IPv4 peer that the socket reports as ::ffff:127.0.0.2.
    srv, log = server(tmp_path, "--trusted-proxy", "127.0.0.2", "--allow-insecure-remote", host="::")
    try:
        call(srv, "127.0.0.2", [("X-Forwarded-For", "203.0.113.8")], host="127.0.0.1")
        call(srv, "127.0.0.3", [("X-Forwarded-For", "203.0.113.9")], host="127.0.0.1")
        lines = audit_lines(log, "tool_call", 2)
    finally:
        assert srv.close() == 0
    assert [(l["remote"], l["client"], l.get("forwarded")) for l in lines] == [
        ("127.0.0.2", "203.0.113.8", "ok"), ("127.0.0.3", "127.0.0.3", None)]


@pytest.mark.parametrize("args,needle", [
    (["--trusted-proxy", "10.0.0.1/8"], "--trusted-proxy"),
    (["--trusted-proxy", "proxy.example"], "--trusted-proxy"),
    (["--trusted-proxy", "fd00::/129"], "--trusted-proxy"),
    (["--trusted-proxy-header", "x-real-ip"], "trusted_proxy_header"),
])
def test_bad_flags_stop_the_server(tmp_path, args, needle):
    p = subprocess.run([BINARY, "--transport", "http", "--port", str(free_port()), "--sandbox-backend", "none",
                        "--state-dir", str(tmp_path / "state"), "--no-warm-cache", *args],
                       stdin=subprocess.DEVNULL, capture_output=True, timeout=30)
    assert p.returncode != 0
    assert needle.encode() in p.stderr, p.stderr

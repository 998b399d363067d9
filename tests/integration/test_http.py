"""Streamable HTTP transport (and the legacy HTTP+SSE endpoints) end to end: the real binary
with --transport http, driven with http.client/socket/ssl.  Only 127.0.0.1 and ::1 are ever
contacted."""
import hashlib
import http.client
import json
import os
import re
import signal
import socket
import ssl
import subprocess
import sys
import tempfile
import threading
import time

import pytest

from conftest import BINARY, wait_until

LATEST = "2025-11-25"
ACCEPT_BOTH = "application/json, text/event-stream"


def free_port(family=socket.AF_INET, host="127.0.0.1"):
    with socket.socket(family, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


class HttpServer:
    """The binary serving HTTP on a free loopback port."""

    def __init__(self, *args, host="127.0.0.1", tls=False, state_dir=None, expect_start=True):
        self.tmp = tempfile.TemporaryDirectory(prefix="mps-http-")
        self.state_dir = state_dir or os.path.join(self.tmp.name, "state")
        self.host = host
        self.family = socket.AF_INET6 if ":" in host else socket.AF_INET
        self.port = free_port(self.family, host)
        self.tls = tls
        argv = [BINARY, "--transport", "http", "--host", host, "--port", str(self.port),
                "--sandbox-backend", "none", "--state-dir", self.state_dir, *args]
        self.stderr_path = os.path.join(self.tmp.name, "stderr.log")
        self.stderr_file = open(self.stderr_path, "wb")
        self.proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                     stderr=self.stderr_file)
        self.closed = False
        if expect_start:
            self._wait_listening()

    def _wait_listening(self, timeout=15):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise AssertionError("server exited: " + self.stderr_text())
            try:
                with socket.create_connection((self.host, self.port), timeout=1):
                    return
            except OSError:
                time.sleep(0.02)
        raise AssertionError("server did not listen: " + self.stderr_text())

    # ------------------------------------------------------------ HTTP
    def connect(self, timeout=30):
        if self.tls:
            ctx = ssl.create_default_context(cafile=os.path.join(self.state_dir, "tls", "cert.pem"))
            return http.client.HTTPSConnection("localhost" if self.family == socket.AF_INET else self.host,
                                               self.port, timeout=timeout, context=ctx)
        return http.client.HTTPConnection(self.host, self.port, timeout=timeout)

    def request(self, method, path="/mcp", body=None, headers=None, conn=None):
        """One request on a fresh connection; returns (status, headers dict, body bytes)."""
        c = conn or self.connect()
        hdrs = dict(headers or {})
        if isinstance(body, (dict, list)):
            body = json.dumps(body).encode()
            hdrs.setdefault("Content-Type", "application/json")
        c.request(method, path, body=body, headers=hdrs)
        r = c.getresponse()
        data = r.read()
        h = {k.lower(): v for k, v in r.getheaders()}
        if conn is None:
            c.close()
        return r.status, h, data

    def post(self, msg, sid=None, headers=None, version=None, conn=None):
        hdrs = {"Accept": ACCEPT_BOTH, "Content-Type": "application/json"}
        if sid:
            hdrs["Mcp-Session-Id"] = sid
        if version:
            hdrs["MCP-Protocol-Version"] = version
        hdrs.update(headers or {})
        return self.request("POST", "/mcp", msg, hdrs, conn=conn)

    def initialize(self, version=LATEST, headers=None):
        st, h, body = self.post({"jsonrpc": "2.0", "id": 0, "method": "initialize",
                                 "params": {"protocolVersion": version, "capabilities": {},
                                            "clientInfo": {"name": "itest", "version": "0"}}},
                                headers=headers)
        assert st == 200, (st, body)
        assert h["content-type"] == "application/json"
        sid = h["mcp-session-id"]
        assert re.fullmatch(r"[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}", sid)
        st, _, _ = self.post({"jsonrpc": "2.0", "method": "notifications/initialized"}, sid,
                             headers=headers, version=version)
        assert st == 202
        return sid

    def open_stream(self, msg, sid, headers=None):
        """POSTs msg and returns (conn, response) without reading the body."""
        c = self.connect()
        hdrs = {"Accept": ACCEPT_BOTH, "Content-Type": "application/json", "Mcp-Session-Id": sid}
        hdrs.update(headers or {})
        c.request("POST", "/mcp", json.dumps(msg).encode(), hdrs)
        return c, c.getresponse()

    def open_get(self, sid, last_event_id=None, path="/mcp"):
        c = self.connect()
        hdrs = {"Accept": "text/event-stream"}
        if sid:
            hdrs["Mcp-Session-Id"] = sid
        if last_event_id:
            hdrs["Last-Event-ID"] = last_event_id
        c.request("GET", path, headers=hdrs)
        return c, c.getresponse()

    # ------------------------------------------------------------ process
    def rss_kib(self):
        with open(f"/proc/{self.proc.pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1])
        return 0

    def sanitized(self):
        """Built with ASan (whose quarantine makes RSS meaningless)?"""
        with open(f"/proc/{self.proc.pid}/maps") as f:
            return "libasan" in f.read()

    def stderr_text(self):
        if not self.stderr_file.closed:
            self.stderr_file.flush()
        with open(self.stderr_path, "rb") as f:
            return f.read().decode(errors="replace")

    def close(self, timeout=15):
        if self.closed:
            return self.proc.returncode
        self.closed = True
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
                raise AssertionError("server did not exit on SIGTERM: " + self.stderr_text()[-3000:])
        self.stderr_file.close()
        rc = self.proc.returncode
        log = self.stderr_text()
        self.tmp.cleanup()
        for needle in ("ERROR: AddressSanitizer", "ERROR: LeakSanitizer", "runtime error:"):
            assert needle not in log, log[-4000:]
        return rc


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
def srv(make_http):
    return make_http()


def wait_for_progress(resp, text):
    """Reads resp's SSE events until a progress notification carrying text (a line the script
    printed): the call runs.  The rest of the stream stays to be read."""
    for ev in sse_events(resp):
        data = ev.get("data") or ""
        if "notifications/progress" in data and text in data:
            return True
    return False


def sse_events(resp):
    """Yields SSE events ({"id", "event", "data", "retry"}) from an http.client response."""
    ev, data = {}, []
    while True:
        line = resp.readline()
        if not line:
            if data:
                ev["data"] = "\n".join(data)
                yield ev
            return
        line = line.decode().rstrip("\n").rstrip("\r")
        if line == "":
            if data or ev:
                if data:
                    ev["data"] = "\n".join(data)
                yield ev
            ev, data = {}, []
            continue
        if line.startswith(":"):
            continue
        field, _, value = line.partition(":")
        if value.startswith(" "):
            value = value[1:]
        if field == "data":
            data.append(value)
        else:
            ev[field] = value


def messages(events):
    return [json.loads(e["data"]) for e in events if e.get("data")]


def call_msg(req_id, script, token=None, **args):
    params = {"name": "execute_python", "arguments": {"script": script, **args}}
    if token is not None:
        params["_meta"] = {"progressToken": token}
    return {"jsonrpc": "2.0", "id": req_id, "method": "tools/call", "params": params}


def err_code(body):
    return json.loads(body)["error"]["code"]


# ================================================================ status-code table

def test_post_status_table(srv):
    ping = {"jsonrpc": "2.0", "id": 1, "method": "ping"}
    sid = srv.initialize()
    # 200 + JSON for a request answered at once
    st, h, body = srv.post(ping, sid, version=LATEST)
    assert st == 200 and h["content-type"] == "application/json"
    assert json.loads(body) == {"jsonrpc": "2.0", "id": 1, "result": {}}
    assert h["mcp-session-id"] == sid
    # 202 for a notification and for a response
    st, _, body = srv.post({"jsonrpc": "2.0", "method": "notifications/roots/list_changed"}, sid)
    assert st == 202 and body == b""
    st, _, body = srv.post({"jsonrpc": "2.0", "id": 99, "result": {}}, sid)
    assert st == 202 and body == b""
    # 400: not JSON, not JSON-RPC, batch on a 2025-11-25 session, no session header
    st, _, body = srv.request("POST", "/mcp", b"{nope", {"Content-Type": "application/json",
                                                         "Accept": ACCEPT_BOTH, "Mcp-Session-Id": sid})
    assert st == 400 and err_code(body) == -32700
    st, _, body = srv.post({"jsonrpc": "1.0", "id": 1, "method": "ping"}, sid)
    assert st == 400 and err_code(body) == -32600
    st, _, body = srv.post({"jsonrpc": "2.0", "id": None, "method": "ping"}, sid)
    assert st == 400 and err_code(body) == -32600
    st, _, body = srv.post([ping], sid)
    assert st == 400 and err_code(body) == -32600
    st, _, body = srv.post(ping)
    assert st == 400 and b"Mcp-Session-Id" in body
    # 404: unknown session
    st, _, body = srv.post(ping, "5d6b8a9e-0000-4000-8000-000000000000")
    assert st == 404 and err_code(body) == -32001
    # MCP-Protocol-Version: unsupported -> 400; any supported one is fine (not only the negotiated)
    st, _, _ = srv.post(ping, sid, version="1999-01-01")
    assert st == 400
    st, _, _ = srv.post(ping, sid, version="2025-03-26")
    assert st == 200
    # 415, 406, 405
    st, _, _ = srv.request("POST", "/mcp", json.dumps(ping).encode(),
                           {"Content-Type": "text/plain", "Mcp-Session-Id": sid})
    assert st == 415
    st, _, _ = srv.request("POST", "/mcp", json.dumps(ping).encode(),
                           {"Content-Type": "application/json; charset=utf-8", "Mcp-Session-Id": sid})
    assert st == 200  # parameters ignored, no Accept = anything
    st, _, _ = srv.post(ping, sid, headers={"Accept": "text/html"})
    assert st == 406
    st, _, _ = srv.post({"jsonrpc": "2.0", "method": "notifications/x"}, sid, headers={"Accept": "text/html"})
    assert st == 202  # Accept is not checked on notifications
    st, _, _ = srv.post(ping, sid, headers={"Accept": "application/*"})
    assert st == 200
    st, h, _ = srv.request("PUT", "/mcp", b"{}", {"Content-Type": "application/json"})
    assert st == 405 and set(h["allow"].replace(" ", "").split(",")) == {"GET", "POST", "DELETE"}
    st, _, _ = srv.request("GET", "/elsewhere")
    assert st == 404
    # initialize with a live session header -> 400
    st, _, body = srv.post({"jsonrpc": "2.0", "id": 5, "method": "initialize",
                            "params": {"protocolVersion": LATEST, "capabilities": {}}}, sid)
    assert st == 400 and err_code(body) == -32600
    # protocol errors are 200 + JSON-RPC error (the router's answer passed through)
    st, _, body = srv.post({"jsonrpc": "2.0", "id": 7, "method": "no/such"}, sid)
    assert st == 200 and err_code(body) == -32601
    # a failed initialize opens no session
    st, h, body = srv.post({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {}})
    assert st == 200 and err_code(body) == -32602 and "mcp-session-id" not in h


def test_keep_alive_connection_serves_many_requests(srv):
    sid = srv.initialize()
    c = srv.connect()
    for i in range(20):
        st, _, body = srv.post({"jsonrpc": "2.0", "id": i, "method": "ping"}, sid, conn=c)
        assert st == 200 and json.loads(body)["id"] == i
    st, _, _ = srv.request("DELETE", "/mcp", headers={"Mcp-Session-Id": sid}, conn=c)
    assert st == 200
    c.close()


def test_batches_only_on_2025_03_26(srv):
    sid = srv.initialize("2025-03-26")
    st, h, body = srv.post([{"jsonrpc": "2.0", "id": 1, "method": "ping"},
                            {"jsonrpc": "2.0", "method": "notifications/x"},
                            {"jsonrpc": "2.0", "id": 2, "method": "tools/list"}], sid)
    assert st == 200
    out = json.loads(body)
    assert sorted(r["id"] for r in out) == [1, 2]
    st, _, _ = srv.post([{"jsonrpc": "2.0", "method": "notifications/x"}], sid)
    assert st == 202
    st, _, _ = srv.post([{"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {}}], sid)
    assert st == 400


def test_get_and_delete(srv):
    sid = srv.initialize()
    st, _, _ = srv.request("GET", "/mcp", headers={"Accept": "application/json", "Mcp-Session-Id": sid})
    assert st == 406
    st, _, _ = srv.request("GET", "/mcp", headers={"Accept": "text/event-stream"})
    assert st == 400
    c1, r1 = srv.open_get(sid)
    assert r1.status == 200 and r1.getheader("Content-Type") == "text/event-stream"
    st, _, _ = srv.request("GET", "/mcp", headers={"Accept": "text/event-stream", "Mcp-Session-Id": sid})
    assert st == 409
    st, _, _ = srv.request("DELETE", "/mcp")
    assert st == 400
    st, _, _ = srv.request("DELETE", "/mcp", headers={"Mcp-Session-Id": sid})
    assert st == 200
    # the GET stream ends with the session
    assert list(sse_events(r1)) == []
    c1.close()
    for method in ("POST", "GET", "DELETE"):
        hdrs = {"Mcp-Session-Id": sid, "Accept": ACCEPT_BOTH, "Content-Type": "application/json"}
        st, _, body = srv.request(method, "/mcp", b'{"jsonrpc":"2.0","id":1,"method":"ping"}'
                                  if method == "POST" else None, hdrs)
        assert st == 404, method


def test_standalone_stream_reopens_after_client_leaves(srv):
    sid = srv.initialize()
    c, r = srv.open_get(sid)
    assert r.status == 200
    c.sock.shutdown(socket.SHUT_RDWR)
    c.close()
    # the server notices the hang-up of a suspended stream and lets the client back in

    def reopened():
        c2, r2 = srv.open_get(sid)
        status = r2.status
        c2.close()
        return status == 200
    assert wait_until(reopened, 5)


# ================================================================ security

def test_origin_and_host(make_http):
    s = make_http("--allowed-origins", "https://app.example", "--allowed-hosts", "mcp.internal")
    init = {"jsonrpc": "2.0", "id": 0, "method": "initialize",
            "params": {"protocolVersion": LATEST, "capabilities": {}}}
    st, _, body = s.post(init, headers={"Origin": "http://evil.example.com"})
    assert st == 403
    st, _, _ = s.post(init, headers={"Host": "evil.example.com"})
    assert st == 403
    st, _, _ = s.post(init, headers={"Host": "evil.example.com", "Origin": "http://evil.example.com"})
    assert st == 403
    st, _, _ = s.post(init, headers={"Origin": "null"})
    assert st == 403
    st, h, _ = s.post(init, headers={"Host": f"localhost:{s.port}", "Origin": f"http://localhost:{s.port}"})
    assert st == 200 and h["access-control-allow-origin"] == f"http://localhost:{s.port}"
    assert "mcp-session-id" in h["access-control-expose-headers"].lower()
    st, _, _ = s.post(init, headers={"Host": f"[::1]:{s.port}"})
    assert st == 200
    st, _, _ = s.post(init, headers={"Origin": "https://app.example"})
    assert st == 200
    st, _, _ = s.post(init, headers={"Host": f"MCP.internal:{s.port}"})
    assert st == 200
    # CORS preflight: only for allowed origins
    st, h, _ = s.request("OPTIONS", "/mcp", headers={"Origin": "https://app.example",
                                                     "Access-Control-Request-Method": "POST"})
    assert st == 204 and "mcp-session-id" in h["access-control-allow-headers"].lower()
    st, _, _ = s.request("OPTIONS", "/mcp", headers={"Origin": "https://other.example"})
    assert st == 403


def test_bearer_tokens(make_http, tmp_path):
    tokens = tmp_path / "tokens"
    tokens.write_text("# team tokens\nalice: s3cret-alice\n\n  bob-token-123  \n")
    s = make_http("--auth-token-file", str(tokens))
    init = {"jsonrpc": "2.0", "id": 0, "method": "initialize",
            "params": {"protocolVersion": LATEST, "capabilities": {}}}
    st, h, _ = s.post(init)
    assert st == 401
    assert h["www-authenticate"] == 'Bearer realm="mcp", error="invalid_token"'
    st, _, _ = s.post(init, headers={"Authorization": "Bearer wrong"})
    assert st == 401
    st, _, _ = s.post(init, headers={"Authorization": "Basic s3cret-alice"})
    assert st == 401
    st, _, _ = s.post(init, headers={"Authorization": "Bearer alice: s3cret-alice"})
    assert st == 401
    auth = {"Authorization": "Bearer s3cret-alice"}
    sid = s.initialize(headers=auth)
    st, _, _ = s.post({"jsonrpc": "2.0", "id": 1, "method": "ping"}, sid)
    assert st == 401  # every request needs the token
    st, _, _ = s.post({"jsonrpc": "2.0", "id": 1, "method": "ping"}, sid,
                      headers={"Authorization": "bearer s3cret-alice"})
    assert st == 200  # the scheme is case-insensitive
    # another valid token is another principal: alice's session is not found for it
    st, _, _ = s.post({"jsonrpc": "2.0", "id": 1, "method": "ping"}, sid,
                      headers={"Authorization": "bearer bob-token-123"})
    assert st == 404
    bob = s.initialize(headers={"Authorization": "Bearer bob-token-123"})
    st, _, _ = s.post({"jsonrpc": "2.0", "id": 1, "method": "ping"}, bob,
                      headers={"Authorization": "bearer bob-token-123"})
    assert st == 200
    st, _, _ = s.request("GET", "/mcp", headers={"Accept": "text/event-stream", "Mcp-Session-Id": sid})
    assert st == 401
    # Origin is judged before the token
    st, _, _ = s.post(init, headers={"Origin": "http://evil.example.com", **auth})
    assert st == 403


def test_refuses_remote_address_without_tokens(tmp_path):
    p = subprocess.run([BINARY, "--transport", "http", "--host", "0.0.0.0", "--port", str(free_port()),
                        "--sandbox-backend", "none", "--state-dir", str(tmp_path)],
                       capture_output=True, timeout=20)
    assert p.returncode != 0
    assert b"--allow-insecure-remote" in p.stderr


def test_refuses_backend_none_with_several_principals(tmp_path):
    """Backend none runs every tenant's script as the server's user, which can read the token
    file: with more than one principal over HTTP the server refuses to start, and a reload
    that would bring a second one is refused, unless --allow-none-with-tokens says yes."""
    env = {k: v for k, v in os.environ.items() if k != "MCP_PY_SANDBOX_ALLOW_NONE_WITH_TOKENS"}
    tokens = tmp_path / "tokens"
    tokens.write_text("alice:" + "a" * 24 + "\nbob:" + "b" * 24 + "\n")
    argv = [BINARY, "--transport", "http", "--port", str(free_port()), "--sandbox-backend", "none",
            "--state-dir", str(tmp_path / "state"), "--auth-token-file", str(tokens)]
    p = subprocess.run(argv, capture_output=True, timeout=30, env=env)
    assert p.returncode != 0
    assert b"names 2 principals" in p.stderr and b"--allow-none-with-tokens" in p.stderr, p.stderr
    assert b"every other tenant's token" in p.stderr
    # Consent: it serves both.
    port = free_port()
    argv[4] = str(port)
    ok = subprocess.Popen([*argv, "--allow-none-with-tokens"], stdout=subprocess.DEVNULL,
                          stderr=subprocess.DEVNULL, env=env)
    try:
        assert wait_until(lambda: _get_status(port, "/readyz", "b" * 24) == 200, 30)
    finally:
        ok.terminate()
        ok.wait(30)
    # One principal: fine; a reload that names a second one is refused, the tokens stay.
    tokens.write_text("alice:" + "a" * 24 + "\n")
    port = free_port()
    argv[4] = str(port)
    err = tmp_path / "stderr"
    with open(err, "wb") as f:
        one = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=f, env=env)
    try:
        assert wait_until(lambda: _get_status(port, "/readyz", "a" * 24) == 200, 30)
        tokens.write_text("alice:" + "a" * 24 + "\nbob:" + "b" * 24 + "\n")
        one.send_signal(signal.SIGHUP)
        assert wait_until(lambda: b"now names more than one principal" in err.read_bytes(), 30), err.read_bytes()
        assert _post_status(port, "b" * 24) == 401
        assert _post_status(port, "a" * 24) == 200
    finally:
        one.terminate()
        one.wait(30)


def _get_status(port, path, token):
    try:
        c = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
        c.request("GET", path, headers={"Authorization": f"Bearer {token}"})
        st = c.getresponse().status
        c.close()
        return st
    except OSError:
        return 0


def _post_status(port, token):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    body = json.dumps({"jsonrpc": "2.0", "id": 1, "method": "initialize",
                       "params": {"protocolVersion": "2025-11-25", "capabilities": {}}})
    c.request("POST", "/mcp", body=body, headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json",
                                                  "Accept": "application/json, text/event-stream"})
    st = c.getresponse().status
    c.close()
    return st


# ================================================================ sessions

def test_idle_expiry(make_http):
    s = make_http("--session-idle-seconds", "1")
    sid = s.initialize()
    st, _, _ = s.post({"jsonrpc": "2.0", "id": 1, "method": "ping"}, sid)
    assert st == 200
    time.sleep(0.6)
    assert s.post({"jsonrpc": "2.0", "id": 2, "method": "ping"}, sid)[0] == 200  # activity renews it
    time.sleep(1.9)  # idle: expires within 1 s + half a second of sweep period
    assert s.post({"jsonrpc": "2.0", "id": 3, "method": "ping"}, sid)[0] == 404


def test_session_cap(make_http):
    s = make_http("--max-sessions", "2")
    a = s.initialize()
    # a busy session (a script running) is never evicted
    busy = "import time; print('go', flush=True); time.sleep(6)"
    c, r = s.open_stream(call_msg(1, busy, token=1), a)
    assert wait_for_progress(r, "go")
    b = s.initialize()
    time.sleep(0.05)
    # at the cap, the least recently used idle session (b) makes room
    d = s.initialize()
    assert s.post({"jsonrpc": "2.0", "id": 2, "method": "ping"}, b)[0] == 404
    # two busy sessions: no room -> 503
    c2, r2 = s.open_stream(call_msg(1, busy, token=1), d)
    assert wait_for_progress(r2, "go")
    st, h, body = s.post({"jsonrpc": "2.0", "id": 0, "method": "initialize",
                          "params": {"protocolVersion": LATEST, "capabilities": {}}})
    assert st == 503 and "retry-after" in h
    assert messages(sse_events(r))[-1]["id"] == 1 and messages(sse_events(r2))[-1]["id"] == 1
    c.close()
    c2.close()


# ================================================================ streaming

SLOW = "import sys, time\nfor i in range({n}):\n    print('line', i, flush=True)\n    time.sleep({d})\n"


def test_progress_streams_in_order(srv):
    sid = srv.initialize()
    c, r = srv.open_stream(call_msg(3, SLOW.format(n=5, d=0.1), token="tok"), sid)
    assert r.status == 200 and r.getheader("Content-Type") == "text/event-stream"
    events = list(sse_events(r))
    c.close()
    # priming event first (2025-11-25 session): an id, a retry hint, empty data
    assert events[0]["id"].endswith("-0") and events[0]["data"] == "" and "retry" in events[0]
    msgs = messages(events[1:])
    assert all(e["event"] == "message" for e in events[1:])
    ids = [e["id"] for e in events]
    assert len(set(ids)) == len(ids) and len({i.split("-")[0] for i in ids}) == 1
    progress = [m for m in msgs if m.get("method") == "notifications/progress"]
    assert msgs[-1]["id"] == 3 and "result" in msgs[-1]
    assert [m for m in msgs if "id" in m] == [msgs[-1]]
    values = [p["params"]["progress"] for p in progress]
    assert values == sorted(values) and len(set(values)) == len(values)
    assert all(p["params"]["progressToken"] == "tok" for p in progress)
    text = "".join(p["params"]["message"] for p in progress)
    assert text == "".join(f"line {i}\n" for i in range(5))


def test_no_priming_before_2025_11_25(srv):
    sid = srv.initialize("2025-06-18")
    c, r = srv.open_stream(call_msg(1, "print('x')", token=1), sid)
    events = list(sse_events(r))
    c.close()
    assert all(e.get("data") for e in events)
    assert messages(events)[-1]["id"] == 1


def test_json_only_client_gets_json(srv):
    sid = srv.initialize()
    st, h, body = srv.post(call_msg(1, "print('hi')", token=1), sid, headers={"Accept": "application/json"})
    assert st == 200 and h["content-type"] == "application/json"
    assert json.loads(body)["result"]["structuredContent"]["stdout"] == "hi\n"


def test_resumption_after_disconnect(srv):
    sid = srv.initialize()
    n = 12
    c, r = srv.open_stream(call_msg(4, SLOW.format(n=n, d=0.12), token="r"), sid)
    it = sse_events(r)
    before = []
    for ev in it:
        before.append(ev)
        if len(messages(before)) >= 3:
            break
    last_id = before[-1]["id"]
    # the client goes away mid-script: not a cancellation
    c.sock.shutdown(socket.SHUT_RDWR)
    r.close()
    c.close()
    time.sleep(0.4)
    c2, r2 = srv.open_get(sid, last_event_id=last_id)
    assert r2.status == 200
    after = list(sse_events(r2))
    c2.close()
    all_events = before + after
    ids = [e["id"] for e in all_events]
    assert len(set(ids)) == len(ids), ids  # nothing duplicated
    seqs = [int(i.split("-")[1]) for i in ids]
    assert seqs == list(range(len(seqs))), seqs  # nothing lost
    msgs = messages(all_events)
    assert msgs[-1]["id"] == 4 and msgs[-1]["result"]["structuredContent"]["exit_code"] == 0
    text = "".join(m["params"]["message"] for m in msgs if m.get("method") == "notifications/progress")
    assert text == "".join(f"line {i}\n" for i in range(n))


def test_resumption_after_the_request_finished(srv):
    sid = srv.initialize()
    c, r = srv.open_stream(call_msg(5, SLOW.format(n=3, d=0.1), token="r"), sid)
    first = next(sse_events(r))  # the priming event
    c.sock.shutdown(socket.SHUT_RDWR)
    r.close()
    c.close()
    time.sleep(0.8)  # the script ends while nobody listens
    c2, r2 = srv.open_get(sid, last_event_id=first["id"])
    msgs = messages(list(sse_events(r2)))
    c2.close()
    assert msgs[-1]["id"] == 5 and "result" in msgs[-1]
    # and a resumption of an unknown stream is an empty stream, not an error
    c3, r3 = srv.open_get(sid, last_event_id="999-1")
    assert r3.status == 200 and list(sse_events(r3)) == []
    c3.close()
    st, _, _ = srv.request("GET", "/mcp", headers={"Accept": "text/event-stream", "Mcp-Session-Id": sid,
                                                   "Last-Event-ID": "garbage"})
    assert st == 400


def test_cancellation_ends_stream_without_response(srv):
    sid = srv.initialize()
    script = "import os, time\nprint(os.getpid(), flush=True)\ntime.sleep(30)\n"
    c, r = srv.open_stream(call_msg(9, script, token="c"), sid)
    it = sse_events(r)
    out = ""
    for ev in it:
        for m in messages([ev]):
            if m.get("method") == "notifications/progress":
                out += m["params"]["message"]
        if "\n" in out:
            break
    pid = int(out.split()[0])
    assert os.path.exists(f"/proc/{pid}")
    st, _, _ = srv.post({"jsonrpc": "2.0", "method": "notifications/cancelled",
                         "params": {"requestId": 9, "reason": "user"}}, sid)
    assert st == 202
    rest = messages(list(it))
    c.close()
    assert not [m for m in rest if "id" in m]  # no response
    assert wait_until(lambda: not os.path.exists(f"/proc/{pid}") or
                      open(f"/proc/{pid}/stat").read().split(")")[1].split()[0] == "Z", 10)


# ================================================================ legacy HTTP+SSE

def test_legacy_sse_transport(srv):
    c, r = srv.open_get(None, path="/sse")
    assert r.status == 200
    it = sse_events(r)
    ev = next(it)
    assert ev["event"] == "endpoint"
    m = re.fullmatch(r"/messages\?sessionId=([0-9a-f-]{36})", ev["data"])
    assert m
    url = ev["data"]
    hdrs = {"Content-Type": "application/json"}
    st, _, body = srv.request("POST", url, json.dumps(
        {"jsonrpc": "2.0", "id": 1, "method": "initialize",
         "params": {"protocolVersion": "2024-11-05", "capabilities": {}}}).encode(), hdrs)
    assert st == 202
    ev = next(it)
    assert ev["event"] == "message" and "id" not in ev
    assert json.loads(ev["data"])["result"]["protocolVersion"] == "2024-11-05"
    srv.request("POST", url, b'{"jsonrpc":"2.0","method":"notifications/initialized"}', hdrs)
    srv.request("POST", url, json.dumps(call_msg(2, "print('legacy')")).encode(), hdrs)
    ev = next(it)
    assert json.loads(ev["data"])["result"]["structuredContent"]["stdout"] == "legacy\n"
    st, _, _ = srv.request("POST", url, b"{bad", hdrs)
    assert st == 400
    st, _, _ = srv.request("POST", "/messages?sessionId=nope", b"{}", hdrs)
    assert st == 404
    # legacy ids are not Streamable HTTP sessions
    assert srv.post({"jsonrpc": "2.0", "id": 1, "method": "ping"}, m.group(1))[0] == 404
    c.sock.shutdown(socket.SHUT_RDWR)
    c.close()
    # the stream was the session
    assert wait_until(lambda: srv.request("POST", url, b'{"jsonrpc":"2.0","id":3,"method":"ping"}',
                                          hdrs)[0] == 404, 5)


# ================================================================ TLS

def test_tls_self_signed(make_http):
    s = make_http("--tls-self-signed", tls=True)
    log = s.stderr_text()
    fp = re.search(r"SHA-256 fingerprint: ((?:[0-9A-F]{2}:){31}[0-9A-F]{2})", log).group(1)
    # pinned by fingerprint
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    with socket.create_connection(("127.0.0.1", s.port)) as raw:
        with ctx.wrap_socket(raw, server_hostname="localhost") as t:
            der = t.getpeercert(binary_form=True)
    assert hashlib.sha256(der).hexdigest().upper() == fp.replace(":", "")
    # verified as a trust anchor, with the hostname check
    sid = s.initialize()
    st, _, _ = s.post({"jsonrpc": "2.0", "id": 1, "method": "ping"}, sid)
    assert st == 200
    assert oct(os.stat(os.path.join(s.state_dir, "tls", "key.pem")).st_mode & 0o777) == "0o600"
    # plain HTTP on the TLS port gets nowhere
    with pytest.raises((http.client.HTTPException, ConnectionError, OSError)):
        c = http.client.HTTPConnection("127.0.0.1", s.port, timeout=5)
        c.request("GET", "/mcp")
        c.getresponse().read()
        raise ConnectionError("plain HTTP answered")
    # the same certificate is reused by the next start
    state = s.state_dir
    s2 = make_http("--tls-self-signed", tls=True, state_dir=state)
    assert fp in s2.stderr_text()


# Runs inside a network namespace of its own (unshare -rn), whose loopback interface also
# holds 10.77.0.1: the server binds the wildcard there (no other machine can reach it), and
# the client verifies its certificate by that address, and by a --tls-san name.
TLS_SAN_CHECK = r"""
import json, os, socket, ssl, subprocess, sys, tempfile, time
binary, state = sys.argv[1], sys.argv[2]
tokens = os.path.join(state, "tokens")
os.makedirs(state, exist_ok=True)
open(tokens, "w").write("alice:tls-san-test-token-0123456789\n")
os.chmod(tokens, 0o600)
s = socket.socket(); s.bind(("10.77.0.1", 0)); port = s.getsockname()[1]; s.close()
server = subprocess.Popen([binary, "--transport", "http", "--host", "0.0.0.0", "--port", str(port),
                           "--sandbox-backend", "none", "--state-dir", state, "--auth-token-file", tokens,
                           "--tls-self-signed", "--tls-san", "mps.example.test", "--tls-san", "192.0.2.7"],
                          stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=open(os.path.join(state, "log"), "wb"))
out = {}
try:
    for _ in range(1500):
        try:
            socket.create_connection(("10.77.0.1", port), timeout=1).close()
            break
        except OSError:
            if server.poll() is not None:
                break
            time.sleep(0.01)
    cert = os.path.join(state, "tls", "cert.pem")
    out["san"] = ssl._ssl._test_decode_cert(cert).get("subjectAltName", [])
    ctx = ssl.create_default_context(cafile=cert)
    for name in ("10.77.0.1", "mps.example.test", "not-named.example.test"):
        try:
            with socket.create_connection(("10.77.0.1", port), timeout=10) as raw:
                with ctx.wrap_socket(raw, server_hostname=name) as t:
                    t.sendall(b"GET /healthz HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n")
                    out[name] = t.recv(64).decode(errors="replace").split("\r\n")[0]
        except ssl.SSLCertVerificationError as e:
            out[name] = "verify failed: " + e.verify_message
finally:
    server.terminate()
    server.wait()
    out["log"] = open(os.path.join(state, "log"), errors="replace").read()[-3000:]
print(json.dumps(out))
"""


def test_tls_self_signed_names_the_host_and_its_addresses(tmp_path):
    # --host 0.0.0.0 (the README's LAN example): the certificate holds every interface's
    # address, the host's name and the --tls-san extras, so a client that reaches the server
    # by one of them verifies it.
    probe = subprocess.run(["unshare", "-rn", "true"], capture_output=True)
    if probe.returncode != 0:
        pytest.skip("no network namespace of our own here (unshare -rn): " + probe.stderr.decode()[-200:])
    state = str(tmp_path / "state")
    script = ("ip link set lo up && ip addr add 10.77.0.1/32 dev lo && exec \"$0\" -c \"$1\" \"$2\" \"$3\"")
    r = subprocess.run(["unshare", "-rn", "sh", "-c", script, sys.executable, TLS_SAN_CHECK, BINARY, state],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    san = [tuple(x) for x in out["san"]]
    for want in [("DNS", "localhost"), ("IP Address", "127.0.0.1"), ("IP Address", "10.77.0.1"),
                 ("DNS", "mps.example.test"), ("IP Address", "192.0.2.7"), ("DNS", socket.gethostname())]:
        assert want in san, (want, san, out["log"])
    assert out["10.77.0.1"].startswith("HTTP/1.1 "), out
    assert out["mps.example.test"].startswith("HTTP/1.1 "), out
    assert out["not-named.example.test"].startswith("verify failed"), out
    assert "Sanitizer" not in out["log"] and "runtime error" not in out["log"], out["log"]


def test_tls_san_is_checked_and_a_name_the_certificate_lacks_makes_a_new_one(make_http):
    bad = HttpServer("--tls-self-signed", "--tls-san", "bad_name!", tls=True, expect_start=False)
    assert bad.proc.wait(timeout=30) != 0
    assert "--tls-san: 'bad_name!' is neither" in bad.stderr_text()
    bad.close()
    alone = HttpServer("--tls-san", "mps.example.test", expect_start=False)
    assert alone.proc.wait(timeout=30) != 0
    assert "needs --tls-self-signed" in alone.stderr_text()
    alone.close()
    s = make_http("--tls-self-signed", tls=True)
    fp = re.search(r"SHA-256 fingerprint: (\S+)", s.stderr_text()).group(1)
    state = s.state_dir
    s2 = make_http("--tls-self-signed", "--tls-san", "mps.example.test", tls=True, state_dir=state)
    fp2 = re.search(r"SHA-256 fingerprint: (\S+)", s2.stderr_text()).group(1)
    assert fp2 != fp
    assert "does not name DNS:mps.example.test" in s2.stderr_text()
    cert = ssl._ssl._test_decode_cert(os.path.join(state, "tls", "cert.pem"))
    assert ("DNS", "mps.example.test") in cert["subjectAltName"]
    # the same list, or one name fewer: the certificate stays (a new one is a new trust anchor)
    s3 = make_http("--tls-self-signed", "--tls-san", "mps.example.test", tls=True, state_dir=state)
    assert fp2 in s3.stderr_text()
    s4 = make_http("--tls-self-signed", tls=True, state_dir=state)
    assert fp2 in s4.stderr_text()


# ================================================================ load, limits, IPv6

def test_concurrent_sessions_and_flat_memory(make_http):
    s = make_http()
    sanitized = s.sanitized()

    def round_(n_sessions=12, calls=2):
        results, errors = {}, []

        def worker(k):
            try:
                sid = s.initialize()
                threads = []

                def one(j):
                    st, h, body = s.post(call_msg(j, f"print({k} * 1000 + {j})", token=j), sid)
                    if h.get("content-type") == "text/event-stream":
                        msgs = [json.loads(x[6:]) for x in body.decode().split("\n") if x.startswith("data: {")]
                    else:
                        msgs = [json.loads(body)]
                    results[(k, j)] = [m for m in msgs if "id" in m]
                for j in range(calls):
                    t = threading.Thread(target=one, args=(j,))
                    t.start()
                    threads.append(t)
                for t in threads:
                    t.join()
                assert s.request("DELETE", "/mcp", headers={"Mcp-Session-Id": sid})[0] == 200
            except Exception as e:  # noqa: BLE001
                errors.append(repr(e))
        ts = [threading.Thread(target=worker, args=(k,)) for k in range(n_sessions)]
        for t in ts:
            t.start()
        for t in ts:
            t.join()
        assert not errors, errors
        assert len(results) == n_sessions * calls
        for (k, j), resp in results.items():
            assert len(resp) == 1, resp  # exactly one response each
            assert resp[0]["id"] == j
            assert resp[0]["result"]["structuredContent"]["stdout"] == f"{k * 1000 + j}\n"

    round_()
    round_()
    before = s.rss_kib()
    round_()
    round_()
    after = s.rss_kib()
    if not sanitized:
        assert after - before < 3072, (before, after)


def test_body_limit(make_http):
    s = make_http("--max-message-bytes", "4096")
    sid = s.initialize()
    big = json.dumps({"jsonrpc": "2.0", "id": 1, "method": "ping", "params": {"pad": "x" * 5000}}).encode()
    # declared too large: refused before reading the body
    with socket.create_connection(("127.0.0.1", s.port)) as raw:
        raw.sendall(b"POST /mcp HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                    b"Mcp-Session-Id: " + sid.encode() + b"\r\nContent-Length: " + str(len(big)).encode() +
                    b"\r\n\r\n" + big[:100])
        head = raw.recv(4096)
    assert head.startswith(b"HTTP/1.1 413")
    # chunked (no declared length): refused once it grows past the limit
    with socket.create_connection(("127.0.0.1", s.port)) as raw:
        raw.settimeout(10)
        raw.sendall(b"POST /mcp HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                    b"Transfer-Encoding: chunked\r\nMcp-Session-Id: " + sid.encode() + b"\r\n\r\n")
        try:
            for i in range(0, len(big), 1000):
                part = big[i:i + 1000]
                raw.sendall(b"%x\r\n%s\r\n" % (len(part), part))
            raw.sendall(b"0\r\n\r\n")
        except OSError:
            pass
        head = raw.recv(4096)
    assert head.startswith(b"HTTP/1.1 413")
    # headers too large for a connection's memory: 431
    with socket.create_connection(("127.0.0.1", s.port)) as raw:
        raw.sendall(b"POST /mcp HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Big: " + b"a" * 70000 + b"\r\n\r\n")
        head = raw.recv(4096)
    assert head.startswith(b"HTTP/1.1 431")
    # and the server lives on
    assert s.post({"jsonrpc": "2.0", "id": 2, "method": "ping"}, sid)[0] == 200


def test_ipv6_loopback(make_http):
    if not socket.has_ipv6:
        pytest.skip("no IPv6")
    try:
        free_port(socket.AF_INET6, "::1")
    except OSError:
        pytest.skip("no ::1 on this machine")
    s = make_http(host="::1")
    sid = s.initialize()
    assert s.post({"jsonrpc": "2.0", "id": 1, "method": "ping"}, sid)[0] == 200


def test_sigterm_with_open_streams(make_http):
    # Without a drain (test_service.py has the drain): SIGTERM ends everything at once.
    s = make_http("--drain-seconds", "0")
    sid = s.initialize()
    g, gr = s.open_get(sid)
    c, r = s.open_stream(call_msg(1, "import time; print('go', flush=True); time.sleep(120)", token=1), sid)
    assert wait_for_progress(r, "go")
    # At once, not when the call would end (120 s): close() kills a server still there after
    # its timeout, and the exit status would not be 0.  (The one bound is the feature; a
    # loaded machine's margin.)
    assert s.close(timeout=60) == 0
    g.close()
    c.close()


def test_artifact_download_url(make_http, tmp_path):
    tokens = tmp_path / "tokens"
    tokens.write_text("dl-token-1\n")
    s = make_http("--auth-token-file", str(tokens))
    auth = {"Authorization": "Bearer dl-token-1"}
    sid = s.initialize(headers=auth)
    script = ("import os\nos.makedirs('outputs', exist_ok=True)\n"
              "open('outputs/data.bin', 'wb').write(bytes(range(256)) * 8192)\n")
    st, h, body = s.post(call_msg(1, script), sid, headers=auth, version=LATEST)
    assert st == 200
    if h["content-type"].startswith("text/event-stream"):
        result = [m for m in messages(sse_events_from_bytes(body)) if m.get("id") == 1][0]["result"]
    else:
        result = json.loads(body)["result"]
    links = [c for c in result["content"] if c["type"] == "resource_link"]
    assert links, result["content"]
    uri = links[0]["uri"]
    assert uri.startswith("sandbox://runs/")
    path = "/mcp/runs/" + uri[len("sandbox://runs/"):]
    st, h, data = s.request("GET", path, headers=auth)
    assert st == 200 and data == bytes(range(256)) * 8192
    assert h["content-type"] == "application/octet-stream"
    st, _, _ = s.request("GET", path)  # the same token rules as the endpoint
    assert st == 401
    st, _, _ = s.request("GET", path.rsplit("/", 1)[0] + "/nope.bin", headers=auth)
    assert st == 404
    st, _, _ = s.request("GET", "/mcp/runs/../../etc/passwd", headers=auth)
    assert st in (400, 404)
    st, _, _ = s.request("POST", path, headers=auth)
    assert st == 405


def sse_events_from_bytes(body):
    events, cur = [], {}
    for line in body.decode().splitlines():
        if not line:
            if cur:
                events.append(cur)
            cur = {}
        elif line.startswith("data:"):
            cur["data"] = cur.get("data", "") + line[5:].strip()
        elif line.startswith("id:"):
            cur["id"] = line[3:].strip()
    if cur:
        events.append(cur)
    return events


def test_per_token_limit_across_sessions(make_http, tmp_path):
    tokens = tmp_path / "tokens"
    tokens.write_text("alice: tok-alice\nbob: tok-bob\n")
    s = make_http("--auth-token-file", str(tokens), "--max-token-concurrent", "1")
    alice, bob = {"Authorization": "Bearer tok-alice"}, {"Authorization": "Bearer tok-bob"}
    sid1 = s.initialize(headers=alice)
    sid2 = s.initialize(headers=alice)
    sid3 = s.initialize(headers=bob)
    # A slow call for alice on one session (SSE: progress token), then a second on another.
    conn, resp = s.open_stream(call_msg(1, "import time\nprint('x', flush=True)\ntime.sleep(1.5)", token="p"),
                               sid1, headers=alice)
    assert wait_for_progress(resp, "x")
    st, h, body = s.post(call_msg(2, "print('second')"), sid2, headers=alice, version=LATEST)
    res = json.loads(body)["result"] if h["content-type"] == "application/json" else \
        [m for m in messages(sse_events_from_bytes(body)) if m.get("id") == 2][0]["result"]
    assert res["isError"] is True and "per-token limit" in res["content"][0]["text"] and "alice" in res["content"][0]["text"]
    # bob is not affected
    st, h, body = s.post(call_msg(3, "print('bob')"), sid3, headers=bob, version=LATEST)
    res = json.loads(body)["result"] if h["content-type"] == "application/json" else \
        [m for m in messages(sse_events_from_bytes(body)) if m.get("id") == 3][0]["result"]
    assert res["structuredContent"]["stdout"] == "bob\n"
    msgs = messages(sse_events(resp))
    assert [m for m in msgs if m.get("id") == 1][0]["result"]["structuredContent"]["exit_code"] == 0
    conn.close()

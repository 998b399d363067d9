"""Running it as a service: /healthz, /readyz and /metrics, the drain on SIGTERM (running calls
finish, new ones get 503 with Retry-After, a second SIGTERM or the deadline cancels), SIGHUP
reading the token file again, and authentication failures in the audit log."""
import json
import os
import re
import signal
import subprocess
import threading
import time

import pytest

from conftest import BACKEND, BINARY, Server, descendants, processes_with_marker, wait_until
from test_http import HttpServer, call_msg, sse_events


def get(srv, path, headers=None):
    return srv.request("GET", path, None, headers or {})


def metric(text, name, **labels):
    want = ",".join(f'{k}="{v}"' for k, v in labels.items())
    pat = re.escape(name) + (r"\{" + re.escape(want) + r"\}" if labels else "") + r" (\S+)$"
    for line in text.splitlines():
        m = re.match(pat, line)
        if m:
            return float(m.group(1))
    return None


def answer_of(body):
    """The JSON-RPC answer in a POST's body (JSON, or the last message of an SSE stream)."""
    text = body.decode() if isinstance(body, bytes) else body
    if text.lstrip().startswith("{"):
        return json.loads(text)
    msgs = [json.loads(l[5:]) for l in text.splitlines() if l.startswith("data:") and l[5:].strip()]
    return [m for m in msgs if "id" in m][-1]


def test_health_ready_and_metrics(tmp_path):
    tokens = tmp_path / "tokens"
    tokens.write_text("alice:alice-token-0123456789\nops:ops-token-0123456789\n")
    srv = HttpServer("--sandbox-backend", BACKEND, "--auth-token-file", str(tokens), "--prestart", "off",
                     "--metrics-token", "ops")
    try:
        auth = {"Authorization": "Bearer alice-token-0123456789"}
        ops = {"Authorization": "Bearer ops-token-0123456789"}
        # The probes need no token; /metrics does, and an operator's (--metrics-token).
        st, h, body = get(srv, "/healthz")
        assert st == 200 and body.strip() == b"ok", (st, body)
        assert wait_until(lambda: get(srv, "/readyz")[0] == 200, timeout=30)
        st, _, _ = get(srv, "/metrics")
        assert st == 401
        st, _, _ = get(srv, "/metrics", auth)
        assert st == 403
        st, h, before = get(srv, "/metrics", ops)
        assert st == 200 and h["content-type"].startswith("text/plain; version=0.0.4"), h
        before = before.decode()
        assert "# TYPE mcp_sandbox_tool_calls_total counter" in before
        ok0 = metric(before, "mcp_sandbox_tool_calls_total", tool="execute_python", outcome="ok")
        assert ok0 == 0
        sid = srv.initialize(headers=auth)
        for i in range(2):
            st, _, b = srv.post(call_msg(10 + i, "print(1)"), sid, headers=auth)
            assert st == 200, b
        st, _, b = srv.post(call_msg(20, "import time\ntime.sleep(10)", timeout_seconds=1), sid, headers=auth)
        assert answer_of(b)["result"]["isError"] is True
        st, _, after = get(srv, "/metrics", ops)
        after = after.decode()
        assert metric(after, "mcp_sandbox_tool_calls_total", tool="execute_python", outcome="ok") == 2
        assert metric(after, "mcp_sandbox_tool_calls_total", tool="execute_python", outcome="limit") == 1
        assert metric(after, "mcp_sandbox_run_limit_kills_total", limit="timeout") == 1
        assert metric(after, "mcp_sandbox_tool_call_duration_seconds_count", tool="execute_python") == 3
        assert metric(after, "mcp_sandbox_http_auth_failures_total") >= 1
        assert metric(after, "mcp_sandbox_http_sessions") == 1
        assert metric(after, "mcp_sandbox_ready") == 1
        assert metric(after, "mcp_sandbox_queue_wait_seconds_count") == 3
        assert metric(after, "mcp_sandbox_executions_running") == 0
        assert metric(after, "mcp_sandbox_executions_starting") == 0
        assert metric(after, "mcp_sandbox_prestart_ready") == 0  # --prestart off
        assert metric(after, "mcp_sandbox_interpreter_downloads_total", result="ok") == 0
        assert metric(after, "mcp_sandbox_env_builds_total") == 0
        # No per-session, per-run or per-principal series: the labels are fixed sets.
        assert "alice" not in after and sid not in after
        # --health-auth: the probes want a token too.
    finally:
        assert srv.close() == 0
    srv = HttpServer("--sandbox-backend", BACKEND, "--auth-token-file", str(tokens), "--health-auth",
                     "--prestart", "off")
    try:
        assert get(srv, "/healthz")[0] == 401
        assert get(srv, "/healthz", {"Authorization": "Bearer alice-token-0123456789"})[0] == 200
    finally:
        assert srv.close() == 0


@pytest.mark.skipif(BACKEND != "bwrap", reason="only bubblewrap holds interpreters (issue 20)")
def test_metrics_count_prestarted_interpreters():
    srv = HttpServer("--sandbox-backend", BACKEND, "--prestart", "1")
    try:
        def ready():
            return metric(get(srv, "/metrics")[2].decode(), "mcp_sandbox_prestart_ready_interpreters")
        assert wait_until(lambda: ready() >= 1, timeout=60), get(srv, "/metrics")[2].decode()
        sid = srv.initialize()
        st, _, b = srv.post(call_msg(1, "print(1)", details=True), sid)
        assert st == 200 and "prestarted: interpreter" in answer_of(b)["result"]["content"][0]["text"], b
        after = get(srv, "/metrics")[2].decode()
        assert metric(after, "mcp_sandbox_prestart_taken_interpreter_total") == 1
        assert metric(after, "mcp_sandbox_prestart_taken_total") == 1
    finally:
        assert srv.close() == 0


def marked(marker, seconds):
    """A script that sleeps, with a child whose command line carries marker (found by
    processes_with_marker) sleeping as long."""
    return (f"import subprocess, sys, time\n"
            f"subprocess.Popen([sys.executable, '-c', 'import time; time.sleep({seconds})', '{marker}'])\n"
            f"time.sleep({seconds})\n")


def start_call(srv, sid, req_id, script, headers=None, **args):
    """POSTs a call on a thread of its own; returns (thread, results list)."""
    out = []

    def run():
        try:
            out.append(srv.post(call_msg(req_id, script, **args), sid, headers=headers))
        except Exception as e:  # noqa: BLE001 (the connection may be cut by the shutdown)
            out.append(e)
    t = threading.Thread(target=run, daemon=True)
    t.start()
    return t, out


def test_sigterm_drains_running_calls_and_refuses_new_ones(tmp_path):
    srv = HttpServer("--sandbox-backend", BACKEND, "--drain-seconds", "30", "--prestart", "off")
    try:
        sid = srv.initialize()
        marker = "mps-drain-%d" % os.getpid()
        t, out = start_call(srv, sid, 1, marked(marker, 3) + "print('finished')\n")
        assert wait_until(lambda: processes_with_marker(marker), timeout=30)
        started = time.monotonic()
        srv.proc.send_signal(signal.SIGTERM)
        assert wait_until(lambda: get(srv, "/readyz")[0] == 503, timeout=10)
        st, h, body = get(srv, "/readyz")
        assert st == 503 and h.get("retry-after"), (st, h)
        # A new call and a new session: 503 with Retry-After; a ping still works.
        st, h, body = srv.post(call_msg(2, "print(2)"), sid)
        assert st == 503 and int(h["retry-after"]) >= 1, (st, h, body)
        assert json.loads(body)["id"] == 2
        st, h, body = srv.post({"jsonrpc": "2.0", "id": 3, "method": "initialize",
                                "params": {"protocolVersion": "2025-06-18", "capabilities": {},
                                           "clientInfo": {"name": "late", "version": "0"}}})
        assert st == 503
        st, _, body = srv.post({"jsonrpc": "2.0", "id": 4, "method": "ping"}, sid)
        assert st == 200 and json.loads(body)["result"] == {}
        # The running call finishes with its result, and then the server goes.
        t.join(timeout=30)
        st, _, body = out[0]
        res = answer_of(body)["result"]
        assert res["isError"] is False and "finished" in res["content"][0]["text"]
        assert srv.proc.wait(timeout=15) == 0
        assert time.monotonic() - started < 20
        assert processes_with_marker(marker) == []
    finally:
        srv.close()


def test_the_drain_deadline_and_a_second_sigterm_cancel(tmp_path):
    for how in ("deadline", "second"):
        args = ["--drain-seconds", "2" if how == "deadline" else "60"]
        srv = HttpServer("--sandbox-backend", BACKEND, "--kill-grace-seconds", "1", "--prestart", "off", *args)
        try:
            sid = srv.initialize()
            marker = "mps-drain-%s-%d" % (how, os.getpid())
            t, out = start_call(srv, sid, 1, marked(marker, 120))
            assert wait_until(lambda: processes_with_marker(marker), timeout=30)
            started = time.monotonic()
            srv.proc.send_signal(signal.SIGTERM)
            if how == "second":
                assert wait_until(lambda: get(srv, "/readyz")[0] == 503, timeout=10)
                assert srv.proc.poll() is None  # draining
                srv.proc.send_signal(signal.SIGTERM)
            assert srv.proc.wait(timeout=20) == 0
            assert time.monotonic() - started < 15
            assert wait_until(lambda: processes_with_marker(marker) == [], timeout=5)
        finally:
            srv.close()


def test_stdio_drain_refuses_new_calls_with_a_tool_error(tmp_path):
    s = Server("--drain-seconds", "30", "--prestart", "off")
    try:
        s.initialize()
        marker = "mps-stdio-drain-%d" % os.getpid()
        s.send({"jsonrpc": "2.0", "id": 1, "method": "tools/call",
                "params": {"name": "execute_python",
                           "arguments": {"script": marked(marker, 2) + "print('done')\n"}}})
        assert wait_until(lambda: processes_with_marker(marker), timeout=30)
        s.proc.send_signal(signal.SIGTERM)
        time.sleep(0.3)
        res = s.request("tools/call", {"name": "execute_python", "arguments": {"script": "print(3)"}},
                        req_id=2)["result"]
        assert res["isError"] is True and "draining" in res["content"][0]["text"]
        first = s.recv_response(1, timeout=30)
        assert first["result"]["isError"] is False and "done" in first["result"]["content"][0]["text"]
        assert s.proc.wait(timeout=15) == 0
    finally:
        s.close()


def test_sighup_reads_the_token_file_again(tmp_path):
    tokens = tmp_path / "tokens"
    tokens.write_text("alice:alice-token-0123456789\n")
    log = str(tmp_path / "audit.log")
    srv = HttpServer("--auth-token-file", str(tokens), "--audit-log", log, "--prestart", "off")
    alice = {"Authorization": "Bearer alice-token-0123456789"}
    bob = {"Authorization": "Bearer bob-token-0123456789ab"}
    ping = {"jsonrpc": "2.0", "id": 1, "method": "ping"}
    try:
        sid = srv.initialize(headers=alice)
        assert srv.post(ping, sid, headers=bob)[0] == 401
        tokens.write_text("alice:alice-token-0123456789\nbob:bob-token-0123456789ab\n")
        srv.proc.send_signal(signal.SIGHUP)
        assert wait_until(lambda: srv.post(ping, None, headers=bob)[0] != 401, timeout=10)
        bob_sid = srv.initialize(headers=bob)
        # alice removed: refused from the next request on, her session too.
        tokens.write_text("bob:bob-token-0123456789ab\n")
        srv.proc.send_signal(signal.SIGHUP)
        assert wait_until(lambda: srv.post(ping, sid, headers=alice)[0] == 401, timeout=10)
        assert srv.post(ping, bob_sid, headers=bob)[0] == 200
        # A file without tokens would open the server to anyone: the old tokens stay.
        tokens.write_text("# nobody\n")
        srv.proc.send_signal(signal.SIGHUP)
        time.sleep(0.5)
        assert srv.post(ping, bob_sid, headers=bob)[0] == 200
        assert srv.post(ping, None)[0] == 401
        assert srv.proc.poll() is None
        assert wait_until(lambda: any(l.get("event") == "auth_failure"
                                      for l in map(json.loads, open(log).read().splitlines())), timeout=10)
    finally:
        assert srv.close() == 0
    text = open(log).read()
    fails = [json.loads(l) for l in text.splitlines() if '"auth_failure"' in l]
    assert fails and fails[0]["remote"] == "127.0.0.1" and fails[0]["reason"] in ("missing", "invalid")
    assert "alice-token" not in text and "bob-token" not in text


def test_the_drain_refuses_a_new_legacy_sse_session(tmp_path):
    """GET /sse makes a session (HTTP+SSE: the stream is the session): during the drain it is
    refused like an initialize, with 503 and Retry-After, not opened to fail later."""
    srv = HttpServer("--sandbox-backend", BACKEND, "--drain-seconds", "30", "--prestart", "off")
    try:
        sid = srv.initialize()
        marker = "mps-drain-sse-%d" % os.getpid()
        t, out = start_call(srv, sid, 1, marked(marker, 3))
        assert wait_until(lambda: processes_with_marker(marker), timeout=30)
        srv.proc.send_signal(signal.SIGTERM)
        assert wait_until(lambda: get(srv, "/readyz")[0] == 503, timeout=10)
        c, r = srv.open_get(None, path="/sse")
        try:
            assert r.status == 503 and int(r.getheader("Retry-After")) >= 1, r.status
        finally:
            c.close()
        t.join(timeout=30)
        assert srv.proc.wait(timeout=15) == 0
    finally:
        srv.close()


def test_a_reload_never_gives_an_unnamed_tokens_tenancy_to_another_token(tmp_path):
    """An unnamed token is the principal "line N".  Removing the first of two unnamed tokens
    moves the second to line 1: it must not thereby become the removed token's tenant (its
    sessions, tasks and files).  Such a reload is refused and says why."""
    tokens = tmp_path / "tokens"
    tokens.write_text("first-token-0123456789ab\nsecond-token-0123456789a\n")
    srv = HttpServer("--auth-token-file", str(tokens), "--prestart", "off")
    first = {"Authorization": "Bearer first-token-0123456789ab"}
    second = {"Authorization": "Bearer second-token-0123456789a"}
    ping = {"jsonrpc": "2.0", "id": 1, "method": "ping"}
    try:
        sid = srv.initialize(headers=first)
        assert srv.post(ping, sid, headers=second)[0] == 404
        tokens.write_text("second-token-0123456789a\n")
        srv.proc.send_signal(signal.SIGHUP)
        # Refused (the tokens stay as they were), and the log says which line.
        assert wait_until(lambda: "stay as they were" in srv.stderr_text(), timeout=10), \
            srv.stderr_text()
        assert "line 1" in srv.stderr_text()
        assert srv.post(ping, sid, headers=second)[0] == 404
        assert srv.post(ping, sid, headers=first)[0] == 200
        # A file that names its tokens is taken.
        tokens.write_text("bob:second-token-0123456789a\n")
        srv.proc.send_signal(signal.SIGHUP)
        assert wait_until(lambda: srv.post(ping, sid, headers=first)[0] == 401, timeout=10)
        assert srv.post(ping, sid, headers=second)[0] == 404
    finally:
        srv.close()

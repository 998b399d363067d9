"""The audit log (--audit-log): one JSON line per tool call, with who, what (the script by its
digest, never its text), how it ended and what it cost; the token never; SIGHUP reopens the
file after logrotate moved it; a file that cannot be an audit log stops the server at start-up."""
import hashlib
import json
import os
import signal
import subprocess

from conftest import BACKEND, BINARY, Server, wait_until
from test_http import HttpServer, call_msg


def lines_of(path):
    if not os.path.exists(path):
        return []
    with open(path) as f:
        return [json.loads(l) for l in f if l.strip()]


def tool_lines(path, n, timeout=10):
    """The first n tool_call lines, once the writer thread wrote them."""
    assert wait_until(lambda: len([l for l in lines_of(path) if l.get("event") == "tool_call"]) >= n,
                      timeout=timeout), lines_of(path)
    return [l for l in lines_of(path) if l.get("event") == "tool_call"]


def test_a_line_per_tool_call_with_outcome_and_cost(tmp_path):
    log = str(tmp_path / "audit.log")
    s = Server("--audit-log", log, "--prestart", "off")
    try:
        s.initialize()
        script = "print('secret-text-of-the-script')\n"
        assert s.execute(script)["isError"] is False
        res = s.execute("import time\ntime.sleep(30)\n", timeout_seconds=1)
        assert res["isError"] is True
        assert s.execute("import sys\nsys.exit(3)\n")["isError"] is True
        s.call("check_environment", {})
        # An unknown tool is no tool call (nothing to name in a line).
        s.request("tools/call", {"name": "no_such_tool", "arguments": {}})
        s.execute("import os\nos.makedirs('outputs', exist_ok=True)\nopen('outputs/a.txt', 'w').write('x')\n")
        lines = tool_lines(log, 5)
    finally:
        s.close()
    ok, timeout, failed, env, art = lines[:5]
    # The session by the server's number for it (over HTTP its id is a credential).
    assert isinstance(ok["session"], int) and ok["session"] >= 1
    assert all(l["session"] == ok["session"] for l in lines)
    assert ok["artifacts"] == 0 and art["artifacts"] == 1 and art["artifact_bytes"] == 1
    assert list(ok)[0] == "time" and ok["time"].endswith("Z")
    assert ok["principal"] and ok["tool"] == "execute_python" and ok["outcome"] == "ok"
    assert ok["script_sha256"] == hashlib.sha256(script.encode()).hexdigest()
    assert ok["script_bytes"] == len(script) and ok["exit_code"] == 0
    assert ok["sandbox"] == BACKEND and ok["python"] and ok["network"] in ("off", "policy")
    assert ok["stdout_bytes"] == len("secret-text-of-the-script\n")
    assert isinstance(ok["duration_ms"], int) and isinstance(ok["cpu_ms"], int)
    assert timeout["outcome"] == "limit" and timeout["limit"] == "timeout"
    assert failed["outcome"] == "tool_error" and failed["exit_code"] == 3
    assert env["tool"] == "check_environment" and env["outcome"] == "ok"
    with open(log) as f:
        text = f.read()
    assert "secret-text-of-the-script" not in text
    assert os.stat(log).st_mode & 0o777 == 0o600


def test_http_lines_name_the_token_never_the_token(tmp_path):
    tokens = tmp_path / "tokens"
    secret = "s3cr3t-token-value-0123456789abcdef"
    tokens.write_text(f"alice:{secret}\n")
    log = str(tmp_path / "audit.log")
    srv = HttpServer("--auth-token-file", str(tokens), "--audit-log", log, "--prestart", "off")
    try:
        auth = {"Authorization": "Bearer " + secret}
        sid = srv.initialize(headers=auth)
        st, _, _ = srv.post(call_msg(1, "print(1)"), sid, headers=auth)
        assert st == 200
        lines = tool_lines(log, 1)
    finally:
        srv.close()
    assert lines[0]["principal"] == "alice" and lines[0]["outcome"] == "ok"
    with open(log) as f:
        assert secret not in f.read()


def test_sighup_reopens_after_logrotate(tmp_path):
    log = str(tmp_path / "audit.log")
    s = Server("--audit-log", log, "--prestart", "off")
    try:
        s.initialize()
        s.execute("print('before')")
        tool_lines(log, 1)
        os.rename(log, log + ".1")
        s.proc.send_signal(signal.SIGHUP)
        # The server lives on (SIGHUP is not a stop) and writes to a new file.
        assert wait_until(lambda: os.path.exists(log), timeout=10)
        assert s.execute("print('after')")["isError"] is False
        assert len(tool_lines(log, 1)) == 1
        assert s.proc.poll() is None
    finally:
        s.close()
    assert len([l for l in lines_of(log + ".1") if l.get("event") == "tool_call"]) == 1


def test_an_audit_log_that_is_not_a_file_stops_the_start(tmp_path):
    fifo = str(tmp_path / "fifo")
    os.mkfifo(fifo)
    # (Opening the FIFO would block: the run's timeout is the hang's failure.)
    r = subprocess.run([BINARY, "--audit-log", fifo, "--state-dir", str(tmp_path / "state")],
                       stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=30)
    assert r.returncode != 0
    assert "audit" in r.stderr and "not a regular file" in r.stderr, r.stderr
    r = subprocess.run([BINARY, "--audit-log", str(tmp_path / "no" / "such" / "dir"), "--state-dir",
                        str(tmp_path / "state")], stdin=subprocess.DEVNULL, capture_output=True,
                       text=True, timeout=30)
    assert r.returncode != 0 and "audit" in r.stderr


def test_rotation_by_size(tmp_path):
    log = str(tmp_path / "audit.log")
    s = Server("--audit-log", log, "--audit-log-max-bytes", "1K", "--audit-log-keep", "2",
               "--prestart", "off")
    try:
        s.initialize()
        for i in range(30):  # about 150 bytes a line: three files' worth
            s.call("check_environment", {})
        assert wait_until(lambda: os.path.exists(log + ".2"), timeout=10)
    finally:
        s.close()
    assert not os.path.exists(log + ".3")


def test_a_record_too_large_still_says_who_what_and_how(tmp_path):
    """A caller cannot wipe its own line: 256 long requirements make the record far larger than
    a line may be, yet the line keeps the principal, the tool, the script's digest and the
    outcome (what is too long goes, and the line says which)."""
    log = str(tmp_path / "audit.log")
    s = Server("--audit-log", log, "--prestart", "off", "--offline")
    try:
        s.initialize()
        script = "print('hidden')\n"
        deps = ["p%03d%s" % (i, "x" * 400) for i in range(256)]
        s.execute(script, dependencies=deps)
        lines = tool_lines(log, 1)
    finally:
        s.close()
    line = lines[0]
    assert line["tool"] == "execute_python" and line["principal"], line
    assert line["outcome"] in ("ok", "tool_error", "error"), line
    assert line["script_sha256"] == hashlib.sha256(script.encode()).hexdigest(), line
    assert "requirements" in line.get("omitted", []), line
    with open(log) as f:
        assert all(len(l) <= 64 * 1024 for l in f)

"""The server's log under systemd: when stderr is the journal's stream (JOURNAL_STREAM names its
device and inode, as systemd sets it for a service), every line starts with its sd-daemon
priority (<3> error, <4> warning, <6> info, <7> debug), so that `journalctl -p warning` finds
the warnings; otherwise lines keep their timestamp.  A warm-up that fails is a warning and
counts in mcp_sandbox_warmup_failures_total (deploy/prometheus's WarmUpFailed alert), and the
drain says when it is over.  (tests/package/test-deb.sh reads the same lines back from a real
journald with journalctl -p.)"""
import os
import re
import signal
import socket
import subprocess
import urllib.request

from conftest import BINARY, wait_until


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def closed_port():
    """A loopback port nothing listens on (bound, never listening: connections are refused)."""
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    return s, s.getsockname()[1]


def start(tmp_path, journal, *args, env_extra=None):
    err_path = tmp_path / "stderr.log"
    err = open(err_path, "wb")
    env = dict(os.environ)
    env.pop("JOURNAL_STREAM", None)
    st = os.fstat(err.fileno())
    # Not the journal: a JOURNAL_STREAM naming another file must change nothing.
    env["JOURNAL_STREAM"] = f"{st.st_dev}:{st.st_ino if journal else st.st_ino + 1}"
    env.update(env_extra or {})
    port = free_port()
    proc = subprocess.Popen([BINARY, "--transport", "http", "--host", "127.0.0.1", "--port", str(port),
                             "--sandbox-backend", "none", "--state-dir", str(tmp_path / "state"),
                             "--prestart", "off", *args],
                            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=err, env=env)
    err.close()
    return proc, port, err_path


def metrics(port):
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
            return r.read().decode()
    except OSError:
        return ""


def metric(text, name):
    m = re.search(r"^" + re.escape(name) + r" (\S+)$", text, re.M)
    return float(m.group(1)) if m else None


def test_journal_lines_carry_priorities_and_a_failed_warm_up_is_a_counted_warning(tmp_path):
    sock, dead = closed_port()
    try:
        proc, port, err_path = start(tmp_path, True, "--index-url", f"http://127.0.0.1:{dead}/simple",
                                     env_extra={"MCP_PY_SANDBOX_WARM_CACHE": "1"})
        try:
            assert wait_until(lambda: metric(metrics(port), "mcp_sandbox_warmup_failures_total") == 1,
                              timeout=180), err_path.read_text()
            proc.send_signal(signal.SIGTERM)
            assert proc.wait(timeout=60) == 0
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    finally:
        sock.close()
    lines = err_path.read_text().splitlines()
    assert lines, "no log"
    # Every line has a priority prefix, and no timestamp (the journal keeps its own).
    bad = [l for l in lines if not re.match(r"<[3467]>(error|warning|info|debug): |<5>mcp-python-exec-sandbox .* listening on ", l)]
    assert not bad, bad
    assert any(l.startswith("<5>") and "listening on" in l for l in lines), lines
    assert any(l.startswith("<6>info: ") for l in lines), lines
    assert any(l.startswith("<4>warning: ") and "warming" in l for l in lines), lines
    # The drain's end is said.
    assert any(l.startswith("<6>info: drain: done") for l in lines), lines


def test_without_the_journal_lines_keep_their_timestamp(tmp_path):
    proc, port, err_path = start(tmp_path, False)
    try:
        assert wait_until(lambda: metric(metrics(port), "mcp_sandbox_warmup_failures_total") == 0, timeout=60)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    lines = err_path.read_text().splitlines()
    assert lines and all(re.match(r"\d{4}-\d\d-\d\dT\S+Z (error|warning|info|debug) mcp-python-exec-sandbox: |mcp-python-exec-sandbox \S+ listening on ", l)
                         for l in lines), lines


def test_a_startup_error_is_an_error_in_the_journal(tmp_path):
    err_path = tmp_path / "stderr.log"
    with open(err_path, "wb") as err:
        st = os.fstat(err.fileno())
        env = dict(os.environ, JOURNAL_STREAM=f"{st.st_dev}:{st.st_ino}")
        rc = subprocess.run([BINARY, "--no-such-flag"], stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                            stderr=err, env=env).returncode
    assert rc == 2
    assert err_path.read_text().startswith("<3>mcp-python-exec-sandbox: error: "), err_path.read_text()

"""Regressions found in review (the joints between sessions, admission, tokens and the drain)."""
import os
import time

from conftest import kernel_pids, wait_until


def text(res):
    return res["content"][0]["text"]


def test_a_queued_session_call_leaves_the_kernel_frozen(make_server):
    """A session's kernel is thawed when its call runs, not when the call is claimed: while the
    call waits for a slot (--max-concurrent) a thread the user left spinning gets no CPU
    outside the calls the scheduler admitted."""
    s = make_server("--prestart", "off", "--max-concurrent", "1")
    s.initialize()
    res = s.execute("import threading, time\n"
                    "n = 0\n"
                    "def spin():\n    global n\n    while True: n += 1\n"
                    "threading.Thread(target=spin, daemon=True).start()\n"
                    "time.sleep(0.3)\n"
                    "print(time.process_time())", session="new")
    sc = res["structuredContent"]
    sid = sc["session"]["id"]
    assert sc["session"]["kernel_frozen"] is True, text(res)
    cpu_before = float(sc["stdout"])
    # Another call takes the one slot; the session's call waits for it.
    s.send({"jsonrpc": "2.0", "id": 901, "method": "tools/call",
            "params": {"name": "execute_python", "arguments": {"details": True,
                "script": "import time\nprint('started', flush=True)\ntime.sleep(5)"},
                "_meta": {"progressToken": "p"}}})
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        msg = s.recv(timeout=30)
        if msg.get("method") == "notifications/progress" and "started" in msg["params"].get("message", ""):
            break
    s.send({"jsonrpc": "2.0", "id": 902, "method": "tools/call",
            "params": {"name": "execute_python", "arguments": {"details": True,
                "script": "import time\nprint(time.process_time())", "session": sid}}})
    first = s.recv_response(901, timeout=60)
    assert first["result"]["structuredContent"]["exit_code"] == 0, first
    second = s.recv_response(902, timeout=60)["result"]
    spent = float(second["structuredContent"]["stdout"]) - cpu_before
    assert spent < 1.5, f"the kernel used {spent:.2f} s of CPU while its call waited for a slot"
    s.call("close_session", {"session": sid})
    assert wait_until(lambda: not kernel_pids(s.proc.pid), 10)


def test_a_killed_servers_frozen_kernel_is_ended_by_the_next_start(make_server):
    """A server killed (SIGKILL, a crash) while a session was idle left its kernel frozen in
    the cgroup v1 freezer: frozen, it takes no signal, not its parent-death SIGKILL nor the
    next server's sweep of dead servers' cgroups, so it lived on for good (and every later
    start waited on its directories).  The next start thaws what it sweeps."""
    s = make_server("--prestart", "off")
    s.initialize()
    res = s.execute("x = 1", session="new")
    assert res["structuredContent"]["session"]["kernel_frozen"] is True, text(res)
    pids = kernel_pids(s.proc.pid)
    assert pids
    s.proc.kill()
    s.proc.wait()
    s2 = make_server("--prestart", "off", state_dir=s.state_dir)  # (which it cleans up)
    s2.initialize()

    def gone():
        return all(not os.path.exists(f"/proc/{p}") or _zombie(p) for p in pids)
    assert wait_until(gone, 15), "the dead server's frozen kernel lives on"


def _zombie(pid):
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] == "Z"
    except OSError:
        return True

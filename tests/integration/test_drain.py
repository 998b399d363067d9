"""Issue 28, part 4: shutdown leaves nothing, under load too.  SIGTERM's drain must wait for
every teardown (the held sandboxes of the prestarted pool, the refills in progress, session
kernels, and the sandboxes whose teardown follows their answer) before the process exits, and
no prestarted sandbox may be set up once the drain began (it would only be torn down again,
racing the exit).  After the server exits, nothing of it may be left: no mount under its state
directory, no process that descended from it, no cgroup named after its pid, nothing in its
work directory.

Each round starts a server with a prestarted pool, opens a session (a kernel), sends a burst
of calls that grows the pool (--prestart-max), and sends SIGTERM in the middle of the burst,
at a different moment each round, while two CPU busy loops load the machine (a race: the
burst's refills and teardowns against the drain)."""
import os
import signal
import subprocess
import threading
import time

import pytest

from conftest import BACKEND, Server, _processes, cgroup_dirs, instance_id, held_sandboxes, mounts_under, wait_until
from test_http import HttpServer, call_msg

pytestmark = [
    pytest.mark.skipif(BACKEND == "none", reason="only sandboxes with a supervisor can be held"),
    # It loads the machine (two busy loops) on purpose and judges a race: alone.
    pytest.mark.serial,
]

CLK_TCK = os.sysconf("SC_CLK_TCK")
BURST = 10
ARGS = ("--prestart", "2", "--prestart-max", "8", "--drain-seconds", "120",
        # The shutdown's deadline (grace + 3 s) is for a teardown that hangs, not for a loaded
        # machine's slow one: the normal drain must finish on its own.
        "--kill-grace-seconds", "20")


def _stat(pid):
    try:
        with open(f"/proc/{pid}/stat") as f:
            rest = f.read().rsplit(")", 1)[1].split()
        return rest[0], int(rest[1]), int(rest[19])  # state, ppid, start time (ticks since boot)
    except (OSError, IndexError, ValueError):
        return None


def _now_ticks():
    with open("/proc/uptime") as f:
        return float(f.read().split()[0]) * CLK_TCK


class Descendants(threading.Thread):
    """Every process that descends from root while it lives: pid -> (start time, parent,
    command line), so that one still alive after root's exit can be told from a new process
    that reused its pid."""

    def __init__(self, root):
        super().__init__(daemon=True)
        self.root = root
        self.seen = {}
        self.done = threading.Event()

    def run(self):
        while not self.done.is_set():
            self.look()
            time.sleep(0.005)

    def look(self):
        table = _processes()
        for pid in table:
            if pid == self.root or pid in self.seen:
                continue
            q, n = table[pid][1], 0
            while q in table and n < 64:
                if q == self.root:
                    st = _stat(pid)
                    try:
                        with open(f"/proc/{pid}/cmdline", "rb") as f:
                            cmd = f.read()
                    except OSError:
                        cmd = b""
                    if st:
                        self.seen[pid] = (st[2], st[1], cmd)
                    break
                q, n = table[q][1], n + 1

    def stop(self):
        self.done.set()
        self.join(timeout=5)

    def alive(self):
        left = []
        for pid, (start, _, cmd) in self.seen.items():
            st = _stat(pid)
            if st and st[2] == start and st[0] not in ("Z", "X"):
                left.append((pid, cmd[:200]))
        return left

    def held_set_ups_after(self, ticks):
        """Prestarted sandboxes (their launcher, the server's child: --wait-go or the runner's
        --mps-warm) started after ticks."""
        return [pid for pid, (start, ppid, cmd) in self.seen.items()
                if ppid == self.root and start > ticks and (b"--wait-go" in cmd or b"--mps-warm" in cmd)]






@pytest.fixture
def busy_loops():
    procs = [subprocess.Popen(["python3", "-c", "while 1: pass"]) for _ in range(2)]
    yield
    for p in procs:
        p.kill()
        p.wait()


def script(i):
    return f"import time\ntime.sleep({0.03 * i:.2f})\nprint({i})\n"


class StdioRound:
    def __init__(self):
        self.s = Server(*ARGS)
        self.proc = self.s.proc
        self.state_dir = self.s.state_dir

    def start(self):
        self.s.initialize()
        res = self.s.execute("x = 1", session="new", timeout=120)
        assert res["structuredContent"]["session"]["id"], res

    def burst(self):
        for i in range(BURST):
            self.s.send({"jsonrpc": "2.0", "id": 100 + i, "method": "tools/call",
                         "params": {"name": "execute_python", "arguments": {"details": True, "script": script(i)}}})

    def stderr_text(self):
        return self.s.stderr_text()

    def close(self):
        self.s.close()


class HttpRound:
    def __init__(self):
        self.s = HttpServer("--sandbox-backend", BACKEND, *ARGS)
        self.proc = self.s.proc
        self.state_dir = self.s.state_dir
        self.threads = []

    def start(self):
        self.sid = self.s.initialize()
        st, _, body = self.s.post(call_msg(1, "x = 1", session="new"), self.sid)
        assert st == 200 and b'"session"' in body, (st, body)

    def burst(self):
        def post(i):
            try:
                self.s.post(call_msg(100 + i, script(i)), self.sid)
            except Exception:  # noqa: BLE001 (the drain may refuse or cut it)
                pass
        for i in range(BURST):
            t = threading.Thread(target=post, args=(i,), daemon=True)
            t.start()
            self.threads.append(t)

    def stderr_text(self):
        return self.s.stderr_text()

    def close(self):
        for t in self.threads:
            t.join(timeout=10)
        self.s.close()


def one_round(kind, delay):
    r = StdioRound() if kind == "stdio" else HttpRound()
    pid = r.proc.pid
    tracker = Descendants(pid)
    tracker.start()
    try:
        r.start()
        instance_id(pid, r.state_dir)  # remembered for cgroup_dirs(pid) after its exit
        # The pool is up (two held), plus the session's kernel.
        assert wait_until(lambda: len(held_sandboxes()) >= 2, timeout=60), r.stderr_text()[-3000:]
        r.burst()
        time.sleep(delay)
        r.proc.send_signal(signal.SIGTERM)
        # From the moment the server says it drains, no prestarted sandbox may be set up.
        assert wait_until(lambda: "draining (" in r.stderr_text(), timeout=30), r.stderr_text()[-3000:]
        drain_began = _now_ticks()
        assert r.proc.wait(timeout=120) == 0, r.stderr_text()[-3000:]
        tracker.stop()
        where = f"{kind}, SIGTERM {delay}s into the burst"
        log = r.stderr_text()
        assert mounts_under(r.state_dir) == [], (where, mounts_under(r.state_dir))
        assert tracker.alive() == [], (where, tracker.alive())
        assert cgroup_dirs(pid) == [], (where, cgroup_dirs(pid))
        work = os.path.join(r.state_dir, "work")
        assert os.listdir(work) == [], (where, os.listdir(work))
        # (One tick of slack: the clock of start times counts in ticks.)
        late = tracker.held_set_ups_after(drain_began + 1)
        assert late == [], (where, "prestarted sandboxes set up during the drain", late)
        # The drain itself waited for every teardown: nothing was left for the synchronous
        # kill-and-reap past its deadline.
        assert "killing and reaping them now" not in log and "stopping anyway" not in log, \
            (where, log[-3000:])
    finally:
        tracker.stop()
        r.close()


@pytest.mark.parametrize("kind", ["stdio", "http"])
def test_sigterm_during_a_burst_leaves_nothing(kind, busy_loops):
    for delay in (0.0, 0.15, 0.4, 0.8, 1.5):
        one_round(kind, delay)

"""How concurrent calls are scheduled: at most --max-concurrent scripts run at once (the rest
wait in order), and of those at most --max-starting are in their start-up (their first
100 ms) at once, so that a burst of calls does not start everything together."""
import time

from conftest import Server

SCRIPT = "import time\nprint('START', time.time(), flush=True)\ntime.sleep(%s)\nprint('END', time.time())\n"


def run_together(s, n, sleep):
    """Sends n calls at once; returns [(start, end)] in the order of the calls."""
    for i in range(n):
        s.send({"jsonrpc": "2.0", "id": f"c{i}", "method": "tools/call",
                "params": {"name": "execute_python", "arguments": {"script": SCRIPT % sleep}}})
    got = {}
    deadline = time.monotonic() + 60
    while len(got) < n and time.monotonic() < deadline:
        msg = s.recv(timeout=60)
        if isinstance(msg, dict) and str(msg.get("id", "")).startswith("c") and "result" in msg:
            got[msg["id"]] = msg["result"]["structuredContent"]
    assert len(got) == n, got
    out = []
    for i in range(n):
        sc = got[f"c{i}"]
        assert sc["exit_code"] == 0, sc
        words = sc["stdout"].split()
        out.append((float(words[1]), float(words[3])))
    return out


def test_max_concurrent_queues_in_order(make_server):
    s = make_server("--max-concurrent", "1")
    s.initialize()
    (s1, e1), (s2, e2) = run_together(s, 2, 0.4)
    assert s2 >= e1 - 0.01, "the second call ran beside the first"


def test_max_starting_staggers_the_starts_but_runs_overlap(make_server):
    # Every run set up alike (no prestarted sandbox for the first), so that the starts are
    # apart by the windows and not by how long each one's set-up took.
    s = make_server("--max-starting", "1", "--prestart", "off")
    s.initialize()
    runs = sorted(run_together(s, 4, 1.5))
    starts = [a for a, _ in runs]
    # each one waits for the previous one's start-up window (100 ms): 300 ms from the first
    # start to the last, give or take how long each start took...
    assert starts[-1] - starts[0] >= 0.2, starts
    # ...but not for its end: all four sleep at the same time
    assert max(starts) < min(e for _, e in runs), runs


def test_starts_are_not_staggered_below_the_limit(make_server):
    s = make_server("--max-starting", "8")
    s.initialize()
    starts = sorted(a for a, _ in run_together(s, 3, 0.5))
    assert starts[-1] - starts[0] < 0.3, starts


def test_max_starting_is_checked(tmp_path):
    s = Server("--max-starting", "x", state_dir=str(tmp_path / "state"))
    assert s.proc.wait(timeout=10) != 0
    assert "--max-starting" in s.stderr_text()

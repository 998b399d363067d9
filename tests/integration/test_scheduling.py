"""How concurrent calls are scheduled: at most --max-concurrent scripts run at once (the rest
wait in order), and of those at most --max-starting are in their start-up (their first
100 ms) at once, so that a burst of calls does not start everything together.

These tests assert order and overlap from the order of the messages on stdout (each script
prints a marker that the server streams as progress as soon as it is printed), never
durations: the start-up window's length and how far apart starts are go to bench/ (case 9)."""
import time

import pytest

from conftest import Server

# Apart from the parallel pass (test.sh): the start-up windows are judged against the scripts'
# sleeps, and a machine loaded by other tests stretches the start-ups (a start under
# --max-starting 1 can then come after an earlier run ended).
pytestmark = pytest.mark.serial

SCRIPT = "print('START %s', flush=True)\nimport time\ntime.sleep(%s)\nprint('END')\n"


def run_together(s, n, sleep):
    """Sends n calls at once, each with a progress token; returns the stream of events in
    the order they arrived: ("start", i) when call i's marker came as progress, ("done", i)
    when its response came."""
    for i in range(n):
        s.send({"jsonrpc": "2.0", "id": f"c{i}", "method": "tools/call",
                "params": {"name": "execute_python", "arguments": {"details": True, "script": SCRIPT % (i, sleep)},
                           "_meta": {"progressToken": f"p{i}"}}})
    events = []
    done = set()
    deadline = time.monotonic() + 120
    while len(done) < n and time.monotonic() < deadline:
        msg = s.recv(timeout=120)
        if msg.get("method") == "notifications/progress":
            token = msg["params"].get("progressToken", "")
            if f"START {token[1:]}" in msg["params"].get("message", ""):
                events.append(("start", int(token[1:])))
        elif str(msg.get("id", "")).startswith("c") and "result" in msg:
            i = int(msg["id"][1:])
            sc = msg["result"]["structuredContent"]
            assert sc["exit_code"] == 0 and sc["stdout"] == f"START {i}\nEND\n", sc
            events.append(("done", i))
            done.add(i)
    assert len(done) == n, events
    # Every call started exactly once and was answered exactly once.
    assert sorted(i for e, i in events if e == "start") == list(range(n)), events
    return events


def test_max_concurrent_queues_in_order(make_server):
    s = make_server("--max-concurrent", "1")
    s.initialize()
    events = run_together(s, 3, 0.3)
    # One at a time, in the order sent: each starts only after the previous one ended.
    assert events == [("start", 0), ("done", 0), ("start", 1), ("done", 1), ("start", 2), ("done", 2)], events


def test_max_starting_staggers_the_starts_but_runs_overlap(make_server):
    # Every run set up alike (no prestarted sandbox for the first), so that the starts are
    # apart by the windows and not by how long each one's set-up took.
    s = make_server("--max-starting", "1", "--prestart", "off")
    s.initialize()
    events = run_together(s, 4, 1.5)
    # The windows delay the starts, not the runs: all four were running at once (every
    # start came before the first end).
    first_done = next(k for k, e in enumerate(events) if e[0] == "done")
    assert first_done == 4, events


def test_starts_are_not_staggered_below_the_limit(make_server):
    s = make_server("--max-starting", "8")
    s.initialize()
    events = run_together(s, 3, 0.5)
    assert [e for e, _ in events[:3]] == ["start"] * 3, events


def test_max_starting_is_checked(tmp_path):
    s = Server("--max-starting", "x", state_dir=str(tmp_path / "state"))
    assert s.proc.wait(timeout=10) != 0
    assert "--max-starting" in s.stderr_text()

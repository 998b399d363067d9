"""The prestarted sandbox (--prestart, on by default): one bubblewrap sandbox is kept set up
for the next call of the default shape, and a call that matches runs in it.  It must be as
fresh and as isolated as one set up for the call, its clock must start at the call, and
nothing of it may be left behind."""
import os
import shutil
import signal
import sys
import tempfile
import time

import pytest

from conftest import BACKEND, descendants, held_sandboxes, wait_until, work_left

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "fixtures"))
import wheelhouse  # noqa: E402

pytestmark = pytest.mark.skipif(BACKEND == "none", reason="only sandboxes with a supervisor can be held")


def start(make_server, *args):
    # One held per shape (--prestart 1, and --prestart-max 1 so that a call that finds the
    # refill not ready yet does not grow the pool), so the counts below are the shapes'; the
    # pool of N per shape (the default, on), its growth and the held interpreters are
    # test_warm.py's.
    if "--prestart" not in args:
        args = ("--prestart", "1", "--prestart-max", "1") + args
    s = make_server(*args)
    s.initialize()
    return s


def wait_held(s, count=1):
    assert wait_until(lambda: len(held_sandboxes()) >= count, timeout=10), s.stderr_text()[-2000:]


def test_calls_run_in_prestarted_sandboxes(make_server):
    s = start(make_server)
    wait_held(s)
    for _ in range(3):
        sc = s.execute("import os; print(os.getcwd())")["structuredContent"]
        assert sc["prestarted"] == "interpreter" and sc["exit_code"] == 0, sc
        assert sc["stdout"].strip() == "/work"
        wait_held(s)
    text = s.probed_environment()["content"][0]["text"]
    assert "Prestarted sandbox: on" in text


def test_each_prestarted_sandbox_is_fresh(make_server):
    s = start(make_server)
    wait_held(s)
    first = s.execute("""
import os
open('/tmp/left-behind', 'w').write('x')
open('/work/left-behind', 'w').write('x')
print(os.getuid())
""")["structuredContent"]
    wait_held(s)
    second = s.execute("""
import os
print(os.path.exists('/tmp/left-behind'), os.path.exists('/work/left-behind'), sorted(os.listdir('/work')))
print(os.getuid())
""")["structuredContent"]
    assert first["prestarted"] == second["prestarted"] == "interpreter"
    lines = second["stdout"].splitlines()
    assert lines[0] == "False False ['script.py']", second
    if os.getuid() == 0:  # a fresh uid per run
        assert lines[1] != first["stdout"].strip()


def test_a_released_sandbox_runs_the_call_and_cancelling_kills_it(make_server):
    """A released sandbox keeps its --wait-go command line: it must count as the call's
    processes (not as a held sandbox) and die with the call."""
    s = start(make_server)
    wait_held(s)
    held_before = set(held_sandboxes())
    marker = "mps-prestart-cancel-%d" % os.getpid()
    assert s.start_sleeping_call("long", marker)
    running = set(descendants(s.proc.pid))
    assert held_before & running, "the call did not run in the held sandbox"
    assert not held_before & set(held_sandboxes())
    s.notify("notifications/cancelled", {"requestId": "long", "reason": "user"})
    assert wait_until(lambda: descendants(s.proc.pid) == [], timeout=5)
    # ...and reaped.
    assert wait_until(lambda: not running & {int(p) for p in os.listdir("/proc") if p.isdigit()}, timeout=5)


def test_other_shapes_start_their_own(make_server):
    s = start(make_server)
    wait_held(s)
    sc = s.execute("import socket; print('ok')", network=False)["structuredContent"]
    assert sc["prestarted"] == "no" and sc["stdout"] == "ok\n", sc
    # The held one is still there for the next call of the default shape.
    assert s.execute("print(2)")["structuredContent"]["prestarted"] == "interpreter"
    # Another interpreter: its own, and held for the next such call.
    other = "3.11" if os.path.exists("/root/.pyenv/versions/3.11.7") else None
    if other:
        sc = s.execute("import sys; print(sys.version_info[:2])", python_version=other)["structuredContent"]
        assert sc["prestarted"] == "no" and sc["stdout"] == "(3, 11)\n", sc
        assert wait_until(lambda: len({w for w in held_sandboxes().values() if w}) == 2, timeout=10)
        sc = s.execute("import sys; print(sys.version_info[:2])", python_version=other)["structuredContent"]
        assert sc["prestarted"] == "interpreter" and sc["stdout"] == "(3, 11)\n", sc


def test_the_last_other_shape_is_prestarted_too(make_server):
    wheels = tempfile.mkdtemp(prefix="mps-wheels-")
    os.chmod(wheels, 0o755)
    try:
        wheelhouse.build_synthetic(wheels)
        s = start(make_server, "--find-links", wheels, "--offline")
        wait_held(s)
        script = "import mps_beta; print(mps_beta.ALPHA)"
        first = s.execute(script, dependencies=["mps-beta"], timeout=120)["structuredContent"]
        assert first["prestarted"] == "no" and first["stdout"] == "2.0\n", first
        # Now two are held: the commonest shape and this one (with /env mounted).
        assert wait_until(lambda: len({w for w in held_sandboxes().values() if w}) == 2, timeout=10)
        for _ in range(2):
            sc = s.execute(script, dependencies=["mps-beta"])["structuredContent"]
            assert sc["prestarted"] == "interpreter" and sc["stdout"] == "2.0\n", sc
            assert sc["environment"]["cached"] is True
            assert wait_until(lambda: len({w for w in held_sandboxes().values() if w}) == 2, timeout=10)
        # The commonest shape is still served, and a third shape replaces the second.
        assert s.execute("print(1)")["structuredContent"]["prestarted"] == "interpreter"
        assert s.execute("print(1)", network=False)["structuredContent"]["prestarted"] == "no"
        assert s.execute("print(1)", network=False)["structuredContent"]["prestarted"] == "interpreter"
        assert s.execute(script, dependencies=["mps-beta"])["structuredContent"]["prestarted"] == "no"
    finally:
        shutil.rmtree(wheels, ignore_errors=True)


def test_inputs_and_timeout_start_at_the_call(make_server):
    s = start(make_server)
    wait_held(s)
    time.sleep(1.5)  # longer than the call's timeout: the clock must not run while held
    res = s.execute("import time; time.sleep(0.3); print(open('data.txt').read())", timeout_seconds=1,
                    files=[{"path": "data.txt", "content": "hello"}])
    sc = res["structuredContent"]
    # Held for longer than its 1 s timeout, yet not timed out: the clock started at the call
    # (how long the call took is bench/ case 8's).
    assert sc["prestarted"] == "interpreter" and sc["timed_out"] is False and sc["stdout"] == "hello\n", sc
    wait_held(s)
    res = s.execute("import time; time.sleep(30)", timeout_seconds=1)
    assert res["structuredContent"]["timed_out"] is True


def test_a_held_sandbox_that_dies_is_replaced(make_server):
    s = start(make_server)
    wait_held(s)
    killed = list(held_sandboxes())
    for pid in killed:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    assert wait_until(lambda: not set(killed) & set(held_sandboxes()), timeout=5)
    time.sleep(0.2)  # the server notices
    sc = s.execute("print(1)")["structuredContent"]
    assert sc["exit_code"] == 0 and sc["stdout"] == "1\n", sc
    wait_held(s)
    assert s.execute("print(2)")["structuredContent"]["prestarted"] == "interpreter"


def test_nothing_is_left_behind(make_server):
    s = start(make_server)
    wait_held(s)
    for _ in range(3):
        s.execute("pass")
    wait_held(s)
    # One shape was used: one sandbox held, no more, once the last call's sandbox is torn down
    # (after its answer, beside the loop: meanwhile its processes may still look held).
    assert wait_until(lambda: len({w for w in held_sandboxes().values() if w}) == 1, timeout=10), \
        held_sandboxes()
    held_dirs = {w for w in held_sandboxes().values() if w}
    assert len(held_dirs) == 1, held_dirs
    assert wait_until(lambda: work_left(s.state_dir) == [], timeout=5)
    s.proc.stdin.close()
    assert s.proc.wait(timeout=10) == 0
    assert wait_until(lambda: held_sandboxes() == {}, timeout=5)
    assert not any(os.path.exists(d) for d in held_dirs)


def test_prestart_off(make_server):
    s = start(make_server, "--prestart", "off")
    sc = s.execute("pass")["structuredContent"]
    assert sc["prestarted"] == "no"
    time.sleep(0.3)
    assert held_sandboxes() == {}
    assert "Prestarted sandbox: off (--prestart off)" in s.call("check_environment")["content"][0]["text"]

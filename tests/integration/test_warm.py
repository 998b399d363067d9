"""Prestarted interpreters (--prestart, issue 20): the held sandbox's interpreter is already up,
blocked on its FIFO, and a call only sends the go.  What a script sees must be what it would
see in a run started for it (`python -s script.py` through the start-up runner): fresh state,
the same sys.modules, argv, __file__, sys.path[0], tracebacks, limits, stdin; the timeout from
the go; the pool refilled, a killed one replaced, nothing left behind."""
import glob
import json
import os
import re
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
import time

import pytest

from conftest import BACKEND, _cmdline, held_sandboxes, instance_id, cgroup_dirs, wait_until, work_left

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "fixtures"))
import wheelhouse  # noqa: E402

README = os.path.join(os.path.dirname(__file__), "..", "..", "README.md")
PYENV = "/root/.pyenv/versions"
bwrap_only = pytest.mark.skipif(BACKEND == "none", reason="the none backend holds nothing")


def start(make_server, *args, **kwargs):
    s = make_server(*args, **kwargs)
    s.initialize()
    return s


def pool(s):
    return s.call("check_environment")["structuredContent"]["prestart"]


def wait_ready(s, n, interpreters=None):
    want = n if interpreters is None else interpreters
    ok = wait_until(lambda: (lambda p: p["ready"] >= n and p["ready_interpreters"] >= want)(pool(s)),
                    timeout=20, interval=0.1)
    assert ok, (pool(s), s.stderr_text()[-2000:])


def held_interpreters():
    """pid -> work directory of every held interpreter (the python waiting on its FIFO)."""
    return {pid: w for pid, w in held_sandboxes().items() if _cmdline(pid)[4:5] == [b"--mps-warm"]}


def runner_list():
    """What the README says the runner imported before the script (its sys.modules delta)."""
    text = open(README).read()
    m = re.search(r"<!-- runner-modules: (.*?) -->", text)
    assert m, "the README lists the runner's imports in a <!-- runner-modules: ... --> marker"
    return set(m.group(1).split())


# ------------------------------------------------------------------ the pool


@bwrap_only
def test_calls_run_in_prestarted_interpreters(make_server):
    s = start(make_server)
    p = pool(s)
    assert p["on"] is True and p["per_shape"] == 4, p
    wait_ready(s, 4)
    res = s.execute("print('hi')")
    sc = res["structuredContent"]
    assert sc["prestarted"] == "interpreter" and sc["stdout"] == "hi\n", sc
    assert "\n--- prestarted: interpreter ---" in res["content"][0]["text"]
    text = s.call("check_environment")["content"][0]["text"]
    assert "Prestarted sandbox: on (4 per shape" in text, text
    p = pool(s)
    assert p["taken"] >= 1 and p["taken_interpreter"] >= 1, p
    assert p["shapes"][0]["holds"] == "interpreter" and p["shapes"][0]["target"] == 4, p


@bwrap_only
def test_a_burst_takes_the_whole_pool(make_server):
    s = start(make_server)
    wait_ready(s, 4)
    for i in range(4):
        s.send({"jsonrpc": "2.0", "id": f"b{i}", "method": "tools/call",
                "params": {"name": "execute_python", "arguments": {"details": True, "script": f"print({i})"}}})
    answers = {}
    deadline = time.monotonic() + 120
    while len(answers) < 4 and time.monotonic() < deadline:
        msg = s.recv(timeout=max(0.1, deadline - time.monotonic()))
        if isinstance(msg, dict) and str(msg.get("id", "")).startswith("b"):
            assert msg["id"] not in answers, msg  # each answered exactly once
            answers[msg["id"]] = msg["result"]["structuredContent"]
    got = [answers[f"b{i}"] for i in range(4)]
    assert [g["stdout"] for g in got] == [f"{i}\n" for i in range(4)], got
    assert all(g["prestarted"] == "interpreter" for g in got), got
    # ...and refilled beside the calls.
    wait_ready(s, 4)


def burst(s, n, script, prefix="g", **args):
    """n calls at once; their structuredContent in order, each answered exactly once."""
    for i in range(n):
        s.send({"jsonrpc": "2.0", "id": f"{prefix}{i}", "method": "tools/call",
                "params": {"name": "execute_python", "arguments": {"details": True, "script": script, **args}}})
    answers = {}
    deadline = time.monotonic() + 120
    while len(answers) < n and time.monotonic() < deadline:
        msg = s.recv(timeout=max(0.1, deadline - time.monotonic()))
        if isinstance(msg, dict) and str(msg.get("id", "")).startswith(prefix):
            assert msg["id"] not in answers, msg
            answers[msg["id"]] = msg["result"]["structuredContent"]
    assert len(answers) == n, answers
    return [answers[f"{prefix}{i}"] for i in range(n)]


@bwrap_only
def test_the_pool_grows_with_a_burst_and_shrinks_back(make_server):
    # --prestart 2 --prestart-max 6: a burst of 8 finds 2 ready, and the 6 that found none
    # grow the shape's pool to 6 (its cap); without a miss it halves back to 3, then 2.
    s = start(make_server, "--prestart", "2", "--prestart-max", "6",
              env={"MPS_PRESTART_SHRINK_MS": "2500"})
    wait_ready(s, 2)
    p = pool(s)
    assert p["max_per_shape"] == 6 and p["shapes"][0]["target"] == 2, p
    got = burst(s, 8, "import time; time.sleep(0.3)")
    assert sum(g["prestarted"] == "interpreter" for g in got) >= 2, got
    assert all(g["exit_code"] == 0 for g in got), got
    assert pool(s)["shapes"][0]["target"] == 6, pool(s)
    wait_ready(s, 6)
    # The next burst of the same size finds them all ready.
    got = burst(s, 6, "pass", prefix="h")
    assert all(g["prestarted"] == "interpreter" for g in got), got
    wait_ready(s, 6)
    assert wait_until(lambda: pool(s)["shapes"][0]["target"] == 3, timeout=20, interval=0.2), pool(s)
    assert wait_until(lambda: pool(s)["ready"] == 3, timeout=10, interval=0.1), pool(s)
    assert wait_until(lambda: pool(s)["shapes"][0]["target"] == 2, timeout=20, interval=0.2), pool(s)
    assert wait_until(lambda: pool(s)["ready"] == 2, timeout=10, interval=0.1), pool(s)
    assert wait_until(lambda: len(held_interpreters()) == 2, timeout=10, interval=0.1), held_interpreters()


@bwrap_only
def test_no_growth_at_the_cap(make_server):
    s = start(make_server, "--prestart", "2", "--prestart-max", "2")
    wait_ready(s, 2)
    burst(s, 5, "import time; time.sleep(0.2)")
    p = pool(s)
    assert p["max_per_shape"] == 2 and p["shapes"][0]["target"] == 2, p


@bwrap_only
def test_refills_wait_while_calls_wait(make_server):
    # One call at a time: the first takes a held interpreter, three wait for the slot.  The
    # refill would take CPU from them for a later call's sake: it waits until none waits.
    s = start(make_server, "--prestart", "2", "--prestart-max", "2", "--max-concurrent", "1")
    wait_ready(s, 2)
    # In one write, so that the server reads the four together: sent one by one, a refill
    # the first one's take scheduled could run before the others were read (nothing waited yet).
    s.send_raw(b"".join(json.dumps({
        "jsonrpc": "2.0", "id": f"q{i}", "method": "tools/call",
        "params": {"name": "execute_python", "arguments": {"details": True, "script": "import time; time.sleep(1.5)"}}}).encode() + b"\n"
        for i in range(4)))
    assert wait_until(lambda: pool(s)["taken"] == 1, timeout=20, interval=0.05), pool(s)
    for _ in range(5):  # ...and no refill while the other three wait
        p = pool(s)
        assert p["taken"] == 1 and p["ready"] == 1, p
        time.sleep(0.1)
    answers = set()
    deadline = time.monotonic() + 60
    while len(answers) < 4 and time.monotonic() < deadline:
        msg = s.recv(timeout=max(0.1, deadline - time.monotonic()))
        if isinstance(msg, dict) and str(msg.get("id", "")).startswith("q"):
            assert msg["result"]["structuredContent"]["exit_code"] == 0, msg
            answers.add(msg["id"])
    assert len(answers) == 4
    wait_ready(s, 2)  # and refilled once nothing waits


@bwrap_only
def test_the_pool_grows_only_within_the_servers_descriptors(make_server):
    # Each held sandbox keeps several of the server's descriptors (pipes, pidfd, channels, FIFO,
    # egress).  With RLIMIT_NOFILE 160, a pool grown to --prestart-max (128) by a burst would
    # take them all: the refills fail with EMFILE (and the shape is given up), and calls that
    # need descriptors of their own (another shape's, cold) are refused.  The growth stops
    # within the budget instead, and check_environment says how far it may go.
    def low_fds():
        resource.setrlimit(resource.RLIMIT_NOFILE, (160, 160))

    s = start(make_server, "--prestart", "2", "--max-concurrent", "8", preexec_fn=low_fds)
    wait_ready(s, 2)
    got = burst(s, 40, "pass")
    assert all(g["exit_code"] == 0 for g in got), got
    p = pool(s)
    assert p["max_per_shape"] < 128, p  # the truth: this server cannot hold 128 per shape
    assert p["shapes"][0]["target"] <= p["max_per_shape"], p
    time.sleep(3)  # the refills beside nothing
    got = burst(s, 8, "print('cold')", prefix="o", python_version="3.12")  # another shape: cold, its own descriptors
    assert all(g["stdout"] == "cold\n" for g in got), got
    p = pool(s)
    assert p["shapes"][0]["holds"] == "interpreter", p
    assert "Too many open files" not in s.stderr_text(), s.stderr_text()[-2000:]


def test_a_bad_prestart_max_is_refused():
    from conftest import BINARY
    r = subprocess.run([BINARY, "--prestart-max", "5000"], capture_output=True, text=True,
                       stdin=subprocess.DEVNULL, timeout=30)
    assert r.returncode != 0 and "prestart_max must be <= 1024" in r.stderr, r


def test_prestart_takes_a_number(make_server):
    s = start(make_server, "--prestart", "2")
    p = pool(s)
    if BACKEND == "none":
        assert p["on"] is False and p["ready"] == 0, p
        assert s.execute("pass")["structuredContent"]["prestarted"] == "no"
        return
    assert p["per_shape"] == 2, p
    wait_ready(s, 2)
    time.sleep(0.3)
    assert pool(s)["ready"] == 2


def test_a_bad_prestart_value_is_refused():
    from conftest import BINARY
    r = subprocess.run([BINARY, "--prestart", "lots", "--help"], capture_output=True, text=True)
    assert r.returncode != 0 and "--prestart" in r.stderr, r


def test_backend_none_holds_nothing(make_server):
    if BACKEND != "none":
        pytest.skip("the none backend's behaviour")
    s = start(make_server)
    res = s.execute("print(1)")
    assert res["structuredContent"]["prestarted"] == "no"
    assert "\n--- prestarted: no ---" in res["content"][0]["text"]
    assert "Prestarted sandbox: off" in s.call("check_environment")["content"][0]["text"]


# ------------------------------------------------------------------ as fresh as a new run


@bwrap_only
def test_every_call_is_fresh(make_server):
    s = start(make_server)
    wait_ready(s, 4)
    dirty = """
import builtins, os, sys, json
builtins.len = lambda x: 42
json.MARK = 1
os.environ['MPS_WARM_MARK'] = '1'
sys.path.append('/nonexistent-mark')
sys.modules['mps_warm_mark'] = sys
open('/tmp/mark', 'w').write('x')
open('mark.txt', 'w').write('x')
MARK = 1
print(os.getuid())
"""
    check = """
import builtins, os, sys
print(len('ab'), 'MARK' in globals(), 'MPS_WARM_MARK' in os.environ,
      '/nonexistent-mark' in sys.path, 'mps_warm_mark' in sys.modules, 'json' in sys.modules,
      os.path.exists('/tmp/mark'), sorted(os.listdir('.')))
print(os.getuid())
"""
    uids = set()
    for _ in range(3):
        first = s.execute(dirty)["structuredContent"]
        second = s.execute(check)["structuredContent"]
        assert first["prestarted"] == second["prestarted"] == "interpreter", (first, second)
        lines = second["stdout"].splitlines()
        assert lines[0] == "2 False False False False False False ['script.py']", second
        uids |= {first["stdout"].strip(), lines[1]}
    if os.getuid() == 0:  # a uid of its own per run
        assert len(uids) == 6, uids


def _bare_modules(exe, script_dir, env_root=None):
    env = {"PATH": "/usr/local/bin:/usr/bin:/bin", "LANG": "C.UTF-8", "LC_ALL": "C.UTF-8",
           "PYTHONUNBUFFERED": "1", "PYTHONDONTWRITEBYTECODE": "1", "PYTHONIOENCODING": "utf-8",
           "MPLBACKEND": "Agg"}
    r = subprocess.run([exe, "-s", "script.py"], cwd=script_dir, env=env, capture_output=True,
                       text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    return set(r.stdout.split())


def _versions():
    return [v for v in ("3.8", "3.9", "3.10", "3.11", "3.12", "3.13")
            if glob.glob(f"{PYENV}/{v}.*/bin/python{v}")]


@bwrap_only
def test_sys_modules_is_what_python_script_py_has(make_server):
    """For every interpreter that can be held: the script finds exactly the modules a bare
    `python -s script.py` has, plus what the README lists (nothing)."""
    listed = runner_list()
    s = start(make_server, "--prestart", "1")
    script = "import sys\nprint(' '.join(sorted(sys.modules)))\nprint(sys.modules['__main__'].__file__)\n"
    d = tempfile.mkdtemp(prefix="mps-warm-mods-")
    try:
        with open(os.path.join(d, "script.py"), "w") as f:
            f.write(script.replace("print(sys.modules['__main__'].__file__)\n", ""))
        for v in _versions():
            sc = None
            for _ in range(3):  # the first call of a shape sets it up
                sc = s.execute(script, python_version=v)["structuredContent"]
                if sc["prestarted"] == "interpreter":
                    break
                time.sleep(0.5)
            assert sc["prestarted"] == "interpreter", (v, sc)
            out = sc["stdout"].splitlines()
            got = set(out[0].split())
            bare = _bare_modules(sc["python"]["path"], d)
            assert got - bare <= listed, (v, sorted(got - bare))
            assert not bare - got, (v, sorted(bare - got))
            # As `python script.py` sets it: absolute from 3.9 on.
            assert out[1] == ("script.py" if v == "3.8" else "/work/script.py"), (v, out)
    finally:
        shutil.rmtree(d, ignore_errors=True)


@bwrap_only
def test_argv_file_path_and_tracebacks(make_server):
    s = start(make_server)
    wait_ready(s, 2)
    res = s.execute("""import os, sys
print(sys.argv, __file__, sys.path[0], __name__, os.getcwd())
print(sys.modules['__main__'].__dict__ is globals(), __spec__, __package__)
def inner():
    raise ValueError("boom")

inner()
""")
    sc = res["structuredContent"]
    assert sc["prestarted"] == "interpreter", sc
    lines = sc["stdout"].splitlines()
    assert lines[0] == "['script.py'] /work/script.py /work __main__ /work", sc
    assert lines[1] == "True None None", sc
    assert sc["exit_code"] == 1
    err = sc["stderr"]
    assert err.startswith("Traceback (most recent call last):\n"), err
    assert 'File "/work/script.py", line 7, in <module>' in err, err
    assert 'File "/work/script.py", line 5, in inner' in err, err
    assert "runner" not in err and "mps-warm" not in err, err
    assert err.rstrip().endswith("ValueError: boom"), err
    res = s.execute("x = (\nprint(1)\n")["structuredContent"]
    assert res["prestarted"] == "interpreter" and res["exit_code"] == 1
    assert 'File "/work/script.py", line 1' in res["stderr"] and "SyntaxError" in res["stderr"], res
    assert "runner" not in res["stderr"], res
    res = s.execute("import sys; sys.exit(7)")["structuredContent"]
    assert res["exit_code"] == 7 and res["stderr"] == "", res


@bwrap_only
def test_same_answers_as_a_sandbox_started_for_the_call(make_server):
    """The same probing script in a held interpreter and with --prestart off: the same
    answers (stdin, flags, limits, environment, cwd, umask)."""
    probe = """import os, resource, stat, sys
st = os.fstat(0)
print(stat.S_ISCHR(st.st_mode), os.major(st.st_rdev), os.minor(st.st_rdev), repr(sys.stdin.read()))
print(sys.flags)
print([resource.getrlimit(r) for r in (resource.RLIMIT_AS, resource.RLIMIT_NOFILE, resource.RLIMIT_NPROC, resource.RLIMIT_FSIZE, resource.RLIMIT_CPU)])
print(sorted(k for k in os.environ))
print(os.getcwd(), oct(os.umask(0o22)), sys.stdout.line_buffering, sys.stdout.encoding)
print(open('/proc/self/status').read().split('Seccomp:')[1].split()[0])
"""
    flags = ("--memory-limit", "700M", "--max-open-files", "99", "--cpu-limit", "50")
    warm = start(make_server, "--prestart", "1", *flags)
    wait_ready(warm, 1)
    a = warm.execute(probe)["structuredContent"]
    cold = start(make_server, "--prestart", "off", *flags)
    b = cold.execute(probe)["structuredContent"]
    assert a["prestarted"] == "interpreter" and b["prestarted"] == "no", (a, b)
    assert a["exit_code"] == b["exit_code"] == 0, (a, b)
    assert a["stdout"] == b["stdout"], (a["stdout"], b["stdout"])
    assert a["stdout"].startswith("True 1 3 ''\n"), a  # stdin is /dev/null, as always


@bwrap_only
def test_limits_are_in_force_from_the_first_instruction(make_server):
    s = start(make_server, "--prestart", "1", "--memory-limit", "300M", "--max-processes", "40")
    wait_ready(s, 1)
    res = s.execute("x = bytearray(400 * 1024 * 1024)")["structuredContent"]
    assert res["prestarted"] == "interpreter", res
    assert res["exit_code"] != 0 and "MemoryError" in res["stderr"], res
    wait_ready(s, 1)
    # The held interpreter, before any call: already under the run's rlimits and in its cgroup.
    assert wait_until(lambda: held_interpreters(), timeout=15)
    pid = next(iter(held_interpreters()))
    with open(f"/proc/{pid}/limits") as f:
        limits = f.read()
    assert re.search(r"Max address space\s+314572800\s+314572800", limits), limits
    if s.call("check_environment")["structuredContent"]["cgroups"]["active"]:
        with open(f"/proc/{pid}/cgroup") as f:
            assert "/run-" in f.read()


@bwrap_only
def test_the_timeout_counts_from_the_go(make_server):
    s = start(make_server, "--prestart", "1")
    wait_ready(s, 1)
    time.sleep(3.5)  # longer than the call's timeout: held time does not count
    sc = s.execute("import time; time.sleep(0.3); print(open('in.txt').read())", timeout_seconds=3,
                   files=[{"path": "in.txt", "content": "data"}])["structuredContent"]
    assert sc["prestarted"] == "interpreter" and sc["timed_out"] is False, sc
    assert sc["stdout"] == "data\n", sc
    wait_ready(s, 1)
    sc = s.execute("import time; time.sleep(30)", timeout_seconds=3)["structuredContent"]
    assert sc["prestarted"] == "interpreter" and sc["timed_out"] is True, sc


@bwrap_only
def test_input_files_are_importable(make_server):
    """The files argument lands before the go: a module among them imports (the import
    system saw nothing of the work directory before)."""
    s = start(make_server)
    wait_ready(s, 1)
    sc = s.execute("import helper; print(helper.VALUE)",
                   files=[{"path": "helper.py", "content": "VALUE = 41 + 1\n"}])["structuredContent"]
    assert sc["prestarted"] == "interpreter" and sc["stdout"] == "42\n", sc


# ------------------------------------------------------------------ interpreters


@bwrap_only
def test_which_interpreters_are_held(make_server):
    """CPython 3.8 and later: the interpreter; older (3.6, 3.7): the sandbox only."""
    s = start(make_server, "--prestart", "1")
    s.execute("pass")
    versions = _versions() + [v for v in ("3.6", "3.7") if glob.glob(f"{PYENV}/{v}.*/bin/python{v}")]
    for v in versions:
        s.execute("pass", python_version=v)  # the shape becomes the last other one
        want = "sandbox" if v in ("3.6", "3.7") else "interpreter"
        got = None
        for _ in range(20):
            sc = s.execute("import sys; print('%d.%d' % sys.version_info[:2])",
                           python_version=v)["structuredContent"]
            got = sc["prestarted"]
            if got != "no":
                break
            time.sleep(0.2)
        assert got == want and sc["stdout"] == v + "\n", (v, sc)


@bwrap_only
def test_a_dependency_environment(make_server):
    wheels = tempfile.mkdtemp(prefix="mps-wheels-")
    os.chmod(wheels, 0o755)
    try:
        wheelhouse.build_synthetic(wheels)
        s = start(make_server, "--find-links", wheels, "--offline", "--prestart", "2")
        script = "import sys, mps_beta; print(mps_beta.ALPHA, 'mps_beta' in sys.modules)"
        first = s.execute("import sys; print('mps_beta' in sys.modules)", dependencies=["mps-beta"],
                          timeout=120)["structuredContent"]
        assert first["prestarted"] == "no" and first["stdout"] == "False\n", first
        wait_ready(s, 3)  # the commonest shape's two, and one of this (until one is taken)
        for _ in range(3):
            sc = s.execute(script, dependencies=["mps-beta"])["structuredContent"]
            assert sc["prestarted"] == "interpreter" and sc["stdout"] == "2.0 True\n", sc
            assert sc["environment"]["cached"] is True
        # The environment's package is on the path but never imported before the script.
        sc = s.execute("import sys; print('mps_beta' in sys.modules)",
                       dependencies=["mps-beta"])["structuredContent"]
        assert sc["prestarted"] == "interpreter" and sc["stdout"] == "False\n", sc
    finally:
        shutil.rmtree(wheels, ignore_errors=True)


# ------------------------------------------------------------------ deaths and the end


@bwrap_only
def test_a_held_interpreter_killed_from_outside_is_replaced(make_server):
    s = start(make_server)
    wait_ready(s, 4)
    assert wait_until(lambda: len(held_interpreters()) == 4, timeout=15), held_interpreters()
    before = held_interpreters()
    victim = next(iter(before))
    os.kill(victim, signal.SIGKILL)
    assert wait_until(lambda: victim not in held_sandboxes(), timeout=5)
    # Noticed (its sandbox ends with it) and replaced.
    assert wait_until(lambda: len(held_interpreters()) == 4 and victim not in held_interpreters(),
                      timeout=15), held_interpreters()
    assert pool(s)["failed"] >= 1
    for _ in range(5):
        sc = s.execute("print(1)")["structuredContent"]
        assert sc["exit_code"] == 0 and sc["stdout"] == "1\n", sc
    assert s.execute("print(2)")["structuredContent"]["prestarted"] == "interpreter"


@bwrap_only
def test_shutdown_leaves_nothing(make_server):
    s = start(make_server)
    wait_ready(s, 4)
    for _ in range(3):
        s.execute("pass")
    s.execute("pass", network=False)  # a second shape: one held for it...
    wait_ready(s, 5)
    assert pool(s)["shapes"][1]["target"] == 1
    assert s.execute("pass", network=False)["structuredContent"]["prestarted"] == "interpreter"
    wait_ready(s, 8)  # ...and four once a call took it
    held = held_sandboxes()
    dirs = {w for w in held.values() if w}
    assert len(dirs) == 8, dirs
    assert all(os.path.exists(d + ".ctl/go") for d in dirs), dirs
    assert wait_until(lambda: work_left(s.state_dir) == [], timeout=5), work_left(s.state_dir)
    instance_id(s.proc.pid)  # remembered: its record goes with it
    s.proc.stdin.close()
    assert s.proc.wait(timeout=15) == 0
    assert wait_until(lambda: held_sandboxes() == {}, timeout=5)
    def alive():
        left = set()
        for pid in held:
            try:
                with open(f"/proc/{pid}/stat") as f:
                    if f.read().rsplit(")", 1)[1].split()[0] not in ("Z", "X"):
                        left.add(pid)
            except OSError:
                pass
        return left
    # (Killed with the server's end: its held runs' trees, the interpreters in them too.)
    assert wait_until(lambda: not alive(), timeout=10), {p: _cmdline(p) for p in alive()}
    assert not any(os.path.exists(d) or os.path.exists(d + ".ctl") for d in dirs)
    with open("/proc/self/mountinfo") as f:
        mounts = f.read()
    assert not any(d in mounts for d in dirs)
    assert not cgroup_dirs(s.proc.pid)
    work = os.path.join(s.state_dir, "work")
    assert not [e for e in os.listdir(work) if e.startswith("srv-")], os.listdir(work)


@bwrap_only
def test_interpreters_that_keep_dying_fall_back_to_held_sandboxes(make_server, tmp_path):
    """A runner whose wait fails (here: one that exits at once when prestarted) makes the
    held interpreters of that shape end before use: after a few in a row the server holds
    only the sandbox (prestarted: sandbox), and calls still run."""
    d = tmp_path / "runner"
    d.mkdir()
    os.chmod(tmp_path, 0o755)
    os.chmod(d, 0o755)
    runner = d / "runner.py"
    runner.write_text("import sys\n"
                      "if sys.argv[1] == '--mps-warm':\n"
                      "    sys.exit(3)\n"
                      "sys.argv = sys.argv[1:]\n"
                      "exec(compile(open(sys.argv[0]).read(), sys.argv[0], 'exec'))\n")
    os.chmod(runner, 0o644)
    s = start(make_server, "--prestart", "1", env={"MPS_RUNNER": str(runner)})
    assert wait_until(lambda: pool(s)["shapes"] and pool(s)["shapes"][0]["holds"] == "sandbox",
                      timeout=30, interval=0.2), pool(s)
    wait_ready(s, 1, interpreters=0)
    sc = s.execute("print('ran')")["structuredContent"]
    assert sc["prestarted"] == "sandbox" and sc["stdout"] == "ran\n", sc
    assert pool(s)["failed"] >= 3

"""Cgroups for runs: one budget for a whole process tree (memory, processes, CPU bandwidth),
peak memory measured, and everything left in it killed at the end, on whichever backend the
suite runs (bwrap or none).

Each test proves something rlimits alone cannot do: four children that each stay under the
address-space limit but together exceed the memory limit; forks beyond --max-processes
as root (RLIMIT_NPROC does not bind root, so the none backend had no process limit); a
daemon that left the process group (setsid) on the none backend; CPU bandwidth.

Where the host has no usable cgroup these tests skip, unless MPS_TEST_REQUIRE_CGROUPS=1
(set by test.sh when it runs as root), which turns the skip into a failure."""
import glob
import os
import threading
import time

import pytest

from conftest import BACKEND, Server, instance_id, cgroup_dirs, started_instances, daemon_script, held_sandboxes, processes_with_marker, wait_until


def cgroups_line(s):
    text = s.call("check_environment")["content"][0]["text"]
    return next(line for line in text.splitlines() if line.startswith("Cgroups: "))


@pytest.fixture(scope="module")
def cg_available():
    s = Server()
    s.initialize()
    line = cgroups_line(s)
    s.close()
    if "not used" in line:
        if os.environ.get("MPS_TEST_REQUIRE_CGROUPS") == "1":
            pytest.fail("cgroups are required here but the server says: " + line)
        pytest.skip(line)
    return line


def start(make_server, *args, **kwargs):
    s = make_server(*args, **kwargs)
    s.initialize()
    instance_id(s.proc.pid)  # run_dirs() knows its cgroups by it
    return s


def run_dirs():
    """Run cgroups that exist now, in any hierarchy, but the prestarted sandbox's."""
    held = set()
    for pid in held_sandboxes():
        try:
            with open(f"/proc/{pid}/cgroup") as f:
                held.update(line.rstrip("\n").split(":", 2)[2] for line in f)
        except OSError:
            pass
    return [d for d in glob.glob("/sys/fs/cgroup/**/mps-*/run-*", recursive=True)
            if os.path.isdir(d) and not any(d.endswith(h) for h in held if h != "/")
            and _server_of(d) in started_instances()]


def _server_of(run_dir):
    """The instance id in the mps-<id> directory above a run directory (other sessions'
    servers have theirs too)."""
    return os.path.basename(os.path.dirname(run_dir))[4:]


def test_check_environment_says_which_cgroups(cg_available, make_server):
    s = start(make_server, "--cpus", "0.5", "--max-processes", "33")
    line = cgroups_line(s)
    assert "cgroup v" in line and "memory" in line and "pids" in line, line
    assert "processes 33 (pids.max)" in line and "CPU bandwidth 0.500 CPUs (cpu.max)" in line, line
    sc = s.call("check_environment")["structuredContent"]
    assert sc["cgroups"]["active"] is True


# Four children of 60 MiB each: each far below an address-space limit of 160 MiB, together
# over a memory limit of 160 MiB for the whole tree.
FORKS_FOUR_60M = """
import os, sys, time
kids = []
for i in range(4):
    pid = os.fork()
    if pid == 0:
        b = bytearray(60 << 20)
        for j in range(0, len(b), 4096):
            b[j] = 1
        time.sleep(1)
        os._exit(0)
    kids.append(pid)
bad = sum(1 for pid in kids if os.waitpid(pid, 0)[1] != 0)
print('children killed:', bad)
sys.exit(1 if bad else 0)
"""


def test_memory_limit_covers_the_whole_tree(cg_available, make_server):
    # Each child stays far below the 160 MiB address-space limit; four of them do not fit
    # in 160 MiB together.
    s = start(make_server, "--memory-limit", "160M")
    res = s.execute(FORKS_FOUR_60M, timeout_seconds=60)
    sc = res["structuredContent"]
    text = res["content"][0]["text"]
    assert sc["limit"] == "memory", text
    assert "limit: out of memory (the 160 MiB memory limit of the whole process tree)" in text
    assert sc["memory_peak_bytes"] is not None and sc["memory_peak_bytes"] <= (160 << 20) + (1 << 20), sc
    assert s.request("ping")["result"] == {}


def test_peak_memory_is_measured(cg_available, make_server):
    s = start(make_server)
    sc = s.execute("b = bytearray(40 << 20)\nfor j in range(0, len(b), 4096): b[j] = 1")["structuredContent"]
    assert sc["exit_code"] == 0 and sc["limit"] is None, sc
    assert sc["memory_peak_bytes"] >= 40 << 20, sc


def test_process_limit_binds_even_root(cg_available, make_server):
    # As root, RLIMIT_NPROC binds nobody: on the none backend only pids.max stops this.
    s = start(make_server, "--max-processes", "20")
    res = s.execute("""
import os, time
ok = refused = 0
kids = []
for i in range(50):
    try:
        pid = os.fork()
    except OSError:
        refused += 1
        continue
    if pid == 0:
        time.sleep(0.5)
        os._exit(0)
    kids.append(pid)
for k in kids:
    os.waitpid(k, 0)
print('forked', len(kids), 'refused', refused)
""")
    sc = res["structuredContent"]
    forked = int(sc["stdout"].split()[1])
    assert forked < 20, sc["stdout"]
    assert sc["limit"] == "processes", sc
    assert "limit: process limit reached (20 processes" in res["content"][0]["text"]


def test_daemon_that_left_the_process_group_is_killed(cg_available, make_server):
    s = start(make_server)
    marker = "mps-cg-daemon-%d" % os.getpid()
    s.execute(daemon_script(marker))
    assert wait_until(lambda: processes_with_marker(marker) == [], timeout=5)


def test_cpu_bandwidth(cg_available, make_server):
    s = start(make_server, "--cpus", "0.25")
    sc = s.execute("""
import time
t = time.monotonic()
while time.monotonic() - t < 2.0:
    pass
print(round(time.process_time(), 2))
""")["structuredContent"]
    # A quarter of a CPU for two seconds: about 0.5 s of CPU (1.0 leaves room for noise;
    # uncapped it is about 2.0 on an idle machine).
    assert float(sc["stdout"]) < 1.0, sc


def test_run_cgroups_are_removed(cg_available, make_server):
    s = start(make_server)
    for _ in range(3):
        assert s.execute("print(1)")["structuredContent"]["exit_code"] == 0
    assert wait_until(lambda: run_dirs() == [], timeout=5), run_dirs()
    s.close()
    assert cgroup_dirs(s.proc.pid) == []


def test_cgroup_off(make_server):
    s = start(make_server, "--cgroup", "off")
    assert cgroups_line(s) == "Cgroups: not used: turned off (--cgroup off)"
    sc = s.execute("print(1)")["structuredContent"]
    assert sc["memory_peak_bytes"] is None


def test_explicit_cgroup_must_be_cgroup2(tmp_path):
    s = Server("--cgroup", str(tmp_path))
    rc = s.proc.wait(timeout=15)
    err = s.stderr_text()
    s.close()
    assert rc != 0
    assert "not a directory of a cgroup v2 file system" in err, err


def cgroup2_mount():
    with open("/proc/self/mountinfo") as f:
        for line in f:
            left, _, right = line.partition(" - ")
            if right.split()[:1] == ["cgroup2"]:
                return left.split()[4]
    return None


@pytest.fixture
def v2_dir():
    """A cgroup v2 directory of the test's own (this machine's cgroup2 mount has no
    controllers, so it proves the v2 mechanics: clone3 into the cgroup, cgroup.kill,
    cpu.stat, the clean-up)."""
    mount = cgroup2_mount()
    if not mount or os.getuid() != 0:
        if os.environ.get("MPS_TEST_REQUIRE_CGROUPS") == "1":
            pytest.fail("no cgroup2 mount to test with")
        pytest.skip("no cgroup2 mount, or not root")
    d = os.path.join(mount, "mps-itest-%d" % os.getpid())
    os.mkdir(d)
    yield d
    for root, dirs, _ in os.walk(d, topdown=False):
        for sub in dirs:
            os.rmdir(os.path.join(root, sub))
    os.rmdir(d)


def test_explicit_cgroup2_directory(v2_dir, make_server):
    s = start(make_server, "--cgroup", v2_dir)
    line = cgroups_line(s)
    assert "cgroup v2" in line and v2_dir in line, line
    marker = "mps-cg2-daemon-%d" % os.getpid()
    sc = s.execute(daemon_script(marker, prelude="print(open('/proc/self/cgroup').read())"))["structuredContent"]
    assert sc["exit_code"] == 0, sc
    if BACKEND == "none":  # in bwrap the cgroup namespace shows "/"
        own = next(line for line in sc["stdout"].splitlines() if line.startswith("0::"))
        assert own.startswith("0::/" + os.path.basename(v2_dir) + "/mps-") and "/run-" in own, own
    # cgroup.kill ended the daemon that left the process group.
    assert wait_until(lambda: processes_with_marker(marker) == [], timeout=5)
    s.close()
    assert not any(e.startswith("mps-") for e in os.listdir(v2_dir))



def test_a_sessions_memory_limit_covers_its_kernels_tree(cg_available, make_server):
    """Issue 19: the session's kernel and what it forks share one cgroup: children far below
    the address-space limit do not fit together, the OOM kill is reported as the memory
    limit, and the session (its state, or a fresh kernel on its files) goes on."""
    s = start(make_server, "--memory-limit", "160M", "--prestart", "off")
    res = s.execute("keep = 'me'", session="new")
    sid = res["structuredContent"]["session"]["id"]
    res = s.execute(FORKS_FOUR_60M, session=sid, timeout_seconds=60)
    sc = res["structuredContent"]
    text = res["content"][0]["text"]
    assert sc["limit"] == "memory", text
    assert "memory limit of the whole process tree" in text, text
    res = s.execute("print('alive')", session=sid)
    assert res["structuredContent"]["stdout"] == "alive\n", res["content"][0]["text"]


def test_a_sessions_cgroup_goes_with_it(cg_available, make_server):
    s = start(make_server, "--prestart", "off")
    res = s.execute("print(1)", session="new")
    sid = res["structuredContent"]["session"]["id"]
    assert run_dirs() != [], "the kernel's cgroup should exist while the session lives"
    s.call("close_session", {"session": sid})
    assert wait_until(lambda: run_dirs() == [], timeout=10), run_dirs()
    # and a kernel killed with its session's server leaves none either
    s.execute("print(2)", session="new")
    s.close()
    assert cgroup_dirs(s.proc.pid) == []


def test_a_session_kernel_killed_by_the_oom_killer_is_reported(cg_available, make_server):
    """Issue 19: the kernel itself OOM-killed (it makes itself the victim the cgroup's OOM
    killer picks, then a child fills the tree's memory): the call says so and what was lost,
    and the next call gets a fresh kernel on the same workspace."""
    s = start(make_server, "--memory-limit", "160M", "--prestart", "off")
    res = s.execute("open('kept.txt', 'w').write('file')\nstate = 1", session="new")
    sid = res["structuredContent"]["session"]["id"]
    res = s.execute("""
import os, time
with open('/proc/self/oom_score_adj', 'w') as f:
    f.write('1000')
held = bytearray(40 << 20)
for j in range(0, len(held), 4096):
    held[j] = 1
# Three children of 45 MiB, each (with the address space it shares) within the
# address-space limit, together with the kernel over the tree's 160 MiB.
kids = []
for i in range(3):
    pid = os.fork()
    if pid == 0:
        try:
            with open('/proc/self/oom_score_adj', 'w') as f:
                f.write('0')
            b = bytearray(45 << 20)
            for j in range(0, len(b), 4096):
                b[j] = 1
            time.sleep(5)
        finally:
            os._exit(0)
    kids.append(pid)
for pid in kids:
    os.waitpid(pid, 0)
time.sleep(5)
""", session=sid, timeout_seconds=60)
    sc = res["structuredContent"]
    text = res["content"][0]["text"]
    assert sc["call_status"] == "kernel_died" and sc["limit"] == "memory", text
    assert "out-of-memory" in sc["session"]["note"] and "lost" in sc["session"]["note"], text
    res = s.execute("print(open('kept.txt').read(), 'state' in globals())", session=sid)
    assert res["structuredContent"]["stdout"] == "file False\n", res["content"][0]["text"]


PID_NAMESPACE = ("unshare", "--pid", "--fork", "--mount-proc")


def _records(state_dir):
    d = os.path.join(state_dir, "instances")
    out = {}
    for name in os.listdir(d):
        if len(name) == 16 and all(c in "0123456789abcdef" for c in name):
            with open(os.path.join(d, name)) as f:
                out[name] = dict(line.split(" ", 1) for line in f.read().splitlines())
    return out


def test_two_instances_as_pid_1_share_no_uid_and_no_cgroup(cg_available, make_server, tmp_path):
    """Two servers, each pid 1 of its own pid namespace (as in every container deployment):
    concurrent calls of both run, as different uids, each in a cgroup of its own instance
    (with the pid in the names, the second start removed the first's cgroups, their runs
    collided on "run-N", and both ran scripts as the same uids)."""
    state = str(tmp_path / "state")
    a = make_server("--prestart", "off", state_dir=state, wrapper=PID_NAMESPACE)
    a.initialize()
    assert wait_until(lambda: len(_records(state)) == 1, timeout=30)
    (id_a, rec_a), = _records(state).items()
    assert rec_a["pid"] == "1", rec_a  # really pid 1 in its namespace
    b = make_server("--prestart", "off", state_dir=state, wrapper=PID_NAMESPACE)
    b.initialize()
    assert wait_until(lambda: len(_records(state)) == 2, timeout=30)
    records = _records(state)
    id_b = next(i for i in records if i != id_a)
    assert records[id_b]["pid"] == "1" and records[id_a]["uid_block"] != records[id_b]["uid_block"]
    dirs_a = glob.glob(f"/sys/fs/cgroup/**/mps-{id_a}", recursive=True)
    dirs_b = glob.glob(f"/sys/fs/cgroup/**/mps-{id_b}", recursive=True)
    assert dirs_a and dirs_b, (dirs_a, dirs_b)  # b's start kept a's
    script = "import os, sys, time\nprint(os.getuid())\nsys.stdout.flush()\ntime.sleep(3)\n"
    results = {}

    def call(name, s):
        results[name] = s.execute(script, timeout_seconds=60)
    threads = [threading.Thread(target=call, args=(n, s)) for n, s in (("a", a), ("b", b))]
    for t in threads:
        t.start()

    def both_running():
        return all(glob.glob(f"{d}/run-*") for d in dirs_a + dirs_b
                   if "/memory/" in d or "/pids/" in d)
    # Both runs at once, each in its own instance's directory (memory and pids: a run has no
    # directory in the cpu hierarchy without a CPU cap, nor in the freezer's unless frozen).
    assert wait_until(both_running, timeout=60), (
        results, {d: os.listdir(d) for d in dirs_a + dirs_b if os.path.isdir(d)})
    for t in threads:
        t.join(120)
    sa, sb = results["a"]["structuredContent"], results["b"]["structuredContent"]
    assert sa["exit_code"] == 0 and sb["exit_code"] == 0, (sa, sb)
    if BACKEND != "none":  # (the none backend runs scripts as the server's own uid)
        uid_a, uid_b = int(sa["stdout"]), int(sb["stdout"])
        assert uid_a != uid_b, (uid_a, uid_b)
        # Each uid from its own instance's block, and the blocks do not overlap.
        for uid, rec in ((uid_a, records[id_a]), (uid_b, records[id_b])):
            first = 2000000000 + int(rec["uid_block"]) * 4096
            assert first <= uid < first + 4096, (uid, rec)
    a.close()
    b.close()
    assert not glob.glob(f"/sys/fs/cgroup/**/mps-{id_a}", recursive=True)
    assert not glob.glob(f"/sys/fs/cgroup/**/mps-{id_b}", recursive=True)
    assert _records(state) == {}  # a clean exit takes its record with it


def test_a_directory_without_a_record_is_left_alone(cg_available, make_server):
    """A cgroup directory named like an instance's whose record the server cannot see (an
    instance with another state directory, in another pid namespace) is not swept."""
    s = start(make_server)
    mine = cgroup_dirs(s.proc.pid)
    assert mine
    foreign = [os.path.join(os.path.dirname(d), "mps-0123456789abcdef") for d in mine]
    for d in foreign:
        os.mkdir(d)
    try:
        s2 = start(make_server)
        assert cgroup_dirs(s2.proc.pid)
        assert all(os.path.isdir(d) for d in foreign), foreign
        # ...while a dead instance's (its record is there and unlocked) is swept.
        s3 = start(make_server, state_dir=s2.state_dir)
        dead = cgroup_dirs(s3.proc.pid)
        s3.proc.kill()
        s3.proc.wait()
        assert dead and all(os.path.isdir(d) for d in dead)
        start(make_server, state_dir=s2.state_dir)
        assert not any(os.path.isdir(d) for d in dead), dead
        assert all(os.path.isdir(d) for d in foreign), foreign
    finally:
        for d in foreign:
            os.rmdir(d)


def test_a_killed_instance_of_another_state_directory_is_swept(cg_available, make_server):
    """The cgroup tree is the machine's: a server killed with SIGKILL leaves its run cgroups and
    a session's kernel (frozen between calls, it takes not even its parent-death signal) behind,
    and the next server to start sweeps them whatever its state directory, for the dead one's
    lock in /run/mcp-python-exec-sandbox/instances proves it gone."""
    a = start(make_server)
    res = a.execute("x = 41", session="new")
    assert res["structuredContent"]["exit_code"] == 0, res
    ida = instance_id(a.proc.pid)
    assert os.path.exists(f"/run/mcp-python-exec-sandbox/instances/{ida}")
    mine = glob.glob(f"/sys/fs/cgroup/**/mps-{ida}", recursive=True)
    assert mine
    kernels = processes_with_marker(a.state_dir)
    assert kernels, "no process of the session's kernel"
    a.proc.kill()
    a.proc.wait()
    b = start(make_server)  # another state directory
    assert b.state_dir != a.state_dir
    assert wait_until(lambda: not glob.glob(f"/sys/fs/cgroup/**/mps-{ida}", recursive=True), timeout=30), \
        glob.glob(f"/sys/fs/cgroup/**/mps-{ida}", recursive=True)
    assert wait_until(lambda: not processes_with_marker(a.state_dir), timeout=30), processes_with_marker(a.state_dir)
    assert not os.path.exists(f"/run/mcp-python-exec-sandbox/instances/{ida}")
    # (its work directories' mounts are the next server's of its own state directory to sweep)
    start(make_server, state_dir=a.state_dir)

"""Hostile dependency builds: an sdist's build backend (or a wheel's .pth at the inspect
step) is code of the caller's, run by the server's build.  A build must not hang the server
(FIFOs and symlinks where the server will look), poison what another build installs, fill
the disk, or starve a concurrent build of processes; what it leaves behind is gone.

Every package here comes from a local wheelhouse (--find-links) of tiny wheels and sdists
with in-tree build backends (tests/fixtures/wheelhouse.py); no index, no PyPI."""
import fcntl
import glob
import json
import os
import shutil
import signal
import sys
import tempfile

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "fixtures"))
import wheelhouse  # noqa: E402

from conftest import BACKEND, processes_with_marker, wait_until, work_left  # noqa: E402

NO_PIP_ENV = {"PIP_FIND_LINKS": None, "PIP_INDEX_URL": None, "PIP_EXTRA_INDEX_URL": None}
ROOT = os.geteuid() == 0
SLEEPER = "mps-sleeper-%d" % os.getpid()
VICTIM_TEXT = "the victim's own content\n"

# The backend runs under the interpreter of the environment being built (pip re-executes
# itself with --python's interpreter), so sys.prefix is that environment: /env in the
# bubblewrap sandbox, the build space's env/ on the none backend.
FIFO_MANIFEST = """
import os, time
os.mkfifo(os.path.join(sys.prefix, "mps-manifest.json"))
time.sleep(2)
"""
LINK_MANIFEST = """
import os, time
os.symlink(VICTIM, os.path.join(sys.prefix, "mps-manifest.json"))
time.sleep(2)
"""
# A FIFO whose name is not UTF-8: the error that names it must still reach the caller.
FIFO_BAD_NAME = """
import os, time
os.mkfifo(os.path.join(os.fsencode(sys.prefix), b"mps-\\xff\\xfe-fifo"))
time.sleep(2)
"""
FIFO_BIN = """
import os, time
os.makedirs(os.path.join(sys.prefix, "bin"), exist_ok=True)
os.mkfifo(os.path.join(sys.prefix, "bin", "mps-fifo"))
time.sleep(2)
"""
# Symlinks to a host file where the server used to look (bin/ scripts it relocated): the
# build succeeds, the symlinks stay symlinks, and the host file is never touched.
LINK_BIN = """
import os
b = os.path.join(sys.prefix, "bin")
for name in ["activate", "mps-victim"]:
    p = os.path.join(b, name)
    if os.path.lexists(p):
        os.unlink(p)
    os.symlink(VICTIM, p)
"""
# A .pth runs whenever the environment's interpreter starts: first at the inspect step.
PTH_HOOK = """
import os, sys
try:
    {action}
except OSError:
    pass
"""
# Build A's backend: a forged mps-legit wheel over every mps-legit wheel it can reach, and
# planted in every directory it can write (its cache, the wheelhouse, /tmp).
POISON = """
import os, tempfile
forged_dir = tempfile.mkdtemp()
base = _write_wheel(forged_dir, "mps-legit", "1.0", {"mps_legit/__init__.py": "MARKER = 'FORGED'\\n"})
data = open(os.path.join(forged_dir, base), "rb").read()
found, dirs_seen = [], []
for top in {"/cache", "/wheels", "/tmp", os.environ.get("PIP_CACHE_DIR", "/cache")}:
    for d, dirs, files in os.walk(top):
        dirs_seen.append(d)
        found += [os.path.join(d, f) for f in files if f.startswith("mps_legit") and f.endswith(".whl")]
hits = 0
for p in found:
    try:
        if b"FORGED" in open(p, "rb").read():
            continue  # planted by this backend (pip may run it twice)
        open(p, "wb").write(data)
        hits += 1
    except OSError:
        pass
for d in dirs_seen:
    try:
        open(os.path.join(d, base), "wb").write(data)
    except OSError:
        pass
FILES["mps_alice/__init__.py"] = "HITS = %d\\n" % hits
"""
BIG = """
import os
chunk = b"x" * (1 << 20)
for d in [os.environ.get("PIP_CACHE_DIR", "/cache"), os.environ.get("TMPDIR", "/tmp")]:
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, "big"), "wb") as f:
        for i in range(300):
            f.write(chunk)
"""
SLEEPERS = """
import os, time
n = 0
for i in range(2000):  # until the limits refuse
    try:
        pid = os.fork()
    except OSError:
        break
    if pid == 0:
        null = os.open("/dev/null", os.O_RDWR)
        for fd in (0, 1, 2):
            os.dup2(null, fd)  # not holding pip's pipes open
        os.execv("/bin/sleep", ["%s", "300"])
    n += 1
release = os.path.join(os.environ.get("TMPDIR", "/tmp"), "mps-release")
for i in range(1200):
    if os.path.exists(release):
        break
    time.sleep(0.1)
raise SystemExit("forked %%d sleepers and stopped" %% n)
""" % SLEEPER
# Enough for the server's copy out of the space to take a while: many files and some bytes.
SLOW_COPY = """
import os
d = os.path.join(sys.prefix, "mps-slow-copy")
os.makedirs(d)
for i in range(30000):
    with open(os.path.join(d, "f%d" % i), "wb") as f:
        f.write(b"x" * 1024)
with open(os.path.join(d, "big"), "wb") as f:
    for i in range(200):
        f.write(os.urandom(1 << 20))
"""
# A backend that takes its time: what a dry-run resolution runs to learn the metadata.
STALL = """
import time
time.sleep(120)
"""
# 100 MB into the build's cache at install, then (a .pth of the wheel it makes) a sleeper at
# the inspect step, whose cgroup the test reads.
MEMORY_STEPS = """
import os
with open("/cache/filler", "wb") as f:
    for i in range(100):
        f.write(os.urandom(1 << 20))
FILES["mps_memory_steps.pth"] = "import mps_memory_steps_hook\\n"
FILES["mps_memory_steps_hook.py"] = (
    "import os, subprocess, sys\\n"
    "if os.access(sys.prefix, os.W_OK):\\n"
    "    subprocess.run(['MARKER', '60'], executable='/bin/sleep')\\n")
""".replace("MARKER", SLEEPER)
PROBE = """
import os
FILES["mps_probe/__init__.py"] = "UID = %d\\n" % os.getuid()
"""


@pytest.fixture(scope="module")
def victim():
    d = tempfile.mkdtemp(prefix="mps-victim-")
    os.chmod(d, 0o755)
    path = os.path.join(d, "victim.txt")
    with open(path, "w") as f:
        f.write(VICTIM_TEXT)
    os.chmod(path, 0o644)
    yield path
    shutil.rmtree(d, ignore_errors=True)


def pth_wheel(outdir, name, action):
    mod = name.replace("-", "_")
    return wheelhouse.make_wheel(outdir, name, "1.0", files={
        f"{mod}/__init__.py": "",
        f"{mod}.pth": f"import {mod}_hook\n",
        f"{mod}_hook.py": PTH_HOOK.format(action=action),
    })


@pytest.fixture(scope="module")
def wheels(victim):
    # Builds run as unprivileged uids: the wheelhouse must be world-readable.
    d = tempfile.mkdtemp(prefix="mps-hostile-wheels-")
    os.chmod(d, 0o755)
    wheelhouse.build_synthetic(d)
    prelude = f"VICTIM = {victim!r}\n"
    for name, code in [("mps-fifo-manifest", FIFO_MANIFEST), ("mps-link-manifest", LINK_MANIFEST),
                       ("mps-fifo-bin", FIFO_BIN), ("mps-fifo-bad-name", FIFO_BAD_NAME),
                       ("mps-link-bin", LINK_BIN), ("mps-alice", POISON),
                       ("mps-big", BIG), ("mps-sleepers", SLEEPERS), ("mps-probe", PROBE),
                       ("mps-slow-copy", SLOW_COPY), ("mps-stall", STALL), ("mps-memory-steps", MEMORY_STEPS)]:
        wheelhouse.make_sdist(d, name, "1.0", hostile=prelude + code)
    wheelhouse.make_sdist(d, "mps-legit", "1.0", files={"mps_legit/__init__.py": "MARKER = 'REAL'\n"})
    pth_wheel(d, "mps-pth-fifo", "os.mkfifo(os.path.join(sys.prefix, 'mps-manifest.json'))")
    pth_wheel(d, "mps-pth-link", f"os.symlink({victim!r}, os.path.join(sys.prefix, 'mps-manifest.json'))")
    # At the inspect step (the server starts the environment's interpreter with -I there, runs
    # without): a package list of 2 MB instead of the real one.
    pth_wheel(d, "mps-pth-flood", "if sys.flags.isolated: "
              "sys.stdout.write('{' + ','.join('\"p%d\": \"%s\"' % (i, 'x' * 200) for i in range(10000)) + '}'); "
              "sys.stdout.flush(); os._exit(0)")
    for f in os.listdir(d):
        os.chmod(os.path.join(d, f), 0o644)
    yield d
    shutil.rmtree(d, ignore_errors=True)


@pytest.fixture
def dep_server(make_server, wheels):
    def make(*args, **kw):
        s = make_server("--find-links", wheels, "--offline", *args, env={**NO_PIP_ENV, **kw.pop("env", {})}, **kw)
        s.initialize()
        return s
    return make


def text(res):
    return res["content"][0]["text"]


def envs_of(s):
    d = os.path.join(s.state_dir, "envs")
    return sorted(e for e in os.listdir(d) if not e.startswith(".") and not e.endswith(".lock"))


def mounts_under(path):
    with open("/proc/self/mountinfo") as f:
        return [line.split()[4] for line in f if line.split()[4].startswith(path + "/")]


def disk_bytes(path):
    """Bytes allocated under path on its own filesystems (mounts below it not crossed)."""
    dev = os.lstat(path).st_dev
    total = 0
    for d, dirs, files in os.walk(path):
        dirs[:] = [x for x in dirs if os.lstat(os.path.join(d, x)).st_dev == dev]
        for f in files:
            try:
                total += os.lstat(os.path.join(d, f)).st_blocks * 512
            except OSError:
                pass
    return total


def assert_nothing_left(s):
    assert not glob.glob(os.path.join(s.state_dir, "envs", ".staging-*"))
    assert wait_until(lambda: work_left(s.state_dir) == [], timeout=30), work_left(s.state_dir)
    assert mounts_under(s.state_dir) == [] or all("/run-" in m for m in mounts_under(s.state_dir)), \
        mounts_under(s.state_dir)
    assert wait_until(lambda: not glob.glob(os.path.join(s.state_dir, "envs", ".trash-*")), timeout=30)


def victim_intact(victim):
    with open(victim) as f:
        return f.read() == VICTIM_TEXT


# ---------------------------------------------------------------- files the server touches

@pytest.mark.parametrize("package,words", [
    ("mps-fifo-manifest", ["mps-manifest.json", "a FIFO"]),
    ("mps-link-manifest", ["mps-manifest.json", "a symlink"]),
    ("mps-fifo-bin", ["a FIFO", "bin/mps-fifo"]),
    ("mps-fifo-bad-name", ["a FIFO", "./mps-\ufffd\ufffd-fifo"]),
    ("mps-pth-fifo", ["mps-manifest.json", "a FIFO"]),
    ("mps-pth-link", ["mps-manifest.json", "a symlink"]),
])
def test_special_files_in_the_build_fail_it_and_the_server_keeps_serving(dep_server, victim, package, words):
    s = dep_server()
    s.send({"jsonrpc": "2.0", "id": "build", "method": "tools/call", "params": {
        "name": "execute_python", "arguments": {"details": True, "script": "print('never')", "dependencies": [package],
                                                "timeout_seconds": 60}}})
    # Answered while the build runs (the backends sleep after the deed), and before it.
    assert s.request("ping", timeout=60)["result"] == {}
    assert not any(m.get("id") == "build" for m in s.stray), "the build answered before the ping"
    res = s.recv_response("build", timeout=180)["result"]
    assert res["isError"] is True, text(res)
    for w in words:
        assert w in text(res), text(res)
    # The server lives on, and nothing of the build is left.
    assert s.request("ping")["result"] == {}
    ok = s.execute("print('still here')")
    assert ok["structuredContent"]["stdout"] == "still here\n"
    assert envs_of(s) == []
    assert_nothing_left(s)
    assert victim_intact(victim)


def test_symlinks_to_host_files_stay_symlinks(dep_server, victim):
    s = dep_server()
    res = s.execute("import os, sys\nprint(os.path.islink(os.path.join(sys.prefix, 'bin', 'mps-victim')))",
                    dependencies=["mps-link-bin"], timeout=180)
    assert res["structuredContent"]["exit_code"] == 0, text(res)
    assert res["structuredContent"]["stdout"] == "True\n"
    env = os.path.join(s.state_dir, "envs", res["structuredContent"]["environment"]["key"])
    for name in ["activate", "mps-victim"]:
        p = os.path.join(env, "bin", name)
        assert os.path.islink(p) and os.readlink(p) == victim
    assert victim_intact(victim)
    # What the server wrote is its own, with no set-id bits; the manifest says who asked.
    for d, dirs, files in os.walk(env):
        for f in dirs + files:
            st = os.lstat(os.path.join(d, f))
            assert st.st_uid == os.geteuid(), os.path.join(d, f)
            assert not st.st_mode & 0o7000, os.path.join(d, f)
    manifest = json.load(open(os.path.join(env, "mps-manifest.json")))
    assert manifest["format"] == 2 and "built_by" in manifest and manifest["built_by"] == "stdio"
    assert_nothing_left(s)


# The install step swaps a directory of its /tmp that bwrap made for the mount point of a
# --find-links directory deeper below /tmp for a symlink to a host directory: should the next
# step (inspect) get the same /tmp, bwrap (as root) makes that mount point through the symlink,
# a directory on the host outside the build's space.
TMP_SWAP = """
import os
os.rename(TOP, TOP + "-moved")
os.symlink("/oldroot" + HOST_DIR, TOP)
"""


def test_a_step_cannot_steer_the_next_steps_mounts_through_tmp(make_server):
    if BACKEND != "bwrap":
        pytest.skip("bubblewrap makes the mount points of the build's read-only binds below its /tmp")
    top = tempfile.mkdtemp(prefix="mps-deep-links-")
    host_dir = tempfile.mkdtemp(prefix="mps-host-dir-")
    try:
        links = os.path.join(top, "links")
        os.mkdir(links)
        for d in (top, links):
            os.chmod(d, 0o755)
        wheelhouse.make_sdist(links, "mps-tmp-swap", "1.0",
                              hostile=f"TOP = {top!r}\nHOST_DIR = {host_dir!r}\n" + TMP_SWAP)
        for f in os.listdir(links):
            os.chmod(os.path.join(links, f), 0o644)
        s = make_server("--find-links", links, "--offline", env=NO_PIP_ENV)
        s.initialize()
        res = s.execute("import mps_tmp_swap\nprint('built')", dependencies=["mps-tmp-swap"], timeout=180)
        assert res["structuredContent"]["stdout"] == "built\n", text(res)
        assert os.listdir(host_dir) == []
        assert_nothing_left(s)
    finally:
        shutil.rmtree(top, ignore_errors=True)
        shutil.rmtree(top + "-moved", ignore_errors=True)
        shutil.rmtree(host_dir, ignore_errors=True)


def manifest_bytes(s, key):
    return os.path.getsize(os.path.join(s.state_dir, "envs", key, "mps-manifest.json"))


def test_a_manifest_stays_small_whatever_the_build_prints_or_the_call_asks(dep_server):
    # Every listing of the store (an eviction at each build, check_environment) reads the
    # manifests it has not read before, on the loop: a 1 MB one per environment made a
    # thousand such environments block the server for seconds at each listing.  The package
    # list comes from the inspect step, which a .pth of the build can flood.
    s = dep_server()
    res = s.execute("import mps_pth_flood\nprint('ok')", dependencies=["mps-pth-flood"], timeout=180)
    assert res["structuredContent"]["stdout"] == "ok\n", text(res)
    assert res["structuredContent"]["environment"]["packages"] == {}
    assert manifest_bytes(s, res["structuredContent"]["environment"]["key"]) < 8192
    again = s.execute("print('again')", dependencies=["mps-pth-flood"], timeout=60)
    assert again["structuredContent"]["environment"]["cached"] is True, text(again)
    # A long requirement list (2 MB in JSON) is counted, not kept.
    skipped = [f"mps-nothing{i}; platform_release == '{chr(34) * 3900}'" for i in range(200)]
    res = s.execute("print('long')", dependencies=["mps-gamma"] + skipped, timeout=180)
    assert res["structuredContent"]["stdout"] == "long\n", text(res)[:2000]
    key = res["structuredContent"]["environment"]["key"]
    assert manifest_bytes(s, key) < 8192
    manifest = json.load(open(os.path.join(s.state_dir, "envs", key, "mps-manifest.json")))
    assert manifest["requested_count"] == 201 and manifest["requested"] == []
    again = s.execute("print('again')", dependencies=["mps-gamma"] + skipped, timeout=60)
    assert again["structuredContent"]["environment"]["cached"] is True, text(again)
    assert_nothing_left(s)


# ---------------------------------------------------------------- nothing shared writable

def test_a_build_cannot_poison_another_builds_packages(dep_server):
    if BACKEND == "none":
        pytest.skip("the none backend runs builds unsandboxed, as the server's own user")
    s = dep_server()
    first = s.execute("import mps_legit\nprint(mps_legit.MARKER)", dependencies=["mps-legit"], timeout=180)
    assert first["structuredContent"]["stdout"] == "REAL\n", text(first)
    # Alice's build rewrites every mps-legit wheel it can reach and plants forged ones.
    alice = s.execute("import mps_alice\nprint('alice', mps_alice.HITS)", dependencies=["mps-alice"], timeout=180)
    assert alice["structuredContent"]["exit_code"] == 0, text(alice)
    assert alice["structuredContent"]["stdout"] == "alice 0\n"  # nothing of anyone else's in reach
    # Bob's later, separate build of the legitimate package installs the real one.
    bob = s.execute("import mps_legit\nprint(mps_legit.MARKER)", dependencies=["mps-legit", "mps-gamma"],
                    timeout=180)
    assert bob["structuredContent"]["environment"]["cached"] is False
    assert bob["structuredContent"]["stdout"] == "REAL\n", text(bob)
    assert not glob.glob(os.path.join(s.state_dir, "downloads", "**", "mps_legit*"), recursive=True)
    # A build's cache is its own and goes with it.
    assert_nothing_left(s)


def test_old_downloads_are_cleared_at_start(make_server, wheels, tmp_path):
    state = tmp_path / "state"
    forged = state / "downloads" / "pip" / "wheels" / "ab" / "mps_legit-1.0-py3-none-any.whl"
    forged.parent.mkdir(parents=True)
    forged.write_text("forged")
    (state / "downloads" / "wheels").mkdir()
    planted = state / "downloads" / "wheels" / "mps_legit-1.0-py3-none-any.whl"
    planted.write_text("forged")
    s = make_server("--find-links", wheels, "--offline", state_dir=str(state), env=NO_PIP_ENV)
    s.initialize()
    assert wait_until(lambda: not forged.exists() and not planted.exists(), timeout=30)
    assert sorted(os.listdir(state / "downloads")) == ["wheels"]
    assert os.listdir(state / "downloads" / "wheels") == []
    s.close()
    # A wheel the server did not store (another owner, or writable by others) goes too, at
    # every start; one of its own stays.
    good = state / "downloads" / "wheels" / "mps_gamma-1.0-py3-none-any.whl"
    shutil.copy(glob.glob(os.path.join(wheels, "mps_gamma-1.0-*.whl"))[0], good)
    os.chmod(good, 0o644)
    bad = state / "downloads" / "wheels" / "mps_alpha-1.0-py3-none-any.whl"
    bad.write_text("x")
    os.chmod(bad, 0o666)
    s = make_server("--find-links", wheels, "--offline", state_dir=str(state), env=NO_PIP_ENV)
    s.initialize()
    assert wait_until(lambda: not bad.exists(), timeout=30)
    assert good.exists()


# ---------------------------------------------------------------- bounded writes

def test_a_build_that_writes_too_much_fails_at_the_bound(dep_server):
    if not ROOT:
        pytest.skip("the build space is a size-capped tmpfs only when the server runs as root")
    s = dep_server("--max-build-bytes", "64M")
    before = disk_bytes(s.state_dir)
    res = s.execute("print('never')", dependencies=["mps-big"], timeout=180)
    assert res["isError"] is True
    assert "the build wrote more than 64M" in text(res), text(res)
    assert s.request("ping")["result"] == {}
    assert_nothing_left(s)
    assert disk_bytes(s.state_dir) < before + (1 << 20)
    assert mounts_under(os.path.join(s.state_dir, "work")) == [] or \
        all("/run-" in m for m in mounts_under(os.path.join(s.state_dir, "work")))


def test_a_build_cancelled_while_it_is_copied_stops(dep_server):
    # The call goes (and its slot with it): the build must not go on without it.
    s = dep_server("--max-concurrent", "1")
    s.send({"jsonrpc": "2.0", "id": "big", "method": "tools/call", "params": {
        "name": "execute_python", "arguments": {"details": True, "script": "print('never')", "dependencies": ["mps-slow-copy"]}}})
    staging = os.path.join(s.state_dir, "envs", ".staging-*")
    assert wait_until(lambda: glob.glob(staging), timeout=180, interval=0.01)
    s.notify("notifications/cancelled", {"requestId": "big"})
    assert s.request("ping")["result"] == {}
    assert_nothing_left(s)
    assert envs_of(s) == []
    assert "built in" not in s.stderr_text()
    ok = s.execute("import mps_gamma\nprint('next')", dependencies=["mps-gamma"], timeout=180)
    assert ok["structuredContent"]["stdout"] == "next\n", text(ok)


def test_a_copy_left_by_a_server_killed_while_copying_goes_at_the_next_start(dep_server, tmp_path):
    state = str(tmp_path / "state")
    s = dep_server(state_dir=state)
    s.send({"jsonrpc": "2.0", "id": "big", "method": "tools/call", "params": {
        "name": "execute_python", "arguments": {"details": True, "script": "print('never')", "dependencies": ["mps-slow-copy"]}}})
    staging = os.path.join(state, "envs", ".staging-*")
    assert wait_until(lambda: glob.glob(staging), timeout=180, interval=0.01)
    s.proc.send_signal(signal.SIGKILL)
    s.proc.wait()
    assert glob.glob(staging)  # left behind by the crash...
    # ...and gone once another server starts on the state directory, whatever it builds
    # (no build of that key would ever come to remove it).
    s2 = dep_server(state_dir=state)
    ok = s2.execute("import mps_gamma\nprint('next')", dependencies=["mps-gamma"], timeout=180)
    assert ok["structuredContent"]["stdout"] == "next\n", text(ok)
    assert wait_until(lambda: not glob.glob(staging) and not glob.glob(os.path.join(state, "envs", ".trash-*")),
                      timeout=60)
    assert_nothing_left(s2)


@pytest.mark.parametrize("caps,why", [
    (("--max-concurrent", "4", "--max-token-running", "1"), "of yours are running already (at most 1 at once)"),
    (("--max-concurrent", "1"), "are running already (at most 1 at once, --max-concurrent)"),
])
def test_dry_run_resolutions_are_bounded(dep_server, caps, why):
    # They run package code in a space of their own, like builds, but hold no execution slot.
    s = dep_server(*caps)
    s.send({"jsonrpc": "2.0", "id": "stall", "method": "tools/call", "params": {
        "name": "validate_script", "arguments": {"script": "pass", "dependencies": ["mps-stall"], "resolve": True}}})
    spaces = os.path.join(s.state_dir, "work", "srv-*", "resolve-*")
    assert wait_until(lambda: glob.glob(spaces), timeout=60)
    res = s.call("validate_script", {"script": "pass", "dependencies": ["mps-gamma"], "resolve": True}, timeout=60)
    assert res["isError"] is True and why in text(res), text(res)
    assert len(glob.glob(spaces)) == 1
    s.notify("notifications/cancelled", {"requestId": "stall"})
    assert wait_until(lambda: not glob.glob(spaces), timeout=60)
    res = s.call("validate_script", {"script": "pass", "dependencies": ["mps-gamma"], "resolve": True}, timeout=120)
    assert text(res).startswith("VALID") and "mps-gamma==1.0" in text(res), text(res)
    assert not any(m.get("id") == "stall" for m in s.stray)


# ---------------------------------------------------------------- processes

def cgroups_of(pid):
    try:
        with open(f"/proc/{pid}/cgroup") as f:
            return {line.split(":", 2)[1]: line.rstrip("\n").split(":", 2)[2] for line in f}
    except OSError:
        return None


def uid_of(pid):
    try:
        with open(f"/proc/{pid}/status") as f:
            return next(int(line.split()[1]) for line in f if line.startswith("Uid:"))
    except OSError:
        return None


def memory_limit_of(pid):
    for controller, path in (cgroups_of(pid) or {}).items():
        for f in ("memory.max", "memory.limit_in_bytes"):
            base = "/sys/fs/cgroup" + ("/memory" if controller == "memory" else "")
            try:
                with open(base + path + "/" + f) as fh:
                    return int(fh.read())
            except (OSError, ValueError):
                pass
    return None


def test_what_earlier_steps_wrote_counts_against_a_later_steps_memory(dep_server):
    # The space is a tmpfs: its pages are memory, charged to the step that wrote them; the
    # next step's cgroup must not get room for a whole space again on top of them.
    if not ROOT or BACKEND == "none":
        pytest.skip("the build space is a tmpfs only when the server runs as root")
    s = dep_server("--max-build-bytes", "256M")
    s.send({"jsonrpc": "2.0", "id": "m", "method": "tools/call", "params": {
        "name": "execute_python", "arguments": {"details": True, "script": "print('done')", "dependencies": ["mps-memory-steps"]}}})
    assert wait_until(lambda: processes_with_marker(SLEEPER), timeout=180)
    pid = processes_with_marker(SLEEPER)[0]
    limit, cgroups = memory_limit_of(pid), cgroups_of(pid) or {}
    for p in processes_with_marker(SLEEPER):
        os.kill(p, signal.SIGKILL)
    if limit is None or not any("/mps-" in v for v in cgroups.values()):
        pytest.skip("no memory cgroup for builds here")
    assert limit <= (4 << 30) + (256 << 20) - (100 << 20), limit
    res = s.recv_response("m", timeout=180)["result"]
    assert res["structuredContent"]["stdout"] == "done\n", text(res)


def test_a_build_forking_hundreds_does_not_starve_a_concurrent_one(dep_server):
    s = dep_server()
    s.send({"jsonrpc": "2.0", "id": "a", "method": "tools/call", "params": {
        "name": "execute_python", "arguments": {"details": True, "script": "pass", "dependencies": ["mps-sleepers"],
                                                "timeout_seconds": 120}}})
    assert wait_until(lambda: len(processes_with_marker(SLEEPER)) >= 450, timeout=120), \
        len(processes_with_marker(SLEEPER))
    sleepers = processes_with_marker(SLEEPER)
    # Bob's build meanwhile: processes of its own, and it records who it ran as.
    # (Its success is the proof: with one uid or one pids cgroup for both builds, its forks
    # would fail against the 512-process limit the sleepers exhaust.)
    res = s.execute("import mps_probe\nprint(mps_probe.UID)", dependencies=["mps-probe"], timeout=180)
    assert res["structuredContent"]["exit_code"] == 0, text(res)
    probe_uid = int(res["structuredContent"]["stdout"])
    live = [p for p in sleepers if uid_of(p) is not None]
    assert live
    if BACKEND != "none" and ROOT:
        assert uid_of(live[0]) != probe_uid  # a uid (and RLIMIT_NPROC budget) of each build's own
        assert uid_of(live[0]) >= 2000000000  # from the per-run pool
    cg = cgroups_of(live[0])
    if cg and any("/mps-" in v for v in cg.values()):
        assert all("/run-" in v for k, v in cg.items() if "/mps-" in v), cg  # a cgroup of the build's own
    for d in glob.glob(os.path.join(s.state_dir, "work", "srv-*", "build-*", "tmp*")):
        open(os.path.join(d, "mps-release"), "w").close()
    a = s.recv_response("a", timeout=180)["result"]
    assert a["isError"] is True and "stopped" in text(a), text(a)
    assert wait_until(lambda: processes_with_marker(SLEEPER) == [], timeout=60)
    assert_nothing_left(s)


# ---------------------------------------------------------------- the store's own promises

def test_uv_missing_is_a_clean_tool_error(make_server, wheels):
    # Issue 16.1: the answer used to come from inside env_store_ensure, after which the caller
    # wrote into the job the callback had freed (ASan: heap-use-after-free).  The conftest
    # fails the test on any sanitizer report in the server's log.
    s = make_server("--installer", "uv", "--uv-path", "/nonexistent/uv", "--find-links", wheels, "--offline",
                    env=NO_PIP_ENV)
    s.initialize()
    for _ in range(2):
        res = s.execute("print('x')", dependencies=["mps-gamma"], timeout=60)
        assert res["isError"] is True
        assert "uv was not found at '/nonexistent/uv'" in text(res), text(res)
    assert s.request("ping")["result"] == {}


def test_a_hit_whose_lock_is_taken_is_a_miss(dep_server):
    # Issue 16.6: another server evicting an environment holds its lock exclusively while it
    # renames the directory away; a hit must not be handed out meanwhile.
    s = dep_server()
    first = s.execute("import mps_gamma\nprint('one')", dependencies=["mps-gamma"], timeout=180)
    key = first["structuredContent"]["environment"]["key"]
    envs = os.path.join(s.state_dir, "envs")
    with open(os.path.join(envs, key + ".lock"), "r+") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        s.send({"jsonrpc": "2.0", "id": "hit", "method": "tools/call", "params": {
            "name": "execute_python", "arguments": {"details": True, "script": "import mps_gamma\nprint('two')",
                                                    "dependencies": ["mps-gamma"]}}})
        assert wait_until(lambda: f"environment {key} is locked elsewhere" in s.stderr_text(), timeout=30), \
            s.stderr_text()[-2000:]
        assert s.request("ping")["result"] == {}
        assert not any(m.get("id") == "hit" for m in s.stray), "a locked environment was handed out"
        os.rename(os.path.join(envs, key), os.path.join(envs, f".evicted-{key}-test"))
        fcntl.flock(lock, fcntl.LOCK_UN)
    res = s.recv_response("hit", timeout=180)["result"]
    assert res["structuredContent"]["stdout"] == "two\n", text(res)
    assert res["structuredContent"]["environment"]["cached"] is False  # built again
    shutil.rmtree(os.path.join(envs, f".evicted-{key}-test"), ignore_errors=True)


def lock_holders(pid, path):
    fds = os.path.join(f"/proc/{pid}/fd")
    return [fd for fd in os.listdir(fds) if os.path.realpath(os.path.join(fds, fd)) == os.path.realpath(path)]


def test_a_build_cancelled_while_it_waits_for_the_lock_never_starts(dep_server):
    s = dep_server()
    first = s.execute("import mps_gamma\nprint('one')", dependencies=["mps-gamma"], timeout=180)
    key = first["structuredContent"]["environment"]["key"]
    envs = os.path.join(s.state_dir, "envs")
    with open(os.path.join(envs, key + ".lock"), "r+") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        os.rename(os.path.join(envs, key), os.path.join(envs, f".evicted-{key}-test"))
        s.send({"jsonrpc": "2.0", "id": "wait", "method": "tools/call", "params": {
            "name": "execute_python", "arguments": {"details": True, "script": "print('never')", "dependencies": ["mps-gamma"]}}})
        assert wait_until(lambda: f"environment {key} is locked elsewhere" in s.stderr_text(), timeout=30), \
            s.stderr_text()[-2000:]
        s.notify("notifications/cancelled", {"requestId": "wait"})
        assert s.request("ping")["result"] == {}
        # The build is gone: nothing of the server's waits on the lock any more (had it gone
        # on, it would build the environment again, for no one, once the lock is free).
        assert lock_holders(s.proc.pid, os.path.join(envs, key + ".lock")) == []
        fcntl.flock(lock, fcntl.LOCK_UN)
    shutil.rmtree(os.path.join(envs, f".evicted-{key}-test"), ignore_errors=True)


def test_check_environment_says_how_builds_are_held(dep_server):
    s = dep_server("--max-build-bytes", "64M", "--build-timeout", "77")
    line = next(l for l in text(s.call("check_environment")).splitlines() if l.startswith("Dependency builds: "))
    assert "64M (--max-build-bytes)" in line and "77s (--build-timeout)" in line, line
    if BACKEND == "none":
        assert "not isolated" in line, line
    else:
        assert line.startswith("Dependency builds: in the sandbox"), line
        assert (", as a uid of its own" in line) == (ROOT and BACKEND == "bwrap"), line
    assert ("a tmpfs capped at 64M" in line) == ROOT, line


def test_the_manifest_names_who_asked_for_the_build(wheels, tmp_path):
    # The hook for per-principal cache accounting: over HTTP, the bearer token's name.
    from test_http import LATEST, HttpServer, call_msg, messages, sse_events_from_bytes
    tokens = tmp_path / "tokens"
    tokens.write_text("alice: tok-alice\n")
    s = HttpServer("--auth-token-file", str(tokens), "--find-links", wheels, "--offline")
    try:
        alice = {"Authorization": "Bearer tok-alice"}
        sid = s.initialize(headers=alice)
        # (an environment build: a loaded CI machine may take longer than the default 30 s)
        st, h, body = s.post(call_msg(1, "import mps_gamma\nprint('ok')", dependencies=["mps-gamma"], details=True), sid,
                             headers=alice, version=LATEST, conn=s.connect(timeout=180))
        assert st == 200, body
        res = json.loads(body)["result"] if h["content-type"] == "application/json" else \
            [m for m in messages(sse_events_from_bytes(body)) if m.get("id") == 1][0]["result"]
        assert res["structuredContent"]["stdout"] == "ok\n", res
        key = res["structuredContent"]["environment"]["key"]
        manifest = json.load(open(os.path.join(s.state_dir, "envs", key, "mps-manifest.json")))
        assert manifest["built_by"] == "alice"
    finally:
        s.close()

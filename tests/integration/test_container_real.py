"""The docker and podman backends on a real engine (deploy/container-engine.sh sets it up).

test.sh runs `deploy/container-engine.sh setup all` first and passes the engines that came up
in MPS_TEST_CONTAINER_ENGINES ("docker podman"); without it every test here is skipped, with
the reason.  The image is the debootstrap one (Debian's python3, no uv): dependency
environments are built by the image's pip, inside a container.

Every test checks at the end that none of our containers is left (`docker ps -a` with our
label) and that no channel directory is left behind."""
import getpass
import json
import glob
import os
import socket
import subprocess
import sys
import threading
import http.server
import time

import pytest

from conftest import Server, wait_until
import policy_probes
import test_hostile

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "fixtures"))
import wheelhouse  # noqa: E402

ENGINES = os.environ.get("MPS_TEST_CONTAINER_ENGINES", "").split()
LABEL = "io.github.mcp-python-exec-sandbox.run"

pytestmark = pytest.mark.skipif(
    not ENGINES, reason="SKIPPED: no container engine set up (MPS_TEST_CONTAINER_ENGINES is empty; "
    "run deploy/container-engine.sh setup all, as test.sh does)")


def ours(engine):
    out = subprocess.run([engine, "ps", "-aq", "--filter", f"label={LABEL}"], capture_output=True,
                         text=True, timeout=60)
    return out.stdout.split()


@pytest.fixture(params=ENGINES or ["none"])
def engine(request):
    yield request.param
    assert wait_until(lambda: ours(request.param) == [], timeout=30), ours(request.param)


@pytest.fixture
def run_dir(tmp_path):
    d = tmp_path / "runs"
    return str(d)


@pytest.fixture
def start(engine, run_dir):
    made = []

    def start(*args, env=None):
        full = {"MPS_DOCKER_RUN_DIR": run_dir, "MPS_DOCKER": None}
        full.update(env or {})
        s = Server(*args, backend=engine, env=full)
        s.initialize()
        res = s.probed_environment(timeout=120)
        assert res["structuredContent"]["sandbox_available"], res["content"][0]["text"]
        made.append(s)
        return s

    yield start
    for s in made:
        s.close()
    # Each run's channel directory went with it.
    assert not os.path.isdir(run_dir) or os.listdir(run_dir) == []


def mounts_under(path):
    with open("/proc/self/mountinfo") as f:
        return [line.split()[4] for line in f if line.split()[4].startswith(path)]


def text(res):
    return res["content"][0]["text"]


def image_python(engine):
    out = subprocess.run([engine, "run", "--rm", "--network", "none", "--ulimit", "nproc=4096:4096",
                          "--ulimit", "nofile=1024:1024", "--entrypoint", "python3",
                          "mcp-python-exec-sandbox:py3.12", "-c",
                          "import os, platform, shutil; print(platform.python_version(), "
                          "os.path.realpath(shutil.which('python3')))"],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    version, path = out.stdout.split()
    return version, path


# ---------------------------------------------------------------- execution


def test_runs_and_reports_the_images_interpreter(engine, start):
    version, path = image_python(engine)
    s = start()
    env = s.probed_environment()
    assert env["structuredContent"]["python_version"] == version
    assert env["structuredContent"]["python_path"] == path
    assert f"({path}, in the sandbox's image)" in text(env)
    res = s.execute("import getpass, sys, os\n"
                    "print(6*7, sys.executable, os.getuid(), os.getcwd(), getpass.getuser())")
    sc = res["structuredContent"]
    assert sc["exit_code"] == 0, text(res)
    out = sc["stdout"].split()
    assert out[0] == "42" and out[3] == "/work"
    assert out[4] == ("sandbox" if os.geteuid() == 0 else getpass.getuser())  # as under bwrap
    assert_run_uid(int(out[2]))
    assert os.path.realpath(out[1]) == out[1] or out[1].startswith("/usr")
    assert sc["python"]["version"] == version and sc["python"]["path"] == path, sc["python"]
    assert sc["sandbox"] == engine
    assert f"--- python: {version} ({path}) ---" in text(res)
    # The script's real exit status, not the client's.
    res = s.execute("import sys; sys.exit(3)")
    assert res["structuredContent"]["exit_code"] == 3
    assert "could not confirm" not in text(res)
    res = s.execute("import os, signal; os.kill(os.getpid(), signal.SIGTERM)")
    assert res["structuredContent"]["exit_code"] == -15, text(res)


def assert_run_uid(uid):
    """As root, each container runs as a uid of its own (sandbox/uids.c), as bwrap's runs do;
    otherwise as the server's own uid."""
    if os.geteuid() == 0:
        assert 2000000000 <= uid < 2000000000 + (1 << 27), uid
    else:
        assert uid == os.getuid(), uid


def test_no_uv_needed_without_dependencies(engine, start):
    """The image has no uv: runs without dependencies never ask for one."""
    s = start("--installer", "auto")
    res = s.execute("print('no uv here')")
    assert res["structuredContent"]["stdout"] == "no uv here\n", text(res)
    assert "uv" not in res["structuredContent"]["stderr"]


# ---------------------------------------------------------------- limits


def test_memory_oom_is_reported_as_the_memory_limit(engine, start):
    s = start("--memory-limit", "128M")
    res = s.execute("x = bytearray(1 << 30)\nprint('survived')")
    sc = res["structuredContent"]
    assert "survived" not in sc["stdout"]
    assert sc["exit_code"] == -9, text(res)
    assert "limit: out of memory (the 128 MiB memory limit" in text(res), text(res)
    # A run within the limit says nothing of the kind.
    res = s.execute("x = bytearray(16 << 20)\nprint('fine')")
    assert res["structuredContent"]["stdout"] == "fine\n"
    assert "out of memory" not in text(res)


def test_pids_limit_stops_a_fork_bomb(engine, start):
    s = start("--max-processes", "24")
    script = """
import os, time
kids, refused = 0, False
for _ in range(200):
    try:
        pid = os.fork()
    except OSError:
        refused = True
        break
    if pid == 0:
        time.sleep(30)
        os._exit(0)
    kids += 1
print(kids, refused)
"""
    res = s.execute(script, timeout_seconds=60)
    out = res["structuredContent"]["stdout"].split()
    assert out[1] == "True", text(res)
    assert int(out[0]) < 24


def test_cpu_time_limit(engine, start):
    s = start("--cpu-limit", "1")
    res = s.execute("while True: pass", timeout_seconds=30)
    sc = res["structuredContent"]
    assert sc["timed_out"] is False
    assert "limit: cpu time exceeded" in text(res), text(res)


def test_read_only_root_and_tmpfs_sizes(engine, start):
    s = start("--tmp-size", "64M")
    script = """
import os
for p in ("/usr/evil", "/etc/evil", "/evil", "/.mps-drop"):
    try:
        open(p, "w").write("x")
        print("WROTE", p)
    except OSError as e:
        print("refused", p, e.errno)
open("/work/ok", "w").write("x")
open("/tmp/ok", "w").write("x")
st = os.statvfs("/tmp")
print("tmp", st.f_blocks * st.f_frsize)
try:
    with open("/tmp/fill", "wb") as f:
        for _ in range(100):
            f.write(b"\\0" * (1 << 20))
    print("FILLED")
except OSError as e:
    print("full", e.errno)
"""
    res = s.execute(script)
    out = res["structuredContent"]["stdout"]
    assert "WROTE" not in out, out
    assert out.count("refused") == 4
    tmp = int(next(l for l in out.splitlines() if l.startswith("tmp ")).split()[1])
    assert tmp == 64 << 20, out
    assert "full 28" in out and "FILLED" not in out


# ---------------------------------------------------------------- the network


class _Hello(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200)
        self.end_headers()
        self.wfile.write(b"hello-from-the-host")

    def log_message(self, *a):
        pass


@pytest.fixture
def host_http():
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Hello)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    yield srv.server_address[1]
    srv.shutdown()
    srv.server_close()


NET_SCRIPT = """
import socket, urllib.request
def get(url):
    try:
        return urllib.request.urlopen(url, timeout=10).read().decode()
    except Exception as e:
        return "ERR " + type(e).__name__
print("proxied", get("http://127.0.0.1:{port}/"))
print("other", get("http://127.0.0.2:{port}/"))
try:
    socket.create_connection(("127.0.0.1", {port}), timeout=3)
    print("direct CONNECTED")
except OSError as e:
    print("direct", e.errno)
try:
    socket.create_connection(("{host_ip}", {port}), timeout=3)
    print("host CONNECTED")
except OSError as e:
    print("host", e.errno)
print("ifaces", sorted(n for _, n in socket.if_nameindex()))
"""


def host_address():
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        s.connect(("192.0.2.1", 9))  # no packet is sent
        return s.getsockname()[0]
    except OSError:
        return "127.0.0.1"
    finally:
        s.close()


def test_egress_reaches_only_what_the_policy_allows(engine, start, host_http):
    s = start("--network-allow", f"127.0.0.1:{host_http}")
    script = NET_SCRIPT.format(port=host_http, host_ip=host_address())
    res = s.execute(script, network=True)
    out = res["structuredContent"]["stdout"]
    assert "proxied hello-from-the-host" in out, text(res)
    assert "other ERR" in out  # 127.0.0.2: loopback, denied by the proxy
    assert "direct 111" in out  # the container's own loopback: nothing listens there
    assert "host CONNECTED" not in out and "direct CONNECTED" not in out
    assert "ifaces ['lo']" in out
    net = res["structuredContent"]["network"]
    assert net["proxied"] is True and net["policy"] == "on"
    assert any(d["host"] == "127.0.0.2" for d in net["denied"]), net
    assert "network: denied 1 destination: 127.0.0.2" in text(res)
    # A call's list narrows: the allowed server is not on it, so it is denied too.
    res = s.execute(script, network=["93.184.216.34:80"])
    out = res["structuredContent"]["stdout"]
    assert "proxied ERR" in out, out
    assert res["structuredContent"]["network"]["policy"] == "rules"
    # Widening is refused with a clear error.
    res = s.execute("print(1)", network=["127.0.0.3:80"])
    assert res["isError"] and "refused" in text(res), text(res)


def test_no_network_without_the_proxy(engine, start, host_http):
    s = start("--network", "off")
    res = s.execute(NET_SCRIPT.format(port=host_http, host_ip=host_address()))
    out = res["structuredContent"]["stdout"]
    assert "proxied ERR" in out and "host CONNECTED" not in out and "direct CONNECTED" not in out, out
    assert "ifaces ['lo']" in out
    assert res["structuredContent"]["network"]["proxied"] is False
    # By default (network on) the proxy's is the only way: the host is unreachable directly.
    s2 = start()
    res = s2.execute(NET_SCRIPT.format(port=host_http, host_ip=host_address()), network=True)
    out = res["structuredContent"]["stdout"]
    assert "proxied ERR" in out and "host CONNECTED" not in out, out


# ---------------------------------------------------------------- killing


def test_timeout_removes_the_container(engine, start):
    s = start()
    t0 = time.monotonic()
    res = s.execute("import time\nprint('sleeping', flush=True)\ntime.sleep(120)", timeout_seconds=2)
    assert res["structuredContent"]["timed_out"] is True, text(res)
    assert time.monotonic() - t0 < 60
    assert wait_until(lambda: ours(engine) == [], timeout=30), ours(engine)


def test_graceful_timeout_reaches_the_script(engine, start):
    """The graceful half of a kill goes through the channel: the script sees SIGTERM."""
    s = start()
    script = """
import signal, sys, time
def bye(*a):
    print('got SIGTERM', flush=True)
    sys.exit(0)
signal.signal(signal.SIGTERM, bye)
print('ready', flush=True)
time.sleep(120)
"""
    # (the timeout must come after the handler is set: a container's start on a loaded machine
    # took more than the 2 s this had)
    res = s.execute(script, timeout_seconds=8)
    assert res["structuredContent"]["timed_out"] is True
    assert "ready" in res["structuredContent"]["stdout"], text(res)
    assert "got SIGTERM" in res["structuredContent"]["stdout"], text(res)


def test_a_script_ignoring_sigterm_is_removed_after_the_grace(engine, start, run_dir):
    s = start()
    script = "import signal, time\nsignal.signal(signal.SIGTERM, signal.SIG_IGN)\nprint('stubborn', flush=True)\ntime.sleep(120)"
    res = s.execute(script, timeout_seconds=2)
    assert res["structuredContent"]["timed_out"] is True, text(res)
    assert wait_until(lambda: ours(engine) == [], timeout=30), ours(engine)
    # The launcher was killed with the rest; the backend removed its channel directory.
    assert wait_until(lambda: os.listdir(run_dir) == [], timeout=10), os.listdir(run_dir)


def test_a_killed_servers_container_goes_with_it(engine, start, run_dir):
    """kill -9 of the server mid-run: its launcher dies with it (PR_SET_PDEATHSIG), the
    container's init sees its channel close and ends the script, and --rm removes the
    container; nothing of ours is left running."""
    s = start()
    s.send({"jsonrpc": "2.0", "id": "k", "method": "tools/call",
            "params": {"name": "execute_python", "arguments": {"details": True, "script": "import time\nprint('up', flush=True)\ntime.sleep(300)",
                                                               "timeout_seconds": 300}}})
    assert wait_until(lambda: ours(engine) != [], timeout=60)
    s.proc.kill()
    s.proc.wait(timeout=30)
    assert wait_until(lambda: ours(engine) == [], timeout=30), ours(engine)
    # What the killed server left on the host (its run's work directory) is swept by the next
    # server on the state directory.
    work = os.path.join(s.state_dir, "work")
    left = glob.glob(os.path.join(work, "srv-*"))
    assert left  # left behind by the crash...
    chans = os.listdir(run_dir)
    assert chans  # (the run's channel directory too)
    nxt = Server(backend=engine, state_dir=s.state_dir, env={"MPS_DOCKER": None, "MPS_DOCKER_RUN_DIR": run_dir})
    nxt.initialize()
    assert not any(os.path.exists(d) for d in left)  # ...and gone once the next server starts
    assert mounts_under(work + "/") == []
    res = nxt.probed_environment(timeout=120)  # the probe sweeps the channel directories
    assert res["structuredContent"]["sandbox_available"], text(res)
    assert os.listdir(run_dir) == [], os.listdir(run_dir)
    nxt.close()


def test_cancellation_removes_the_container(engine, start):
    s = start()
    marker = "mps-real-cancel-%d" % os.getpid()
    assert s.start_sleeping_call("long", marker, timeout=60)
    assert len(ours(engine)) == 1
    s.notify("notifications/cancelled", {"requestId": "long", "reason": "user"})
    assert wait_until(lambda: ours(engine) == [], timeout=30), ours(engine)
    assert s.request("ping")["result"] == {}


# ---------------------------------------------------------------- dependencies and files


@pytest.fixture(scope="module")
def wheels(tmp_path_factory):
    d = tmp_path_factory.mktemp("container-wheels")
    os.chmod(d, 0o755)
    wheelhouse.build_synthetic(str(d))
    for f in os.listdir(d):
        os.chmod(os.path.join(d, f), 0o644)
    p = str(d)
    while p != "/":
        os.chmod(p, os.stat(p).st_mode | 0o005)
        p = os.path.dirname(p)
    return str(d)


def test_dependencies_build_in_a_container_and_mount_read_only(engine, start, wheels):
    s = start("--find-links", wheels, "--offline", "--installer", "pip")
    names = sorted(os.listdir(wheels))
    dist = next(n.split("-")[0] for n in names if n.endswith(".whl"))
    script = f"""
import importlib.metadata, os, sys
print(sys.prefix)
print(importlib.metadata.version({dist.replace('_', '-')!r}))
try:
    open(os.path.join(sys.prefix, "evil"), "w")
    print("WROTE")
except OSError as e:
    print("ro", e.errno)
"""
    res = s.execute(script, dependencies=[dist.replace("_", "-")], timeout_seconds=240)
    sc = res["structuredContent"]
    assert sc["exit_code"] == 0, text(res)
    out = sc["stdout"].splitlines()
    assert out[0] == "/env", out
    assert out[2] == "ro 30", out
    assert sc["environment"] and sc["environment"]["packages"], sc
    assert sc["python"]["path"].startswith("/usr/bin/python3")


def test_a_host_uv_gives_way_to_the_images_pip(engine, start, wheels, tmp_path):
    """uv on the host, none in the image: --installer auto builds with the image's pip (the
    host's uv could not run in the container), and says so."""
    uv = tmp_path / "uv"
    uv.write_text("#!/bin/sh\necho 'host uv must not run' >&2\nexit 3\n")
    uv.chmod(0o755)
    s = start("--find-links", wheels, "--offline", "--uv-path", str(uv))
    dist = next(n.split("-")[0] for n in sorted(os.listdir(wheels)) if n.endswith(".whl"))
    res = s.execute("print('built')", dependencies=[dist.replace("_", "-")], timeout_seconds=240)
    sc = res["structuredContent"]
    assert sc["exit_code"] == 0 and sc["stdout"] == "built\n", text(res)
    assert sc["environment"]["packages"], sc
    env = s.call("check_environment", {})
    assert "pip (the image's own" in text(env), text(env)
    assert "image has no uv: environments are built with the image's pip" in s.stderr_text()


def test_files_in_and_out(engine, start):
    s = start()
    script = """
import os
data = open('data/in.txt').read()
os.makedirs('outputs', exist_ok=True)
open('outputs/out.txt', 'w').write(data.upper())
print('ok')
"""
    res = s.execute(script, files=[{"path": "data/in.txt", "content": "hello files"}])
    sc = res["structuredContent"]
    assert sc["exit_code"] == 0, text(res)
    files = sc.get("files") or []
    assert any(f.get("path", "").endswith("out.txt") for f in files), sc
    assert "out.txt" in text(res)


# ---------------------------------------------------------------- hostile scripts


def test_hostile_script_cannot_reach_the_channel_or_fake_a_status(engine, start):
    s = start("--memory-limit", "256M")
    script = """
import os, signal, socket, struct
# Nothing of the supervisor's is open here.
print("fds", sorted(os.listdir("/proc/self/fd")))
# The channel's socket is gone once the supervisor connected.
try:
    print("channel", os.listdir("/.mps-channel"))
except OSError as e:
    print("channel", e.errno)
try:
    c = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    c.connect("/.mps-channel/channel")
    print("CONNECTED")
except OSError as e:
    print("connect", e.errno)
# The supervisor (pid 1) cannot be signalled, traced or read.
for sig in (signal.SIGKILL, signal.SIGTERM, signal.SIGSTOP):
    try:
        os.kill(1, sig)
    except OSError as e:
        print("kill", e.errno)
for p in ("/proc/1/environ", "/proc/1/mem"):
    try:
        open(p, "rb").read(1)
        print("READ", p)
    except OSError as e:
        print("read", e.errno)
print("caps", [l for l in open("/proc/self/status") if l.startswith("CapEff")][0].split()[1])
os._exit(7)
"""
    res = s.execute(script)
    sc = res["structuredContent"]
    out = sc["stdout"]
    assert "channel []" in out or "channel 13" in out, out
    assert "CONNECTED" not in out and "READ" not in out, out
    assert "fds ['0', '1', '2', '3']" in out  # 3: listdir's own
    assert "caps 0000000000000000" in out
    # Pid 1 survived all of it and reported the script's own exit code.
    assert sc["exit_code"] == 7, text(res)
    assert "could not confirm" not in text(res)


def test_hostile_script_cannot_escape_the_work_directory(engine, start):
    s = start()
    script = """
import os
print(os.listdir("/"))
print(open("/etc/hostname").read().strip())
try:
    os.symlink("/etc/shadow", "/work/shadow")
    print(len(open("/work/shadow").read()))
except OSError as e:
    print("shadow", e.errno)
"""
    res = s.execute(script)
    out = res["structuredContent"]["stdout"]
    assert "shadow 13" in out or "shadow 2" in out, out  # unreadable (the image's) or absent
    assert "root" not in out.splitlines()[-1]


def test_kernel_surface_refused(engine, start):
    """The native filter's table, as the container's seccomp profile: user namespaces (podman's
    default profile allowed them), io_uring (docker's did), keyrings and file watches are
    refused with the same errno as under bubblewrap (test_hostile.py runs the same probes)."""
    s = start()
    res = s.execute(policy_probes.SCRIPT, timeout_seconds=60)
    policy_probes.check(res)
    # The profile is the server's own file, in its state directory, and nobody else's to read.
    profiles = glob.glob(os.path.join(s.state_dir, "sandbox", "seccomp-*.json"))
    assert len(profiles) == 1, profiles
    assert os.stat(profiles[0]).st_mode & 0o777 == 0o600
    assert os.stat(os.path.dirname(profiles[0])).st_mode & 0o777 == 0o700


def test_runs_do_not_share_a_uid(engine, start):
    """Concurrent and successive runs each have a uid of their own (as root): RLIMIT_NPROC,
    files and the kernel's per-uid state (the user keyring, which podman's runs shared as uid
    65534 until reboot) are the run's alone."""
    if os.geteuid() != 0:
        pytest.skip("not root: containers run as the server's own uid")
    s = start("--max-processes", "16")
    script = "import os, time\nprint(os.getuid())\ntime.sleep(1)\n"
    for i in range(2):
        s.send({"jsonrpc": "2.0", "id": f"u{i}", "method": "tools/call",
                "params": {"name": "execute_python", "arguments": {"details": True, "script": script}}})
    answers, deadline = {}, time.monotonic() + 180
    while len(answers) < 2:  # in either order
        msg = s.recv(timeout=max(1, deadline - time.monotonic()))
        if isinstance(msg, dict) and msg.get("id") in ("u0", "u1"):
            answers[msg["id"]] = msg["result"]["structuredContent"]
    uids = [int(a["stdout"]) for a in answers.values()]
    uids.append(int(s.execute("import os; print(os.getuid())")["structuredContent"]["stdout"]))
    for uid in uids:
        assert_run_uid(uid)
    assert len(set(uids)) == 3, uids


class _Index(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *a):
        pass


def test_build_reaches_a_loopback_index_through_the_proxy(engine, start, wheels, tmp_path):
    """The build runs in a container of its own with --network none: the index on the host's
    loopback is reachable only as the index host the proxy allows for builds."""
    root = tmp_path / "index"
    wheelhouse.index_layout(wheels, str(root))
    handler = lambda *a, **kw: _Index(*a, directory=str(root), **kw)  # noqa: E731
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    port = httpd.server_address[1]
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    try:
        s = start("--index-url", f"http://127.0.0.1:{port}/simple", "--installer", "pip",
                  env={"PIP_INDEX_URL": None, "PIP_EXTRA_INDEX_URL": None, "PIP_FIND_LINKS": None})
        res = s.execute("import mps_beta\nprint(mps_beta.ALPHA)", dependencies=["mps-beta"],
                        timeout_seconds=240, timeout=300)
        assert res["structuredContent"]["stdout"] == "2.0\n", text(res)
        # A script of the same server cannot reach that index: it is not in its policy.
        res = s.execute(f"import urllib.request\ntry:\n    urllib.request.urlopen('http://127.0.0.1:{port}/simple/', timeout=10)\n"
                        "    print('REACHED')\nexcept Exception as e:\n    print('denied', type(e).__name__)",
                        network=True)
        assert "denied" in res["structuredContent"]["stdout"], text(res)
    finally:
        httpd.shutdown()
        httpd.server_close()


# ---------------------------------------------------------------- the escape battery

@pytest.fixture(scope="module", params=ENGINES or ["none"])
def hostile(request, tmp_path_factory):
    """test_hostile.py's server (the same limits, a host secret in root's home and in the
    server's environment) on a container engine: its probes run here unchanged."""
    engine = request.param
    run_dir = str(tmp_path_factory.mktemp("hostile-runs"))
    with open(test_hostile.SECRET_FILE, "w") as f:
        f.write(test_hostile.SECRET)
    os.chmod(test_hostile.SECRET_FILE, 0o644)
    s = Server("--network", "off", "--tmp-size", "16M", "--max-file-size", "8M", "--max-processes", "64",
               "--memory-limit", "512M", backend=engine,
               env={"MPS_TEST_SECRET": test_hostile.SECRET, "MPS_DOCKER_RUN_DIR": run_dir, "MPS_DOCKER": None})
    try:
        s.initialize()
        res = s.probed_environment(timeout=120)
        assert res["structuredContent"]["sandbox_available"], res["content"][0]["text"]
        s.execute("pass")  # warm up before measuring memory
        s.rss_before = s.rss_kib("VmRSS")
        yield s
    finally:
        os.unlink(test_hostile.SECRET_FILE)
        s.close()
    assert wait_until(lambda: ours(engine) == [], timeout=30), ours(engine)
    assert os.listdir(run_dir) == []


# test_hostile.py's probes, each as it is there, against the fixture above (pytest resolves
# `hostile` in this module): the same answers on docker and podman as on bubblewrap.  Its
# tests of bubblewrap's own flags (--network host, --work-size) are not here.
HOSTILE_PROBES = [name for name in dir(test_hostile) if name.startswith("test_")
                  and "hostile" in test_hostile.__dict__[name].__code__.co_varnames[
                      :test_hostile.__dict__[name].__code__.co_argcount]]
for _name in HOSTILE_PROBES:
    globals()["test_hostile_" + _name[len("test_"):]] = test_hostile.__dict__[_name]
del _name


RESOLVER_FILES = "print(open('/etc/hosts').read()); print('---'); print(open('/etc/resolv.conf').read())"


def _host_resolver_words():
    """Names, addresses and search domains of the host's resolver files (a sandbox must see
    none of them): everything but localhost's."""
    words = set()
    for path in ("/etc/hosts", "/etc/resolv.conf"):
        try:
            with open(path) as f:
                for line in f:
                    line = line.split("#", 1)[0].split()
                    if line and line[0] in ("nameserver", "search", "domain"):
                        line = line[1:]
                    words.update(line)
        except OSError:
            pass
    return words - {"localhost", "127.0.0.1", "::1", "ip6-localhost", "ip6-loopback",
                    "ip6-localnet", "ip6-mcastprefix", "ip6-allnodes", "ip6-allrouters",
                    "fe00::0", "ff00::0", "ff02::1", "ff02::2", "options"}


def test_a_networked_container_gets_resolver_files_of_its_own(engine, start):
    """As under bubblewrap (issue 30, 9): a networked container's /etc/hosts names localhost
    and the sandbox alone, and its resolv.conf nothing of the host (the engines copied the
    host's resolvers and search domains, and podman's hosts named the host); a container
    without network gets the same files."""
    s = start()
    host_words = _host_resolver_words()
    for network in (True, False):
        res = s.execute(RESOLVER_FILES, network=network)
        sc = res["structuredContent"]
        assert sc["exit_code"] == 0, text(res)
        hosts, resolv = sc["stdout"].split("---\n", 1)
        entries = [line.split() for line in hosts.splitlines() if line.strip()]
        assert entries == [["127.0.0.1", "localhost"], ["::1", "localhost", "ip6-localhost", "ip6-loopback"],
                           ["127.0.1.1", "sandbox"]], hosts
        leaked = {w for w in host_words if w in sc["stdout"].split()}
        assert not leaked, (leaked, sc["stdout"])
        servers = [line.split()[1] for line in resolv.splitlines() if line.startswith("nameserver")]
        assert servers == ["127.0.0.1"], resolv
        assert not any(line.startswith(("search", "domain")) for line in resolv.splitlines()), resolv

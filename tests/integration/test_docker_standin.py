"""The real server with `--sandbox-backend docker`, against a stand-in docker client.

No Docker engine runs on our machines: tests/fixtures/docker-standin plays the client (see
its docstring).  It records every call, so these tests check what the server asks of
docker end to end: the probe, `docker run` with the isolation flags and exactly the
script's environment, a run's output and exit code coming back, and the container killed
and removed by name on timeout and cancellation."""
import json
import os
import shutil
import tempfile
import time

import pytest

from conftest import Server, processes_with_marker, wait_until

STANDIN = os.path.join(os.path.dirname(__file__), "..", "fixtures", "docker-standin")
SECRET = "hunter2-docker-itest-secret"
IMAGE = "mcp-python-exec-sandbox:py3.12"


class Standin:
    """A private copy of the stand-in: its directory holds its switches and records."""

    def __init__(self, tmp_path):
        self.dir = str(tmp_path / "standin")
        os.makedirs(self.dir)
        self.path = os.path.join(self.dir, "docker-standin")
        shutil.copy(STANDIN, self.path)
        os.chmod(self.path, 0o755)

    def switch(self, name, content=""):
        with open(os.path.join(self.dir, name), "w") as f:
            f.write(content)

    def calls(self):
        try:
            with open(os.path.join(self.dir, "calls.jsonl")) as f:
                return [json.loads(line) for line in f if line.strip()]
        except FileNotFoundError:
            return []

    def runs(self):
        """The runs of scripts (not the probe's trial container, which has no name)."""
        return [c["argv"] for c in self.calls() if c["argv"][:1] == ["run"] and "--name" in c["argv"]]

    def termed(self, name):
        """The graceful stop reached the container through the supervisor's channel."""
        return os.path.exists(os.path.join(self.dir, "containers", name + ".term"))

    def has_call(self, *words):
        return any(c["argv"][:len(words)] == list(words) for c in self.calls())

    def kill_leftovers(self):
        cdir = os.path.join(self.dir, "containers")
        if not os.path.isdir(cdir):
            return
        for entry in os.listdir(cdir):
            if entry.endswith(".pid"):
                try:
                    with open(os.path.join(cdir, entry)) as f:
                        os.kill(int(f.read()), 9)
                except (OSError, ValueError):
                    pass


@pytest.fixture
def standin(tmp_path):
    if not os.access("/usr/bin/python3", os.X_OK):
        pytest.skip("the stand-in docker client needs /usr/bin/python3")
    s = Standin(tmp_path)
    # A state directory every uid can walk to: the stand-in runs the "container" on the
    # host, where the script's uid must reach the work directory that a real container
    # would get by a bind mount.
    s.state_root = tempfile.mkdtemp(prefix="mps-docker-itest-")
    os.chmod(s.state_root, 0o755)
    yield s
    s.kill_leftovers()
    shutil.rmtree(s.state_root, ignore_errors=True)


def start(standin, *args):
    env = {"MPS_DOCKER": standin.path, "MPS_TEST_DOCKER_SECRET": SECRET,
           "DOCKER_HOST": "unix:///nonexistent/mps-itest-docker.sock", "MPS_DOCKER_IMAGE": ""}
    state = tempfile.mkdtemp(prefix="state-", dir=standin.state_root)
    os.chmod(state, 0o755)
    s = Server(*args, backend="docker", state_dir=state, env=env)
    s.initialize()
    return s


def check_environment(s):
    res = s.probed_environment()
    sc = res["structuredContent"]
    if "built without the docker backend" in sc["sandbox_status"]:
        s.close()
        pytest.skip("this binary was built without the docker backend")
    return res, sc


def value_after(argv, flag):
    return [argv[i + 1] for i, a in enumerate(argv[:-1]) if a == flag]


def test_check_environment_says_docker(standin):
    s = start(standin)
    try:
        res, sc = check_environment(s)
        assert sc["sandbox_backend"] == "docker"
        assert sc["sandbox_available"] is True
        assert "docker engine 27.5.1-standin" in sc["sandbox_status"]
        assert IMAGE in sc["sandbox_status"]
        text = res["content"][0]["text"]
        assert "Sandbox backend: docker\n" in text
        assert "Sandbox available: yes" in text
        assert standin.has_call("version", "--format", "{{.Server.Version}}")
        assert standin.has_call("image", "inspect")
        assert not standin.has_call("pull")
    finally:
        s.close()


def test_missing_image_is_unavailable_and_refuses(standin):
    standin.switch("image-missing")
    s = start(standin)
    try:
        res, sc = check_environment(s)
        assert sc["sandbox_available"] is False
        assert f"docker build -t {IMAGE} profiles/" in sc["sandbox_status"]
        assert "Sandbox available: no" in res["content"][0]["text"]
        res = s.execute("print('never')")
        assert res["isError"] is True
        assert "not available" in res["content"][0]["text"]
        assert standin.runs() == []
    finally:
        s.close()


def test_execute_end_to_end(standin):
    s = start(standin, "--network", "off")
    try:
        check_environment(s)
        script = ("import os, sys\n"
                  "print('hello from docker', os.getuid())\n"
                  "print('ENV', sorted(os.environ))\n"
                  "print('oops', file=sys.stderr)\n"
                  "sys.exit(4)\n")
        res = s.execute(script)
        sc = res["structuredContent"]
        assert sc["exit_code"] == 4, res
        assert sc["sandbox"] == "docker"
        assert "hello from docker" in sc["stdout"] and "oops" in sc["stderr"]
        assert SECRET not in sc["stdout"] and "MPS_TEST_DOCKER_SECRET" not in sc["stdout"]
        if os.geteuid() == 0:
            # A uid of its own per run (sandbox/uids.c), as bwrap's runs.
            uid = int(sc["stdout"].split("hello from docker ")[1].split()[0])
            assert 2000000000 <= uid < 2000000000 + (1 << 27), sc["stdout"]

        runs = standin.runs()
        assert len(runs) == 1
        argv = runs[0]
        for flag in ("--rm", "--read-only", "--interactive=false"):
            assert flag in argv
        # The supervisor (drop.c) is pid 1 instead of docker's --init.
        assert "--init" not in argv
        assert value_after(argv, "--entrypoint") == ["/.mps-drop"]
        assert value_after(argv, "--network") == ["none"]
        assert value_after(argv, "--cap-drop") == ["ALL"]
        opts = value_after(argv, "--security-opt")
        assert opts[0] == "no-new-privileges" and len(opts) == 2, opts
        # The native policy as an OCI profile, in the state directory, readable by us alone.
        profile = opts[1][len("seccomp="):]
        assert opts[1].startswith("seccomp=") and profile.startswith(s.state_dir + "/sandbox/seccomp-")
        assert os.stat(profile).st_mode & 0o777 == 0o600
        assert os.stat(os.path.dirname(profile)).st_mode & 0o777 == 0o700
        with open(profile) as f:
            policy = json.load(f)
        assert policy["defaultAction"] == "SCMP_ACT_ALLOW"
        denied = {n for e in policy["syscalls"] for n in e["names"]}
        assert {"unshare", "io_uring_setup", "add_key", "keyctl", "inotify_init1"} <= denied
        assert value_after(argv, "--pull") == ["never"]
        assert value_after(argv, "-w") == ["/work"]
        assert value_after(argv, "--memory") == value_after(argv, "--memory-swap")
        assert any(v.startswith("/tmp:rw,nosuid,nodev,size=") for v in value_after(argv, "--tmpfs"))
        assert any(v.endswith(":/work:rw") for v in value_after(argv, "-v"))
        user = value_after(argv, "--user")[0]
        assert not user.startswith("0:")
        if os.geteuid() == 0:
            assert user == f"{uid}:{uid}"
        # The container's environment is the server's fixed list, nothing of its own.
        env = value_after(argv, "--env")
        assert env and all("=" in e for e in env)
        assert not any(SECRET in a for a in argv)
        assert not any(e.startswith(("MPS_", "DOCKER_", "HOME=")) for e in env)
        image_at = argv.index(IMAGE)
        assert argv[image_at + 1:image_at + 4] == ["--connect", "/.mps-channel/channel", "--"]
        assert argv[image_at + 4].startswith("/usr/local/bin/python3")
        assert argv[image_at + 5:] == ["-s", "/opt/mps/runner.py", "script.py"]
        # The client itself got only what it needs to reach the engine.
        for call in standin.calls():
            assert "MPS_TEST_DOCKER_SECRET" not in call["env"]
            assert "DOCKER_HOST" in call["env"]
        # Removed by name after the run, in case --rm did not happen.
        name = value_after(argv, "--name")[0]
        assert wait_until(lambda: standin.has_call("rm", "-f", name), timeout=10)

        # Network on: still no network of the engine's, only the egress forwarder (the
        # supervisor, on port 3128 of the container's loopback), and a new name.
        s2 = start(standin, "--network", "on")
        try:
            res = s2.execute("print('net')")
            assert res["structuredContent"]["exit_code"] == 0, res
            argv2 = standin.runs()[-1]
            assert value_after(argv2, "--network") == ["none"]
            assert value_after(argv2, "--egress-port") == ["3128"]
            text = res["content"][0]["text"]
            assert "egress policy yet" not in text
            assert res["structuredContent"]["network"]["policy"] == "on"
            assert res["structuredContent"]["network"]["proxied"] is True
            env_text = s2.call("check_environment")["content"][0]["text"]
            assert "egress proxy yet" not in env_text
            assert value_after(argv2, "--name") != [name]
        finally:
            s2.close()
    finally:
        s.close()


@pytest.mark.serial  # the stand-in's engine answers slowly beside other tests (a tool error)
def test_timeout_kills_the_container_by_name(standin):
    s = start(standin)
    try:
        check_environment(s)
        t0 = time.monotonic()
        res = s.execute("import time\nprint('sleeping', flush=True)\ntime.sleep(60)", timeout_seconds=1)
        elapsed = time.monotonic() - t0
        sc = res["structuredContent"]
        assert sc["timed_out"] is True, res
        # The one bound is the feature, with a loaded machine's margin: the container never ran
        # its 60 s.
        assert elapsed < 40
        name = value_after(standin.runs()[-1], "--name")[0]
        # The graceful half through the supervisor's channel (pid 1 of a container ignores a
        # SIGTERM from `docker kill`), the rest by name.
        assert standin.termed(name)
        assert wait_until(lambda: standin.has_call("rm", "-f", name), timeout=10)
    finally:
        s.close()


def test_cancellation_kills_the_container_by_name(standin):
    s = start(standin)
    try:
        check_environment(s)
        marker = "mps-docker-cancel-%d" % os.getpid()
        assert s.start_sleeping_call("long", marker)
        name = value_after(standin.runs()[-1], "--name")[0]
        s.notify("notifications/cancelled", {"requestId": "long", "reason": "user"})
        assert wait_until(lambda: standin.termed(name), timeout=10)
        assert wait_until(lambda: standin.has_call("rm", "-f", name), timeout=10)
        assert s.request("ping")["result"] == {}
        assert all(m.get("id") != "long" for m in s.stray)
    finally:
        s.close()


@pytest.mark.serial  # what it sees while probing must come within the probe's 5 s
def test_a_hanging_engine_does_not_block_the_server(standin):
    """The probe runs on the event loop: while `docker version` hangs, the server answers,
    check_environment says "probing", and a call that needs the sandbox waits for the
    probe's outcome (here: the engine did not answer in time) instead of failing early."""
    standin.switch("engine-hangs")
    s = start(standin)
    try:
        assert wait_until(lambda: standin.has_call("version", "--format", "{{.Server.Version}}"), timeout=10)
        assert s.request("ping")["result"] == {}
        res = s.call("check_environment")
        sc = res["structuredContent"]
        assert sc["sandbox_probing"] is True and sc["sandbox_available"] is False, sc
        assert "Sandbox available: probing" in res["content"][0]["text"]
        # Sent while probing: answered once the probe has given up on the engine.
        s.send({"jsonrpc": "2.0", "id": "waits", "method": "tools/call",
                "params": {"name": "execute_python", "arguments": {"details": True, "script": "print('never')"}}})
        assert s.request("tools/list")["result"]["tools"]
        res = s.recv_response("waits", timeout=60)["result"]
        assert res["isError"] is True
        assert "did not finish within" in res["content"][0]["text"], res
        assert standin.runs() == []
        sc = s.probed_environment()["structuredContent"]
        assert sc["sandbox_probing"] is False and sc["sandbox_available"] is False
        # The hung client was killed, not left behind.
        assert wait_until(lambda: not processes_with_marker(standin.path), timeout=10)
    finally:
        s.close()

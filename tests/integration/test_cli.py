"""Flags, environment variables and the seed's validation messages."""
import os
import subprocess

import pytest

from conftest import BINARY


def run(*args, env=None):
    return subprocess.run([BINARY, *args], capture_output=True, text=True, timeout=10, env=env,
                          stdin=subprocess.DEVNULL)


@pytest.mark.parametrize("args,message", [
    (["--max-timeout", "0"], "max_timeout must be >= 1"),
    (["--default-timeout", "0"], "default_timeout must be between"),
    (["--max-timeout", "10", "--default-timeout", "20"], "default_timeout must be between 1 and 10"),
    (["--max-output-bytes", "100"], "max_output_bytes must be >= 1024"),
    (["--sandbox-backend", "invalid"], "Invalid sandbox_backend 'invalid', must be one of ('native', 'docker', 'podman', 'none')"),
    (["--max-timeout", "abc"], "invalid int value: 'abc'"),
    (["--bogus"], "unrecognized arguments: --bogus"),
    (["--max-timeout"], "expected one argument"),
    (["--cpus", "abc"], "argument --cpus: invalid value: 'abc' (a number of CPUs"),
    (["--cpus", "1.5.2"], "argument --cpus: invalid value"),
    (["--cpus", "-1"], "argument --cpus: invalid value"),
    (["--cpus", "5000"], "argument --cpus: invalid value"),
    (["--cgroup", "relative/dir"], "Invalid cgroup 'relative/dir', must be 'auto', 'off' or an absolute path"),
    (["--network", "maybe"], "argument --network: invalid choice: 'maybe' (choose from 'on', 'off', 'host')"),
    (["--network-allow", "a..b"], "argument --network-allow: network rule 'a..b' is not a host name"),
    (["--network-deny", "10.0.0.0/33"], "argument --network-deny: network rule '10.0.0.0/33'"),
    (["--build-network-allow", "*."], "argument --build-network-allow: network rule '*.'"),
    (["--dns-server", "dns.example"], "argument --dns-server: invalid value: 'dns.example'"),
    (["--dns-server", "10.0.0.0/8"], "argument --dns-server: invalid value"),
    (["--network-max-connections", "0"], "network_max_connections must be >= 1"),
    (["--profile", "lan", "--network", "host"], "--network host is refused with the lan profile"),
])
def test_validation(args, message):
    r = run(*args)
    assert r.returncode == 2
    assert message in r.stderr
    assert r.stdout == ""


def test_help_and_version():
    r = run("--help")
    assert r.returncode == 0
    for flag in ["--python-version", "--sandbox-backend", "--max-timeout", "--default-timeout",
                 "--max-output-bytes", "--no-warm-cache", "--uv-path"]:
        assert flag in r.stdout
    r = run("--version")
    assert r.returncode == 0 and r.stdout.startswith("mcp-python-exec-sandbox ")
    # Then where the helpers come from: a build directory's own (the installed tree's are
    # checked by tests/package/test-deb.sh).
    lines = dict(l.split(": ", 1) for l in r.stdout.splitlines()[1:])
    here = os.path.dirname(os.path.realpath(BINARY))
    assert lines["drop helper"] == os.path.join(here, "mps-sandbox-drop"), lines
    assert lines["start-up runner"] == os.path.join(here, "mps-runner", "runner.py"), lines
    assert lines["profiles"] == os.path.join(here, "profiles"), lines
    env = dict(os.environ, MPS_RUNNER="/nonexistent/runner.py")
    r = run("--version", env=env)
    assert "start-up runner: /nonexistent/runner.py (MPS_RUNNER)" in r.stdout, r.stdout


def _elf_has_interpreter(path):
    """Whether an ELF64 file asks for a dynamic loader (a PT_INTERP program header)."""
    import struct
    with open(path, "rb") as f:
        data = f.read()
    assert data[:4] == b"\x7fELF" and data[4] == 2, path
    phoff, = struct.unpack_from("<Q", data, 0x20)
    phentsize, phnum = struct.unpack_from("<HH", data, 0x36)
    return any(struct.unpack_from("<I", data, phoff + i * phentsize)[0] == 3 for i in range(phnum))


def test_the_drop_helper_is_static():
    """The drop helper runs twice in every call's sandbox set-up: linked statically, it skips
    the dynamic loader (not in a sanitizer build, whose runtimes are shared libraries)."""
    with open(BINARY, "rb") as f:
        if b"libasan" in f.read():
            pytest.skip("a sanitizer build: the helper is linked dynamically")
    helper = os.path.join(os.path.dirname(os.path.realpath(BINARY)), "mps-sandbox-drop")
    if not os.path.exists(helper):
        pytest.skip("no drop helper next to the binary")
    assert not _elf_has_interpreter(helper), "mps-sandbox-drop asks for a dynamic loader"
    assert _elf_has_interpreter(BINARY)  # (the check itself: the server is dynamic)


def test_environment_variables_and_override():
    import os
    env = dict(os.environ, MCP_PY_SANDBOX_MAX_TIMEOUT="0")
    r = run(env=env)
    assert r.returncode == 2 and "max_timeout must be >= 1" in r.stderr and "MCP_PY_SANDBOX" not in r.stderr
    env = dict(os.environ, MCP_PY_SANDBOX_MAX_OUTPUT_BYTES="x")
    r = run(env=env)
    assert r.returncode == 2 and "MCP_PY_SANDBOX_MAX_OUTPUT_BYTES" in r.stderr
    # the flag wins over the environment
    env = dict(os.environ, MCP_PY_SANDBOX_MAX_TIMEOUT="0")
    r = subprocess.run([BINARY, "--max-timeout", "5", "--default-timeout", "5", "--sandbox-backend", "none"],
                       input="", capture_output=True, text=True, timeout=10, env=env)
    assert r.returncode == 0


def test_profiles(tmp_path):
    import json
    for name in ["default", "offline", "lan"]:
        r = subprocess.run([BINARY, "--profile", name, "--sandbox-backend", "none", "--state-dir", str(tmp_path)],
                           input="", capture_output=True, text=True, timeout=10)
        assert r.returncode == 0, r.stderr
    bad = tmp_path / "bad.toml"
    bad.write_text("bogus = 1\n")
    r = run("--profile", str(bad))
    assert r.returncode == 2 and "unknown setting 'bogus'" in r.stderr
    bad.write_text("network = \n")
    r = run("--profile", str(bad))
    assert r.returncode == 2 and "line 1" in r.stderr
    r = run("--profile", "nope")
    assert r.returncode == 2 and "profile 'nope' not found" in r.stderr
    # the profile's values apply, and flags override them
    from conftest import Server

    def env_text(*args):
        srv = Server(*args, backend="none")
        srv.initialize()
        t = srv.probed_environment()["content"][0]["text"]
        srv.close()
        return t
    t = env_text("--profile", "lan")
    assert "Max timeout: 120s" in t and "Network: off" in t and "Profile: lan" in t
    t = env_text("--profile", "lan", "--max-timeout", "200")
    assert "Max timeout: 200s" in t


def test_relative_state_dir_is_resolved_at_start(tmp_path):
    """A relative --state-dir (and one with "..") is resolved against the directory the
    server starts in: calls work, and the state lands there."""
    from conftest import BACKEND, Server
    start = tmp_path / "start"
    start.mkdir()
    for given, where in (("rel/state", start / "rel" / "state"),
                         ("../up/./state/", tmp_path / "up" / "state")):
        srv = Server(backend=BACKEND, state_dir=given, cwd=str(start))
        try:
            srv.initialize()
            res = srv.execute("print('relative ok')")
            assert not res.get("isError"), res
            assert "relative ok" in res["content"][0]["text"]
            # the work directory of this server is under the resolved directory
            assert (where / "work").is_dir()
            assert any(e.startswith("srv-") for e in os.listdir(where / "work"))
            assert f"state directory: {where}" in srv.stderr_text()
        finally:
            srv.close()

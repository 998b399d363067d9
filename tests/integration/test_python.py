"""Several Python versions side by side: discovery, identity cache, per-call selection."""
import glob
import json
import os
import re
import stat
import time

import pytest

from conftest import Server


def pyenv_versions():
    root = os.environ.get("PYENV_ROOT") or os.path.expanduser("~/.pyenv")
    found = {}
    for d in sorted(glob.glob(os.path.join(root, "versions", "3.*"))):
        name = os.path.basename(d)
        if re.fullmatch(r"3\.\d+\.\d+", name) and os.access(os.path.join(d, "bin", "python"), os.X_OK):
            found[name] = d
    return found


def interpreters(server):
    return server.call("check_environment")["structuredContent"]["interpreters"]


@pytest.mark.parametrize("minor", [8, 9, 10, 11, 12, 13])
def test_each_pyenv_version_runs_on_request(server, minor):
    versions = [v for v in pyenv_versions() if v.startswith(f"3.{minor}.")]
    if not versions:
        pytest.skip(f"no pyenv CPython 3.{minor} on this machine")
    res = server.execute("import sys; print('%d.%d.%d' % sys.version_info[:3])", python_version=f"3.{minor}")
    sc = res["structuredContent"]
    assert sc["exit_code"] == 0, res["content"][0]["text"]
    got = sc["stdout"].strip()
    assert got.startswith(f"3.{minor}.")
    assert sc["python"]["version"] == got
    assert f"--- python: {got} (" in res["content"][0]["text"]


def test_exact_patch_version(server):
    pys = [p for p in interpreters(server) if p["ok"]]
    target = pys[-1]["version"]
    res = server.execute("import platform; print(platform.python_version())", python_version=target)
    assert res["structuredContent"]["stdout"].strip() == target


def test_specifier_newest_match_wins(server):
    pys = [p for p in interpreters(server) if p["ok"] and not p["free_threaded"]]
    wanted = [p["version"] for p in pys if p["version"].startswith(("3.9.", "3.10."))]
    if not wanted:
        pytest.skip("no 3.9/3.10 interpreter")
    newest = max(wanted, key=lambda v: tuple(int(x) for x in v.split(".")))
    res = server.execute("import platform; print(platform.python_version())", python_version=">=3.9,<3.11")
    assert res["structuredContent"]["stdout"].strip() == newest


def test_impossible_request_lists_available(server):
    res = server.execute("print(1)", python_version="3.99")
    assert res["isError"] is True
    t = res["content"][0]["text"]
    assert "No Python interpreter matches '3.99'" in t and "Available:" in t and "(default)" in t
    res = server.execute("print(1)", python_version="banana")
    assert res["isError"] is True and "not a Python version request" in res["content"][0]["text"]
    res = server.execute("print(1)", python_version="3.13t")
    if res["isError"]:
        assert "matches '3.13t'" in res["content"][0]["text"]


def test_default_is_newest_stable_and_flag_overrides(make_server):
    s = make_server()
    s.initialize()
    pys = [p for p in interpreters(s) if p["ok"]]
    default = [p for p in pys if p["default"]]
    assert len(default) == 1
    stable = [p for p in pys if p["implementation"] == "cpython" and not p["free_threaded"]]
    assert default[0]["version"] == stable[0]["version"]  # newest first
    versions = pyenv_versions()
    if any(v.startswith("3.12.") for v in versions):
        s2 = make_server("--python-version", "3.12")
        s2.initialize()
        res = s2.execute("import sys; print(sys.version_info[:2])")
        assert res["structuredContent"]["stdout"].strip() == "(3, 12)"
    s3 = make_server("--python", "/usr/bin/python3")
    s3.initialize()
    res = s3.execute("import sys; print(sys.executable)")
    assert res["structuredContent"]["stdout"].strip().startswith("/usr/bin/python3")


def write_fake_interpreter(path, version, log):
    """A stand-in interpreter that answers the identity probe with a made-up version and
    records each time it is asked."""
    with open(path, "w") as f:
        f.write(f"""#!/bin/sh
# Asked to compile the start-up runner (not an identity probe): refuse, the runs use runner.py.
case "$*" in *py_compile*) exit 1 ;; esac
echo probed >> {log}
echo '{{"version": "{version}", "implementation": "cpython", "releaselevel": "final", "executable": "{path}", "prefix": "/usr", "base_prefix": "/usr", "free_threaded": false}}'
""")
    os.chmod(path, 0o755)


def test_broken_interpreter_listed_never_used(make_server, tmp_path):
    bad = tmp_path / "bin"
    bad.mkdir()
    broken = bad / "python3.77"
    broken.write_text("#!/bin/sh\necho 'I am broken' >&2\nexit 3\n")
    broken.chmod(0o755)
    s = make_server(env={"PATH": f"{bad}:{os.environ['PATH']}"})
    s.initialize()
    pys = interpreters(s)
    entry = [p for p in pys if p.get("path") == str(broken)]
    assert entry and entry[0]["ok"] is False and "exit code 3" in entry[0]["error"]
    assert "broken: " + str(broken) in s.call("check_environment")["content"][0]["text"]
    res = s.execute("print(1)", python_version="3.77")
    assert res["isError"] is True
    assert s.execute("print(1)")["structuredContent"]["exit_code"] == 0


def test_identity_cache_and_invalidation(make_server, tmp_path):
    d = tmp_path / "pys"
    d.mkdir()
    log = tmp_path / "probes.log"
    fake = d / "python3.50"
    write_fake_interpreter(str(fake), "3.50.1", log)
    state = str(tmp_path / "state")

    def versions_seen():
        s = make_server("--python-dir", str(d), state_dir=state)
        s.initialize()
        vs = [p["version"] for p in interpreters(s) if p["ok"] and p["path"] == str(fake)]
        s.close()
        return vs

    assert versions_seen() == ["3.50.1"]
    assert log.read_text().count("probed") == 1
    # a warm start asks nobody again
    assert versions_seen() == ["3.50.1"]
    assert log.read_text().count("probed") == 1
    # the binary changes: it is asked again
    time.sleep(0.01)
    write_fake_interpreter(str(fake), "3.51.0", log)
    assert versions_seen() == ["3.51.0"]
    assert log.read_text().count("probed") == 2
    cache = json.load(open(os.path.join(state, "interpreters.json")))
    assert str(fake) in cache["interpreters"]


def test_python_version_argument_validation(server):
    for bad in [5, "", "x" * 300]:
        res = server.execute("print(1)", python_version=bad)
        assert res["isError"] is True


UV_DOWNLOAD_STANDIN = r'''#!/usr/bin/python3
# A stand-in for uv's `python install`: records the request and "installs" an interpreter
# that answers the identity probe as the requested version and runs the host's python3.
import json, os, sys
args = sys.argv[1:]
root = os.environ["UV_PYTHON_INSTALL_DIR"]
with open(os.path.join(os.path.dirname(root), "uv-calls.jsonl"), "a") as f:
    f.write(json.dumps(args) + "\n")
if args[:2] != ["python", "install"]:
    sys.exit(2)
version = args[2]
if version == "3.98":
    print("error: No download found for request: cpython-3.98", file=sys.stderr)
    sys.exit(1)
prefix = os.path.join(root, f"cpython-{version}.0-linux-x86_64-gnu")
os.makedirs(os.path.join(prefix, "bin"), exist_ok=True)
exe = os.path.join(prefix, "bin", f"python{version}")
with open(exe, "w") as f:
    f.write(f"""#!/bin/sh
if [ "$1" = "-I" ] && [ "$2" = "-c" ]; then
  echo '{{"version": "{version}.0", "implementation": "cpython", "releaselevel": "final", "executable": "{exe}", "prefix": "{prefix}", "base_prefix": "{prefix}", "free_threaded": false}}'
  exit 0
fi
exec /usr/bin/python3 "$@"
""")
os.chmod(exe, 0o755)
os.chmod(prefix, 0o755)
print(f"Installed Python {version}.0")
'''


def test_allow_python_downloads_with_uv(make_server, tmp_path):
    uv = tmp_path / "uv-standin"
    uv.write_text(UV_DOWNLOAD_STANDIN)
    uv.chmod(0o755)
    root = tmp_path / "uvpython"
    root.mkdir()
    env = {"UV_PYTHON_INSTALL_DIR": str(root)}
    # Without the flag: the error lists what is available, nothing is downloaded.
    s = make_server("--uv-path", str(uv), env=env)
    s.initialize()
    res = s.execute("print(1)", python_version="3.97")
    assert res["isError"] and "No Python interpreter matches '3.97'" in res["content"][0]["text"]
    assert not (tmp_path / "uv-calls.jsonl").exists()
    # With it: uv installs it, progress says so, and the script runs on it.
    s2 = make_server("--uv-path", str(uv), "--allow-python-downloads", env=env)
    s2.initialize()
    s2.send({"jsonrpc": "2.0", "id": "d", "method": "tools/call", "params": {
        "name": "execute_python", "arguments": {"details": True, "script": "print('ran')", "python_version": "3.97"},
        "_meta": {"progressToken": "p"}}})
    r = s2.recv_response("d", timeout=60)
    res = r["result"]
    assert res["structuredContent"]["stdout"] == "ran\n", res["content"][0]["text"]
    assert res["structuredContent"]["python"]["version"] == "3.97.0"
    assert any("downloading Python 3.97" in n["params"].get("message", "") for n in s2.notifications)
    calls = [json.loads(l) for l in open(tmp_path / "uv-calls.jsonl")]
    assert calls == [["python", "install", "3.97"]]
    # It is now listed, and a second call needs no download.
    assert any(p.get("version") == "3.97.0" for p in interpreters(s2))
    assert s2.execute("print(2)", python_version="3.97")["structuredContent"]["stdout"] == "2\n"
    assert len(open(tmp_path / "uv-calls.jsonl").readlines()) == 1
    # A version uv cannot provide: its own words come back.
    res = s2.execute("print(1)", python_version="3.98")
    assert res["isError"] and "No download found" in res["content"][0]["text"]

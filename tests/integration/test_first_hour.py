"""A new user's first hour (issue 38): Debian's own numpy and matplotlib import in the sandbox
and make a plot; a machine that cannot reach the package index gets one short paragraph
saying so and what to do; PIP_FIND_LINKS of the server's environment is mounted into the
build; with --offline none of the server's PIP_* variables reach the build, and the offline
profile means --offline; an interpreter without pip is said plainly; a script that hits a
name-resolution failure without network is told the network is off for its call.

No real internet: the index is "unreachable" because the test's own DNS responder on loopback
answers NXDOMAIN for every name (--dns-server); wheels are built locally (tests/fixtures)."""
import http.server
import json
import os
import shutil
import socket
import socketserver
import struct
import subprocess
import sys
import tempfile
import threading

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "fixtures"))
import wheelhouse  # noqa: E402

from conftest import BACKEND  # noqa: E402

NO_PIP_ENV = {"PIP_FIND_LINKS": None, "PIP_INDEX_URL": None, "PIP_EXTRA_INDEX_URL": None,
              "UV_FIND_LINKS": None, "UV_INDEX_URL": None, "UV_EXTRA_INDEX_URL": None}
SYSTEM_PYTHON = "/usr/bin/python3"
SECRET = "s3cr3t-first-hour-index-token"

needs_bwrap = pytest.mark.skipif(BACKEND != "bwrap", reason="the bwrap backend's sandbox (its /etc, "
                                                            "its network namespace, the egress proxy)")


def text(res):
    return res["content"][0]["text"]


@pytest.fixture(scope="module")
def wheels():
    d = tempfile.mkdtemp(prefix="mps-first-hour-wheels-")
    os.chmod(d, 0o755)  # builds run as an unprivileged uid
    wheelhouse.build_synthetic(d)
    yield d
    shutil.rmtree(d, ignore_errors=True)


class NxDomain:
    """A DNS responder on 127.0.0.1 that knows no name (NXDOMAIN to every query)."""

    def __init__(self):
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.sock.bind(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.queries = []
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self):
        while True:
            try:
                q, peer = self.sock.recvfrom(2048)
            except OSError:
                return
            try:
                i, labels = 12, []
                while q[i]:
                    labels.append(q[i + 1:i + 1 + q[i]].decode().lower())
                    i += 1 + q[i]
                self.queries.append(".".join(labels))
                self.sock.sendto(q[:2] + struct.pack(">HHHHH", 0x8183, 1, 0, 0, 0) + q[12:i + 5], peer)
            except Exception:
                pass

    def close(self):
        self.sock.close()


# ------------------------------------------------------------------ Debian's own packages

def _system_has(*modules):
    if not os.access(SYSTEM_PYTHON, os.X_OK):
        return False
    code = "import " + ", ".join(modules)
    return subprocess.run([SYSTEM_PYTHON, "-I", "-c", code], capture_output=True).returncode == 0


PLOT = r'''
import os, numpy, matplotlib
matplotlib.use("Agg")
import matplotlib.pyplot as plt
os.makedirs("outputs", exist_ok=True)
x = numpy.linspace(0, 6.28, 50)
plt.plot(x, numpy.sin(x))
plt.savefig("outputs/sine.png")
print(numpy.__file__, matplotlib.__file__)
'''


@needs_bwrap
@pytest.mark.skipif(not _system_has("numpy", "matplotlib"),
                    reason="Debian's python3-numpy and python3-matplotlib are not installed "
                           "(deploy/install-deps.sh --test installs them)")
def test_debian_numpy_and_matplotlib_make_a_png(make_server):
    s = make_server("--python", SYSTEM_PYTHON)
    s.initialize()
    res = s.execute(PLOT, timeout=180)
    sc = res["structuredContent"]
    # libblas.so.3 links through /etc/alternatives: without it, numpy's import fails here.
    assert sc["exit_code"] == 0, text(res)
    assert "/usr/lib/python3/dist-packages/numpy" in sc["stdout"], sc["stdout"]
    assert "outputs/sine.png" in [f["path"] for f in sc["files"]], text(res)
    images = [c for c in res["content"] if c["type"] == "image"]
    assert images and images[0]["mimeType"] == "image/png"
    import base64
    assert base64.b64decode(images[0]["data"])[:8] == b"\x89PNG\r\n\x1a\n"
    # check_environment says which interpreter sees the system's packages.
    t = text(s.call("check_environment"))
    line = [x for x in t.splitlines() if x.startswith("System packages")]
    assert line and os.path.realpath(SYSTEM_PYTHON) in line[0] and "the default" in line[0], t


# ------------------------------------------------------------------ no index reachable

@needs_bwrap
def test_unreachable_index_is_one_short_paragraph(make_server):
    dns = NxDomain()
    try:
        s = make_server("--dns-server", f"127.0.0.1:{dns.port}", env=NO_PIP_ENV)
        s.initialize()
        res = s.execute("import mps_nothing", dependencies=["mps-nothing-here"], timeout=300)
        t = text(res)
        assert res["isError"] is True
        assert "https://pypi.org/simple" in t and "cannot be resolved or reached from this server" in t, t
        assert "--find-links DIR --offline" in t and "--index-url" in t, t
        # One paragraph, not pip's retries.
        assert "Retrying" not in t and "ProxyError" not in t and len(t) < 1200, t
        assert "pypi.org" in dns.queries  # it did try, and only our responder heard it
    finally:
        dns.close()


class _Quiet(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *a):
        pass


@needs_bwrap
def test_a_packages_own_name_failure_keeps_its_wall(make_server):
    """The index answers (over loopback); the package's build backend fails to resolve a name
    of its own: that is the package's failure (its wall stays), not an unreachable index."""
    dns = NxDomain()
    d = tempfile.mkdtemp(prefix="mps-first-hour-index-")
    try:
        os.chmod(d, 0o755)
        files = os.path.join(d, "files")
        os.makedirs(files)
        wheelhouse.make_sdist(files, "mps-resolver", "1.0",
                              hostile="import socket\nsocket.getaddrinfo('nothing.test', 80)\n")
        root = os.path.join(d, "index")
        wheelhouse.index_layout(files, root)
        handler = lambda *a, **kw: _Quiet(*a, directory=root, **kw)  # noqa: E731
        httpd = socketserver.ThreadingTCPServer(("127.0.0.1", 0), handler)
        threading.Thread(target=httpd.serve_forever, daemon=True).start()
        try:
            s = make_server("--dns-server", f"127.0.0.1:{dns.port}",
                            "--index-url", f"http://127.0.0.1:{httpd.server_address[1]}/simple", env=NO_PIP_ENV)
            s.initialize()
            res = s.execute("import mps_resolver", dependencies=["mps-resolver"], timeout=300)
            t = text(res)
            assert res["isError"] is True
            assert "Temporary failure in name resolution" in t  # what would look like an unreachable index
            assert "cannot be resolved or reached" not in t and "subprocess-exited-with-error" in t, t
        finally:
            httpd.shutdown()
    finally:
        dns.close()
        shutil.rmtree(d, ignore_errors=True)


# ------------------------------------------------------------------ PIP_FIND_LINKS and --offline

ENV_DUMP = r'''
import json, os
FILES["mps_envdump/env.json"] = json.dumps(dict(os.environ))
'''


def _envdump_sdist(d):
    wheelhouse.make_sdist(d, "mps-envdump", "1.0", files={"mps_envdump/__init__.py": ""}, hostile=ENV_DUMP)


READ_ENV = r'''
import json, os, mps_envdump
print(open(os.path.join(os.path.dirname(mps_envdump.__file__), "env.json")).read())
'''


def test_pip_find_links_of_the_environment_is_mounted(make_server, wheels):
    # No flag: the server's PIP_FIND_LINKS is the wheel directory; the build must see it.
    s = make_server("--offline", env={**NO_PIP_ENV, "PIP_FIND_LINKS": wheels})
    s.initialize()
    res = s.execute("import mps_beta\nprint(mps_beta.ALPHA)", dependencies=["mps-beta"], timeout=180)
    assert res["structuredContent"]["stdout"] == "2.0\n", text(res)


def test_offline_keeps_the_servers_pip_variables_out_of_the_build(make_server):
    d = tempfile.mkdtemp(prefix="mps-first-hour-sdist-")
    try:
        os.chmod(d, 0o755)
        _envdump_sdist(d)
        env = {**NO_PIP_ENV,
               "PIP_INDEX_URL": f"http://builder:{SECRET}@127.0.0.1:9/simple",
               "PIP_EXTRA_INDEX_URL": f"http://builder:{SECRET}@127.0.0.1:9/extra",
               "HTTPS_PROXY": f"http://proxy-{SECRET}@127.0.0.1:9"}
        s = make_server("--offline", "--find-links", d, env=env)
        s.initialize()
        res = s.execute(READ_ENV, dependencies=["mps-envdump"], timeout=180)
        assert res["structuredContent"]["exit_code"] == 0, text(res)
        seen = json.loads(res["structuredContent"]["stdout"])
        leaked = sorted(k for k, v in seen.items() if SECRET in v or k in ("PIP_INDEX_URL", "PIP_EXTRA_INDEX_URL",
                                                                           "PIP_FIND_LINKS"))
        assert leaked == [], leaked
    finally:
        shutil.rmtree(d, ignore_errors=True)


def test_offline_profile_means_offline(make_server):
    s = make_server("--profile", "offline", env=NO_PIP_ENV)
    s.initialize()
    t = text(s.call("check_environment"))
    assert "Network: off" in t
    assert "; offline (no index" in t, t


# ------------------------------------------------------------------ pip missing

@pytest.fixture(scope="module")
def pipless_python():
    """A stand-in interpreter without pip: Debian's python3.X binary copied beside a link to
    its standard library, so its prefix has no dist-packages (and no pip)."""
    real = os.path.realpath(SYSTEM_PYTHON)
    if not os.access(real, os.X_OK):
        pytest.skip("no system python3 to copy")
    ver = subprocess.run([real, "-c", "import sys; print('%d.%d' % sys.version_info[:2])"],
                         capture_output=True, text=True).stdout.strip()
    stdlib = f"/usr/lib/python{ver}"
    if not os.path.isfile(os.path.join(stdlib, "os.py")):
        pytest.skip("the system python's standard library is not at " + stdlib)
    d = tempfile.mkdtemp(prefix="mps-pipless-")
    os.chmod(d, 0o755)
    os.makedirs(os.path.join(d, "bin"))
    os.makedirs(os.path.join(d, "lib"))
    exe = os.path.join(d, "bin", f"python{ver}")
    shutil.copy2(real, exe)
    os.symlink(stdlib, os.path.join(d, "lib", f"python{ver}"))
    os.chmod(os.path.join(d, "bin"), 0o755)
    os.chmod(os.path.join(d, "lib"), 0o755)
    if subprocess.run([exe, "-c", "import pip"], capture_output=True).returncode == 0:
        shutil.rmtree(d, ignore_errors=True)
        pytest.skip("the stand-in still finds a pip")
    yield exe
    shutil.rmtree(d, ignore_errors=True)


def test_pip_missing_is_said_plainly(make_server, wheels, pipless_python):
    s = make_server("--python", pipless_python, "--installer", "pip", "--find-links", wheels, "--offline",
                    env=NO_PIP_ENV)
    s.initialize()
    t = text(s.call("check_environment"))
    assert "it has no pip" in t and "apt-get install python3-pip" in t, t
    res = s.execute("import mps_alpha", dependencies=["mps-alpha"], timeout=180)
    t = text(res)
    assert res["isError"] is True
    assert f"the interpreter {pipless_python} has no pip" in t and "apt-get install python3-pip" in t, t
    assert "Traceback" not in t and "exit code" not in t, t
    # validate_script's resolution runs the interpreter's pip too.
    res = s.call("validate_script", {"script": "pass", "dependencies": ["mps-alpha"], "resolve": True},
                 timeout=180)
    t = text(res)
    assert f"the interpreter {pipless_python} has no pip" in t and "apt-get install python3-pip" in t, t


# ------------------------------------------------------------------ network off

@needs_bwrap
def test_name_resolution_failure_without_network_says_network_is_off(make_server):
    s = make_server()
    s.initialize()
    script = "import socket\nsocket.getaddrinfo('example.org', 443)\n"
    res = s.execute(script, network=False, timeout=60)
    t = text(res)
    assert res["structuredContent"]["exit_code"] != 0
    assert "gaierror" in res["structuredContent"]["stderr"]
    assert "the network is off for this call" in t, t
    # A script that fails otherwise gets no such note.
    res = s.execute("raise SystemExit('no network involved')", network=False, timeout=60)
    assert "the network is off" not in text(res)

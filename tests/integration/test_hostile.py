"""Hostile scripts through the real server and the bubblewrap sandbox: each is contained,
the server keeps serving, and afterwards no process, no directory and no memory is left."""
import os
import socket
import threading
import time

import pytest

from conftest import BACKEND, Server, daemon_script, descendants, processes_with_marker, wait_until, work_left
import policy_probes

pytestmark = pytest.mark.skipif(BACKEND == "none", reason="the none backend does not isolate")

SECRET = "mps-host-secret-%d" % os.getpid()
# Per test run: other sessions on the machine run these tests too.
SECRET_FILE = "/root/.mps-test-secret-%d" % os.getpid()


@pytest.fixture(scope="module")
def hostile():
    # A host secret in root's home and in the server's environment.
    secret_file = SECRET_FILE
    with open(secret_file, "w") as f:
        f.write(SECRET)
    os.chmod(secret_file, 0o644)
    s = Server("--network", "off", "--tmp-size", "16M", "--max-file-size", "8M", "--max-processes", "64",
               "--memory-limit", "512M", env={"MPS_TEST_SECRET": SECRET})
    s.initialize()
    s.execute("pass")  # warm up before measuring memory
    s.rss_before = s.rss_kib("VmRSS")
    yield s
    os.unlink(secret_file)
    s.close()


def run(s, script, **kw):
    res = s.execute(script, timeout=60, **kw)
    assert s.request("ping")["result"] == {}  # the server lives on
    return res["structuredContent"]


def test_host_files_unreadable(hostile):
    out = run(hostile, f"""
import os
for p in ['/etc/shadow', {SECRET_FILE!r}, '/root/.bashrc', '/home']:
    try:
        if os.path.isdir(p):
            print(p, 'LISTED', os.listdir(p))
        else:
            print(p, 'READ', open(p).read()[:20])
    except OSError as e:
        print(p, 'refused', e.errno)
print('checked all')
""")["stdout"]
    assert SECRET not in out and "READ" not in out, out
    assert out.count("refused") >= 3, out
    assert out.endswith("checked all\n"), out


def test_cannot_write_outside_work(hostile):
    out = run(hostile, """
import os
for p in ['/etc/x', '/usr/x', '/x', '/root/x', '/bin/x', '/opt/x']:
    try:
        open(p, 'w').write('x'); print('WROTE', p)
    except OSError as e:
        print('refused', p)
open('/work/ok', 'w').write('ok'); open('/tmp/ok', 'w').write('ok'); print('work ok')
""")["stdout"]
    assert "WROTE" not in out and "work ok" in out, out
    assert out.count("refused") == 6, out


def test_other_runs_and_state_invisible(hostile):
    state = hostile.state_dir
    out = run(hostile, f"""
import os
for p in [{state!r}, {state + '/work'!r}, {state + '/envs'!r}]:
    print(p, os.path.exists(p))
print(os.listdir('/'))
print('looked')
""")["stdout"]
    assert "True" not in out, out
    # It ran and looked: three answers, the root listing, the end marker.
    assert out.count(" False\n") == 3 and "'work'" in out and out.endswith("looked\n"), out


def test_symlink_to_host_file(hostile):
    out = run(hostile, f"""
import os
os.symlink('/etc/shadow', 'link'); os.symlink({SECRET_FILE!r}, 'link2')
for l in ['link', 'link2']:
    try:
        print(open(l).read()[:10])
    except OSError as e:
        print('refused', e.errno)
print('followed both')
""")["stdout"]
    assert SECRET not in out and out.count("refused") == 2, out
    assert out.endswith("followed both\n"), out


def test_environment_and_proc_secrets(hostile):
    out = run(hostile, """
import os, glob
found = []
for p in glob.glob('/proc/*/environ'):
    try:
        found.append(open(p, 'rb').read())
    except OSError:
        pass
print(b''.join(found).decode(errors='replace'))
print(dict(os.environ))
print(sorted(int(p) for p in os.listdir('/proc') if p.isdigit()))
print('environ files read:', len(found))
""")["stdout"]
    assert SECRET not in out and "MPS_TEST_SECRET" not in out
    # It really read what it could see: at least its own environment, and its PATH in it.
    assert "environ files read: " in out and int(out.rsplit(":", 1)[1]) >= 1, out
    assert "'PATH':" in out, out


def test_fork_bomb_contained(hostile):
    sc = run(hostile, """
import os
print('forking', flush=True)
while True:
    try:
        os.fork()
    except OSError:
        pass
""", timeout_seconds=3)
    # It ran (the marker), never ended by itself, and was stopped by its timeout.
    assert sc["stdout"].startswith("forking\n"), sc
    assert sc["timed_out"] is True, sc
    assert wait_until(lambda: descendants(hostile.proc.pid) == [], timeout=5)
    assert run(hostile, "print('after')")["stdout"] == "after\n"


def test_memory_bomb(hostile):
    sc = run(hostile, "print('allocating', flush=True)\nx = []\nwhile True:\n    x.append(bytearray(50 * 1024 * 1024))\n",
             timeout_seconds=20)
    assert sc["stdout"] == "allocating\n", sc
    assert sc["exit_code"] != 0
    assert "MemoryError" in sc["stderr"] or sc["signal"] is not None
    if "MemoryError" in sc["stderr"]:
        assert sc["limit"] == "memory"


def test_fill_tmp_and_file_size(hostile):
    out = run(hostile, """
import errno
try:
    for i in range(1000):  # many files, each under the file size limit
        with open('/tmp/fill%d' % i, 'wb') as f:
            f.write(b'x' * (1 << 20))
except OSError as e:
    print('tmp', errno.errorcode[e.errno])
import signal
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
try:
    with open('/work/big', 'wb') as f:
        while True:
            f.write(b'x' * (1 << 20)); f.flush()
except OSError as e:
    print('work', errno.errorcode[e.errno])
""", timeout_seconds=30)["stdout"]
    assert "tmp ENOSPC" in out and "work EFBIG" in out, out


def test_daemon_does_not_outlive_the_run(hostile):
    marker = "mps-daemon-%d" % os.getpid()
    sc = run(hostile, daemon_script(marker))
    assert sc["stdout"] == "parent exits\n" and sc["exit_code"] == 0, sc
    assert wait_until(lambda: processes_with_marker(marker) == [], timeout=5)


def test_forbidden_syscalls(hostile):
    out = run(hostile, """
import ctypes, os, errno
libc = ctypes.CDLL(None, use_errno=True)
def check(name, rc):
    print(name, 'EPERM' if rc == -1 and ctypes.get_errno() in (errno.EPERM, errno.EACCES) else ('rc=%d errno=%d' % (rc, ctypes.get_errno())))
check('ptrace', libc.ptrace(16, 1, 0, 0))
check('mount', libc.mount(b'none', b'/tmp', b'tmpfs', 0, None))
check('unshare', libc.unshare(0x10000000))
check('setuid0', libc.setuid(0))
""")["stdout"]
    for name in ["ptrace", "mount", "unshare", "setuid0"]:
        assert f"{name} EPERM" in out, out


def test_kernel_surface_refused(hostile):
    """User namespaces, io_uring, keyrings and file watches: the same probes, with the same
    answers, as on docker and podman (test_container_real.py)."""
    res = hostile.execute(policy_probes.SCRIPT, timeout=60)
    policy_probes.check(res)


def test_no_network_when_off(hostile):
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(1)
    port = srv.getsockname()[1]
    accepted = []
    threading.Thread(target=lambda: accepted.append(srv.accept()), daemon=True).start()
    out = run(hostile, f"""
import socket
try:
    socket.create_connection(('127.0.0.1', {port}), timeout=2); print('CONNECTED')
except OSError as e:
    print('refused', e)
""")["stdout"]
    srv.close()
    assert "CONNECTED" not in out and not accepted, out
    assert out.startswith("refused "), out


def test_network_host_reaches_loopback_and_on_does_not(make_server):
    # The old default (the host's namespace) is now the explicit, unsafe --network host; with
    # --network on the script has a namespace of its own (test_network.py: the proxy's policy).
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(4)
    port = srv.getsockname()[1]
    script = (f"import socket\ntry:\n    socket.create_connection(('127.0.0.1', {port}), timeout=5)\n"
              f"    print('CONNECTED')\nexcept OSError as e:\n    print('refused', e.errno)")
    host = make_server("--network", "host")
    host.initialize()
    out = host.execute(script)
    assert out["structuredContent"]["stdout"] == "CONNECTED\n"
    assert out["structuredContent"]["network"]["policy"] == "host"
    on = make_server("--network", "on")
    on.initialize()
    out = on.execute(script)
    srv.close()
    assert out["structuredContent"]["stdout"].startswith("refused"), out
    assert out["structuredContent"]["network"]["policy"] == "on"


def test_runs_as_unprivileged_uid(hostile):
    out = run(hostile, """
import os
print(os.getuid(), os.geteuid(), os.getgid())
for line in open('/proc/self/status'):
    if line.startswith(('CapEff', 'CapBnd', 'NoNewPrivs', 'Seccomp:')):
        print(line.strip())
""")["stdout"]
    uid = int(out.split()[0])
    assert uid != 0
    assert "CapEff:\t0000000000000000" in out and "NoNewPrivs:\t1" in out and "Seccomp:\t2" in out


def test_zz_nothing_left_behind(hostile):
    assert wait_until(lambda: descendants(hostile.proc.pid) == [], timeout=5)
    assert wait_until(lambda: work_left(hostile.state_dir) == [], timeout=5)
    rss = hostile.rss_kib("VmRSS")
    assert rss - hostile.rss_before < 16 * 1024, (hostile.rss_before, rss)


def test_work_directory_total_size_is_capped(make_server):
    s = make_server("--work-size", "4M", "--max-file-size", "64M")
    s.initialize()
    out = s.execute("""
import errno
try:
    for i in range(100):
        with open('f%d' % i, 'wb') as f:
            f.write(b'x' * (1 << 20))
except OSError as e:
    print('work', errno.errorcode[e.errno], i)
""", timeout=60)["structuredContent"]["stdout"]
    assert "work ENOSPC" in out, out
    assert "size-capped tmpfs" in s.probed_environment()["content"][0]["text"]

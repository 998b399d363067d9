"""Probes of the syscall policy every isolating backend shares (sandbox/seccomp.c: the native
filter and the OCI profile docker and podman load), run as a script inside a sandbox by
test_hostile.py (bwrap) and test_container_real.py (docker, podman): each backend must refuse
the same calls with the same errno.

SCRIPT prints one line per probe, "PROBE <name> <outcome>", where the outcome is OK or the
errno's name; EXPECTED is what every backend must print."""

SCRIPT = r"""
import ctypes, errno, os, shutil, subprocess
libc = ctypes.CDLL(None, use_errno=True)
L = ctypes.c_long
# The numbers that differ between the architectures we run on; io_uring's are the same everywhere.
NR = {
    "x86_64": {"clone": 56, "add_key": 248, "request_key": 249, "keyctl": 250, "inotify_init": 253},
    "aarch64": {"clone": 220, "add_key": 217, "request_key": 218, "keyctl": 219, "inotify_init": None},
}[os.uname().machine]

def outcome(rc):
    return "OK" if rc != -1 else errno.errorcode.get(ctypes.get_errno(), str(ctypes.get_errno()))

def probe(name, rc):
    print("PROBE", name, outcome(rc), flush=True)

CLONE_NEWUSER, CLONE_NEWNET, SIGCHLD = 0x10000000, 0x40000000, 17
# A user namespace, as unshare(1) and os.unshare make it, and by clone().
probe("unshare_user", libc.unshare(CLONE_NEWUSER))
probe("unshare_net", libc.unshare(CLONE_NEWNET))
pid = libc.syscall(L(NR["clone"]), L(CLONE_NEWUSER | SIGCHLD), L(0), L(0), L(0), L(0))
if pid == 0:
    os._exit(0)  # a child in a new user namespace: the probe failed; it says so below
if pid > 0:
    os.waitpid(pid, 0)
probe("clone_newuser", pid)
# clone3 has its flags in memory: refused wholesale with ENOSYS (glibc falls back to clone).
probe("clone3", libc.syscall(L(435), L(0), L(0)))
if hasattr(os, "unshare"):
    try:
        os.unshare(os.CLONE_NEWUSER)
        print("PROBE os_unshare OK")
    except OSError as e:
        print("PROBE os_unshare", errno.errorcode.get(e.errno, str(e.errno)))
else:
    print("PROBE os_unshare EPERM")  # Python < 3.12: the libc probe above stands for it
if shutil.which("unshare"):
    r = subprocess.run(["unshare", "-U", "true"], capture_output=True)
    print("PROBE unshare_cmd", "OK" if r.returncode == 0 else "EPERM")
else:
    print("PROBE unshare_cmd EPERM")  # no unshare(1) in the image: the libc probe stands for it
# io_uring.
params = ctypes.create_string_buffer(120)
probe("io_uring_setup", libc.syscall(L(425), L(8), ctypes.c_void_p(ctypes.addressof(params))))
probe("io_uring_enter", libc.syscall(L(426), L(0), L(0), L(0), L(0), L(0), L(0)))
probe("io_uring_register", libc.syscall(L(427), L(0), L(0), L(0), L(0)))
# Kernel keyrings: the user keyring (-4) is the uid's, shared by every process of that uid.
probe("add_key", libc.syscall(L(NR["add_key"]), ctypes.c_char_p(b"user"), ctypes.c_char_p(b"mps-probe"),
                              ctypes.c_char_p(b"x"), L(1), L(-4)))
probe("keyctl", libc.syscall(L(NR["keyctl"]), L(0), L(-4), L(0)))  # KEYCTL_GET_KEYRING_ID
probe("request_key", libc.syscall(L(NR["request_key"]), ctypes.c_char_p(b"user"),
                                  ctypes.c_char_p(b"mps-probe"), L(0), L(0)))
# File watches on what runs share.
if NR["inotify_init"] is not None:
    probe("inotify_init", libc.syscall(L(NR["inotify_init"])))
else:
    print("PROBE inotify_init EPERM")  # no such syscall here: inotify_init1 stands for it
probe("inotify_init1", libc.inotify_init1(0))
probe("fanotify_init", libc.fanotify_init(0, 0))
"""

EXPECTED = {
    "unshare_user": "EPERM",
    "unshare_net": "EPERM",
    "clone_newuser": "EPERM",
    "clone3": "ENOSYS",
    "os_unshare": "EPERM",
    "unshare_cmd": "EPERM",
    "io_uring_setup": "EPERM",
    "io_uring_enter": "EPERM",
    "io_uring_register": "EPERM",
    "add_key": "EPERM",
    "keyctl": "EPERM",
    "request_key": "EPERM",
    "inotify_init": "EPERM",
    "inotify_init1": "EPERM",
    "fanotify_init": "EPERM",
}


def outcomes(stdout):
    """{probe: outcome} from SCRIPT's output."""
    got = {}
    for line in stdout.splitlines():
        parts = line.split()
        if len(parts) == 3 and parts[0] == "PROBE":
            got[parts[1]] = parts[2]
    return got


def check(res):
    """Asserts that a run of SCRIPT refused every probe as EXPECTED."""
    sc = res["structuredContent"]
    got = outcomes(sc["stdout"])
    assert sc["exit_code"] == 0, (sc["stdout"], sc["stderr"])
    assert got == EXPECTED, {k: (got.get(k), v) for k, v in EXPECTED.items() if got.get(k) != v}

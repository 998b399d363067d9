"""Shared fixtures: start the real binary and talk JSON-RPC to it over stdio."""
import glob
import io
import json
import os
import queue
import subprocess
import tempfile
import threading
import time

import pytest

BINARY = os.environ.get("MPS_BINARY") or os.path.join(
    os.path.dirname(__file__), "..", "..", "build", "mcp-python-exec-sandbox")
BINARY = os.path.abspath(BINARY)
# The backend integration tests run with unless a test asks for another one.
BACKEND = os.environ.get("MPS_TEST_BACKEND", "none")


# Cache warming would reach for the public index at every start (a DNS query leaving the
# machine, at least): no server a test starts does it unless the test asks (--warm-cache,
# with a loopback index).  Set here, every server inherits it, however it is started.
os.environ.setdefault("MCP_PY_SANDBOX_WARM_CACHE", "0")
# Most HTTP tests run backend none with a token file of two tenants (what they test is not
# the sandbox): the server refuses that without --allow-none-with-tokens, which every server
# a test starts inherits from here (test_http.py's refusal test removes it).
os.environ.setdefault("MCP_PY_SANDBOX_ALLOW_NONE_WITH_TOKENS", "1")

def pytest_configure(config):
    # test.sh runs the suite under pytest-xdist (several tests at once), then the tests marked
    # serial alone (-m serial -n 0): those bound how long the server takes to end a run or to
    # stop (a timeout's kill, SIGTERM), or judge scheduling from the order of starts, and a
    # loaded machine stretches what they measure.  Run by hand without -m, everything runs.
    config.addinivalue_line("markers", "serial: run apart from the parallel pass (see test.sh)")
    # pytest-xdist's own marker (--dist loadgroup), known even where xdist is not loaded.
    config.addinivalue_line("markers", "xdist_group(name): run every test of the group in one xdist worker")
    # The tiers (test.sh, docs/testing.md "Tiers"): given by the tables below, or by the
    # marker on a test or a module (pytestmark) of its own.
    config.addinivalue_line("markers", "sandbox_independent: its servers never run a script on "
                            "MPS_TEST_BACKEND: test.sh runs it once, in the none pass")
    config.addinivalue_line("markers", "asan: exercises the server's own memory: the ASan+UBSan "
                            "build runs it (on the none backend)")
    config.addinivalue_line("markers", "none_pass: runs on the none backend in the normal build "
                            "too (conftest.py NONE_PASS; every test runs on bwrap there)")
    config.addinivalue_line("markers", "long: too slow for every submission: ./test.sh --full only")


# ---------------------------------------------------------------- the tiers, in one place
#
# test.sh runs the integration suite three times:
#   normal build, MPS_TEST_BACKEND=bwrap: every test but the sandbox_independent ones
#   normal build, MPS_TEST_BACKEND=none:  the sandbox_independent tests and those marked
#                                         none_pass (NONE_PASS below)
#   ASan build,   MPS_TEST_BACKEND=none:  the tests marked asan
# (and ./test.sh --full adds the tests marked long, every test in the normal build's none
# pass, and the ASan build's whole suite).
#
# sandbox_independent: a test whose every server runs with --sandbox-backend none whatever
# MPS_TEST_BACKEND says (HttpServer, make_http, make_tenants' default, backend="none"), or with
# a backend of its own (the docker stand-in, a stand-in bwrap), or that runs no script.  On
# both backends it would run the same binary with the same flags twice.  A test that skips
# on the none backend must never be one (it would run nowhere).
#
# Whole modules, or ("http", exceptions): the module's tests that take none of
# STDIO_BACKEND_FIXTURES (a stdio server on MPS_TEST_BACKEND running scripts) and are not
# named in exceptions.
STDIO_BACKEND_FIXTURES = {"server", "make_server", "stdio", "tasks_server"}
SANDBOX_INDEPENDENT = {
    "test_http": "all",                 # HttpServer: always --sandbox-backend none
    "test_forwarded": "all",            # HttpServer and `none` only
    "test_ui_tenancy": "all",           # make_http, make_tenants (none)
    "test_docker_standin": "all",       # backend="docker" against the stand-in
    "test_probe": "all",                # backend="bwrap" with a stand-in bwrap
    "test_journal": "all",              # its own servers, --sandbox-backend none
    "test_monitoring": "all",           # HttpServer (none), and promtool
    # the stdio servers here run no script, but these two tests:
    "test_protocol": ("all but", {"test_batches_only_on_2025_03_26", "test_stdout_is_only_json"}),
    # every test but one passes --sandbox-backend none or runs nothing
    "test_cli": ("all but", {"test_relative_state_dir_is_resolved_at_start"}),
    "test_protocol_2026": ("http", set()),
    "test_tasks": ("http", set()),
    "test_tasks_attacks": ("http", set()),
    "test_listen_lifetimes": ("http", set()),
    "test_ui": ("http", set()),
    # (make_tenants on the test's backend; the pool refills, each one's last other shape:
    # bwrap only)
    "test_tenancy": ("http", {"test_one_token_cannot_starve_another",
                              "test_a_token_at_its_running_cap_does_not_stop_the_pools_refills",
                              "test_a_tenants_last_other_shape_is_its_own",
                              "test_last_other_shapes_are_kept_for_a_bounded_number_of_principals"}),
}
# The none pass of the normal build runs the sandbox_independent tests, and of the others
# only these (marked none_pass): the none backend's own run path (test_execute: spawning,
# limits, timeouts, the kill of a whole tree; test_cgroups: its cgroups), and the tests whose
# assertions differ on none or that run on none only.  Every other test runs on bwrap in the
# normal build (the default backend) and on none under ASan when its module is in
# ASAN_MODULES; ./test.sh --full runs the whole suite on none as well.
NONE_PASS = {
    "test_execute": "all",
    "test_results": "all",
    "test_runs": "all",
    "test_cgroups": "all",
    "test_build_hostile": {"test_check_environment_says_how_builds_are_held"},
    "test_files": {"test_network_false_without_isolation_says_so",
                   "test_network_list_without_isolation_is_refused"},
    "test_faults": {"test_a_stdio_client_that_writes_and_never_reads_costs_bounded_memory",
                    "test_a_stdio_client_that_dies_while_the_server_holds_back_does_not_leave_it_running",
                    "test_200_http_clients_x_50_calls"},
    "test_warm": {"test_prestart_takes_a_number", "test_backend_none_holds_nothing"},
}
# The ASan+UBSan build's integration tier: the modules that exercise the server's own memory
# (the protocol and transports, faults, tenancy and tasks bookkeeping, listen streams,
# sessions, the chaos driver, token rotation).  A module not yet in the tree is simply absent.
ASAN_MODULES = {
    "test_protocol", "test_protocol_2026", "test_http", "test_forwarded", "test_faults",
    "test_tenancy", "test_tasks", "test_tasks_attacks", "test_listen_lifetimes",
    "test_sessions", "test_chaos", "test_token_rotation", "test_route",
}


def _independent(item):
    rule = SANDBOX_INDEPENDENT.get(item.module.__name__)
    name = getattr(item, "originalname", item.name)
    if rule is None:
        return False
    if rule == "all":
        return True
    kind, exceptions = rule
    if name in exceptions:
        return False
    if kind == "http":
        return not (STDIO_BACKEND_FIXTURES & set(item.fixturenames))
    return True


def _none_pass(item):
    rule = NONE_PASS.get(item.module.__name__)
    return rule == "all" or (rule is not None and getattr(item, "originalname", item.name) in rule)


def pytest_collection_modifyitems(config, items):
    for item in items:
        if _independent(item):
            item.add_marker(pytest.mark.sandbox_independent)
        elif _none_pass(item):
            item.add_marker(pytest.mark.none_pass)
        if item.module.__name__ in ASAN_MODULES:
            item.add_marker(pytest.mark.asan)


# The pids of every server this test run started (other sessions on the machine run servers
# too).
STARTED_SERVERS = set()
# pid -> state directory of the servers Server started; pid -> instance id, once looked up.
SERVER_STATE_DIRS = {}
INSTANCE_IDS = {}


def instance_id(pid, state_dir=None, timeout=10):
    """The instance id of the server with this pid (its cgroup directories are mps-<id>), from
    its record in <state>/instances/ (written at start-up, removed at a clean exit: look it up
    while the server lives; it is remembered).  None when there is none."""
    if pid in INSTANCE_IDS:
        return INSTANCE_IDS[pid]
    records = os.path.join(state_dir or SERVER_STATE_DIRS.get(pid, ""), "instances")

    def find():
        try:
            names = os.listdir(records)
        except OSError:
            return None
        for name in names:
            try:
                with open(os.path.join(records, name)) as f:
                    fields = dict(line.split(" ", 1) for line in f.read().splitlines() if " " in line)
            except OSError:
                continue
            if fields.get("pid") == str(pid) and fields.get("instance") == name:
                return name
        return None

    found = [None]

    def look():
        found[0] = find()
        return found[0] is not None or not os.path.exists(f"/proc/{pid}")
    wait_until(look, timeout=timeout)
    if found[0]:
        INSTANCE_IDS[pid] = found[0]
    return found[0]


def started_instances():
    """The instance ids of the servers this test run started and looked up."""
    return {iid for pid, iid in INSTANCE_IDS.items() if pid in STARTED_SERVERS}


def cgroup_dirs(pid, state_dir=None):
    """The cgroup directories (mps-<instance id>, in any hierarchy) of the server with this pid."""
    iid = instance_id(pid, state_dir, timeout=0)
    if not iid:
        return []
    return [d for d in glob.glob(f"/sys/fs/cgroup/**/mps-{iid}", recursive=True) if os.path.isdir(d)]


class Server:
    def __init__(self, *args, backend=None, state_dir=None, env=None, cwd=None, preexec_fn=None,
                 wrapper=()):
        """wrapper: a command the server runs under (e.g. unshare ... in its own namespaces)."""
        self.tmp = tempfile.TemporaryDirectory(prefix="mps-itest-")
        self.state_dir = state_dir or os.path.join(self.tmp.name, "state")
        argv = [*wrapper, BINARY, "--sandbox-backend", backend or BACKEND, "--state-dir", self.state_dir, *args]
        self.stderr_path = os.path.join(self.tmp.name, "stderr.log")
        self.stderr_file = open(self.stderr_path, "wb")
        full_env = dict(os.environ)
        # Cache warming would reach for an index at every start: tests opt in explicitly.
        full_env.setdefault("MCP_PY_SANDBOX_WARM_CACHE", "0")
        for k, v in (env or {}).items():
            if v is None:
                full_env.pop(k, None)
            else:
                full_env[k] = v
        self.proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=self.stderr_file, env=full_env, bufsize=0, cwd=cwd,
                                     preexec_fn=preexec_fn)
        STARTED_SERVERS.add(self.proc.pid)
        SERVER_STATE_DIRS[self.proc.pid] = self.state_dir
        self.lines = queue.Queue()
        self.notifications = []
        self.stray = []
        self.next_id = 1
        self.closed = False
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self):
        # Buffered: the process pipe is unbuffered (bufsize=0), and reading a multi-megabyte
        # line a byte at a time would take seconds.
        for line in io.BufferedReader(self.proc.stdout, 1 << 20):
            self.lines.put(line)
        self.lines.put(None)

    # ------------------------------------------------------------ raw I/O
    def send_raw(self, data: bytes):
        self.proc.stdin.write(data)
        self.proc.stdin.flush()

    def send(self, obj):
        self.send_raw(json.dumps(obj).encode() + b"\n")

    def recv(self, timeout=15):
        """The next message on stdout (every line must be one JSON value)."""
        line = self.lines.get(timeout=timeout)
        if line is None:
            raise EOFError("server closed stdout")
        assert line.endswith(b"\n")
        return json.loads(line)

    def recv_response(self, req_id, timeout=15):
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(f"no response to {req_id!r}")
            msg = self.recv(timeout=left)
            if isinstance(msg, dict) and "method" in msg and "id" not in msg:
                self.notifications.append(msg)
                continue
            if isinstance(msg, dict) and msg.get("id") == req_id:
                return msg
            self.stray.append(msg)

    def request(self, method, params=None, timeout=15, req_id=None):
        if req_id is None:
            req_id = self.next_id
            self.next_id += 1
        msg = {"jsonrpc": "2.0", "id": req_id, "method": method}
        if params is not None:
            msg["params"] = params
        self.send(msg)
        return self.recv_response(req_id, timeout=timeout)

    def notify(self, method, params=None):
        msg = {"jsonrpc": "2.0", "method": method}
        if params is not None:
            msg["params"] = params
        self.send(msg)

    # ------------------------------------------------------------ MCP
    def initialize(self, version="2025-06-18"):
        r = self.request("initialize", {"protocolVersion": version, "capabilities": {},
                                        "clientInfo": {"name": "itest", "version": "0"}})
        assert "result" in r, r
        self.notify("notifications/initialized")
        return r["result"]

    def call(self, name, arguments=None, timeout=60, progress_token=None, req_id=None):
        params = {"name": name, "arguments": arguments or {}}
        if progress_token is not None:
            params["_meta"] = {"progressToken": progress_token}
        r = self.request("tools/call", params, timeout=timeout, req_id=req_id)
        assert "result" in r, r
        return r["result"]

    def probed_environment(self, timeout=60):
        """check_environment once the sandbox's probe (which runs in the background after
        start-up) has finished: until then it says "probing"."""
        deadline = time.monotonic() + timeout
        while True:
            res = self.call("check_environment")
            if not res["structuredContent"].get("sandbox_probing") or time.monotonic() > deadline:
                return res
            time.sleep(0.05)

    def execute(self, script, timeout=60, **kwargs):
        """execute_python with details: true unless the caller says otherwise: most tests
        check the run's metadata (its sandbox, environment, network, limits), which a result
        carries only when asked (issue 36); test_results.py checks the default shape."""
        args = {"script": script, "details": True, **kwargs}
        return self.call("execute_python", args, timeout=timeout)

    def start_sleeping_call(self, req_id, marker, timeout=15):
        """Sends an execute_python that prints marker and sleeps for a minute, with a
        progress token, and waits until the marker arrives as progress (so it is running)."""
        self.send({"jsonrpc": "2.0", "id": req_id, "method": "tools/call",
                   "params": {"name": "execute_python", "arguments": {
                       "script": f"import time\nprint('{marker}', flush=True)\ntime.sleep(60)",
                       "timeout_seconds": 120}, "_meta": {"progressToken": "p1"}}})
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            msg = self.recv(timeout=timeout)
            if msg.get("method") == "notifications/progress" and marker in msg["params"].get("message", ""):
                return True
        return False

    # ------------------------------------------------------------ process
    def rss_kib(self, field="VmHWM"):
        with open(f"/proc/{self.proc.pid}/status") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1])
        return 0

    def stderr_text(self):
        if not self.stderr_file.closed:
            self.stderr_file.flush()
        with open(self.stderr_path, "rb") as f:
            return f.read().decode(errors="replace")

    def close(self, timeout=10):
        if self.closed:
            return self.proc.returncode
        self.closed = True
        if self.proc.poll() is None:
            instance_id(self.proc.pid, timeout=1)  # remembered: its record goes with it
            try:
                self.proc.stdin.close()
            except BrokenPipeError:
                pass
            try:
                self.proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.stderr_file.close()
        rc = self.proc.returncode
        log = self.stderr_text()
        self.tmp.cleanup()
        # Under the sanitizer build, any report in the server's log fails the test.
        for needle in ("ERROR: AddressSanitizer", "ERROR: LeakSanitizer", "runtime error:"):
            assert needle not in log, log[-4000:]
        return rc


@pytest.fixture
def server():
    s = Server()
    s.initialize()
    yield s
    s.close()


@pytest.fixture
def make_server():
    made = []

    def make(*args, **kwargs):
        s = Server(*args, **kwargs)
        made.append(s)
        return s
    yield make
    for s in made:
        s.close()


# The 2026 era's protocol version: its requests carry it in _meta and in headers.
MODERN = "2026-07-28"


def modern_call(s, token, name, arguments):
    """A tools/call of the 2026 era over an HttpServer s (test_http.py), as the principal of
    the bearer token: its result (the HTTP status must be 200)."""
    p = {"name": name, "arguments": arguments,
         "_meta": {"io.modelcontextprotocol/protocolVersion": MODERN,
                   "io.modelcontextprotocol/clientCapabilities": {}}}
    st, _, body = s.post({"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": p},
                         headers={"MCP-Protocol-Version": MODERN, "Mcp-Method": "tools/call",
                                  "Mcp-Name": name, "Authorization": "Bearer " + token,
                                  "Accept": "application/json"})
    assert st == 200, body
    return json.loads(body)["result"]

def _cmdline(pid):
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().split(b"\0")
    except OSError:
        return []


def _processes():
    """{pid: (state, ppid)} of every process now."""
    table = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                rest = f.read().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        table[int(entry)] = (rest[0], int(rest[1]))
    return table


def held_sandboxes():
    """The prestarted sandboxes (--prestart) of this test run's servers still waiting for a
    call: pid -> their work directory.  Every process of one, bwrap and the waiting drop helper, carries --wait-go in
    its command line; they are kept on purpose, so the leak checks leave them out.  Once a call
    has released one, its processes keep that command line, but the drop helper has forked the
    script: a --wait-go process with any descendant without --wait-go is running a call, and is
    counted like any other process.  A prestarted interpreter's bwrap (and every process below
    it: the drop helper and the interpreter) carries the runner's --mps-warm instead, and is
    held until its work directory has a script.py (a call writes it before the go)."""
    marked = {}
    table = _processes()
    me = os.getpid()

    def ours(pid):
        # Started by a server of this test run: other sessions on the machine hold theirs.
        q, seen = pid, 0
        while q in table and seen < 64:
            if q == me:
                return True
            q, seen = table[q][1], seen + 1
        return False

    warm = {}  # a prestarted interpreter's bwrap -> its work directory
    for pid in table:
        if not ours(pid):
            continue
        argv = _cmdline(pid)
        if b"--wait-go" not in argv and b"--mps-warm" not in argv:
            continue
        workdir = None
        for i in range(len(argv) - 2):
            if argv[i] == b"--bind" and argv[i + 2] == b"/work":
                workdir = argv[i + 1].decode()
        if b"--wait-go" in argv:
            marked[pid] = workdir
        elif workdir and not os.path.lexists(os.path.join(workdir, "script.py")):
            # A prestarted interpreter (the runner's --mps-warm): its processes keep that
            # command line after the go, but a call writes script.py before it.
            warm[pid] = workdir
    # Every process below a held interpreter's bwrap is held too (the drop helper, the
    # interpreter waiting on its FIFO).
    for pid in table:
        q, seen = pid, 0
        while q in table and seen < 64:
            if q in warm:
                marked[pid] = warm[q]
                break
            q, seen = table[q][1], seen + 1
    # Walk up from every unmarked process: the marked ancestors it passes are released.
    for pid in table:
        if pid in marked:
            continue
        q, seen = table[pid][1], 0
        while q in table and seen < 64:
            marked.pop(q, None)
            q, seen = table[q][1], seen + 1
    return marked


def work_left(state_dir):
    """What is in the state directory's work/ (and in the servers' own directories there,
    work/srv-*) other than a prestarted sandbox's work directory."""
    keep = {os.path.basename(w) for w in held_sandboxes().values() if w}
    keep |= {k + ".ctl" for k in keep}  # a prestarted interpreter's FIFO directory
    work = os.path.join(state_dir, "work")
    left = []
    for e in os.listdir(work):
        if e.startswith("srv-"):
            left += [f"{e}/{r}" for r in os.listdir(os.path.join(work, e)) if r not in keep]
        elif e not in keep:
            left.append(e)
    return left


def descendants(pid):
    """Every live process whose ancestry includes pid (but the prestarted sandbox)."""
    held = set(held_sandboxes())
    parents = {p: ppid for p, (state, ppid) in _processes().items()
               if state not in ("Z", "X") and p not in held}
    out = []
    for p in parents:
        q = p
        seen = 0
        while q in parents and seen < 64:
            q = parents[q]
            seen += 1
            if q == pid:
                out.append(p)
                break
    return out


def mounts_under(path):
    """Mount points on the host at or below path."""
    path = os.path.realpath(path)
    found = []
    with open("/proc/self/mountinfo") as f:
        for line in f:
            mp = line.split()[4].replace("\\040", " ")
            if mp == path or mp.startswith(path + "/"):
                found.append(mp)
    return found




def processes_with_marker(marker):
    """Live processes whose command line contains marker (to find escaped daemons)."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                cmd = f.read()
            with open(f"/proc/{entry}/stat") as f:
                state = f.read().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if marker.encode() in cmd and state not in ("Z", "X"):
            found.append(int(entry))
    return found


def daemon_script(marker, prelude=""):
    """A script that leaves behind a daemon (setsid and a double fork) whose command line
    carries marker, then exits; find it with processes_with_marker(marker)."""
    return f"""
import os, sys, time
{prelude}
if os.fork() == 0:
    os.setsid()
    if os.fork() == 0:
        os.execv(sys.executable, [sys.executable, '-c', 'import time; time.sleep(60)', '{marker}'])
    os._exit(0)
time.sleep(0.3)
print('parent exits')
"""


def kernel_pids(server_pid):
    """The processes of the server's session kernels (descendants running kernel.py)."""
    found = []
    for pid in _tree_of(server_pid):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                if b"kernel.py" in f.read():
                    found.append(pid)
        except OSError:
            pass
    return found


def _tree_of(root):
    """Every process below root, held sandboxes included."""
    children = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    ppid = int(f.read().rsplit(")", 1)[1].split()[1])
            except (OSError, ValueError, IndexError):
                continue
            children.setdefault(ppid, []).append(int(entry))
    out, todo = [], [root]
    while todo:
        for c in children.get(todo.pop(), []):
            out.append(c)
            todo.append(c)
    return out


def thaw_from_outside(pid):
    """What an operator's SIGKILL needs to land on a frozen cgroup v1 task: its freezer thawed."""
    try:
        with open(f"/proc/{pid}/cgroup") as f:
            for line in f:
                _, ctl, path = line.rstrip("\n").split(":", 2)
                if "freezer" in ctl.split(","):
                    with open(f"/sys/fs/cgroup/freezer{path}/freezer.state", "w") as st:
                        st.write("THAWED")
    except OSError:
        pass


def kill_kernels_from_outside(server_pid):
    """SIGKILLs the server's session kernels as the OOM killer or an operator would.  Between
    calls a kernel is frozen, so nothing of its own can end it then."""
    pids = kernel_pids(server_pid)
    assert pids, "no session kernel"
    for pid in pids:
        try:
            os.kill(pid, 9)
        except ProcessLookupError:
            pass
        thaw_from_outside(pid)
    assert wait_until(lambda: not kernel_pids(server_pid), 10)


def wait_until(pred, timeout=10.0, interval=0.05):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if pred():
            return True
        time.sleep(interval)
    return pred()

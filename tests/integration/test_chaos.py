"""A model-based chaos test (issue 28, part 5): seeded, reproducible random interleavings of
everything the server does, against one HTTP server with two bearer tokens (alice and bob), in
both protocol eras (the handshake era: initialize and Mcp-Session-Id; the stateless 2026-07-28
era: each request carries its own _meta), and against one stdio server beside it.

The operations (OPS below): one-shot runs that succeed, fail, time out, flood their output,
fork children or write outputs/; sessions (new, reused, closed, another principal's, first
calls that fail before the kernel starts); tasks (both eras: created, polled, read, cancelled,
another principal's); resources/read and downloads of run artifacts (own and another's);
notifications/cancelled and closed connections during a call; clients that hang up during an
SSE answer; malformed bodies and cut or pipelined requests; SIGHUP after the tokens file rotated
bob's token; one token's attacks on the other's things (its busy session, its running request,
its session named in a task); bursts of operations at once.  A small model
says what each principal owns (sessions, tasks, artifacts) and what each answer must be.

Checked after every operation: both servers are alive and answer a ping, every request was
answered within BOUND (a cancelled one may end without an answer), and no principal reaches or
sees anything of another's (its ids answer like unknown ones, listings leave them out).  At the
end a drain (SIGTERM): each server exits 0 and leaves nothing (no process, no mount under its
state directory, no cgroup named after it, no work directory).

The random choices depend on the seed alone (the server's ids are chosen among by their order
of creation); the timings differ from run to run, and so may the order in which a burst's
operations (several at once) create things.

Environment: MPS_CHAOS_SEEDS (comma list, default DEFAULT_SEEDS), MPS_CHAOS_OPS (operations per
seed), MPS_CHAOS_SECONDS (a campaign: random seeds, each of MPS_CHAOS_OPS operations, until that
many seconds have passed; every seed is printed).  A failure names the seed, the operation's
index and the last operations: MPS_CHAOS_SEEDS=<seed> MPS_CHAOS_OPS=<index + 1> replays it.
See docs/testing.md.  Only 127.0.0.1 is contacted; dependencies resolve from an empty local
wheelhouse (--find-links, --offline), so a dependency cannot be installed, quickly."""
import base64
import http.client
import json
import os
import random
import re
import signal
import socket
import subprocess
import tempfile
import threading
import time
import traceback

import pytest

from conftest import BACKEND, BINARY, STARTED_SERVERS, Server, cgroup_dirs, instance_id, mounts_under, processes_with_marker, wait_until
from test_http import ACCEPT_BOTH, free_port, messages, sse_events_from_bytes

HS = "2025-11-25"
MODERN = "2026-07-28"
EXT = "io.modelcontextprotocol/tasks"
RELATED = "io.modelcontextprotocol/related-task"
PV = "io.modelcontextprotocol/protocolVersion"
CAPS = "io.modelcontextprotocol/clientCapabilities"
TOKENS = {"alice": ["tok-alice-0123456789"],
          "bob": ["tok-bob-9876543210", "tok-bob2-1357924680"]}  # bob's is rotated by SIGHUP
UNKNOWN_SESSION = "s-" + "0" * 20
UNKNOWN_TASK = "0" * 32
UNKNOWN_RUN = "sandbox://runs/" + "0" * 32 + "/outputs/f.bin"
TERMINAL = ("completed", "failed", "cancelled")
# Any request is answered within this many seconds (scripts here run for at most ~3 s, time
# out after 1 s, or are cancelled; a loaded machine and the sanitizer stretch that).
BOUND = 90
DEFAULT_SEEDS = [11, 23, 37, 41]
DEFAULT_OPS = 130  # 4 x 130 = 520 operations in the default run
NO_PIP_ENV = {"PIP_FIND_LINKS": None, "PIP_INDEX_URL": None, "PIP_EXTRA_INDEX_URL": None}


class ChaosFailure(AssertionError):
    pass


class Revoked(Exception):
    """A request in flight while its token was rotated away: it ends with a 401 naming the
    removal (issue 28: a token owns what it opened), which the model expects."""


def read_to_last_chunk(sock, got):
    """got and what sock sends until the chunked answer's last chunk (or the socket's end)."""
    while not got.endswith(b"\r\n0\r\n\r\n"):
        chunk = sock.recv(65536)
        if not chunk:
            break
        got += chunk
    return got


def marker_processes(marker):
    """Live processes (but this one) whose command line carries marker."""
    return [pid for pid in processes_with_marker(marker) if pid != os.getpid()]


def processes_under(path):
    """Live processes whose command line names path or whose working directory is below it."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                cmd = f.read()
            with open(f"/proc/{entry}/stat") as f:
                state = f.read().rsplit(")", 1)[1].split()[0]
            cwd = os.readlink(f"/proc/{entry}/cwd")
        except OSError:
            continue
        if state in ("Z", "X"):
            continue
        if path.encode() in cmd or cwd == path or cwd.startswith(path + "/"):
            found.append((int(entry), cmd.replace(b"\0", b" ")[:200].decode(errors="replace")))
    return found






def answer_of(status, headers, body, req_id):
    """The JSON-RPC answer to req_id in a JSON or SSE body (None: none in it)."""
    if headers.get("content-type", "").startswith("text/event-stream"):
        for m in messages(sse_events_from_bytes(body)):
            if isinstance(m, dict) and m.get("id") == req_id and "method" not in m:
                return m
        return None
    try:
        return json.loads(body)
    except ValueError:
        return None


def plain(text, *ids):
    for i in ids:
        text = text.replace(i, "ID")
    return text


def _as_is(u):
    return u


def _upper_run(u):
    head, run, rest = u[:15], u[15:47], u[47:]
    return head + run.upper() + rest


def _dot_segment(u):
    return u.replace("/outputs/", "/outputs/./", 1)


def _dot_dot(u):
    return u.replace("/outputs/", "/outputs/../outputs/", 1)


def _trailing_slash(u):
    return u + "/"


def _escaped(u):
    return u[:-1] + "%%%02x" % ord(u[-1])


URI_VARIANTS = [_as_is, _as_is, _upper_run, _dot_segment, _dot_dot, _trailing_slash, _escaped]


def check_task_result(res, want):
    if want["stdout"] is None:  # a call that fails (another principal's session id)
        assert res["isError"] is True and "expired or unknown" in res["content"][0]["text"], res
    else:
        assert res["structuredContent"]["stdout"] == want["stdout"], res


# ---------------------------------------------------------------- the servers

class ChaosHttp:
    """The binary serving HTTP on 127.0.0.1 with the two principals' tokens."""

    def __init__(self, tmp, backend):
        self.tmp = tmp
        self.state_dir = os.path.join(tmp, "state")
        self.tokens_path = os.path.join(tmp, "tokens")
        self.bob = 0  # which of bob's tokens the file holds
        self.write_tokens()
        self.wheels = os.path.join(tmp, "wheels")
        os.makedirs(self.wheels)
        os.chmod(tmp, 0o755)
        os.chmod(self.wheels, 0o755)
        self.port = free_port()
        argv = [BINARY, "--transport", "http", "--host", "127.0.0.1", "--port", str(self.port),
                "--sandbox-backend", backend, "--state-dir", self.state_dir,
                "--auth-token-file", self.tokens_path, "--no-warm-cache", "--kill-grace-seconds", "1",
                "--find-links", self.wheels, "--offline", "--drain-seconds", "20"]
        self.stderr_path = os.path.join(tmp, "http-stderr.log")
        self.stderr_file = open(self.stderr_path, "wb")
        env = dict(os.environ)
        for k in NO_PIP_ENV:
            env.pop(k, None)
        self.proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                     stderr=self.stderr_file, env=env)
        STARTED_SERVERS.add(self.proc.pid)
        deadline = time.monotonic() + 30
        while True:
            if self.proc.poll() is not None:
                raise AssertionError("server exited: " + self.stderr_text())
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=1):
                    break
            except OSError:
                assert time.monotonic() < deadline, self.stderr_text()
                time.sleep(0.02)

    def write_tokens(self):
        text = f"alice: {TOKENS['alice'][0]}\nbob: {TOKENS['bob'][self.bob]}\n"
        tmp = self.tokens_path + ".new"
        with open(tmp, "w") as f:
            f.write(text)
        os.rename(tmp, self.tokens_path)  # as a rotation does: the file is replaced whole

    def stderr_text(self):
        self.stderr_file.flush()
        with open(self.stderr_path, "rb") as f:
            return f.read().decode(errors="replace")

    def request(self, method, path="/mcp", body=None, headers=None, timeout=BOUND):
        c = http.client.HTTPConnection("127.0.0.1", self.port, timeout=timeout)
        try:
            c.request(method, path, body=body, headers=headers or {})
            r = c.getresponse()
            data = r.read()
            return r.status, {k.lower(): v for k, v in r.getheaders()}, data
        finally:
            c.close()


class Principal:
    """What one principal owns.  The ids are the server's (random): choices among them go by
    their order of creation, never by their values, so that a seed makes the same choices."""

    def __init__(self, name):
        self.name = name
        self.token_index = 0
        self.hs_sid = None           # the handshake era's transport session
        self.sessions = {}           # execution session id -> the value kept in it
        self.closed = []             # execution session ids closed (answer like unknown ones)
        self.tasks = {}              # task id -> {"stdout": expected, "cancelled": bool}
        self.artifacts = {}          # uri -> bytes
        self.pending_new = 0         # session "new" calls not yet answered
        self.rotations = 0           # how often this principal's token was rotated

    @property
    def token(self):
        return TOKENS[self.name][self.token_index]

    def auth(self):
        return {"Authorization": "Bearer " + self.token}


# ---------------------------------------------------------------- the driver

class Chaos:
    def __init__(self, seed, n_ops, backend):
        self.seed = seed
        self.n_ops = n_ops
        self.backend = backend
        self.main_rng = random.Random(seed)
        self.local = threading.local()  # a burst's threads draw from their own generators
        self.history = []
        self.ids = iter(range(1000, 10 ** 9))
        self.lock = threading.Lock()
        self.spent = {}              # operation -> seconds (MPS_CHAOS_TIMES=1 prints them)
        self.background = []         # (thread, started, description, errors list)
        self.markers = []            # every forked child's marker: none may outlive the drain
        self.raw_gets = {}           # session id -> [raw GET streams open on it, when the last closed]
        self.tmp = tempfile.mkdtemp(prefix="mps-chaos-")
        self.alice, self.bob = Principal("alice"), Principal("bob")
        self.http = None
        self.stdio = None
        self.stdio_model = Principal("stdio")
        self.stdio_modern = self.rng.random() < 0.5

    @property
    def rng(self):
        return getattr(self.local, "rng", None) or self.main_rng

    # ------------------------------------------------------------ plumbing
    def next_id(self):
        with self.lock:
            return next(self.ids)

    def other(self, p):
        return self.bob if p is self.alice else self.alice

    def hs_headers(self, p, sid=True):
        h = {"Accept": ACCEPT_BOTH, "Content-Type": "application/json", "MCP-Protocol-Version": HS,
             **p.auth()}
        if sid:
            h["Mcp-Session-Id"] = p.hs_sid
        return h

    def modern_params(self, params, declare_tasks=False):
        p = dict(params or {})
        p["_meta"] = {PV: MODERN, CAPS: {"extensions": {EXT: {}}} if declare_tasks else {},
                      "io.modelcontextprotocol/clientInfo": {"name": "chaos", "version": "0"}}
        return p

    def modern_headers(self, p, method, params):
        h = {"Accept": ACCEPT_BOTH, "Content-Type": "application/json", "MCP-Protocol-Version": MODERN,
             "Mcp-Method": method, **p.auth()}
        name = {"tools/call": "name", "resources/read": "uri", "tasks/get": "taskId",
                "tasks/cancel": "taskId", "tasks/update": "taskId"}.get(method)
        if name and isinstance(params.get(name), str):
            h["Mcp-Name"] = params[name]
        return h

    def initialize(self, p):
        req_id = self.next_id()
        body = json.dumps({"jsonrpc": "2.0", "id": req_id, "method": "initialize",
                           "params": {"protocolVersion": HS, "capabilities": {},
                                      "clientInfo": {"name": "chaos", "version": "0"}}}).encode()
        st, h, data = self.http.request("POST", "/mcp", body, self.hs_headers(p, sid=False))
        assert st == 200, (st, data[:300])
        p.hs_sid = h["mcp-session-id"]
        st, _, data = self.http.request("POST", "/mcp", json.dumps(
            {"jsonrpc": "2.0", "method": "notifications/initialized"}).encode(), self.hs_headers(p))
        assert st == 202, (st, data[:300])

    def rpc(self, p, era, method, params=None, declare_tasks=False):
        """One request over HTTP; returns the JSON-RPC answer (HTTP status asserted)."""
        req_id = self.next_id()
        if era == "hs":
            msg = {"jsonrpc": "2.0", "id": req_id, "method": method}
            if params is not None:
                msg["params"] = params
            headers = self.hs_headers(p)
        else:
            msg = {"jsonrpc": "2.0", "id": req_id, "method": method,
                   "params": self.modern_params(params, declare_tasks)}
            headers = self.modern_headers(p, method, params or {})
        rotations = p.rotations
        st, h, data = self.http.request("POST", "/mcp", json.dumps(msg).encode(), headers)
        if st == 401 and p.rotations != rotations and b"removed from the token file" in data:
            raise Revoked(method)
        ans = answer_of(st, h, data, req_id)
        assert ans is not None, (st, data[:500])
        assert ans.get("id") == req_id, (st, ans)
        # A result is 200; the modern era's errors may be 400 or 404 (H4).
        assert st == 200 or (era == "modern" and st in (400, 404) and "error" in ans), (st, ans)
        return ans

    def result(self, p, era, method, params=None, declare_tasks=False):
        ans = self.rpc(p, era, method, params, declare_tasks)
        assert "result" in ans, ans
        return ans["result"]

    def execute(self, p, era, args, declare_tasks=False):
        return self.result(p, era, "tools/call", {"name": "execute_python", "arguments": args},
                           declare_tasks)

    def tool(self, p, era, name, args):
        return self.result(p, era, "tools/call", {"name": name, "arguments": args})

    def in_background(self, desc, fn):
        errors = []

        def run():
            try:
                fn()
            except Revoked:
                pass  # its token was rotated while it ran: the expected end
            except BaseException as e:  # noqa: B902 - reported by the main thread
                errors.append("".join(traceback.format_exception(e))[-3000:])
        t = threading.Thread(target=run, daemon=True)
        t.start()
        self.background.append((t, time.monotonic(), desc, errors))

    def reap(self, wait=False):
        keep = []
        for t, started, desc, errors in self.background:
            if wait:
                t.join(timeout=max(0.0, started + BOUND + 10 - time.monotonic()))
            if errors:
                raise ChaosFailure(f"background {desc}: {errors[0]}")
            if t.is_alive():
                if time.monotonic() - started > BOUND + 10:
                    raise ChaosFailure(f"background {desc}: no answer within {BOUND} s")
                keep.append((t, started, desc, errors))
        self.background = keep

    # ------------------------------------------------------------ invariants
    def check_alive(self):
        assert self.http.proc.poll() is None, "the HTTP server died: " + self.http.stderr_text()[-4000:]
        assert self.stdio.proc.poll() is None, "the stdio server died: " + self.stdio.stderr_text()[-4000:]
        p = self.alice
        ans = self.rpc(p, "hs", "ping")
        assert ans.get("result") == {}, ans
        assert self.result(p, "modern", "server/discover")["resultType"] == "complete"
        if self.stdio_modern:
            r = self.stdio_request("server/discover", {})
        else:
            r = self.stdio_request("ping")
        assert "result" in r, r
        self.reap()

    def check_listings(self, p):
        """list_sessions, resources/list, tasks/list show exactly (sessions) or only (the rest)
        what the model says p owns."""
        era = self.rng.choice(["hs", "modern"])
        for listed in ({e["id"] for e in self.tool(p, era, "list_sessions", {})["structuredContent"]["sessions"]},
                       {e["id"] for e in self.tool(p, era, "check_environment", {})["structuredContent"]
                        ["sessions"]["yours"]}):
            # A session "new" whose first call is still running (in a burst) is listed too.
            extra = listed - set(p.sessions)
            assert set(p.sessions) <= listed and len(extra) <= p.pending_new, (listed, p.sessions, p.pending_new)
            assert not extra & set(self.other(p).sessions), extra
        res = self.result(p, era, "resources/list")
        uris = {r["uri"] for r in res["resources"]}
        theirs = set(self.other(p).artifacts)
        assert not (uris & theirs), uris & theirs
        assert uris <= set(p.artifacts), (uris, p.artifacts)
        tasks = {t["taskId"] for t in self.result(p, "hs", "tasks/list")["tasks"]}
        assert not (tasks & set(self.other(p).tasks)), tasks
        assert tasks <= set(p.tasks), (tasks, p.tasks)

    # ------------------------------------------------------------ stdio plumbing
    def stdio_request(self, method, params=None, declare_tasks=False, timeout=BOUND):
        s = self.stdio
        req_id = self.next_id()
        msg = {"jsonrpc": "2.0", "id": req_id, "method": method}
        if self.stdio_modern:
            msg["params"] = self.modern_params(params, declare_tasks)
        elif params is not None:
            msg["params"] = params
        s.send(msg)
        return s.recv_response(req_id, timeout=timeout)

    def stdio_execute(self, args, declare_tasks=False):
        r = self.stdio_request("tools/call", {"name": "execute_python", "arguments": args}, declare_tasks)
        assert "result" in r, r
        return r["result"]

    # ------------------------------------------------------------ start and end
    def start(self):
        self.http = ChaosHttp(self.tmp, self.backend)
        for p in (self.alice, self.bob):
            self.initialize(p)
        self.stdio = Server("--kill-grace-seconds", "1", "--find-links", self.http.wheels, "--offline",
                            "--drain-seconds", "20", backend=self.backend,
                            state_dir=os.path.join(self.tmp, "stdio-state"), env=NO_PIP_ENV)
        if not self.stdio_modern:
            self.stdio.initialize(HS)

    def drain(self):
        """SIGTERM both (a call running on each): the calls finish, each server exits 0 and
        leaves nothing behind."""
        self.reap(wait=True)
        p = self.rng.choice([self.alice, self.bob])
        era = self.rng.choice(["hs", "modern"])
        finished = []

        def last_call():
            r = self.execute(p, era, {"script": "import time\nprint('a', flush=True)\ntime.sleep(1)\nprint('b')"})
            finished.append(r)
        t = threading.Thread(target=last_call, daemon=True)
        t.start()
        stdio_id = self.next_id()
        params = {"name": "execute_python", "arguments": {"script": "import time\ntime.sleep(1)\nprint('c')"}}
        if self.stdio_modern:
            params["_meta"] = self.modern_params({})["_meta"]
        self.stdio.send({"jsonrpc": "2.0", "id": stdio_id, "method": "tools/call", "params": params})
        time.sleep(0.3)
        for name, proc, state_dir, log in (
                ("http", self.http.proc, self.http.state_dir, self.http.stderr_text),
                ("stdio", self.stdio.proc, self.stdio.state_dir, self.stdio.stderr_text)):
            instance_id(proc.pid, state_dir)  # remembered for cgroup_dirs() after its exit
            proc.send_signal(signal.SIGTERM)
            try:
                rc = proc.wait(timeout=BOUND)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
                raise ChaosFailure(f"the {name} server did not exit after SIGTERM: " + log()[-3000:])
            text = log()
            for needle in ("ERROR: AddressSanitizer", "ERROR: LeakSanitizer", "runtime error:"):
                assert needle not in text, f"{name}: " + text[-6000:]
            assert rc == 0, f"the {name} server exited {rc}: " + text[-3000:]
            if name == "http":
                t.join(BOUND)
                assert finished and finished[0]["structuredContent"]["stdout"] == "a\nb\n", finished
            else:
                r = self.stdio.recv_response(stdio_id, timeout=BOUND)
                assert r["result"]["structuredContent"]["stdout"] == "c\n", r
            assert wait_until(lambda: not processes_under(state_dir), 15), processes_under(state_dir)
            assert mounts_under(state_dir) == [], mounts_under(state_dir)
            assert wait_until(lambda: not cgroup_dirs(proc.pid), 10), cgroup_dirs(proc.pid)
            work = os.path.join(state_dir, "work")
            left = os.listdir(work) if os.path.isdir(work) else []
            assert left == [], f"{name}: work/ holds {left}"
        for m in self.markers:
            assert wait_until(lambda: not marker_processes(m), 10), (m, marker_processes(m))
        self.stdio.closed = True
        self.stdio.stderr_file.close()

    def cleanup(self):
        for proc in (self.http and self.http.proc, self.stdio and self.stdio.proc):
            if proc and proc.poll() is None:
                proc.kill()
                proc.wait()
        if self.stdio:
            self.stdio.closed = True
        for m in sorted(mounts_under(self.tmp), key=len, reverse=True):
            subprocess.run(["umount", "-l", m], check=False)
        subprocess.run(["rm", "-rf", self.tmp], check=False)

    def run(self):
        ops, weights = zip(*[(name, w) for name, w in OPS])
        try:
            self.start()
            for i in range(self.n_ops):
                name = self.rng.choices(ops, weights)[0]
                desc = [name]
                self.history.append((i, desc))
                try:
                    t0 = time.monotonic()
                    getattr(self, "op_" + name)(desc)
                    self.spent[name] = self.spent.get(name, 0.0) + time.monotonic() - t0
                    self.check_alive()
                except BaseException as e:  # noqa: B902
                    self.fail(i, e)
            self.history.append((self.n_ops, ["drain"]))
            counts = {}
            for _, d in self.history:
                counts[d[0]] = counts.get(d[0], 0) + 1
            print(f"chaos seed {self.seed}: {self.n_ops} operations, stdio {'modern' if self.stdio_modern else 'hs'}:",
                  " ".join(f"{k}={v}" for k, v in sorted(counts.items())), flush=True)
            if os.environ.get("MPS_CHAOS_TIMES"):
                print("  seconds:", " ".join(f"{k}={v:.1f}" for k, v in
                                             sorted(self.spent.items(), key=lambda kv: -kv[1])))
            try:
                self.drain()
            except BaseException as e:  # noqa: B902
                self.fail(self.n_ops, e)
        finally:
            self.cleanup()

    def fail(self, i, e):
        last = "\n".join(f"  #{j}: {' '.join(map(str, d))}" for j, d in self.history[-12:])
        last = last.replace("'", "")
        logs = ""
        for name, srv in (("http", self.http), ("stdio", self.stdio)):
            if srv:
                text = srv.stderr_text()
                at = min([i for i in (text.find("ERROR: AddressSanitizer"), text.find("runtime error:"),
                                      text.find("ERROR: LeakSanitizer")) if i >= 0], default=-1)
                text = text[at:at + 8000] if at >= 0 else text[-3000:]
                logs += f"\n--- {name} server stderr ---\n" + text
        tb = "".join(traceback.format_exception(e))[-4000:]
        raise ChaosFailure(
            f"chaos: seed {self.seed} ({self.backend}), operation #{i} failed\n"
            f"replay: MPS_CHAOS_SEEDS={self.seed} MPS_CHAOS_OPS={i + 1} MPS_TEST_BACKEND={self.backend}\n"
            f"last operations:\n{last}\n{tb}{logs}") from None

    # ------------------------------------------------------------ choices
    def pick(self, desc):
        p = self.rng.choice([self.alice, self.bob])
        era = self.rng.choice(["hs", "modern"])
        desc += [p.name, era]
        return p, era

    # ================================================================ operations: runs
    def op_exec_ok(self, desc):
        p, era = self.pick(desc)
        word = "w%d" % self.rng.randrange(10 ** 6)
        r = self.execute(p, era, {"script": f"print({word!r})"})
        assert r["isError"] is False and r["structuredContent"]["stdout"] == word + "\n", r

    def op_exec_fail(self, desc):
        p, era = self.pick(desc)
        kind = self.rng.choice(["exit", "raise", "syntax"])
        desc.append(kind)
        script = {"exit": "import sys\nprint('bye')\nsys.exit(1)", "raise": "raise ValueError('chaos')",
                  "syntax": "def (:"}[kind]
        r = self.execute(p, era, {"script": script})
        sc = r["structuredContent"]
        assert r["isError"] is True and sc["exit_code"] == 1, r

    def op_exec_timeout(self, desc):
        p, era = self.pick(desc)

        def go():
            r = self.execute(p, era, {"script": "import time\nprint('s', flush=True)\ntime.sleep(60)",
                                      "timeout_seconds": 1})
            assert r["isError"] is True and r["structuredContent"]["timed_out"] is True, r
        self.in_background(" ".join(desc), go)

    def op_exec_flood(self, desc):
        p, era = self.pick(desc)
        mib = self.rng.choice([1, 4, 16])
        desc.append(f"{mib}MiB")
        script = (f"import sys\nline = 'x' * 1023 + '\\n'\nfor _ in range({mib} * 1024):\n"
                  "    sys.stdout.write(line)\nsys.stderr.write('e' * 100000)\n")

        def go():
            r = self.execute(p, era, {"script": script, "details": True})
            sc = r["structuredContent"]
            assert sc["exit_code"] == 0 and sc["stdout_bytes"] == mib << 20, sc.get("stdout_bytes")
            assert len(sc["stdout"]) < (mib << 20) or not sc["truncated"]
        if self.rng.random() < 0.5:
            self.in_background(" ".join(desc), go)
        else:
            go()

    def op_exec_fork(self, desc):
        p, era = self.pick(desc)
        marker = f"mps-chaos-{os.getpid()}-{self.seed}-{len(self.history)}"
        self.markers.append(marker)
        n = self.rng.randint(1, 3)
        desc.append(f"{n} children")
        script = ("import subprocess, sys, os\n"
                  f"for i in range({n}):\n"
                  f"    subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(300)', '{marker}'],"
                  " start_new_session=bool(i % 2))\n"
                  "if os.fork() == 0:\n"
                  f"    os.execv(sys.executable, [sys.executable, '-c', 'import time; time.sleep(300)', '{marker}'])\n"
                  "print('forked', flush=True)\n")
        r = self.execute(p, era, {"script": script})
        assert r["structuredContent"]["stdout"] == "forked\n", r
        assert wait_until(lambda: not marker_processes(marker), 20), \
            f"children outlived their run: {marker_processes(marker)}"

    def op_exec_outputs(self, desc):
        p, era = self.pick(desc)
        size = self.rng.randint(1, 20000)
        fill = self.rng.randrange(256)
        name = "f%d.bin" % self.rng.randrange(1000)
        desc.append(f"{name} {size}B")
        script = ("import os\nos.makedirs('outputs', exist_ok=True)\n"
                  f"open('outputs/{name}', 'wb').write(bytes(({fill} + i) % 256 for i in range({size})))\n")
        r = self.execute(p, era, {"script": script})
        assert r["isError"] is False, r
        links = [c["uri"] for c in r["content"] if c["type"] == "resource_link"]
        files = r["structuredContent"]["files"]
        uri = [f["uri"] for f in files if f["path"] == "outputs/" + name][0] if files else None
        assert uri and (not links or uri in links), r["content"]
        p.artifacts[uri] = bytes((fill + i) % 256 for i in range(size))

    # ================================================================ operations: sessions
    def op_session_new(self, desc):
        p, era = self.pick(desc)
        if len(p.sessions) >= 3:  # under --max-exec-sessions-per-token (4): close the oldest first
            self.close_session(p, era, next(iter(p.sessions)), desc)
        value = self.rng.randrange(10 ** 6)
        r = self.new_session_call(p, era, {"script": f"v = {value}\nv", "session": "new"})
        sc = r["structuredContent"]
        assert r["isError"] is False and sc["display"] == str(value), r
        assert sc["session"]["note"] is None, sc["session"]
        p.sessions[sc["session"]["id"]] = value
        desc.append(sc["session"]["id"])

    def new_session_call(self, p, era, args):
        with self.lock:
            p.pending_new += 1
        try:
            return self.execute(p, era, args)
        finally:
            with self.lock:
                p.pending_new -= 1

    def op_session_use(self, desc):
        p, era = self.pick(desc)
        if not p.sessions:
            return self.op_session_new(desc)
        sid = self.rng.choice(list(p.sessions))
        desc.append(sid)
        bump = self.rng.randrange(100)
        r = self.execute(p, era, {"script": f"v += {bump}\nprint(v)", "session": sid})
        assert r["isError"] is False, r
        p.sessions[sid] += bump
        assert r["structuredContent"]["stdout"] == f"{p.sessions[sid]}\n", r

    def close_session(self, p, era, sid, desc):
        desc.append("close " + sid)
        r = self.tool(p, era, "close_session", {"session": sid})
        assert not r.get("isError"), r
        del p.sessions[sid]
        p.closed.append(sid)

    def op_session_close(self, desc):
        p, era = self.pick(desc)
        if p.sessions:
            self.close_session(p, era, self.rng.choice(list(p.sessions)), desc)

    def op_session_foreign(self, desc):
        """Another principal's session id (or a closed one of its own) answers exactly as an
        id that never existed, from execute_python and close_session; the owner's session lives on."""
        p, era = self.pick(desc)
        victim = self.other(p)
        candidates = list(victim.sessions) + p.closed[-2:] + victim.closed[-1:]
        if not candidates:
            return
        sid = self.rng.choice(candidates)
        desc.append(sid)
        for name, args in (("execute_python", {"script": "print(v)"}), ("close_session", {})):
            answers = []
            for s in (sid, UNKNOWN_SESSION):
                r = self.tool(p, era, name, {**args, "session": s})
                answers.append((r.get("isError"), plain(r["content"][0]["text"], s)))
            assert answers[0] == answers[1], answers
            assert answers[0][0] is True, answers
        if sid in victim.sessions:
            r = self.execute(victim, self.rng.choice(["hs", "modern"]), {"script": "print(v)", "session": sid})
            assert r["structuredContent"]["stdout"] == f"{victim.sessions[sid]}\n", r

    def op_session_fail_first(self, desc):
        """A session whose first call fails before its kernel starts (an interpreter that does
        not exist, a dependency that cannot be installed): an error, and no session is left."""
        p, era = self.pick(desc)
        kind = self.rng.choice(["python", "python", "python", "dependency"])  # a failed build costs seconds
        desc.append(kind)
        args = {"script": "print(1)", "session": "new"}
        if kind == "python":
            args["python_version"] = "9.99"
        else:
            args["dependencies"] = ["mps-chaos-missing-%d" % self.rng.randrange(1000)]
        r = self.new_session_call(p, era, args)
        assert r["isError"] is True, r
        assert "closed" in r["content"][0]["text"] or "session" not in r.get("structuredContent", {}), r

    # ================================================================ operations: tasks
    def op_task_create(self, desc):
        p, era = self.pick(desc)
        if len(p.tasks) >= 28:  # --max-tasks-per-principal is 32
            return
        n = self.rng.randint(0, 3)
        script = f"import time\nfor i in range({n}):\n    print(i, flush=True)\n    time.sleep(0.5)\nprint('end')"
        expected = "".join(f"{i}\n" for i in range(n)) + "end\n"
        desc.append(f"{n} ticks")
        if era == "hs":
            r = self.result(p, era, "tools/call", {"name": "execute_python", "task": {"ttl": 600000},
                                                   "arguments": {"script": script, "timeout_seconds": 120}})
            task = r["task"]
        else:
            task = self.execute(p, era, {"script": script, "timeout_seconds": 120}, declare_tasks=True)
            assert task["resultType"] == "task", task
        assert task["status"] == "working" and re.fullmatch(r"[0-9a-f]{32}", task["taskId"]), task
        p.tasks[task["taskId"]] = {"stdout": expected, "cancelled": False}
        desc.append(task["taskId"])

    def task_get(self, p, era, tid):
        if era == "hs":
            return self.rpc(p, era, "tasks/get", {"taskId": tid})
        return self.rpc(p, era, "tasks/get", {"taskId": tid}, declare_tasks=True)

    def op_task_poll(self, desc):
        p, era = self.pick(desc)
        if not p.tasks:
            return self.op_task_create(desc)
        tid = self.rng.choice(list(p.tasks))
        want = p.tasks[tid]
        desc.append(tid)
        wait = self.rng.random() < 0.5
        deadline = time.monotonic() + BOUND
        while True:
            got = self.task_get(p, era, tid)["result"]
            if got["status"] in TERMINAL or not wait:
                break
            assert time.monotonic() < deadline, got
            time.sleep(0.2)
        if got["status"] == "cancelled":
            assert want["cancelled"], got
        elif got["status"] == "completed":
            if era == "hs":
                res = self.result(p, era, "tasks/result", {"taskId": tid})
                assert res["_meta"][RELATED] == {"taskId": tid}, res
            else:
                res = got["result"]
            check_task_result(res, want)
        else:
            assert got["status"] == "working", got

    def op_task_result_waits(self, desc):
        """tasks/result (the handshake era) blocks until the task ends: in the background."""
        p, _ = self.pick(desc)
        if not p.tasks:
            return
        tid = self.rng.choice(list(p.tasks))
        want = dict(p.tasks[tid])
        desc.append(tid)

        def go():
            ans = self.rpc(p, "hs", "tasks/result", {"taskId": tid})
            if "result" in ans:
                check_task_result(ans["result"], want)
            else:  # cancelled (now or later: the model's copy is from before)
                assert "cancelled" in ans["error"]["message"], ans
        self.in_background(" ".join(desc), go)

    def op_task_cancel(self, desc):
        p, era = self.pick(desc)
        if not p.tasks:
            return
        tid = self.rng.choice(list(p.tasks))
        desc.append(tid)
        params = {"taskId": tid}
        ans = self.rpc(p, era, "tasks/cancel", params, declare_tasks=(era == "modern"))
        if "result" in ans:
            p.tasks[tid]["cancelled"] = True
            if era == "hs":
                assert ans["result"]["status"] == "cancelled", ans
        else:  # already terminal
            assert ans["error"]["code"] == -32602, ans
            got = self.task_get(p, era, tid)["result"]
            assert got["status"] in TERMINAL, got

    def op_task_foreign(self, desc):
        """Another principal's task id answers like an unknown one from every tasks/ method;
        tasks/list never shows it; the owner's task is untouched."""
        p, era = self.pick(desc)
        victim = self.other(p)
        if not victim.tasks:
            return
        tid = self.rng.choice(list(victim.tasks))
        desc.append(tid)
        methods = ["tasks/get", "tasks/cancel"] + (["tasks/result"] if era == "hs" else ["tasks/update"])
        before = self.task_get(victim, "hs", tid)["result"]["status"]
        for m in methods:
            answers = []
            for t in (tid, UNKNOWN_TASK):
                params = {"taskId": t, **({"inputResponses": {"k": {}}} if m == "tasks/update" else {})}
                ans = self.rpc(p, era, m, params, declare_tasks=(era == "modern"))
                assert "error" in ans, ans
                e = ans["error"]
                answers.append((e["code"], plain(e["message"], t), plain(json.dumps(e.get("data")), t)))
            assert answers[0] == answers[1], answers
        after = self.task_get(victim, "hs", tid)["result"]["status"]
        if before == "working":
            assert after != "cancelled" or victim.tasks[tid]["cancelled"], (before, after)
        else:
            assert after == before, (before, after)
        self.check_listings(p)

    # ================================================================ operations: artifacts
    def op_artifact_read(self, desc):
        p, era = self.pick(desc)
        if not p.artifacts:
            return self.op_exec_outputs(desc)
        uri = self.rng.choice(list(p.artifacts))
        desc.append(uri)
        if self.rng.random() < 0.5:
            c = self.result(p, era, "resources/read", {"uri": uri})["contents"][0]
            data = base64.b64decode(c["blob"]) if "blob" in c else c["text"].encode()
        else:
            st, _, data = self.http.request("GET", "/mcp/runs/" + uri[len("sandbox://runs/"):],
                                            headers=p.auth())
            assert st == 200, (st, data[:200])
        assert data == p.artifacts[uri]

    def op_artifact_foreign(self, desc):
        p, era = self.pick(desc)
        victim = self.other(p)
        if not victim.artifacts:
            return
        uri = self.rng.choice(list(victim.artifacts))
        variant = self.rng.choice(URI_VARIANTS)
        desc += [uri, variant.__name__ if hasattr(variant, "__name__") else "variant"]
        answers = []
        for u in (variant(uri), variant(UNKNOWN_RUN)):
            ans = self.rpc(p, era, "resources/read", {"uri": u})
            assert "error" in ans, ans
            e = ans["error"]
            answers.append((e["code"], plain(e["message"], u), plain(json.dumps(e.get("data")), u)))
        assert answers[0] == answers[1], answers
        dl = [self.http.request("GET", "/mcp/runs/" + variant(u)[len("sandbox://runs/"):], headers=p.auth())
              for u in (uri, UNKNOWN_RUN)]
        assert dl[0][0] == dl[1][0] == 404 and dl[0][2] == dl[1][2], dl
        self.check_listings(p)

    def op_listings(self, desc):
        p, _ = self.pick(desc)
        self.check_listings(p)

    # ================================================================ operations: cancel, hang up
    def stream_call(self, p, era, script, req_id, timeout_seconds=30):
        """Opens a tools/call with a progress token as an SSE answer; returns the socket,
        once the script's first line arrived."""
        params = {"name": "execute_python", "arguments": {"script": script, "timeout_seconds": timeout_seconds},
                  "_meta": {"progressToken": "chaos-%d" % req_id}}
        if era == "hs":
            headers = self.hs_headers(p)
        else:
            headers = self.modern_headers(p, "tools/call", params)
            params["_meta"].update(self.modern_params({})["_meta"])
        body = json.dumps({"jsonrpc": "2.0", "id": req_id, "method": "tools/call", "params": params}).encode()
        headers["Content-Length"] = str(len(body))
        sock = socket.create_connection(("127.0.0.1", self.http.port), timeout=BOUND)
        head = "POST /mcp HTTP/1.1\r\nHost: 127.0.0.1:%d\r\n" % self.http.port
        head += "".join(f"{k}: {v}\r\n" for k, v in headers.items()) + "\r\n"
        sock.sendall(head.encode() + body)
        got = b""
        while b"started" not in got:
            chunk = sock.recv(65536)
            assert chunk, got[-500:]
            got += chunk
        return sock, got

    def op_cancel_inflight(self, desc):
        """notifications/cancelled of a running call (the handshake era), or its connection
        closed (the modern era: a closed stream cancels): the script's processes end."""
        p, era = self.pick(desc)
        marker = f"mps-chaos-c-{os.getpid()}-{self.seed}-{len(self.history)}"
        self.markers.append(marker)
        req_id = self.next_id()
        script = ("import subprocess, sys, time\n"
                  f"subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(300)', '{marker}'])\n"
                  "print('started', flush=True)\ntime.sleep(60)")
        sock, got = self.stream_call(p, era, script, req_id)
        try:
            if era == "hs":
                st, _, data = self.http.request("POST", "/mcp", json.dumps(
                    {"jsonrpc": "2.0", "method": "notifications/cancelled",
                     "params": {"requestId": req_id, "reason": "chaos"}}).encode(), self.hs_headers(p))
                assert st == 202, (st, data)
                # The stream ends (without an answer, or with one if the run had ended first).
                got = read_to_last_chunk(sock, got)
        finally:
            sock.close()
        assert wait_until(lambda: not marker_processes(marker), 20), marker_processes(marker)

    def op_hangup(self, desc):
        """A client that closes its socket during an SSE answer (sometimes with a reset)."""
        p, era = self.pick(desc)
        req_id = self.next_id()
        script = ("import time\nprint('started', flush=True)\n"
                  "for i in range(20):\n    print('x' * 5000, flush=True)\n    time.sleep(0.05)\n")
        sock, _ = self.stream_call(p, era, script, req_id)
        if self.rng.random() < 0.5:
            desc.append("reset")
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
        sock.close()

    # ================================================================ operations: attacks
    def op_attack_busy_session(self, desc):
        """While the owner's session runs a call, the other principal's attempts on it answer
        exactly as for an unknown id (no "running another call" oracle) and disturb nothing."""
        owner, era = self.pick(desc)
        attacker = self.other(owner)
        if not owner.sessions:
            return
        sid = self.rng.choice(list(owner.sessions))
        bump = self.rng.randrange(100)
        owner.sessions[sid] += bump
        want = owner.sessions[sid]
        desc.append(sid)
        done = []

        def run():
            r = self.execute(owner, era, {"script": f"import time\ntime.sleep(0.8)\nv += {bump}\nprint(v)",
                                          "session": sid})
            done.append(r)
        t = threading.Thread(target=run, daemon=True)
        t.start()
        time.sleep(0.2)
        a_era = self.rng.choice(["hs", "modern"])
        for name, args in (("execute_python", {"script": "print(v)"}), ("close_session", {}),
                           ("close_session", {"export": True})):
            answers = []
            for s in (sid, UNKNOWN_SESSION):
                r = self.tool(attacker, a_era, name, {**args, "session": s})
                answers.append((r.get("isError"), plain(r["content"][0]["text"], s)))
            assert answers[0] == answers[1], answers
        t.join(BOUND)
        assert done, "the owner's call was not answered"
        assert done[0]["structuredContent"]["stdout"] == f"{want}\n", done[0]

    def op_attack_cancel_foreign(self, desc):
        """notifications/cancelled naming the owner's running request, sent by the other
        principal in its own session, cancels nothing."""
        owner, _ = self.pick(desc)
        attacker = self.other(owner)
        req_id = self.next_id()
        sock, got = self.stream_call(owner, "hs", "import time\nprint('started', flush=True)\ntime.sleep(0.5)\n"
                                     "print('survived')", req_id)
        try:
            st, _, data = self.http.request("POST", "/mcp", json.dumps(
                {"jsonrpc": "2.0", "method": "notifications/cancelled",
                 "params": {"requestId": req_id, "reason": "attack"}}).encode(), self.hs_headers(attacker))
            assert st == 202, (st, data)
            got = read_to_last_chunk(sock, got)
        finally:
            sock.close()
        assert b'"result"' in got and b"survived" in got.split(b'"result"', 1)[1], got[-1000:]

    def op_attack_task_session(self, desc):
        """A task-augmented call naming another principal's session: its task fails exactly as
        one naming an unknown session does."""
        owner, _ = self.pick(desc)
        attacker = self.other(owner)
        if not owner.sessions or len(attacker.tasks) >= 26:
            return
        sid = self.rng.choice(list(owner.sessions))
        desc.append(sid)
        results = []
        for s in (sid, UNKNOWN_SESSION):
            r = self.result(attacker, "hs", "tools/call", {"name": "execute_python", "task": {"ttl": 600000},
                                                            "arguments": {"script": "print(v)", "session": s}})
            tid = r["task"]["taskId"]
            attacker.tasks[tid] = {"stdout": None, "cancelled": False}
            res = self.result(attacker, "hs", "tasks/result", {"taskId": tid})
            results.append((res["isError"], plain(res["content"][0]["text"], s)))
        assert results[0] == results[1], results
        r = self.execute(owner, "hs", {"script": "print(v)", "session": sid})
        assert r["structuredContent"]["stdout"] == f"{owner.sessions[sid]}\n", r

    def op_attack_modern_with_session_id(self, desc):
        """A 2026 request carrying the other principal's Mcp-Session-Id runs as its own token's
        principal: it lists and reaches only its own things."""
        p, _ = self.pick(desc)
        victim = self.other(p)
        for method, params in (("resources/list", {}), ("tools/call", {"name": "list_sessions", "arguments": {}})):
            req_id = self.next_id()
            msg = {"jsonrpc": "2.0", "id": req_id, "method": method, "params": self.modern_params(params)}
            headers = {**self.modern_headers(p, method, params), "Mcp-Session-Id": victim.hs_sid}
            st, h, data = self.http.request("POST", "/mcp", json.dumps(msg).encode(), headers)
            ans = answer_of(st, h, data, req_id)
            assert st == 200 and "result" in ans, (st, data[:300])
            shown = json.dumps(ans["result"])
            for thing in list(victim.artifacts) + list(victim.sessions):
                assert thing not in shown, (thing, shown[:500])

    def op_raw_connection(self, desc):
        """Requests cut short or doubled on one connection: a body shorter than its
        Content-Length then a close (or a reset), headers only, two requests pipelined, a
        standalone GET stream left at once."""
        p, _ = self.pick(desc)
        kind = self.rng.choice(["short body", "short body reset", "headers only", "pipelined", "get stream"])
        desc.append(kind)
        body = json.dumps({"jsonrpc": "2.0", "id": 1, "method": "ping"}).encode()
        hdrs = self.hs_headers(p)
        if kind == "get stream":
            hdrs = {"Accept": "text/event-stream", "Mcp-Session-Id": p.hs_sid, "MCP-Protocol-Version": HS,
                    **p.auth()}
            head = "GET /mcp HTTP/1.1\r\nHost: 127.0.0.1\r\n"
        else:
            hdrs["Content-Length"] = str(len(body) + (40 if kind.startswith("short") else 0))
            head = "POST /mcp HTTP/1.1\r\nHost: 127.0.0.1\r\n"
        head = (head + "".join(f"{k}: {v}\r\n" for k, v in hdrs.items()) + "\r\n").encode()
        sock = socket.create_connection(("127.0.0.1", self.http.port), timeout=BOUND)
        try:
            if kind == "headers only":
                sock.sendall(head)
            elif kind == "pipelined":
                sock.sendall(head + body + head + body)
                got = b""
                while got.count(b'"result":{}') < 2:
                    chunk = sock.recv(65536)
                    assert chunk, got
                    got += chunk
            elif kind == "get stream":
                # A session has one standalone stream at a time: another raw GET of a burst,
                # open on it now or closed a moment ago (the server sees the close at its
                # next turn), makes this one a 409, and only that.
                with self.lock:
                    g = self.raw_gets.setdefault(p.hs_sid, [0, 0.0])
                    others = g[0] > 0 or time.monotonic() - g[1] < 5
                    g[0] += 1
                try:
                    sock.sendall(head)
                    got = sock.recv(65536)
                    with self.lock:
                        others = others or g[0] > 1
                finally:
                    sock.close()
                    with self.lock:
                        g[0] -= 1
                        g[1] = time.monotonic()
                if others and got.startswith(b"HTTP/1.1 409"):
                    assert b"Only one SSE stream" in got, got[:300]
                else:
                    assert got.startswith(b"HTTP/1.1 200"), ("the standalone stream was refused", got[:300])
            else:
                sock.sendall(head + body)
                if kind.endswith("reset"):
                    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
        finally:
            sock.close()

    # ================================================================ operations: at once
    BURST = ["exec_ok", "exec_fail", "exec_outputs", "malformed", "hangup", "raw_connection", "artifact_read",
             "artifact_foreign", "task_create", "task_poll", "cancel_inflight", "session_fail_first"]

    def op_burst(self, desc):
        """Several operations at once, each in a thread with a generator of its own (seeded
        from the main one: the choices stay reproducible)."""
        n = self.rng.randint(2, 6)
        plan = [(self.rng.choice(self.BURST), self.rng.randrange(2 ** 32)) for _ in range(n)]
        errors = []

        def run(name, seed, sub):
            self.local.rng = random.Random(seed)
            try:
                getattr(self, "op_" + name)(sub)
            except BaseException as e:  # noqa: B902
                errors.append(f"{' '.join(sub)}: " + "".join(traceback.format_exception(e))[-2500:])
        threads = []
        for name, seed in plan:
            sub = [name]
            desc.append(sub)
            threads.append(threading.Thread(target=run, args=(name, seed, sub), daemon=True))
        for t in threads:
            t.start()
        for t in threads:
            t.join(BOUND + 30)
            assert not t.is_alive(), f"a burst's operation was not answered within {BOUND} s"
        assert not errors, errors[0]

    def op_session_contended(self, desc):
        """Calls at once in one session: one runs at a time, the others are refused as busy (or
        wait their turn); the session's state holds exactly the calls that ran."""
        p, era = self.pick(desc)
        if not p.sessions:
            return self.op_session_new(desc)
        sid = self.rng.choice(list(p.sessions))
        bumps = [self.rng.randrange(1, 100) for _ in range(self.rng.randint(2, 4))]
        desc += [sid, bumps]
        answers = [None] * len(bumps)

        def run(i):
            answers[i] = self.execute(p, era, {"script": f"import time\ntime.sleep(0.2)\nv += {bumps[i]}\nprint(v)",
                                               "session": sid})
        threads = [threading.Thread(target=run, args=(i,), daemon=True) for i in range(len(bumps))]
        for t in threads:
            t.start()
        for t in threads:
            t.join(BOUND)
        ran = 0
        for i, r in enumerate(answers):
            assert r is not None, "a call was not answered"
            if r["isError"]:
                assert "running another call" in r["content"][0]["text"], r
            else:
                ran += bumps[i]
        assert ran, answers  # one of them ran
        p.sessions[sid] += ran
        r = self.execute(p, era, {"script": "print(v)", "session": sid})
        assert r["structuredContent"]["stdout"] == f"{p.sessions[sid]}\n", (r, answers)

    # ================================================================ operations: malformed bodies
    MALFORMED = [
        ("bad json", b'{"jsonrpc": "2.0", "id": 1, "method": '),
        ("not an object", b'"hello"'),
        ("empty", b""),
        ("params array", json.dumps({"jsonrpc": "2.0", "id": 5, "method": "tools/call", "params": [1]}).encode()),
        ("id object", json.dumps({"jsonrpc": "2.0", "id": {"a": 1}, "method": "ping"}).encode()),
        ("huge int id", b'{"jsonrpc": "2.0", "id": 1' + b"0" * 400 + b', "method": "ping"}'),
        ("huge string id", json.dumps({"jsonrpc": "2.0", "id": "i" * 200000, "method": "ping"}).encode()),
        ("float id", b'{"jsonrpc": "2.0", "id": 1e308, "method": "ping"}'),
        ("method number", json.dumps({"jsonrpc": "2.0", "id": 6, "method": 7}).encode()),
        ("arguments string", json.dumps({"jsonrpc": "2.0", "id": 7, "method": "tools/call",
                                         "params": {"name": "execute_python", "arguments": "x"}}).encode()),
        ("timeout string", json.dumps({"jsonrpc": "2.0", "id": 8, "method": "tools/call",
                                       "params": {"name": "execute_python",
                                                  "arguments": {"script": "1", "timeout_seconds": "x"}}}).encode()),
        ("session number", json.dumps({"jsonrpc": "2.0", "id": 9, "method": "tools/call",
                                       "params": {"name": "execute_python",
                                                  "arguments": {"script": "1", "session": 12}}}).encode()),
        ("task ttl string", json.dumps({"jsonrpc": "2.0", "id": 10, "method": "tools/call",
                                        "params": {"name": "execute_python", "task": {"ttl": "x"},
                                                   "arguments": {"script": "1"}}}).encode()),
        ("taskId number", json.dumps({"jsonrpc": "2.0", "id": 11, "method": "tasks/get",
                                      "params": {"taskId": 5}}).encode()),
        ("batch", json.dumps([{"jsonrpc": "2.0", "id": 12, "method": "ping"}]).encode()),
        ("deep nesting", b'{"jsonrpc": "2.0", "id": 13, "method": "ping", "params": ' + b"[" * 5000 + b"]" * 5000 + b"}"),
        ("nul in method", b'{"jsonrpc": "2.0", "id": 14, "method": "pi\\u0000ng"}'),
        ("cancel unknown", json.dumps({"jsonrpc": "2.0", "method": "notifications/cancelled",
                                       "params": {"requestId": "nope"}}).encode()),
        ("response", json.dumps({"jsonrpc": "2.0", "id": 15, "result": {}}).encode()),
    ]

    def op_malformed(self, desc):
        p, era = self.pick(desc)
        name, body = self.rng.choice(self.MALFORMED)
        desc.append(name)
        if era == "hs":
            headers = self.hs_headers(p)
        else:
            headers = {"Accept": ACCEPT_BOTH, "Content-Type": "application/json",
                       "MCP-Protocol-Version": MODERN, "Mcp-Method": "ping", **p.auth()}
            try:  # the modern era reads _meta: give the object one where it has params
                msg = json.loads(body)
                if isinstance(msg, dict) and isinstance(msg.get("params"), dict):
                    msg["params"]["_meta"] = self.modern_params({})["_meta"]
                    headers["Mcp-Method"] = str(msg.get("method"))
                    body = json.dumps(msg).encode()
            except (ValueError, RecursionError):  # not JSON, or too deep for Python's parser
                pass
        st, h, data = self.http.request("POST", "/mcp", body, headers)
        assert st < 500, (st, data[:300])
        if st in (200, 400, 404) and data:
            ans = answer_of(st, h, data, None)
            assert ans is None or isinstance(ans, (dict, list)), data[:300]

    # ================================================================ operations: SIGHUP
    def op_sighup_rotate(self, desc):
        """The tokens file swaps bob's token for his other one (same principal) and the server
        reloads it: the old token is refused, and what it opened over the transport ends with
        it (issue 28: its handshake session answers 404, so bob initializes again); the new one
        reaches everything else of bob's (his Python sessions, tasks and artifacts)."""
        b = self.bob
        b.rotations += 1
        self.http.bob = 1 - self.http.bob
        self.http.write_tokens()
        self.http.proc.send_signal(signal.SIGHUP)
        old = b.auth()
        b.token_index = self.http.bob
        desc.append(f"bob -> token {b.token_index}")
        ping = json.dumps({"jsonrpc": "2.0", "id": 1, "method": "ping"}).encode()
        hdrs = self.hs_headers(b)
        # The reload is asynchronous: the new token works once it is read; the old token's
        # handshake session is gone by then.
        assert wait_until(lambda: self.http.request("POST", "/mcp", ping, hdrs)[0] == 404, 15), \
            self.http.request("POST", "/mcp", ping, hdrs)
        self.initialize(b)
        hdrs = self.hs_headers(b)
        assert self.http.request("POST", "/mcp", ping, hdrs)[0] == 200
        assert self.http.request("POST", "/mcp", ping, {**hdrs, **old})[0] == 401
        self.check_listings(b)

    # ================================================================ operations: stdio
    def op_stdio_exec(self, desc):
        kind = self.rng.choice(["ok", "fail", "timeout", "outputs"])
        desc.append(kind + (" modern" if self.stdio_modern else " hs"))
        if kind == "ok":
            r = self.stdio_execute({"script": "print(6 * 7)"})
            assert r["structuredContent"]["stdout"] == "42\n", r
        elif kind == "fail":
            r = self.stdio_execute({"script": "raise SystemExit(1)"})
            assert r["isError"] is True and r["structuredContent"]["exit_code"] == 1, r
        elif kind == "timeout":
            r = self.stdio_execute({"script": "import time\ntime.sleep(60)", "timeout_seconds": 1})
            assert r["structuredContent"]["timed_out"] is True, r
        else:
            r = self.stdio_execute({"script": "import os\nos.makedirs('outputs')\nopen('outputs/a.txt', 'w').write('a')"})
            uri = r["structuredContent"]["files"][0]["uri"]
            read = self.stdio_request("resources/read", {"uri": uri})
            assert read["result"]["contents"][0]["text"] == "a", read
            # alice's artifacts on the other server are unknown here
            for u in list(self.alice.artifacts)[:1]:
                e = self.stdio_request("resources/read", {"uri": u})
                assert "error" in e, e

    def op_stdio_session(self, desc):
        m = self.stdio_model
        kind = self.rng.choice(["new", "use", "use", "close", "fail"])
        desc.append(kind)
        if kind == "use" and not m.sessions or kind == "new" and len(m.sessions) >= 3:
            kind = "close" if m.sessions else "new"
        if kind == "new":
            r = self.stdio_execute({"script": "v = 1", "session": "new"})
            assert r["isError"] is False, r
            m.sessions[r["structuredContent"]["session"]["id"]] = 1
        elif kind == "use":
            sid = self.rng.choice(list(m.sessions))
            r = self.stdio_execute({"script": "v += 1\nprint(v)", "session": sid})
            m.sessions[sid] += 1
            assert r["structuredContent"]["stdout"] == f"{m.sessions[sid]}\n", r
        elif kind == "close" and m.sessions:
            sid = self.rng.choice(list(m.sessions))
            r = self.stdio_request("tools/call", {"name": "close_session", "arguments": {"session": sid}})
            assert not r["result"].get("isError"), r
            del m.sessions[sid]
        elif kind == "fail":
            args = self.rng.choice([{"python_version": "9.99"}, {"dependencies": ["mps-chaos-nothing"]}])
            r = self.stdio_execute({"script": "1", "session": "new", **args})
            assert r["isError"] is True, r

    def op_stdio_task(self, desc):
        m = self.stdio_model
        s = self.stdio
        if m.tasks and self.rng.random() < 0.6:
            tid = self.rng.choice(list(m.tasks))
            method = self.rng.choice(["tasks/get", "tasks/cancel"])
            desc += [method, tid]
            r = self.stdio_request(method, {"taskId": tid}, declare_tasks=True)
            if method == "tasks/cancel" and "result" in r:
                m.tasks[tid]["cancelled"] = True
            elif "result" in r and r["result"]["status"] == "cancelled":
                assert m.tasks[tid]["cancelled"], r
            elif "error" in r:
                assert method == "tasks/cancel" and r["error"]["code"] == -32602, r
            return
        if len(m.tasks) >= 28:
            return
        script = "import time\ntime.sleep(%s)\nprint('t')" % self.rng.choice(["0", "0.5", "2"])
        if self.stdio_modern:
            r = self.stdio_execute({"script": script, "timeout_seconds": 120}, declare_tasks=True)
            tid = r["taskId"]
        else:
            msg_id = self.next_id()
            s.send({"jsonrpc": "2.0", "id": msg_id, "method": "tools/call",
                    "params": {"name": "execute_python", "task": {"ttl": 600000},
                               "arguments": {"script": script, "timeout_seconds": 120}}})
            tid = s.recv_response(msg_id, timeout=BOUND)["result"]["task"]["taskId"]
        m.tasks[tid] = {"stdout": "t\n", "cancelled": False}
        desc += ["create", tid]

    def op_stdio_cancel(self, desc):
        """notifications/cancelled of a running call on stdio: its processes end."""
        s = self.stdio
        marker = f"mps-chaos-s-{os.getpid()}-{self.seed}-{len(self.history)}"
        self.markers.append(marker)
        req_id = self.next_id()
        params = {"name": "execute_python", "arguments": {
            "script": ("import subprocess, sys, time\n"
                       f"subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(300)', '{marker}'])\n"
                       "print('started', flush=True)\ntime.sleep(60)"), "timeout_seconds": 30},
            "_meta": {"progressToken": "c%d" % req_id}}
        if self.stdio_modern:
            params["_meta"].update(self.modern_params({})["_meta"])
        s.send({"jsonrpc": "2.0", "id": req_id, "method": "tools/call", "params": params})
        assert wait_until(lambda: marker_processes(marker), 30)
        s.notify("notifications/cancelled", {"requestId": req_id, "reason": "chaos"})
        assert wait_until(lambda: not marker_processes(marker), 20), marker_processes(marker)

    def op_stdio_malformed(self, desc):
        s = self.stdio
        name, line = self.rng.choice([
            ("bad json", b"{nope\n"), ("array params", b'{"jsonrpc":"2.0","id":"m1","method":"tools/call","params":[]}\n'),
            ("huge id", b'{"jsonrpc":"2.0","id":' + b"9" * 300 + b',"method":"ping"}\n'),
            ("blank", b"\n"), ("string", b'"x"\n'),
            ("unknown method", b'{"jsonrpc":"2.0","id":"m2","method":"nope/nope"}\n')])
        desc.append(name)
        s.send_raw(line)


# (name, weight): the operation table.
OPS = [
    ("exec_ok", 8), ("exec_fail", 5), ("exec_timeout", 3), ("exec_flood", 2), ("exec_fork", 2),
    ("exec_outputs", 4),
    ("session_new", 4), ("session_use", 6), ("session_close", 2), ("session_foreign", 4),
    ("session_fail_first", 3),
    ("task_create", 5), ("task_poll", 5), ("task_result_waits", 2), ("task_cancel", 3),
    ("task_foreign", 4),
    ("artifact_read", 3), ("artifact_foreign", 3), ("listings", 2),
    ("cancel_inflight", 3), ("hangup", 3), ("malformed", 6), ("sighup_rotate", 1),
    ("attack_busy_session", 2), ("attack_cancel_foreign", 2), ("attack_task_session", 1),
    ("attack_modern_with_session_id", 1), ("raw_connection", 2), ("burst", 4), ("session_contended", 2),
    ("stdio_exec", 4), ("stdio_session", 3), ("stdio_task", 3), ("stdio_cancel", 1), ("stdio_malformed", 2),
]


def seeds():
    env = os.environ.get("MPS_CHAOS_SEEDS")
    if env:
        return [int(s) for s in env.split(",") if s.strip()]
    return DEFAULT_SEEDS


def n_ops():
    return int(os.environ.get("MPS_CHAOS_OPS", DEFAULT_OPS))


@pytest.mark.skipif(bool(os.environ.get("MPS_CHAOS_SECONDS")), reason="a campaign runs instead")
@pytest.mark.parametrize("seed", seeds())
def test_chaos(seed):
    Chaos(seed, n_ops(), BACKEND).run()


@pytest.mark.skipif(not os.environ.get("MPS_CHAOS_SECONDS"), reason="MPS_CHAOS_SECONDS starts a campaign")
def test_chaos_campaign():
    """Random seeds until MPS_CHAOS_SECONDS have passed; each seed is printed before it runs."""
    end = time.monotonic() + float(os.environ["MPS_CHAOS_SECONDS"])
    done = 0
    while time.monotonic() < end:
        seed = int.from_bytes(os.urandom(4), "big")
        print(f"chaos campaign: seed {seed}", flush=True)
        Chaos(seed, n_ops(), BACKEND).run()
        done += 1
    print(f"chaos campaign: {done} seeds of {n_ops()} operations passed")


# ---------------------------------------------------------------- regressions the chaos found

def test_a_new_sessions_first_call_failing_before_its_kernel_starts():
    """session "new" whose first call fails before a kernel starts (python_version "9.99", a
    dependency that cannot be installed), over HTTP in both eras and over stdio: an error
    saying the session closed, the server lives on, and no session is left.  Such a call freed
    the session while it was still in use (a use after free in exec_session_job_done: ASan
    reports it at once, a normal build crashed at times): seed 11, operation #9
    (MPS_CHAOS_SEEDS=11 MPS_CHAOS_OPS=10 with the sanitizer build)."""
    c = Chaos(0, 0, BACKEND)
    c.stdio_modern = False
    try:
        c.start()
        p = c.alice
        for transport in ("hs", "modern", "stdio"):
            for args in ({"python_version": "9.99"}, {"python_version": "9.99"},
                         {"dependencies": ["mps-chaos-missing"]}):
                call = {"script": "print(1)", "session": "new", **args}
                r = c.stdio_execute(call) if transport == "stdio" else c.execute(p, transport, call)
                assert r["isError"] is True, (transport, r)
                assert "(closed: its first call did not start)" in r["content"][0]["text"], (transport, r)
                c.check_alive()
            if transport == "stdio":
                r = c.stdio_request("tools/call", {"name": "list_sessions", "arguments": {}})["result"]
            else:
                r = c.tool(p, transport, "list_sessions", {})
            assert r["structuredContent"]["sessions"] == [], (transport, r)
        c.drain()
    finally:
        c.cleanup()

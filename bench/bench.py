#!/usr/bin/python3
"""Benchmarks: mcp-python-exec-sandbox against its limits and its peers.

Run through bench/run.sh (which installs wrk and the pinned reference server and builds a
release binary); or directly:

    /usr/bin/python3 bench/bench.py --binary build-bench/mcp-python-exec-sandbox [--quick]
                                    [--cases 1,2,5] [--results DIR]

Every comparison is measured side by side: the compared commands run interleaved, in a
shuffled order in every round, so that noise on this shared 2-core machine hits all of them
alike.  The table shows medians and ratios of medians; absolute times are only context.
Stdlib only; loopback only; every case is bounded in count and time.
"""
import argparse
import http.client
import http.server
import json
import os
import platform
import random
import selectors
import shutil
import signal
import socket
import socketserver
import statistics
import subprocess
import sys
import tempfile
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, os.path.join(ROOT, "tests", "fixtures"))
import wheelhouse  # noqa: E402

LATEST = "2025-11-25"
BARE_BWRAP = ["--ro-bind", "/", "/", "--dev", "/dev", "--proc", "/proc", "--unshare-all", "--die-with-parent"]
# What the server gives a script (server/execute.c job_run), for the bare runs.
SCRIPT_ENV = {"PATH": "/usr/local/bin:/usr/bin:/bin", "LANG": "C.UTF-8", "LC_ALL": "C.UTF-8",
              "PYTHONUNBUFFERED": "1", "PYTHONDONTWRITEBYTECODE": "1", "PYTHONIOENCODING": "utf-8"}
# No pip configuration from the caller's environment leaks into the dependency cases.
NO_PIP_ENV = ("PIP_FIND_LINKS", "PIP_INDEX_URL", "PIP_EXTRA_INDEX_URL", "PIP_NO_INDEX", "PIP_CONFIG_FILE")
PY311 = "/root/.pyenv/versions/3.11.7/bin/python"
PYDANTIC_SET = ["pydantic", "pydantic_core", "annotated-types", "typing_extensions", "typing-inspection"]

STARTED = []  # every process this harness started: killed by pid at exit


def log(*a):
    print(*a, file=sys.stderr, flush=True)


# ------------------------------------------------------------------------------ statistics

def median(xs):
    return statistics.median(xs) if xs else None


def pct(xs, p):
    if not xs:
        return None
    s = sorted(xs)
    k = (len(s) - 1) * p / 100.0
    lo = int(k)
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (k - lo)


def summary(xs):
    return {"n": len(xs), "median": median(xs), "p10": pct(xs, 10), "p90": pct(xs, 90),
            "min": min(xs) if xs else None, "max": max(xs) if xs else None}


# ------------------------------------------------------------------------------ results

class Results:
    def __init__(self):
        self.rows = []

    def add(self, case, label, value, unit, baseline=None, baseline_value=None, ratio=None, goal=None,
            ok=None, note=None, details=None):
        row = {"case": case, "label": label, "value": value, "unit": unit, "baseline": baseline,
               "baseline_value": baseline_value, "ratio": ratio, "goal": goal,
               "status": None if ok is None else ("PASS" if ok else "MISS"), "note": note,
               "details": details or {}}
        self.rows.append(row)
        log(f"  -> {fmt_row_text(row)}")
        return row

    def unavailable(self, case, label, why, goal=None):
        row = {"case": case, "label": label, "value": None, "unit": None, "baseline": None,
               "baseline_value": None, "ratio": None, "goal": goal, "status": "N/A",
               "note": why, "details": {}}
        self.rows.append(row)
        log(f"  -> {label}: {why}")


def fmt_val(v, unit):
    if v is None:
        return "—"
    if unit == "ms":
        return f"{v:.2f} ms" if v < 100 else f"{v:.0f} ms"
    if unit == "s":
        return f"{v:.2f} s"
    if unit == "req/s":
        return f"{v:,.0f} req/s"
    if unit == "calls/s":
        return f"{v:.1f} calls/s"
    if unit == "MiB":
        return f"{v:.2f} MiB"
    if unit == "KiB":
        return f"{v:,.0f} KiB"
    return f"{v} {unit}"


def fmt_ratio(r):
    return "—" if r is None else f"{r:.3f}×"


def fmt_row_text(row):
    if row["status"] == "N/A":
        return f"{row['label']}: {row['note']}"
    s = f"{row['label']}: {fmt_val(row['value'], row['unit'])}"
    if row["baseline"]:
        s += f" vs {row['baseline']} {fmt_val(row['baseline_value'], row['unit'])} = {fmt_ratio(row['ratio'])}"
    if row["goal"]:
        s += f"  goal {row['goal']}: {row['status']}"
    if row["note"]:
        s += f"  ({row['note']})"
    return s


CASE_NAMES = {
    1: "Trivial call (stdio)",
    2: "Cached dependencies",
    3: "Cold environment",
    4: "Start-up and idle memory",
    5: "HTTP protocol throughput",
    6: "100 concurrent executions (HTTP)",
    7: "Streaming latency (stdio)",
    8: "Network: egress proxy vs off vs host",
    9: "Time bounds the tests used to assert",
    10: "A call in a warm session (stdio)",
    11: "Prestarted interpreters (issue 20)",
    12: "Sustained trivial calls: CPU per call (stdio)",
    13: "Sustained session calls: CPU per call, PSS per session",
    14: "The data path: a large input, a large environment store",
    15: "HTTP at 8 clients: cold pool and sustained",
}


def markdown_table(rows):
    out = ["| # | measurement | ours | baseline | ratio | goal | result |",
           "| --- | --- | ---: | --- | ---: | --- | --- |"]
    for r in rows:
        if r["status"] == "N/A":
            out.append(f"| {r['case']} | {r['label']} | {r['note']} | | | {r['goal'] or ''} | n/a |")
            continue
        base = f"{r['baseline']}: {fmt_val(r['baseline_value'], r['unit'])}" if r["baseline"] else ""
        label = r["label"] + (f" ({r['note']})" if r["note"] else "")
        out.append(f"| {r['case']} | {label} | {fmt_val(r['value'], r['unit'])} | {base} | "
                   f"{fmt_ratio(r['ratio']) if r['ratio'] is not None else ''} | {r['goal'] or ''} | "
                   f"{'**' + r['status'] + '**' if r['status'] == 'MISS' else (r['status'] or '')} |")
    return "\n".join(out)


def text_table(rows):
    hdr = ["#", "measurement", "ours", "baseline", "ratio", "goal", "result"]
    lines = []
    for r in rows:
        if r["status"] == "N/A":
            lines.append([str(r["case"]), r["label"], r["note"], "", "", r["goal"] or "", "n/a"])
            continue
        base = f"{r['baseline']}: {fmt_val(r['baseline_value'], r['unit'])}" if r["baseline"] else ""
        lines.append([str(r["case"]), r["label"], fmt_val(r["value"], r["unit"]), base,
                      fmt_ratio(r["ratio"]) if r["ratio"] is not None else "", r["goal"] or "", r["status"] or ""])
    widths = [max(len(hdr[i]), *(len(l[i]) for l in lines)) if lines else len(hdr[i]) for i in range(len(hdr))]
    fmt = "  ".join("{:<%d}" % w for w in widths)
    out = [fmt.format(*hdr), fmt.format(*("-" * w for w in widths))]
    out += [fmt.format(*l) for l in lines]
    return "\n".join(out)


# ------------------------------------------------------------------------------ processes

def kill_started():
    for p in STARTED:
        if p.poll() is None:
            try:
                p.kill()
                p.wait(timeout=5)
            except Exception:
                pass


def popen(argv, **kw):
    p = subprocess.Popen(argv, **kw)
    STARTED.append(p)
    return p


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_listening(port, proc, timeout=10.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            return False
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                return True
        except OSError:
            time.sleep(0.02)
    return False


def server_env(extra=None):
    env = dict(os.environ)
    env["MCP_PY_SANDBOX_WARM_CACHE"] = "0"
    for k in NO_PIP_ENV:
        env.pop(k, None)
    env.update(extra or {})
    return env


class Spawner:
    """Bare commands: posix_spawn + waitpid, the least a launcher can add."""

    def __init__(self):
        self.devnull = os.open(os.devnull, os.O_RDWR)
        self.actions = [(os.POSIX_SPAWN_DUP2, self.devnull, 0), (os.POSIX_SPAWN_DUP2, self.devnull, 1),
                        (os.POSIX_SPAWN_DUP2, self.devnull, 2)]

    def run(self, argv, env):
        t0 = time.monotonic()
        pid = os.posix_spawn(argv[0], argv, env, file_actions=self.actions)
        _, status = os.waitpid(pid, 0)
        dt = time.monotonic() - t0
        if os.waitstatus_to_exitcode(status) != 0:
            raise RuntimeError(f"{argv[:3]}... exited with status {status}")
        return dt


class StdioServer:
    """The binary on stdio, driven synchronously: write a request, read lines until its
    response (notifications are kept, with their arrival time)."""

    def __init__(self, binary, args, state_dir, env=None):
        self.stderr = tempfile.TemporaryFile()
        argv = [binary, "--state-dir", state_dir, "--log-level", "warning", *args]
        self.proc = popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self.stderr,
                          env=server_env(env))
        self.next_id = 1
        self.notes = []

    def send(self, obj):
        self.proc.stdin.write(json.dumps(obj).encode() + b"\n")
        self.proc.stdin.flush()

    def read(self):
        line = self.proc.stdout.readline()
        t = time.monotonic()
        if not line:
            raise EOFError("server closed stdout: " + self.stderr_text()[-2000:])
        return json.loads(line), t

    def request(self, method, params=None, on_note=None):
        rid = self.next_id
        self.next_id += 1
        msg = {"jsonrpc": "2.0", "id": rid, "method": method}
        if params is not None:
            msg["params"] = params
        t0 = time.monotonic()
        self.send(msg)
        while True:
            m, t = self.read()
            if m.get("id") == rid and "method" not in m:
                return m, t - t0
            if on_note:
                on_note(m, t)

    def initialize(self):
        r, _ = self.request("initialize", {"protocolVersion": "2025-06-18", "capabilities": {},
                                           "clientInfo": {"name": "bench", "version": "0"}})
        assert "result" in r, r
        self.send({"jsonrpc": "2.0", "method": "notifications/initialized"})
        return r["result"]

    def execute(self, script, check=True, **args):
        r, dt = self.request("tools/call", {"name": "execute_python", "arguments": {"script": script, **args}})
        res = r.get("result")
        if check:
            sc = (res or {}).get("structuredContent")
            if not sc or sc.get("exit_code") != 0 or res.get("isError"):
                raise RuntimeError("execute_python failed: " + json.dumps(r)[:2000])
        return res, dt

    def rss_kib(self, field="VmRSS"):
        with open(f"/proc/{self.proc.pid}/status") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1])
        return None

    def stderr_text(self):
        self.stderr.seek(0)
        return self.stderr.read().decode(errors="replace")

    def close(self):
        if self.proc.poll() is None:
            try:
                self.proc.stdin.close()
                self.proc.wait(timeout=10)
            except Exception:
                self.proc.kill()
                self.proc.wait()
        self.stderr.close()


# ------------------------------------------------------------------------------ HTTP client

def messages_of(content_type, body):
    """The JSON-RPC messages of a response body: an SSE stream's data fields, or JSON."""
    msgs = []
    if "text/event-stream" in content_type:
        for block in body.decode().replace("\r\n", "\n").split("\n\n"):
            data = "\n".join(l[5:].lstrip() for l in block.split("\n") if l.startswith("data:"))
            if data.strip():
                msgs.append(json.loads(data))
    elif body.strip():
        m = json.loads(body)
        msgs.extend(m if isinstance(m, list) else [m])
    return msgs


class McpHttp:
    """One Streamable HTTP session over one keep-alive connection."""

    def __init__(self, port, path="/mcp"):
        self.port, self.path = port, path
        self.conn = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
        self.sid = None
        self.version = LATEST
        self.next_id = 1

    def post(self, obj):
        headers = {"Content-Type": "application/json", "Accept": "application/json, text/event-stream"}
        if self.sid:
            headers["Mcp-Session-Id"] = self.sid
            headers["Mcp-Protocol-Version"] = self.version
        self.conn.request("POST", self.path, body=json.dumps(obj).encode(), headers=headers)
        resp = self.conn.getresponse()
        body = resp.read()
        return resp.status, resp, messages_of(resp.getheader("Content-Type") or "", body)

    def initialize(self):
        status, resp, msgs = self.post({"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {
            "protocolVersion": LATEST, "capabilities": {}, "clientInfo": {"name": "bench", "version": "0"}}})
        if status != 200 or not msgs or "result" not in msgs[-1]:
            raise RuntimeError(f"initialize: HTTP {status} {msgs}")
        self.sid = resp.getheader("Mcp-Session-Id")
        self.version = msgs[-1]["result"].get("protocolVersion", LATEST)
        status, _, _ = self.post({"jsonrpc": "2.0", "method": "notifications/initialized"})
        if status not in (200, 202):
            raise RuntimeError(f"notifications/initialized: HTTP {status}")

    def request(self, method, params=None):
        rid = self.next_id
        self.next_id += 1
        msg = {"jsonrpc": "2.0", "id": rid, "method": method}
        if params is not None:
            msg["params"] = params
        status, _, msgs = self.post(msg)
        answers = [m for m in msgs if isinstance(m, dict) and m.get("id") == rid and "method" not in m]
        return status, answers

    def close(self):
        self.conn.close()


def parse_http_response(raw):
    """(status, headers (lower-case names), the JSON-RPC messages) of one whole HTTP/1.1
    response read up to the close of its connection (chunked or not; JSON or SSE)."""
    head, _, body = raw.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    status = int(lines[0].split()[1])
    headers = {}
    for line in lines[1:]:
        k, _, v = line.partition(":")
        headers[k.strip().lower()] = v.strip()
    if "chunked" in headers.get("transfer-encoding", "").lower():
        out, rest = b"", body
        while rest:
            size_line, _, rest = rest.partition(b"\r\n")
            size = int(size_line.split(b";")[0], 16)
            if size == 0:
                break
            out, rest = out + rest[:size], rest[size + 2:]
        body = out
    return status, headers, messages_of(headers.get("content-type", ""), body)


def http_burst(port, requests, timeout=300):
    """Sends every (session id, protocol version, JSON-RPC message) at once, each on a
    connection of its own (Connection: close), from one thread with a selector: the client
    costs next to nothing, so the server's time is what is measured.  Returns the total
    time from the first send to the last response's end, and per request (status, the
    messages that answer its id)."""
    socks, bufs, done_at = [], [], []
    for sid, version, msg in requests:
        body = json.dumps(msg).encode()
        head = (f"POST /mcp HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nContent-Type: application/json\r\n"
                f"Accept: application/json, text/event-stream\r\nMcp-Session-Id: {sid}\r\n"
                f"Mcp-Protocol-Version: {version}\r\nConnection: close\r\n"
                f"Content-Length: {len(body)}\r\n\r\n").encode()
        s = socket.create_connection(("127.0.0.1", port), timeout=30)
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        socks.append((s, head + body))
        bufs.append([])
        done_at.append(None)
    sel = selectors.DefaultSelector()
    t0 = time.monotonic()
    for i, (s, data) in enumerate(socks):
        s.sendall(data)  # a few hundred bytes: never blocks on a fresh connection
        s.setblocking(False)
        sel.register(s, selectors.EVENT_READ, i)
    left = len(socks)
    deadline = t0 + timeout
    while left and time.monotonic() < deadline:
        for key, _ in sel.select(timeout=1.0):
            i = key.data
            try:
                chunk = key.fileobj.recv(65536)
            except BlockingIOError:
                continue
            if chunk:
                bufs[i].append(chunk)
                continue
            done_at[i] = time.monotonic()
            sel.unregister(key.fileobj)
            left -= 1
    total = max(d for d in done_at if d is not None) - t0 if left < len(socks) else float("inf")
    results = []
    for (s, _), (_, _, msg), chunks in zip(socks, requests, bufs):
        s.close()
        try:
            status, _, msgs = parse_http_response(b"".join(chunks))
            results.append((status, [m for m in msgs if isinstance(m, dict) and m.get("id") == msg["id"]
                                     and "method" not in m]))
        except Exception as e:  # noqa: BLE001
            results.append((None, repr(e)))
    sel.close()
    return total, results


def curl_initialize(port):
    """initialize + notifications/initialized with curl, as a client would: the session id."""
    body = json.dumps({"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {
        "protocolVersion": LATEST, "capabilities": {}, "clientInfo": {"name": "bench-wrk", "version": "0"}}})
    url = f"http://127.0.0.1:{port}/mcp"
    out = subprocess.run(["curl", "-sS", "-D", "-", "-X", "POST", url, "-H", "Content-Type: application/json",
                          "-H", "Accept: application/json, text/event-stream", "--data-binary", body],
                         capture_output=True, text=True, timeout=20)
    sid = None
    version = LATEST
    for line in out.stdout.splitlines():
        if line.lower().startswith("mcp-session-id:"):
            sid = line.split(":", 1)[1].strip()
        if '"protocolVersion"' in line:
            try:
                payload = line[5:] if line.startswith("data:") else line
                version = json.loads(payload)["result"]["protocolVersion"]
            except Exception:
                pass
    if not sid:
        raise RuntimeError("no Mcp-Session-Id from initialize: " + out.stdout[:500] + out.stderr[:500])
    subprocess.run(["curl", "-sS", "-o", "/dev/null", "-X", "POST", url, "-H", "Content-Type: application/json",
                    "-H", "Accept: application/json, text/event-stream", "-H", f"Mcp-Session-Id: {sid}",
                    "-H", f"Mcp-Protocol-Version: {version}",
                    "--data-binary", '{"jsonrpc":"2.0","method":"notifications/initialized"}'],
                   capture_output=True, timeout=20)
    return sid, version


# ------------------------------------------------------------------------------ the harness

class Bench:
    def __init__(self, args):
        self.args = args
        self.quick = args.quick
        self.binary = os.path.abspath(args.binary)
        self.res = Results()
        self.rng = random.Random(args.seed)
        self.tmp = tempfile.mkdtemp(prefix="mps-bench-")
        os.chmod(self.tmp, 0o755)
        self.spawner = Spawner()
        self.bwrap = shutil.which("bwrap")
        self.ideal_failures = 0
        self._wheels = None
        self._http = None
        self.default_python = None

    def n(self, full, quick):
        return quick if self.quick else full

    def state_dir(self, name):
        d = os.path.join(self.tmp, "state-" + name)
        os.makedirs(d, exist_ok=True)
        return d

    def python_of(self, res):
        return res["structuredContent"]["python"]["path"]

    # -------------------------------------------------------------- shared fixtures
    def wheels(self):
        """A world-readable wheelhouse: the synthetic set, one more synthetic package, and
        (when CPython 3.11.7 has it installed) the pydantic set re-packed."""
        if self._wheels:
            return self._wheels
        d = os.path.join(self.tmp, "wheels")
        os.makedirs(d)
        os.chmod(d, 0o755)
        wheelhouse.build_synthetic(d)
        wheelhouse.make_wheel(d, "mps-delta", "1.0",
                              files={"mps_delta/__init__.py": "import mps_gamma\nDELTA = 1\n"},
                              requires=["mps-gamma"])
        pydantic = False
        if os.access(PY311, os.X_OK):
            try:
                for dist in PYDANTIC_SET:
                    wheelhouse.repack_installed(d, PY311, dist)
                pydantic = True
            except Exception as e:  # noqa: BLE001
                log(f"  (pydantic set not re-packed: {e})")
        for f in os.listdir(d):
            os.chmod(os.path.join(d, f), 0o644)
        self._wheels = (d, pydantic)
        return self._wheels

    def http_available(self):
        """Whether the binary serves Streamable HTTP: it must accept --transport http and
        listen on the port."""
        if self._http is not None:
            return self._http
        port = free_port()
        errf = tempfile.TemporaryFile()
        p = popen([self.binary, "--transport", "http", "--port", str(port), "--sandbox-backend", "none",
                   "--state-dir", self.state_dir("http-probe"), "--log-level", "warning"],
                  stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=errf, env=server_env())
        ok = wait_listening(port, p, timeout=5)
        if p.poll() is None:
            p.send_signal(signal.SIGTERM)
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
        errf.seek(0)
        err = errf.read().decode(errors="replace").strip().splitlines()
        if ok:
            self._http = (True, None)
        elif p.returncode == 2:
            self._http = (False, "not available yet (the binary rejects --transport http: "
                                 f"{err[-1] if err else 'exit 2'})")
        else:
            self._http = (False, "not available yet (the binary does not listen with --transport http)")
        return self._http

    def start_http(self, args=(), name="http"):
        port = free_port()
        errf = tempfile.TemporaryFile()
        p = popen([self.binary, "--transport", "http", "--port", str(port), "--state-dir", self.state_dir(name),
                   "--log-level", "warning", *args],
                  stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=errf, env=server_env())
        if not wait_listening(port, p, timeout=15):
            errf.seek(0)
            raise RuntimeError("HTTP server did not start: " + errf.read().decode(errors="replace")[-1000:])
        return p, port

    @staticmethod
    def stop(p):
        if p.poll() is None:
            p.send_signal(signal.SIGTERM)
            try:
                p.wait(timeout=15)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()

    # -------------------------------------------------------------- case 1
    def case1(self):
        log("case 1: trivial call vs bare bwrap vs bare python")
        servers = {
            "server, bwrap (default)": StdioServer(self.binary, [], self.state_dir("c1-bwrap")),
            "server, bwrap --network off": StdioServer(self.binary, ["--network", "off"],
                                                       self.state_dir("c1-bwrap-off")),
            "server, bwrap --prestart off": StdioServer(self.binary, ["--prestart", "off"],
                                                        self.state_dir("c1-bwrap-cold")),
            "server, --sandbox-backend none": StdioServer(self.binary, ["--sandbox-backend", "none"],
                                                          self.state_dir("c1-none")),
        }
        try:
            for s in servers.values():
                s.initialize()
                res, _ = s.execute("pass")  # waits for interpreter discovery
            py = self.python_of(res)
            self.default_python = py
            commands = {name: (lambda s=s: s.execute("pass")[1]) for name, s in servers.items()}
            commands["bare bwrap"] = lambda: self.spawner.run([self.bwrap, *BARE_BWRAP, py, "-c", "pass"], SCRIPT_ENV)
            commands["bare python"] = lambda: self.spawner.run([py, "-c", "pass"], SCRIPT_ENV)
            t = self.interleave(commands, warmup=self.n(5, 3), rounds=self.n(100, 30), settle=0.03)
            bb, bp = median(t["bare bwrap"]), median(t["bare python"])
            details = {k: summary(v) for k, v in t.items()}
            details["python"] = py
            for name in ("server, bwrap (default)", "server, bwrap --network off", "server, bwrap --prestart off"):
                m = median(t[name])
                self.res.add(1, f"execute_python(\"pass\"), {name[8:]}", m * 1e3, "ms", "bare bwrap", bb * 1e3,
                             m / bb, "≤ 1.05×", m / bb <= 1.05,
                             note=f"+{(m - bb) * 1e3:.1f} ms/call; {m / bp:.2f}× bare python",
                             details={"paired_ratio_median": self.paired(t[name], t["bare bwrap"]), **details})
            m = median(t["server, --sandbox-backend none"])
            self.res.add(1, "execute_python(\"pass\"), backend none", m * 1e3, "ms", "bare python", bp * 1e3,
                         m / bp, "≤ 1.05×", m / bp <= 1.05, note=f"+{(m - bp) * 1e3:.1f} ms/call",
                         details={"paired_ratio_median": self.paired(t["server, --sandbox-backend none"],
                                                                     t["bare python"])})
        finally:
            for s in servers.values():
                s.close()

    def interleave(self, commands, warmup, rounds, settle=0.0):
        """settle: seconds of pause after each command (not timed), so that work a server
        does after answering (setting up the next prestarted sandbox) never overlaps the
        next command, ours or a baseline's; calls from a model are seconds apart anyway."""
        names = list(commands)
        for _ in range(warmup):
            for nm in names:
                commands[nm]()
                time.sleep(settle)
        times = {nm: [] for nm in names}
        for _ in range(rounds):
            order = names[:]
            self.rng.shuffle(order)
            for nm in order:
                times[nm].append(commands[nm]())
                time.sleep(settle)
        return times

    @staticmethod
    def paired(a, b):
        return median([x / y for x, y in zip(a, b)])

    # -------------------------------------------------------------- case 2
    def case2(self):
        log("case 2: cached dependencies vs trivial call")
        wheels, _ = self.wheels()
        s = StdioServer(self.binary, ["--find-links", wheels, "--offline"], self.state_dir("c2"))
        deps = ["mps-beta", "mps-gamma", "mps-tool"]
        try:
            s.initialize()
            s.execute("pass")
            res, cold = s.execute("pass", dependencies=deps)
            env = res["structuredContent"].get("environment") or {}
            n_pkgs = len(env.get("packages") or {})

            def cached():
                r, dt = s.execute("pass", dependencies=deps)
                if not r["structuredContent"]["environment"]["cached"]:
                    raise RuntimeError("environment not cached")
                return dt
            t = self.interleave({"deps": cached, "trivial": lambda: s.execute("pass")[1]},
                                warmup=self.n(5, 3), rounds=self.n(60, 20), settle=0.03)
            m, b = median(t["deps"]), median(t["trivial"])
            self.res.add(2, f"cached environment ({n_pkgs} packages), bwrap", m * 1e3, "ms", "trivial call",
                         b * 1e3, m / b, "≤ 1.05×", m / b <= 1.05, note=f"+{(m - b) * 1e3:.1f} ms/call",
                         details={"first_call_build_s": cold, "deps": summary(t["deps"]),
                                  "trivial": summary(t["trivial"]), "paired_ratio_median": self.paired(t["deps"], t["trivial"]),
                                  "packages": env.get("packages")})
        finally:
            s.close()

    # -------------------------------------------------------------- case 3
    def case3(self):
        log("case 3: cold environment vs by hand")
        wheels, pydantic = self.wheels()
        synth = ["mps-beta", "mps-tool", "mps-delta"]  # + mps-alpha, mps-gamma: 5 wheels
        sets = []
        if not self.quick or not pydantic:
            sets.append(("5 synthetic wheels", synth, None, "import mps_beta, mps_tool, mps_delta"))
        if pydantic:
            sets.append(("5 synthetic + 5 pydantic wheels, CPython 3.11", synth + ["pydantic"], "3.11",
                         "import mps_beta, mps_tool, mps_delta, pydantic"))
        for label, reqs, pyver, script in sets:
            s = StdioServer(self.binary, ["--find-links", wheels, "--offline"], self.state_dir("c3-" + str(len(reqs))))
            try:
                s.initialize()
                extra = {"python_version": pyver} if pyver else {}
                res, _ = s.execute("pass", **extra)
                py = self.python_of(res)
                counter = [0]

                def variant_reqs():
                    # A different key per sample (same resolution): mps-gamma!=0.0.N.
                    counter[0] += 1
                    return reqs + [f"mps-gamma!=0.0.{counter[0]}"]

                def server_cold():
                    r, dt = s.execute(script, dependencies=variant_reqs(), **extra)
                    if r["structuredContent"]["environment"]["cached"]:
                        raise RuntimeError("expected a cold environment")
                    self._npk = len(r["structuredContent"]["environment"]["packages"])
                    return dt

                def by_hand(lean):
                    d = tempfile.mkdtemp(dir=self.tmp, prefix="venv-")
                    cache = tempfile.mkdtemp(dir=self.tmp, prefix="pipcache-")
                    env = {"PATH": "/usr/local/bin:/usr/bin:/bin", "LANG": "C.UTF-8", "HOME": self.tmp,
                           "PYTHONDONTWRITEBYTECODE": "1", "PIP_DISABLE_PIP_VERSION_CHECK": "1",
                           "PIP_NO_INPUT": "1", "PIP_PROGRESS_BAR": "off", "PIP_CACHE_DIR": cache}
                    r = variant_reqs()
                    t0 = time.monotonic()
                    if lean:
                        self.spawner.run([py, "-m", "venv", "--without-pip", d], env)
                        self.spawner.run([py, "-m", "pip", "--python", f"{d}/bin/python", "install", "--no-index",
                                          "--find-links", wheels, "--", *r], env)
                    else:
                        self.spawner.run([py, "-m", "venv", d], env)
                        self.spawner.run([f"{d}/bin/python", "-m", "pip", "install", "--no-index", "--find-links",
                                          wheels, *r], env)
                    self.spawner.run([f"{d}/bin/python", "-c", script], env)
                    dt = time.monotonic() - t0
                    shutil.rmtree(d, ignore_errors=True)
                    shutil.rmtree(cache, ignore_errors=True)
                    return dt
                t = self.interleave({"server": server_cold, "by hand": lambda: by_hand(False),
                                     "by hand, lean": lambda: by_hand(True)},
                                    warmup=self.n(1, 0), rounds=self.n(5, 2))
                m, b, bl = median(t["server"]), median(t["by hand"]), median(t["by hand, lean"])
                self.res.add(3, f"first call, {label} ({self._npk} packages)", m, "s",
                             "venv + pip install", b, m / b, "≤ 1.00×", m <= b,
                             note=f"{m / bl:.2f}× venv --without-pip + pip --python, unsandboxed ({bl:.2f} s)",
                             details={k: summary(v) for k, v in t.items()} | {"python": py})
            finally:
                s.close()

    # -------------------------------------------------------------- case 4
    def case4(self):
        log("case 4: start-up and idle memory")
        init = json.dumps({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
            "protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "bench", "version": "0"}}}).encode() + b"\n"
        rest = (b'{"jsonrpc":"2.0","method":"notifications/initialized"}\n'
                b'{"jsonrpc":"2.0","id":2,"method":"tools/list"}\n')
        rss = {"bwrap": [], "none": []}
        anon = {"bwrap": [], "none": []}
        first_call = {"bwrap": [], "none": []}

        def start(backend):
            def go():
                st = self.state_dir("c4-" + backend)
                t0 = time.monotonic()
                p = popen([self.binary, "--state-dir", st, "--log-level", "warning", "--sandbox-backend",
                           "native" if backend == "bwrap" else "none"],
                          stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=server_env())
                p.stdin.write(init)
                p.stdin.flush()
                line = p.stdout.readline()
                dt = time.monotonic() - t0
                assert b'"result"' in line, line
                p.stdin.write(rest)
                p.stdin.flush()
                p.stdout.readline()
                time.sleep(0.05)
                with open(f"/proc/{p.pid}/status") as f:
                    st = {l.split(":")[0]: int(l.split()[1]) for l in f if l.startswith(("VmRSS:", "RssAnon:"))}
                rss[backend].append(st["VmRSS"])
                anon[backend].append(st["RssAnon"])
                p.stdin.write(b'{"jsonrpc":"2.0","id":3,"method":"tools/call","params":{"name":"execute_python",'
                              b'"arguments":{"script":"pass"}}}\n')
                p.stdin.flush()
                p.stdout.readline()
                first_call[backend].append(time.monotonic() - t0)
                p.stdin.close()
                p.wait(timeout=15)
                return dt
            return go

        def floor():
            t0 = time.monotonic()
            p = popen(["/bin/cat"], stdin=subprocess.PIPE, stdout=subprocess.PIPE)
            p.stdin.write(init)
            p.stdin.flush()
            p.stdout.readline()
            dt = time.monotonic() - t0
            p.stdin.close()
            p.wait()
            return dt
        t = self.interleave({"bwrap": start("bwrap"), "none": start("none"), "floor": floor},
                            warmup=2, rounds=self.n(30, 10))
        fl = median(t["floor"])
        for backend, label in (("bwrap", "bwrap (default)"), ("none", "backend none")):
            m = median(t[backend])
            self.res.add(4, f"process start → initialize answered, {label}", m * 1e3, "ms", None, None, None,
                         "≤ 10 ms", m <= 0.010,
                         note=f"spawn+pipe floor (cat) {fl * 1e3:.2f} ms; first execute_python answered at "
                              f"{median(first_call[backend]) * 1e3:.0f} ms",
                         details={"start": summary(t[backend]), "floor": summary(t["floor"]),
                                  "first_call": summary(first_call[backend])})
        for backend, label in (("bwrap", "bwrap (default)"), ("none", "backend none")):
            m = median(rss[backend]) / 1024
            self.res.add(4, f"idle RSS after initialize + tools/list, {label}", m, "MiB", None, None, None,
                         "≤ 5 MiB", m <= 5.0,
                         note=f"of which anonymous {median(anon[backend]) / 1024:.2f} MiB, the rest shared libraries",
                         details={"rss_kib": summary(rss[backend]), "rss_anon_kib": summary(anon[backend])})

    # -------------------------------------------------------------- case 5
    def case5(self):
        log("case 5: HTTP protocol throughput vs the TypeScript reference server")
        ok, why = self.http_available()
        goal = "≥ 3× req/s, lower p99, ≤ 0.25× memory"
        if not ok:
            self.res.unavailable(5, "ping and tools/list req/s over Streamable HTTP", why, goal)
            return
        wrk = shutil.which("wrk")
        node = shutil.which("node")
        ref = os.path.join(HERE, "node_modules", "@modelcontextprotocol", "server-everything", "dist", "index.js")
        if not wrk or not node or not os.path.exists(ref):
            self.res.unavailable(5, "ping and tools/list req/s over Streamable HTTP",
                                 "wrk or the reference server is missing (run bench/run.sh)", goal)
            return
        ours, our_port = self.start_http(name="c5")
        ref_port = free_port()
        ref_p = popen([node, ref, "streamableHttp"], stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                      stderr=subprocess.DEVNULL, env={**os.environ, "PORT": str(ref_port)})
        try:
            if not wait_listening(ref_port, ref_p, timeout=30):
                raise RuntimeError("the reference server did not start")
            targets = {"ours": (ours, our_port), "reference": (ref_p, ref_port)}
            sessions = {k: curl_initialize(port) for k, (_, port) in targets.items()}
            dur = self.n(6, 3)
            rounds = self.n(3, 1)
            conns = 16
            results = {(k, m): [] for k in targets for m in ("ping", "tools/list")}

            def run_wrk(k, method, seconds):
                _, port = targets[k]
                sid, ver = sessions[k]
                env = {**os.environ, "MCP_METHOD": method, "MCP_SESSION": sid, "MCP_VERSION": ver}
                out = subprocess.run([wrk, "-t2", f"-c{conns}", f"-d{seconds}s", "--timeout", "10s", "-s",
                                      os.path.join(HERE, "wrk", "mcp.lua"), f"http://127.0.0.1:{port}/mcp"],
                                     capture_output=True, text=True, env=env, timeout=seconds + 60)
                line = next((l for l in out.stdout.splitlines() if l.startswith("WRKJSON ")), None)
                if not line:
                    raise RuntimeError("wrk: " + out.stdout[-1000:] + out.stderr[-1000:])
                d = json.loads(line[8:])
                d["rps"] = d["requests"] / (d["duration_us"] / 1e6)
                d["errors"] = d["connect_errors"] + d["read_errors"] + d["write_errors"] + d["status_errors"] + d["timeout_errors"]
                return d
            # sanity: both answer both methods with a result
            for k, (_, port) in targets.items():
                c = McpHttp(port)
                c.sid, c.version = sessions[k]
                for m in ("ping", "tools/list"):
                    st, ans = c.request(m, {})
                    if st != 200 or not ans or "result" not in ans[0]:
                        raise RuntimeError(f"{k} {m}: HTTP {st} {ans}")
                c.close()
            for k in targets:  # warm-up (the reference's JIT)
                for m in ("ping", "tools/list"):
                    run_wrk(k, m, 2)
            for _ in range(rounds):
                for m in ("ping", "tools/list"):
                    order = list(targets)
                    self.rng.shuffle(order)
                    for k in order:
                        results[(k, m)].append(run_wrk(k, m, dur))
            mem = {}
            for k, (p, _) in targets.items():
                with open(f"/proc/{p.pid}/status") as f:
                    st = {l.split(":")[0]: int(l.split()[1]) for l in f if l.startswith(("VmRSS:", "VmHWM:"))}
                mem[k] = st
            for m in ("ping", "tools/list"):
                o, r = results[("ours", m)], results[("reference", m)]
                o_rps, r_rps = median([x["rps"] for x in o]), median([x["rps"] for x in r])
                o_p99, r_p99 = median([x["p99_us"] for x in o]) / 1e3, median([x["p99_us"] for x in r]) / 1e3
                errs = sum(x["errors"] for x in o)
                ok = o_rps >= 3 * r_rps and o_p99 < r_p99 and errs == 0
                self.res.add(5, f"{m} over HTTP, wrk -t2 -c{conns}", o_rps, "req/s", "TS reference server",
                             r_rps, o_rps / r_rps, "≥ 3×, lower p99", ok,
                             note=f"p99 {o_p99:.2f} ms vs {r_p99:.2f} ms; errors {errs} vs {sum(x['errors'] for x in r)}",
                             details={"ours": o, "reference": r})
            o_mem, r_mem = mem["ours"]["VmHWM"] / 1024, mem["reference"]["VmHWM"] / 1024
            self.res.add(5, "peak RSS after the HTTP load", o_mem, "MiB", "TS reference server", r_mem,
                         o_mem / r_mem, "≤ 0.25×", o_mem / r_mem <= 0.25,
                         note=f"RSS now {mem['ours']['VmRSS'] / 1024:.1f} vs {mem['reference']['VmRSS'] / 1024:.1f} MiB",
                         details=mem)
        finally:
            self.stop(ours)
            self.stop(ref_p)

    # -------------------------------------------------------------- case 6
    def case6(self):
        log("case 6: 100 concurrent execute_python calls over HTTP")
        ok, why = self.http_available()
        goal = "≥ 0.8× of the ideal"
        if not ok:
            self.res.unavailable(6, "100 concurrent execute_python over HTTP, 50 sessions", why, goal)
            return
        n_calls, n_sessions = 100, 50
        variants = {"default": (), "--network off": ("--network", "off")}
        servers = {k: self.start_http(a, name="c6-" + k.strip("-").replace(" ", "-")) for k, a in variants.items()}
        py = self.default_python
        try:
            if not py:
                c = McpHttp(servers["default"][1])
                c.initialize()
                _, ans = c.request("tools/call", {"name": "execute_python", "arguments": {"script": "pass"}})
                py = ans[0]["result"]["structuredContent"]["python"]["path"]
                c.close()

            def ours(k):
                return self.http100(servers[k][1], k, n_calls, n_sessions)

            def ideal():
                return self.ideal100(py, n_calls)
            self._bad = {k: 0 for k in variants}
            cmds = {k: (lambda k=k: ours(k)) for k in variants}
            cmds["ideal"] = ideal
            t = self.interleave(cmds, warmup=self.n(1, 0), rounds=self.n(5, 2))
            bi = median(t["ideal"])
            for k in variants:
                m = median(t[k])
                label = "100 concurrent execute_python over HTTP, 50 sessions" + ("" if k == "default" else ", " + k)
                self.res.add(6, label, m, "s", "100 bare bwrap runs, 2 at a time", bi, bi / m,
                             "≥ 0.8× of the ideal", bi / m >= 0.8 and self._bad[k] == 0,
                             note=f"ratio = ideal/ours; every call answered exactly once: "
                                  f"{'yes' if self._bad[k] == 0 else 'NO (' + str(self._bad[k]) + ' bad)'}",
                             details={"ours": summary(t[k]), "ideal": summary(t["ideal"])})
        finally:
            for p, _ in servers.values():
                self.stop(p)

    # -------------------------------------------------------------- case 7
    def case7(self):
        log("case 7: streaming latency (flushed print -> progress notification)")
        n_prints = self.n(40, 25)
        script = ("import time\n"
                  f"for i in range({n_prints}):\n"
                  "    print('T %.6f' % time.monotonic(), flush=True)\n"
                  "    time.sleep(0.06)\n")
        for backend, args in (("bwrap (default)", []), ("backend none", ["--sandbox-backend", "none"])):
            s = StdioServer(self.binary, args, self.state_dir("c7-" + backend.split()[0]))
            lat = []
            try:
                s.initialize()
                s.execute("pass")
                for _ in range(self.n(2, 1)):
                    def on_note(m, t):
                        if m.get("method") != "notifications/progress":
                            return
                        for line in (m["params"].get("message") or "").splitlines():
                            if line.startswith("T "):
                                lat.append(t - float(line[2:]))
                    rid = s.next_id
                    s.next_id += 1
                    s.send({"jsonrpc": "2.0", "id": rid, "method": "tools/call",
                            "params": {"name": "execute_python", "arguments": {"script": script},
                                       "_meta": {"progressToken": "bench"}}})
                    while True:
                        m, t = s.read()
                        if m.get("id") == rid and "method" not in m:
                            break
                        on_note(m, t)
            finally:
                s.close()
            if not lat:
                self.res.unavailable(7, f"print → progress notification, {backend}", "no progress notifications seen",
                                     "≤ 5 ms median")
                continue
            m = median(lat) * 1e3
            self.res.add(7, f"print → progress notification, {backend}", m, "ms", None, None, None, "≤ 5 ms median",
                         m <= 5.0, note=f"p90 {pct(lat, 90) * 1e3:.2f} ms, max {max(lat) * 1e3:.2f} ms, {len(lat)} prints",
                         details=summary(lat))

    # -------------------------------------------------------------- case 8
    def run_together(self, s, n, script):
        """Sends n calls at once; returns their structuredContent in call order."""
        ids = []
        for _ in range(n):
            rid = s.next_id
            s.next_id += 1
            ids.append(rid)
            s.send({"jsonrpc": "2.0", "id": rid, "method": "tools/call",
                    "params": {"name": "execute_python", "arguments": {"script": script}}})
        got = {}
        while len(got) < n:
            m, _ = s.read()
            if m.get("id") in ids and "method" not in m:
                got[m["id"]] = m["result"]["structuredContent"]
        return [got[i] for i in ids]

    def case11(self):
        """Issue 20, side by side in one run: a trivial call on a prestarted interpreter
        (default flags) against a bare `python -c pass` and a bare bwrap, the same with a
        cached dependency environment, `--prestart off` for reference, and 100 concurrent
        trivial calls over HTTP against the ideal of bare bwrap runs two at a time."""
        log("case 11: prestarted interpreters vs bare python vs bare bwrap")
        wheels, _ = self.wheels()
        deps = ["mps-beta", "mps-gamma", "mps-tool"]
        servers = {
            "warm": StdioServer(self.binary, ["--find-links", wheels, "--offline"], self.state_dir("c11-warm")),
            "cold": StdioServer(self.binary, ["--prestart", "off"], self.state_dir("c11-cold")),
        }
        try:
            for s in servers.values():
                s.initialize()
                res, _ = s.execute("pass")
            py = self.python_of(res)
            warm = servers["warm"]
            warm.execute("pass", dependencies=deps)  # built, then cached

            def call(s, **kw):
                def run():
                    r, dt = s.execute("pass", **kw)
                    if s is warm and r["structuredContent"].get("prestarted") != "interpreter":
                        self._not_warm += 1
                    return dt
                return run
            stamp = "import time; print(time.monotonic())"

            def first_warm():
                t0 = time.monotonic()
                r, _ = warm.execute(stamp)
                return float(r["structuredContent"]["stdout"]) - t0

            def first_bare():
                t0 = time.monotonic()
                out = subprocess.run([py, "-c", stamp], env=SCRIPT_ENV, capture_output=True, check=True).stdout
                return float(out) - t0
            self._not_warm = 0
            t = self.interleave({
                "first warm": first_warm,
                "first bare": first_bare,
                "trivial": call(warm),
                "deps": call(warm, dependencies=deps),
                "cold": call(servers["cold"]),
                "bare bwrap": lambda: self.bare_bwrap(py),
                "bare python": lambda: self.spawner.run([py, "-c", "pass"], SCRIPT_ENV),
            }, warmup=self.n(5, 3), rounds=self.n(100, 30), settle=0.03)
            m, d, c = median(t["trivial"]), median(t["deps"]), median(t["cold"])
            bb, bp = median(t["bare bwrap"]), median(t["bare python"])
            details = {k: summary(v) for k, v in t.items()}
            details["calls_not_on_a_prestarted_interpreter"] = self._not_warm
            self.res.add(11, "execute_python(\"pass\") on a prestarted interpreter", m * 1e3, "ms",
                         "bare python -c pass", bp * 1e3, m / bp, "≤ 0.5×", m / bp <= 0.5,
                         note=f"{m / bb:.2f}× bare bwrap ({bb * 1e3:.1f} ms); --prestart off {c * 1e3:.1f} ms; "
                              f"{self._not_warm} calls not on a held interpreter",
                         details={"paired_ratio_median": self.paired(t["trivial"], t["bare python"]), **details})
            fw, fb = median(t["first warm"]), median(t["first bare"])
            self.res.add(11, "request sent → the script's first instruction, prestarted interpreter", fw * 1e3, "ms",
                         "python -c: spawn → first instruction", fb * 1e3, fw / fb, None, None,
                         note="CLOCK_MONOTONIC printed by the script, read by the client",
                         details={"paired_ratio_median": self.paired(t["first warm"], t["first bare"])})
            self.res.add(11, f"the same with a cached environment ({len(deps)} requirements)", d * 1e3, "ms",
                         "trivial call", m * 1e3, d / m, "≤ 1.05×", d / m <= 1.05,
                         note=f"{d / bp:.2f}× bare python",
                         details={"paired_ratio_median": self.paired(t["deps"], t["trivial"])})
        finally:
            for s in servers.values():
                s.close()
        ok, why = self.http_available()
        goal = "≥ 2× the ideal"
        if not ok:
            self.res.unavailable(11, "100 concurrent execute_python over HTTP", why, goal)
            return
        p, port = self.start_http((), name="c11-http")
        try:
            self._bad = {"default": 0}
            # Each side is measured on a quiet machine: first the server's pool is back to its
            # target (the refills after the last burst are over), so that they take no CPU
            # from the ideal's runs, nor from the next burst.  The warm-up burst is where the
            # pool learns the burst's size (it grows by the calls that found none ready).
            self.wait_pool(port)
            first = self.http100(port, "default")
            first_ideal = self.wait_pool(port) or self.ideal100(py)
            t = self.interleave({"ours": lambda: self.wait_pool(port) or self.http100(port, "default"),
                                 "ideal": lambda: self.wait_pool(port) or self.ideal100(py)},
                                warmup=0, rounds=self.n(5, 2))
            ready = self.wait_pool(port, want=True)
            self.res.add(11, "the first burst of 100 (the pool not grown yet: 4 ready)", first, "s",
                         "100 bare bwrap runs, 2 at a time", first_ideal, first_ideal / first, None, None,
                         note="ratio = ideal/ours; one round")
            bi, mo = median(t["ideal"]), median(t["ours"])
            self.res.add(11, "100 concurrent execute_python over HTTP on prestarted interpreters", mo, "s",
                         "100 bare bwrap runs, 2 at a time", bi, bi / mo, goal,
                         bi / mo >= 2 and self._bad["default"] == 0,
                         note=f"ratio = ideal/ours; every call answered exactly once: "
                              f"{'yes' if self._bad['default'] == 0 else 'NO'}; "
                              f"bare bwrap runs that failed: {self.ideal_failures}; "
                              f"interpreters held before each burst (default flags, after the "
                              f"warm-up burst): {ready}",
                         details={"ours": summary(t["ours"]), "ideal": summary(t["ideal"])})
        finally:
            self.stop(p)

    def wait_pool(self, port, timeout=60.0, want=False):
        """Waits until every prestarted shape of the server on port has its target ready;
        returns None (want: the number of held interpreters)."""
        deadline = time.monotonic() + timeout
        while True:
            c = McpHttp(port)
            c.initialize()
            _, ans = c.request("tools/call", {"name": "check_environment", "arguments": {}})
            c.close()
            pool = ans[0]["result"]["structuredContent"].get("prestart") or {}
            shapes = pool.get("shapes") or []
            if all(sh["ready"] >= sh["target"] for sh in shapes) or time.monotonic() > deadline:
                time.sleep(0.2)  # the last one's start-up (it counts as ready once started)
                return pool.get("ready_interpreters") if want else None
            time.sleep(0.1)

    def bare_bwrap(self, py):
        """A bare `bwrap --ro-bind / / ... python -c pass`, timed; one that fails is counted
        and run again (its recursive bind of / races with mounts that come and go under it,
        the servers' tmpfs work directories: "Can't bind mount /oldroot/ ...")."""
        for _ in range(3):
            try:
                return self.spawner.run([self.bwrap, *BARE_BWRAP, py, "-c", "pass"], SCRIPT_ENV)
            except RuntimeError:
                self.ideal_failures += 1
        return self.spawner.run([self.bwrap, *BARE_BWRAP, py, "-c", "pass"], SCRIPT_ENV)

    def http100(self, port, key, n_calls=100, n_sessions=50):
        """100 execute_python("pass") over HTTP at once, two per session, one connection each;
        the time until the last answer (bad answers counted in self._bad[key])."""
        clients = []
        for i in range(n_sessions):
            c = McpHttp(port)
            c.initialize()
            clients.append(c)
        reqs = [(clients[i % n_sessions].sid, clients[i % n_sessions].version,
                 {"jsonrpc": "2.0", "id": 100 + i, "method": "tools/call",
                  "params": {"name": "execute_python", "arguments": {"script": "pass"}}})
                for i in range(n_calls)]
        total, answers = http_burst(port, reqs)
        for st, ans in answers:
            if st != 200 or not isinstance(ans, list) or len(ans) != 1 or \
                    ans[0].get("result", {}).get("structuredContent", {}).get("exit_code") != 0:
                self._bad[key] += 1
        for c in clients:
            c.close()
        return total

    def ideal100(self, py, n_calls=100):
        """The same number of bare bwrap runs, two at a time."""
        jobs = list(range(n_calls))
        lock = threading.Lock()

        def w():
            while True:
                with lock:
                    if not jobs:
                        return
                    jobs.pop()
                try:
                    self.spawner.run([self.bwrap, *BARE_BWRAP, py, "-c", "pass"], SCRIPT_ENV)
                except RuntimeError:
                    # (A loaded machine fails one now and then: counted, and the worker goes on,
                    # or the ideal would run one at a time from there.)
                    self.ideal_failures += 1
        t0 = time.monotonic()
        ws = [threading.Thread(target=w) for _ in range(2)]
        for x in ws:
            x.start()
        for x in ws:
            x.join()
        return time.monotonic() - t0

    # -------------------------------------------------------------- cases 12-15 (issue 32)
    # CPU is the figure to trust on a loaded machine: it is what a call costs, whoever else
    # runs.  Wall-clock ratios of these cases are for a quiet machine.

    @staticmethod
    def _proc_stat(pid):
        with open(f"/proc/{pid}/stat") as f:
            rest = f.read().rsplit(")", 1)[1].split()
        return rest  # rest[1] is the ppid; rest[11..14] utime, stime, cutime, cstime

    def tree(self, root):
        """The live processes under root (root included)."""
        kids = {}
        for d in os.listdir("/proc"):
            if d.isdigit():
                try:
                    kids.setdefault(int(self._proc_stat(d)[1]), []).append(int(d))
                except (OSError, IndexError):
                    pass
        out, todo = [], [root]
        while todo:
            p = todo.pop()
            out.append(p)
            todo.extend(kids.get(p, []))
        return out

    def tree_cpu(self, root):
        """CPU seconds of root's whole tree so far: each live process's own time plus what its
        reaped children used (a reaped child is in its parent's cutime/cstime, a live one not)."""
        tick = os.sysconf("SC_CLK_TCK")
        total = 0
        for p in self.tree(root):
            try:
                f = self._proc_stat(p)
                total += sum(int(x) for x in f[11:15])
            except (OSError, IndexError):
                pass
        return total / tick

    @staticmethod
    def pss_kib(pid):
        try:
            with open(f"/proc/{pid}/smaps_rollup") as f:
                for line in f:
                    if line.startswith("Pss:"):
                        return int(line.split()[1])
        except OSError:
            pass
        return 0

    def sustained(self, call, seconds, cpu_of):
        """Back-to-back calls for `seconds`: (calls, wall seconds, CPU seconds, latencies)."""
        lat = []
        c0, t0 = cpu_of(), time.monotonic()
        while time.monotonic() - t0 < seconds:
            t = time.monotonic()
            call()
            lat.append(time.monotonic() - t)
        wall, cpu = time.monotonic() - t0, cpu_of() - c0
        return len(lat), wall, cpu, lat

    @staticmethod
    def children_cpu():
        import resource
        r = resource.getrusage(resource.RUSAGE_CHILDREN)
        return r.ru_utime + r.ru_stime

    def case12(self):
        """Sustained back-to-back trivial calls over stdio (the pool refilling as fast as the
        calls take it), against bare `python -c pass` and bare bwrap back to back: CPU per call
        (the server's whole process tree, sandboxes included) and time per call, p99."""
        log("case 12: sustained back-to-back trivial calls, CPU per call")
        block = self.n(20, 5)
        s = StdioServer(self.binary, [], self.state_dir("c12"))
        try:
            s.initialize()
            res, _ = s.execute("pass")
            py = self.python_of(res)
            for _ in range(self.n(20, 5)):
                s.execute("pass")
            kinds = {
                "ours": (lambda: s.execute("pass"), lambda: self.tree_cpu(s.proc.pid)),
                "bare python": (lambda: self.spawner.run([py, "-c", "pass"], SCRIPT_ENV), self.children_cpu),
                "bare bwrap": (lambda: self.bare_bwrap(py), self.children_cpu),
            }
            got = {k: [0, 0.0, 0.0, []] for k in kinds}
            for _ in range(3):  # three blocks each, interleaved: the load hits all alike
                order = list(kinds)
                self.rng.shuffle(order)
                for k in order:
                    n, wall, cpu, lat = self.sustained(kinds[k][0], block, kinds[k][1])
                    g = got[k]
                    g[0] += n
                    g[1] += wall
                    g[2] += cpu
                    g[3] += lat
            per = {k: {"calls": g[0], "cpu_ms": g[2] / g[0] * 1e3, "time_ms": g[1] / g[0] * 1e3,
                       "p50_ms": median(g[3]) * 1e3, "p99_ms": pct(g[3], 99) * 1e3} for k, g in got.items()}
            o, bp, bb = per["ours"], per["bare python"], per["bare bwrap"]
            self.res.add(12, f"sustained execute_python(\"pass\") over stdio, {3 * block} s: CPU per call",
                         o["cpu_ms"], "ms", "bare python -c pass", bp["cpu_ms"], o["cpu_ms"] / bp["cpu_ms"],
                         "≤ 0.6×", o["cpu_ms"] / bp["cpu_ms"] <= 0.6,
                         note=f"{o['calls']} calls (bare bwrap's CPU is not shown: what runs in its pid "
                              f"namespace is not all reaped into ours)", details=per)
            self.res.add(12, "the same: time per call", o["time_ms"], "ms", "bare python -c pass", bp["time_ms"],
                         o["time_ms"] / bp["time_ms"], "≤ 0.8×", o["time_ms"] / bp["time_ms"] <= 0.8,
                         note=f"p99 {o['p99_ms']:.1f} ms (bare python {bp['p99_ms']:.1f} ms); "
                              f"bare bwrap {bb['time_ms']:.1f} ms")
            # What a held interpreter costs while it waits: the server's tree's PSS, idle.
            time.sleep(2)
            procs = self.tree(s.proc.pid)
            def is_held(p):
                try:
                    return ("python" in os.path.basename(os.readlink(f"/proc/{p}/exe"))
                            and "--mps-warm" in open(f"/proc/{p}/cmdline").read().replace("\0", " "))
                except OSError:
                    return False
            held = [p for p in procs if is_held(p)]
            if held:
                sandboxes = sum(self.pss_kib(p) for p in procs if p != s.proc.pid)
                self.res.add(12, "PSS per held interpreter (its sandbox's processes included)",
                             sandboxes / len(held) / 1024, "MiB",
                             note=f"{len(held)} held; the interpreter alone "
                                  f"{median([self.pss_kib(p) for p in held]) / 1024:.1f} MiB")
        finally:
            s.close()

    def case13(self):
        """A call in a warm session, sustained: CPU per call (the kernel's and the server's),
        time per call; the PSS a session's kernel holds."""
        log("case 13: sustained session calls, CPU per call, PSS per session")
        block = self.n(10, 3)
        s = StdioServer(self.binary, ["--prestart", "off"], self.state_dir("c13"))
        try:
            s.initialize()
            res, _ = s.execute("x = 0", session="new")
            sid = res["structuredContent"]["session"]["id"]
            py = self.python_of(res)
            kinds = {
                "session": (lambda: s.execute("x += 1", session=sid), lambda: self.tree_cpu(s.proc.pid)),
                "bare python": (lambda: self.spawner.run([py, "-c", "pass"], SCRIPT_ENV), self.children_cpu),
            }
            got = {k: [0, 0.0, 0.0, []] for k in kinds}
            for _ in range(3):
                for k in kinds:
                    n, wall, cpu, lat = self.sustained(kinds[k][0], block, kinds[k][1])
                    got[k][0] += n
                    got[k][1] += wall
                    got[k][2] += cpu
                    got[k][3] += lat
            per = {k: {"calls": g[0], "cpu_ms": g[2] / g[0] * 1e3, "p50_ms": median(g[3]) * 1e3,
                       "p99_ms": pct(g[3], 99) * 1e3} for k, g in got.items()}
            o, bp = per["session"], per["bare python"]
            self.res.add(13, "a call in a warm session, sustained: time per call (median)", o["p50_ms"], "ms",
                         "bare python -c pass", bp["p50_ms"], o["p50_ms"] / bp["p50_ms"], "≤ 0.04×",
                         o["p50_ms"] / bp["p50_ms"] <= 0.04, note=f"p99 {o['p99_ms']:.2f} ms", details=per)
            self.res.add(13, "the same: CPU per call (server + kernel)", o["cpu_ms"], "ms", "bare python -c pass",
                         bp["cpu_ms"], o["cpu_ms"] / bp["cpu_ms"], None, None)
            procs = [p for p in self.tree(s.proc.pid) if p != s.proc.pid]
            self.res.add(13, "PSS per session (its kernel's sandbox, all processes)",
                         sum(self.pss_kib(p) for p in procs) / 1024, "MiB")
        finally:
            s.close()

    def case14(self):
        """The data path: a 100 MB input file; check_environment beside 10,000 cached
        environments, and a ping sent right behind it (the loop's wait)."""
        log("case 14: the data path")
        size = self.n(100, 20) * 1000 * 1000
        s = StdioServer(self.binary, ["--sandbox-backend", "none", "--prestart", "off", "--max-message-bytes", "400M",
                                      "--max-input-file-bytes", "300M", "--max-input-bytes", "300M"],
                        self.state_dir("c14-input"))
        try:
            s.initialize()
            s.execute("pass")
            rss0 = s.rss_kib()
            content = "x" * size
            t0 = time.monotonic()
            res, _ = s.execute("import os\nprint(os.path.getsize('big.txt'))", files=[{"path": "big.txt",
                                                                                    "content": content}])
            dt = time.monotonic() - t0
            hwm = s.rss_kib("VmHWM")
            ok = res["structuredContent"]["stdout"].strip() == str(size)
            self.res.add(14, f"a {size // 10**6} MB input file: request sent → answer", dt, "s", goal="< 3 s",
                         ok=dt < 3 and ok, note=f"peak RSS {hwm / 1024:.0f} MiB = {hwm * 1024 / size:.2f}× the file "
                                                f"(goal < 2×; {rss0 / 1024:.0f} MiB before)")
        finally:
            s.close()
        n_envs = self.n(10000, 2000)
        state = self.state_dir("c14-envs")
        envs = os.path.join(state, "envs")
        for i in range(n_envs):
            d = os.path.join(envs, f"{i:064x}")
            os.makedirs(d, exist_ok=True)
            with open(os.path.join(d, "mps-manifest.json"), "w") as f:
                json.dump({"key": f"{i:064x}", "size": 1000, "built_by": "stdio", "created": 1700000000,
                           "packages": {"mps-fake": "1.0"}, "python": {"version": "3.11.7"}}, f)
        s = StdioServer(self.binary, ["--sandbox-backend", "none", "--prestart", "off"], state)
        try:
            s.initialize()
            deadline = time.monotonic() + 120
            while time.monotonic() < deadline:
                r, _ = s.request("tools/call", {"name": "check_environment", "arguments": {}})
                if f"{n_envs} cached environments" in r["result"]["content"][0]["text"]:
                    break
                time.sleep(0.5)
            answer, ping = [], []
            for _ in range(self.n(20, 8)):
                time.sleep(0.3)  # (listings older than 2 s are made again in the background)
                rid = s.next_id
                s.next_id += 2
                t0 = time.monotonic()
                s.send({"jsonrpc": "2.0", "id": rid, "method": "tools/call",
                        "params": {"name": "check_environment", "arguments": {}}})
                t1 = time.monotonic()
                s.send({"jsonrpc": "2.0", "id": rid + 1, "method": "ping"})
                got = {}
                while len(got) < 2:
                    m, t = s.read()
                    if m.get("id") in (rid, rid + 1):
                        got[m["id"]] = t
                answer.append(got[rid] - t0)
                ping.append(got[rid + 1] - t1)
            a, p = median(answer), median(ping)
            self.res.add(14, f"check_environment with {n_envs} cached environments", a * 1e3, "ms", goal="< 50 ms",
                         ok=a < 0.05, note=f"p90 {pct(answer, 90) * 1e3:.1f} ms")
            self.res.add(14, "a ping sent right behind it: its wait", p * 1e3, "ms", goal="< 5 ms", ok=p < 0.005,
                         note=f"p90 {pct(ping, 90) * 1e3:.1f} ms (the answer to check_environment is "
                              f"{len(json.dumps(r)) // 1024} KiB: every environment is listed)")
        finally:
            s.close()

    def case15(self):
        """HTTP at 8 clients, each calling back to back: from a cold pool (the server just
        started) and sustained (the second half), against the ideal of bare bwrap runs two at
        a time for as long."""
        log("case 15: HTTP throughput at 8 clients, cold and sustained")
        ok, why = self.http_available()
        if not ok:
            self.res.unavailable(15, "HTTP throughput at 8 clients", why, "≥ 2× the ideal")
            return
        seconds = self.n(40, 12)
        p, port = self.start_http((), name="c15")
        try:
            c = McpHttp(port)
            c.initialize()
            _, ans = c.request("tools/call", {"name": "execute_python", "arguments": {"script": "pass"}})
            py = ans[0]["result"]["structuredContent"]["python"]["path"]
            c.close()
            self.stop(p)
            p, port = self.start_http((), name="c15")  # cold: no pool yet
            done, bad = [], [0]
            lock = threading.Lock()
            t0 = time.monotonic()

            def client():
                cl = McpHttp(port)
                cl.initialize()
                while time.monotonic() - t0 < seconds:
                    ts = time.monotonic()
                    _, a = cl.request("tools/call", {"name": "execute_python", "arguments": {"script": "pass"}})
                    te = time.monotonic()
                    good = len(a) == 1 and a[0].get("result", {}).get("structuredContent", {}).get("exit_code") == 0
                    with lock:
                        done.append((te - t0, te - ts))
                        bad[0] += not good
                cl.close()
            ths = [threading.Thread(target=client) for _ in range(8)]
            for t in ths:
                t.start()
            for t in ths:
                t.join()
            cpu = self.tree_cpu(p.pid)
            half = [lat for at, lat in done if at >= seconds / 2]
            rate_all = len(done) / seconds
            rate_half = len(half) / (seconds / 2)
            # The ideal: bare bwrap runs, two at a time, for as long.
            n_ideal = [0]
            ti = time.monotonic()

            def w():
                while time.monotonic() - ti < seconds / 2:
                    try:
                        self.spawner.run([self.bwrap, *BARE_BWRAP, py, "-c", "pass"], SCRIPT_ENV)
                        with lock:
                            n_ideal[0] += 1
                    except RuntimeError:
                        self.ideal_failures += 1
            ws = [threading.Thread(target=w) for _ in range(2)]
            for x in ws:
                x.start()
            for x in ws:
                x.join()
            ideal = n_ideal[0] / (time.monotonic() - ti)
            p50, p99 = median(half) if half else 0, pct(half, 99) if half else 0
            self.res.add(15, f"execute_python(\"pass\") over HTTP, 8 clients back to back, cold pool, {seconds} s",
                         rate_all, "calls/s", "bare bwrap, 2 at a time", ideal, rate_all / ideal, None, None,
                         note=f"{bad[0]} bad answers; server tree CPU {cpu / max(1, len(done)) * 1e3:.1f} ms/call "
                              f"(includes the server's start)")
            self.res.add(15, "the same, sustained (second half)", rate_half, "calls/s", "bare bwrap, 2 at a time",
                         ideal, rate_half / ideal, "≥ 2×, p99 < 3× p50", rate_half / ideal >= 2 and p99 < 3 * p50,
                         note=f"p50 {p50 * 1e3:.1f} ms, p99 {p99 * 1e3:.1f} ms")
        finally:
            self.stop(p)


    def case10(self):
        """Issue 19: a call in a warm session (`x += 1`: no process starts) end to end over
        stdio, against a fresh-sandbox trivial call and a bare `python -c pass`."""
        log("case 10: warm session call vs fresh trivial call vs bare python")
        s = StdioServer(self.binary, [], self.state_dir("c10"))
        try:
            s.initialize()
            res, _ = s.execute("x = 0", session="new")
            sid = res["structuredContent"]["session"]["id"]
            py = self.python_of(res)
            t = self.interleave({
                "session": lambda: s.execute("x += 1", session=sid)[1],
                "fresh": lambda: s.execute("pass")[1],
                "bare python": lambda: self.spawner.run([py, "-c", "pass"], SCRIPT_ENV),
            }, warmup=self.n(5, 3), rounds=self.n(100, 30), settle=0.03)
            m, f, bp = median(t["session"]), median(t["fresh"]), median(t["bare python"])
            self.res.add(10, "execute_python(\"x += 1\") in a warm session", m * 1e3, "ms", "bare python",
                         bp * 1e3, m / bp, "< 0.1×", m / bp < 0.1,
                         note=f"{m / f:.2f}× a fresh-sandbox trivial call ({f * 1e3:.1f} ms)",
                         details={k: summary(v) for k, v in t.items()})
        finally:
            s.close()

    def case9(self):
        """What the integration tests asserted as durations until they kept to behaviour
        (order, overlap, counts): measured here, against the same bounds."""
        log("case 9: time bounds the tests used to assert")
        stamp = ("import time\nprint('START', time.monotonic(), flush=True)\ntime.sleep(%s)\n"
                 "print('END', time.monotonic())\n")

        def starts_of(results):
            return sorted(float(r["stdout"].split()[1]) for r in results)

        rounds = self.n(3, 1)
        # The start-up window of --max-starting: 4 calls at once, one start at a time.
        spreads = []
        s = StdioServer(self.binary, ["--max-starting", "1", "--prestart", "off"], self.state_dir("c8-stagger"))
        try:
            s.initialize()
            s.execute("pass")
            for _ in range(rounds):
                st = starts_of(self.run_together(s, 4, stamp % 1.5))
                spreads.append(st[-1] - st[0])
        finally:
            s.close()
        m = median(spreads)
        self.res.add(9, "--max-starting 1: first to last of 4 starts (3 windows of 100 ms)", m * 1e3, "ms", None,
                     None, None, "≥ 200 ms", m >= 0.2, details=summary(spreads))
        # Below the limit: not staggered.
        spreads = []
        s = StdioServer(self.binary, ["--max-starting", "8"], self.state_dir("c8-nostagger"))
        try:
            s.initialize()
            s.execute("pass")
            for _ in range(rounds):
                st = starts_of(self.run_together(s, 3, stamp % 0.5))
                spreads.append(st[-1] - st[0])
        finally:
            s.close()
        m = median(spreads)
        self.res.add(9, "--max-starting 8: first to last of 3 starts", m * 1e3, "ms", None, None, None, "< 300 ms",
                     m < 0.3, details=summary(spreads))
        # A prestarted sandbox held for 1.5 s: the call's duration counts from the call.
        durs = []
        s = StdioServer(self.binary, [], self.state_dir("c8-held"))
        try:
            s.initialize()
            s.execute("pass")
            for _ in range(rounds):
                time.sleep(1.5)
                res, _ = s.execute("import time; time.sleep(0.3)", timeout_seconds=1)
                sc = res["structuredContent"]
                if sc.get("prestarted"):
                    durs.append(sc["duration_ms"])
        finally:
            s.close()
        if durs:
            m = median(durs)
            self.res.add(9, "held 1.5 s, then a 0.3 s script: its duration_ms", m, "ms", None, None, None,
                         "< 1000 ms", m < 1000, details=summary(durs))
        else:
            self.res.unavailable(8, "held 1.5 s, then a 0.3 s script: its duration_ms",
                                 "no call ran in a prestarted sandbox (backend cannot hold one?)", "< 1000 ms")
        # initialize while the cache is being warmed from a slow index.
        times = []
        for i in range(rounds):
            times.append(self.initialize_while_warming(i))
        m = median(times)
        self.res.add(9, "initialize answered while warming from an index that answers in 3 s", m * 1e3, "ms",
                     None, None, None, "< 5 s", m < 5.0, details=summary(times))
        # Collecting outputs/ with 100 000 files, capped at 50.
        s = StdioServer(self.binary, ["--max-output-files", "50"], self.state_dir("c8-files"))
        try:
            s.initialize()
            t0 = time.monotonic()
            res, _ = s.execute("import os\nos.makedirs('outputs')\nfor i in range(100000):\n"
                               "    open('outputs/%06d.txt' % i, 'w').write('x')\n", timeout_seconds=240)
            call_s = time.monotonic() - t0
            extra = call_s - res["structuredContent"]["duration_ms"] / 1000
        finally:
            s.close()
        self.res.add(9, "100 000 files in outputs/, 50 collected: the call beyond the script", extra * 1e3, "ms",
                     None, None, None, "< 20 s", extra < 20.0)

    def initialize_while_warming(self, i):
        """Seconds from writing initialize to reading its answer, with --warm-cache against a
        loopback index whose every answer takes 3 s."""
        import http.server

        class Slow(http.server.BaseHTTPRequestHandler):
            def do_GET(self):
                time.sleep(3)
                self.send_response(404)
                self.end_headers()

            def log_message(self, *a):
                pass

        httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Slow)
        threading.Thread(target=httpd.serve_forever, daemon=True).start()
        prof = os.path.join(self.tmp, f"c8-profiles-{i}")
        os.makedirs(prof, exist_ok=True)
        with open(os.path.join(prof, "warmup.txt"), "w") as f:
            f.write("mps-alpha\nmps-gamma\n")
        s = StdioServer(self.binary, ["--index-url", f"http://127.0.0.1:{httpd.server_address[1]}/simple", "--warm-cache"],
                        self.state_dir(f"c8-warm-{i}"),
                        env={"MPS_PROFILES_DIR": prof, "MCP_PY_SANDBOX_WARM_CACHE": "1"})
        try:
            time.sleep(0.5)  # warming has started
            t0 = time.monotonic()
            s.initialize()
            return time.monotonic() - t0
        finally:
            s.close()
            httpd.shutdown()

    # -------------------------------------------------------------- driver
    def machine(self):
        cpu = "unknown"
        try:
            with open("/proc/cpuinfo") as f:
                cpu = next(l.split(":", 1)[1].strip() for l in f if l.startswith("model name"))
        except (OSError, StopIteration):
            pass
        mem = None
        with open("/proc/meminfo") as f:
            for l in f:
                if l.startswith("MemTotal:"):
                    mem = round(int(l.split()[1]) / 1024 / 1024, 1)
        load = os.getloadavg()
        return {"nproc": os.cpu_count(), "kernel": platform.release(), "cpu_model": cpu, "mem_gib": mem,
                "loadavg_at_start": [round(x, 2) for x in load]}

    def git(self):
        def run(*a):
            try:
                return subprocess.run(["git", "-C", ROOT, *a], capture_output=True, text=True, timeout=10).stdout.strip()
            except Exception:
                return ""
        return {"commit": run("rev-parse", "HEAD") or None,
                "dirty": bool(run("status", "--porcelain", "--untracked-files=no"))}

    def versions(self):
        def out(argv):
            try:
                r = subprocess.run(argv, capture_output=True, text=True, timeout=10)
                return (r.stdout or r.stderr).strip().splitlines()[0]
            except Exception:
                return None
        return {"server": out([self.binary, "--version"]), "bwrap": out([self.bwrap, "--version"]) if self.bwrap else None,
                "wrk": out(["wrk", "--version"]), "node": out(["node", "--version"]),
                "reference_server": self.ref_version()}

    def ref_version(self):
        try:
            with open(os.path.join(HERE, "node_modules", "@modelcontextprotocol", "server-everything", "package.json")) as f:
                return "@modelcontextprotocol/server-everything " + json.load(f)["version"]
        except OSError:
            return None

    # -------------------------------------------------------------- case 8
    def case8(self):
        """The network through the egress proxy (the default: a namespace of its own per run,
        the supervisor's forwarder, the server's proxy) against --network off and against
        --network host (the old shared namespace): a trivial call, and one HTTP fetch from a
        loopback test server that a --network-allow rule opens."""
        log("case 8: network through the egress proxy vs off vs host")
        body = b"x" * 1024

        class H(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.0"

            def do_GET(self):
                self.send_response(200)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *a):
                pass

        class Srv(socketserver.ThreadingMixIn, http.server.HTTPServer):
            daemon_threads = True
        httpd = Srv(("127.0.0.1", 0), H)
        port = httpd.server_address[1]
        threading.Thread(target=httpd.serve_forever, daemon=True).start()
        fetch = (f"import urllib.request\n"
                 f"assert len(urllib.request.urlopen('http://127.0.0.1:{port}/', timeout=10).read()) == 1024\n")
        servers = {
            "proxy": StdioServer(self.binary, ["--network-allow", f"127.0.0.1:{port}"], self.state_dir("c8-proxy")),
            "off": StdioServer(self.binary, ["--network", "off"], self.state_dir("c8-off")),
            "host": StdioServer(self.binary, ["--network", "host"], self.state_dir("c8-host")),
        }
        try:
            for s in servers.values():
                s.initialize()
                s.execute("pass")
            servers["proxy"].execute(fetch)
            servers["host"].execute(fetch)
            commands = {f"trivial {k}": (lambda s=s: s.execute("pass")[1]) for k, s in servers.items()}
            commands["fetch proxy"] = lambda: servers["proxy"].execute(fetch)[1]
            commands["fetch host"] = lambda: servers["host"].execute(fetch)[1]
            t = self.interleave(commands, warmup=self.n(5, 3), rounds=self.n(60, 20), settle=0.03)
            host, proxy, off = median(t["trivial host"]), median(t["trivial proxy"]), median(t["trivial off"])
            details = {k: summary(v) for k, v in t.items()}
            self.res.add(8, "execute_python(\"pass\"), network on (egress proxy)", proxy * 1e3, "ms",
                         "--network host", host * 1e3, proxy / host, "≤ 1.1×", proxy / host <= 1.1,
                         note=f"+{(proxy - host) * 1e3:.1f} ms/call; --network off {off * 1e3:.2f} ms",
                         details={"paired_ratio_median": self.paired(t["trivial proxy"], t["trivial host"]), **details})
            self.res.add(8, "execute_python(\"pass\"), --network off", off * 1e3, "ms", "--network host",
                         host * 1e3, off / host, None, None)
            fp, fh = median(t["fetch proxy"]), median(t["fetch host"])
            self.res.add(8, "one HTTP fetch from a loopback server a rule allows, through the proxy", fp * 1e3, "ms",
                         "--network host (direct)", fh * 1e3, fp / fh, None, None,
                         note=f"+{(fp - fh) * 1e3:.1f} ms/call",
                         details={"paired_ratio_median": self.paired(t["fetch proxy"], t["fetch host"])})
        finally:
            for s in servers.values():
                s.close()
            httpd.shutdown()

    def run(self, cases):
        started = time.time()
        meta = {"date": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "mode": "quick" if self.quick else "full",
                "machine": self.machine(), "git": self.git(), "versions": self.versions(),
                "binary": self.binary}
        for c in cases:
            t0 = time.monotonic()
            try:
                getattr(self, f"case{c}")()
            except Exception as e:  # noqa: BLE001
                import traceback
                traceback.print_exc()
                self.res.unavailable(c, CASE_NAMES[c], f"failed: {str(e)[:300]}")
            log(f"  (case {c} took {time.monotonic() - t0:.0f} s)")
        meta["duration_s"] = round(time.time() - started, 1)
        meta["machine"]["loadavg_at_end"] = [round(x, 2) for x in os.getloadavg()]
        meta["rows"] = self.res.rows
        return meta


def write_outputs(meta, outdir):
    os.makedirs(outdir, exist_ok=True)
    with open(os.path.join(outdir, "latest.json"), "w") as f:
        json.dump(meta, f, indent=1, ensure_ascii=False)
        f.write("\n")
    m = meta["machine"]
    g = meta["git"]
    head = (f"Measured {meta['date']} ({meta['mode']} run, {meta['duration_s']:.0f} s) on {m['nproc']} cores, "
            f"{m['cpu_model']}, kernel {m['kernel']}, at commit {(g['commit'] or 'unknown')[:12]}"
            f"{' + local changes' if g['dirty'] else ''}; load average {m['loadavg_at_start'][0]:.1f} at the start, "
            f"{m.get('loadavg_at_end', [0])[0]:.1f} at the end; bubblewrap {(meta['versions'].get('bwrap') or '?').split()[-1]}. "
            "Medians of interleaved runs; ratios are ours ÷ baseline (case 6: ideal ÷ ours).")
    with open(os.path.join(outdir, "latest.md"), "w") as f:
        f.write(head + "\n\n" + markdown_table(meta["rows"]) + "\n")
    return head


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--binary", default=os.path.join(ROOT, "build-bench", "mcp-python-exec-sandbox"))
    ap.add_argument("--quick", action="store_true", help="fewer samples: under 2 minutes")
    ap.add_argument("--cases", default="1,2,3,4,5,6,7,8,9,10,11,12,13,14,15", help="comma-separated case numbers")
    ap.add_argument("--results", default=os.path.join(HERE, "results"), help="where latest.json/md go")
    ap.add_argument("--seed", type=int, default=1)
    args = ap.parse_args()
    cases = [int(c) for c in args.cases.split(",") if c.strip()]
    if not os.access(args.binary, os.X_OK):
        sys.exit(f"bench: no binary at {args.binary} (run bench/run.sh, or pass --binary)")
    signal.signal(signal.SIGTERM, lambda *a: sys.exit(143))
    b = Bench(args)
    try:
        meta = b.run(cases)
    finally:
        kill_started()
        shutil.rmtree(b.tmp, ignore_errors=True)
    head = write_outputs(meta, args.results)
    print()
    print(head)
    print()
    print(text_table(meta["rows"]))
    print()
    print(f"Written: {os.path.relpath(os.path.join(args.results, 'latest.json'))}, "
          f"{os.path.relpath(os.path.join(args.results, 'latest.md'))}")


if __name__ == "__main__":
    main()

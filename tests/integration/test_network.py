"""The network of scripts and builds (issue 15): with the default policy neither a script nor a
dependency build reaches the host's loopback (127.0.0.1, ::1), its interface addresses, the
server's own HTTP port, an abstract unix socket of the host, a private-range or link-local
address, or a name that resolves to one of them; an allowed destination is reachable through
the server's egress proxy; a build never sees the server's index credentials and still
installs from a credentialed index; a call can narrow the policy but never widen it; refusals
are reported; a run's connections end with it.

Everything stays on loopback and in a network namespace the test makes (a veth pair to
192.175.48.1, with 10.77.0.1, 169.254.77.1 and special-purpose addresses behind it); the
test's own DNS responder on
loopback answers the names (--dns-server).  Needs the bwrap backend and root (ip netns)."""
import base64
import contextlib
import ctypes
import http.server
import io
import json
import os
import shutil
import signal
import socket
import socketserver
import struct
import subprocess
import sys
import tarfile
import tempfile
import threading
import time

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "fixtures"))
import wheelhouse  # noqa: E402

from conftest import BACKEND, Server, wait_until  # noqa: E402

# One worker for the whole module (pytest-xdist, --dist loadgroup): the namespace's addresses
# and the host's routes to them are the machine's, so a second world beside it would collide
# (and the module's fixtures start it once for all of its tests).
pytestmark = [pytest.mark.skipif(BACKEND != "bwrap", reason="only the bwrap backend gives runs a network namespace "
                                                          "of their own and the egress proxy"),
              pytest.mark.xdist_group("netns")]

SECRET = "s3cr3t-index-token-9f2c7"
SECRET2 = "s3cr3t-other-pip-var-41d0"
# 192.175.48.0/24 (AS112 direct delegation) is one of the few special-purpose ranges IANA marks
# globally reachable: public as far as the policy goes, and nothing this machine talks to.
NS_ADDR, NS_PRIVATE, NS_LINKLOCAL, HOST_VETH = "192.175.48.1", "10.77.0.1", "169.254.77.1", "192.175.48.2"
NS_ADDR2 = "192.175.48.3"  # a second public server of the namespace's
# Special-purpose ranges IANA marks not globally reachable (benchmarking, documentation, IETF
# protocol assignments): denied like private ones (issue 30, 8).
NS_SPECIAL = {"benchmarking": "198.18.77.1", "documentation": "198.51.100.77", "IETF protocol assignments": "192.0.0.77"}
NS_PORT = 8080


def text_of(res):
    return "\n".join(c.get("text", "") for c in res["content"] if c.get("type") == "text")


# ------------------------------------------------------------------ listeners the test owns

class Canary:
    """A TCP (or abstract unix) listener that nobody in a sandbox may reach: it records every
    connection it accepts."""

    def __init__(self, family, addr):
        self.sock = socket.socket(family, socket.SOCK_STREAM)
        if family != socket.AF_UNIX:
            self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        if family == socket.AF_INET6:
            self.sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
        self.sock.bind(addr)
        self.sock.listen(16)
        self.addr = self.sock.getsockname()
        self.accepted = []
        self.stop = False
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    @property
    def port(self):
        return self.addr[1]

    def _serve(self):
        self.sock.settimeout(0.2)
        while not self.stop:
            try:
                c, peer = self.sock.accept()
            except OSError:
                continue
            self.accepted.append(peer)
            try:
                c.sendall(b"CANARY\n")
            except OSError:
                pass
            c.close()

    def close(self):
        self.stop = True
        self.thread.join()
        self.sock.close()


class Hold:
    """A loopback server (opened by a rule) that keeps each connection open and notes when the
    peer ends it."""

    def __init__(self):
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(8)
        self.port = self.sock.getsockname()[1]
        self.opened = []
        self.closed_at = []
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self):
        while True:
            try:
                c, _ = self.sock.accept()
            except OSError:
                return
            self.opened.append(time.monotonic())
            threading.Thread(target=self._hold, args=(c,), daemon=True).start()

    def _hold(self, c):
        c.sendall(b"HOLD\n")
        while True:
            try:
                if not c.recv(4096):
                    break
            except OSError:
                break
        self.closed_at.append(time.monotonic())
        c.close()


class Allowed(socketserver.ThreadingMixIn, http.server.HTTPServer):
    daemon_threads = True


def allowed_http_server():
    class H(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            body = f"allowed loopback {self.path}".encode()
            if self.path.startswith("/big/"):
                body = b"x" * min(int(self.path[5:]), 1 << 24)
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *a):
            pass
    srv = Allowed(("127.0.0.1", 0), H)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    return srv


# ------------------------------------------------------------------ DNS

class DnsResponder:
    """Answers A/AAAA queries for a fixed table (an address or a list of them) on 127.0.0.1
    (UDP); NXDOMAIN otherwise."""

    def __init__(self, table):
        self.table = table
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
                self.sock.sendto(self._answer(q), peer)
            except Exception:
                pass

    def _answer(self, q):
        i, labels = 12, []
        while q[i]:
            n = q[i]
            labels.append(q[i + 1:i + 1 + n].decode().lower())
            i += 1 + n
        qtype, _ = struct.unpack(">HH", q[i + 1:i + 5])
        question = q[12:i + 5]
        name = ".".join(labels)
        self.queries.append((name, qtype))
        ans, count, rcode = b"", 0, 0
        addrs = self.table.get(name)
        if addrs is None:
            rcode = 3
        for addr in [addrs] if isinstance(addrs, str) else addrs or []:  # in this order
            if qtype == 1 and ":" not in addr:
                ans += b"\xc0\x0c" + struct.pack(">HHIH", 1, 1, 30, 4) + socket.inet_aton(addr)
                count += 1
            elif qtype == 28 and ":" in addr:
                ans += b"\xc0\x0c" + struct.pack(">HHIH", 28, 1, 30, 16) + socket.inet_pton(socket.AF_INET6, addr)
                count += 1
        return q[:2] + struct.pack(">HHHHH", 0x8180 | rcode, 1, count, 0, 0) + question + ans

    def close(self):
        self.sock.close()


# ------------------------------------------------------------------ a network namespace of the test's

NS_SERVER = r"""
import http.server, socketserver, sys
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        local = self.connection.getsockname()[0]
        print("HIT", local, self.path, flush=True)
        body = ("hello from the test namespace at " + local).encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
    def log_message(self, *a):
        pass
class S(socketserver.ThreadingMixIn, http.server.HTTPServer):
    daemon_threads = True
    allow_reuse_address = True
s = S(("0.0.0.0", int(sys.argv[1])), H)
print("ready", flush=True)
s.serve_forever()
"""


def ip(*args, check=True):
    return subprocess.run(["ip", *args], check=check, capture_output=True, text=True)


def sweep_stale_namespaces():
    """The namespaces (and their host routes) of test processes gone without cleaning up (a run
    killed mid-way): their fixed addresses would collide with a new one's."""
    for line in ip("netns", "list", check=False).stdout.splitlines():
        name = line.split()[0] if line.split() else ""
        tag = name[len("mps-net-"):]
        if not name.startswith("mps-net-") or not tag.isdigit() or os.path.exists(f"/proc/{int(tag)}"):
            continue
        ip("netns", "del", name, check=False)
        ip("link", "del", f"mpsh{tag}", check=False)


class TestNamespace:
    """netns with 192.175.48.1 (public as far as the policy goes), plus 10.77.0.1 (private),
    169.254.77.1 (link-local) and NS_SPECIAL, routed from the host over a veth whose host end
    is 192.175.48.2; an HTTP server on port 8080 of all of them that logs each hit."""

    def __init__(self):
        tag = str(os.getpid())[-6:]
        self.ns = f"mps-net-{tag}"
        self.host_if, self.ns_if = f"mpsh{tag}", f"mpsn{tag}"
        self.proc = None
        self.hits = []
        sweep_stale_namespaces()
        try:
            ip("netns", "add", self.ns)
            ip("link", "add", self.host_if, "type", "veth", "peer", "name", self.ns_if)
            ip("link", "set", self.ns_if, "netns", self.ns)
            ip("addr", "add", f"{HOST_VETH}/24", "dev", self.host_if)
            ip("link", "set", self.host_if, "up")
            for a in (f"{NS_ADDR}/24", f"{NS_ADDR2}/24", f"{NS_PRIVATE}/32", f"{NS_LINKLOCAL}/32", *(f"{x}/32" for x in NS_SPECIAL.values())):
                ip("netns", "exec", self.ns, "ip", "addr", "add", a, "dev", self.ns_if)
            ip("netns", "exec", self.ns, "ip", "link", "set", self.ns_if, "up")
            ip("netns", "exec", self.ns, "ip", "link", "set", "lo", "up")
            ip("netns", "exec", self.ns, "ip", "route", "add", "default", "via", HOST_VETH)
            for a in (NS_PRIVATE, NS_LINKLOCAL, *NS_SPECIAL.values()):
                ip("route", "add", f"{a}/32", "via", NS_ADDR, "dev", self.host_if)
            self.proc = subprocess.Popen(["ip", "netns", "exec", self.ns, sys.executable, "-u", "-c", NS_SERVER, str(NS_PORT)],
                                         stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
            assert self.proc.stdout.readline().strip() == "ready"
            threading.Thread(target=self._log, daemon=True).start()
        except BaseException:
            self.close()
            raise

    def _log(self):
        for line in self.proc.stdout:
            if line.startswith("HIT"):
                self.hits.append(line.split()[1:])

    def close(self):
        if self.proc:
            self.proc.kill()
            self.proc.wait()
        # Deleting the namespace deletes its veth end, and with it the pair and the routes.
        ip("netns", "del", self.ns, check=False)
        ip("link", "del", self.host_if, check=False)


def host_addresses():
    """Non-loopback IPv4 addresses of the host (besides the veth's)."""
    out = ip("-j", "-4", "addr", "show", check=False).stdout
    try:
        data = json.loads(out or "[]")
    except ValueError:
        return []
    addrs = []
    for link in data:
        for a in link.get("addr_info", []):
            if a.get("local") and not a["local"].startswith("127.") and a["local"] != HOST_VETH:
                addrs.append(a["local"])
    return addrs


# ------------------------------------------------------------------ the probe

# Tries each target directly and through the forwarder (HTTP CONNECT at 127.0.0.1:3128), and
# the abstract unix socket; prints one JSON object.  Also the body of a module of a build.
PROBE = r'''
import json, os, socket

def _recv_head(s):
    data = b""
    while b"\r\n\r\n" not in data and len(data) < 65536:
        chunk = s.recv(4096)
        if not chunk:
            break
        data += chunk
    return data

def _direct(host, port):
    fam = socket.AF_INET6 if ":" in host else socket.AF_INET
    try:
        s = socket.socket(fam, socket.SOCK_STREAM)
        s.settimeout(3)
        s.connect((host, port))
        got = s.recv(64)
        s.close()
        return "OPEN " + got.decode(errors="replace").strip()
    except OSError as e:
        return "closed " + type(e).__name__

def _connect(host, port):
    try:
        s = socket.create_connection(("127.0.0.1", 3128), timeout=5)
        h = "[%s]" % host if ":" in host else host
        s.sendall(("CONNECT %s:%d HTTP/1.1\r\nHost: %s:%d\r\n\r\n" % (h, port, h, port)).encode())
        head = _recv_head(s)
        status = int(head.split()[1]) if head.startswith(b"HTTP/") else -1
        if status != 200:
            return "status %d" % status
        rest = head.split(b"\r\n\r\n", 1)[1]
        s.sendall(b"GET /via-connect HTTP/1.0\r\nHost: x\r\n\r\n")
        s.settimeout(3)
        try:
            while len(rest) < 8192:
                chunk = s.recv(4096)
                if not chunk:
                    break
                rest += chunk
        except OSError:
            pass
        return "OPEN " + rest.decode(errors="replace").strip()[-120:]
    except OSError as e:
        return "error " + type(e).__name__

def _abstract(name):
    try:
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.settimeout(3)
        s.connect("\0" + name)
        return "OPEN " + s.recv(64).decode(errors="replace").strip()
    except OSError as e:
        return "closed " + type(e).__name__

def probe(targets, abstract):
    out = {}
    for name, (host, port) in sorted(targets.items()):
        out[name + "/direct"] = _direct(host, port) if not host.endswith(".test") else "skipped"
        out[name + "/proxy"] = _connect(host, port)
    if abstract:
        out["abstract"] = _abstract(abstract)
    return out
'''


# ------------------------------------------------------------------ fixtures

@pytest.fixture(scope="module")
def world():
    if os.geteuid() != 0 or not shutil.which("ip"):
        pytest.skip("needs root and iproute2 to make a network namespace")
    made = []
    try:
        ns = TestNamespace()
        made.append(ns)
        # The namespace really is reachable from the host (else the test proves nothing).
        for a in (NS_ADDR, NS_PRIVATE, NS_LINKLOCAL, *NS_SPECIAL.values()):
            with socket.create_connection((a, NS_PORT), timeout=5) as c:
                c.sendall(b"GET /sanity HTTP/1.0\r\n\r\n")
                data = b""
                while chunk := c.recv(4096):
                    data += chunk
                assert b"hello from the test namespace" in data
        w = {"ns": ns}
        w["c4"] = Canary(socket.AF_INET, ("127.0.0.1", 0))
        w["c6"] = Canary(socket.AF_INET6, ("::1", 0))
        w["cveth"] = Canary(socket.AF_INET, (HOST_VETH, 0))
        extra = host_addresses()
        w["ciface"] = Canary(socket.AF_INET, (extra[0], 0)) if extra else None
        w["abstract"] = f"mps-test-abstract-{os.getpid()}"
        w["cunix"] = Canary(socket.AF_UNIX, "\0" + w["abstract"])
        made += [w[k] for k in ("c4", "c6", "cveth", "ciface", "cunix") if w[k]]
        w["dns"] = DnsResponder({"evil.test": "127.0.0.1", "evil6.test": "::1", "private.test": NS_PRIVATE,
                                 "linklocal.test": NS_LINKLOCAL, "meta.test": "169.254.169.254",
                                 "public.test": NS_ADDR, "veth.test": HOST_VETH, "searched.corp.test": NS_ADDR,
                                 "tls-index.test": ["127.0.0.2", "127.0.0.1"], "bench.test": NS_SPECIAL["benchmarking"],
                                 "alias.test": NS_ADDR, "other.test": NS_ADDR2, "both.test": [NS_ADDR, NS_ADDR2]})
        made.append(w["dns"])
        w["allowed"] = allowed_http_server()
        w["hold"] = Hold()
        ns.hits.clear()
        yield w
    finally:
        for m in reversed(made):
            try:
                m.close()
            except Exception:
                pass
    assert ip("netns", "list").stdout.find(made[0].ns if made else "-") < 0


def canaries(w):
    return [w[k] for k in ("c4", "c6", "cveth", "ciface", "cunix") if w[k]]


def forbidden_targets(w, http_port=None):
    t = {"loopback4": ["127.0.0.1", w["c4"].port], "loopback6": ["::1", w["c6"].port],
         "veth": [HOST_VETH, w["cveth"].port], "private": [NS_PRIVATE, NS_PORT],
         "linklocal": [NS_LINKLOCAL, NS_PORT], "name-loopback": ["evil.test", w["c4"].port],
         "name-loopback6": ["evil6.test", w["c6"].port], "name-private": ["private.test", NS_PORT],
         "name-linklocal": ["linklocal.test", NS_PORT], "name-metadata": ["meta.test", 80],
         "metadata": ["169.254.169.254", 80], "name-benchmarking": ["bench.test", NS_PORT]}
    for cls, a in NS_SPECIAL.items():
        t["special-" + cls] = [a, NS_PORT]
    if w["ciface"]:
        t["iface"] = [w["ciface"].addr[0], w["ciface"].port]
    if http_port:
        t["server-http"] = ["127.0.0.1", http_port]
    return t


@pytest.fixture(scope="module")
def net_server(world):
    s = Server("--dns-server", f"127.0.0.1:{world['dns'].port}",
               "--network-allow", f"127.0.0.1:{world['allowed'].server_address[1]}",
               "--network-allow", f"127.0.0.1:{world['hold'].port}")
    s.initialize()
    yield s
    s.close()


@pytest.fixture(scope="module")
def http_server_port(world):
    """A second server, over HTTP on loopback: its port must be out of reach too."""
    with socket.socket() as t:
        t.bind(("127.0.0.1", 0))
        port = t.getsockname()[1]
    s = Server("--transport", "http", "--port", str(port), "--prestart", "off")
    try:
        assert wait_until(lambda: _listening(port), timeout=15)
        yield port
    finally:
        s.proc.send_signal(signal.SIGTERM)
        s.proc.wait(timeout=15)
        s.close()


def _listening(port):
    try:
        socket.create_connection(("127.0.0.1", port), timeout=1).close()
        return True
    except OSError:
        return False


def run_probe(server, targets, abstract=None, **kw):
    script = PROBE + f"\nprint(json.dumps(probe({targets!r}, {abstract!r})))\n"
    res = server.execute(script, timeout=120, **kw)
    assert res["structuredContent"]["exit_code"] == 0, text_of(res)
    return json.loads(res["structuredContent"]["stdout"]), res


# ------------------------------------------------------------------ scripts

def test_script_reaches_nothing_forbidden(net_server, world, http_server_port):
    targets = forbidden_targets(world, http_server_port)
    got, res = run_probe(net_server, targets, world["abstract"])
    for name, value in got.items():
        assert not value.startswith("OPEN"), (name, value, got)
    # Refused by the proxy (403), not just unlucky.
    for name in targets:
        assert got[name + "/proxy"] == "status 403", (name, got)
    assert got["abstract"].startswith("closed")
    for c in canaries(world):
        assert c.accepted == [], c.addr
    assert not [h for h in world["ns"].hits if h[0] in (NS_PRIVATE, NS_LINKLOCAL, *NS_SPECIAL.values())]
    # Every refusal is in the result, with why.
    net = res["structuredContent"]["network"]
    assert net["policy"] == "on" and net["proxied"] is True
    denied = {(d["host"], d["port"]): d["reason"] for d in net["denied"]}
    assert len(denied) + net["denied_more"] == len(targets)
    assert denied[("127.0.0.1", world["c4"].port)] == "loopback"
    assert denied[("::1", world["c6"].port)] == "loopback"
    assert denied[(HOST_VETH, world["cveth"].port)] == "this server's own address"
    assert denied[(NS_PRIVATE, NS_PORT)] == "private"
    assert denied[(NS_LINKLOCAL, NS_PORT)] == "link-local"
    assert denied[("169.254.169.254", 80)] == "cloud metadata"
    assert "loopback" in denied[("evil.test", world["c4"].port)] and "127.0.0.1" in denied[("evil.test", world["c4"].port)]
    assert denied[("127.0.0.1", http_server_port)] == "loopback"
    for cls, a in NS_SPECIAL.items():
        assert denied[(a, NS_PORT)] == cls, denied
    assert denied[("bench.test", NS_PORT)].startswith("benchmarking")
    text = text_of(res)
    assert f"--- network: denied {len(targets)} destinations: " in text
    assert "(ask the operator for a --network-allow rule) ---" in text


def test_script_reaches_allowed_destinations(net_server, world):
    allowed_port = world["allowed"].server_address[1]
    script = f'''
import urllib.request, json, socket, os
out = {{}}
# Through HTTP_PROXY (plain HTTP, absolute URI), the way clients do it.
out["ns"] = urllib.request.urlopen("http://{NS_ADDR}:{NS_PORT}/plain", timeout=10).read().decode()
out["ns-name"] = urllib.request.urlopen("http://public.test:{NS_PORT}/by-name", timeout=10).read().decode()
# A loopback service of the host that a --network-allow rule names.
out["loopback"] = urllib.request.urlopen("http://127.0.0.1:{allowed_port}/rule", timeout=10).read().decode()
# SOCKS5 (no authentication, CONNECT to a domain name).
s = socket.create_connection(("127.0.0.1", 3128), timeout=5)
s.sendall(b"\\x05\\x01\\x00")
assert s.recv(2) == b"\\x05\\x00"
name = b"public.test"
s.sendall(b"\\x05\\x01\\x00\\x03" + bytes([len(name)]) + name + ({NS_PORT}).to_bytes(2, "big"))
rep = s.recv(10)
out["socks-rep"] = rep[1]
s.sendall(b"GET /socks HTTP/1.0\\r\\n\\r\\n")
data = b""
while True:
    c = s.recv(4096)
    if not c: break
    data += c
out["socks"] = data.decode().split("\\r\\n\\r\\n", 1)[-1]
out["env"] = {{k: v for k, v in os.environ.items() if "proxy" in k.lower()}}
print(json.dumps(out))
'''
    res = net_server.execute(script, timeout=60)
    assert res["structuredContent"]["exit_code"] == 0, text_of(res)
    out = json.loads(res["structuredContent"]["stdout"])
    assert out["ns"] == f"hello from the test namespace at {NS_ADDR}"
    assert out["ns-name"] == f"hello from the test namespace at {NS_ADDR}"
    assert out["loopback"] == "allowed loopback /rule"
    assert out["socks-rep"] == 0 and out["socks"].startswith("hello from the test namespace")
    assert out["env"]["HTTP_PROXY"] == out["env"]["HTTPS_PROXY"] == "http://127.0.0.1:3128"
    net = res["structuredContent"]["network"]
    assert net["connections"] >= 4 and net["bytes_in"] > 0 and net["bytes_out"] > 0
    assert net["denied"] == [] and "--- network: denied" not in text_of(res)
    assert ["/plain"] in [h[1:] for h in world["ns"].hits]


def test_call_narrows_and_never_widens(net_server, world):
    allowed_port = world["allowed"].server_address[1]
    targets = {"listed": [NS_ADDR, NS_PORT], "unlisted-name": ["public.test", NS_PORT],
               "rule-but-unlisted": ["127.0.0.1", allowed_port]}
    for _ in range(2):  # the second call may run in a prestarted sandbox
        got, res = run_probe(net_server, targets, network=[f"{NS_ADDR}:{NS_PORT}"])
        assert got["listed/proxy"].startswith("OPEN") and "hello from the test namespace" in got["listed/proxy"]
        assert got["unlisted-name/proxy"] == "status 403"
        assert got["rule-but-unlisted/proxy"] == "status 403"
        net = res["structuredContent"]["network"]
        assert net["policy"] == "rules" and net["allow"] == [f"{NS_ADDR}:{NS_PORT}"]
        reasons = {d["host"]: d["reason"] for d in net["denied"]}
        assert reasons["public.test"] == "not in this call's network list"
    # A name on the list resolving to loopback stays refused: a list never opens anything.
    got, res = run_probe(net_server, {"evil": ["evil.test", world["c4"].port]}, network=["evil.test"])
    assert got["evil/proxy"] == "status 403" and world["c4"].accepted == []
    # Widening is a tool error naming the entry.
    for entry in ("127.0.0.2", "127.0.0.1:9", "10.0.0.0/8", f"[::1]:{world['c6'].port}", "169.254.169.254",
                  f"{HOST_VETH}:{world['cveth'].port}" if False else "fd00::/8"):
        res = net_server.execute("print(1)", network=["pypi.org", entry])
        assert res["isError"] is True, entry
        assert "is refused" in text_of(res) and "--network-allow" in text_of(res), text_of(res)
    res = net_server.execute("print(1)", network=["not a rule"])
    assert res["isError"] is True and "entry 1" in text_of(res)
    # The server's own rule may be named: it stays within the policy.
    res = net_server.execute("print(1)", network=[f"127.0.0.1:{allowed_port}"])
    assert res["isError"] is False, text_of(res)
    # An empty list is no network at all.
    res = net_server.execute("print(1)", network=[])
    assert res["structuredContent"]["network"]["policy"] == "off"



def test_refusals_do_not_map_names_for_the_sandbox(net_server, world):
    """A refused client learns why (the class), never what the host's resolver answered: the
    proxy resolves names the sandbox cannot, and must not be an oracle of internal names'
    addresses.  The run's result, for the model, keeps the address."""
    script = r'''
import json, socket
def body(host, port):
    s = socket.create_connection(("127.0.0.1", 3128), timeout=5)
    s.sendall(("GET http://%s:%d/ HTTP/1.1\r\nHost: x\r\n\r\n" % (host, port)).encode())
    data = b""
    while True:
        c = s.recv(4096)
        if not c:
            break
        data += c
    return data.decode()
print(json.dumps({h: body(h, PORT) for h in ("private.test", "evil.test", "linklocal.test")}))
'''.replace("PORT", str(NS_PORT))
    res = net_server.execute(script, timeout=60)
    assert res["structuredContent"]["exit_code"] == 0, text_of(res)
    got = json.loads(res["structuredContent"]["stdout"])
    reasons = {d["host"]: d["reason"] for d in res["structuredContent"]["network"]["denied"]}
    for host, addr, cls in (("private.test", NS_PRIVATE, "private"), ("evil.test", "127.0.0.1", "loopback"),
                            ("linklocal.test", NS_LINKLOCAL, "link-local")):
        assert got[host].startswith("HTTP/1.1 403 Forbidden"), got[host]
        assert got[host].rstrip().endswith(f"{host}:{NS_PORT} is not allowed: {cls}"), got[host]
        assert addr not in got[host], got[host]
        assert addr in reasons[host] and reasons[host].startswith(cls), reasons


def test_network_false_and_off_server(net_server, world, make_server):
    got, res = run_probe(net_server, {"ns": [NS_ADDR, NS_PORT]}, network=False)
    assert got["ns/proxy"].startswith("error") and got["ns/direct"].startswith("closed")
    assert res["structuredContent"]["network"]["policy"] == "off"
    off = make_server("--network", "off")
    off.initialize()
    res = off.execute("print(1)", network=["pypi.org"])
    assert res["isError"] is True and "--network off" in text_of(res)
    got, res = run_probe(off, {"ns": [NS_ADDR, NS_PORT]})
    assert got["ns/proxy"].startswith("error")  # no forwarder at all
    assert res["structuredContent"]["network"] == {**res["structuredContent"]["network"], "policy": "off",
                                                   "proxied": False}


def test_connections_end_with_the_run(net_server, world):
    hold = world["hold"]
    before = len(hold.opened)
    script = f'''
import socket, time
s = socket.create_connection(("127.0.0.1", 3128), timeout=5)
s.sendall(b"CONNECT 127.0.0.1:{hold.port} HTTP/1.1\\r\\nHost: x\\r\\n\\r\\n")
print(s.recv(64).split(b"\\r\\n")[0].decode(), flush=True)
time.sleep(120)
'''
    res = net_server.execute(script, timeout_seconds=3, timeout=60)
    assert res["structuredContent"]["timed_out"] is True
    assert "200" in res["structuredContent"]["stdout"]
    ended = time.monotonic()
    assert len(hold.opened) == before + 1
    assert wait_until(lambda: len(hold.closed_at) >= before + 1, timeout=10)
    assert hold.closed_at[-1] - ended < 10


def test_check_environment_describes_the_policy(net_server):
    res = net_server.call("check_environment")
    text = text_of(res)
    assert "Network: on" in text and "Network policy: on" in text and "egress proxy" in text
    assert "Build network:" in text
    # What is decided how (issue 30): own addresses, special ranges, names vs addresses, held
    # sandboxes, the sandbox's resolver files, the index credentials' scope.
    for said in ("asked of it for each address", "not globally reachable", "a held sandbox has no egress",
                 "a hosts file and a resolv.conf of its own", "a denied address or prefix its destinations by any name",
                 "below the index URL's path and of the files the index's own pages linked to"):
        assert said in text, said
    sc = res["structuredContent"]
    assert sc["network"] is True and sc["network_policy"]["mode"] == "on" and sc["network_policy"]["proxied"] is True
    assert any(r.startswith("127.0.0.1:") for r in sc["network_policy"]["allow"])


def test_network_host_is_explicit_and_refused_with_lan(make_server, world):
    s = make_server("--network", "host")
    s.initialize()
    text = text_of(s.call("check_environment"))
    assert "Network policy: host (unsafe)" in text
    got, res = run_probe(s, {"loopback4": ["127.0.0.1", world["c4"].port]})
    assert got["loopback4/direct"] == "OPEN CANARY"  # what host gives up
    world["c4"].accepted.clear()
    res = s.execute("print(1)", network=["pypi.org"])
    assert res["isError"] is True and "--network host" in text_of(res)
    bad = Server("--profile", "lan", "--network", "host")
    rc = bad.proc.wait(timeout=15)
    assert rc != 0 and "refused with the lan profile" in bad.stderr_text()
    bad.close()


def test_profile_rules(make_server, world, tmp_path):
    prof = tmp_path / "p.toml"
    prof.write_text(f'network = "on"\nnetwork-allow = ["127.0.0.1:{world["allowed"].server_address[1]}"]\n'
                    f'network-deny = ["{NS_ADDR}"]\ndns-server = ["127.0.0.1:{world["dns"].port}"]\n')
    s = make_server("--profile", str(prof))
    s.initialize()
    got, res = run_probe(s, {"ns": [NS_ADDR, NS_PORT], "allowed": ["127.0.0.1", world["allowed"].server_address[1]]})
    assert got["ns/proxy"] == "status 403" and got["allowed/proxy"].startswith("OPEN")
    reasons = {d["host"]: d["reason"] for d in res["structuredContent"]["network"]["denied"]}
    assert reasons[NS_ADDR] == f"denied by --network-deny {NS_ADDR}"
    res = s.execute("print(1)", network=[NS_ADDR])
    assert res["isError"] is True and "--network-deny" in text_of(res)



def test_wide_rules_never_open_denied_ranges(world, make_server):
    """A NAT64 or IPv4-mapped rule, or 0.0.0.0/0, opens public addresses only: never loopback,
    link-local, private, cloud metadata or a special-purpose range (issue 30, 7 and 8); a rule
    that names a special-purpose range opens it."""
    s = make_server("--dns-server", f"127.0.0.1:{world['dns'].port}", "--network-allow", "64:ff9b::/96",
                    "--network-allow", "::ffff:0:0/96", "--network-allow", "0.0.0.0/0", "--network-allow", "::/0",
                    "--network-allow", f"{NS_SPECIAL['benchmarking']}:{NS_PORT}")
    s.initialize()
    targets = {"loopback4": ["127.0.0.1", world["c4"].port], "mapped-loopback": ["::ffff:127.0.0.1", world["c4"].port],
               "nat64-loopback": ["64:ff9b::7f00:1", world["c4"].port], "loopback6": ["::1", world["c6"].port],
               "private": [NS_PRIVATE, NS_PORT], "linklocal": [NS_LINKLOCAL, NS_PORT],
               "metadata": ["169.254.169.254", 80], "name-loopback": ["evil.test", world["c4"].port],
               "documentation": [NS_SPECIAL["documentation"], NS_PORT], "public": [NS_ADDR, NS_PORT],
               "named-special": [NS_SPECIAL["benchmarking"], NS_PORT]}
    got, res = run_probe(s, targets)
    for name in targets:
        if name in ("public", "named-special"):
            assert got[name + "/proxy"].startswith("OPEN") and "hello from the test namespace" in got[name + "/proxy"], got
        else:
            assert got[name + "/proxy"] == "status 403", (name, got)
    assert world["c4"].accepted == [] and world["c6"].accepted == []
    reasons = {d["host"]: d["reason"] for d in res["structuredContent"]["network"]["denied"]}
    assert reasons["::ffff:127.0.0.1"] == "loopback" and reasons["64:ff9b::7f00:1"] == "loopback", reasons
    assert reasons["169.254.169.254"] == "cloud metadata" and reasons[NS_SPECIAL["documentation"]] == "documentation"
    # A call cannot reach them through those rules either.
    res = s.execute("print(1)", network=["127.0.0.1"])
    assert res["isError"] is True and "loopback" in text_of(res), text_of(res)
    text = text_of(s.call("check_environment"))
    assert "not globally reachable" in text and "64:ff9b::/96" in text, text


def test_deny_name_denies_its_destination(world, make_server):
    """--network-deny NAME denies the server that name is: its address as a literal, or any other
    name of it, judged on what the name resolves to at connect time (issue 30, 10).  A denied
    name that does not exist denies nothing."""
    s = make_server("--dns-server", f"127.0.0.1:{world['dns'].port}", "--network-deny", "public.test",
                    "--network-deny", "nosuch.test")
    s.initialize()
    targets = {"name": ["public.test", NS_PORT], "literal": [NS_ADDR, NS_PORT], "alias": ["alias.test", NS_PORT],
               "other": ["other.test", NS_PORT], "both": ["both.test", NS_PORT]}
    hits = len(world["ns"].hits)
    got, res = run_probe(s, targets)
    assert got["name/proxy"] == "status 403" and got["literal/proxy"] == "status 403", got
    assert got["alias/proxy"] == "status 403", got
    assert got["other/proxy"].startswith("OPEN") and NS_ADDR2 in got["other/proxy"], got
    # A name with a denied and an allowed address reaches only the allowed one.
    assert got["both/proxy"].startswith("OPEN") and NS_ADDR2 in got["both/proxy"], got
    assert not [h for h in world["ns"].hits[hits:] if h[0] == NS_ADDR], world["ns"].hits[hits:]
    reasons = {d["host"]: d["reason"] for d in res["structuredContent"]["network"]["denied"]}
    assert reasons["public.test"] == "denied by --network-deny public.test"
    assert reasons[NS_ADDR] == f"denied by --network-deny public.test (that name resolves to {NS_ADDR})", reasons
    assert reasons["alias.test"].startswith("denied by --network-deny public.test"), reasons
    # The sandbox hears the rule, not what the name resolved to.
    body = s.execute(PROBE + f"\ns = socket.create_connection(('127.0.0.1', 3128), timeout=5)\n"
                     f"s.sendall(b'GET http://alias.test:{NS_PORT}/ HTTP/1.0\\r\\n\\r\\n')\n"
                     f"print(s.recv(4096).decode())\n", timeout=60)
    out = body["structuredContent"]["stdout"]
    assert "403" in out and "--network-deny public.test (the same destination)" in out and NS_ADDR not in out, out


OWN_LISTENER = r"""
import socket, sys
s = socket.socket(socket.AF_INET6, socket.SOCK_STREAM)
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
s.bind(("::", int(sys.argv[1])))
s.listen(64)
print("ready", flush=True)
while True:
    c, peer = s.accept()
    print("HIT", c.getsockname()[0], flush=True)
    c.sendall(b"OWN\n")
    c.close()
"""


def test_own_addresses_are_asked_of_the_kernel(make_server):
    """The server's own addresses are what the kernel routes locally: an address local through a
    route (AnyIP, `ip route add local ... dev lo`), IPv4 or IPv6, and the 300th address of an
    interface, as well as the first (issue 30, 6).  The server runs in a network namespace the
    test makes (setns before exec) and its own services listen on every address of it."""
    ns = f"mps-own-{str(os.getpid())[-6:]}"
    ip("netns", "add", ns)
    listener = None
    fd = os.open(f"/run/netns/{ns}", os.O_RDONLY)
    try:
        nsip = ["ip", "netns", "exec", ns, "ip"]
        subprocess.run(nsip + ["link", "set", "lo", "up"], check=True)
        subprocess.run(nsip + ["route", "add", "local", "192.31.196.0/24", "dev", "lo"], check=True)
        v6 = subprocess.run(nsip + ["-6", "route", "add", "local", "2620:4f:8000::/48", "dev", "lo"]).returncode == 0
        batch = "".join(f"addr add 192.52.193.{i}/32 dev lo\n" for i in range(1, 255)) + \
            "".join(f"addr add 192.175.48.{i}/32 dev lo\n" for i in range(1, 61))
        subprocess.run(nsip + ["-batch", "-"], input=batch, text=True, check=True)
        listener = subprocess.Popen(["ip", "netns", "exec", ns, sys.executable, "-u", "-c", OWN_LISTENER, "8090"],
                                    stdout=subprocess.PIPE, text=True)
        assert listener.stdout.readline().strip() == "ready"
        hits = []
        threading.Thread(target=lambda: [hits.append(line) for line in listener.stdout], daemon=True).start()
        setns = ctypes.CDLL(None, use_errno=True).setns

        def enter():
            if setns(fd, 0x40000000) != 0:  # CLONE_NEWNET
                os._exit(121)
        s = make_server("--dns-server", "127.0.0.1:9", preexec_fn=enter)
        s.initialize()
        targets = {"anyip4": ["192.31.196.77", 8090], "mapped-anyip": ["::ffff:192.31.196.78", 8090],
                   "first": ["192.52.193.1", 8090], "past-256th": ["192.175.48.60", 8090]}
        if v6:
            targets["anyip6"] = ["2620:4f:8000::77", 8090]
        got, res = run_probe(s, targets)
        for name in targets:
            assert got[name + "/proxy"] == "status 403", (name, got)
        reasons = {d["host"]: d["reason"] for d in res["structuredContent"]["network"]["denied"]}
        for host, _ in targets.values():
            assert reasons[host] == "this server's own address", reasons
        assert hits == [], hits
        assert "own addresses (what the kernel routes locally" in text_of(s.call("check_environment"))
        # A rule naming one of them opens that one (the operator's choice).
        s2 = make_server("--dns-server", "127.0.0.1:9", "--network-allow", "192.31.196.77:8090", preexec_fn=enter)
        s2.initialize()
        got, _ = run_probe(s2, {"named": ["192.31.196.77", 8090], "other": ["192.31.196.79", 8090]})
        assert got["named/proxy"].startswith("OPEN") and "OWN" in got["named/proxy"], got
        assert got["other/proxy"] == "status 403", got
    finally:
        os.close(fd)
        if listener:
            listener.kill()
            listener.wait()
        ip("netns", "del", ns, check=False)


def test_names_are_resolved_as_written(world, make_server):
    """The proxy's resolver applies no search domains of the host (LOCALDOMAIN stands in for
    resolv.conf's search line): "searched" is not searched.corp.test, a name the deny rule
    names, and the judged name is the one resolved."""
    s = make_server("--dns-server", f"127.0.0.1:{world['dns'].port}", "--network-deny", "searched.corp.test",
                    env={"LOCALDOMAIN": "corp.test"})
    s.initialize()
    hits, queries = len(world["ns"].hits), len(world["dns"].queries)
    script = PROBE + f"\nprint(json.dumps({{'control': _connect('control.test', {NS_PORT}), " \
                     f"'short': _connect('searched', {NS_PORT}), " \
                     f"'full': _connect('searched.corp.test', {NS_PORT})}}))\n"
    res = s.execute(script, timeout=120)
    assert res["structuredContent"]["exit_code"] == 0, text_of(res)
    got = json.loads(res["structuredContent"]["stdout"])
    assert got == {"control": "status 502", "short": "status 502", "full": "status 403"}, got
    assert len(world["ns"].hits) == hits
    # The deny rule's own name is resolved for every connection the proxy judges (issue 30, 10),
    # as many times as the control's and the short name's own queries; a search domain would
    # have added queries of searched.corp.test for "searched" (and taken away its own).
    asked = [q[0] for q in world["dns"].queries[queries:]]
    assert asked.count("searched") > 0
    assert asked.count("searched.corp.test") == asked.count("control.test") + asked.count("searched"), asked


# ------------------------------------------------------------------ builds

HOSTILE_BACKEND = r'''
import base64, csv, hashlib, io, json, os, sys, zipfile
HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from probe_code import probe
CFG = json.load(open(os.path.join(HERE, "targets.json")))

def _dump():
    """Everything a build could leak: its environment, every process it can see, and the
    files it can read (bounded)."""
    d = {"env": dict(os.environ), "proc": {}, "files": {}}
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        for what in ("environ", "cmdline"):
            try:
                d["proc"][pid + "/" + what] = open("/proc/%s/%s" % (pid, what), "rb").read().decode("latin1")
            except OSError:
                pass
    skip = ("/proc", "/sys", "/dev", "/usr", "/lib", "/lib64", "/bin", "/sbin", sys.base_prefix, sys.prefix)
    budget = 16 << 20
    for top in ("/",):
        for root, dirs, files in os.walk(top):
            dirs[:] = [x for x in dirs if not os.path.join(root, x).startswith(skip)]
            for f in files:
                p = os.path.join(root, f)
                try:
                    if os.path.islink(p) or not os.path.isfile(p) or os.path.getsize(p) > (1 << 20):
                        continue
                    data = open(p, "rb").read()
                except OSError:
                    continue
                budget -= len(data)
                if budget < 0:
                    d["truncated"] = True
                    return d
                d["files"][p] = data.decode("latin1")
    return d

def _wheel(wheel_directory, report):
    name = "mps_hostile-1.0-py3-none-any.whl"
    files = {"mps_hostile/__init__.py": "",
             "mps_hostile/report.json": json.dumps(report),
             "mps_hostile-1.0.dist-info/METADATA": "Metadata-Version: 2.1\nName: mps-hostile\nVersion: 1.0\n",
             "mps_hostile-1.0.dist-info/WHEEL": "Wheel-Version: 1.0\nGenerator: t\nRoot-Is-Purelib: true\nTag: py3-none-any\n"}
    rows = []
    with zipfile.ZipFile(os.path.join(wheel_directory, name), "w") as z:
        for rel, text in files.items():
            data = text.encode()
            z.writestr(rel, data)
            h = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
            rows.append([rel, "sha256=" + h, str(len(data))])
        rows.append(["mps_hostile-1.0.dist-info/RECORD", "", ""])
        buf = io.StringIO()
        csv.writer(buf, lineterminator="\n").writerows(rows)
        z.writestr("mps_hostile-1.0.dist-info/RECORD", buf.getvalue())
    return name

def get_requires_for_build_wheel(config_settings=None):
    return []

def build_wheel(wheel_directory, config_settings=None, metadata_directory=None):
    report = {"probe": probe(CFG["targets"], CFG["abstract"]), "dump": _dump()}
    return _wheel(wheel_directory, report)
'''


def make_hostile_sdist(directory, targets, abstract, probe_code=PROBE):
    path = os.path.join(directory, "mps_hostile-1.0.tar.gz")
    members = {
        "pyproject.toml": '[build-system]\nrequires = []\nbuild-backend = "hostile_backend"\nbackend-path = ["."]\n',
        "PKG-INFO": "Metadata-Version: 2.1\nName: mps-hostile\nVersion: 1.0\n",
        "hostile_backend.py": HOSTILE_BACKEND,
        "probe_code.py": probe_code,
        "targets.json": json.dumps({"targets": targets, "abstract": abstract}),
    }
    with tarfile.open(path, "w:gz") as t:
        for name, text in members.items():
            data = text.encode()
            info = tarfile.TarInfo(f"mps_hostile-1.0/{name}")
            info.size = len(data)
            info.mode = 0o644
            t.addfile(info, io.BytesIO(data))
    return path


class AuthIndex(socketserver.ThreadingMixIn, http.server.HTTPServer):
    daemon_threads = True


def credentialed_index(files_dir, user, password, tls=None):
    """A PEP 503 index on loopback that answers only with Basic credentials (over TLS with
    tls=(certfile, keyfile))."""
    want = "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()
    # "other": every request but GET (method, path, with the credentials); "bodied": GETs
    # with the credentials that came with a body.
    seen = {"ok": 0, "refused": 0, "paths": [], "other": [], "bodied": []}

    class H(http.server.BaseHTTPRequestHandler):
        def _other(self):
            # What a careless index does: stores uploads, deletes, echoes TRACE.
            seen["other"].append((self.command, self.path, self.headers.get("Authorization") == want))
            n = int(self.headers.get("Content-Length") or 0)
            if n:
                self.rfile.read(n)
            body = (self.requestline + "\r\n" + str(self.headers)).encode() if self.command == "TRACE" else b"done"
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        do_POST = do_PUT = do_DELETE = do_PATCH = do_TRACE = _other

        def do_GET(self):
            if self.headers.get("Authorization") != want:
                seen["refused"] += 1
                self.send_response(401)
                self.send_header("WWW-Authenticate", 'Basic realm="test"')
                self.send_header("Content-Length", "0")
                self.end_headers()
                return
            seen["ok"] += 1
            seen["paths"].append(self.path)
            if self.headers.get("Content-Length") or self.headers.get("Transfer-Encoding"):
                seen["bodied"].append(self.path)
            if self.path == "/simple/session":
                # A session cookie, issued for the credentials: as good as they are.
                self.send_response(200)
                self.send_header("Set-Cookie", f"session=cookie-{password}; Path=/")
                self.send_header("Content-Length", "2")
                self.end_headers()
                self.wfile.write(b"ok")
                return
            if self.path.rstrip("/") == "/simple" or self.path.startswith("/simple/mps-"):
                links = "".join(f'<a href="/files/{f}">{f}</a>\n' for f in os.listdir(files_dir))
                body = f"<html><body>{links}</body></html>".encode()
                ctype = "text/html"
            elif self.path.startswith("/files/") and os.path.isfile(os.path.join(files_dir, self.path[7:])):
                body = open(os.path.join(files_dir, self.path[7:]), "rb").read()
                ctype = "application/octet-stream"
            else:
                self.send_response(404)
                self.send_header("Content-Length", "0")
                self.end_headers()
                return
            self.send_response(200)
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *a):
            pass
    srv = AuthIndex(("127.0.0.1", 0), H)
    if tls:
        import ssl
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.load_cert_chain(*tls)
        srv.socket = ctx.wrap_socket(srv.socket, server_side=True)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    return srv, seen


READ_REPORT = r'''
import json, os, mps_hostile
text = open(os.path.join(os.path.dirname(mps_hostile.__file__), "report.json")).read()
r = json.loads(text)
print(json.dumps({"secrets": [s for s in %r if s in text], "probe": r["probe"],
                  "files": len(r["dump"]["files"]), "procs": len(r["dump"]["proc"]),
                  "env": sorted(r["dump"]["env"]), "proxy": r["dump"]["env"].get("HTTP_PROXY")}))
'''


def test_build_reaches_nothing_and_never_sees_credentials(world, http_server_port):
    d = tempfile.mkdtemp(prefix="mps-hostile-")
    try:
        os.chmod(d, 0o755)
        targets = forbidden_targets(world, http_server_port)
        make_hostile_sdist(d, targets, world["abstract"])
        index, seen = credentialed_index(d, "builder", SECRET)
        port = index.server_address[1]
        # The credentials come from the server's environment, as index settings (no flag),
        # along with other PIP_/UV_ variables that must not reach the build either.
        env = {"PIP_INDEX_URL": f"http://builder:{SECRET}@127.0.0.1:{port}/simple",
               "PIP_CLIENT_CERT": f"/nonexistent/{SECRET2}", "UV_INDEX_TOKEN": SECRET2,
               "PIP_EXTRA_INDEX_URL": None, "PIP_FIND_LINKS": None}
        state = os.path.join(d, "state")
        s = Server("--dns-server", f"127.0.0.1:{world['dns'].port}", state_dir=state, env=env)
        try:
            s.initialize()
            res = s.execute(READ_REPORT % ([SECRET, SECRET2, base64.b64encode(f"builder:{SECRET}".encode()).decode()],),
                            dependencies=["mps-hostile"], timeout=300)
            assert res["structuredContent"]["exit_code"] == 0, text_of(res)
            out = json.loads(res["structuredContent"]["stdout"])
            # It installed from the credentialed index: the proxy added the credentials.
            assert seen["ok"] >= 2 and any(p.startswith("/files/") for p in seen["paths"]), seen
            # The build dumped its environment, the processes and the files it could see:
            # none of it holds a secret.
            assert out["secrets"] == [], out["secrets"]
            assert out["files"] > 0 and out["procs"] > 0
            assert not [k for k in out["env"] if k in ("PIP_INDEX_URL", "PIP_CLIENT_CERT", "UV_INDEX_TOKEN")]
            assert out["proxy"] == "http://127.0.0.1:3128"
            for name, value in out["probe"].items():
                assert not value.startswith("OPEN"), (name, value)
            for name in targets:
                assert out["probe"][name + "/proxy"] == "status 403", (name, out["probe"])
            assert out["probe"]["abstract"].startswith("closed")
            for c in canaries(world):
                assert c.accepted == [], c.addr
            assert not [h for h in world["ns"].hits if h[0] in (NS_PRIVATE, NS_LINKLOCAL)]
            assert SECRET not in json.dumps(res) and SECRET not in s.stderr_text()
            key = res["structuredContent"]["environment"]["key"]
        finally:
            s.close()
        # A rotated secret is the same environment (the key holds no secret): a cache hit.
        env["PIP_INDEX_URL"] = f"http://builder:rotated-{SECRET2}@127.0.0.1:{port}/simple"
        s2 = Server("--dns-server", f"127.0.0.1:{world['dns'].port}", state_dir=state, env=env)
        try:
            s2.initialize()
            res = s2.execute("import mps_hostile\nprint('again')", dependencies=["mps-hostile"], timeout=300)
            assert res["structuredContent"]["stdout"] == "again\n", text_of(res)
            assert res["structuredContent"]["environment"] == {**res["structuredContent"]["environment"],
                                                              "key": key, "cached": True}
        finally:
            s2.close()
        index.shutdown()
    finally:
        shutil.rmtree(d, ignore_errors=True)


def test_build_policy_allows_only_the_index_hosts(world, make_server):
    """A build's sandbox reaches its index (a plain loopback one, through the proxy) and
    nothing else, not even what --network-allow opens for scripts."""
    d = tempfile.mkdtemp(prefix="mps-hostile-")
    try:
        os.chmod(d, 0o755)
        allowed_port = world["allowed"].server_address[1]
        targets = {"script-rule": ["127.0.0.1", allowed_port], "ns": [NS_ADDR, NS_PORT],
                   "ns-name": ["public.test", NS_PORT]}
        make_hostile_sdist(d, targets, None)
        index, seen = credentialed_index(d, "u", "p")
        port = index.server_address[1]
        s = make_server("--dns-server", f"127.0.0.1:{world['dns'].port}", "--network-allow", f"127.0.0.1:{allowed_port}",
                        "--index-url", f"http://u:p@127.0.0.1:{port}/simple",
                        env={"PIP_INDEX_URL": None, "PIP_EXTRA_INDEX_URL": None, "PIP_FIND_LINKS": None})
        s.initialize()
        res = s.execute(READ_REPORT % ([],), dependencies=["mps-hostile"], timeout=300)
        assert res["structuredContent"]["exit_code"] == 0, text_of(res)
        probe = json.loads(res["structuredContent"]["stdout"])["probe"]
        for name in targets:
            assert probe[name + "/proxy"] == "status 403", (name, probe)
        index.shutdown()
    finally:
        shutil.rmtree(d, ignore_errors=True)



# (a probe's raw HTTP exchange with a host: the answer as text, or the error's name)
RAW_EXCHANGE = r'''
import socket

def _raw(host, port, data):
    try:
        s = socket.create_connection((host, port), timeout=10)
        s.sendall(data)
        out = b""
        while True:
            c = s.recv(65536)
            if not c:
                break
            out += c
        return out.decode("latin1")
    except OSError as e:
        return "error " + type(e).__name__
'''

# What a hostile build tries with the index origin of its forwarder: writes, TRACE, a body
# to smuggle a second request in, a session cookie.
INDEX_ABUSE = RAW_EXCHANGE + r'''
def probe(targets, abstract):
    port = targets["index_port"]
    fw = ("127.0.1.1", 3128)
    r = {}
    for m in ("POST", "PUT", "DELETE", "PATCH", "TRACE", "get"):
        r[m] = _raw(*fw, ("%s /simple/upload HTTP/1.1\r\nHost: x\r\nContent-Length: 4\r\n\r\nbody" % m).encode())
    r["GET-body"] = _raw(*fw, b"GET /simple/ HTTP/1.1\r\nHost: x\r\nContent-Length: 4\r\n\r\nbody")
    r["GET-chunked"] = _raw(*fw, b"GET /simple/ HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n")
    r["abs-POST"] = _raw(*fw, b"POST http://127.0.1.1:3128/simple/upload HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n")
    # Plain HTTP to the index's real origin gets its credentials too: the same rules apply.
    r["origin-PUT"] = _raw("127.0.0.1", 3128, ("PUT http://127.0.0.1:%d/simple/upload HTTP/1.1\r\nHost: x\r\n"
                                                 "Content-Length: 0\r\n\r\n" % port).encode())
    r["session"] = _raw(*fw, b"GET /simple/session HTTP/1.1\r\nHost: x\r\n\r\n")
    r["GET"] = _raw(*fw, b"GET /simple/ HTTP/1.1\r\nHost: x\r\n\r\n")
    return r
'''


def hostile_build_probe(world, index_url):
    """Runs a script needing mps-hostile from index_url (the world's DNS, no PIP_* of the
    host): what its build's probe reported, and the result."""
    s = Server("--dns-server", f"127.0.0.1:{world['dns'].port}", "--index-url", index_url,
               env={"PIP_INDEX_URL": None, "PIP_EXTRA_INDEX_URL": None, "PIP_FIND_LINKS": None})
    try:
        s.initialize()
        res = s.execute("import json, os, mps_hostile\n"
                        "r = json.load(open(os.path.join(os.path.dirname(mps_hostile.__file__), 'report.json')))\n"
                        "print(json.dumps(r['probe']))", dependencies=["mps-hostile"], timeout=300)
        assert res["structuredContent"]["exit_code"] == 0, text_of(res)
        got = json.loads(res["structuredContent"]["stdout"])
    finally:
        s.close()
    return got, res


def test_build_uses_index_credentials_only_to_read(world):
    """The proxy adds the server's index credentials to GET and HEAD without a body only: a
    hostile build cannot upload, delete, have them echoed back (TRACE), smuggle a request in
    a body, or keep a session cookie the index issued for them."""
    d = tempfile.mkdtemp(prefix="mps-hostile-")
    try:
        os.chmod(d, 0o755)
        index, seen = credentialed_index(d, "builder", SECRET)
        port = index.server_address[1]
        make_hostile_sdist(d, {"index_port": port}, None, probe_code=INDEX_ABUSE)
        got, res = hostile_build_probe(world, f"http://builder:{SECRET}@127.0.0.1:{port}/simple")
        index.shutdown()
        # Nothing but GET reached the index with the credentials, and no GET with a body.
        assert [o for o in seen["other"] if o[2]] == [], seen["other"]
        assert seen["bodied"] == [], seen["bodied"]
        for name in ("POST", "PUT", "DELETE", "PATCH", "TRACE", "get", "GET-body", "GET-chunked", "abs-POST",
                     "origin-PUT"):
            assert got[name].startswith("HTTP/1.1 405 "), (name, got[name])
        assert SECRET not in json.dumps(got)
        assert got["session"].split(" ")[1] == "200" and "set-cookie" not in got["session"].lower(), got["session"]
        assert f"cookie-{SECRET}" not in got["session"]
        # The reads still work.
        assert got["GET"].split(" ")[1] == "200" and "mps_hostile-1.0.tar.gz" in got["GET"], got["GET"]
    finally:
        shutil.rmtree(d, ignore_errors=True)



def test_script_gets_no_index_credentials(world):
    """The forwarder's index origins (127.0.1.<n+1>) are a build's: a script run on the same
    server, right after a build registered the credentialed index, reaches the index only as
    anyone would (a rule opens it here), without the credentials, however it asks."""
    d = tempfile.mkdtemp(prefix="mps-scriptidx-")
    try:
        os.chmod(d, 0o755)
        wheelhouse.make_wheel(d, "mps-netdep", "1.0")
        index, seen = credentialed_index(d, "builder", SECRET)
        port = index.server_address[1]
        s = Server("--dns-server", f"127.0.0.1:{world['dns'].port}", "--network-allow", f"127.0.0.1:{port}",
                   "--index-url", f"http://builder:{SECRET}@127.0.0.1:{port}/simple",
                   env={"PIP_INDEX_URL": None, "PIP_EXTRA_INDEX_URL": None, "PIP_FIND_LINKS": None})
        script = r'''
import json, socket
def raw(addr, data):
    try:
        s = socket.create_connection(addr, timeout=10)
        s.sendall(data)
        out = b""
        while True:
            c = s.recv(65536)
            if not c:
                break
            out += c
        return out.decode("latin1").split("\r\n")[0]
    except OSError as e:
        return "error " + type(e).__name__
fw = ("127.0.0.1", 3128)
print(json.dumps({
    "origin": raw(("127.0.1.1", 3128), b"GET /simple/ HTTP/1.1\r\nHost: x\r\n\r\n"),
    "absolute": raw(fw, b"GET http://127.0.1.1:3128/simple/ HTTP/1.1\r\nHost: x\r\n\r\n"),
    "mapped": raw(fw, b"GET http://[::ffff:127.0.1.1]:3128/simple/ HTTP/1.1\r\nHost: x\r\n\r\n"),
    "connect": raw(fw, b"CONNECT 127.0.1.1:3128 HTTP/1.1\r\nHost: x\r\n\r\n"),
    "real": raw(fw, b"GET http://127.0.0.1:PORT/simple/ HTTP/1.1\r\nHost: x\r\n\r\n"),
}))
'''.replace("PORT", str(port))
        try:
            s.initialize()
            res = s.execute(script, dependencies=["mps-netdep"], timeout=300)
            assert res["structuredContent"]["exit_code"] == 0, text_of(res)
            got = json.loads(res["structuredContent"]["stdout"])
        finally:
            s.close()
        index.shutdown()
        built = seen["ok"]
        assert built >= 2 and any(p.startswith("/files/") for p in seen["paths"]), seen
        assert got["origin"].startswith("HTTP/1.1 400 "), got
        for name in ("absolute", "mapped", "connect"):
            assert got[name].startswith("HTTP/1.1 403 "), (name, got)
        assert got["real"].split(" ")[1] == "401", got  # reached, without the credentials
        assert not [p for p in seen["paths"] if p.startswith("/simple/") and p.rstrip("/") == "/simple"], seen
    finally:
        shutil.rmtree(d, ignore_errors=True)


def make_ca_and_cert(d):
    """A CA and a certificate for 127.0.0.1 and tls-index.test that it signed (openssl)."""
    def run(*a):
        subprocess.run(["openssl", *a], check=True, capture_output=True, cwd=d)
    run("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", "ca.key", "-out", "ca.pem", "-days", "2",
        "-subj", "/CN=mps test CA")
    run("req", "-newkey", "rsa:2048", "-nodes", "-keyout", "srv.key", "-out", "srv.csr", "-subj", "/CN=127.0.0.1")
    with open(os.path.join(d, "ext.cnf"), "w") as f:
        f.write("subjectAltName=IP:127.0.0.1,DNS:tls-index.test\nbasicConstraints=CA:FALSE\n")
    run("x509", "-req", "-in", "srv.csr", "-CA", "ca.pem", "-CAkey", "ca.key", "-CAcreateserial", "-out", "srv.pem",
        "-days", "2", "-extfile", "ext.cnf")
    return os.path.join(d, "ca.pem"), os.path.join(d, "srv.pem"), os.path.join(d, "srv.key")


@pytest.mark.skipif(not shutil.which("openssl"), reason="needs the openssl command to make a test CA")
def test_credentialed_https_index_through_the_proxy(world):
    """The proxy speaks TLS to an https index itself (verifying it against the trust store the
    server's SSL_CERT_FILE names) and adds the credentials; the builder sees plain HTTP on its
    forwarder and no secret."""
    d = tempfile.mkdtemp(prefix="mps-tlsindex-")
    try:
        os.chmod(d, 0o755)
        ca, cert, key = make_ca_and_cert(d)
        files = os.path.join(d, "files")
        os.makedirs(files)
        os.chmod(files, 0o755)
        wheelhouse.make_wheel(files, "mps-tlsdep", "1.0")
        index, seen = credentialed_index(files, "tls-user", SECRET, tls=(cert, key))
        port = index.server_address[1]
        args = ("--index-url", f"https://tls-user:{SECRET}@127.0.0.1:{port}/simple")
        base_env = {"PIP_INDEX_URL": None, "PIP_EXTRA_INDEX_URL": None, "PIP_FIND_LINKS": None}
        s = Server(*args, env={**base_env, "SSL_CERT_FILE": ca})
        try:
            s.initialize()
            res = s.execute("import mps_tlsdep, os\nprint(mps_tlsdep.__version__)\n"
                            "print(sorted(k for k in os.environ if 'PIP' in k or 'UV' in k))",
                            dependencies=["mps-tlsdep"], timeout=300)
            assert res["structuredContent"]["exit_code"] == 0, text_of(res)
            assert res["structuredContent"]["stdout"].startswith("1.0\n")
            assert seen["ok"] >= 2 and any(p.startswith("/files/") for p in seen["paths"]), seen
            assert SECRET not in json.dumps(res)
        finally:
            s.close()
        # Without the CA the proxy refuses the index: verification is on.
        seen["ok"] = 0
        s = Server(*args, env={**base_env, "SSL_CERT_FILE": os.path.join(d, "nonexistent.pem")})
        try:
            s.initialize()
            res = s.execute("print(1)", dependencies=["mps-tlsdep"], timeout=300)
            assert res["isError"] is True
            assert seen["ok"] == 0
        finally:
            s.close()
        index.shutdown()
    finally:
        shutil.rmtree(d, ignore_errors=True)



@pytest.mark.skipif(not shutil.which("openssl"), reason="needs the openssl command to make a test CA")
def test_index_tls_handshake_that_hangs_moves_on(world):
    """An https index whose name has two addresses, the first of which accepts and then never
    answers the TLS handshake: after the handshake's timeout the proxy tries the next address
    with a TLS session of its own (the hung one freed: the sanitizer build's leak check)."""
    d = tempfile.mkdtemp(prefix="mps-tlsindex-")
    hang = None
    try:
        os.chmod(d, 0o755)
        ca, cert, key = make_ca_and_cert(d)
        files = os.path.join(d, "files")
        os.makedirs(files)
        os.chmod(files, 0o755)
        wheelhouse.make_wheel(files, "mps-tlsdep", "1.0")
        index, seen = credentialed_index(files, "tls-user", SECRET, tls=(cert, key))
        port = index.server_address[1]
        # The first address: one connection is accepted and held, then nothing listens.
        hang = socket.socket()
        hang.bind(("127.0.0.2", port))
        hang.listen(1)
        held = []

        def hold_one():
            c, _ = hang.accept()
            held.append(c)
            hang.close()
        threading.Thread(target=hold_one, daemon=True).start()
        s = Server("--dns-server", f"127.0.0.1:{world['dns'].port}",
                   "--index-url", f"https://tls-user:{SECRET}@tls-index.test:{port}/simple",
                   env={"PIP_INDEX_URL": None, "PIP_EXTRA_INDEX_URL": None, "PIP_FIND_LINKS": None,
                        "SSL_CERT_FILE": ca, "PIP_DEFAULT_TIMEOUT": "60", "UV_HTTP_TIMEOUT": "60"})
        try:
            s.initialize()
            res = s.execute("import mps_tlsdep\nprint(mps_tlsdep.__version__)", dependencies=["mps-tlsdep"],
                            timeout=300)
            assert res["structuredContent"]["exit_code"] == 0, text_of(res)
            assert res["structuredContent"]["stdout"] == "1.0\n"
            assert len(held) == 1 and seen["ok"] >= 2
        finally:
            s.close()  # asserts no sanitizer report
        index.shutdown()
        for c in held:
            c.close()
    finally:
        shutil.rmtree(d, ignore_errors=True)


def test_per_run_connection_caps(world, make_server):
    hold = world["hold"]
    s = make_server("--network-allow", f"127.0.0.1:{hold.port}", "--network-max-connections", "2",
                    "--network-max-total-connections", "4")
    s.initialize()
    script = f'''
import socket, time
def tunnel():
    c = socket.create_connection(("127.0.0.1", 3128), timeout=5)
    c.sendall(b"CONNECT 127.0.0.1:{hold.port} HTTP/1.1\\r\\nHost: x\\r\\n\\r\\n")
    return c
a, b = tunnel(), tunnel()
print("a", a.recv(12).decode(), "b", b.recv(12).decode(), flush=True)
c = tunnel()
c.settimeout(1.5)
try:
    c.recv(12); print("third answered at once")
except socket.timeout:
    print("third waits")
a.close()
c.settimeout(10)
print("third", c.recv(12).decode())
b.close()
d = tunnel()
d.settimeout(10)
print("fourth", d.recv(12).decode())
c.close()
e = tunnel()
e.settimeout(10)
print("fifth", e.recv(64).decode().split("\\r\\n")[0])
'''
    res = s.execute(script, timeout=60)
    out = res["structuredContent"]["stdout"]
    assert "a HTTP/1.1 200 b HTTP/1.1 200" in out, text_of(res)
    assert "third waits" in out and "third HTTP/1.1 200" in out
    assert "fourth HTTP/1.1 200" in out
    assert "fifth HTTP/1.1 429 Too Many Requests" in out


def test_per_run_bandwidth_cap(world, make_server):
    """--network-rate: a token bucket per run (a burst of one second's worth, then the rate)."""
    s = make_server("--network-allow", f"127.0.0.1:{world['allowed'].server_address[1]}", "--network-rate", "64K")
    s.initialize()
    port = world["allowed"].server_address[1]
    script = f'''
import urllib.request, time
t = time.monotonic()
n = 0
for i in range(5):
    n += len(urllib.request.urlopen("http://127.0.0.1:{port}/big/60000", timeout=30).read())
print(n, round(time.monotonic() - t, 2))
'''
    res = s.execute(script, timeout=120)
    assert res["structuredContent"]["exit_code"] == 0, text_of(res)
    n, took = res["structuredContent"]["stdout"].split()
    net = res["structuredContent"]["network"]
    # 300 KB through a 64 KiB/s bucket cannot take less than (300 - 64) / 64 s: a lower bound,
    # so no load makes it flaky.
    total = net["bytes_in"] + net["bytes_out"]
    assert int(n) == 300_000 and total > 300_000
    assert float(took) >= (total - 65536) / 65536 * 0.9, (took, total)


# ------------------------------------------------------------------ a GitLab-shaped index

GL_PREFIX = "/api/v4/projects/1/packages/pypi"


def _server_path(raw):
    """The path a lenient server (Tomcat, a framework's router) acts on: percent-decoded, ";"
    parameters and dot segments resolved (the way out of an index's path a request may try)."""
    import posixpath
    import urllib.parse
    path = urllib.parse.unquote(raw.split("?", 1)[0]).replace("\\", "/")
    path = "/".join(seg.split(";", 1)[0] for seg in path.split("/"))
    norm = posixpath.normpath(path)
    return norm + "/" if path.endswith("/") and norm != "/" else norm


def gitlab_index(files_dir, user, password):
    """A credentialed index shaped like GitLab's (Artifactory's and Nexus's are alike): the
    simple pages at GL_PREFIX/simple, linking to GL_PREFIX/files/<sha256>/<name> relatively
    ("../../files/..."), and beside them a private API path that answers the credentials with a
    secret.  Every request is logged: (raw path, the path acted on, credentials?, headers)."""
    import hashlib
    want = "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()
    log = []

    class H(http.server.BaseHTTPRequestHandler):
        def _send(self, status, body=b"", ctype="text/plain", extra=()):
            self.send_response(status)
            for k, v in extra:
                self.send_header(k, v)
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(body)

        def do_GET(self):
            path = _server_path(self.path)
            creds = self.headers.get("Authorization") == want
            log.append((self.path, path, creds, dict(self.headers)))
            if not creds:
                return self._send(401, b"", extra=[("WWW-Authenticate", 'Basic realm="gitlab"')])
            files = sorted(os.listdir(files_dir))
            if path == GL_PREFIX + "/simple/early/":
                # Interim heads before the final one, each with a cookie of the credentials'
                # and hop-by-hop headers (what a proxy passes on must be rewritten, every head).
                self.wfile.write(
                    b"HTTP/1.1 100 Continue\r\nSet-Cookie: c100=cookie-" + password.encode() +
                    b"\r\nKeep-Alive: timeout=5\r\n\r\n"
                    b"HTTP/1.1 103 Early Hints\r\nLink: </s.css>; rel=preload\r\nSet-Cookie: c103=cookie-" +
                    password.encode() + b"\r\nConnection: X-Hop\r\nX-Hop: h\r\n\r\n"
                    b"HTTP/1.1 200 OK\r\nSet-Cookie: session=cookie-" + password.encode() +
                    b"\r\nX-Hop2: y\r\nConnection: X-Hop2\r\nContent-Type: text/plain\r\n"
                    b"Content-Length: 5\r\n\r\nearly")
                self.close_connection = True
                return
            if path == "/api/v4/private/token" or path.startswith("/api/v4/projects/2/"):
                return self._send(200, f"private-{password}".encode())
            if path.rstrip("/") == GL_PREFIX + "/simple":
                links = "".join(f'<a href="{f.split("-")[0].replace("_", "-")}/">{f}</a>\n' for f in files)
                return self._send(200, f"<html><body>{links}</body></html>".encode(), "text/html")
            if path.startswith(GL_PREFIX + "/simple/mps-"):
                links = ""
                for f in files:
                    data = open(os.path.join(files_dir, f), "rb").read()
                    sha = hashlib.sha256(data).hexdigest()
                    links += f'<a href="../../files/{sha}/{f}#sha256={sha}">{f}</a>\n'
                return self._send(200, f"<html><body>{links}</body></html>".encode(), "text/html")
            if path.startswith(GL_PREFIX + "/files/"):
                name = path.rsplit("/", 1)[1]
                if name in files:
                    return self._send(200, open(os.path.join(files_dir, name), "rb").read(),
                                      "application/octet-stream")
            return self._send(404)

        do_HEAD = do_GET

        def log_message(self, *a):
            pass
    srv = AuthIndex(("127.0.0.1", 0), H)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    return srv, log


@contextlib.contextmanager
def gitlab_serving_hostile(probe_code):
    """A GitLab-shaped credentialed index (gitlab_index) serving the hostile sdist with
    probe_code (its targets: the index's port and path prefix): its URL with the credentials,
    and its log."""
    d = tempfile.mkdtemp(prefix="mps-gitlab-")
    try:
        os.chmod(d, 0o755)
        files = os.path.join(d, "files")
        os.makedirs(files)
        os.chmod(files, 0o755)
        index, log = gitlab_index(files, "deploy", SECRET)
        port = index.server_address[1]
        make_hostile_sdist(files, {"index_port": port, "prefix": GL_PREFIX}, None, probe_code=probe_code)
        try:
            yield f"http://deploy:{SECRET}@127.0.0.1:{port}{GL_PREFIX}/simple", log
        finally:
            index.shutdown()
    finally:
        shutil.rmtree(d, ignore_errors=True)


# What a build tries on the index's host besides the index: the private API, by the
# forwarder's index origin, by dot segments, encoded or ";"-hidden, from a linked file's
# place, and by the index's real origin.
PRIVATE_PROBE = RAW_EXCHANGE + r'''
def probe(targets, abstract):
    port, p = targets["index_port"], targets["prefix"]
    fw = ("127.0.1.1", 3128)
    tries = {
        "private": "/api/v4/private/token",
        "other-project": "/api/v4/projects/2/packages/pypi/simple/",
        "dots": p + "/simple/../../../../private/token",
        "encoded-dots": p + "/simple/%2e%2e/%2e%2e/%2e%2e/%2e%2e/private/token",
        "encoded-slash": p + "/simple/..%2f..%2f..%2f..%2fprivate/token",
        "params": p + "/simple/..;/..;/..;/..;/private/token",
        "backslash": p + "/simple/..\\..\\..\\..\\private\\token",
        "from-files": p + "/files/../../../private/token",
    }
    r = {}
    for name, path in tries.items():
        r[name] = _raw(*fw, ("GET %s HTTP/1.1\r\nHost: x\r\n\r\n" % path).encode())
    r["real-origin"] = _raw("127.0.0.1", 3128, ("GET http://127.0.0.1:%d/api/v4/private/token HTTP/1.1\r\n"
                                                  "Host: x\r\n\r\n" % port).encode())
    r["page"] = _raw(*fw, ("GET %s/simple/mps-hostile/ HTTP/1.1\r\nHost: x\r\n\r\n" % p).encode())
    return r
'''


def test_index_credentials_only_for_the_index(world):
    """The index's credentials go with requests below the index URL's path and to the files
    its pages linked to, nothing else on its host (issue 30, 1): a build asks for the private
    API of a GitLab-shaped index by every spelling (dot segments, encoded, ";"-hidden, from a
    file's place, the real origin) and gets what anyone gets, 401, while its dependencies
    still install from the index (pages, and the relatively linked files, credentialed)."""
    with gitlab_serving_hostile(PRIVATE_PROBE) as (url, log):
        got, res = hostile_build_probe(world, url)
        for name in ("private", "other-project", "dots", "encoded-dots", "encoded-slash", "params", "backslash",
                     "from-files", "real-origin"):
            assert got[name].split(" ")[1] == "401", (name, got[name][:300])
        assert SECRET not in json.dumps(got) and f"private-{SECRET}" not in json.dumps(res)
        # The index's own page is still read with them.
        assert got["page"].split(" ")[1] == "200" and "mps_hostile-1.0.tar.gz" in got["page"], got["page"][:300]
        # What reached the index with the credentials: its pages and the files they linked to.
        credentialed = [(raw, path) for raw, path, creds, _ in log if creds]
        assert any(p.startswith(GL_PREFIX + "/files/") for _, p in credentialed), log
        for raw, path in credentialed:
            assert raw == path and (path.startswith(GL_PREFIX + "/simple") or path.startswith(GL_PREFIX + "/files/")), raw
        assert not [raw for raw, path, creds, _ in log if creds and "private" in path], log


EARLY_PROBE = r"""
import socket

def probe(targets, abstract):
    s = socket.create_connection(("127.0.1.1", 3128), timeout=10)
    s.sendall(("GET %s/simple/early/ HTTP/1.1\r\nHost: x\r\nExpect: 100-continue\r\n\r\n" % targets["prefix"]).encode())
    out = b""
    while True:
        c = s.recv(65536)
        if not c:
            break
        out += c
    return {"early": out.decode("latin1")}
"""


def test_every_response_head_of_an_index_is_rewritten(world):
    """An index's answer with interim heads (100 Continue, 103 Early Hints) before the final one:
    each head reaches the build rewritten, without the index's cookies (issued for the server's
    credentials) or hop-by-hop headers, and a credentialed request goes without Expect
    (issue 30, 2)."""
    with gitlab_serving_hostile(EARLY_PROBE) as (url, log):
        got = hostile_build_probe(world, url)[0]["early"]
        heads = got.split("\r\n\r\n")
        assert heads[0] == "HTTP/1.1 100 Continue", got
        assert heads[1] == "HTTP/1.1 103 Early Hints\r\nLink: </s.css>; rel=preload", got
        assert heads[2].startswith("HTTP/1.1 200 OK\r\n") and heads[3] == "early", got
        assert "cookie" not in got.lower() and SECRET not in got, got
        for hop in ("Keep-Alive", "X-Hop", "X-Hop2"):
            assert hop.lower() + ":" not in got.lower(), (hop, got)
        early = [h for raw, path, creds, h in log if path == GL_PREFIX + "/simple/early/"]
        assert early and all(not any(k.lower() == "expect" for k in h) for h in early), early


# ------------------------------------------------------------------ held interpreters

# A dependency whose .pth runs in every interpreter of its environment, a held one included
# (before any call): it opens tunnels through the forwarder to the Hold server and keeps them.
PTH_HOOK = r"""
import socket, threading, time
N, PORT = {count}, {port}
state = {{"status": [], "socks": [], "t": time.time()}}

def _one():
    try:
        s = socket.create_connection(("127.0.0.1", 3128), timeout=60)
        state["socks"].append(s)
        s.sendall(b"CONNECT 127.0.0.1:%d HTTP/1.1\r\nHost: x\r\n\r\n" % PORT)
        head = s.recv(64)
        state["status"].append(head.split(b"\r\n")[0].decode(errors="replace") or "closed")
    except OSError as e:
        state["status"].append("error " + type(e).__name__)

for _ in range(N):
    threading.Thread(target=_one, daemon=True).start()
"""


def pth_wheelhouse(port, count):
    d = tempfile.mkdtemp(prefix="mps-pth-")
    os.chmod(d, 0o755)
    wheelhouse.make_wheel(d, "mps-pthnet", "1.0", files={
        "mps_pthnet.pth": "import mps_pthnet_hook\n",
        "mps_pthnet_hook.py": PTH_HOOK.format(count=count, port=port),
        "mps_pthnet/__init__.py": "",
    })
    return d


# The call's side: what became of the .pth's tunnels (joined for a while), and whether any of
# them still leads to the Hold server.
USE_PTH_TUNNELS = r"""
import json, time, mps_pthnet_hook as h
deadline = time.monotonic() + 15
while len(h.state["status"]) < h.N and time.monotonic() < deadline:
    time.sleep(0.05)
got = []
for s in h.state["socks"]:
    try:
        s.settimeout(2)
        s.sendall(b"ping")
        got.append(s.recv(64).decode(errors="replace"))
    except OSError as e:
        got.append("error " + type(e).__name__)
print(json.dumps({"status": sorted(h.state["status"]), "got": got, "t": h.state["t"]}))
"""


def wait_dependency_shape_held(s):
    """Until a held interpreter of a shape with an environment is ready (check_environment)."""
    def ready():
        shapes = s.call("check_environment")["structuredContent"]["prestart"]["shapes"]
        return any(x["environment"] and x["ready"] >= 1 and x["holds"] == "interpreter" for x in shapes)
    assert wait_until(ready, timeout=30, interval=0.2), s.stderr_text()[-2000:]


def test_a_held_interpreter_is_bound_by_the_calls_network(world, make_server):
    """A call's network list binds a prestarted interpreter before anything of the call runs
    (issue 30, 3): a .pth of the environment that opened a tunnel while the interpreter was
    held (under the server's wider policy) leaves the narrowed script nothing to use; the
    tunnel never reached its destination."""
    hold = world["hold"]
    wheels = pth_wheelhouse(hold.port, 1)
    try:
        s = make_server("--prestart", "1", "--prestart-max", "1", "--find-links", wheels, "--offline",
                        "--dns-server", f"127.0.0.1:{world['dns'].port}", "--network-allow", f"127.0.0.1:{hold.port}")
        s.initialize()
        narrow = [f"{NS_ADDR}:{NS_PORT}"]
        first = s.execute("print(1)", dependencies=["mps-pthnet"], network=narrow, timeout=180)
        assert first["structuredContent"]["exit_code"] == 0, text_of(first)
        opened = len(hold.opened)
        # The dependency's shape is held now: its interpreter runs the .pth.
        wait_dependency_shape_held(s)
        wait_until(lambda: len(hold.opened) > opened, timeout=5)
        called = time.time()
        res = s.execute(USE_PTH_TUNNELS, dependencies=["mps-pthnet"], network=narrow, timeout=60)
        sc = res["structuredContent"]
        assert sc["exit_code"] == 0 and sc["prestarted"] == "interpreter", text_of(res)
        out = json.loads(sc["stdout"])
        assert out["t"] < called, "the .pth ran in the call, not while held"
        assert out["status"] and not [x for x in out["status"] if " 200 " in x], out
        assert not [g for g in out["got"] if "HOLD" in g], out
        assert len(hold.opened) == opened, "a held interpreter's tunnel reached its destination"
        assert sc["network"]["policy"] == "rules" and sc["network"]["allow"] == narrow
    finally:
        shutil.rmtree(wheels, ignore_errors=True)


def test_held_interpreters_get_no_egress(world, make_server):
    """A held (not yet released) sandbox gets no egress at all (issue 30, 4): a .pth that opens
    more tunnels than the server-wide connection cap (32 here: the server's open-file limit)
    while its interpreter waits for a call reaches nothing, and a call of another shape still
    connects at once."""
    import resource
    hold = world["hold"]
    wheels = pth_wheelhouse(hold.port, 40)

    def low_nofile():
        resource.setrlimit(resource.RLIMIT_NOFILE, (640, 640))
    try:
        s = make_server("--prestart", "1", "--prestart-max", "1", "--find-links", wheels, "--offline",
                        "--dns-server", f"127.0.0.1:{world['dns'].port}", "--network-allow", f"127.0.0.1:{hold.port}",
                        preexec_fn=low_nofile)
        s.initialize()
        first = s.execute("print(1)", dependencies=["mps-pthnet"], network=[f"{NS_ADDR}:{NS_PORT}"], timeout=180)
        assert first["structuredContent"]["exit_code"] == 0, text_of(first)
        opened = len(hold.opened)
        wait_dependency_shape_held(s)
        wait_until(lambda: len(hold.opened) >= opened + 32, timeout=8)
        assert len(hold.opened) == opened, f"held interpreters opened {len(hold.opened) - opened} connections"
        # A call of the default shape (no dependencies) is not starved.
        script = f'''
import socket
c = socket.create_connection(("127.0.0.1", 3128), timeout=5)
c.sendall(b"CONNECT 127.0.0.1:{hold.port} HTTP/1.1\\r\\nHost: x\\r\\n\\r\\n")
c.settimeout(5)
try:
    print(c.recv(64).split(b"\\r\\n")[0].decode())
except socket.timeout:
    print("starved")
'''
        res = s.execute(script, timeout=60)
        assert res["structuredContent"]["stdout"].strip() == "HTTP/1.1 200 Connection Established", text_of(res)
        assert len(hold.opened) == opened + 1
        # The held interpreter did run the .pth (before its call), and got nowhere.
        called = time.time()
        res = s.execute(USE_PTH_TUNNELS, dependencies=["mps-pthnet"], network=[f"{NS_ADDR}:{NS_PORT}"], timeout=60)
        sc = res["structuredContent"]
        assert sc["exit_code"] == 0 and sc["prestarted"] == "interpreter", text_of(res)
        out = json.loads(sc["stdout"])
        assert out["t"] < called and len(out["status"]) == 40, out
        assert not [x for x in out["status"] if " 200 " in x] and not [g for g in out["got"] if "HOLD" in g], out
        assert len(hold.opened) == opened + 1
    finally:
        shutil.rmtree(wheels, ignore_errors=True)


# ------------------------------------------------------------------ the sandbox's resolver files

def test_a_networked_sandbox_gets_no_resolver_files_of_the_host(world, make_server, tmp_path):
    """A sandbox whose way out is the egress proxy gets a hosts file of its own (localhost and
    its name) and a resolv.conf that names nothing of the host: no internal names, search
    domains or resolvers (issue 30, 9).  The server runs in a mount namespace the test makes,
    whose /etc/hosts and /etc/resolv.conf are an internal network's; names still resolve
    through the proxy."""
    hosts = tmp_path / "hosts"
    hosts.write_text("127.0.0.1 localhost\n10.9.8.7 internal-db.corp.example internal-db\n")
    resolv = tmp_path / "resolv.conf"
    resolv.write_text("search corp.example\nnameserver 10.9.8.53\noptions ndots:3\n")

    def private_etc():
        libc = ctypes.CDLL(None, use_errno=True)
        clone_newns, ms_rec, ms_private, ms_bind = 0x20000, 0x4000, 1 << 18, 4096
        if libc.unshare(clone_newns) != 0 or libc.mount(None, b"/", None, ms_rec | ms_private, None) != 0:
            os._exit(121)
        for src, dst in ((hosts, "/etc/hosts"), (resolv, "/etc/resolv.conf")):
            if libc.mount(str(src).encode(), dst.encode(), None, ms_bind, None) != 0:
                os._exit(122)
    s = make_server("--dns-server", f"127.0.0.1:{world['dns'].port}", preexec_fn=private_etc)
    s.initialize()
    script = f'''
import json, socket, urllib.request
out = {{"hosts": open("/etc/hosts").read(), "resolv": open("/etc/resolv.conf").read()}}
try:
    socket.getaddrinfo("internal-db", 80)
    out["lookup"] = "resolved"
except OSError as e:
    out["lookup"] = type(e).__name__
out["proxy"] = urllib.request.urlopen("http://public.test:{NS_PORT}/resolv", timeout=10).read().decode()
print(json.dumps(out))
'''
    res = s.execute(script, timeout=60)
    assert res["structuredContent"]["exit_code"] == 0, text_of(res)
    out = json.loads(res["structuredContent"]["stdout"])
    for name in ("hosts", "resolv"):
        for planted in ("internal-db", "corp.example", "10.9.8."):
            assert planted not in out[name], (name, out[name])
    assert "localhost" in out["hosts"]
    assert [line for line in out["resolv"].splitlines() if line and not line.startswith("#")] == \
        ["nameserver 127.0.0.1", "options timeout:1 attempts:1"], out["resolv"]
    assert out["lookup"] == "gaierror", out
    assert out["proxy"] == f"hello from the test namespace at {NS_ADDR}"
    # Without network: the same files (one mount plan for every backend: a container cannot
    # be without the engine's resolv.conf, so every sandbox off the host's network gets ours).
    res = s.execute("print(open('/etc/hosts').read()); print(open('/etc/resolv.conf').read())",
                    network=False)
    text = res["structuredContent"]["stdout"]
    assert "internal-db" not in text and "localhost" in text, text
    assert "corp.example" not in text and "10.9.8." not in text and "nameserver 127.0.0.1" in text, text

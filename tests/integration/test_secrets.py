"""Secrets that never enter the sandbox (issue 37): --secret NAME=PATH@HOST and [secrets.NAME] in
a --profile file; a call names them in `secrets`; the script gets a placeholder in $NAME, never
the value; an unknown or foreign name is a tool error; check_environment lists names and hosts;
a placeholder sent in cleartext (plain HTTP, here to an allowed loopback server) is never
replaced and the request is refused (403) before it leaves; a missing or world-readable file
stops the start; the value is in no result, log or audit line.

Only loopback: the upstream is a plain HTTP server on 127.0.0.1 that records what reaches it."""
import http.server
import json
import os
import socketserver
import sys
import threading

import pytest

from conftest import BACKEND, Server  # noqa: E402

pytestmark = [pytest.mark.skipif(BACKEND != "bwrap", reason="secrets need the bwrap backend's egress proxy"),
              pytest.mark.xdist_group("secrets")]

VALUE = "val-7c1e9b2d-never-in-a-sandbox"


def text_of(res):
    return "\n".join(c.get("text", "") for c in res["content"] if c.get("type") == "text")


class Recorder(socketserver.ThreadingMixIn, http.server.HTTPServer):
    daemon_threads = True


def recording_server():
    seen = []

    class H(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            seen.append(self.requestline + "\n" + str(self.headers))
            body = b"ok"
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *a):
            pass
    srv = Recorder(("127.0.0.1", 0), H)
    srv.seen = seen
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    return srv


@pytest.fixture(scope="module")
def upstream():
    srv = recording_server()
    yield srv
    srv.shutdown()


@pytest.fixture(scope="module")
def secret_file(tmp_path_factory):
    d = tmp_path_factory.mktemp("secrets")
    f = d / "token"
    f.write_text(VALUE + "\n")
    os.chmod(f, 0o600)
    return f


@pytest.fixture(scope="module")
def audit_path(tmp_path_factory):
    return tmp_path_factory.mktemp("audit") / "audit.log"


@pytest.fixture(scope="module")
def server(upstream, secret_file, audit_path):
    port = upstream.server_address[1]
    s = Server("--network-allow", f"127.0.0.1:{port}",
               "--secret", f"API_TOKEN={secret_file}@api.example.test,*.example.org:8443",
               "--audit-log", str(audit_path), "--prestart", "off")
    s.initialize()
    yield s
    s.close()


def test_placeholder_in_env_value_nowhere(server):
    script = r'''
import os, json, glob
needle = b"%s"[::-1]  # (reversed: the script itself must not hold the value)
ph = os.environ.get("API_TOKEN", "")
found = []
for p in glob.glob("/proc/*/environ") + glob.glob("/proc/*/cmdline"):
    try:
        if needle in open(p, "rb").read():
            found.append(p)
    except OSError:
        pass
# Every file the sandbox can read in its writable and configuration trees.
for top in ("/work", "/tmp", "/etc", "/opt", "/dev/shm"):
    for root, dirs, files in os.walk(top):
        for f in files:
            p = os.path.join(root, f)
            try:
                if os.path.getsize(p) < (8 << 20) and needle in open(p, "rb").read():
                    found.append(p)
            except OSError:
                pass
print(json.dumps({"ph": ph, "found": found}))
''' % VALUE[::-1]
    res = server.execute(script, secrets=["API_TOKEN"], timeout=120)
    sc = res["structuredContent"]
    assert sc["exit_code"] == 0, text_of(res)
    out = json.loads(sc["stdout"])
    assert out["ph"].startswith("mps-secret:API_TOKEN:") and len(out["ph"]) == len("mps-secret:API_TOKEN:") + 32
    assert out["found"] == []
    assert sc["network"]["secrets_used"] == []
    # A call that does not name it gets nothing of it.
    res = server.execute("import os; print(os.environ.get('API_TOKEN'))", timeout=120)
    assert res["structuredContent"]["stdout"].strip() == "None"
    # Placeholders are per call.
    res2 = server.execute("import os; print(os.environ['API_TOKEN'])", secrets=["API_TOKEN"], timeout=120)
    assert res2["structuredContent"]["stdout"].strip() != out["ph"]


def test_cleartext_placeholder_is_refused(server, upstream):
    port = upstream.server_address[1]
    before = len(upstream.seen)
    script = f'''
import base64, os, urllib.request, urllib.error
ph = os.environ["API_TOKEN"]
def get(url, headers):
    try:
        r = urllib.request.urlopen(urllib.request.Request(url, headers=headers), timeout=20)
        return r.status
    except urllib.error.HTTPError as e:
        return e.code
print(get("http://127.0.0.1:{port}/plain", {{"Authorization": "Bearer " + ph}}))
basic = base64.b64encode(("user:" + ph).encode()).decode()
print(get("http://127.0.0.1:{port}/basic", {{"Authorization": "Basic " + basic}}))
print(get("http://127.0.0.1:{port}/q?token=" + ph, {{}}))
print(get("http://127.0.0.1:{port}/clean", {{"X-Other": "nothing"}}))
'''
    res = server.execute(script, secrets=["API_TOKEN"], timeout=120)
    sc = res["structuredContent"]
    assert sc["exit_code"] == 0, text_of(res)
    assert sc["stdout"].split() == ["403", "403", "403", "200"]
    # Only the clean request reached the upstream; no placeholder and no value did.
    got = upstream.seen[before:]
    assert len(got) == 1 and "/clean" in got[0]
    assert "mps-secret" not in "".join(got) and VALUE not in "".join(got)
    assert sc["network"]["secrets_used"] == []
    assert any("API_TOKEN" in d["reason"] for d in sc["network"]["denied"]), sc["network"]
    assert VALUE not in json.dumps(res)


def test_unknown_secret_and_no_network_are_tool_errors(server):
    for bad in (["NOPE"], ["api_token"], "API_TOKEN", [1]):
        res = server.execute("print(1)", secrets=bad, timeout=60)
        assert res["isError"] is True, bad
    res = server.execute("print(1)", secrets=["NOPE"], timeout=60)
    assert "Unknown secret 'NOPE'" in text_of(res)
    res = server.execute("print(1)", secrets=["API_TOKEN"], network=False, timeout=60)
    assert res["isError"] is True and "network" in text_of(res)


def test_check_environment_lists_names_and_hosts(server):
    res = server.call("check_environment")
    text = text_of(res)
    assert "API_TOKEN (hosts: api.example.test, *.example.org:8443)" in text
    assert res["structuredContent"]["secrets"] == [
        {"name": "API_TOKEN", "hosts": ["api.example.test", "*.example.org:8443"]}]
    assert VALUE not in json.dumps(res)


def test_value_in_no_log_or_audit(server, audit_path):
    server.execute("import os; print(os.environ['API_TOKEN'])", secrets=["API_TOKEN"], timeout=120)
    audit = audit_path.read_text()
    assert VALUE not in audit and VALUE not in server.stderr_text()
    lines = [json.loads(l) for l in audit.splitlines() if l.strip()]
    assert any(l.get("secrets_used") == [] for l in lines), audit[-2000:]


def test_start_up_errors(tmp_path):
    f = tmp_path / "v"
    f.write_text("x\n")
    os.chmod(f, 0o644)
    s = Server("--secret", f"A={f}@api.example.test")
    assert s.proc.wait(timeout=30) != 0 and "world-readable" in s.stderr_text()
    s.close()
    s = Server("--secret", f"A={tmp_path}/missing@api.example.test")
    assert s.proc.wait(timeout=30) != 0 and "secret A" in s.stderr_text()
    s.close()
    os.chmod(f, 0o600)
    for bad in (f"a={f}@h.test", f"A={f}", f"A={f}@10.0.0.1"):
        s = Server("--secret", bad)
        assert s.proc.wait(timeout=30) != 0, bad
        s.close()
    s = Server("--secret", f"A={f}@api.example.test", "--network-deny", "api.example.test")
    assert s.proc.wait(timeout=30) != 0 and "--network-deny" in s.stderr_text()
    s.close()


def test_profile_secrets_and_principals(tmp_path):
    f = tmp_path / "tok"
    f.write_text(VALUE)
    os.chmod(f, 0o600)
    prof = tmp_path / "p.toml"
    prof.write_text('[secrets.MINE]\nfile = "tok"\nhosts = ["api.example.test"]\n\n'
                    '[secrets.ALICE_ONLY]\nfile = "tok"\nhosts = ["a.example.test"]\nprincipals = ["alice"]\n')
    s = Server("--profile", str(prof), "--prestart", "off")
    try:
        s.initialize()
        sc = s.call("check_environment")["structuredContent"]
        assert sc["secrets"] == [{"name": "MINE", "hosts": ["api.example.test"]}]
        # Another principal's secret answers like an unknown one (stdio is principal "stdio").
        res = s.execute("print(1)", secrets=["ALICE_ONLY"], timeout=60)
        assert res["isError"] is True and "Unknown secret 'ALICE_ONLY'" in text_of(res)
        res = s.execute("import os; print(os.environ['MINE'][:15])", secrets=["MINE"], timeout=120)
        assert res["structuredContent"]["stdout"].strip() == "mps-secret:MINE"
    finally:
        s.close()


# ------------------------------------------------------------------ TLS interception

from test_network import DnsResponder  # noqa: E402
import ssl  # noqa: E402
import subprocess  # noqa: E402


def make_test_ca(d):
    """A CA of the test's own and a certificate for the upstream's names, made with openssl."""
    run = lambda *a: subprocess.run(["openssl", *a], check=True, capture_output=True)  # noqa: E731
    run("req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes", "-days", "2",
        "-subj", "/CN=test upstream CA", "-keyout", str(d / "ca.key"), "-out", str(d / "ca.pem"),
        "-addext", "basicConstraints=critical,CA:TRUE", "-addext", "keyUsage=critical,keyCertSign,cRLSign")
    run("req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes", "-subj", "/CN=upstream",
        "-keyout", str(d / "up.key"), "-out", str(d / "up.csr"))
    (d / "ext.cnf").write_text("subjectAltName=DNS:api.example.test,DNS:other.example.test\n"
                               "extendedKeyUsage=serverAuth\nbasicConstraints=critical,CA:FALSE\n"
                               "keyUsage=critical,digitalSignature\n"
                               "authorityKeyIdentifier=keyid\nsubjectKeyIdentifier=hash\n")
    run("x509", "-req", "-in", str(d / "up.csr"), "-CA", str(d / "ca.pem"), "-CAkey", str(d / "ca.key"),
        "-CAcreateserial", "-days", "2", "-extfile", str(d / "ext.cnf"), "-out", str(d / "up.pem"))


@pytest.fixture(scope="module")
def tls_world(tmp_path_factory):
    d = tmp_path_factory.mktemp("tlsworld")
    make_test_ca(d)
    seen = []

    class H(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            seen.append(self.requestline + "\n" + str(self.headers))
            body = b"upstream ok"
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def do_POST(self):
            n = int(self.headers.get("Content-Length", "0"))
            seen.append(self.requestline + "\n" + str(self.headers) + "\nBODY " + str(len(self.rfile.read(n))))
            self.send_response(200)
            self.send_header("Content-Length", "7")
            self.end_headers()
            self.wfile.write(b"posted!")

        def log_message(self, *a):
            pass
    srv = Recorder(("127.0.0.1", 0), H)
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(str(d / "up.pem"), str(d / "up.key"))
    srv.socket = ctx.wrap_socket(srv.socket, server_side=True)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    dns = DnsResponder({"api.example.test": "127.0.0.1", "other.example.test": "127.0.0.1"})
    port = srv.server_address[1]
    for name, host in (("tok", "api"), ("other", "other")):
        (d / name).write_text(f"{VALUE}-{name}\n")
        os.chmod(d / name, 0o600)
    s = Server("--dns-server", f"127.0.0.1:{dns.port}", "--egress-ca-file", str(d / "ca.pem"),
               "--network-allow", f"api.example.test:{port}", "--network-allow", f"other.example.test:{port}",
               "--secret", f"API_TOKEN={d / 'tok'}@api.example.test:{port}",
               "--secret", f"OTHER={d / 'other'}@other.example.test:{port}", "--prestart", "off")
    s.initialize()
    yield {"server": s, "port": port, "seen": seen, "dir": d, "dns": dns}
    s.close()
    srv.shutdown()


def test_upstream_receives_the_value_over_intercepted_tls(tls_world):
    s, port, seen = tls_world["server"], tls_world["port"], tls_world["seen"]
    before = len(seen)
    script = f'''
import base64, http.client, json, os, ssl, subprocess, urllib.request
ph = os.environ["API_TOKEN"]
out = {{}}
url = "https://api.example.test:{port}/u?key=" + ph
r = urllib.request.urlopen(urllib.request.Request(url, headers={{"Authorization": "Bearer " + ph}}), timeout=30)
out["urllib"] = r.read().decode()
basic = base64.b64encode(("user:" + ph).encode()).decode()
# http.client through the proxy with the default context, and with Python 3.13's strict flag
for name, flags in (("default", 0), ("strict", ssl.VERIFY_X509_STRICT)):
    ctx = ssl.create_default_context()
    ctx.verify_flags |= flags
    c = http.client.HTTPSConnection("127.0.0.1", 3128, context=ctx, timeout=30)
    c.set_tunnel("api.example.test", {port})
    c.request("GET", "/b", headers={{"Authorization": "Basic " + basic}})
    out[name] = c.getresponse().read().decode()
p = subprocess.run(["curl", "-sS", "-H", "X-Key: " + ph, "https://api.example.test:{port}/c"],
                   capture_output=True, text=True)
out["curl"] = p.stdout + p.stderr
out["env"] = {{k: os.environ.get(k) for k in ("SSL_CERT_FILE", "REQUESTS_CA_BUNDLE", "CURL_CA_BUNDLE", "PIP_CERT", "NODE_EXTRA_CA_CERTS")}}
print(json.dumps(out))
'''
    res = s.execute(script, secrets=["API_TOKEN"], timeout=120)
    sc = res["structuredContent"]
    assert sc["exit_code"] == 0, text_of(res)
    out = json.loads(sc["stdout"])
    assert out["urllib"] == out["default"] == out["strict"] == "upstream ok", out
    assert "upstream ok" in out["curl"], out["curl"]
    assert set(out["env"].values()) == {"/etc/ssl/certs/ca-certificates.crt"}
    got = seen[before:]
    assert len(got) == 4, got
    import base64
    value = VALUE + "-tok"
    assert f"/u?key={value}" in got[0] and f"Bearer {value}" in got[0]
    assert base64.b64encode(f"user:{value}".encode()).decode() in got[1]
    assert f"X-Key: {value}" in got[3]
    assert "mps-secret" not in "".join(got)
    assert sc["network"]["secrets_used"] == ["API_TOKEN"]
    assert value not in json.dumps(res) and value not in s.stderr_text()


def test_placeholder_to_another_secrets_host_is_refused(tls_world):
    s, port, seen = tls_world["server"], tls_world["port"], tls_world["seen"]
    before = len(seen)
    script = f'''
import os, urllib.request, urllib.error
ph = os.environ["OTHER"]
try:
    urllib.request.urlopen(urllib.request.Request("https://api.example.test:{port}/x",
                           headers={{"Authorization": "Bearer " + ph}}), timeout=30)
    print("sent")
except urllib.error.HTTPError as e:
    print(e.code)
'''
    res = s.execute(script, secrets=["API_TOKEN", "OTHER"], timeout=120)
    sc = res["structuredContent"]
    assert sc["stdout"].strip() == "403", text_of(res)
    assert len(seen) == before
    assert sc["network"]["secrets_used"] == []


def test_no_secret_no_ca(tls_world):
    """A call that names no secret: no interception, no CA variables (the host's trust)."""
    s, port = tls_world["server"], tls_world["port"]
    script = f'''
import os, ssl, urllib.request
print(os.environ.get("SSL_CERT_FILE"))
try:
    urllib.request.urlopen("https://api.example.test:{port}/n", timeout=30)
    print("verified")
except Exception as e:
    print("refused", type(e).__name__)
'''
    res = s.execute(script, timeout=120)
    lines = res["structuredContent"]["stdout"].split("\n")
    assert lines[0] == "None" and lines[1].startswith("refused"), lines  # the test CA is not the host's


def test_network_list_without_the_host_gets_a_note(tls_world):
    s, port, seen = tls_world["server"], tls_world["port"], tls_world["seen"]
    res = s.execute("print(1)", secrets=["API_TOKEN"], network=[f"other.example.test:{port}"], timeout=120)
    assert "secret API_TOKEN: none of its hosts is in this call's network list" in text_of(res)
    res = s.execute("print(1)", secrets=["API_TOKEN"], network=[f"api.example.test:{port}"], timeout=120)
    assert "none of its hosts" not in text_of(res)


def test_refusal_is_said_in_the_text(tls_world):
    s, port = tls_world["server"], tls_world["port"]
    script = f'''
import os, urllib.request, urllib.error
try:
    urllib.request.urlopen(urllib.request.Request("https://api.example.test:{port}/x",
                           headers={{"X": os.environ["OTHER"]}}), timeout=30)
except urllib.error.HTTPError as e:
    print(e.code)
'''
    res = s.execute(script, secrets=["API_TOKEN", "OTHER"], timeout=120)
    assert "secret OTHER's placeholder was refused (403)" in text_of(res)


def test_sighup_reads_the_values_again(tls_world):
    import signal
    s, port, seen, d = tls_world["server"], tls_world["port"], tls_world["seen"], tls_world["dir"]
    (d / "tok").write_text("rotated-value-5e2\n")
    s.proc.send_signal(signal.SIGHUP)
    from conftest import wait_until
    assert wait_until(lambda: "SIGHUP: secrets read again" in s.stderr_text(), timeout=15)
    before = len(seen)
    script = f'''
import os, urllib.request
urllib.request.urlopen(urllib.request.Request("https://api.example.test:{port}/r",
                       headers={{"X": os.environ["API_TOKEN"]}}), timeout=30).read()
'''
    res = s.execute(script, secrets=["API_TOKEN"], timeout=120)
    assert res["structuredContent"]["exit_code"] == 0, text_of(res)
    assert "X: rotated-value-5e2" in seen[before]
    # A file that turned world-readable keeps the old value (and says so).
    os.chmod(d / "tok", 0o644)
    n = s.stderr_text().count("SIGHUP: secrets read again")
    s.proc.send_signal(signal.SIGHUP)
    assert wait_until(lambda: s.stderr_text().count("SIGHUP: secrets read again") > n, timeout=15)
    assert "world-readable" in s.stderr_text()
    os.chmod(d / "tok", 0o600)
    # The value the other tests expect, back.
    (d / "tok").write_text(f"{VALUE}-tok\n")
    n = s.stderr_text().count("SIGHUP: secrets read again")
    s.proc.send_signal(signal.SIGHUP)
    assert wait_until(lambda: s.stderr_text().count("SIGHUP: secrets read again") > n, timeout=15)


def test_other_backends_refuse_secrets(secret_file):
    s = Server("--secret", f"API_TOKEN={secret_file}@api.example.test", backend="none")
    try:
        s.initialize()
        res = s.execute("print(1)", secrets=["API_TOKEN"], timeout=60)
        assert res["isError"] is True and "bwrap backend" in text_of(res)
    finally:
        s.close()


def test_large_head_and_body_through_interception(tls_world):
    s, port, seen = tls_world["server"], tls_world["port"], tls_world["seen"]
    before = len(seen)
    script = f'''
import os, urllib.request
ph = os.environ["API_TOKEN"]
req = urllib.request.Request("https://api.example.test:{port}/post", data=b"x" * 300000,
                             headers={{"X-Big": "y" * 12000, "X-Key": ph}}, method="POST")
print(urllib.request.urlopen(req, timeout=60).read().decode())
'''
    res = s.execute(script, secrets=["API_TOKEN"], timeout=120)
    assert res["structuredContent"]["stdout"].strip() == "posted!", text_of(res)
    got = seen[before]
    assert f"X-Key: {VALUE}-tok" in got and got.endswith("BODY 300000")


def test_principals_over_http(tmp_path):
    """[secrets.NAME] principals: the secret is alice's; bob neither sees it in check_environment
    nor may name it (the answer is that of an unknown name)."""
    from test_http import HttpServer, LATEST, call_msg
    from test_tenancy import result_of
    (tmp_path / "tokens").write_text("alice: tok-alice-0123456789\nbob: tok-bob-9876543210\n")
    (tmp_path / "v").write_text(VALUE)
    os.chmod(tmp_path / "v", 0o600)
    (tmp_path / "p.toml").write_text('[secrets.ALICE_KEY]\nfile = "v"\nhosts = ["api.example.test"]\n'
                                     'principals = ["alice"]\n')
    s = HttpServer("--auth-token-file", str(tmp_path / "tokens"), "--profile", str(tmp_path / "p.toml"),
                   "--sandbox-backend", "bwrap", "--no-warm-cache", "--prestart", "off")
    try:
        answers = {}
        for who, tok in (("alice", "tok-alice-0123456789"), ("bob", "tok-bob-9876543210")):
            auth = {"Authorization": f"Bearer {tok}"}
            sid = s.initialize(headers=auth)
            msg = {"jsonrpc": "2.0", "id": 1, "method": "tools/call",
                   "params": {"name": "check_environment", "arguments": {}}}
            st, h, body = s.post(msg, sid, headers=auth, version=LATEST)
            env = result_of(h, body, 1)["result"]
            st, h, body = s.post(call_msg(2, "import os; print(os.environ['ALICE_KEY'][:21])", secrets=["ALICE_KEY"]),
                                 sid, headers=auth, version=LATEST)
            answers[who] = (env, result_of(h, body, 2)["result"])
        alice_env, alice_run = answers["alice"]
        bob_env, bob_run = answers["bob"]
        assert alice_env["structuredContent"]["secrets"] == [{"name": "ALICE_KEY", "hosts": ["api.example.test"]}]
        assert bob_env["structuredContent"]["secrets"] == []
        assert "ALICE_KEY" not in text_of(bob_env)
        assert alice_run["structuredContent"]["stdout"].strip() == "mps-secret:ALICE_KEY:"
        assert bob_run["isError"] is True and "Unknown secret 'ALICE_KEY'" in text_of(bob_run)
        assert VALUE not in json.dumps(answers) and VALUE not in s.stderr_text()
    finally:
        s.close()


def test_values_are_kept_out_of_core_dumps(tls_world):
    """Each value lives in a mapping marked MADV_DONTDUMP (VmFlags "dd" in smaps)."""
    def dontdump(pid):
        """kB in mappings marked dd (adjacent ones merge: sizes, not counts)."""
        total, size = 0, 0
        for line in open(f"/proc/{pid}/smaps"):
            if line.startswith("Size:"):
                size = int(line.split()[1])
            elif line.startswith("VmFlags:") and "dd" in line.split()[1:]:
                total += size
        return total
    plain = Server("--prestart", "off")  # the same binary without secrets: its libraries' own
    try:
        plain.initialize()
        baseline = dontdump(plain.proc.pid)
    finally:
        plain.close()
    page_kb = os.sysconf("SC_PAGESIZE") // 1024
    assert dontdump(tls_world["server"].proc.pid) >= baseline + 2 * page_kb  # API_TOKEN and OTHER


def test_ca_bundle_is_per_process_and_removed(secret_file, tmp_path):
    s = Server("--secret", f"API_TOKEN={secret_file}@api.example.test", "--prestart", "off",
               state_dir=str(tmp_path / "state"))
    try:
        s.initialize()
        res = s.execute("print(open('/etc/ssl/certs/ca-certificates.crt').read().count('BEGIN CERTIFICATE') > 0)",
                        secrets=["API_TOKEN"], timeout=120)
        assert res["structuredContent"]["stdout"].strip() == "True", text_of(res)
        made = os.listdir(tmp_path / "state" / "egress-ca")
        assert made == [f"ca-certificates-{s.proc.pid}.crt"]
        pem = (tmp_path / "state" / "egress-ca" / made[0]).read_text()
        assert "PRIVATE KEY" not in pem and pem.rstrip().endswith("-----END CERTIFICATE-----")
    finally:
        s.close()
    assert os.listdir(tmp_path / "state" / "egress-ca") == []


def test_upstream_is_verified(tls_world):
    """Without --egress-ca-file the test upstream's certificate is not trusted: the proxy answers
    the CONNECT with 502 and nothing (no value) reaches the upstream."""
    port, seen, d = tls_world["port"], tls_world["seen"], tls_world["dir"]
    s = Server("--dns-server", f"127.0.0.1:{tls_world['dns'].port}",
               "--network-allow", f"api.example.test:{port}",
               "--secret", f"API_TOKEN={d / 'tok'}@api.example.test:{port}", "--prestart", "off")
    try:
        s.initialize()
        before = len(seen)
        script = f'''
import os, urllib.request
try:
    urllib.request.urlopen(urllib.request.Request("https://api.example.test:{port}/v",
                           headers={{"X": os.environ["API_TOKEN"]}}), timeout=30)
    print("sent")
except Exception as e:
    print("refused", e)
'''
        res = s.execute(script, secrets=["API_TOKEN"], timeout=120)
        out = res["structuredContent"]["stdout"]
        assert out.startswith("refused") and "502" in out, text_of(res)
        assert len(seen) == before
    finally:
        s.close()


def test_lean_result_still_says_which_secrets_were_used(tls_world):
    """Without details the result is lean, but a call with secrets keeps its network object
    (secrets_used); one without keeps none."""
    s, port = tls_world["server"], tls_world["port"]
    script = f'''
import os, urllib.request
urllib.request.urlopen(urllib.request.Request("https://api.example.test:{port}/lean",
                       headers={{"X": os.environ["API_TOKEN"]}}), timeout=30).read()
'''
    res = s.execute(script, secrets=["API_TOKEN"], details=False, timeout=120)
    assert res["structuredContent"]["network"]["secrets_used"] == ["API_TOKEN"], res["structuredContent"]
    res = s.execute("print(1)", details=False, timeout=120)
    assert "network" not in res["structuredContent"]


def test_tools_list_declares_secrets_only_where_there_are_some(server, secret_file):
    props = lambda s: [t for t in s.request("tools/list")["result"]["tools"]  # noqa: E731
                       if t["name"] == "execute_python"][0]["inputSchema"]["properties"]
    assert props(server)["secrets"]["type"] == "array"
    plain = Server("--prestart", "off")
    try:
        plain.initialize()
        assert "secrets" not in props(plain)
    finally:
        plain.close()

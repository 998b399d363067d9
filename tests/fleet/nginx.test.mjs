// nginx (Debian's package) in front of three instances of the server on loopback, with the
// files of deploy/nginx/ as they are: TLS from a CA the test makes, a session's requests on
// the instance that answered its initialize, the stateless era routed freely, SSE unbuffered.
// The load (tests/fleet/load.mjs, the SDK v1 client) runs in a child process that trusts the
// test's CA (NODE_EXTRA_CA_CERTS).
import { test } from "node:test";
import assert from "node:assert/strict";
import { execFileSync, spawn } from "node:child_process";
import { request as httpsRequest } from "node:https";
import { connect } from "node:net";
import { mkdirSync, readFileSync, writeFileSync, chownSync, existsSync } from "node:fs";
import { join } from "node:path";

import {
  FLEET_DIR, ROOT, freePort, get, makeToken, metricValue, startInstance, tempDir, waitReady, waitUntil,
} from "./lib.mjs";

const ROUTES = ["i1", "i2", "i3"];
// The address nginx connects to the instances from, and the one a test's own client uses
// (the load connects from 127.0.0.1).
const NGINX_SOURCE = "127.0.0.3";
const CLIENT_SOURCE = "127.0.0.2";

/** A CA and a server certificate for 127.0.0.1 and localhost, made with openssl. */
function makeCA(dir) {
  const ossl = (...a) => execFileSync("openssl", a, { cwd: dir, stdio: ["ignore", "ignore", "pipe"] });
  ossl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2", "-subj", "/CN=mps fleet test CA",
    "-keyout", "ca.key", "-out", "ca.pem", "-addext", "basicConstraints=critical,CA:TRUE", "-addext", "keyUsage=critical,keyCertSign");
  ossl("req", "-newkey", "rsa:2048", "-nodes", "-subj", "/CN=localhost", "-keyout", "server.key", "-out", "server.csr");
  writeFileSync(join(dir, "ext.cnf"), "subjectAltName=IP:127.0.0.1,DNS:localhost\nextendedKeyUsage=serverAuth\n");
  ossl("x509", "-req", "-in", "server.csr", "-CA", "ca.pem", "-CAkey", "ca.key", "-CAcreateserial", "-days", "2",
    "-extfile", "ext.cnf", "-out", "server.pem");
  return { ca: join(dir, "ca.pem"), cert: join(dir, "server.pem"), key: join(dir, "server.key") };
}

/**
 * nginx with deploy/nginx/mcp-{maps,location,gone}.conf and a site of the test's: the pool
 * and one upstream per instance, as mcp-site.conf.example has them.  Returns { port, url,
 * dir, stop() }.
 */
async function startNginx(t, { instances, tls }) {
  const dir = tempDir(t, "fleet-nginx");
  for (const d of ["body", "proxy", "fastcgi", "uwsgi", "scgi"]) {
    mkdirSync(join(dir, d));
    if (process.getuid() === 0) chownSync(join(dir, d), 65534, 65534); // the workers run as nobody
  }
  const port = await freePort();
  const deploy = join(ROOT, "deploy", "nginx");
  const servers = instances.map((inst) => `    server 127.0.0.1:${inst.port} max_fails=1 fail_timeout=10s;`).join("\n");
  const site = `
include ${deploy}/mcp-maps.conf;
upstream mcp_pool {
    least_conn;
${servers}
    keepalive 32;
}
${instances.map((inst, i) => `upstream mcp_${ROUTES[i]} { server 127.0.0.1:${inst.port}; keepalive 8; }`).join("\n")}
map $mcp_route $mcp_upstream {
${instances.map((_, i) => `    ${ROUTES[i]} mcp_${ROUTES[i]};`).join("\n")}
    default mcp_pool;
}
map $upstream_addr $mcp_self_route {
${instances.map((inst, i) => `    "~(^|, )127\\.0\\.0\\.1:${inst.port}$" ${ROUTES[i]};`).join("\n")}
    default "";
}
server {
    listen 127.0.0.1:${port} ssl http2;
    # nginx reaches the instances from an address of its own, as it would from another
    # host: the instances trust it (--trusted-proxy) and tell it from its clients.
    proxy_bind ${NGINX_SOURCE};
    ssl_certificate ${tls.cert};
    ssl_certificate_key ${tls.key};
    ssl_protocols TLSv1.2 TLSv1.3;
    access_log ${dir}/access.log mcp;
    location = /mcp {
        include ${deploy}/mcp-location.conf;
    }
    location = /healthz {
        return 200 "ok\\n";
    }
    location / {
        return 404;
    }
    include ${deploy}/mcp-gone.conf;
}
`;
  const conf = `
${process.getuid() === 0 ? "user nobody nogroup;" : ""}
worker_processes 2;
pid ${dir}/nginx.pid;
error_log ${dir}/error.log warn;
events { worker_connections 1024; }
http {
    client_body_temp_path ${dir}/body;
    proxy_temp_path ${dir}/proxy;
    fastcgi_temp_path ${dir}/fastcgi;
    uwsgi_temp_path ${dir}/uwsgi;
    scgi_temp_path ${dir}/scgi;
    ${site}
}
`;
  writeFileSync(join(dir, "nginx.conf"), conf);
  execFileSync("nginx", ["-t", "-q", "-c", join(dir, "nginx.conf"), "-p", dir], { stdio: ["ignore", "ignore", "pipe"] });
  const proc = spawn("nginx", ["-c", join(dir, "nginx.conf"), "-p", dir, "-g", "daemon off;"], { stdio: ["ignore", "ignore", "pipe"] });
  let err = "";
  proc.stderr.on("data", (c) => (err += c));
  const exited = new Promise((r) => proc.once("exit", r));
  const stop = async () => {
    if (proc.exitCode === null && proc.signalCode === null) {
      proc.kill("SIGQUIT");
      const killer = setTimeout(() => proc.kill("SIGKILL"), 10000);
      await exited;
      clearTimeout(killer);
    }
  };
  t.after(stop);
  assert.ok(await waitUntil(() => existsSync(join(dir, "nginx.pid")), 10000), `nginx did not start: ${err}`);
  return { port, url: `https://127.0.0.1:${port}/mcp`, dir, stop, log: () => readFileSync(join(dir, "error.log"), "utf8") };
}

/** Three instances (their own state directories and audit logs, one token file), ready;
 * operator names the principal that may read their /metrics. */
async function startInstances(t, n, tokenFile, dir, operator) {
  const instances = [];
  for (let i = 0; i < n; i++) {
    const port = await freePort();
    const audit = join(dir, `audit-${i}.log`);
    const inst = startInstance(t, {
      port, tokenFile,
      args: ["--audit-log", audit, "--trusted-proxy", NGINX_SOURCE, "--metrics-token", operator, "--max-concurrent", "8", "--max-token-concurrent", "64", "--max-token-running", "8",
        "--max-sessions-per-token", "256", "--max-session-concurrent", "2", "--kill-grace-seconds", "1"],
    });
    inst.audit = audit;
    instances.push(inst);
  }
  for (const inst of instances) await waitReady(inst.base, 60000, `instance on ${inst.port}`);
  return instances;
}

/** Runs load.mjs; resolves its JSON document. */
function runLoad(t, { url, token, ca, dir, sessions, calls, workers, killAfter, killPid, tag, execEvery = 1 }) {
  const out = join(dir, `load-${tag}.json`);
  const args = [join(FLEET_DIR, "load.mjs"), "--url", url, "--token", token, "--sessions", String(sessions),
    "--calls", String(calls), "--workers", String(workers), "--out", out, "--tag", tag, "--call-timeout-ms", "90000", "--exec-every", String(execEvery)];
  if (killAfter) args.push("--kill-after", String(killAfter), "--kill-pid", String(killPid));
  return new Promise((resolve, reject) => {
    const p = spawn(process.execPath, args, { env: { ...process.env, NODE_EXTRA_CA_CERTS: ca }, stdio: ["ignore", "pipe", "pipe"] });
    let text = "";
    p.stdout.on("data", (c) => (text += c));
    p.stderr.on("data", (c) => (text += c));
    t.after(() => p.exitCode === null && p.kill("SIGKILL"));
    p.once("exit", (code) => {
      if (code !== 0) return reject(new Error(`load.mjs exited ${code}: ${text.slice(-3000)}`));
      t.diagnostic(text.trim());
      resolve(JSON.parse(readFileSync(out, "utf8")));
    });
  });
}

/** Every audit line of an instance of the given event. */
function auditLines(inst, event) {
  const text = existsSync(inst.audit) ? readFileSync(inst.audit, "utf8") : "";
  return text.split("\n").filter((l) => l.trim()).map((l) => JSON.parse(l)).filter((a) => a.event === event);
}

/** One POST through nginx from localAddress; resolves { status, headers, body }. */
function postFrom(url, { ca, localAddress, headers = {}, body }) {
  const data = Buffer.from(JSON.stringify(body));
  return new Promise((resolve, reject) => {
    const req = httpsRequest(url, {
      method: "POST", ca: readFileSync(ca), localAddress, agent: false,
      headers: { "content-type": "application/json", accept: "application/json, text/event-stream", "content-length": data.length, ...headers },
    }, (res) => {
      let text = "";
      res.setEncoding("utf8");
      res.on("data", (c) => (text += c));
      res.on("end", () => resolve({ status: res.statusCode, headers: res.headers, body: text }));
    });
    req.on("error", reject);
    req.end(data);
  });
}

/** The audit lines of execute_python, per instance: Map sha256 -> count (and "tool:NAME" -> count). */
function auditCounts(instances) {
  return instances.map((inst) => {
    const counts = new Map();
    const text = existsSync(inst.audit) ? readFileSync(inst.audit, "utf8") : "";
    for (const line of text.split("\n")) {
      if (!line.trim()) continue;
      const a = JSON.parse(line);
      if (a.event !== "tool_call") continue;
      counts.set(`tool:${a.tool}`, (counts.get(`tool:${a.tool}`) ?? 0) + 1);
      if (a.tool !== "execute_python") continue;
      counts.set(a.script_sha256, (counts.get(a.script_sha256) ?? 0) + 1);
    }
    return counts;
  });
}

// The submission tier's load: 60 sessions x 10 calls; ./test.sh --full (MPS_FLEET_FULL=1)
// runs 200 x 20.
const LOAD = process.env.MPS_FLEET_FULL === "1" ? { sessions: 200, calls: 20 } : { sessions: 60, calls: 10 };

test(`nginx: ${LOAD.sessions} sessions x ${LOAD.calls} calls over TLS to three instances, none lost, each answered once, the load spread`, async (t) => {
  const dir = tempDir(t);
  const tok = makeToken(dir);
  const tls = makeCA(dir);
  const instances = await startInstances(t, 3, tok.file, dir, tok.name);
  const ngx = await startNginx(t, { instances, tls });

  // Plain HTTP on the TLS port is refused; the front's own /healthz answers over TLS.
  const plain = await get(`http://127.0.0.1:${ngx.port}/healthz`);
  assert.notEqual(plain.status, 200, "plain HTTP to the TLS port was served");

  // Every fifth call runs Python; the others are validate_script (answered by the server
  // itself): what is under test is where each call goes, not the interpreter's start-up.
  const doc = await runLoad(t, { url: ngx.url, token: tok.token, ca: tls.ca, dir, ...LOAD, workers: 24, tag: "spread", execEvery: 5 });
  const failed = doc.calls.filter((c) => !c.ok);
  assert.equal(doc.calls.length, LOAD.sessions * LOAD.calls);
  assert.deepEqual(failed.slice(0, 5), [], `${failed.length} call(s) failed`);
  assert.equal(doc.calls.filter((c) => c.notFound).length, 0, "a session was lost (404) with every instance up");

  // Each call ran exactly once, in the instance of its session's route: every instance's
  // audit log counts exactly the calls of its sessions, tool by tool, and holds each
  // execute_python script once.
  const counts = auditCounts(instances);
  for (const [i, r] of ROUTES.entries()) {
    for (const tool of ["execute_python", "validate_script"]) {
      const sent = doc.calls.filter((c) => c.route === r && c.tool === tool).length;
      assert.equal(counts[i].get(`tool:${tool}`) ?? 0, sent, `instance ${r}: ${tool} calls in its audit log vs its sessions' calls`);
    }
  }
  for (const c of doc.calls.filter((x) => x.tool === "execute_python")) {
    const i = ROUTES.indexOf(c.route);
    assert.ok(i >= 0, `session id without a route tag: ${c.sid}`);
    const total = counts.reduce((n, m) => n + (m.get(c.sha256) ?? 0), 0);
    assert.equal(total, 1, `call s${c.session} c${c.call} ran ${total} times`);
    assert.equal(counts[i].get(c.sha256), 1, `call s${c.session} c${c.call} ran outside its session's instance ${c.route}`);
  }
  // Behind nginx each line names both: nginx as the peer, the load's own address as the client.
  for (const inst of instances) {
    for (const a of auditLines(inst, "tool_call"))
      assert.deepEqual([a.remote, a.client, a.forwarded], [NGINX_SOURCE, "127.0.0.1", "ok"], `instance ${inst.port}: ${JSON.stringify(a)}`);
  }
  // Spread: every instance took a fair part of the sessions and of the calls (its /metrics too).
  const perRoute = ROUTES.map((r) => new Set(doc.calls.filter((c) => c.route === r).map((c) => c.sid)).size);
  t.diagnostic(`sessions per instance: ${perRoute.join(", ")}`);
  for (const [i, n] of perRoute.entries()) assert.ok(n >= LOAD.sessions / 3 / 2, `instance ${ROUTES[i]} got ${n} of ${LOAD.sessions} sessions`);
  for (const [i, inst] of instances.entries()) {
    const m = await get(`${inst.base}/metrics`, { headers: { authorization: `Bearer ${tok.token}` } });
    const calls = metricValue(m.body, "mcp_sandbox_tool_calls_total");
    assert.equal(calls, doc.calls.filter((c) => c.route === ROUTES[i]).length, `instance ${inst.port}: calls in /metrics`);
    assert.ok(calls >= (LOAD.sessions * LOAD.calls) / 3 / 2, `instance ${inst.port}: ${calls} calls in /metrics`);
  }
  assert.doesNotMatch(ngx.log(), /\[(error|crit|alert|emerg)\]/, "nginx logged errors");
});

test("nginx: the audit log has the client's address behind nginx; a client's own X-Forwarded-For changes nothing", async (t) => {
  const dir = tempDir(t);
  const tok = makeToken(dir);
  const tls = makeCA(dir);
  const instances = await startInstances(t, 3, tok.file, dir, tok.name);
  const ngx = await startNginx(t, { instances, tls });
  // nginx writes its pid file a moment before it listens.
  const listening = () => new Promise((r) => {
    const sock = connect(ngx.port, "127.0.0.1", () => { sock.destroy(); r(true); });
    sock.on("error", () => r(false));
  });
  assert.ok(await waitUntil(listening, 10000), "nginx does not listen");
  const from = { ca: tls.ca, localAddress: CLIENT_SOURCE };
  const auth = { authorization: `Bearer ${tok.token}` };
  // A session (the handshake era) and a call in it, each request claiming another address.
  const spoof = { "x-forwarded-for": "6.6.6.6, 10.0.0.1", forwarded: "for=6.6.6.7" };
  const init = await postFrom(ngx.url, {
    ...from, headers: { ...auth, ...spoof },
    body: { jsonrpc: "2.0", id: 0, method: "initialize", params: { protocolVersion: "2025-11-25", capabilities: {}, clientInfo: { name: "xff", version: "0" } } },
  });
  assert.equal(init.status, 200, init.body);
  const sid = init.headers["mcp-session-id"];
  assert.match(sid, /^i[123]\./);
  const session = { ...auth, ...spoof, "mcp-session-id": sid, "mcp-protocol-version": "2025-11-25" };
  assert.equal((await postFrom(ngx.url, { ...from, headers: session, body: { jsonrpc: "2.0", method: "notifications/initialized" } })).status, 202);
  const called = await postFrom(ngx.url, {
    ...from, headers: session,
    body: { jsonrpc: "2.0", id: 1, method: "tools/call", params: { name: "validate_script", arguments: { script: "print(1)\n" } } },
  });
  assert.equal(called.status, 200, called.body);
  // And a request without a token: its auth_failure line too.
  const refused = await postFrom(ngx.url, { ...from, headers: spoof, body: { jsonrpc: "2.0", id: 2, method: "ping" } });
  assert.equal(refused.status, 401);

  const inst = instances[ROUTES.indexOf(sid.split(".")[0])];
  assert.ok(await waitUntil(() => auditLines(inst, "tool_call").length === 1, 10000), "no tool_call line");
  const [call] = auditLines(inst, "tool_call");
  assert.deepEqual([call.remote, call.client, call.forwarded, call.tool], [NGINX_SOURCE, CLIENT_SOURCE, "ok", "validate_script"]);
  assert.ok(await waitUntil(() => instances.some((i) => auditLines(i, "auth_failure").length > 0), 10000), "no auth_failure line");
  const fails = instances.flatMap((i) => auditLines(i, "auth_failure"));
  assert.equal(fails.length, 1);
  assert.deepEqual([fails[0].remote, fails[0].client, fails[0].forwarded], [NGINX_SOURCE, CLIENT_SOURCE, "ok"]);
  for (const i of instances) {
    const text = existsSync(i.audit) ? readFileSync(i.audit, "utf8") : "";
    assert.doesNotMatch(text, /6\.6\.6\.[67]/, "a client's own claim reached the audit log");
  }
  // nginx's own access log agrees on who the client was.
  assert.match(readFileSync(join(ngx.dir, "access.log"), "utf8"), new RegExp(`^${CLIENT_SOURCE.replaceAll(".", "\\.")} `, "m"));
});

test("nginx: the stateless era (2026-07-28) routes every request freely over the pool", async (t) => {
  const dir = tempDir(t);
  const tok = makeToken(dir);
  const tls = makeCA(dir);
  const instances = await startInstances(t, 3, tok.file, dir, tok.name);
  const ngx = await startNginx(t, { instances, tls });
  const res = execFileSync(process.execPath, [join(FLEET_DIR, "modern-calls.mjs"), ngx.url, tok.token, "30"], {
    env: { ...process.env, NODE_EXTRA_CA_CERTS: tls.ca },
  }).toString();
  const r = JSON.parse(res.trim().split("\n").pop());
  assert.equal(r.ok, 30);
  assert.equal(r.sid, null, "a stateless client got a session id");
  const per = [];
  for (const inst of instances) {
    const m = await get(`${inst.base}/metrics`, { headers: { authorization: `Bearer ${tok.token}` } });
    per.push(metricValue(m.body, "mcp_sandbox_tool_calls_total", { tool: "execute_python" }) ?? 0);
  }
  t.diagnostic(`calls per instance: ${per.join(", ")}`);
  assert.equal(per.reduce((a, b) => a + b, 0), 30);
  assert.ok(per.filter((n) => n > 0).length >= 2, `one client's calls all went to one instance: ${per}`);
});

test("nginx: an instance killed mid-run loses only its in-flight calls; new sessions go to the others", async (t) => {
  const dir = tempDir(t);
  const tok = makeToken(dir);
  const tls = makeCA(dir);
  const instances = await startInstances(t, 3, tok.file, dir, tok.name);
  const ngx = await startNginx(t, { instances, tls });
  const victim = instances[1]; // route i2
  const doc = await runLoad(t, {
    url: ngx.url, token: tok.token, ca: tls.ca, dir, sessions: 30, calls: 20, workers: 12, tag: "kill",
    killAfter: 150, killPid: victim.proc.pid,
  });
  assert.ok(doc.killedAt, "the instance was never killed");
  await victim.exited;
  const failed = doc.calls.filter((c) => !c.ok);
  t.diagnostic(`${failed.length} call(s) failed: ${[...new Set(failed.map((c) => c.error))].join(" | ").slice(0, 1000)}`);
  // Only calls that were on i2 when it died fail, at most one per session (calls of a
  // session are sequential), and with an error that says what happened.
  for (const c of failed) {
    assert.equal(c.route, "i2", `a call of ${c.route} failed: ${c.error}`);
    // In flight: sent before the kill, or in the few milliseconds the kernel takes to tear
    // the killed process's sockets down (a connection it still accepted is then reset).
    assert.ok(c.sentAt <= doc.killedAt + 1000, `a call sent ${c.sentAt - doc.killedAt} ms after the kill failed: ${c.error}`);
    // nginx says so when the instance died before its answer began (mcp-gone.conf); a
    // stream that had begun ends without the answer.
    assert.match(c.error, /instance failed during the request; its outcome is unknown|terminated|socket|ECONNRESET|aborted|SSE stream disconnected|Maximum reconnection/i);
  }
  const i2Sessions = new Set(doc.calls.filter((c) => c.route === "i2" && c.sentAt <= doc.killedAt).map((c) => c.session));
  assert.ok(failed.length <= i2Sessions.size, `${failed.length} failed, more than the ${i2Sessions.size} session(s) on i2`);
  // Later calls of i2's sessions were told 404 (session gone) and went on in a new session
  // on another instance; every call sent after the kill landed on i1 or i3 and was answered.
  const after = doc.calls.filter((c) => c.sentAt > doc.killedAt + 2000);
  assert.ok(after.length > 0, "no call after the kill");
  for (const c of after) {
    assert.notEqual(c.route, "i2", `a call after the kill went to the dead instance`);
    assert.ok(c.ok, `a call after the kill failed: ${c.error}`);
  }
  const notFound = doc.calls.flatMap((c) => c.notFound ?? []);
  for (const n of notFound) assert.match(n.error, /404|Session not found/);
  // Nothing answered twice: the survivors' audit logs hold each of their calls once.
  const counts = auditCounts([instances[0], instances[2]]);
  for (const c of doc.calls.filter((x) => x.ok && x.route !== "i2")) {
    assert.equal(counts.reduce((n, m) => n + (m.get(c.sha256) ?? 0), 0), 1, `s${c.session} c${c.call}`);
  }
});

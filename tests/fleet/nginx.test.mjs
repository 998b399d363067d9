// nginx (Debian's package) in front of two or three instances of the server on loopback, with
// the files of deploy/nginx/ as they are (the site example too): TLS from a CA the test makes,
// a session's requests on the instance that answered its initialize, a request naming an id
// on the instance that made it, stateless requests by principal, SSE unbuffered.
// The load (tests/fleet/load.mjs, the SDK v1 client) runs in a child process that trusts the
// test's CA (NODE_EXTRA_CA_CERTS).
import { test } from "node:test";
import assert from "node:assert/strict";
import { execFileSync, spawn } from "node:child_process";
import { request as httpsRequest } from "node:https";
import { connect } from "node:net";
import { copyFileSync, mkdirSync, readFileSync, writeFileSync, chownSync, existsSync } from "node:fs";
import { join } from "node:path";

import {
  FLEET_DIR, ROOT, freePort, get, makeToken, metricValue, sleep, startInstance, tempDir, waitReady, waitUntil,
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
 * nginx with the files of deploy/nginx/ as they are: mcp-{maps,location,proxy,gone}.conf in
 * <dir>/mcp/ (they include each other as mcp/..., relative to the configuration's
 * directory, as under /etc/nginx), and mcp-site.conf.example itself as the site, with the
 * test's addresses, ports, certificate and log in place of the example's (one replica per
 * instance: routes i1, i2, i3).  Returns { port, url, base, dir, stop(), log() }.
 */
async function startNginx(t, { instances, tls }) {
  const dir = tempDir(t, "fleet-nginx");
  for (const d of ["body", "proxy", "fastcgi", "uwsgi", "scgi"]) {
    mkdirSync(join(dir, d));
    if (process.getuid() === 0) chownSync(join(dir, d), 65534, 65534); // the workers run as nobody
  }
  const port = await freePort();
  const deploy = join(ROOT, "deploy", "nginx");
  mkdirSync(join(dir, "mcp"));
  for (const f of ["mcp-maps.conf", "mcp-location.conf", "mcp-proxy.conf", "mcp-gone.conf"])
    copyFileSync(join(deploy, f), join(dir, "mcp", f));
  let site = readFileSync(join(deploy, "mcp-site.conf.example"), "utf8");
  // The example's replicas are on ports 8101..8103: one line per replica names its port or
  // its route; the lines of replicas the test does not start go.
  site = site.split("\n").filter((line) => {
    for (let i = instances.length; i < 3; i++) if (line.includes(`810${i + 1}`) || line.includes(`mcp_i${i + 1}`)) return false;
    return true;
  }).join("\n");
  for (const [i, inst] of instances.entries()) {
    site = site.replaceAll(`127.0.0.1:810${i + 1}`, `127.0.0.1:${inst.port}`).replaceAll(`127\\.0\\.0\\.1:810${i + 1}`, `127\\.0\\.0\\.1:${inst.port}`);
  }
  const must = (from, to) => {
    assert.ok(site.includes(from), `mcp-site.conf.example has no "${from}"`);
    site = site.replaceAll(from, to);
  };
  must("include /etc/nginx/mcp/", `include ${dir}/mcp/`);
  must("    listen 443 ssl http2;\n", `    listen 127.0.0.1:${port} ssl http2;\n`);
  must("    listen [::]:443 ssl http2;\n", "");
  must("/etc/nginx/tls/mcp.example.lan.crt", tls.cert);
  must("/etc/nginx/tls/mcp.example.lan.key", tls.key);
  must("/var/log/nginx/mcp-access.log", `${dir}/access.log`);
  // nginx reaches the instances from an address of its own, as it would from another
  // host: the instances trust it (--trusted-proxy) and tell it from its clients.
  must("# proxy_bind 127.0.0.3;", `proxy_bind ${NGINX_SOURCE};`);
  writeFileSync(join(dir, "site.conf"), site);
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
    include ${dir}/site.conf;
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
  // nginx writes its pid file a moment before it listens.
  const listening = () => new Promise((r) => {
    const sock = connect(port, "127.0.0.1", () => { sock.destroy(); r(true); });
    sock.on("error", () => r(false));
  });
  assert.ok(await waitUntil(listening, 10000), `nginx does not listen: ${err}`);
  return { port, url: `https://127.0.0.1:${port}/mcp`, base: `https://127.0.0.1:${port}`, dir, stop, log: () => readFileSync(join(dir, "error.log"), "utf8") };
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
      args: ["--route", ROUTES[i], "--audit-log", audit, "--trusted-proxy", NGINX_SOURCE, "--metrics-token", operator, "--max-concurrent", "8", "--max-token-concurrent", "64", "--max-token-running", "8",
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

test("nginx: the stateless era (2026-07-28): one principal's requests all reach one instance; principals spread", async (t) => {
  const dir = tempDir(t);
  const tok = makeToken(dir);
  // Eight principals (and the operator): consistent hashing on the bearer token.
  const tenants = Array.from({ length: 8 }, (_, i) => ({ name: `p${i}`, token: `${tok.token.slice(0, 20)}p${i}` }));
  writeFileSync(tok.file, [`${tok.name}:${tok.token}`, ...tenants.map((p) => `${p.name}:${p.token}`)].join("\n") + "\n");
  const tls = makeCA(dir);
  const instances = await startInstances(t, 3, tok.file, dir, tok.name);
  const ngx = await startNginx(t, { instances, tls });
  for (const p of tenants) {
    const res = execFileSync(process.execPath, [join(FLEET_DIR, "modern-calls.mjs"), ngx.url, p.token, "4"], {
      env: { ...process.env, NODE_EXTRA_CA_CERTS: tls.ca },
    }).toString();
    const r = JSON.parse(res.trim().split("\n").pop());
    assert.equal(r.ok, 4, `${p.name}: ${res}`);
    assert.equal(r.sid, null, "a stateless client got a session id");
  }
  // Each principal's calls are in one instance's audit log, all of them.
  const where = new Map();
  for (const [i, inst] of instances.entries()) {
    for (const a of auditLines(inst, "tool_call")) {
      if (!where.has(a.principal)) where.set(a.principal, new Map());
      where.get(a.principal).set(i, (where.get(a.principal).get(i) ?? 0) + 1);
    }
  }
  for (const p of tenants) {
    const m = where.get(p.name);
    assert.ok(m, `${p.name}: no call in any audit log`);
    assert.equal(m.size, 1, `${p.name}'s calls went to several instances: ${JSON.stringify([...m])}`);
    assert.equal([...m.values()][0], 4);
  }
  const used = new Set(tenants.map((p) => [...where.get(p.name).keys()][0]));
  t.diagnostic(`instances used by 8 principals: ${used.size}`);
  assert.ok(used.size >= 2, "eight principals all hashed to one instance");
});

/** One JSON-RPC exchange through nginx: a POST, its answer (JSON or the SSE message with
 * the request's id); resolves { status, headers, msg } (msg: the JSON-RPC message or null). */
async function rpc(url, { ca, token, sid, modern, id, method, params = {}, name }) {
  const headers = { authorization: `Bearer ${token}` };
  const p = { ...params };
  if (modern) {
    // What a 2026-07-28 client sends (the SDK v2 does the same): the version and the
    // capabilities in _meta, Mcp-Method, and Mcp-Name mirroring params.name/.uri/.taskId.
    p._meta = { "io.modelcontextprotocol/protocolVersion": "2026-07-28",
      "io.modelcontextprotocol/clientCapabilities": { extensions: { "io.modelcontextprotocol/tasks": {} } } };
    headers["mcp-protocol-version"] = "2026-07-28";
    headers["mcp-method"] = method;
    const mirrored = name ?? p.name ?? p.uri ?? p.taskId;
    if (mirrored !== undefined) headers["mcp-name"] = mirrored;
  } else {
    headers["mcp-protocol-version"] = "2025-11-25";
    if (sid) headers["mcp-session-id"] = sid;
  }
  const r = await postFrom(url, { ca, localAddress: "127.0.0.1", headers, body: { jsonrpc: "2.0", id, method, params: p } });
  let msg = null;
  if ((r.headers["content-type"] ?? "").startsWith("text/event-stream")) {
    for (const block of r.body.split("\n\n")) {
      const data = block.split("\n").filter((l) => l.startsWith("data:")).map((l) => l.slice(5).trimStart()).join("\n");
      if (!data) continue;
      const m = JSON.parse(data);
      if (m.id === id) msg = m;
    }
  } else if (r.body.trim()) {
    try { msg = JSON.parse(r.body); } catch { msg = null; }
  }
  return { status: r.status, headers: r.headers, msg, body: r.body };
}

/** GET through nginx (TLS, the test's CA); resolves { status, headers, body }. */
function getFrom(url, { ca, headers = {} }) {
  return new Promise((resolve, reject) => {
    const req = httpsRequest(url, { method: "GET", ca: readFileSync(ca), agent: false, headers }, (res) => {
      let text = "";
      res.setEncoding("utf8");
      res.on("data", (c) => (text += c));
      res.on("end", () => resolve({ status: res.statusCode, headers: res.headers, body: text }));
    });
    req.on("error", reject);
    req.end();
  });
}

test("nginx: state behind two instances, both eras: tasks, Python sessions, output files, the page and downloads reach their owner; after a SIGKILL the dead instance's ids get a clear error", async (t) => {
  const dir = tempDir(t);
  const tok = makeToken(dir);
  const tenants = Array.from({ length: 6 }, (_, i) => ({ name: `q${i}`, token: `${tok.token.slice(0, 20)}q${i}` }));
  writeFileSync(tok.file, [`${tok.name}:${tok.token}`, ...tenants.map((p) => `${p.name}:${p.token}`)].join("\n") + "\n");
  const tls = makeCA(dir);
  const instances = await startInstances(t, 2, tok.file, dir, tok.name);
  const ngx = await startNginx(t, { instances, tls });
  const ca = tls.ca;
  let nextId = 1;
  const routeOf = (id) => id.split(".")[0];
  const writeScript = (tag) => `import os\nos.makedirs('outputs', exist_ok=True)\nopen('outputs/${tag}.txt', 'w').write('${tag} ' * 10)\nprint('${tag}')\n`;
  const uriOf = (result) => (result.content ?? []).map((c) => c.uri ?? c.resource?.uri).find((u) => u && u.startsWith("sandbox://runs/"));

  // One principal's whole state, in one era: a task polled 10 times to its result, a Python
  // session of 10 calls, 10 reads of an output file and 10 downloads of it.  Returns the ids.
  async function exercise(p, modern) {
    let sid = null;
    if (!modern) {
      const init = await rpc(ngx.url, { ca, token: p.token, id: nextId++, method: "initialize",
        params: { protocolVersion: "2025-11-25", capabilities: {}, clientInfo: { name: "state", version: "0" } } });
      assert.equal(init.status, 200, JSON.stringify(init.msg));
      sid = init.headers["mcp-session-id"];
      assert.match(sid, /^i[12]\./);
      const note = await postFrom(ngx.url, { ca, localAddress: "127.0.0.1", headers: { authorization: `Bearer ${p.token}`, "mcp-session-id": sid, "mcp-protocol-version": "2025-11-25" },
        body: { jsonrpc: "2.0", method: "notifications/initialized" } });
      assert.equal(note.status, 202);
    }
    const call = (args, extra = {}) => rpc(ngx.url, { ca, token: p.token, sid, modern, id: nextId++, method: "tools/call",
      params: { name: "execute_python", arguments: args, ...extra } });
    // A task: 2026-07-28 makes one of a call that may run over a minute (the client declared
    // the extension); the handshake era of a call with params.task.
    const created = modern
      ? await call({ script: "import time\ntime.sleep(2)\nprint('task done')\n", timeout_seconds: 90 })
      : await call({ script: "import time\ntime.sleep(2)\nprint('task done')\n", timeout_seconds: 90 }, { task: { ttl: 600000 } });
    assert.equal(created.status, 200, JSON.stringify(created.msg));
    const taskId = modern ? created.msg.result.taskId : created.msg.result.task.taskId;
    assert.match(taskId, /^i[12]\.[0-9a-f]{32}$/, JSON.stringify(created.msg));
    const owner = routeOf(taskId);
    let last;
    for (let i = 0; i < 10; i++) {
      const got = await rpc(ngx.url, { ca, token: p.token, sid, modern, id: nextId++, method: "tasks/get", params: { taskId } });
      assert.ok(got.msg?.result, `tasks/get ${i + 1}: ${JSON.stringify(got.msg)}`);
      last = got.msg.result;
      if (i < 9 && last.status === "working") await sleep(400);
    }
    // The 10th poll or a few more see it done (a loaded machine: wait on the condition).
    await waitUntil(async () => {
      last = (await rpc(ngx.url, { ca, token: p.token, sid, modern, id: nextId++, method: "tasks/get", params: { taskId } })).msg.result;
      return last.status !== "working";
    }, 120000);
    assert.equal(last.status, "completed", JSON.stringify(last));
    if (modern) {
      assert.equal(last.result.structuredContent.stdout, "task done\n");
    } else {
      const res = await rpc(ngx.url, { ca, token: p.token, sid, id: nextId++, method: "tasks/result", params: { taskId } });
      assert.equal(res.msg.result.structuredContent.stdout, "task done\n", JSON.stringify(res.msg));
    }
    // A Python session of 10 calls: a counter only one kernel holds.
    const first = await call({ script: "n = 1\nprint(n)\n", session: "new" });
    const session = first.msg.result.structuredContent.session.id;
    assert.match(session, /^i[12]\.s-[0-9a-f]+$/);
    for (let i = 2; i <= 10; i++) {
      const r = await call({ script: "n += 1\nprint(n)\n", session });
      assert.equal(r.msg?.result?.isError ?? false, false, `session call ${i}: ${JSON.stringify(r.msg)}`);
      assert.equal(r.msg.result.structuredContent.stdout, `${i}\n`);
    }
    // An output file: 10 reads, 10 downloads.
    const wrote = await call({ script: writeScript(p.name) });
    const uri = uriOf(wrote.msg.result);
    assert.ok(uri, JSON.stringify(wrote.msg.result.content));
    assert.match(uri, /^sandbox:\/\/runs\/i[12]\.[0-9a-f]{32}\//);
    for (let i = 0; i < 10; i++) {
      const r = await rpc(ngx.url, { ca, token: p.token, sid, modern, id: nextId++, method: "resources/read", params: { uri } });
      assert.equal(r.msg?.result?.contents?.[0]?.text, `${p.name} `.repeat(10), `read ${i + 1}: ${JSON.stringify(r.msg)}`);
    }
    const download = `${ngx.base}/mcp/runs/${uri.slice("sandbox://runs/".length)}`;
    for (let i = 0; i < 10; i++) {
      const d = await getFrom(download, { ca, headers: { authorization: `Bearer ${p.token}` } });
      assert.equal(d.status, 200, `download ${i + 1}: ${d.body}`);
      assert.equal(d.body, `${p.name} `.repeat(10));
    }
    return { owner, taskId, session, uri, download, sid };
  }

  // Every principal in the stateless era, and two in the handshake era.
  const modernState = [];
  for (const p of tenants) modernState.push({ p, ...(await exercise(p, true)) });
  const owners = new Set(modernState.map((s) => s.owner));
  t.diagnostic(`stateless owners: ${modernState.map((s) => `${s.p.name}->${s.owner}`).join(" ")}`);
  for (const s of modernState) {
    assert.equal(routeOf(s.session), s.owner, `${s.p.name}: the session and the task are on different instances`);
    assert.equal(routeOf(s.uri.slice("sandbox://runs/".length)), s.owner);
  }
  assert.equal(owners.size, 2, "six principals all hashed to one instance");
  const legacyState = [];
  for (const p of tenants.slice(0, 2)) legacyState.push({ p, ...(await exercise(p, false)) });

  // The page (a browser's GET) and its assets, through nginx.
  const page = await getFrom(ngx.url, { ca, headers: { accept: "text/html,application/xhtml+xml" } });
  assert.equal(page.status, 200);
  assert.match(page.headers["content-type"], /text\/html/);
  // Per replica, for the operator: readiness and metrics.
  for (const r of ["i1", "i2"]) {
    assert.equal((await getFrom(`${ngx.base}/readyz/${r}`, { ca })).status, 200, `/readyz/${r}`);
    const m = await getFrom(`${ngx.base}/metrics/${r}`, { ca, headers: { authorization: `Bearer ${tok.token}` } });
    assert.equal(m.status, 200, `/metrics/${r}`);
    assert.match(m.body, /mcp_sandbox_tool_calls_total/);
  }
  assert.equal((await getFrom(`${ngx.base}/readyz/i9`, { ca })).status, 404, "an unknown replica's /readyz");

  // SIGKILL the instance that owns the first principal's state.
  const victimRoute = modernState[0].owner;
  const victim = instances[ROUTES.indexOf(victimRoute)];
  victim.proc.kill("SIGKILL");
  await victim.exited;
  const dead = modernState.filter((s) => s.owner === victimRoute);
  const alive = modernState.filter((s) => s.owner !== victimRoute);
  // New calls succeed, for every principal (those of the dead instance move to the other).
  for (const s of modernState) {
    const r = await rpc(ngx.url, { ca, token: s.p.token, modern: true, id: nextId++, method: "tools/call",
      params: { name: "execute_python", arguments: { script: "print('after')" } } });
    assert.equal(r.msg?.result?.structuredContent?.stdout, "after\n", `${s.p.name} after the kill: ${JSON.stringify(r.msg)}`);
  }
  // The survivor's ids still work.
  for (const s of alive) {
    const got = await rpc(ngx.url, { ca, token: s.p.token, modern: true, id: nextId++, method: "tasks/get", params: { taskId: s.taskId } });
    assert.equal(got.msg?.result?.status, "completed", JSON.stringify(got.msg));
    const r = await rpc(ngx.url, { ca, token: s.p.token, modern: true, id: nextId++, method: "resources/read", params: { uri: s.uri } });
    assert.ok(r.msg?.result?.contents, JSON.stringify(r.msg));
  }
  // The dead instance's ids: a JSON-RPC error with the request's id, saying whose they were.
  const gone = new RegExp(`belongs to replica ${victimRoute}`);
  for (const s of dead) {
    const id = nextId++;
    const got = await rpc(ngx.url, { ca, token: s.p.token, modern: true, id, method: "tasks/get", params: { taskId: s.taskId } });
    assert.equal(got.msg?.id, id, `${got.status} ${got.body}`);
    assert.match(got.msg.error.message, gone);
    assert.doesNotMatch(got.msg.error.message, /unknown/);
    const rid = nextId++;
    const read = await rpc(ngx.url, { ca, token: s.p.token, modern: true, id: rid, method: "resources/read", params: { uri: s.uri } });
    assert.equal(read.msg?.id, rid, `${read.status} ${read.body}`);
    assert.match(read.msg.error.message, gone);
    const ses = await rpc(ngx.url, { ca, token: s.p.token, modern: true, id: nextId++, method: "tools/call",
      params: { name: "execute_python", arguments: { script: "print(n)", session: s.session } } });
    assert.equal(ses.msg?.result?.isError, true, JSON.stringify(ses.msg));
    assert.match(ses.msg.result.content[0].text, gone);
    const d = await getFrom(s.download, { ca, headers: { authorization: `Bearer ${s.p.token}` } });
    assert.equal(d.status, 404, `a dead instance's download: ${d.status} ${d.body}`);
  }
  // The handshake era: a session of the dead instance is not found (the client starts a new
  // one); one of the survivor's goes on.
  for (const s of legacyState) {
    const r = await rpc(ngx.url, { ca, token: s.p.token, sid: s.sid, id: nextId++, method: "tasks/get", params: { taskId: s.taskId } });
    if (routeOf(s.sid) === victimRoute) {
      assert.equal(r.status, 404, JSON.stringify(r.msg));
      assert.match(r.msg.error.message, /Session not found/);
    } else {
      assert.equal(r.msg?.result?.status, "completed", JSON.stringify(r.msg));
    }
  }
  // The page still loads.
  assert.equal((await getFrom(ngx.url, { ca, headers: { accept: "text/html" } })).status, 200);
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
    assert.match(c.error, /replica failed during the request; its outcome is unknown|terminated|socket|ECONNRESET|aborted|SSE stream disconnected|Maximum reconnection/i);
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

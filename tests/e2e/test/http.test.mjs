// The official TypeScript SDK client over HTTP: Streamable HTTP (sessions, progress,
// cancellation, resumption), a bearer token, TLS, and the legacy SSE transport.
// Every test skips, saying why, while the binary has no HTTP transport (see startHttpServer).
import { test } from "node:test";
import assert from "node:assert/strict";
import { execFile } from "node:child_process";
import { join } from "node:path";
import { promisify } from "node:util";

import { Client } from "@modelcontextprotocol/sdk/client/index.js";
import { SSEClientTransport } from "@modelcontextprotocol/sdk/client/sse.js";
import { StreamableHTTPClientTransport } from "@modelcontextprotocol/sdk/client/streamableHttp.js";
import { CallToolResultSchema } from "@modelcontextprotocol/sdk/types.js";

import {
  CLIENT_INFO, E2E_DIR, connectHttp, descendants, isAlive, makeStateDir, markedBusyScript,
  markedSleeperScript, marker, processesWithMarker, resultText, selfSignedCertPath, startHttpServer,
  waitUntil, writeTokenFile,
} from "../lib/harness.mjs";
import {
  SEED_ENV_LABELS, SLOW_PRINT_SCRIPT, callChecked, checkProgress, listToolsChecked, progressCall,
} from "../lib/checks.mjs";

const execFileAsync = promisify(execFile);

/** The initialize request the SDK sends, for raw fetch checks. */
const INITIALIZE = {
  jsonrpc: "2.0",
  id: 0,
  method: "initialize",
  params: { protocolVersion: "2025-11-25", capabilities: {}, clientInfo: CLIENT_INFO },
};
const POST_HEADERS = { "content-type": "application/json", accept: "application/json, text/event-stream" };

test("http: initialize, tools/list and the core calls over Streamable HTTP", async (t) => {
  const srv = await startHttpServer(t, { args: ["--max-output-bytes", "2048", "--kill-grace-seconds", "1"] });
  if (!srv) return;
  const { client, transport } = await connectHttp(t, srv.url);
  assert.match(transport.sessionId ?? "", /^[\x21-\x7e]+$/, "no (or a malformed) Mcp-Session-Id");
  assert.equal(client.getServerVersion().name, "mcp-python-exec-sandbox");
  assert.ok(client.getServerCapabilities().tools);
  const tools = await listToolsChecked(client);

  let r = await callChecked(client, tools, "execute_python", { script: "import sys\nprint('out')\nprint('err', file=sys.stderr)" });
  assert.equal(r.isError, false);
  assert.equal(r.structuredContent.stdout, "out\n");
  assert.equal(r.structuredContent.stderr, "err\n");
  assert.match(resultText(r), /--- exit_code: 0 ---/);

  r = await callChecked(client, tools, "execute_python", { script: "import sys\nsys.exit(5)" });
  assert.equal(r.isError, true);
  assert.equal(r.structuredContent.exit_code, 5);

  const mark = marker("http-timeout");
  r = await callChecked(client, tools, "execute_python", { script: markedBusyScript(mark), timeout_seconds: 1 });
  assert.equal(r.isError, true);
  assert.equal(r.structuredContent.timed_out, true);
  assert.ok(await waitUntil(() => processesWithMarker(mark).length === 0, 10000), "the script's child outlived the timeout");

  r = await callChecked(client, tools, "execute_python", { script: "print('z' * 100000)", details: true });
  assert.equal(r.structuredContent.truncated, true);
  assert.equal(r.structuredContent.stdout_bytes, 100001);
  assert.ok(r.structuredContent.stdout.length < 4096);

  r = await callChecked(client, tools, "check_environment", {});
  const lines = resultText(r).split("\n");
  SEED_ENV_LABELS.forEach((label, i) => assert.ok(lines[i].startsWith(`${label}: `), `line ${i + 1}: "${lines[i]}"`));

  // DELETE ends the session (405 = the server refuses client-side termination, also allowed);
  // afterwards the session id is unknown: 404.
  const sid = transport.sessionId;
  const headers = { "mcp-session-id": sid, "mcp-protocol-version": "2025-11-25" };
  const del = await fetch(srv.url, { method: "DELETE", headers });
  await del.body?.cancel();
  assert.ok(del.ok || del.status === 405, `DELETE -> ${del.status}`);
  if (del.ok) {
    const after = await fetch(srv.url, {
      method: "POST",
      headers: { ...POST_HEADERS, ...headers },
      body: JSON.stringify({ jsonrpc: "2.0", id: 9, method: "tools/list" }),
    });
    await after.body?.cancel();
    assert.equal(after.status, 404, "a deleted session must answer 404");
  }
});

test("http: progress notifications stream in order before the result", async (t) => {
  const srv = await startHttpServer(t);
  if (!srv) return;
  const { client } = await connectHttp(t, srv.url);
  const tools = await listToolsChecked(client);
  const { result, events, resultAt } = await progressCall(client, tools);
  checkProgress(events, resultAt, result);
});

test("http: cancellation through an AbortSignal kills the script", async (t) => {
  const srv = await startHttpServer(t, { args: ["--kill-grace-seconds", "1"] });
  if (!srv) return;
  const { client } = await connectHttp(t, srv.url);
  const tools = await listToolsChecked(client);
  const mark = marker("http-cancel");
  const before = new Set(descendants(srv.proc.pid)); // helpers the server may keep (none today)
  const ac = new AbortController();
  let started = false;
  const outcome = client
    .callTool({ name: "execute_python", arguments: { script: markedSleeperScript(mark) } }, undefined, {
      signal: ac.signal,
      onprogress: (p) => {
        if ((p.message ?? "").includes("started")) started = true;
      },
    })
    .then((r) => ({ resolved: r }), (e) => ({ rejected: e }));
  assert.ok(await waitUntil(() => started && processesWithMarker(mark).length > 0, 15000), "the script never started");
  ac.abort("e2e cancels over http");
  const o = await outcome;
  assert.ok(o.rejected, `the cancelled call resolved: ${JSON.stringify(o.resolved)}`);
  assert.match(String(o.rejected.message), /e2e cancels over http/);
  assert.ok(await waitUntil(() => processesWithMarker(mark).length === 0, 10000), "the script's child survived the cancellation");
  const newChildren = () => descendants(srv.proc.pid).filter((p) => !before.has(p));
  assert.ok(await waitUntil(() => newChildren().length === 0, 10000), `processes started for the call are left: ${newChildren()}`);
  const r = await callChecked(client, tools, "execute_python", { script: "print('still here')" });
  assert.equal(r.structuredContent.stdout, "still here\n");
});

test("http: an interrupted call resumes on a new transport with its resumption token", async (t) => {
  const srv = await startHttpServer(t);
  if (!srv) return;
  const first = await connectHttp(t, srv.url);
  const sessionId = first.transport.sessionId;
  assert.ok(sessionId, "resumption needs a session");
  const req = { method: "tools/call", params: { name: "execute_python", arguments: { script: SLOW_PRINT_SCRIPT } } };
  let lastEventId;
  let firstLine = false;
  let settled = false;
  const interrupted = first.client
    .request(req, CallToolResultSchema, {
      onresumptiontoken: (id) => (lastEventId = id),
      onprogress: (p) => {
        if ((p.message ?? "").includes("line 0")) firstLine = true;
      },
    })
    .then((r) => ({ resolved: r }), (e) => ({ rejected: e }))
    .finally(() => (settled = true));
  await waitUntil(() => settled || (firstLine && lastEventId !== undefined), 15000);
  assert.ok(firstLine && lastEventId !== undefined, "no event id (resumption token) on the call's stream before its first output line");
  assert.ok(!settled, "the call ended before it could be interrupted");
  // Lose the connection mid-call: close() aborts the POST's event stream (no DELETE is sent).
  await first.client.close();
  const o = await interrupted;
  assert.ok(o.rejected, "the interrupted request should fail on the closed client");

  // A new transport carrying the old session id: connect() skips initialize, and the request
  // with a resumptionToken goes out as GET + Last-Event-ID instead of a new POST.
  const requests = [];
  const second = await connectHttp(t, srv.url, { sessionId, requests });
  const resumed = await second.client.request(req, CallToolResultSchema, { resumptionToken: lastEventId, timeout: 30000 });
  assert.equal(resumed.isError, false);
  // The whole output, printed once: the call went on while nobody listened, and was not re-run.
  assert.equal(resumed.structuredContent.stdout, "line 0\nline 1\nline 2\nline 3\nline 4\nline 5\n");
  const resumes = requests.filter((r) => r.method === "GET" && r.headers.get("last-event-id") === lastEventId);
  assert.equal(resumes.length, 1, `expected one GET with Last-Event-ID ${lastEventId}: ${JSON.stringify(requests.map((r) => r.method))}`);
  assert.equal(resumes[0].headers.get("mcp-session-id"), sessionId);
  assert.ok(!requests.some((r) => r.method === "POST" && String(r.body).includes("tools/call")), "the call was sent again");
});

test("http: a bearer token is required (401 without it)", async (t) => {
  const token = `e2e-${process.pid}-${Date.now()}-secret`;
  const tokenFile = writeTokenFile(makeStateDir(t), [["e2e", token]]);
  const srv = await startHttpServer(t, { args: ["--auth-token-file", tokenFile] });
  if (!srv) return;

  for (const authorization of [undefined, "Bearer wrong-token", `Basic ${token}`]) {
    const res = await fetch(srv.url, {
      method: "POST",
      headers: { ...POST_HEADERS, ...(authorization ? { authorization } : {}) },
      body: JSON.stringify(INITIALIZE),
    });
    await res.body?.cancel();
    assert.equal(res.status, 401, `Authorization ${authorization ?? "(none)"} -> ${res.status}`);
    assert.match(res.headers.get("www-authenticate") ?? "", /^Bearer\b/i);
  }

  const noToken = new Client(CLIENT_INFO, { capabilities: {} });
  noToken.onerror = () => {};
  await assert.rejects(noToken.connect(new StreamableHTTPClientTransport(srv.url)), (e) => e.code === 401);
  await noToken.close();

  const { client } = await connectHttp(t, srv.url, { headers: { Authorization: `Bearer ${token}` } });
  const tools = await listToolsChecked(client);
  const r = await callChecked(client, tools, "execute_python", { script: "print('authorised')" });
  assert.equal(r.structuredContent.stdout, "authorised\n");
  assert.ok(!srv.log().includes(token), "the server logged the token");
});

test("http: TLS with --tls-self-signed", async (t) => {
  const srv = await startHttpServer(t, { tls: true });
  if (!srv) return;
  assert.equal(srv.url.protocol, "https:");
  const cert = selfSignedCertPath(srv.stateDir);
  // Without the certificate a client must refuse the connection...
  await assert.rejects(fetch(srv.url, { method: "POST", headers: POST_HEADERS, body: JSON.stringify(INITIALIZE) }),
    (e) => /SELF_SIGNED|UNABLE_TO_VERIFY|CERT/.test(String(e.cause?.code ?? e.cause?.message ?? e.message)));
  // ...and with it (read by Node at start-up only, hence a child process) MCP works.
  const { stdout } = await execFileAsync(process.execPath, [join(E2E_DIR, "lib", "tls-probe.mjs"), srv.url.href], {
    env: { ...process.env, NODE_EXTRA_CA_CERTS: cert },
    timeout: 60000,
  });
  const out = JSON.parse(stdout);
  assert.equal(out.server.name, "mcp-python-exec-sandbox");
  assert.ok(out.tools.includes("execute_python"));
  assert.equal(out.result.structuredContent.stdout, "over tls\n");
});

test("http: the legacy SSE transport at /sse", async (t) => {
  const srv = await startHttpServer(t);
  if (!srv) return;
  const client = new Client(CLIENT_INFO, { capabilities: {} });
  client.onerror = () => {};
  t.after(() => client.close());
  await client.connect(new SSEClientTransport(new URL(`${srv.origin}/sse`)));
  assert.equal(client.getServerVersion().name, "mcp-python-exec-sandbox");
  const tools = await listToolsChecked(client);
  const r = await callChecked(client, tools, "execute_python", { script: "print('legacy sse')" });
  assert.equal(r.structuredContent.stdout, "legacy sse\n");
  const { result, events, resultAt } = await progressCall(client, tools);
  checkProgress(events, resultAt, result);
});

test("http: SIGTERM during a call, the server exits 0 and leaves no child", async (t) => {
  // Without a drain (tests/integration/test_service.py has the drain): SIGTERM cancels at once.
  const srv = await startHttpServer(t, { args: ["--kill-grace-seconds", "1", "--drain-seconds", "0"] });
  if (!srv) return;
  const { client } = await connectHttp(t, srv.url);
  const mark = marker("http-shutdown");
  let started = false;
  const call = client
    .callTool({ name: "execute_python", arguments: { script: markedSleeperScript(mark) } }, undefined, {
      onprogress: (p) => {
        if ((p.message ?? "").includes("started")) started = true;
      },
    })
    .then((r) => ({ resolved: r }), (e) => ({ rejected: e }));
  assert.ok(await waitUntil(() => started && processesWithMarker(mark).length > 0, 15000), "the script never started");
  const children = descendants(srv.proc.pid);
  assert.ok(children.length > 0);
  const exited = new Promise((r) => srv.proc.once("exit", (code, signal) => r({ code, signal })));
  srv.proc.kill("SIGTERM");
  assert.deepEqual(await exited, { code: 0, signal: null });
  await client.close();
  await call;
  assert.deepEqual(children.filter(isAlive), [], "children of the server outlived it");
  assert.deepEqual(processesWithMarker(mark), [], "the script's child outlived the server");
});

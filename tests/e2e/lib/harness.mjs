// Shared helpers for the e2e tests: where the binary is, how to start it under a real MCP
// client (stdio) or as an HTTP server, JSON-schema checks, and /proc scans that prove no
// process is left behind.
import { mkdtempSync, readFileSync, readdirSync, rmSync, writeFileSync, existsSync } from "node:fs";
import { tmpdir } from "node:os";
import { dirname, join, resolve } from "node:path";
import { fileURLToPath } from "node:url";
import assert from "node:assert/strict";

import { Ajv2020 } from "ajv/dist/2020.js";
import { Client } from "@modelcontextprotocol/sdk/client/index.js";
import { StdioClientTransport } from "@modelcontextprotocol/sdk/client/stdio.js";

import { canConnect, freePort, sleep, waitUntil as waitUntilEvery } from "../../lib/net.mjs";
import { assertNoSanitizerReport, spawnServer } from "../../lib/server.mjs";

export const E2E_DIR = resolve(dirname(fileURLToPath(import.meta.url)), "..");
export const ROOT = resolve(E2E_DIR, "..", "..");
export const BINARY = resolve(process.env.MPS_BINARY || join(ROOT, "build", "mcp-python-exec-sandbox"));
// The sandbox backend every test runs with (the integration tests use the same variable).
export const BACKEND = process.env.MPS_TEST_BACKEND || "none";
// Set to 1 once the HTTP transport has landed, so that a binary without it fails instead of skipping.
export const REQUIRE_HTTP = process.env.MPS_E2E_REQUIRE_HTTP === "1";

export const CLIENT_INFO = { name: "mps-e2e", version: "0.0.1" };

/** A fresh temporary directory; removed when the test ends unless `keep` (the caller removes it). */
export function makeStateDir(t, { keep = false } = {}) {
  const dir = mkdtempSync(join(tmpdir(), "mps-e2e-"));
  if (!keep) t.after(() => rmSync(dir, { recursive: true, force: true }));
  return dir;
}

/** The server's command line after the binary. */
export function serverArgs(stateDir, extra = []) {
  return ["--sandbox-backend", BACKEND, "--state-dir", stateDir, ...extra];
}

/** A unique string to find a script's processes in /proc by their command line. */
export function marker(tag) {
  return `mps-e2e-${tag}-${process.pid}-${Date.now()}-${Math.floor(Math.random() * 1e9)}`;
}

/** A Python script that starts a child whose argv carries `mark`, prints `started`, then waits. */
export function markedSleeperScript(mark, seconds = 120) {
  return [
    "import subprocess, sys, time",
    `child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(${seconds})", ${JSON.stringify(mark)}])`,
    "print('started', flush=True)",
    `time.sleep(${seconds})`,
  ].join("\n");
}

/** Like markedSleeperScript, but the script itself spins (a timeout must kill it and its child). */
export function markedBusyScript(mark) {
  return [
    "import subprocess, sys",
    `child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)", ${JSON.stringify(mark)}])`,
    "print('started', flush=True)",
    "while True:",
    "    pass",
  ].join("\n");
}

// ------------------------------------------------------------------ /proc

function procStat(pid) {
  try {
    const stat = readFileSync(`/proc/${pid}/stat`, "utf8");
    const rest = stat.slice(stat.lastIndexOf(")") + 2).split(" ");
    return { state: rest[0], ppid: Number(rest[1]) };
  } catch {
    return null;
  }
}

function livePids() {
  return readdirSync("/proc").filter((e) => /^\d+$/.test(e)).map(Number);
}

/** Whether pid is a live process (zombies count as gone). */
export function isAlive(pid) {
  const st = procStat(pid);
  return st !== null && st.state !== "Z" && st.state !== "X";
}

/** Live processes whose command line contains `needle`. */
export function processesWithMarker(needle) {
  const found = [];
  for (const pid of livePids()) {
    if (pid === process.pid) continue;
    let cmd;
    try {
      cmd = readFileSync(`/proc/${pid}/cmdline`);
    } catch {
      continue;
    }
    if (cmd.includes(needle) && isAlive(pid)) found.push(pid);
  }
  return found;
}

/** Every live process whose ancestry includes pid. */
export function descendants(pid) {
  const parents = new Map();
  for (const p of livePids()) {
    const st = procStat(p);
    if (st && st.state !== "Z" && st.state !== "X") parents.set(p, st.ppid);
  }
  const out = [];
  for (const p of parents.keys()) {
    let q = p;
    for (let i = 0; i < 64 && parents.has(q); i++) {
      q = parents.get(q);
      if (q === pid) {
        out.push(p);
        break;
      }
    }
  }
  return out;
}

export { freePort, sleep };

/** Polls pred until it is true or timeoutMs passes; returns its last value. */
export const waitUntil = (pred, timeoutMs = 10000, intervalMs = 50) => waitUntilEvery(pred, timeoutMs, intervalMs);

// ------------------------------------------------------------------ logs

/** Fails if the server's stderr holds a sanitizer report (the ASan+UBSan build). */
export { assertNoSanitizerReport };

// ------------------------------------------------------------------ stdio

/**
 * Starts the binary under the SDK's StdioClientTransport and connects a Client.
 * Returns { client, transport, pid, stateDir, log(), close() }; close() runs at test end too.
 */
export async function connectStdio(t, extraArgs = [], { clientOptions } = {}) {
  const stateDir = makeStateDir(t, { keep: true }); // removed by close(), once the server is gone
  const transport = new StdioClientTransport({
    command: BINARY,
    args: serverArgs(stateDir, extraArgs),
    env: { ...process.env },
    stderr: "pipe",
  });
  let log = "";
  transport.stderr.on("data", (chunk) => {
    log += chunk.toString();
  });
  const client = new Client(CLIENT_INFO, clientOptions ?? { capabilities: {} });
  const transportErrors = [];
  client.onerror = (e) => transportErrors.push(e);
  await client.connect(transport);
  const pid = transport.pid;
  let closed = false;
  const close = async () => {
    if (closed) return;
    closed = true;
    await client.close();
    await new Promise((r) => setImmediate(r)); // let the last piped stderr chunk arrive
    rmSync(stateDir, { recursive: true, force: true });
    assertNoSanitizerReport(log);
  };
  t.after(close);
  return { client, transport, pid, stateDir, log: () => log, transportErrors, close };
}

// ------------------------------------------------------------------ schemas

/** An Ajv for JSON Schema 2020-12, the default dialect of MCP 2025-11-25. */
export function makeAjv() {
  return new Ajv2020({ strict: false, allErrors: true });
}

/** Asserts `schema` is a valid JSON schema, then that `value` conforms to it. */
export function assertConforms(ajv, schema, value, what) {
  assert.ok(ajv.validateSchema(schema), `${what}: invalid JSON schema: ${ajv.errorsText(ajv.errors)}`);
  const validate = ajv.compile(schema);
  assert.ok(validate(value), `${what}: does not match its outputSchema: ${ajv.errorsText(validate.errors)}\n${JSON.stringify(value)}`);
}

/** The text of a tool result's first content block. */
export function resultText(result) {
  assert.ok(Array.isArray(result.content) && result.content.length > 0, `no content: ${JSON.stringify(result)}`);
  assert.equal(result.content[0].type, "text");
  return result.content[0].text;
}

// ------------------------------------------------------------------ HTTP

/**
 * Starts the binary as a Streamable HTTP server on a free loopback port.
 *
 * While the HTTP transport is not in the binary, the test is skipped (t.skip) and null is
 * returned: the binary either rejects `--transport http` (exit 2, "Invalid transport") or
 * accepts the flag but still serves stdio ("serving on stdio" in its log). Any other failure
 * to start fails the test. With MPS_E2E_REQUIRE_HTTP=1, a skip becomes a failure.
 *
 * Options: args (extra flags), tls (adds --tls-self-signed, URL is https), path (/mcp).
 * Returns { url, origin, port, stateDir, proc, log(), stop() }; stop() runs at test end too.
 */
export async function startHttpServer(t, { args = [], tls = false, path = "/mcp" } = {}) {
  const stateDir = makeStateDir(t, { keep: true }); // removed by stop(), once the server is gone
  const port = await freePort();
  const argv = serverArgs(stateDir, [
    "--transport", "http", "--host", "127.0.0.1", "--port", String(port), "--path", path,
    ...(tls ? ["--tls-self-signed"] : []),
    ...args,
  ]);
  const server = spawnServer(BINARY, argv);
  const { proc } = server;
  const stop = async () => {
    await server.stop();
    rmSync(stateDir, { recursive: true, force: true });
    assertNoSanitizerReport(server.log());
  };
  t.after(stop);

  const ready = await waitUntil(async () => server.exit() !== null || (await canConnect(port)), 15000, 50);
  const log = server.log();
  const exit = server.exit();
  if (exit !== null) {
    let why = null;
    if (exit.code === 2 && /Invalid transport/.test(log)) {
      why = "the binary rejects --transport http (exit 2, Invalid transport)";
    } else if (/unrecognized arguments: --(transport|host|port|path|tls-self-signed|auth-token-file)/.test(log)) {
      why = `the binary does not know the HTTP flags yet (${log.trim().split("\n").pop()})`;
    } else if (/serving on stdio/.test(log)) {
      why = "the binary accepts --transport http but still serves stdio (HTTP transport not wired in yet)";
    }
    if (why !== null) {
      if (REQUIRE_HTTP) assert.fail(`MPS_E2E_REQUIRE_HTTP=1 but ${why}`);
      t.skip(`HTTP transport not available: ${why}`);
      return null;
    }
    assert.fail(`HTTP server exited before listening (code ${exit.code}, signal ${exit.signal}):\n${log.slice(-4000)}`);
  }
  assert.ok(ready, `HTTP server did not listen on 127.0.0.1:${port} within 15 s:\n${log.slice(-4000)}`);
  assert.equal(server.stdout(), "", "the HTTP server wrote to stdout");
  const origin = `${tls ? "https" : "http"}://127.0.0.1:${port}`;
  return { url: new URL(origin + path), origin, port, stateDir, proc, log: server.log, stop };
}

/** The PEM certificate --tls-self-signed left under <state dir>/tls/. */
export function selfSignedCertPath(stateDir) {
  const dir = join(stateDir, "tls");
  assert.ok(existsSync(dir), `no ${dir} after --tls-self-signed`);
  for (const name of readdirSync(dir).sort()) {
    const file = join(dir, name);
    let text;
    try {
      text = readFileSync(file, "utf8");
    } catch {
      continue;
    }
    if (text.includes("-----BEGIN CERTIFICATE-----")) return file;
  }
  assert.fail(`no PEM certificate in ${dir}: ${readdirSync(dir).join(", ")}`);
}

/** Writes a bearer-token file in the server's format ([name:]token per line). */
export function writeTokenFile(dir, tokens) {
  const file = join(dir, "tokens");
  writeFileSync(file, tokens.map(([name, tok]) => `${name}:${tok}\n`).join(""), { mode: 0o600 });
  return file;
}

/**
 * Connects an SDK Client over Streamable HTTP. Options: headers (sent on every request),
 * sessionId (reconnect to a session: connect() then skips initialize), requests (an array
 * that receives { method, headers, body } of every HTTP request the transport makes).
 * Closed at test end.
 */
export async function connectHttp(t, url, { headers, sessionId, requests, clientOptions } = {}) {
  const { StreamableHTTPClientTransport } = await import("@modelcontextprotocol/sdk/client/streamableHttp.js");
  const recordingFetch = (input, init = {}) => {
    requests.push({ method: init.method ?? "GET", headers: new Headers(init.headers), body: init.body });
    return fetch(input, init);
  };
  const transport = new StreamableHTTPClientTransport(url, {
    ...(headers ? { requestInit: { headers } } : {}),
    ...(sessionId ? { sessionId } : {}),
    ...(requests ? { fetch: recordingFetch } : {}),
  });
  const client = new Client(CLIENT_INFO, clientOptions ?? { capabilities: {} });
  const transportErrors = [];
  client.onerror = (e) => transportErrors.push(e);
  t.after(() => client.close());
  await client.connect(transport);
  return { client, transport, transportErrors };
}

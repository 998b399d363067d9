// Shared helpers of the fleet suites: the container engine (docker's CLI), MCP clients with
// a bearer token (the SDK v1 client of the handshake era, the v2 client of 2026-07-28),
// /readyz polling and /metrics parsing.  Everything a test starts carries the label
// io.github.mcp-python-exec-sandbox.fleet, so run.sh can sweep what a crashed test left.
import { execFile, execFileSync } from "node:child_process";
import { mkdtempSync, readFileSync, readdirSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { dirname, join, resolve } from "node:path";
import { fileURLToPath } from "node:url";
import { promisify } from "node:util";
import { randomBytes } from "node:crypto";
import assert from "node:assert/strict";

import { Client } from "@modelcontextprotocol/sdk/client/index.js";
import { StreamableHTTPClientTransport } from "@modelcontextprotocol/sdk/client/streamableHttp.js";

import { freePort, sleep, waitUntil } from "../lib/net.mjs";
import { spawnOrphanProof } from "../lib/server.mjs";

export const FLEET_DIR = dirname(fileURLToPath(import.meta.url));
export const ROOT = resolve(FLEET_DIR, "..", "..");
export const LABEL = "io.github.mcp-python-exec-sandbox.fleet";
export const CLI = process.env.MPS_CONTAINER_CLI || "docker";
export const BINARY = resolve(process.env.MPS_BINARY || join(ROOT, "build", "mcp-python-exec-sandbox"));
export const CLIENT_INFO = { name: "mps-fleet", version: "0.0.1" };
export const SECCOMP = join(ROOT, "deploy", "container", "seccomp-bwrap.json");
// What bubblewrap needs in a container (docs/operations.md): namespaces (a seccomp profile
// that allows them), and /proc unmasked, so that the sandbox can mount a fresh one.
export const BWRAP_OPTS = [
  "--security-opt", `seccomp=${SECCOMP}`, "--security-opt", "systempaths=unconfined",
  "--security-opt", "no-new-privileges", "--cap-drop", "ALL",
];

const execFileAsync = promisify(execFile);
export { freePort, sleep, waitUntil };

/** Runs the engine's CLI; resolves its stdout (trimmed), rejects with its stderr. */
export async function engine(args, { timeout = 120000 } = {}) {
  try {
    const { stdout } = await execFileAsync(CLI, args, { timeout, maxBuffer: 16 << 20 });
    return stdout.trim();
  } catch (e) {
    throw new Error(`${CLI} ${args.join(" ")}: ${e.stderr || e.message}`);
  }
}

/** Live processes (the host's, containers' included) whose command line contains needle. */
export function processesWithMarker(needle) {
  const found = [];
  for (const e of readdirSync("/proc")) {
    if (!/^\d+$/.test(e) || Number(e) === process.pid) continue;
    try {
      const stat = readFileSync(`/proc/${e}/stat`, "utf8");
      if (/^[ZX]$/.test(stat.slice(stat.lastIndexOf(")") + 2, stat.lastIndexOf(")") + 3))) continue;
      if (readFileSync(`/proc/${e}/cmdline`).includes(needle)) found.push(Number(e));
    } catch {
      continue;
    }
  }
  return found;
}

/** A container's log, stdout and stderr together (the server logs to stderr). */
export async function engineLogs(name) {
  try {
    const { stdout, stderr } = await execFileAsync(CLI, ["logs", name], { timeout: 30000, maxBuffer: 16 << 20 });
    return stdout + stderr;
  } catch (e) {
    return String(e);
  }
}

/** A fresh temporary directory, removed when the test ends. */
export function tempDir(t, tag = "fleet") {
  const dir = mkdtempSync(join(tmpdir(), `mps-${tag}-`));
  t.after(() => rmSync(dir, { recursive: true, force: true }));
  return dir;
}

/** A random bearer token and a token file (NAME:TOKEN) holding it, readable by the container's user. */
export function makeToken(dir, name = "tester") {
  const token = randomBytes(24).toString("hex");
  const file = join(dir, "tokens");
  writeFileSync(file, `${name}:${token}\n`, { mode: 0o644 });
  return { token, file, name };
}

/**
 * GET url; resolves { status, body } (never throws on a refused connection, nor on no answer
 * within timeoutMs: status 0).
 *
 * A fetch of a container's published port can stay pending forever with nothing left in the
 * event loop: docker's port proxy takes the connection before the server in the container
 * listens, and drops it (trace-pending.mjs caught it: the image suite's first /readyz poll,
 * after which node:test cancelled the file).  So a timer of its own, which keeps the event
 * loop alive, settles the poll: it aborts the fetch and ends the race whatever undici does.
 */
export async function get(url, { headers = {}, dispatcher, timeoutMs = 15000 } = {}) {
  const ac = new AbortController();
  let timer;
  const late = new Promise((_, reject) => {
    timer = setTimeout(() => {
      const e = new Error(`no answer within ${timeoutMs} ms`);
      ac.abort(e);
      reject(e);
    }, timeoutMs);
  });
  try {
    const answer = (async () => {
      const r = await fetch(url, { headers, signal: ac.signal, ...(dispatcher ? { dispatcher } : {}) });
      return { status: r.status, body: await r.text(), headers: r.headers };
    })();
    answer.catch(() => {}); // (the race's loser)
    return await Promise.race([answer, late]);
  } catch (e) {
    return { status: 0, body: String(e?.cause?.code ?? e?.message ?? e), headers: new Headers() };
  } finally {
    clearTimeout(timer);
  }
}

/** Waits for base/readyz to answer 200. */
export async function waitReady(base, timeoutMs = 60000, what = base) {
  let last = null;
  const ok = await waitUntil(async () => (last = await get(`${base}/readyz`)).status === 200, timeoutMs, 200);
  assert.ok(ok, `${what}: /readyz did not turn 200 within ${timeoutMs} ms (last: ${last?.status} ${last?.body})`);
}

/**
 * Starts the server's image in a container, its port 8080 published on a free loopback
 * port.  opts: image, tokenFile (mounted read-only), env ({}), dockerArgs ([]), args (the
 * server's flags), ready (wait for /readyz, default true).  Removed at test end.
 */
export async function runServerContainer(t, { image, tokenFile, env = {}, dockerArgs = [], args = [], ready = true }) {
  const port = await freePort();
  const name = `mps-fleet-${process.pid}-${randomBytes(4).toString("hex")}`;
  const envArgs = Object.entries(env).flatMap(([k, v]) => ["-e", `${k}=${v}`]);
  const id = await engine([
    "run", "-d", "--name", name, "--label", LABEL, "-p", `127.0.0.1:${port}:8080`,
    ...(tokenFile ? ["-v", `${tokenFile}:/run/mps/tokens:ro`, "-e", "MPS_TOKEN_FILE=/run/mps/tokens"] : []),
    ...envArgs, ...dockerArgs, image, ...args,
  ]);
  const base = `http://127.0.0.1:${port}`;
  const c = { id, name, port, base, url: new URL(`${base}/mcp`), logs: () => engineLogs(name) };
  t.after(() => engine(["rm", "-f", "-v", name]).catch(() => {})); // -v: the image's state volume too
  if (ready) {
    try {
      await waitReady(base, 60000, name);
    } catch (e) {
      throw new Error(`${e.message}\n${(await engineLogs(name)).slice(-3000)}`);
    }
  }
  return c;
}

/** An SDK v1 (handshake era) client over Streamable HTTP with a bearer token; closed at test end. */
export async function connectV1(t, url, token, { fetch: customFetch } = {}) {
  const transport = new StreamableHTTPClientTransport(new URL(url), {
    requestInit: { headers: { authorization: `Bearer ${token}` } },
    ...(customFetch ? { fetch: customFetch } : {}),
  });
  const client = new Client(CLIENT_INFO, { capabilities: {} });
  const errors = [];
  client.onerror = (e) => errors.push(e);
  if (t) t.after(() => client.close().catch(() => {}));
  await client.connect(transport);
  return { client, transport, errors };
}

/** A v2 client (@modelcontextprotocol/client), pinned to the stateless era 2026-07-28. */
export async function connectModern(t, url, token) {
  const v2 = await import("@modelcontextprotocol/client");
  const transport = new v2.StreamableHTTPClientTransport(new URL(url), {
    requestInit: { headers: { authorization: `Bearer ${token}` } },
  });
  const client = new v2.Client(CLIENT_INFO, { capabilities: {}, versionNegotiation: { mode: { pin: "2026-07-28" } } });
  if (t) t.after(() => client.close().catch(() => {}));
  await client.connect(transport);
  return { client, transport };
}

/** The text of a tool result's first content block. */
export function resultText(r) {
  assert.ok(Array.isArray(r?.content) && r.content.length > 0, `no content: ${JSON.stringify(r)}`);
  return r.content[0].text;
}

/**
 * The value of one Prometheus sample (metric name and an optional label subset); the sum
 * over every series that matches.
 */
export function metricValue(text, name, labels = {}) {
  let sum = 0;
  let found = false;
  for (const line of text.split("\n")) {
    if (!line.startsWith(name) || line.startsWith("#")) continue;
    const m = /^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{([^}]*)\})?\s+(\S+)/.exec(line);
    if (!m || m[1] !== name) continue;
    const have = Object.fromEntries([...(m[3] ?? "").matchAll(/(\w+)="([^"]*)"/g)].map((x) => [x[1], x[2]]));
    if (Object.entries(labels).every(([k, v]) => have[k] === v)) {
      sum += Number(m[4]);
      found = true;
    }
  }
  return found ? sum : null;
}

/** Unmounts (lazily) every mount point under dir, deepest first. */
export function unmountUnder(dir) {
  const mounts = readFileSync("/proc/self/mounts", "utf8").split("\n").map((l) => l.split(" ")[1])
    .filter((m) => m && (m === dir || m.startsWith(dir + "/"))).sort().reverse();
  for (const m of mounts) {
    try {
      execFileSync("umount", ["-l", m], { stdio: "ignore" });
    } catch {}
  }
}

/**
 * Starts the server binary as an HTTP instance on 127.0.0.1:port (a native process, for the
 * nginx suite).  Returns { proc, port, base, stateDir, log(), kill(signal), exited }.
 */
export function startInstance(t, { port, tokenFile, args = [], backend = process.env.MPS_TEST_BACKEND || "bwrap", prestart = "off" }) {
  const stateDir = mkdtempSync(join(tmpdir(), "mps-fleet-inst-"));
  const argv = [
    "--transport", "http", "--host", "127.0.0.1", "--port", String(port), "--state-dir", stateDir,
    "--sandbox-backend", backend, "--auth-token-file", tokenFile, "--prestart", prestart, ...args,
  ];
  const proc = spawnOrphanProof(BINARY, argv, { stdio: ["ignore", "ignore", "pipe"], env: { ...process.env } });
  let log = "";
  proc.stderr.on("data", (c) => {
    log += c.toString();
    if (log.length > 1 << 20) log = log.slice(-(1 << 19));
  });
  const exited = new Promise((r) => proc.once("exit", (code, signal) => r({ code, signal })));
  let gone = false;
  exited.then(() => (gone = true));
  const inst = {
    proc, port, stateDir, base: `http://127.0.0.1:${port}`, log: () => log, exited,
    kill: (sig = "SIGTERM") => { if (!gone) proc.kill(sig); return exited; },
  };
  t.after(async () => {
    if (!gone) {
      proc.kill("SIGTERM");
      const killer = setTimeout(() => proc.kill("SIGKILL"), 15000);
      await exited;
      clearTimeout(killer);
    }
    // A server killed with SIGKILL could not unmount its runs' work directories (tmpfs
    // mounts in this mount namespace, when root): the test that killed it does.
    // Never throws: a hook that throws skips the later ones, and an instance they would
    // have stopped keeps the test process alive.
    try {
      unmountUnder(stateDir);
      rmSync(stateDir, { recursive: true, force: true });
    } catch (e) {
      console.error(`fleet: cleaning ${stateDir}: ${e.message}`);
    }
  });
  return inst;
}

// The clients of the 2026-07-28 era: the v2 SDK client (@modelcontextprotocol/client 2.4.0,
// with versionNegotiation) and the Inspector 2.12.0 CLI (--protocol-era legacy|auto|modern),
// and the checks their tests share.
import { spawn } from "node:child_process";
import { rmSync } from "node:fs";
import { join } from "node:path";
import assert from "node:assert/strict";

import { Client, StreamableHTTPClientTransport } from "@modelcontextprotocol/client";
import { StdioClientTransport } from "@modelcontextprotocol/client/stdio";

import {
  BINARY, CLIENT_INFO, E2E_DIR, assertNoSanitizerReport, descendants, makeStateDir,
  markedSleeperScript, marker, processesWithMarker, serverArgs, waitUntil,
} from "./harness.mjs";

export const MODERN = "2026-07-28";

/** A script that writes 1 KiB of binary to outputs/ (it comes back as a resource_link). */
export const ARTIFACT_SCRIPT = [
  "import os",
  "os.makedirs('outputs', exist_ok=True)",
  "open('outputs/data.bin', 'wb').write(bytes(range(256)) * 4)",
  "print('wrote')",
].join("\n");
export const ARTIFACT_BYTES = Buffer.from(Array.from({ length: 1024 }, (_, i) => i % 256));

/**
 * markedSleeperScript for a script that travels in some process's argv (the Inspector CLI's
 * --tool-args-json): the marker is put together at run time from two halves, so that only
 * the script's child carries it whole, never the process that passed the script on.
 */
export function argvSafeSleeperScript(mark, seconds = 120) {
  const half = Math.floor(mark.length / 2);
  return [
    "import subprocess, sys, time",
    `mark = ${JSON.stringify(mark.slice(0, half))} + ${JSON.stringify(mark.slice(half))}`,
    `child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(${seconds})", mark])`,
    "print('started', flush=True)",
    `time.sleep(${seconds})`,
  ].join("\n");
}

/** versionNegotiation.mode for a test's mode name: "pin" (2026-07-28), "auto" or "legacy". */
export function negotiationMode(mode) {
  return mode === "pin" ? { pin: MODERN } : mode;
}

/**
 * Connects a v2 Client. transport "stdio" starts the binary (extra server args in args);
 * "http" needs url. Returns { client, transport, pid (stdio), stateDir (stdio), log() }; closed
 * at test end (stdio: then no process of the server may be left, the auto mode's probe sibling
 * included: both carry the state directory in their argv).
 */
export async function connectV2(t, { mode, transport, url, args = [], capabilities = {} }) {
  const client = new Client(CLIENT_INFO, { capabilities, versionNegotiation: { mode: negotiationMode(mode) } });
  const transportErrors = [];
  client.onerror = (e) => transportErrors.push(e);
  if (transport === "http") {
    const tr = new StreamableHTTPClientTransport(url);
    t.after(() => client.close());
    await client.connect(tr);
    return { client, transport: tr, transportErrors, log: () => "" };
  }
  const stateDir = makeStateDir(t, { keep: true });
  const tr = new StdioClientTransport({ command: BINARY, args: serverArgs(stateDir, args), env: { ...process.env }, stderr: "pipe" });
  let log = "";
  tr.stderr.on("data", (c) => (log += c.toString()));
  t.after(async () => {
    await client.close();
    assert.ok(await waitUntil(() => processesWithMarker(stateDir).length === 0, 10000),
      `server processes left after close: ${processesWithMarker(stateDir)}`);
    rmSync(stateDir, { recursive: true, force: true });
    assertNoSanitizerReport(log);
  });
  await client.connect(tr);
  return { client, transport: tr, pid: tr.pid, stateDir, transportErrors, log: () => log };
}

/** tools/list: the three tools, each with an object input schema. */
export function checkToolNames(tools) {
  const names = tools.map((x) => x.name);
  for (const name of ["execute_python", "check_environment", "validate_script"])
    assert.ok(names.includes(name), `${name} missing from tools/list: ${names}`);
  for (const tool of tools) assert.equal(tool.inputSchema?.type, "object", `${tool.name}: inputSchema.type`);
}

/**
 * Calls execute_python with a marked sleeper, waits for it to start (its "started" line in
 * the progress stream, and the marked child in /proc), then aborts the call. The call must
 * reject, and the script's child and every process the server started for it must go.
 * serverPid: the server's pid, to look for its new descendants (stdio: the transport's pid).
 */
export async function checkCancellation(client, serverPid, tag) {
  const mark = marker(tag);
  const before = new Set(serverPid ? descendants(serverPid) : []);
  const ac = new AbortController();
  let started = false;
  const outcome = client
    .callTool({ name: "execute_python", arguments: { script: markedSleeperScript(mark) } }, {
      signal: ac.signal,
      onprogress: (p) => {
        if ((p.message ?? "").includes("started")) started = true;
      },
    })
    .then((r) => ({ resolved: r }), (e) => ({ rejected: e }));
  assert.ok(await waitUntil(() => started && processesWithMarker(mark).length > 0, 20000), "the script never started");
  ac.abort(`e2e cancels (${tag})`);
  const o = await outcome;
  assert.ok(o.rejected, `the cancelled call resolved: ${JSON.stringify(o.resolved)}`);
  assert.ok(await waitUntil(() => processesWithMarker(mark).length === 0, 15000), "the script's child survived the cancellation");
  if (serverPid) {
    const fresh = () => descendants(serverPid).filter((p) => !before.has(p));
    assert.ok(await waitUntil(() => fresh().length === 0, 15000), `processes started for the call are left: ${fresh()}`);
  }
}

/** execute_python writes an artifact; resources/read of its link returns the same bytes. */
export async function checkArtifactRead(client) {
  const r = await client.callTool({ name: "execute_python", arguments: { script: ARTIFACT_SCRIPT } });
  assert.equal(r.isError, false, JSON.stringify(r).slice(0, 2000));
  const file = r.structuredContent.files.find((f) => f.path === "outputs/data.bin");
  assert.ok(file?.uri, `no artifact link in ${JSON.stringify(r.structuredContent.files)}`);
  const read = await client.readResource({ uri: file.uri });
  assert.equal(read.contents.length, 1);
  assert.equal(read.contents[0].uri, file.uri);
  assert.deepEqual(Buffer.from(read.contents[0].blob, "base64"), ARTIFACT_BYTES);
  return file.uri;
}

/** validate_script: a valid script is VALID, a syntax error INVALID with the reason. */
export async function checkValidate(callTool) {
  const ok = await callTool("validate_script", { script: "print(1)\n" });
  const okText = ok.content?.[0]?.text ?? "";
  assert.match(okText, /^VALID\b/, `validate_script print(1): ${okText}`);
  const bad = await callTool("validate_script", { script: "def (:\n" });
  const badText = bad.content?.[0]?.text ?? "";
  assert.match(badText, /^INVALID: .*SyntaxError/s, `validate_script of a syntax error: ${badText}`);
}

// ------------------------------------------------------------------ Inspector 2.12.0

export const INSPECTOR2 = join(E2E_DIR, "node_modules", "@modelcontextprotocol", "inspector", "clients", "launcher", "build", "index.js");

/**
 * Starts the Inspector 2.12.0 CLI (`--cli`, JSON output, quiet) with HOME and its catalog
 * and client config in a directory of the test's, so nothing is written to the user's.
 * Returns { proc, done } where done resolves { code, signal, stdout, stderr, json }.
 */
export function startInspector2(t, args) {
  const home = makeStateDir(t);
  const env = {
    ...process.env,
    HOME: home,
    MCP_CATALOG_PATH: join(home, "mcp.json"),
    MCP_CLIENT_CONFIG_PATH: join(home, "client.json"),
  };
  const proc = spawn(process.execPath, [INSPECTOR2, "--cli", "--format", "json", "-q", ...args],
    { cwd: home, env, stdio: ["ignore", "pipe", "pipe"] });
  let stdout = "";
  let stderr = "";
  proc.stdout.on("data", (c) => (stdout += c.toString()));
  proc.stderr.on("data", (c) => (stderr += c.toString()));
  const killer = setTimeout(() => proc.kill("SIGKILL"), 90000);
  const done = new Promise((resolve) => proc.once("close", (code, signal) => {
    clearTimeout(killer);
    let json = null;
    try {
      json = JSON.parse(stdout);
    } catch {
      // left null: the assertions show stdout and stderr
    }
    resolve({ code, signal, stdout, stderr, json });
  }));
  t.after(() => {
    if (proc.exitCode === null && proc.signalCode === null) proc.kill("SIGKILL");
  });
  return { proc, done };
}

/** Runs the Inspector 2.12.0 CLI to its end. */
export function inspector2(t, args) {
  return startInspector2(t, args).done;
}

/** The result of a run that must have succeeded (exit 0, JSON on stdout). */
export function inspectorResult(run, what) {
  assert.equal(run.code, 0, `${what}: exit ${run.code}\nstdout: ${run.stdout.slice(-2000)}\nstderr: ${run.stderr.slice(-2000)}`);
  assert.ok(run.json, `${what}: stdout is not JSON: ${run.stdout.slice(0, 2000)}`);
  return run.json.result ?? run.json;
}

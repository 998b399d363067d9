// The official TypeScript SDK client (Client + StdioClientTransport) against the binary over stdio.
import { test } from "node:test";
import assert from "node:assert/strict";
import { execFileSync } from "node:child_process";

import {
  BACKEND, BINARY, connectStdio, descendants, isAlive, markedSleeperScript,
  markedBusyScript, marker, processesWithMarker, resultText, waitUntil,
} from "../lib/harness.mjs";
import { SEED_ENV_LABELS, callChecked, checkProgress, listToolsChecked, progressCall } from "../lib/checks.mjs";

test("initialize: server name, version and capabilities", async (t) => {
  const { client } = await connectStdio(t);
  const info = client.getServerVersion();
  assert.equal(info.name, "mcp-python-exec-sandbox");
  // The first line is "<name> <version>"; the lines after it say where the helpers are.
  const cliVersion = execFileSync(BINARY, ["--version"], { encoding: "utf8" }).split("\n")[0].trim();
  assert.ok(cliVersion.endsWith(` ${info.version}`), `serverInfo.version ${info.version} vs --version "${cliVersion}"`);
  const caps = client.getServerCapabilities();
  assert.ok(caps.tools, `no tools capability: ${JSON.stringify(caps)}`);
  assert.ok(caps.logging, `no logging capability: ${JSON.stringify(caps)}`);
  // Declared capabilities only: run outputs are resources (no subscriptions); no prompts.
  assert.deepEqual(caps.resources, { listChanged: false, subscribe: false });
  assert.equal(caps.prompts, undefined);
  assert.deepEqual(await client.setLoggingLevel("debug"), {});
  assert.deepEqual(await client.ping(), {});
});

test("tools/list: object input schemas, valid output schemas", async (t) => {
  const { client } = await connectStdio(t);
  const tools = await listToolsChecked(client);
  const exec = tools.get("execute_python");
  assert.deepEqual(exec.inputSchema.required, ["script"]);
  assert.equal(exec.inputSchema.properties.script.type, "string");
  assert.ok(exec.inputSchema.properties.timeout_seconds, "execute_python has no timeout_seconds");
  assert.ok(exec.inputSchema.properties.dependencies, "execute_python has no dependencies");
  assert.deepEqual(Object.keys(tools.get("check_environment").inputSchema.properties ?? {}), []);
});

test("execute_python: stdout and stderr, exit code 0", async (t) => {
  const { client } = await connectStdio(t);
  const tools = await listToolsChecked(client);
  const script = "import sys\nprint('hello from e2e')\nprint('to stderr', file=sys.stderr)\n";
  const r = await callChecked(client, tools, "execute_python", { script });
  assert.equal(r.isError, false);
  assert.equal(r.structuredContent.stdout, "hello from e2e\n");
  assert.equal(r.structuredContent.stderr, "to stderr\n");
  assert.equal(r.structuredContent.exit_code, 0);
  assert.equal(r.structuredContent.timed_out, false);
  assert.equal(r.structuredContent.truncated, false);
  const text = resultText(r);
  assert.match(text, /^--- stdout ---\nhello from e2e\n/);
  assert.match(text, /--- stderr ---\nto stderr\n/);
  assert.match(text, /--- exit_code: 0 ---/);
  assert.match(text, /--- duration_ms: \d+ ---/);
});

test("execute_python: a non-zero exit is an error result", async (t) => {
  const { client } = await connectStdio(t);
  const tools = await listToolsChecked(client);
  let r = await callChecked(client, tools, "execute_python", { script: "import sys\nprint('bye')\nsys.exit(3)" });
  assert.equal(r.isError, true);
  assert.equal(r.structuredContent.exit_code, 3);
  assert.equal(r.structuredContent.stdout, "bye\n");
  assert.match(resultText(r), /--- exit_code: 3 ---/);

  r = await callChecked(client, tools, "execute_python", { script: "raise ValueError('boom')" });
  assert.equal(r.isError, true);
  assert.equal(r.structuredContent.exit_code, 1);
  assert.match(r.structuredContent.stderr, /ValueError: boom/);
});

test("execute_python: argument errors are tool results, not protocol errors", async (t) => {
  const { client } = await connectStdio(t);
  const tools = await listToolsChecked(client);
  for (const args of [{ script: 42 }, { script: "print(1)", bogus: true }, { script: "print(1)", timeout_seconds: 0 }, {}]) {
    const r = await callChecked(client, tools, "execute_python", args);
    assert.equal(r.isError, true, `${JSON.stringify(args)} gave ${JSON.stringify(r)}`);
    assert.ok(resultText(r).length > 0);
  }
});

test("execute_python: a timeout kills the script and says timed_out", async (t) => {
  const { client } = await connectStdio(t, ["--kill-grace-seconds", "1"]);
  const tools = await listToolsChecked(client);
  const mark = marker("timeout");
  const script = markedBusyScript(mark);
  const r = await callChecked(client, tools, "execute_python", { script, timeout_seconds: 1 }, { timeout: 30000 });
  assert.equal(r.isError, true);
  assert.equal(r.structuredContent.timed_out, true);
  assert.match(resultText(r), /--- timed_out: true ---/);
  assert.equal(r.structuredContent.stdout, "started\n");
  assert.ok(await waitUntil(() => processesWithMarker(mark).length === 0, 10000), "the script's child outlived the timeout");
});

test("execute_python: long output is truncated to --max-output-bytes", async (t) => {
  const { client } = await connectStdio(t, ["--max-output-bytes", "2048"]);
  const tools = await listToolsChecked(client);
  const r = await callChecked(client, tools, "execute_python", { script: "print('a' * 50000 + 'b' * 50000)", details: true });
  const sc = r.structuredContent;
  assert.equal(r.isError, false);
  assert.equal(sc.truncated, true);
  assert.equal(sc.stdout_bytes, 100001);
  assert.ok(sc.stdout.length < 4096, `kept ${sc.stdout.length} bytes of stdout with --max-output-bytes 2048`);
  assert.ok(sc.stdout.startsWith("aaaa"), "the beginning is kept");
  assert.ok(sc.stdout.endsWith("bbbb\n"), "the end is kept");
  assert.match(sc.stdout, /\.\.\. \[truncated at [^\]]+\]/);
  assert.match(resultText(r), /\.\.\. \[truncated at [^\]]+\]/);
});

test("progress: output streams in order, the first notification before the script ends", async (t) => {
  const { client } = await connectStdio(t);
  const tools = await listToolsChecked(client);
  const { result, events, resultAt } = await progressCall(client, tools);
  checkProgress(events, resultAt, result);
});

test("cancellation: aborting the call kills the script's process tree", async (t) => {
  const { client, pid } = await connectStdio(t, ["--kill-grace-seconds", "1"]);
  const tools = await listToolsChecked(client);
  const mark = marker("cancel");
  const before = new Set(descendants(pid)); // helpers the server may keep (none today)
  const ac = new AbortController();
  let started = false;
  const call = client.callTool({ name: "execute_python", arguments: { script: markedSleeperScript(mark) } }, undefined, {
    signal: ac.signal,
    onprogress: (p) => {
      if ((p.message ?? "").includes("started")) started = true;
    },
  });
  const outcome = call.then(
    (r) => ({ resolved: r }),
    (e) => ({ rejected: e }),
  );
  assert.ok(await waitUntil(() => started && processesWithMarker(mark).length > 0, 15000), "the script never started");
  assert.ok(descendants(pid).length > 0);
  ac.abort("e2e cancels");
  const o = await outcome;
  assert.ok(o.rejected, `the cancelled call resolved: ${JSON.stringify(o.resolved)}`);
  assert.match(String(o.rejected.message), /e2e cancels/);
  assert.ok(await waitUntil(() => processesWithMarker(mark).length === 0, 10000), "the script's child survived the cancellation");
  const newChildren = () => descendants(pid).filter((p) => !before.has(p));
  assert.ok(await waitUntil(() => newChildren().length === 0, 10000), `processes started for the call are left: ${newChildren()}`);
  // The server goes on serving.
  const r = await callChecked(client, tools, "execute_python", { script: "print('still here')" });
  assert.equal(r.structuredContent.stdout, "still here\n");
});

test("check_environment: the seed's nine lines", async (t) => {
  const { client } = await connectStdio(t);
  const tools = await listToolsChecked(client);
  const r = await callChecked(client, tools, "check_environment", {});
  assert.equal(r.isError, false);
  const lines = resultText(r).split("\n");
  assert.ok(lines.length >= 9);
  SEED_ENV_LABELS.forEach((label, i) => assert.ok(lines[i].startsWith(`${label}: `), `line ${i + 1} is "${lines[i]}", expected "${label}: ..."`));
  const sc = r.structuredContent;
  assert.equal(lines[3], `Sandbox backend: ${sc.sandbox_backend}`);
  if (BACKEND === "none") assert.equal(sc.sandbox_backend, "none");
  assert.equal(lines[5], `Default timeout: ${sc.default_timeout}s`);
  assert.equal(lines[6], `Max timeout: ${sc.max_timeout}s`);
});

test("shutdown: client.close() with nothing running, the server exits 0", async (t) => {
  const { client, transport, pid, close } = await connectStdio(t);
  const proc = transport._process; // SDK 1.32.2 internal: the only handle on the exit status
  const exited = new Promise((r) => proc.once("exit", (code, signal) => r({ code, signal })));
  await client.listTools();
  await close();
  assert.deepEqual(await exited, { code: 0, signal: null });
  assert.ok(!isAlive(pid));
});

test("shutdown: client.close() during a call, the server exits 0 and leaves no child", async (t) => {
  const { client, transport, pid, close } = await connectStdio(t, ["--kill-grace-seconds", "1"]);
  const proc = transport._process;
  const exited = new Promise((r) => proc.once("exit", (code, signal) => r({ code, signal })));
  const mark = marker("shutdown");
  let started = false;
  const call = client
    .callTool({ name: "execute_python", arguments: { script: markedSleeperScript(mark) } }, undefined, {
      onprogress: (p) => {
        if ((p.message ?? "").includes("started")) started = true;
      },
    })
    .then(
      (r) => ({ resolved: r }),
      (e) => ({ rejected: e }),
    );
  assert.ok(await waitUntil(() => started && processesWithMarker(mark).length > 0, 15000), "the script never started");
  const children = descendants(pid);
  assert.ok(children.length > 0);
  await close();
  // Ended by its own hand on end of input (the SDK would SIGTERM after 2 s, SIGKILL after 4 s).
  assert.deepEqual(await exited, { code: 0, signal: null });
  const o = await call;
  assert.ok(o.rejected, "the call in flight did not fail on close");
  assert.deepEqual(children.filter(isAlive), [], "children of the server outlived it");
  assert.deepEqual(processesWithMarker(mark), [], "the script's child outlived the server");
});

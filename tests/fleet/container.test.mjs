// The server's own image (deploy/container/) on the real engine, reached over HTTP on a
// published loopback port with a bearer token, by the SDK clients of both eras.
//
// MPS_SERVER_IMAGE: the image to run (run.sh builds it with deploy/container/build.sh).
import { test } from "node:test";
import assert from "node:assert/strict";

import {
  BWRAP_OPTS, connectModern, connectV1, engine, get, makeToken, metricValue, processesWithMarker, resultText,
  runServerContainer, sleep, tempDir, waitUntil,
} from "./lib.mjs";

const IMAGE = process.env.MPS_SERVER_IMAGE;
const SLOW_PRINT = ["import time", "for i in range(6):", "    print(f'line {i}', flush=True)", "    time.sleep(0.3)"].join("\n");

function needImage(t) {
  if (!IMAGE) assert.fail("MPS_SERVER_IMAGE is not set (tests/fleet/run.sh builds the image)");
}

test("image: bubblewrap inside the container, non-root, the SDK v1 client over HTTP with a token", async (t) => {
  needImage(t);
  const dir = tempDir(t);
  const tok = makeToken(dir);
  // (The tester is the operator too: it reads /metrics below.)
  const c = await runServerContainer(t, { image: IMAGE, tokenFile: tok.file, dockerArgs: BWRAP_OPTS, args: ["--metrics-token", tok.name] });

  // The process in the container is not root, and nothing in it has a capability.
  const user = await engine(["exec", c.name, "sh", "-c", "id -u; grep CapEff /proc/1/status"]);
  assert.match(user, /^10001\nCapEff:\s+0+$/m, `the server's user and capabilities: ${user}`);

  // No token, no service.
  const anon = await fetch(c.url, {
    method: "POST",
    headers: { "content-type": "application/json", accept: "application/json, text/event-stream" },
    body: JSON.stringify({ jsonrpc: "2.0", id: 1, method: "initialize", params: { protocolVersion: "2025-11-25", capabilities: {}, clientInfo: { name: "x", version: "0" } } }),
  });
  await anon.body?.cancel();
  assert.equal(anon.status, 401);

  const { client } = await connectV1(t, c.url, tok.token);
  const tools = (await client.listTools()).tools.map((x) => x.name);
  for (const n of ["execute_python", "check_environment", "validate_script"]) assert.ok(tools.includes(n), `${n} in ${tools}`);

  let r = await client.callTool({ name: "execute_python", arguments: { script: "import os, sys\nprint('answer', 6 * 7, os.getuid(), sys.version_info[:2])" } });
  assert.equal(r.isError, false, JSON.stringify(r).slice(0, 2000));
  const m = /^answer 42 (\d+) \((\d+), (\d+)\)$/m.exec(r.structuredContent.stdout);
  assert.ok(m, `stdout: ${r.structuredContent.stdout}`);
  assert.notEqual(Number(m[1]), 0, "the script ran as root");

  r = await client.callTool({ name: "execute_python", arguments: { script: "import sys\nsys.exit(3)" } });
  assert.equal(r.isError, true);
  assert.equal(r.structuredContent.exit_code, 3);

  // The sandbox is bubblewrap, really: the script sees no network interface but loopback
  // and a /proc of its own (pid 1 is not the server).
  r = await client.callTool({ name: "execute_python", arguments: { script: "import os\nprint(sorted(os.listdir('/sys/class/net')) if os.path.isdir('/sys/class/net') else [])\nprint(open('/proc/1/cmdline','rb').read().split(b'\\0')[0].decode())" } });
  assert.equal(r.isError, false, JSON.stringify(r).slice(0, 2000));
  assert.ok(!/mcp-python-exec-sandbox/.test(r.structuredContent.stdout.split("\n")[1] ?? ""), `the script sees the server as pid 1: ${r.structuredContent.stdout}`);

  r = await client.callTool({ name: "check_environment", arguments: {} });
  const sc = r.structuredContent;
  assert.equal(sc.sandbox_backend, "bwrap", JSON.stringify(sc));
  assert.equal(sc.sandbox_available, true, JSON.stringify(sc));
  assert.equal(sc.server_files.runner, "/usr/share/mcp-python-exec-sandbox/runner/runner.py");
  assert.match(resultText(r), /Python version: 3\.11/, "the image's interpreter (Debian 12's 3.11)");

  // Progress streams through the published port before the result.
  const events = [];
  r = await client.callTool({ name: "execute_python", arguments: { script: SLOW_PRINT } }, undefined, {
    onprogress: (p) => events.push(p),
  });
  assert.equal(r.structuredContent.stdout, "line 0\nline 1\nline 2\nline 3\nline 4\nline 5\n");
  assert.ok(events.length >= 2, `streamed progress: ${events.length} notification(s)`);
  assert.ok(!(events[0].message ?? "").includes("line 5"), "the first notification came after the script ended");

  // /metrics (with the operator's token) counts the calls.
  const metrics = await get(`${c.base}/metrics`, { headers: { authorization: `Bearer ${tok.token}` } });
  assert.equal(metrics.status, 200);
  assert.ok(metricValue(metrics.body, "mcp_sandbox_tool_calls_total", { tool: "execute_python" }) >= 4, metrics.body.slice(0, 2000));
});

test("image: the stateless era (v2 client pinned to 2026-07-28) through the published port", async (t) => {
  needImage(t);
  const dir = tempDir(t);
  const tok = makeToken(dir);
  const c = await runServerContainer(t, { image: IMAGE, tokenFile: tok.file, dockerArgs: BWRAP_OPTS });
  const { client } = await connectModern(t, c.url, tok.token);
  assert.equal(client.getProtocolEra(), "modern");
  const r = await client.callTool({ name: "execute_python", arguments: { script: "print(6 * 7)" } });
  assert.equal(r.isError, false, JSON.stringify(r).slice(0, 2000));
  assert.equal(r.structuredContent.stdout, "42\n");
});

test("image: cancellation kills the script inside the container", async (t) => {
  needImage(t);
  const dir = tempDir(t);
  const tok = makeToken(dir);
  const c = await runServerContainer(t, { image: IMAGE, tokenFile: tok.file, dockerArgs: BWRAP_OPTS });
  const { client } = await connectV1(t, c.url, tok.token);
  const mark = `mps-fleet-cancel-${process.pid}-${Date.now()}`;
  const script = ["import subprocess, sys, time", `subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(120)', '${mark}'])`, "print('started', flush=True)", "time.sleep(120)"].join("\n");
  const ac = new AbortController();
  let started = false;
  const outcome = client.callTool({ name: "execute_python", arguments: { script } }, undefined, {
    signal: ac.signal,
    onprogress: (p) => { if ((p.message ?? "").includes("started")) started = true; },
  }).then((r) => ({ r }), (e) => ({ e }));
  // The container's processes are the host's too: found in the host's /proc by their argv.
  const inContainer = () => processesWithMarker(mark).length;
  assert.ok(await waitUntil(() => started && inContainer() > 0, 30000), "the script never started");
  ac.abort("fleet cancels");
  assert.ok((await outcome).e, "the cancelled call resolved");
  assert.ok(await waitUntil(() => inContainer() === 0, 15000), "the script's child outlived the cancellation");
});

test("image: without the seccomp profile and /proc unmasked, bubblewrap cannot run: not ready, calls refused", async (t) => {
  needImage(t);
  const dir = tempDir(t);
  const tok = makeToken(dir);
  const c = await runServerContainer(t, { image: IMAGE, tokenFile: tok.file, ready: false });
  // The server is up (healthz) but never ready: its sandbox probe failed.
  assert.ok(await waitUntil(async () => (await get(`${c.base}/healthz`)).status === 200, 30000), "no /healthz");
  await sleep(1000);
  assert.equal((await get(`${c.base}/readyz`)).status, 503);
  assert.match(await c.logs(), /sandbox backend bwrap is not available/);
});

test("image: backend none, for a runtime that isolates the pod itself (gVisor, Kata)", async (t) => {
  needImage(t);
  const dir = tempDir(t);
  const tok = makeToken(dir);
  // The engine's defaults: no extra permission at all.
  const c = await runServerContainer(t, {
    image: IMAGE, tokenFile: tok.file, env: { MPS_SANDBOX_BACKEND: "none" },
    dockerArgs: ["--cap-drop", "ALL", "--security-opt", "no-new-privileges", "--read-only", "--tmpfs", "/tmp"],
  });
  const { client } = await connectV1(t, c.url, tok.token);
  const r = await client.callTool({ name: "execute_python", arguments: { script: "print(6 * 7)" } });
  assert.equal(r.isError, false, JSON.stringify(r).slice(0, 2000));
  assert.equal(r.structuredContent.stdout, "42\n");
  const env = await client.callTool({ name: "check_environment", arguments: {} });
  assert.equal(env.structuredContent.sandbox_backend, "none");
});

test("image: docker stop drains: a running call finishes, /readyz turns 503, exit 0", async (t) => {
  needImage(t);
  const dir = tempDir(t);
  const tok = makeToken(dir);
  const c = await runServerContainer(t, { image: IMAGE, tokenFile: tok.file, dockerArgs: BWRAP_OPTS, env: { MPS_DRAIN_SECONDS: "20" } });
  const { client } = await connectV1(t, c.url, tok.token);
  let started = false;
  const call = client.callTool({ name: "execute_python", arguments: { script: "import time\nprint('started', flush=True)\ntime.sleep(3)\nprint('done')" } }, undefined, {
    onprogress: (p) => { if ((p.message ?? "").includes("started")) started = true; },
  });
  assert.ok(await waitUntil(() => started, 30000), "the call never started");
  const stop = engine(["stop", "-t", "25", c.name]);
  assert.ok(await waitUntil(async () => (await get(`${c.base}/readyz`)).status !== 200, 5000), "/readyz stayed 200 while draining");
  const r = await call;
  assert.equal(r.isError, false, JSON.stringify(r).slice(0, 2000));
  assert.equal(r.structuredContent.stdout, "started\ndone\n");
  await stop;
  assert.equal(await engine(["inspect", "-f", "{{.State.ExitCode}}", c.name]), "0");
});

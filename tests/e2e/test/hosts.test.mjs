// Clients nobody here wrote, as hosts use them (issue 36): the AI SDK's MCP client
// (@ai-sdk/mcp), LangChain's MCP adapters, Mastra's MCP client, and mcp-remote (a stdio
// proxy to an HTTP server, driven by the official SDK's stdio client), each over stdio and
// Streamable HTTP: the tool list, a call, an error, a file, a cancel where the client can,
// and a 90 s script through execute_python(background: true) + wait_run, which no call of
// theirs may take longer than 60 s for (their default timeouts).
import { test } from "node:test";
import assert from "node:assert/strict";
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { createRequire } from "node:module";

import { createMCPClient } from "@ai-sdk/mcp";
import { Experimental_StdioMCPTransport as AiStdio } from "@ai-sdk/mcp/mcp-stdio";
import { MultiServerMCPClient } from "@langchain/mcp-adapters";
import { MCPClient as MastraClient } from "@mastra/mcp";
import { Client } from "@modelcontextprotocol/sdk/client/index.js";
import { StdioClientTransport } from "@modelcontextprotocol/sdk/client/stdio.js";

import { BINARY, CLIENT_INFO, makeStateDir, serverArgs, startHttpServer } from "../lib/harness.mjs";

const require = createRequire(import.meta.url);
const PNG_SCRIPT = [
  "import os, zlib, struct",
  "def chunk(t, d): return struct.pack('>I', len(d)) + t + d + struct.pack('>I', zlib.crc32(t + d))",
  "png = b'\\x89PNG\\r\\n\\x1a\\n' + chunk(b'IHDR', struct.pack('>IIBBBBB', 1, 1, 8, 2, 0, 0, 0))",
  "png += chunk(b'IDAT', zlib.compress(b'\\x00\\xff\\x00\\x00')) + chunk(b'IEND', b'')",
  "os.makedirs('outputs', exist_ok=True)",
  "open('outputs/dot.png', 'wb').write(png)",
  "open('outputs/note.txt', 'w').write('hello file')",
].join("\n");
// 90 s, saying where it is now and then.
const LONG_SCRIPT = "import time\nfor i in range(9):\n    print(f'step {i}', flush=True)\n    time.sleep(10)\nprint('finished')";

/** The server's stdio command line (a fresh state directory, removed at the end: after the
 * client's own end, which the test registers first, and with retries while the server exits). */
function stdioCommand(t, extra = []) {
  const stateDir = makeStateDir(t, { keep: true });
  process.once("exit", () => rmSync(stateDir, { recursive: true, force: true }));
  return { command: BINARY, args: serverArgs(stateDir, ["--kill-grace-seconds", "1", "--no-warm-cache", ...extra]) };
}

async function httpUrl(t) {
  const srv = await startHttpServer(t, { args: ["--kill-grace-seconds", "1", "--no-warm-cache"] });
  return srv ? srv.url : null;
}

/** The structured part of a wait_run/execute_python answer, whatever the client made of it. */
function structured(result) {
  if (result && typeof result === "object" && "structuredContent" in result) return result.structuredContent;
  return result;
}

/** Drives a long run through background + wait_run with call(name, args) -> structured result. */
async function longRun(call) {
  const started = await call("execute_python", { script: LONG_SCRIPT, background: true, timeout_seconds: 150 });
  assert.equal(started.status, "running");
  const seen = [];
  for (let i = 0; i < 10; i++) {
    const t0 = performance.now();
    const r = await call("wait_run", { run_id: started.run_id });
    assert.ok(performance.now() - t0 < 60000, "a wait_run took 60 s or more");
    if (r.status === "running") {
      seen.push(r.stdout);
      continue;
    }
    assert.equal(r.status, "completed");
    assert.match(r.stdout, /step 0\n[\s\S]*finished\n$/);
    assert.ok(seen.length >= 1, "the run never answered still running");
    return r;
  }
  assert.fail("the run did not end");
}

// ------------------------------------------------------------------ the AI SDK

async function aiClient(t, transport) {
  const client = await createMCPClient({ transport, clientInfo: CLIENT_INFO });
  t.after(() => client.close());
  return client;
}

async function aiSdkChecks(t, client, { long = false } = {}) {
  const tools = await client.tools();
  for (const name of ["execute_python", "wait_run", "cancel_run"]) assert.ok(tools[name], `no ${name}`);
  const opts = (id) => ({ toolCallId: id, messages: [] });
  // A call: the model gets the content blocks (toModelOutput).
  let out = await tools.execute_python.execute({ script: "print('hi')" }, opts("1"));
  assert.equal(out.isError, false);
  assert.equal(out.structuredContent.stdout, "hi\n");
  let model = await tools.execute_python.toModelOutput({ output: out });
  assert.equal(model.type, "content");
  assert.match(model.value[0].text, /--- stdout ---\nhi\n/);
  // An error.
  out = await tools.execute_python.execute({ script: "1/0" }, opts("2"));
  assert.equal(out.isError, true);
  assert.match(out.structuredContent.error, /ZeroDivisionError/);
  // A file: the image is a file part for the model, the text file an embedded resource.
  out = await tools.execute_python.execute({ script: PNG_SCRIPT }, opts("3"));
  model = await tools.execute_python.toModelOutput({ output: out });
  assert.ok(model.value.some((p) => p.type === "file" && p.mediaType === "image/png"), JSON.stringify(model).slice(0, 500));
  assert.deepEqual(out.structuredContent.files.map((f) => f.path).sort(), ["outputs/dot.png", "outputs/note.txt"]);
  // A cancel: the AI SDK aborts by closing the request (no notifications/cancelled).
  const ac = new AbortController();
  const pending = tools.execute_python.execute({ script: "import time\ntime.sleep(60)", timeout_seconds: 90 },
    { ...opts("4"), abortSignal: ac.signal });
  setTimeout(() => ac.abort(), 1500);
  await assert.rejects(pending);
  if (long) {
    const call = async (name, args) => structured(await tools[name].execute(args, opts(name)));
    await longRun(call);
  }
}

test("ai-sdk: stdio", async (t) => {
  const { command, args } = stdioCommand(t);
  const client = await aiClient(t, new AiStdio({ command, args }));
  await aiSdkChecks(t, client);
});


// ------------------------------------------------------------------ LangChain

async function langchainChecks(t, server, { long = false } = {}) {
  const client = new MultiServerMCPClient({ mcpServers: { sandbox: server } });
  t.after(() => client.close());
  const tools = await client.getTools();
  const byName = Object.fromEntries(tools.map((x) => [x.name.replace(/^.*__/, ""), x]));
  for (const name of ["execute_python", "wait_run", "cancel_run"]) assert.ok(byName[name], `no ${name}: ${Object.keys(byName)}`);
  const text = (content) => (typeof content === "string" ? content : JSON.stringify(content));
  // invoke with a tool call: a ToolMessage whose content is what the model sees, and the
  // structuredContent as the artifact.
  const run = async (name, args, id = "c") => byName[name].invoke({ type: "tool_call", id, name: byName[name].name, args });
  let msg = await run("execute_python", { script: "print('hi')" });
  assert.ok(text(msg.content).includes("--- stdout ---") && text(msg.content).includes("hi"), text(msg.content));
  // (an isError result is a thrown ToolException to LangChain; its message is what the model gets)
  msg = await run("execute_python", { script: "1/0" }).catch((e) => ({ content: String(e?.message ?? e) }));
  assert.match(text(msg.content), /ZeroDivisionError/);
  msg = await run("execute_python", { script: PNG_SCRIPT });
  assert.match(text(msg.content), /image/);
  assert.match(text(msg.content), /outputs\/note\.txt/);
  if (long) {
    const call = async (name, args) => {
      const m = await run(name, args, name);
      const artifact = (m.artifact ?? []).find((a) => a.type === "mcp_structured_content" || a.data);
      return artifact?.data ?? JSON.parse(m.content);
    };
    await longRun(call);
  }
}

test("langchain: stdio", async (t) => {
  const { command, args } = stdioCommand(t);
  await langchainChecks(t, { transport: "stdio", command, args });
});


// ------------------------------------------------------------------ Mastra

async function mastraChecks(t, server, { long = false } = {}) {
  const mcp = new MastraClient({ id: `mps-${process.pid}-${Math.random()}`, servers: { sandbox: server } });
  t.after(() => mcp.disconnect());
  const tools = await mcp.listTools();
  const tool = (name) => tools[`sandbox_${name}`];
  for (const name of ["execute_python", "wait_run", "cancel_run"]) assert.ok(tool(name), `no ${name}: ${Object.keys(tools)}`);
  // Mastra validates structuredContent against the outputSchema and returns it.
  let out = await tool("execute_python").execute({ script: "print('hi')" }, {});
  assert.equal(structured(out).stdout, "hi\n");
  // (an isError result is a thrown error to Mastra)
  out = await tool("execute_python").execute({ script: "1/0" }, {}).catch((e) => String(e?.message ?? e));
  assert.match(JSON.stringify(out), /ZeroDivisionError/);
  out = await tool("execute_python").execute({ script: PNG_SCRIPT }, {});
  assert.match(JSON.stringify(out), /outputs\/dot\.png/);
  if (long) await longRun(async (name, args) => structured(await tool(name).execute(args, {})));
}

test("mastra: stdio", async (t) => {
  const { command, args } = stdioCommand(t);
  await mastraChecks(t, { command, args });
});


// ------------------------------------------------------------------ mcp-remote

async function remoteChecks(t, url, { long = false } = {}) {
  const configDir = mkdtempSync(join(tmpdir(), "mps-mcp-remote-"));
  t.after(() => rmSync(configDir, { recursive: true, force: true }));
  const proxy = require.resolve("mcp-remote/dist/proxy.js");
  const transport = new StdioClientTransport({
    command: process.execPath,
    args: [proxy, url.href, "--allow-http", "--transport", "http-only"],
    env: { ...process.env, MCP_REMOTE_CONFIG_DIR: configDir },
    stderr: "pipe",
  });
  const client = new Client(CLIENT_INFO, { capabilities: {} });
  t.after(() => client.close());
  await client.connect(transport);
  const { tools } = await client.listTools();
  assert.ok(["execute_python", "wait_run", "cancel_run"].every((n) => tools.some((x) => x.name === n)));
  let r = await client.callTool({ name: "execute_python", arguments: { script: "print('hi')" } });
  assert.equal(r.structuredContent.stdout, "hi\n");
  r = await client.callTool({ name: "execute_python", arguments: { script: "1/0" } });
  assert.equal(r.isError, true);
  r = await client.callTool({ name: "execute_python", arguments: { script: PNG_SCRIPT } });
  assert.ok(r.content.some((c) => c.type === "image"));
  // A cancel: notifications/cancelled through the proxy.
  const ac = new AbortController();
  const pending = client.callTool({ name: "execute_python", arguments: { script: "import time\ntime.sleep(60)", timeout_seconds: 90 } },
    undefined, { signal: ac.signal });
  setTimeout(() => ac.abort(), 1500);
  await assert.rejects(pending);
  if (long) {
    await longRun(async (name, args) => (await client.callTool({ name, arguments: args }, undefined, { timeout: 60000 })).structuredContent);
  }
}

// The four long runs side by side (each mostly waits on its script's sleeps): one after the
// other they took six minutes of the suite.
test("http: each client's 90 s script through background + wait_run, side by side", { timeout: 300000, concurrency: 4 }, async (t) => {
  await Promise.all([
    t.test("ai-sdk: http, and a 90 s script through background + wait_run", { timeout: 240000 }, async (t) => {
      const url = await httpUrl(t);
      if (!url) return;
      const client = await aiClient(t, { type: "http", url: url.href });
      await aiSdkChecks(t, client, { long: true });
    }),
    t.test("langchain: http, and a 90 s script through background + wait_run", { timeout: 240000 }, async (t) => {
      const url = await httpUrl(t);
      if (!url) return;
      await langchainChecks(t, { transport: "http", url: url.href }, { long: true });
    }),
    t.test("mastra: http, and a 90 s script through background + wait_run", { timeout: 240000 }, async (t) => {
      const url = await httpUrl(t);
      if (!url) return;
      await mastraChecks(t, { url }, { long: true });
    }),
    t.test("mcp-remote: stdio to http, and a 90 s script through background + wait_run", { timeout: 240000 }, async (t) => {
      const url = await httpUrl(t);
      if (!url) return;
      await remoteChecks(t, url, { long: true });
    }),
  ]);
});

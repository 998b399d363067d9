// The MCP Inspector's CLI mode (@modelcontextprotocol/inspector-cli, v1) lists and calls the
// tools, over stdio and over HTTP.
//
// Quirk of 1.0.3: it finds its own package.json through a path relative to the *current
// directory*, so it must run from a subdirectory of a folder that has a package.json: we run
// it from tests/e2e/test/ (tests/e2e/ has one). It pipes the stdio server's stderr and never
// reads it, so sanitizer reports are checked by the SDK tests, not here.
import { test } from "node:test";
import assert from "node:assert/strict";
import { execFile } from "node:child_process";
import { join } from "node:path";

import {
  BINARY, E2E_DIR, makeAjv, makeStateDir, processesWithMarker, serverArgs, startHttpServer, waitUntil,
} from "../lib/harness.mjs";

const INSPECTOR = join(E2E_DIR, "node_modules", "@modelcontextprotocol", "inspector-cli", "build", "cli.js");
const INSPECTOR_CWD = join(E2E_DIR, "test");

/** Runs the Inspector CLI; resolves { code, stdout, stderr, json } (json = parsed stdout, or null). */
function inspector(args) {
  return new Promise((resolveRun) => {
    execFile(process.execPath, [INSPECTOR, "--cli", ...args], { cwd: INSPECTOR_CWD, timeout: 60000, maxBuffer: 16 << 20, env: { ...process.env } },
      (error, stdout, stderr) => {
        let json = null;
        try {
          json = JSON.parse(stdout);
        } catch {
          // left null: the assertions below show stdout and stderr
        }
        resolveRun({ code: error ? (error.code ?? 1) : 0, stdout, stderr, json });
      });
  });
}

function assertOk(run, what) {
  assert.equal(run.code, 0, `${what}: exit ${run.code}\nstdout: ${run.stdout.slice(-2000)}\nstderr: ${run.stderr.slice(-2000)}`);
  assert.ok(run.json, `${what}: stdout is not JSON: ${run.stdout.slice(0, 2000)}`);
}

function checkToolList(json) {
  const names = json.tools.map((tool) => tool.name);
  assert.ok(names.includes("execute_python") && names.includes("check_environment"), `tools: ${names}`);
  const ajv = makeAjv();
  for (const tool of json.tools) {
    assert.equal(tool.inputSchema.type, "object");
    if (tool.outputSchema) assert.ok(ajv.validateSchema(tool.outputSchema), `${tool.name}: ${ajv.errorsText(ajv.errors)}`);
  }
}

test("inspector (stdio): tools/list, tools/call, and no server left behind", async (t) => {
  const stateDir = makeStateDir(t);
  // The server's flags follow the binary; the state directory doubles as a marker in its argv.
  const server = [BINARY, ...serverArgs(stateDir)];

  const list = await inspector([...server, "--method", "tools/list"]);
  assertOk(list, "tools/list");
  checkToolList(list.json);

  const call = await inspector([...server, "--method", "tools/call", "--tool-name", "execute_python", "--tool-arg", "script=print(1)"]);
  assertOk(call, "tools/call print(1)");
  assert.equal(call.json.isError, false);
  assert.equal(call.json.structuredContent.stdout, "1\n");
  assert.match(call.json.content[0].text, /^--- stdout ---\n1\n/);

  // --tool-arg values are coerced through the input schema: timeout_seconds must arrive as an integer.
  const failing = await inspector([...server, "--method", "tools/call", "--tool-name", "execute_python",
    "--tool-arg", "script=import sys; print('x'); sys.exit(4)", "--tool-arg", "timeout_seconds=10"]);
  assertOk(failing, "tools/call exit 4"); // an isError result is still a successful call
  assert.equal(failing.json.isError, true);
  assert.equal(failing.json.structuredContent.exit_code, 4);

  const env = await inspector([...server, "--method", "tools/call", "--tool-name", "check_environment"]);
  assertOk(env, "tools/call check_environment");
  assert.match(env.json.content[0].text, /^Python version: /);

  assert.ok(await waitUntil(() => processesWithMarker(stateDir).length === 0, 10000),
    `server processes left after the Inspector exited: ${processesWithMarker(stateDir)}`);
});

test("inspector (http): tools/list and tools/call over Streamable HTTP and legacy SSE", async (t) => {
  const srv = await startHttpServer(t);
  if (!srv) return;
  const list = await inspector([srv.url.href, "--method", "tools/list"]);
  assertOk(list, "tools/list over Streamable HTTP");
  checkToolList(list.json);

  const call = await inspector([srv.url.href, "--transport", "http", "--method", "tools/call",
    "--tool-name", "execute_python", "--tool-arg", "script=print(1)"]);
  assertOk(call, "tools/call over Streamable HTTP");
  assert.equal(call.json.structuredContent.stdout, "1\n");

  const sse = await inspector([`${srv.origin}/sse`, "--transport", "sse", "--method", "tools/call",
    "--tool-name", "execute_python", "--tool-arg", "script=print(2)"]);
  assertOk(sse, "tools/call over legacy SSE");
  assert.equal(sse.json.structuredContent.stdout, "2\n");
});

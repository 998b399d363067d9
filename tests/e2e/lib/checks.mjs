// Assertions shared by the stdio and HTTP tests: the same calls must behave the same over
// every transport.
import assert from "node:assert/strict";

import { assertConforms, makeAjv } from "./harness.mjs";

/** The labels of check_environment's first nine lines, in the seed's order. */
export const SEED_ENV_LABELS = [
  "Python version", "uv", "Platform", "Sandbox backend", "Sandbox status",
  "Default timeout", "Max timeout", "Max output", "Cache warming",
];

/**
 * tools/list (following nextCursor), with the checks every tool must pass: a name, a
 * description, an object inputSchema, and an outputSchema that is a valid JSON schema with
 * an object root. Returns the tools by name.
 */
export async function listToolsChecked(client) {
  const ajv = makeAjv();
  const tools = new Map();
  let cursor;
  do {
    const page = await client.listTools(cursor ? { cursor } : {});
    for (const tool of page.tools) tools.set(tool.name, tool);
    cursor = page.nextCursor;
  } while (cursor);
  assert.deepEqual([...tools.keys()].filter((n) => ["execute_python", "check_environment"].includes(n)).sort(),
    ["check_environment", "execute_python"]);
  for (const tool of tools.values()) {
    assert.match(tool.name, /^[A-Za-z0-9_.-]{1,128}$/);
    assert.ok(typeof tool.description === "string" && tool.description.length > 0, `${tool.name}: no description`);
    assert.equal(tool.inputSchema?.type, "object", `${tool.name}: inputSchema.type`);
    assert.ok(ajv.validateSchema(tool.inputSchema), `${tool.name}: invalid inputSchema: ${ajv.errorsText(ajv.errors)}`);
    if (tool.outputSchema !== undefined) {
      assert.equal(tool.outputSchema.type, "object", `${tool.name}: outputSchema.type`);
      assert.ok(ajv.validateSchema(tool.outputSchema), `${tool.name}: invalid outputSchema: ${ajv.errorsText(ajv.errors)}`);
      assert.doesNotThrow(() => ajv.compile(tool.outputSchema), `${tool.name}: outputSchema does not compile`);
      // listTools() made the SDK compile a validator that callTool() will apply.
      assert.ok(client.getToolOutputValidator(tool.name), `${tool.name}: the SDK cached no output validator`);
    }
  }
  for (const name of ["execute_python", "check_environment"]) {
    assert.ok(tools.get(name).outputSchema, `${name} declares no outputSchema`);
  }
  return tools;
}

/**
 * callTool (which, after listTools, has the SDK validate structuredContent against the
 * tool's outputSchema and throw on a mismatch), then the same check again with our own Ajv.
 */
export async function callChecked(client, tools, name, args, options) {
  const result = await client.callTool({ name, arguments: args }, undefined, options);
  const tool = tools.get(name);
  if (tool.outputSchema && !result.isError) {
    assert.ok(result.structuredContent, `${name}: no structuredContent`);
  }
  if (tool.outputSchema && result.structuredContent) {
    assertConforms(makeAjv(), tool.outputSchema, result.structuredContent, `${name} structuredContent`);
  }
  return result;
}

/** A script that prints "line 0" .. "line 5", 0.3 s apart. */
export const SLOW_PRINT_SCRIPT = [
  "import time",
  "for i in range(6):",
  "    print(f'line {i}', flush=True)",
  "    time.sleep(0.3)",
].join("\n");

/** Runs SLOW_PRINT_SCRIPT with onprogress; returns the result, the notifications and when each came. */
export async function progressCall(client, tools) {
  const events = [];
  const result = await callChecked(client, tools, "execute_python", { script: SLOW_PRINT_SCRIPT }, {
    onprogress: (p) => events.push({ ...p, at: performance.now() }),
  });
  return { result, events, resultAt: performance.now() };
}

/** Progress grows, carries the output in order, and started before the script ended. */
export function checkProgress(events, resultAt, result) {
  assert.equal(result.isError, false);
  assert.ok(events.length >= 2, `expected streamed progress, got ${events.length} notification(s)`);
  for (let i = 1; i < events.length; i++) {
    assert.ok(events[i].progress > events[i - 1].progress, `progress went ${events[i - 1].progress} -> ${events[i].progress}`);
  }
  const streamed = events.map((e) => e.message ?? "").join("");
  let at = -1;
  for (let i = 0; i < 6; i++) {
    const next = streamed.indexOf(`line ${i}\n`);
    assert.ok(next > at, `"line ${i}" missing or out of order in the streamed output: ${JSON.stringify(streamed)}`);
    at = next;
  }
  // The script prints "line 5" 1.5 s after "line 0": a first notification without it was sent
  // while the script was still running, and it reached us before the result did.
  assert.ok(!(events[0].message ?? "").includes("line 5"), `the first notification holds the whole output: ${JSON.stringify(events[0])}`);
  assert.ok(events[0].at < resultAt, "the first progress notification arrived after the result");
  assert.equal(result.structuredContent.stdout, "line 0\nline 1\nline 2\nline 3\nline 4\nline 5\n");
}

// execute_python's MCP App (issue 23) as the Inspector 2.12.0 CLI finds it: with
// `--advertise-apps --app-info` it reports the app on execute_python (the ui:// resource it
// read, its MIME type); without --advertise-apps the server declares nothing, so the CLI finds
// no app. Over stdio (the handshake era) and Streamable HTTP in each of the CLI's eras.
import { test } from "node:test";
import assert from "node:assert/strict";

import { BINARY, makeStateDir, serverArgs, startHttpServer } from "../lib/harness.mjs";
import { inspector2 } from "../lib/modern.mjs";

const APP_URI = "ui://mcp-python-exec-sandbox/run.html";

// The CLI's report; it exits 2 (error code no_app) when the tool has no app.
async function appInfo(t, target, era, extra, { expectApp }) {
  const r = await inspector2(t, ["--protocol-era", era, "--connect-timeout", "30000", ...extra, "--app-info",
    "--method", "tools/call", "--tool-name", "execute_python", "--tool-args-json", JSON.stringify({ script: "print(1)" }),
    ...target]);
  const why = `exit ${r.code}\nstdout: ${r.stdout.slice(-2000)}\nstderr: ${r.stderr.slice(-2000)}`;
  if (expectApp) assert.equal(r.code, 0, why);
  else assert.ok(r.code === 2 && /"no_app"/.test(r.stderr), why);
  assert.ok(r.json, `stdout is not JSON: ${r.stdout.slice(0, 2000)}`);
  return r.json.appInfo ?? r.json;
}

for (const [transport, era] of [["stdio", "legacy"], ["http", "legacy"], ["http", "modern"]]) {
  test(`inspector 2.12.0 --app-info finds the app (${transport}, ${era})`, async (t) => {
    let target;
    if (transport === "http") {
      const srv = await startHttpServer(t);
      if (!srv) return;
      target = [srv.url.href, "--transport", "http"];
    } else {
      target = ["--transport", "stdio", "--", BINARY, ...serverArgs(makeStateDir(t))];
    }
    const info = await appInfo(t, target, era, ["--advertise-apps"], { expectApp: true });
    assert.equal(info.hasApp, true, JSON.stringify(info));
    assert.equal(info.toolName, "execute_python");
    assert.equal(info.resourceUri, APP_URI);
    assert.equal(info.resourceMimeType, "text/html;profile=mcp-app");
    assert.equal(info.resourceError, undefined, JSON.stringify(info));
    const none = await appInfo(t, target, era, [], { expectApp: false });
    assert.equal(none.hasApp, false, `an app was declared to a client that did not ask: ${JSON.stringify(none)}`);
  });
}

// execute_python's MCP App rendered headless: a stand-in host page frames the ui:// resource
// as hosts do (a sandboxed iframe, srcdoc, scripts only), answers its ui/initialize and sends
// it the arguments and the result of a real call, recorded from the server just before (kept
// beside the screenshots as app-result.json).  The app must show the output, the facts, the
// plot and the files, and ask for its size.
import { test } from "node:test";
import assert from "node:assert/strict";
import { mkdirSync, writeFileSync } from "node:fs";
import { join } from "node:path";

import { SHOTS, shot, startBrowser, startServer, TOKEN } from "./lib.mjs";

const APP_URI = "ui://mcp-python-exec-sandbox/run.html";
const UI_CAPS = { extensions: { "io.modelcontextprotocol/ui": { mimeTypes: ["text/html;profile=mcp-app"] } } };

// One stateless (2026-07-28) request to the server.
async function modern(server, method, params) {
  const body = { jsonrpc: "2.0", id: 1, method, params: { ...params, _meta: {
    "io.modelcontextprotocol/protocolVersion": "2026-07-28", "io.modelcontextprotocol/clientCapabilities": UI_CAPS } } };
  const headers = { "Content-Type": "application/json", Accept: "application/json", Authorization: `Bearer ${TOKEN}`,
    "MCP-Protocol-Version": "2026-07-28", "Mcp-Method": method };
  if (method === "tools/call") headers["Mcp-Name"] = params.name;
  if (method === "resources/read") headers["Mcp-Name"] = params.uri;
  const r = await fetch(server.url, { method: "POST", headers, body: JSON.stringify(body) });
  assert.equal(r.status, 200, await r.clone().text());
  const msg = await r.json();
  assert.ok(msg.result, JSON.stringify(msg));
  return msg.result;
}

const SCRIPT = [
  "import os, zlib, struct, sys",
  "os.makedirs('outputs', exist_ok=True)",
  "def chunk(k, d): return struct.pack('>I', len(d)) + k + d + struct.pack('>I', zlib.crc32(k + d))",
  "raw = b''.join(b'\\x00' + bytes([200, x * 8 % 256, 60]) * 48 for x in range(32))",
  "open('outputs/plot.png', 'wb').write(b'\\x89PNG\\r\\n\\x1a\\n' + chunk(b'IHDR', struct.pack('>IIBBBBB', 48, 32, 8, 2, 0, 0, 0)) + chunk(b'IDAT', zlib.compress(raw)) + chunk(b'IEND', b''))",
  "open('outputs/table.csv', 'w').write('a,b\\n1,2\\n')",
  "print('hello from the app')",
  "print('a warning', file=sys.stderr)",
].join("\n");

test("the MCP App renders a recorded result headless", async (t) => {
  const server = await startServer(t);
  const tools = await modern(server, "tools/list", {});
  const tool = tools.tools.find((x) => x.name === "execute_python");
  assert.equal(tool._meta.ui.resourceUri, APP_URI);
  const html = (await modern(server, "resources/read", { uri: APP_URI })).contents[0].text;
  const args = { script: SCRIPT };
  const result = await modern(server, "tools/call", { name: "execute_python", arguments: args });
  assert.equal(result.isError, false, JSON.stringify(result).slice(0, 2000));
  mkdirSync(SHOTS, { recursive: true });
  writeFileSync(join(SHOTS, "app-result.json"), JSON.stringify({ arguments: args, result }, null, 1));

  const browser = await startBrowser(t);
  const page = await browser.newPage({ viewport: { width: 720, height: 800 } });
  const errors = [];
  page.on("pageerror", (e) => errors.push(String(e)));
  page.on("request", (r) => {
    if (!r.url().startsWith("data:") && r.url() !== "about:blank" && !r.url().startsWith("about:")) errors.push("request to " + r.url());
  });
  const app = await frameApp(page, { html, args, result, hostCapabilities: {} });
  await app.locator("#state", { hasText: "finished" }).waitFor({ timeout: 15000 });
  assert.match(await app.locator("#console").textContent(), /hello from the app[\s\S]*a warning/);
  assert.equal(await app.locator('[data-fact="exit code"]').textContent(), "0");
  const img = app.locator('[data-testid="plot"]');
  await img.waitFor();
  assert.deepEqual(await img.evaluate((i) => new Promise((ok) => (i.complete ? ok([i.naturalWidth, i.naturalHeight]) : (i.onload = () => ok([i.naturalWidth, i.naturalHeight]))))), [48, 32]);
  assert.match(await app.locator("#files").textContent(), /outputs\/table\.csv/);
  assert.match(await app.locator("#script").textContent(), /hello from the app/);
  const seen = await page.evaluate(() => window.seen);
  for (const m of ["ui/initialize", "ui/notifications/initialized", "ui/notifications/size-changed"])
    assert.ok(seen.includes(m), `the app did not send ${m}: ${seen}`);
  // A host without downloadFile: the files are listed, with no download button.
  assert.equal(await app.locator("button[data-download]").count(), 0);
  await shot(page, "app");
  assert.deepEqual(errors, []);
});

test("the MCP App downloads a stored file through a host that offers it (ui/download-file)", async (t) => {
  const server = await startServer(t);
  const html = (await modern(server, "resources/read", { uri: APP_URI })).contents[0].text;
  const args = { script: SCRIPT };
  const result = await modern(server, "tools/call", { name: "execute_python", arguments: args });
  const csv = result.structuredContent.files.find((f) => f.path === "outputs/table.csv");
  assert.ok(csv?.uri, `table.csv has no URI: ${JSON.stringify(result.structuredContent.files)}`);

  const browser = await startBrowser(t);
  const page = await browser.newPage({ viewport: { width: 720, height: 800 } });
  const errors = [];
  page.on("pageerror", (e) => errors.push(String(e)));
  const app = await frameApp(page, { html, args, result, hostCapabilities: { downloadFile: {} } });
  await app.locator("#state", { hasText: "finished" }).waitFor({ timeout: 15000 });
  const stored = result.structuredContent.files.filter((f) => f.uri).map((f) => f.path).sort();
  const buttons = await app.locator("button[data-download]").evaluateAll((bs) => bs.map((b) => b.dataset.download).sort());
  assert.deepEqual(buttons, stored, "one button per stored file");
  // The first download is accepted, the second refused (a host's confirmation said no).
  const button = app.locator('button[data-download="outputs/table.csv"]');
  await button.click();
  await app.locator('button[data-download="outputs/table.csv"]', { hasText: "Downloaded" }).waitFor({ timeout: 10000 });
  await page.evaluate(() => { window.refuseDownloads = true; });
  await button.click();
  await app.locator('button[data-download="outputs/table.csv"]', { hasText: "Download refused" }).waitFor({ timeout: 10000 });
  const asked = await page.evaluate(() => window.downloads);
  assert.equal(asked.length, 2);
  assert.deepEqual(asked[0], { contents: [{ type: "resource_link", uri: csv.uri, name: "table.csv", mimeType: csv.mime_type, size: csv.size }] });
  // What the host then does with the link: resources/read, which gives the file.
  const read = await modern(server, "resources/read", { uri: asked[0].contents[0].uri });
  const c = read.contents[0];
  assert.equal(c.text ?? Buffer.from(c.blob, "base64").toString(), "a,b\n1,2\n");
  await shot(page, "app-download");
  assert.deepEqual(errors, []);
});

test("the MCP App gives the host a file name a script chose as a plain name only", async (t) => {
  const server = await startServer(t);
  const html = (await modern(server, "resources/read", { uri: APP_URI })).contents[0].text;
  // Backslashes (a separator on Windows), markup, a bidi override (RLO: "gnp.exe" reads
  // "exe.png"), a C1 control (NEL), a leading dot and a trailing space: all valid on Linux.
  const nasty = "..\\..\\<img src=x onerror=alert(1)>\u202egnp.exe\u0085 ";
  const args = { script: `import os\nos.makedirs('outputs', exist_ok=True)\nopen('outputs/' + ${JSON.stringify(nasty)}, 'w').write('x')\n` };
  const result = await modern(server, "tools/call", { name: "execute_python", arguments: args });
  // The server reports the name escaped (issue 31: no control, format or bidi character
  // reaches a reader raw; a backslash doubled so that distinct names stay distinct).
  const shown = nasty.replace(/\\/g, "\\\\").replace(/\u202e/g, "\\u{202e}").replace(/\u0085/g, "\\u{0085}");
  const file = result.structuredContent.files.find((f) => f.path === "outputs/" + shown);
  assert.ok(file?.uri, `the file was not stored: ${JSON.stringify(result.structuredContent.files)}`);

  const browser = await startBrowser(t);
  const page = await browser.newPage({ viewport: { width: 720, height: 800 } });
  const errors = [];
  page.on("pageerror", (e) => errors.push(String(e)));
  page.on("dialog", (d) => { errors.push("dialog " + d.message()); d.dismiss(); });
  const app = await frameApp(page, { html, args, result, hostCapabilities: { downloadFile: {} } });
  await app.locator("#state", { hasText: "finished" }).waitFor({ timeout: 15000 });
  // Shown as text, never as markup.
  assert.equal(await app.locator("#files img").count(), 0);
  assert.ok((await app.locator("#files").textContent()).includes(shown));
  await app.locator("button[data-download]").click();
  await app.locator("button[data-download]", { hasText: "Downloaded" }).waitFor({ timeout: 10000 });
  const asked = await page.evaluate(() => window.downloads);
  assert.equal(asked.length, 1);
  assert.equal(asked[0].contents[0].uri, file.uri);
  assert.equal(asked[0].contents[0].name, "__..___img src=x onerror=alert(1)__u{202e}gnp.exe_u{0085}");
  assert.deepEqual(errors, []);
});

/**
 * The host: the app in a sandboxed frame of an opaque origin, and the host's side of the
 * protocol (ui/initialize with hostCapabilities, then the call's input and result; a
 * ui/download-file is recorded in window.downloads and accepted unless
 * window.refuseDownloads).  Returns the frame's locator.
 */
async function frameApp(page, { html, args, result, hostCapabilities }) {
  await page.setContent(`<!doctype html><body style="margin:0;font-family:sans-serif">
    <iframe id="app" sandbox="allow-scripts" style="width:100%;height:760px;border:1px solid #ccc"></iframe></body>`);
  await page.evaluate(({ html, args, result, hostCapabilities }) => {
    window.seen = [];
    window.downloads = [];
    const frame = document.getElementById("app");
    window.addEventListener("message", (ev) => {
      if (ev.source !== frame.contentWindow) return;
      const m = ev.data;
      window.seen.push(m.method || "response");
      const reply = (x) => frame.contentWindow.postMessage(Object.assign({ jsonrpc: "2.0" }, x), "*");
      if (m.method === "ui/initialize") {
        reply({ id: m.id, result: { protocolVersion: "2026-01-26", hostInfo: { name: "test-host", version: "0" },
          hostCapabilities, hostContext: { theme: "light", displayMode: "inline" } } });
      } else if (m.method === "ui/notifications/initialized") {
        reply({ method: "ui/notifications/tool-input", params: { arguments: args } });
        reply({ method: "ui/notifications/tool-result", params: result });
      } else if (m.method === "ui/download-file") {
        window.downloads.push(m.params);
        reply({ id: m.id, result: window.refuseDownloads ? { isError: true } : {} });
      }
    });
    frame.srcdoc = html;
  }, { html, args, result, hostCapabilities });
  return page.frameLocator("#app");
}

// Helpers of the browser tests: the server binary on a free loopback port (with a token file),
// and Debian's chromium under playwright-core, started with the flags of the closed network
// (no background traffic, no GPU, a fresh profile), never a browser playwright downloads.
import { mkdirSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { dirname, join, resolve } from "node:path";
import { fileURLToPath } from "node:url";
import assert from "node:assert/strict";

import { chromium } from "playwright-core";

import { canConnect, freePort, sleep, waitUntil } from "../lib/net.mjs";
import { assertNoSanitizerReport, spawnServer } from "../lib/server.mjs";

export const HERE = dirname(fileURLToPath(import.meta.url));
export const ROOT = resolve(HERE, "..", "..");
export const BINARY = resolve(process.env.MPS_BINARY || join(ROOT, "build", "mcp-python-exec-sandbox"));
export const BACKEND = process.env.MPS_TEST_BACKEND || "none";
export const CHROMIUM = process.env.MPS_CHROMIUM || "/usr/bin/chromium";
// Screenshots, kept as CI artifacts: <build>/browser-screenshots/ beside the binary.
export const SHOTS = process.env.MPS_SCREENSHOT_DIR || join(dirname(BINARY), "browser-screenshots");

export { sleep, waitUntil };

export const TOKEN = "browser-test-token-0123456789abcdef";

/** The server over HTTP with one token ("alice"); operator is the principal that may read
 * /metrics (the status view's charts): alice unless told (null: nobody).  Stopped (and its
 * state removed) at test end. */
export async function startServer(t, extra = [], { operator = "alice" } = {}) {
  const dir = mkdtempSync(join(tmpdir(), "mps-browser-"));
  const tokens = join(dir, "tokens");
  writeFileSync(tokens, `alice:${TOKEN}\n`, { mode: 0o600 });
  const port = await freePort();
  const argv = ["--sandbox-backend", BACKEND, "--state-dir", join(dir, "state"), "--transport", "http",
    "--host", "127.0.0.1", "--port", String(port), "--auth-token-file", tokens,
    ...(operator ? ["--metrics-token", operator] : []), ...extra];
  const server = spawnServer(BINARY, argv);
  const stop = async () => {
    await server.stop();
    rmSync(dir, { recursive: true, force: true });
    assertNoSanitizerReport(server.log());
  };
  t.after(stop);
  const ready = await waitUntil(async () => server.exit() !== null || (await canConnect(port)), 15000, 50);
  assert.ok(ready && server.exit() === null, `the server did not listen on ${port}:\n${server.log().slice(-3000)}`);
  const origin = `http://127.0.0.1:${port}`;
  return { origin, url: origin + "/mcp", port, proc: server.proc, log: server.log, stop };
}

/** Chromium, headless, with a fresh profile; closed at test end. */
export async function startBrowser(t) {
  // launch() gives every browser a new empty profile of its own (and removes it).
  const browser = await chromium.launch({
    executablePath: CHROMIUM,
    headless: true,
    args: ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking",
      "--disable-component-update", "--disable-sync"],
  });
  t.after(() => browser.close());
  return browser;
}

export async function shot(page, name) {
  mkdirSync(SHOTS, { recursive: true });
  await page.screenshot({ path: join(SHOTS, name + ".png"), fullPage: true });
}

/** The server's /metrics value of a family (summed over labels), with the token. */
export async function metric(server, name) {
  const r = await fetch(server.origin + "/metrics", { headers: { Authorization: `Bearer ${TOKEN}` } });
  const text = await r.text();
  let sum = 0;
  for (const line of text.split("\n")) {
    const m = /^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})?\s+(\S+)/.exec(line);
    if (m && m[1] === name) sum += Number(m[3]);
  }
  return sum;
}

export { readFileSync };

// The playground page (issue 23) in headless Chromium: a token, a streamed run, a plot, a
// download, a cancel that stops the script, a session that keeps a variable, a wrong token.
import { test } from "node:test";
import assert from "node:assert/strict";

import { execFileSync } from "node:child_process";
import { chmodSync, existsSync, mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { dirname, join } from "node:path";

import { BINARY, ROOT, metric, readFileSync, shot, startBrowser, startServer, TOKEN, waitUntil } from "./lib.mjs";

async function openPage(t, server, { token = TOKEN, width = 1280 } = {}) {
  const browser = await startBrowser(t);
  const context = await browser.newContext({ acceptDownloads: true, viewport: { width, height: 900 } });
  const page = await context.newPage();
  const problems = [];
  page.on("pageerror", (e) => problems.push(String(e)));
  // Nothing may leave for another origin (the page's CSP says so; this checks it).
  page.on("request", (r) => {
    if (!r.url().startsWith(server.origin) && !r.url().startsWith("data:") && !r.url().startsWith("blob:"))
      problems.push("request to " + r.url());
  });
  await page.goto(server.url + "/ui");
  await page.waitForSelector("#token-box:not([hidden])");
  await page.fill("#token", token);
  await page.click("#token-form button[type=submit]");
  return { page, problems };
}

async function setScript(page, text) {
  // The editor is CodeMirror when the bundle was built, a textarea otherwise.
  await page.evaluate((t) => window.__mpsEditorSet(t), text);
}

test("the page: stream, plot, download, cancel, session, token", async (t) => {
  const server = await startServer(t);
  const { page, problems } = await openPage(t, server);
  await page.waitForSelector("#token-box", { state: "hidden" });
  assert.equal(await page.evaluate(() => sessionStorage.getItem("mps-token")), TOKEN);
  if (existsSync(join(dirname(BINARY), "mps-ui", "editor.js")))
    assert.ok(await page.$("#editor-host .cm-editor"), "the editor bundle is built but the page has no CodeMirror");
  assert.ok(!page.url().includes(TOKEN), "the token is in the URL");

  await t.test("lines stream before the end of the run", async () => {
    await setScript(page, "import sys, time\nprint('warn early', file=sys.stderr, flush=True)\nfor i in range(4):\n    print(f'line {i}', flush=True)\n    time.sleep(0.6)\nprint('end')\n");
    await page.keyboard.press("Control+Enter").catch(() => {});
    await page.click("#run").catch(() => {}); // Ctrl-Enter outside the editor is the same; a second run is ignored
    await page.waitForFunction(() => document.getElementById("console").textContent.includes("line 0"), null, { timeout: 60000 });
    const early = await page.evaluate(() => ({ text: document.getElementById("console").textContent, state: document.getElementById("run-state").textContent }));
    assert.equal(early.state, "running", "line 0 was shown only after the run ended");
    assert.ok(!early.text.includes("end"));
    // stderr streams too (in the same progress stream, marked as stderr), shown apart.
    await page.waitForFunction(() => [...document.querySelectorAll("#console .err")].some((e) => e.textContent.includes("warn early")), null, { timeout: 10000 });
    assert.equal(await page.textContent("#run-state"), "running");
    await page.waitForFunction(() => document.getElementById("run-state").textContent === "finished", null, { timeout: 60000 });
    const text = await page.textContent("#console");
    assert.match(text, /line 3[\s\S]*end/);
    assert.equal(await page.textContent('[data-fact="exit code"]'), "0");
    for (const f of ["duration", "CPU"]) assert.ok(await page.$(`[data-fact="${f}"]`), f + " is not shown");
    await shot(page, "page-run");
  });

  await t.test("a plot shows as an image and a file downloads", async () => {
    // A plot without matplotlib (no package index here): a sine curve as a PNG, by hand.
    await setScript(page, [
      "import math, os, struct, zlib",
      "W, H = 400, 200",
      "px = [[(255, 255, 255)] * W for _ in range(H)]",
      "for x in range(W):",
      "    px[H // 2][x] = (200, 200, 200)",
      "    for k, col in ((1, (43, 108, 176)), (2, (221, 107, 32))):",
      "        y = int(H / 2 - math.sin(x / W * 2 * math.pi * k) * (H / 2 - 12) / k)",
      "        for dy in (-1, 0, 1):",
      "            px[y + dy][x] = col",
      "raw = b''.join(b'\\x00' + bytes(c for p in row for c in p) for row in px)",
      "def chunk(k, d): return struct.pack('>I', len(d)) + k + d + struct.pack('>I', zlib.crc32(k + d))",
      "png = b'\\x89PNG\\r\\n\\x1a\\n' + chunk(b'IHDR', struct.pack('>IIBBBBB', W, H, 8, 2, 0, 0, 0)) + chunk(b'IDAT', zlib.compress(raw)) + chunk(b'IEND', b'')",
      "os.makedirs('outputs', exist_ok=True)",
      "open('outputs/sine.png', 'wb').write(png)",
      "open('outputs/data.bin', 'wb').write(bytes(range(256)) * 4)",
      "print('wrote outputs/sine.png and outputs/data.bin')",
    ].join("\n"));
    await page.click("#run");
    await page.waitForFunction(() => document.getElementById("run-state").textContent === "finished", null, { timeout: 60000 });
    const img = await page.waitForSelector('[data-testid="plot"]');
    const size = await img.evaluate((i) => new Promise((ok) => (i.complete ? ok([i.naturalWidth, i.naturalHeight]) : (i.onload = () => ok([i.naturalWidth, i.naturalHeight])))));
    assert.deepEqual(size, [400, 200]);
    const button = page.locator('[data-testid="download"]', { hasText: "data.bin" });
    const [dl] = await Promise.all([page.waitForEvent("download"), button.click()]);
    assert.equal(dl.suggestedFilename(), "data.bin");
    const bytes = readFileSync(await dl.path());
    assert.equal(bytes.length, 1024);
    assert.equal(bytes[255], 255);
    await shot(page, "page-plot");
  });

  await t.test("an attached file reaches the script", async () => {
    await page.setInputFiles("#files", { name: "input.csv", mimeType: "text/csv", buffer: Buffer.from("a,b\n1,2\n3,4\n") });
    await setScript(page, "import csv\nrows = list(csv.DictReader(open('input.csv')))\nprint('sum of b =', sum(int(r['b']) for r in rows))");
    await page.click("#run");
    await page.waitForFunction(() => document.getElementById("run-state").textContent === "finished", null, { timeout: 60000 });
    assert.match(await page.textContent("#console"), /sum of b = 6/);
    await page.setInputFiles("#files", []);
  });

  await t.test("cancel stops the script", async () => {
    await setScript(page, "import time\nfor i in range(600):\n    print('tick', i, flush=True)\n    time.sleep(0.1)\n");
    await page.click("#run");
    await page.waitForFunction(() => document.getElementById("console").textContent.includes("tick 2"), null, { timeout: 60000 });
    assert.ok((await metric(server, "mcp_sandbox_executions_running")) >= 1);
    await page.click("#cancel");
    await page.waitForFunction(() => document.getElementById("run-state").textContent === "cancelled", null, { timeout: 10000 });
    assert.ok(await waitUntil(async () => (await metric(server, "mcp_sandbox_executions_running")) === 0, 15000),
      "the run still holds its slot after the cancel");
    const shown = await page.textContent("#console");
    await new Promise((r) => setTimeout(r, 500));
    assert.equal(await page.textContent("#console"), shown, "output still arrives after the cancel");
  });

  await t.test("a session keeps a variable across two runs", async () => {
    await page.selectOption("#session", "new");
    await setScript(page, "answer = 41\nprint('set')");
    await page.click("#run");
    await page.waitForFunction(() => document.getElementById("run-state").textContent === "finished", null, { timeout: 90000 });
    const sid = await page.inputValue("#session");
    assert.match(sid, /^[A-Za-z0-9_-]+$/);
    assert.notEqual(sid, "new");
    await setScript(page, "print(answer + 1)");
    await page.click("#run");
    await page.waitForFunction(() => document.getElementById("run-state").textContent === "finished", null, { timeout: 60000 });
    assert.match(await page.textContent("#console"), /42/);
    // The status view lists it; closing it there ends it.
    await page.click("#tab-status");
    await page.waitForSelector(`#sessions [data-session="${sid}"]`, { timeout: 20000 });
    await page.waitForSelector("#interpreters tbody tr");
    // This token's runs, from the server's memory of them (newest first).
    await page.waitForFunction(() => /execute_python/.test(document.querySelector("#recent tbody").textContent), null, { timeout: 20000 });
    assert.match(await page.textContent("#recent tbody tr:first-child"), /execute_python\s*ok/);
    await page.waitForFunction(() => document.querySelectorAll("#charts figure").length > 0, null, { timeout: 20000 });
    await page.waitForTimeout(4500); // two more samples, so the charts draw a line
    await shot(page, "status");
    await page.click(`#sessions [data-session="${sid}"]`);
    await page.waitForSelector(`#sessions [data-session="${sid}"]`, { state: "detached", timeout: 20000 });
    await page.click("#tab-run");
  });

  await t.test("phone width", async () => {
    await page.setViewportSize({ width: 390, height: 844 });
    const overflow = await page.evaluate(() => document.documentElement.scrollWidth - window.innerWidth);
    assert.ok(overflow <= 1, `the page is ${overflow}px wider than a phone screen`);
    await shot(page, "page-phone");
    await page.setViewportSize({ width: 1280, height: 900 });
  });

  assert.deepEqual(problems, []);
});

test("a wrong token is refused with a clear message", async (t) => {
  const server = await startServer(t);
  const { page, problems } = await openPage(t, server, { token: "not-the-token" });
  await page.waitForFunction(() => /refused the token/.test(document.getElementById("banner").textContent), null, { timeout: 20000 });
  assert.equal(await page.isVisible("#token-box"), true);
  assert.match(await page.textContent("#conn"), /token refused/);
  await shot(page, "page-wrong-token");
  assert.deepEqual(problems, []);
});

test("for a token that is not an operator's the status view says the charts are not for it", async (t) => {
  // /metrics shows every tenant's activity: with tokens only --metrics-token's principals read it.
  const server = await startServer(t, [], { operator: null });
  const { page, problems } = await openPage(t, server);
  await page.waitForSelector("#token-box", { state: "hidden" });
  await page.click("#tab-status");
  await page.waitForFunction(() => /only the server's operators may read/.test(document.getElementById("charts").textContent), null, { timeout: 20000 });
  // The rest of the view (the caller's own) is there, and no error banner.
  await page.waitForSelector("#interpreters tbody tr");
  assert.equal(await page.$$eval("#charts figure", (f) => f.length), 0);
  assert.doesNotMatch(await page.textContent("#banner"), /metrics/);
  await shot(page, "status-not-operator");
  assert.deepEqual(problems, []);
});

test("the page says when the server has gone", async (t) => {
  const server = await startServer(t);
  const { page } = await openPage(t, server);
  await page.waitForSelector("#token-box", { state: "hidden" });
  await server.stop();
  await page.click("#run");
  await page.waitForFunction(() => /not answering/.test(document.getElementById("banner").textContent), null, { timeout: 20000 });
  assert.match(await page.textContent("#conn"), /unreachable/);
});

test("without the editor bundle the page runs with a textarea, and says so", async (t) => {
  const server = await startServer(t);
  const browser = await startBrowser(t);
  const page = await browser.newPage();
  // As a build without npm serves it: editor.js is a 404.
  await page.route("**/ui/editor.js", (route) => route.fulfill({ status: 404, body: "" }));
  await page.goto(server.url + "/ui");
  await page.fill("#token", TOKEN);
  await page.click("#token-form button[type=submit]");
  await page.waitForSelector("#token-box", { state: "hidden" });
  assert.equal(await page.evaluate(() => document.querySelector("#editor-host textarea") !== null), true);
  assert.match(await page.textContent("#editor-note"), /Plain text editor/);
  await page.fill("#editor-host textarea", "print(6 * 7)");
  await page.focus("#editor-host textarea");
  await page.keyboard.press("Control+Enter");
  await page.waitForFunction(() => document.getElementById("run-state").textContent === "finished", null, { timeout: 60000 });
  assert.match(await page.textContent("#console"), /42/);
});

test("the status view lists your environments and evicts one", async (t) => {
  // A local wheelhouse (tests/fixtures/wheelhouse.py): there is no package index here.
  const wheels = mkdtempSync(join(tmpdir(), "mps-browser-wheels-"));
  t.after(() => rmSync(wheels, { recursive: true, force: true }));
  chmodSync(wheels, 0o755);
  execFileSync("/usr/bin/python3", ["-c", "import sys; sys.path.insert(0, sys.argv[1]); import wheelhouse; wheelhouse.build_synthetic(sys.argv[2])",
    join(ROOT, "tests", "fixtures"), wheels]);
  const server = await startServer(t, ["--find-links", wheels, "--offline"]);
  const { page, problems } = await openPage(t, server);
  await page.waitForSelector("#token-box", { state: "hidden" });
  await setScript(page, "import mps_gamma\nprint('imported')");
  await page.fill("#deps", "mps-gamma");
  await page.click("#run");
  await page.waitForFunction(() => document.getElementById("run-state").textContent === "finished", null, { timeout: 120000 });
  assert.match(await page.textContent("#console"), /imported/);
  await page.click("#tab-status");
  const row = page.locator("#environments tbody tr", { hasText: "mps-gamma" });
  await row.waitFor({ timeout: 20000 });
  await page.waitForTimeout(4500); // a few samples for the charts
  await shot(page, "status-environments");
  await row.locator("button[data-env]").click();
  await page.waitForFunction(() => /None: your calls/.test(document.querySelector("#environments tbody").textContent), null, { timeout: 20000 });
  assert.deepEqual(problems, []);
});

// The console's lines as [stream, text] (a line's pieces joined), from its spans.
async function consoleLines(page) {
  return page.evaluate(() => {
    const lines = [];
    let open = false;
    for (const s of document.querySelectorAll("#console span")) {
      if (open && lines[lines.length - 1][0] === s.dataset.stream) lines[lines.length - 1][1] += s.textContent;
      else lines.push([s.dataset.stream, s.textContent]);
      open = !s.textContent.endsWith("\n");
    }
    return lines;
  });
}

test("the console: each line once, in the order printed, marked by stream, live and at the end", async (t) => {
  const server = await startServer(t);
  const { page, problems } = await openPage(t, server);
  await page.waitForSelector("#token-box", { state: "hidden" });
  // stdout and stderr are two pipes: each print waits until the server has read it (its pipe
  // is empty), so the order the server sees is the one printed.  Then the script waits a
  // little, so that the live view is seen complete before the result.
  await setScript(page, [
    "import fcntl, struct, sys, termios, time",
    "def put(text, f):",
    "    print(text, file=f, flush=True)",
    "    while struct.unpack('i', fcntl.ioctl(f.fileno(), termios.FIONREAD, b'0000'))[0]:",
    "        time.sleep(0.001)",
    "put('out 1', sys.stdout)",
    "put('err 1', sys.stderr)",
    "put('err 2', sys.stderr)",
    "put('out 2', sys.stdout)",
    "put('err 3', sys.stderr)",
    "put('out 3', sys.stdout)",
    "time.sleep(1)",
  ].join("\n"));
  const want = [["stdout", "out 1\n"], ["stderr", "err 1\n"], ["stderr", "err 2\n"], ["stdout", "out 2\n"],
    ["stderr", "err 3\n"], ["stdout", "out 3\n"]];
  // What the console held while the run-state said "running", last seen.
  await page.evaluate(() => {
    window.__liveLines = null;
    new MutationObserver(() => {
      if (document.getElementById("run-state").textContent !== "running") return;
      window.__liveLines = [...document.querySelectorAll("#console span")].map((s) => [s.dataset.stream, s.textContent]);
    }).observe(document.getElementById("console"), { childList: true, subtree: true, characterData: true });
  });
  await page.click("#run");
  await page.waitForFunction(() => document.getElementById("run-state").textContent === "finished", null, { timeout: 60000 });
  assert.deepEqual(await consoleLines(page), want);
  const live = await page.evaluate(() => window.__liveLines);
  assert.ok(live, "nothing was shown while the script ran");
  assert.deepEqual(live, await page.evaluate(() => [...document.querySelectorAll("#console span")].map((s) => [s.dataset.stream, s.textContent])),
    "the end redrew the console");
  // stderr lines carry the marker besides the colour.
  assert.equal(await page.$$eval("#console span.err.bol", (s) => s.length), 3);
  assert.match(await page.textContent("#console-legend"), /stderr in red/);
  await shot(page, "page-order");

  await t.test("an incomplete stream: the result's texts, and the page says the order is lost", async () => {
    // Beyond the progress rate (a burst, then 20 messages a second) output is skipped in
    // progress; the result keeps head and tail.
    await setScript(page, "import sys\nfor i in range(3000):\n    print('o' * 100, i, flush=True)\n    print('e', i, file=sys.stderr, flush=True)\n");
    await page.click("#run");
    await page.waitForFunction(() => document.getElementById("run-state").textContent === "finished", null, { timeout: 60000 });
    const lines = await consoleLines(page);
    assert.equal(lines[0][0], "note");
    assert.match(lines[0][1], /order between them is not known/);
    const streams = lines.slice(1).map((l) => l[0]);
    assert.equal(streams.indexOf("stderr"), streams.lastIndexOf("stdout") + 1, "not stdout, then stderr");
  });

  await t.test("a session call shows – for the CPU time and memory it does not measure", async () => {
    await page.selectOption("#session", "new");
    await setScript(page, "print('in a session')");
    await page.click("#run");
    await page.waitForFunction(() => document.getElementById("run-state").textContent === "finished", null, { timeout: 90000 });
    assert.equal(await page.textContent('[data-fact="CPU"]'), "–");
    assert.equal(await page.textContent('[data-fact="peak memory"]'), "–");
    await page.selectOption("#session", "");
  });

  await t.test("a failed run's state is red", async () => {
    await setScript(page, "raise SystemExit(3)");
    await page.click("#run");
    await page.waitForFunction(() => document.getElementById("run-state").textContent === "failed", null, { timeout: 60000 });
    const colour = await page.$eval("#run-state", (e) => getComputedStyle(e).backgroundColor);
    assert.equal(colour, "rgb(197, 48, 48)");
    assert.match(await page.getAttribute("#run-state", "class"), /\bbad\b/);
  });
  assert.deepEqual(problems, []);
});

// Where the keyboard focus is: the id of the focused element, or its data-testid.
const focused = (page) => page.evaluate(() => document.activeElement.id || document.activeElement.dataset.testid || document.activeElement.tagName);

test("the keyboard: Tab indents in the editor, Escape then Tab leaves it, and the page says so", async (t) => {
  const server = await startServer(t);
  for (const kind of ["plain", "codemirror"]) {
    if (kind === "codemirror" && !existsSync(join(dirname(BINARY), "mps-ui", "editor.js"))) {
      t.diagnostic("no editor bundle in this build (ui/build.sh makes it): CodeMirror's keyboard not checked");
      continue;
    }
    const browser = await startBrowser(t);
    const page = await browser.newPage();
    if (kind === "plain") await page.route("**/ui/editor.js", (route) => route.fulfill({ status: 404, body: "" }));
    await page.goto(server.url + "/ui");
    await page.fill("#token", TOKEN);
    await page.click("#token-form button[type=submit]");
    await page.waitForSelector("#token-box", { state: "hidden" });
    await setScript(page, "x = 1");
    const box = kind === "plain" ? "#editor-host textarea" : "#editor-host .cm-content";
    assert.ok(await page.$(box), kind + ": no editor");
    assert.match(await page.textContent("#editor-keys"), /Escape, then Tab/);
    assert.equal(await page.getAttribute(box, "aria-describedby"), "editor-keys");
    await page.click(box);
    await page.keyboard.press("End");
    await page.keyboard.press("Tab");
    assert.equal(await focused(page), kind === "plain" ? "script" : "editor", kind + ": Tab left the editor");
    const text = await page.evaluate(() => (document.querySelector("#editor-host textarea") || document.querySelector("#editor-host .cm-content")).value ??
      document.querySelector("#editor-host .cm-content").textContent);
    // (the textarea inserts four spaces at the cursor; CodeMirror indents the line)
    assert.ok(text !== "x = 1" && text.trim() === "x = 1", kind + ": Tab did not indent: " + JSON.stringify(text));
    await page.keyboard.press("Escape");
    await page.keyboard.press("Tab");
    assert.equal(await focused(page), "python", kind + ": Escape then Tab did not move on to the next field");
    await page.keyboard.press("Shift+Tab");
    await page.keyboard.press("Escape");
    await page.keyboard.press("Shift+Tab");
    assert.notEqual(await focused(page), kind === "plain" ? "script" : "editor", kind + ": Escape then Shift-Tab stayed");
    await shot(page, "page-keyboard-" + kind);
  }
});

test("dependency builds: each message on a line of its own; a failed build leads with a one-line summary", async (t) => {
  const wheels = mkdtempSync(join(tmpdir(), "mps-browser-wheels-"));
  t.after(() => rmSync(wheels, { recursive: true, force: true }));
  chmodSync(wheels, 0o755);
  execFileSync("/usr/bin/python3", ["-c", "import sys; sys.path.insert(0, sys.argv[1]); import wheelhouse; wheelhouse.build_synthetic(sys.argv[2])",
    join(ROOT, "tests", "fixtures"), wheels]);
  const server = await startServer(t, ["--find-links", wheels, "--offline"]);
  const { page, problems } = await openPage(t, server);
  await page.waitForSelector("#token-box", { state: "hidden" });
  await setScript(page, "import mps_gamma\nprint('imported')");
  await page.fill("#deps", "mps-gamma");
  await page.click("#run");
  await page.waitForFunction(() => document.getElementById("run-state").textContent === "finished", null, { timeout: 120000 });
  const lines = await consoleLines(page);
  const notes = lines.filter((l) => l[0] === "note");
  assert.ok(notes.length >= 2, "no build messages: " + JSON.stringify(lines));
  for (const [, text] of notes) assert.ok(text.endsWith("\n") && text.indexOf("\n") === text.length - 1, "a message not on a line of its own: " + JSON.stringify(text));
  assert.deepEqual(lines[lines.length - 1], ["stdout", "imported\n"]);

  await page.fill("#deps", "mps-no-such-package");
  await setScript(page, "print('never')");
  await page.click("#run");
  await page.waitForFunction(() => document.getElementById("run-state").textContent === "failed", null, { timeout: 120000 });
  const first = await page.$eval("#console .summary", (s) => s.textContent);
  assert.equal(await page.$eval("#console span", (s) => s.className), "summary bol", "the summary is not first");
  assert.equal(first.trim().split("\n").length, 1);
  assert.match(first, /mps-no-such-package/i);
  await shot(page, "page-build-failed");
  assert.deepEqual(problems, []);
});

// The playground page (transport/http/ui.c serves it): an MCP client of the endpoint that
// served it, in the stateless protocol revision 2026-07-28 (every request a POST of its own,
// no handshake, no Mcp-Session-Id), so that a reload, a second tab or a server restart needs
// nothing re-established.  A run is one tools/call whose answer streams as SSE: stdout and
// stderr come as notifications/progress in the order printed, each message's _meta saying
// which of its text is which stream (no logLevel: notifications/message would repeat stderr);
// closing the request (AbortController) is its cancellation.  Python sessions are execute_python's own
// (session: "new" / an id), kept by the server for the token, not by the connection.
"use strict";

const PROTOCOL = "2026-07-28";
const BASE = document.querySelector('meta[name="mps-base"]').content;
// What is under the endpoint (its files, this page's assets): no "//" when the endpoint is "/".
const PREFIX = BASE.replace(/\/+$/, "");
const TOKEN_KEY = "mps-token";
// A progress message's runs by stream (server/exec/progress.c): [[stream, UTF-16 length], ...].
const STREAMS_META = "mcp-python-exec-sandbox/streams";
const $ = (id) => document.getElementById(id);

let nextId = 1;
let editor = null;
let running = null; // { controller }
let interpretersLoaded = false;

class HttpError extends Error {
  constructor(status, message) {
    super(message);
    this.status = status;
  }
}

// ------------------------------------------------------------------ the token

function token() {
  return sessionStorage.getItem(TOKEN_KEY) || "";
}

function showTokenBox(why) {
  $("token-box").hidden = false;
  if (why) banner(why);
  $("token").focus();
}

// ------------------------------------------------------------------ MCP over HTTP

// One request; resolves with its result, rejects with an Error (HttpError for the
// transport's refusals).  onNotify gets every notification of the stream.
async function rpc(method, params, { onNotify, signal, logLevel, progress } = {}) {
  const id = nextId++;
  const meta = {
    "io.modelcontextprotocol/protocolVersion": PROTOCOL,
    "io.modelcontextprotocol/clientCapabilities": {},
    "io.modelcontextprotocol/clientInfo": { name: "mps-playground", version: "1" },
  };
  if (logLevel) meta["io.modelcontextprotocol/logLevel"] = logLevel;
  if (progress) meta.progressToken = "page-" + id;
  const p = Object.assign({}, params || {});
  p._meta = Object.assign({}, p._meta || {}, meta);
  const headers = {
    "Content-Type": "application/json",
    Accept: "application/json, text/event-stream",
    "MCP-Protocol-Version": PROTOCOL,
    "Mcp-Method": method,
  };
  if (method === "tools/call") headers["Mcp-Name"] = p.name;
  if (method === "resources/read") headers["Mcp-Name"] = p.uri;
  const t = token();
  if (t) headers.Authorization = "Bearer " + t;
  let resp;
  try {
    resp = await fetch(BASE, {
      method: "POST",
      headers,
      body: JSON.stringify({ jsonrpc: "2.0", id, method, params: p }),
      signal,
      cache: "no-store",
    });
  } catch (e) {
    if (signal && signal.aborted) throw e;
    connState(false, "server unreachable");
    throw new HttpError(0, "The server is not answering (it stopped, or the network is down): " + e.message);
  }
  connState(true);
  if (resp.status === 401) {
    connState(false, "token refused");
    throw new HttpError(401, "The server refused the token (401 Unauthorized): paste a valid bearer token.");
  }
  const type = resp.headers.get("Content-Type") || "";
  if (!resp.ok && !type.startsWith("text/event-stream")) {
    let msg = resp.status + " " + resp.statusText;
    try {
      const j = await resp.json();
      if (j.error && j.error.message) msg += ": " + j.error.message;
    } catch (_) { /* not JSON */ }
    throw new HttpError(resp.status, msg);
  }
  if (type.startsWith("application/json")) return answer(await resp.json());
  if (!type.startsWith("text/event-stream")) throw new Error("Unexpected answer: " + type);
  // Server-sent events: the notifications, then the response.
  const reader = resp.body.getReader();
  const dec = new TextDecoder();
  let buf = "";
  for (;;) {
    let chunk;
    try {
      chunk = await reader.read();
    } catch (e) {
      if (signal && signal.aborted) throw e;
      connState(false, "connection lost");
      throw new HttpError(0, "The connection to the server was lost during the call.");
    }
    if (chunk.done) break;
    buf += dec.decode(chunk.value, { stream: true }).replace(/\r\n?/g, "\n");
    let end;
    while ((end = buf.indexOf("\n\n")) >= 0) {
      const ev = buf.slice(0, end);
      buf = buf.slice(end + 2);
      const data = ev.split("\n").filter((l) => l.startsWith("data:")).map((l) => l.slice(5).replace(/^ /, "")).join("\n");
      if (!data) continue;
      let msg;
      try {
        msg = JSON.parse(data);
      } catch (_) {
        continue;
      }
      if (msg.id === id && ("result" in msg || "error" in msg)) return answer(msg);
      if (msg.method && onNotify) onNotify(msg);
    }
  }
  throw new HttpError(0, "The server closed the stream without an answer.");
}

function answer(msg) {
  if (msg.error) {
    const e = new Error(msg.error.message || "error " + msg.error.code);
    e.code = msg.error.code;
    throw e;
  }
  return msg.result;
}

function callTool(name, args, opts) {
  return rpc("tools/call", { name, arguments: args || {} }, opts);
}

// ------------------------------------------------------------------ small helpers

function el(tag, attrs, ...kids) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (k === "class") e.className = v;
    else if (k.startsWith("on")) e.addEventListener(k.slice(2), v);
    else e.setAttribute(k, v);
  }
  for (const k of kids) e.append(k instanceof Node ? k : document.createTextNode(String(k)));
  return e;
}

function banner(text) {
  const b = $("banner");
  b.textContent = text || "";
  b.hidden = !text;
}

function connState(ok, why) {
  const c = $("conn");
  c.textContent = ok ? "connected" : why || "not connected";
  c.className = "pill " + (ok ? "ok" : "bad");
}

function fmtBytes(n) {
  if (n == null) return "–";
  const u = ["B", "KiB", "MiB", "GiB", "TiB"];
  let i = 0;
  while (n >= 1024 && i < u.length - 1) {
    n /= 1024;
    i++;
  }
  return (i ? n.toFixed(1) : n) + " " + u[i];
}

function fmtMs(ms) {
  if (ms == null) return "–";
  return ms < 1000 ? ms + " ms" : (ms / 1000).toFixed(2) + " s";
}

function facts(dl, pairs) {
  dl.replaceChildren();
  for (const [k, v] of pairs) {
    if (v === undefined) continue;
    dl.append(el("dt", {}, k), el("dd", { "data-fact": k }, v));
  }
}

function b64ToBlob(b64, type) {
  const bin = atob(b64);
  const bytes = new Uint8Array(bin.length);
  for (let i = 0; i < bin.length; i++) bytes[i] = bin.charCodeAt(i);
  return new Blob([bytes], { type: type || "application/octet-stream" });
}

function saveBlob(blob, name) {
  const url = URL.createObjectURL(blob);
  const a = el("a", { href: url, download: name.split("/").pop() });
  document.body.append(a);
  a.click();
  a.remove();
  setTimeout(() => URL.revokeObjectURL(url), 10000);
}

// ------------------------------------------------------------------ the editor

const SAMPLE = `import time

for i in range(3):
    print(f"tick {i}", flush=True)
    time.sleep(0.5)
print("done")
`;

function setupEditor() {
  const host = $("editor-host");
  if (window.MPSEditor) {
    editor = window.MPSEditor.create(host, SAMPLE, run);
    $("editor-keys").textContent =
      "Tab indents. To leave the editor with the keyboard: Escape, then Tab within 2 seconds (Shift-Tab goes back); " +
      "or Ctrl-M (Shift-Alt-M on a Mac), after which Tab moves on until Ctrl-M again. Ctrl-Enter runs.";
    return;
  }
  const ta = el("textarea", { id: "script", "aria-label": "Python script", "aria-describedby": "editor-keys", spellcheck: "false", "data-testid": "editor" });
  ta.value = SAMPLE;
  // Tab indents; Escape, then Tab (or Shift-Tab) leaves, as in CodeMirror (WCAG 2.1.2: the
  // way out is written under the editor).  Shift-Tab alone leaves too.
  let leave = false;
  ta.addEventListener("keydown", (e) => {
    if (e.key === "Escape") {
      leave = true;
      return;
    }
    const armed = leave;
    if (!["Shift", "Control", "Alt", "Meta"].includes(e.key)) leave = false;
    if (e.key === "Enter" && (e.ctrlKey || e.metaKey)) {
      e.preventDefault();
      run();
    } else if (e.key === "Tab" && !e.shiftKey && !armed) {
      e.preventDefault();
      ta.setRangeText("    ", ta.selectionStart, ta.selectionEnd, "end");
    }
  });
  host.append(ta);
  editor = { get: () => ta.value, set: (t) => (ta.value = t), focus: () => ta.focus() };
  const note = $("editor-note");
  note.textContent = "Plain text editor: this build has no editor bundle (ui/build.sh makes it), so there is no syntax highlighting.";
  $("editor-keys").textContent = "Tab indents. To leave the editor with the keyboard: Escape, then Tab (Shift-Tab goes back). Ctrl-Enter runs.";
  note.hidden = false;
}

// The bundle is optional: a 404 (or any failure) leaves the textarea.
function loadEditor() {
  return new Promise((resolve) => {
    const s = el("script", { src: PREFIX + "/ui/editor.js" });
    s.onload = resolve;
    s.onerror = resolve;
    document.head.append(s);
  });
}

// ------------------------------------------------------------------ a run

// The console: what the run printed, stdout and stderr in the order printed, one span per
// line piece, each marked by its stream (data-stream; stderr red with a bar at its lines'
// start); set-up messages (an environment build, a wait for a slot) on lines of their own.
let live = null; // { out, err, complete }: what streamed, to compare with the result's

function consoleAppend(text, cls) {
  const c = $("console");
  const stream = cls === "out" ? "stdout" : cls === "err" ? "stderr" : "note";
  for (const piece of text.match(/[^\n]*\n|[^\n]+/g) || []) {
    const last = c.lastElementChild;
    const bol = !last || last.textContent.endsWith("\n");
    if (last && !bol && last.dataset.stream === stream) last.textContent += piece;
    else c.append(el("span", { class: cls + (bol ? " bol" : ""), "data-stream": stream }, piece));
  }
  c.scrollTop = c.scrollHeight;
}

// A line of its own, whatever the console ended with.
function consoleLine(text, cls) {
  const last = $("console").lastElementChild;
  if (last && !last.textContent.endsWith("\n")) consoleAppend("\n", last.className.split(" ")[0]);
  consoleAppend(text.endsWith("\n") ? text : text + "\n", cls);
}

function onRunNotify(n) {
  if (n.method !== "notifications/progress" || !n.params || typeof n.params.message !== "string") return;
  const text = n.params.message;
  const runs = n.params._meta && n.params._meta[STREAMS_META];
  if (!Array.isArray(runs)) {
    consoleLine(text, "note"); // set-up: "installing 2 requirements", "Collecting numpy", ...
    return;
  }
  let at = 0;
  for (const [stream, len] of runs) {
    const part = text.slice(at, at + len);
    at += len;
    if (stream === "stdout") live.out += part;
    else if (stream === "stderr") live.err += part;
    else live.complete = false; // output skipped in progress
    if (stream === "note") consoleLine(part.replace(/^\n+/, ""), "note");
    else consoleAppend(part, stream === "stderr" ? "err" : "out");
  }
}

// A failed call's one-line summary: its first line, and what the installer said went wrong
// (pip's last "ERROR:" line, uv's "×" line) when it is a build's wall of output.
function summaryLine(text) {
  const lines = text.split("\n").map((l) => l.trim()).filter(Boolean);
  if (!lines.length) return "";
  const first = lines[0].replace(/[:.]\s*$/, "");
  const said = lines.slice(1).filter((l) => /^(ERROR:|error:|×)/.test(l)).map((l) => l.replace(/^(ERROR:|error:|×)\s*/, ""));
  const why = said.length ? said[said.length - 1] : "";
  const line = why && !first.includes(why) ? first + ": " + why : first;
  return line.length > 300 ? line.slice(0, 299) + "…" : line;
}

async function readFiles() {
  const out = [];
  for (const f of $("files").files) {
    const buf = new Uint8Array(await f.arrayBuffer());
    let bin = "";
    for (let i = 0; i < buf.length; i += 0x8000) bin += String.fromCharCode.apply(null, buf.subarray(i, i + 0x8000));
    out.push({ path: f.name, content: btoa(bin), encoding: "base64" });
  }
  return out;
}

function setRunning(on, state) {
  $("run").disabled = on;
  $("cancel").disabled = !on;
  const s = $("run-state");
  s.textContent = state;
  s.dataset.state = state;
  s.className = "pill" + (state === "finished" ? " ok" : state === "failed" || state === "timed out" ? " bad" : "");
}

async function run() {
  if (running) return;
  if (!token() && $("token-box").hidden === false) {
    banner("Paste a token first.");
    return;
  }
  const controller = new AbortController();
  running = { controller };
  banner("");
  // The state changes at once: reading attached files takes a moment.
  setRunning(true, "running");
  $("console").replaceChildren();
  live = { out: "", err: "", complete: true };
  const args = { script: editor.get() };
  const deps = $("deps").value.split(",").map((d) => d.trim()).filter(Boolean);
  if (deps.length) args.dependencies = deps;
  if ($("python").value) args.python_version = $("python").value;
  if ($("timeout").value) args.timeout_seconds = Number($("timeout").value);
  if ($("session").value) args.session = $("session").value;
  $("images").replaceChildren();
  $("downloads").replaceChildren();
  $("result-facts").replaceChildren();
  let files;
  try {
    files = await readFiles();
  } catch (e) {
    setRunning(false, "failed");
    banner("An attached file could not be read: " + e.message);
    running = null;
    return;
  }
  if (files.length) args.files = files;
  const started = performance.now();
  try {
    const result = await callTool("execute_python", args, {
      signal: controller.signal,
      progress: true,
      onNotify: onRunNotify,
    });
    showResult(result, performance.now() - started);
  } catch (e) {
    if (controller.signal.aborted) {
      setRunning(false, "cancelled");
      consoleAppend("\n[cancelled: the request was closed, which stops the script]\n", "note");
      running = null;
      return;
    }
    setRunning(false, "failed");
    banner(e.message);
    if (e.status === 401) showTokenBox();
    running = null;
    return;
  }
  running = null;
}

function showResult(result, wallMs) {
  const sc = result.structuredContent || {};
  if ("exit_code" in sc) {
    // The console shows what streamed, in the order printed.  The result has stdout and
    // stderr apart (head and tail): when the stream was not all of it, the result's texts
    // replace it, and the order between the two streams is not known.
    const out = sc.stdout || "";
    const err = sc.stderr || "";
    if (!(live && live.complete && !sc.truncated && live.out === out && live.err === err)) {
      $("console").replaceChildren();
      if (out && err)
        consoleLine("[the live output was incomplete" + (sc.truncated ? " (the output was cut to its head and tail)" : "") +
          ": stdout, then stderr below; the order between them is not known]", "note");
      if (out) consoleAppend(out, "out");
      if (err) consoleLine(err, "err");
    }
  } else {
    // No run (arguments refused, a dependency build failed): the message, a summary first.
    $("console").replaceChildren();
    const text = (result.content || []).filter((b) => b.type === "text").map((b) => b.text).join("\n");
    if (result.isError) {
      const summary = summaryLine(text);
      if (summary) consoleLine(summary, "summary");
      if (text.trim() !== summary) {
        consoleAppend("\n", "note");
        consoleLine(text, "err");
      }
    } else consoleAppend(text, "out");
  }
  const ok = !result.isError;
  setRunning(false, ok ? "finished" : sc.timed_out ? "timed out" : "failed");
  // A session call runs in its kernel, whose CPU time and memory are not measured per call
  // (the server reports zeros): "–", not a made-up 0.
  const measured = !sc.session;
  const cpu = measured && sc.cpu_user_ms != null ? sc.cpu_user_ms + (sc.cpu_system_ms || 0) : null;
  const mem = !measured ? null : sc.memory_peak_bytes != null ? sc.memory_peak_bytes : sc.max_rss_kib ? sc.max_rss_kib * 1024 : null;
  facts($("result-facts"), [
    ["exit code", sc.exit_code != null ? String(sc.exit_code) : undefined],
    ["duration", sc.duration_ms != null ? fmtMs(sc.duration_ms) : fmtMs(Math.round(wallMs))],
    ["CPU", "exit_code" in sc ? fmtMs(cpu) : undefined],
    ["peak memory", "exit_code" in sc ? fmtBytes(mem) : undefined],
    ["python", sc.python && sc.python.version],
    ["limit hit", sc.limit || undefined],
    ["session", sc.session ? sc.session.id + " (" + (sc.session.state || "") + ")" : undefined],
    ["value", sc.display != null ? sc.display : undefined],
  ]);
  if (sc.session && sc.session.id) addSessionOption(sc.session.id);
  const images = (result.content || []).filter((b) => b.type === "image");
  for (const img of images) $("images").append(el("img", { src: "data:" + img.mimeType + ";base64," + img.data, alt: "plot", "data-testid": "plot" }));
  let imageIndex = 0;
  for (const f of sc.files || []) {
    if (f.returned === "skipped") {
      $("downloads").append(el("li", {}, f.path + " (skipped: " + (f.reason || "") + ")"));
      continue;
    }
    const image = f.returned === "image" ? images[imageIndex++] : null;
    const btn = el("button", { type: "button", class: "link", "data-testid": "download" }, "⬇ " + f.path);
    btn.addEventListener("click", () => download(f, image).catch((e) => banner("Download failed: " + e.message)));
    $("downloads").append(el("li", {}, btn, " ", el("span", { class: "hint" }, fmtBytes(f.size) + (f.mime_type ? ", " + f.mime_type : ""))));
  }
  refreshSessions().catch(() => {});
}

// A file the run returned: inline images from the result; the rest from the endpoint's
// download URL (<base>/runs/<run>/<path>, the token in a header, never in the URL).
async function download(f, image) {
  if (!f.uri && image) return saveBlob(b64ToBlob(image.data, image.mimeType), f.path);
  const prefix = "sandbox://runs/";
  if (!f.uri || !f.uri.startsWith(prefix)) throw new Error("no copy of " + f.path + " is kept");
  const resp = await fetch(PREFIX + "/runs/" + f.uri.slice(prefix.length), {
    headers: { Authorization: "Bearer " + token() },
    cache: "no-store",
  });
  if (!resp.ok) throw new Error(resp.status + " " + resp.statusText + " (files expire after a while)");
  saveBlob(await resp.blob(), f.path);
}

function cancel() {
  if (running) running.controller.abort();
}

// ------------------------------------------------------------------ sessions

function addSessionOption(id) {
  const sel = $("session");
  if (![...sel.options].some((o) => o.value === id)) sel.append(el("option", { value: id }, "session " + id));
  sel.value = id;
}

async function refreshSessions() {
  const r = await callTool("list_sessions", {});
  const list = (r.structuredContent && r.structuredContent.sessions) || [];
  const sel = $("session");
  const keep = sel.value;
  for (const o of [...sel.options]) if (o.value && o.value !== "new") o.remove();
  const body = $("sessions").querySelector("tbody");
  body.replaceChildren();
  for (const s of list) {
    sel.append(el("option", { value: s.id }, "session " + s.id));
    const close = el("button", { type: "button", "data-session": s.id }, "Close");
    close.addEventListener("click", async () => {
      try {
        await callTool("close_session", { session: s.id });
      } catch (e) {
        banner(e.message);
      }
      refreshSessions().catch(() => {});
    });
    body.append(el("tr", {}, el("td", { class: "id" }, s.id), el("td", {}, s.state || ""), el("td", {}, String(s.calls ?? "")),
      el("td", {}, (s.idle_seconds ?? "") + " s"), el("td", {}, s.python || "–"), el("td", {}, close)));
  }
  if (!list.length) body.append(el("tr", {}, el("td", { colspan: "6", class: "hint" }, "No sessions.")));
  sel.value = [...sel.options].some((o) => o.value === keep) ? keep : "";
}

// ------------------------------------------------------------------ the status view

const SERIES = [
  { metric: "mcp_sandbox_executions_running", label: "running" },
  { metric: "mcp_sandbox_executions_queued", label: "queued" },
  { metric: "mcp_sandbox_prestart_ready", label: "prestarted sandboxes ready" },
  { metric: "mcp_sandbox_tool_calls_total", label: "tool calls / s", rate: true },
  { metric: "mcp_sandbox_env_cache_bytes", label: "environment cache", bytes: true },
  { metric: "mcp_sandbox_http_connections", label: "HTTP requests open" },
];
const MAX_SAMPLES = 150; // 5 minutes at one sample every 2 s
const WINDOW_MS = 5 * 60 * 1000;
const samples = []; // { t, values: {metric: number} }
let pollTimer = null;

// Prometheus text: the sum of each family's samples (labels summed over).
function parseMetrics(text) {
  const v = {};
  for (const line of text.split("\n")) {
    if (!line || line[0] === "#") continue;
    const m = /^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})?\s+(\S+)/.exec(line);
    if (!m) continue;
    const x = Number(m[3]);
    if (Number.isFinite(x)) v[m[1]] = (v[m[1]] || 0) + x;
  }
  return v;
}

async function sample() {
  const resp = await fetch(BASE.replace(/\/[^/]*$/, "") + "/metrics", {
    headers: token() ? { Authorization: "Bearer " + token() } : {},
    cache: "no-store",
  });
  if (resp.status === 401) throw new HttpError(401, "The server refused the token (401 Unauthorized).");
  if (resp.status === 403)
    throw new HttpError(403, "The charts come from /metrics, which only the server's operators may read (--metrics-token): this token is not one.");
  if (!resp.ok) throw new HttpError(resp.status, "metrics: " + resp.status);
  samples.push({ t: Date.now(), values: parseMetrics(await resp.text()) });
  while (samples.length > MAX_SAMPLES) samples.shift();
  drawCharts();
}

function drawCharts() {
  const host = $("charts");
  if (!host.querySelector("figure")) {
    host.replaceChildren(); // (a note that this token may not read /metrics, when it was another)
    for (const s of SERIES) host.append(el("figure", { "data-metric": s.metric }, el("canvas", { width: "300", height: "70" }), el("figcaption", {})));
  }
  for (const s of SERIES) {
    const fig = host.querySelector(`[data-metric="${s.metric}"]`);
    const pts = []; // [time, value]
    for (let i = 0; i < samples.length; i++) {
      const cur = samples[i].values[s.metric];
      if (cur === undefined) continue;
      if (s.rate) {
        if (i === 0 || samples[i - 1].values[s.metric] === undefined) continue;
        const dt = (samples[i].t - samples[i - 1].t) / 1000;
        pts.push([samples[i].t, Math.max(0, (cur - samples[i - 1].values[s.metric]) / dt)]);
      } else pts.push([samples[i].t, cur]);
    }
    const last = pts.length ? pts[pts.length - 1][1] : null;
    fig.querySelector("figcaption").textContent = s.label + ": " + (last == null ? "–" : s.bytes ? fmtBytes(last) : s.rate ? last.toFixed(2) : String(last));
    const cv = fig.querySelector("canvas");
    const g = cv.getContext("2d");
    g.clearRect(0, 0, cv.width, cv.height);
    if (pts.length < 2) continue;
    const max = Math.max(1, ...pts.map((p) => p[1]));
    const now = pts[pts.length - 1][0];
    // The last WINDOW_MS at most; less while fewer samples were taken (at least 30 s).
    const span = Math.min(WINDOW_MS, Math.max(30000, now - samples[0].t));
    g.strokeStyle = "#2b6cb0";
    g.lineWidth = 2;
    g.beginPath();
    pts.forEach(([tm, y], i) => {
      // The right edge is now; the left one span ago.
      const x = cv.width - ((now - tm) / span) * cv.width;
      const yy = cv.height - 4 - (y / max) * (cv.height - 8);
      i ? g.lineTo(x, yy) : g.moveTo(x, yy);
    });
    g.stroke();
  }
}

async function refreshStatus() {
  const r = await callTool("check_environment", {});
  const sc = r.structuredContent || {};
  const t = sc.tenant || {};
  const ex = t.executions || {};
  const envs = t.environments || {};
  const arts = t.artifacts || {};
  facts($("server-facts"), [
    ["version", sc.server_version],
    ["sandbox", sc.sandbox_status || sc.sandbox_backend],
    ["network", sc.network_policy ? sc.network_policy.mode : String(sc.network)],
    ["you are", t.principal],
    ["your calls running / queued", (ex.running ?? "–") + " / " + (ex.queued ?? "–")],
    ["your environments", (envs.count ?? "–") + " (" + fmtBytes(envs.bytes) + ")"],
    ["your output files kept", (arts.files ?? "–") + " (" + fmtBytes(arts.bytes) + ")"],
    ["timeout default / max", (sc.default_timeout ?? "–") + " s / " + (sc.max_timeout ?? "–") + " s"],
  ]);
  const body = $("interpreters").querySelector("tbody");
  body.replaceChildren();
  for (const i of sc.interpreters || [])
    body.append(el("tr", { title: i.path || "" }, el("td", {}, i.version + (i.free_threaded ? " (free-threaded)" : "") + (i.default ? " (default)" : "")),
      el("td", {}, i.implementation || ""), el("td", {}, i.source || ""), el("td", {}, i.ok === false ? "unusable" : "ok")));
  fillPythons(sc.interpreters || []);
  fillEnvironments(envs.items || []);
  const recent = $("recent").querySelector("tbody");
  recent.replaceChildren();
  for (const c of sc.recent_calls || [])
    recent.append(el("tr", {}, el("td", {}, new Date(c.time).toLocaleTimeString()), el("td", {}, c.tool || ""),
      el("td", {}, (c.outcome || "") + (c.limit ? " (" + c.limit + ")" : "")), el("td", {}, c.duration_ms != null ? fmtMs(c.duration_ms) : "–")));
  if (!(sc.recent_calls || []).length) recent.append(el("tr", {}, el("td", { colspan: "4", class: "hint" }, "None yet.")));
}

function packagesText(p) {
  if (Array.isArray(p)) return p.map((x) => (typeof x === "string" ? x : x.name + (x.version ? " " + x.version : ""))).join(", ");
  if (p && typeof p === "object") return Object.entries(p).map(([k, v]) => k + " " + v).join(", ");
  return "";
}

function fillEnvironments(items) {
  const body = $("environments").querySelector("tbody");
  body.replaceChildren();
  for (const e of items) {
    const evict = el("button", { type: "button", "data-env": e.key }, "Evict");
    evict.addEventListener("click", async () => {
      try {
        const r = await callTool("evict_environment", { key: e.key });
        if (r.isError) banner((r.content && r.content[0] && r.content[0].text) || "Not evicted.");
      } catch (err) {
        banner(err.message);
      }
      refreshStatus().catch((err) => banner(err.message));
    });
    body.append(el("tr", {}, el("td", { class: "id", title: e.key }, packagesText(e.packages) || e.key.slice(0, 16)),
      el("td", {}, e.python || "–"), el("td", {}, fmtBytes(e.bytes)),
      el("td", {}, e.built ? new Date(e.built * 1000).toLocaleString() : "–"), el("td", {}, evict)));
  }
  if (!items.length) body.append(el("tr", {}, el("td", { colspan: "5", class: "hint" }, "None: your calls have not needed dependencies yet.")));
}

function fillPythons(list) {
  if (interpretersLoaded) return;
  interpretersLoaded = true;
  const sel = $("python");
  for (const i of list) if (i.ok !== false) sel.append(el("option", { value: i.version }, i.version + (i.default ? " (default)" : "")));
}

async function pollStatus() {
  try {
    await sample();
    banner("");
  } catch (e) {
    if (e.status === 403) {
      // Not an operator: no charts (the rest of the view is the caller's own), and no polling.
      $("charts").replaceChildren(el("p", { class: "hint" }, e.message));
      clearInterval(pollTimer);
      pollTimer = null;
      return;
    }
    banner(e.message);
    if (e.status === 401) showTokenBox();
  }
}

function showView(name) {
  for (const b of document.querySelectorAll("nav [role=tab]")) b.setAttribute("aria-selected", String(b.dataset.view === name));
  $("view-run").hidden = name !== "run";
  $("view-status").hidden = name !== "status";
  clearInterval(pollTimer);
  pollTimer = null;
  if (name === "status") {
    pollStatus();
    pollTimer = setInterval(pollStatus, 2000);
    refreshStatus().catch((e) => banner(e.message));
    refreshSessions().catch(() => {});
  }
}

// ------------------------------------------------------------------ start

// For the browser tests (tests/browser/): set the script whichever editor is in use.
window.__mpsEditorSet = (t) => editor.set(t);

async function connect() {
  try {
    const r = await callTool("check_environment", {});
    $("token-box").hidden = true;
    banner("");
    fillPythons((r.structuredContent && r.structuredContent.interpreters) || []);
    refreshSessions().catch(() => {});
  } catch (e) {
    if (e.status === 401) showTokenBox(token() ? e.message : "This server needs a bearer token.");
    else banner(e.message);
  }
}

document.addEventListener("DOMContentLoaded", async () => {
  $("token-form").addEventListener("submit", (e) => {
    e.preventDefault();
    sessionStorage.setItem(TOKEN_KEY, $("token").value.trim());
    $("token").value = "";
    connect();
  });
  $("token-forget").addEventListener("click", () => {
    sessionStorage.removeItem(TOKEN_KEY);
    connState(false, "no token");
  });
  $("run").addEventListener("click", run);
  $("cancel").addEventListener("click", cancel);
  document.addEventListener("keydown", (e) => {
    if (e.key === "Enter" && (e.ctrlKey || e.metaKey) && !e.defaultPrevented && !$("view-run").hidden) {
      e.preventDefault();
      run();
    }
  });
  for (const b of document.querySelectorAll("nav [role=tab]")) b.addEventListener("click", () => showView(b.dataset.view));
  await loadEditor();
  setupEditor();
  connect();
});

// A load driver of the fleet suites and of bench/fleet-nginx.sh: S sessions of the SDK v1
// client (the handshake era), each making C execute_python calls one after the other, W
// sessions at a time.  Every call prints a string of its own, so its answer can be matched to
// it and found in the instances' audit logs (by the script's SHA-256).
//
//   node load.mjs --url URL --token TOKEN [--sessions 200] [--calls 20] [--workers 24]
//                 [--out FILE] [--kill-after N --kill-pid PID] [--call-timeout-ms 60000]
//                 [--exec-every K]
//
// --exec-every K: every K-th call of a session (and its last) is execute_python, the others
// validate_script of a script whose PEP 723 block names a dependency of the call's own, which
// the answer must repeat (routing is what is tested; the interpreter's start-up is the cost).
// A call answered 404 (the session is unknown: its instance is gone, said nginx) was never
// run: the session starts over with a new initialize and the call is made again there.  Any
// other failure is the call's outcome, recorded with its error, and the session goes on in a
// new one.  --kill-after N sends SIGKILL to --kill-pid once N calls have been answered.
// Writes one JSON document: { calls: [{ session, call, script, route, sid, ok, error,
// sentAt, doneAt }], killedAt, wallMs }.  TLS: the CA in NODE_EXTRA_CA_CERTS.
import { createHash } from "node:crypto";
import { writeFileSync } from "node:fs";
import { parseArgs } from "node:util";

import { Client } from "@modelcontextprotocol/sdk/client/index.js";
import { StreamableHTTPClientTransport, StreamableHTTPError } from "@modelcontextprotocol/sdk/client/streamableHttp.js";

const { values: o } = parseArgs({
  options: {
    url: { type: "string" }, token: { type: "string" }, sessions: { type: "string", default: "200" },
    calls: { type: "string", default: "20" }, workers: { type: "string", default: "24" },
    out: { type: "string" }, "kill-after": { type: "string" }, "kill-pid": { type: "string" },
    "call-timeout-ms": { type: "string", default: "60000" }, "exec-every": { type: "string", default: "1" }, tag: { type: "string", default: String(process.pid) },
  },
});
const S = Number(o.sessions);
const C = Number(o.calls);
const W = Number(o.workers);
const timeout = Number(o["call-timeout-ms"]);
const killAfter = o["kill-after"] ? Number(o["kill-after"]) : null;
const execEvery = Number(o["exec-every"]);

const calls = [];
let answered = 0;
let killedAt = null;

function routeOf(sid) {
  const dot = (sid ?? "").indexOf(".");
  return dot > 0 ? sid.slice(0, dot) : "";
}

async function open() {
  const transport = new StreamableHTTPClientTransport(new URL(o.url), {
    requestInit: { headers: { authorization: `Bearer ${o.token}` } },
    reconnectionOptions: { maxReconnectionDelay: 1000, initialReconnectionDelay: 200, reconnectionDelayGrowFactor: 1.5, maxRetries: 1 },
  });
  const client = new Client({ name: "mps-fleet-load", version: "0.0.1" }, { capabilities: {} });
  client.onerror = () => {};
  await client.connect(transport);
  return { client, transport };
}

function isSessionGone(e) {
  return (e instanceof StreamableHTTPError && e.code === 404) || /\b404\b|Session not found/.test(String(e?.message ?? e));
}

async function session(s) {
  let conn = null;
  for (let i = 0; i < C; i++) {
    const id = `fleet-${o.tag}-s${s}-c${i}`;
    const tool = i % execEvery === execEvery - 1 || i === C - 1 ? "execute_python" : "validate_script";
    const script = tool === "execute_python"
      ? `print(${JSON.stringify(id)})`
      : `# /// script\n# dependencies = [${JSON.stringify(id)}]\n# ///\nprint(1)\n`;
    const rec = { session: s, call: i, tool, script, sha256: createHash("sha256").update(script).digest("hex"), attempts: 0 };
    calls.push(rec);
    for (;;) {
      rec.attempts++;
      try {
        if (!conn) conn = await open();
      } catch (e) {
        rec.ok = false;
        rec.error = `initialize: ${e?.message ?? e}`;
        rec.doneAt = Date.now();
        break;
      }
      rec.sid = conn.transport.sessionId;
      rec.route = routeOf(rec.sid);
      rec.sentAt = Date.now();
      try {
        const r = await conn.client.callTool({ name: tool, arguments: { script } }, undefined, { timeout });
        rec.doneAt = Date.now();
        rec.ok = tool === "execute_python"
          ? r.isError === false && r.structuredContent?.stdout === `${id}\n`
          : /^VALID\b/.test(r.content?.[0]?.text ?? "") && (r.content?.[0]?.text ?? "").includes(id);
        if (!rec.ok) rec.error = `wrong answer: ${JSON.stringify(r).slice(0, 500)}`;
        break;
      } catch (e) {
        rec.doneAt = Date.now();
        const gone = isSessionGone(e);
        await conn.client.close().catch(() => {});
        conn = null;
        if (gone && rec.attempts < 3) {
          (rec.notFound ??= []).push({ route: rec.route, at: rec.doneAt, error: String(e?.message ?? e) });
          continue; // never ran: the same call in a new session
        }
        rec.ok = false;
        rec.error = String(e?.message ?? e);
        break;
      }
    }
    answered++;
    if (killAfter !== null && killedAt === null && answered >= killAfter) {
      killedAt = Date.now();
      try {
        process.kill(Number(o["kill-pid"]), "SIGKILL");
      } catch {}
    }
  }
  if (conn) {
    await conn.transport.terminateSession().catch(() => {});
    await conn.client.close().catch(() => {});
  }
}

const t0 = Date.now();
let next = 0;
await Promise.all(Array.from({ length: Math.min(W, S) }, async () => {
  while (next < S) await session(next++);
}));
const doc = { calls, killedAt, wallMs: Date.now() - t0, sessions: S, callsPerSession: C, workers: W };
if (o.out) writeFileSync(o.out, JSON.stringify(doc));
const ok = calls.filter((c) => c.ok).length;
console.log(`${ok}/${calls.length} calls answered in ${doc.wallMs} ms (${((ok * 1000) / doc.wallMs).toFixed(1)} calls/s)`);

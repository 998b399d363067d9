// The v2 client pinned to the stateless era (2026-07-28): N execute_python calls at once
// through URL with a bearer token; prints { ok, sid } (sid: a session id, if one was given).
//
//   node modern-calls.mjs URL TOKEN N        (TLS: the CA in NODE_EXTRA_CA_CERTS)
import { Client, StreamableHTTPClientTransport } from "@modelcontextprotocol/client";

const [url, token, n] = process.argv.slice(2);
const tr = new StreamableHTTPClientTransport(new URL(url), { requestInit: { headers: { authorization: `Bearer ${token}` } } });
const c = new Client({ name: "mps-fleet", version: "0" }, { capabilities: {}, versionNegotiation: { mode: { pin: "2026-07-28" } } });
await c.connect(tr);
if (c.getProtocolEra() !== "modern") throw new Error(`era ${c.getProtocolEra()}`);
const answers = await Promise.all(Array.from({ length: Number(n) }, async (_, i) => {
  const r = await c.callTool({ name: "execute_python", arguments: { script: `print(${i} * 2)` } });
  return r.structuredContent?.stdout === `${i * 2}\n`;
}));
console.log(JSON.stringify({ ok: answers.filter(Boolean).length, sid: tr.sessionId ?? null }));
await c.close();

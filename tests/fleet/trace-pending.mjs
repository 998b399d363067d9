// Loaded into a fleet suite's test process (run.sh: NODE_OPTIONS=--import=...): records each
// promise's creation stack (async_hooks) until it settles, and when the event loop empties
// writes where the tests' own pending promises were made to $MPS_TRACE_PENDING_FILE.  run.sh
// shows that file only when node:test cancelled the file ("Promise resolution is still
// pending but the event loop has already resolved"): then it names the await nothing will
// ever settle, by file and line.  (At a normal end, the losers of a Promise.race and the like
// are pending too: noise.)
import { createHook } from "node:async_hooks";
import { appendFileSync } from "node:fs";

const out = process.env.MPS_TRACE_PENDING_FILE;
Error.stackTraceLimit = 40;
const ours = (line) => /\/tests\/(fleet|lib)\/[^/]+\.mjs/.test(line) && !line.includes("trace-pending.mjs");
const pending = new Map();
if (out) {
  createHook({
    init(id, type) {
      if (type === "PROMISE") pending.set(id, new Error("pending").stack);
    },
    promiseResolve(id) {
      pending.delete(id);
    },
    destroy(id) {
      pending.delete(id);
    },
  }).enable();
  process.on("beforeExit", () => {
    const stacks = [...pending.values()].map((s) => s.split("\n").filter(ours)).filter((f) => f.length > 0);
    if (stacks.length === 0) return;
    const text = stacks.slice(-20).map((f) => "a promise made\n" + f.join("\n")).join("\n");
    appendFileSync(out, `${stacks.length} promise(s) of the tests pending as the event loop emptied (the last 20):\n${text}\n`);
  });
}

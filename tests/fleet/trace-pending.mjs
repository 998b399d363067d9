// Loaded into a fleet suite's test process (run.sh: NODE_OPTIONS=--import=...): records each
// promise's creation stack (async_hooks) until it settles, and when the event loop empties
// with promises of the tests still pending (node:test then cancels the file: "Promise
// resolution is still pending but the event loop has already resolved"), prints where each
// was made: the await nothing will ever settle, named by file and line.
import { createHook } from "node:async_hooks";

const pending = new Map();
createHook({
  init(id, type) {
    if (type === "PROMISE") pending.set(id, new Error("a promise pending as the event loop emptied").stack);
  },
  promiseResolve(id) {
    pending.delete(id);
  },
  destroy(id) {
    pending.delete(id);
  },
}).enable();

process.on("beforeExit", () => {
  // (the test runner's own promises are pending too: only the tests' frames tell)
  const ours = [...pending.values()].filter((s) => /\/tests\/(fleet|lib)\/[^/]+\.mjs/.test(s));
  if (ours.length === 0) return;
  console.error(`trace-pending: ${ours.length} promise(s) of the tests pending as the event loop emptied:`);
  for (const s of ours.slice(-12)) {
    console.error(s.split("\n").filter((l) => !/node:internal|trace-pending\.mjs/.test(l)).join("\n"));
  }
});

// A test file for selftest/xfail.selftest.mjs: every kind of outcome the list must judge.
// MPS_SELFTEST_BREAK=parent makes the plain parent's body throw (as a failed connect would).
import { test } from "node:test";

import { expectingParent, step } from "../../lib/expect.mjs";

test("plain parent", async (t) => {
  if (process.env.MPS_SELFTEST_BREAK === "parent") throw new Error("the handshake-era connect failed");
  await step(t, "passes", () => {});
  await step(t, "fails", () => {
    throw new Error("not implemented yet");
  });
});

test("wrapped parent", expectingParent(async () => {
  throw new Error("connect refused");
}));

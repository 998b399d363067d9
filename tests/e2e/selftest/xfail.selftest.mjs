// Checks the expected-failures mechanism itself (lib/expect.mjs, lib/xfail-reporter.mjs and
// run.sh's verdict) on a test file of its own, selftest/cases/sample.case.mjs, with lists of
// its own: a listed failure is XFAIL and the run passes; a listed test that passes (XPASS),
// an unlisted failure, a line that names no test, and a plain parent whose body throws
// (a handshake-era connect) all fail the run. run.sh runs it before the real tests.
import { test } from "node:test";
import { spawnSync } from "node:child_process";
import { mkdtempSync, rmSync, writeFileSync, readFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { dirname, join, resolve } from "node:path";
import { fileURLToPath } from "node:url";
import assert from "node:assert/strict";

const E2E = resolve(dirname(fileURLToPath(import.meta.url)), "..");

// The runner marks its children with NODE_TEST_CONTEXT; a nested run must not inherit it,
// or it reports to us instead of through its own reporters.
function envWithout(name) {
  const env = { ...process.env };
  delete env[name];
  return env;
}

function run(t, lines, env = {}) {
  const dir = mkdtempSync(join(tmpdir(), "mps-e2e-selftest-"));
  t.after(() => rmSync(dir, { recursive: true, force: true }));
  const list = join(dir, "expected-failures.txt");
  const status = join(dir, "status.json");
  writeFileSync(list, ["# a list of the self-test", ...lines, ""].join("\n"));
  const r = spawnSync(process.execPath, [
    "--test", "--test-reporter=./lib/xfail-reporter.mjs", "--test-reporter-destination=stdout",
    "selftest/cases/sample.case.mjs",
  ], {
    cwd: E2E, encoding: "utf8", timeout: 60000,
    env: { ...envWithout("NODE_TEST_CONTEXT"), MPS_E2E_EXPECTED_FAILURES: list, MPS_E2E_XFAIL_STATUS: status, MPS_E2E_FULL_RUN: "1", ...env },
  });
  return { code: r.status, out: r.stdout + r.stderr, status: JSON.parse(readFileSync(status, "utf8")) };
}

const BOTH = ["plain parent > fails  # not yet", "wrapped parent  # connect refused"];

test("listed failures are XFAIL and the run passes", (t) => {
  const r = run(t, BOTH);
  assert.equal(r.code, 0, r.out);
  assert.deepEqual(r.status, { xfail: 2, xpass: 0, unmatched: [], fail: 0 });
  assert.match(r.out, /XFAIL {6}plain parent > fails/);
});

test("a listed test that passes is XPASS and fails the run", (t) => {
  const r = run(t, [...BOTH, "plain parent > passes  # expected to fail"]);
  assert.notEqual(r.code, 0, r.out);
  assert.equal(r.status.xpass, 1, r.out);
  assert.match(r.out, /XPASS {6}plain parent > passes/);
});

test("a parent's line covers its children, so a passing child is XPASS", (t) => {
  const r = run(t, ["plain parent  # all of it", "wrapped parent  # connect refused"]);
  assert.notEqual(r.code, 0, r.out);
  assert.deepEqual({ xfail: r.status.xfail, xpass: r.status.xpass }, { xfail: 2, xpass: 1 });
});

test("an unlisted failure fails the run", (t) => {
  const r = run(t, ["wrapped parent  # connect refused"]);
  assert.notEqual(r.code, 0, r.out);
  assert.equal(r.status.fail >= 1, true, r.out);
});

test("a line that names no test is UNMATCHED", (t) => {
  const r = run(t, [...BOTH, "a renamed test  # gone"]);
  assert.deepEqual(r.status.unmatched, ["a renamed test"], r.out);
});

test("a plain parent whose body throws is a failure even when its line covers it", (t) => {
  const r = run(t, ["plain parent  # all of it", "wrapped parent  # connect refused"], { MPS_SELFTEST_BREAK: "parent" });
  assert.notEqual(r.code, 0, r.out);
  assert.match(r.out, /FAIL {7}plain parent\b/);
});

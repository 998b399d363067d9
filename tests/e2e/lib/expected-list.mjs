// The entries of tests/e2e/expected-failures.txt, shared by lib/expect.mjs (in each test
// file's process) and lib/xfail-reporter.mjs (in the runner's): no test helpers imported.
import { readFileSync } from "node:fs";
import { dirname, join, resolve } from "node:path";
import { fileURLToPath } from "node:url";

// MPS_E2E_EXPECTED_FAILURES replaces the list (selftest/xfail.selftest.mjs runs the mechanism on lists of its own).
export const EXPECTED_FAILURES_FILE = process.env.MPS_E2E_EXPECTED_FAILURES ||
  join(resolve(dirname(fileURLToPath(import.meta.url)), ".."), "expected-failures.txt");

// Written by expecting() into the message of a listed test that passed; the reporter keys on it.
export const XPASS_TAG = "XPASS:";
// The start of the TODO text of a listed test that failed as expected.
export const XFAIL_TAG = "expected failure";

/** The entries: [{ name, reason, line }], from "name  # reason" lines (blank and "#" lines skipped). */
export function loadEntries(file = EXPECTED_FAILURES_FILE) {
  const entries = [];
  readFileSync(file, "utf8").split("\n").forEach((raw, i) => {
    const line = raw.trim();
    if (!line || line.startsWith("#")) return;
    const cut = line.indexOf(" # ");
    const name = (cut < 0 ? line : line.slice(0, cut)).trim();
    const reason = cut < 0 ? "listed in expected-failures.txt" : line.slice(cut + 3).trim();
    entries.push({ name, reason, line: i + 1 });
  });
  return entries;
}

/** Whether entry name covers the test of full name fullName ("parent > child"). */
export function covers(name, fullName) {
  return fullName === name || fullName.startsWith(`${name} > `);
}

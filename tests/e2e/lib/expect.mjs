// Expected failures: tests that need what the server does not do yet (protocol revision
// 2026-07-28, tasks; issue 18), named in tests/e2e/expected-failures.txt with the reason.
//
// A test wrapped in expecting() runs as ever. When it fails and the list covers it, it is
// marked TODO with the list's reason (node:test reports it, with its error, but the run
// passes); when it passes and the list covers it, it FAILS, telling which line to remove:
// so each entry flips the day the implementation lands, and the list only shrinks.
//
// An entry covers a test whose full name (node:test's, "parent > child") equals it or
// starts with it followed by " > ". A parent test wrapped in expectingParent() is only
// excused when its own body throws (a connect that fails before any child ran); whether it
// "passes" is decided by its children, each wrapped in expecting(). Wrap a parent only when
// its own body does what the entry expects to fail (the pinned v2 client's connect): a parent
// whose body connects in the handshake era stays a plain test, so that a failure of that era
// is never excused (tasks, the Inspector's eras). lib/xfail-reporter.mjs prints the verdicts.
import { EXPECTED_FAILURES_FILE, XFAIL_TAG, XPASS_TAG, covers, loadEntries } from "./expected-list.mjs";

export { EXPECTED_FAILURES_FILE };

const entries = loadEntries();

/** The entry covering a test's full name, or undefined. */
export function expectedFailure(fullName) {
  return entries.find((e) => covers(e.name, fullName));
}

function firstLine(error) {
  return String(error?.message ?? error).split("\n")[0].slice(0, 300);
}

const skipped = new WeakSet();

/** Skips a test wrapped in expecting() (t.skip alone would read as a pass, hence stale). */
export function skipStep(t, reason) {
  skipped.add(t);
  t.skip(reason);
}

/** Wraps a leaf test's body (see the module comment). */
export function expecting(fn) {
  return async (t) => {
    const entry = expectedFailure(t.fullName);
    try {
      await fn(t);
    } catch (error) {
      if (!entry) throw error;
      t.todo(`${XFAIL_TAG} (${entry.reason}): ${firstLine(error)}`);
      throw error; // reported with the TODO; a TODO test's failure does not fail the run
    }
    if (entry && !skipped.has(t))
      throw new Error(`${XPASS_TAG} "${t.fullName}" passes now, but expected-failures.txt still expects it to fail ` +
        `(${entry.reason}): remove or narrow its line ${entry.line}, "${entry.name}"`);
  };
}

/** Wraps a parent test's body: excused only when the body itself throws. */
export function expectingParent(fn) {
  return async (t) => {
    try {
      await fn(t);
    } catch (error) {
      const entry = expectedFailure(t.fullName);
      if (!entry) throw error;
      t.todo(`${XFAIL_TAG} (${entry.reason}): ${firstLine(error)}`);
      throw error;
    }
  };
}

/** Runs a child test of t whose body is wrapped in expecting(). */
export function step(t, name, fn) {
  return t.test(name, expecting(fn));
}

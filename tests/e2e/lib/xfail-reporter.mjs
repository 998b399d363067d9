// A node:test reporter (run.sh adds it beside the spec reporter) that closes the run with
// the verdicts of expected-failures.txt: each listed test that failed as expected (XFAIL,
// with its reason), each listed test that passed (XPASS: it fails the run, by the test's
// own error, see lib/expect.mjs), each other failure (FAIL), and, on a full run
// (MPS_E2E_FULL_RUN=1), each entry that named no test at all (UNMATCHED: a renamed test
// would otherwise leave a line that excuses nothing and never goes stale). The counts go
// to MPS_E2E_XFAIL_STATUS as JSON, where run.sh reads them: UNMATCHED fails the run.
import { writeFileSync } from "node:fs";

import { XFAIL_TAG, XPASS_TAG, covers, loadEntries } from "./expected-list.mjs";

function messageOf(error) {
  const parts = [];
  for (let e = error, depth = 0; e && depth < 4; e = e.cause, depth++) parts.push(String(e.message ?? e));
  return parts.join(" / ");
}

export default async function* xfailReporter(source) {
  const stack = []; // names of the running tests, by nesting
  const seen = new Set();
  const xfail = [];
  const xpass = [];
  const fail = [];
  const fullName = (data) => [...stack.slice(0, data.nesting), data.name].join(" > ");
  for await (const event of source) {
    const { data } = event;
    if (event.type === "test:start") {
      stack[data.nesting] = data.name;
      stack.length = data.nesting + 1;
    } else if (event.type === "test:pass") {
      seen.add(fullName(data));
    } else if (event.type === "test:fail") {
      const name = fullName(data);
      seen.add(name);
      const message = messageOf(data.details?.error);
      if (typeof data.todo === "string" && data.todo.startsWith(XFAIL_TAG)) xfail.push({ name, why: data.todo });
      else if (message.includes(XPASS_TAG)) xpass.push({ name, why: message.slice(message.indexOf(XPASS_TAG)) });
      else fail.push({ name, why: message.split("\n")[0] });
    }
  }
  const unmatched = process.env.MPS_E2E_FULL_RUN === "1"
    ? loadEntries().filter((e) => ![...seen].some((name) => covers(e.name, name)))
    : [];
  let out = `\n== e2e: expected failures (expected-failures.txt)\n`;
  for (const x of xfail) out += `  XFAIL      ${x.name}\n             ${x.why.slice(0, 300)}\n`;
  for (const x of xpass) out += `  XPASS      ${x.name}\n             ${x.why.slice(0, 400)}\n`;
  for (const e of unmatched) out += `  UNMATCHED  line ${e.line}: "${e.name}" names no test (renamed? remove or fix the line)\n`;
  for (const x of fail) out += `  FAIL       ${x.name}\n             ${x.why.slice(0, 300)}\n`;
  out += `  ${xfail.length} expected failures (XFAIL), ${xpass.length} listed tests passing (XPASS, fail the run), ` +
    `${unmatched.length} unmatched entries, ${fail.length} other failures\n`;
  if (process.env.MPS_E2E_XFAIL_STATUS)
    writeFileSync(process.env.MPS_E2E_XFAIL_STATUS, JSON.stringify({
      xfail: xfail.length, xpass: xpass.length, unmatched: unmatched.map((e) => e.name), fail: fail.length,
    }) + "\n");
  yield out;
}

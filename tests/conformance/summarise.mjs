// Summarises a conformance results directory (written by `conformance server -o DIR`): one
// line per scenario with its check counts and whether the baseline expects it to fail, a
// closing count, and the same as summary.json beside the results.
//   node summarise.mjs RESULTS_DIR BASELINE_YAML|- [gate|report]
// "report" (pending scenarios, baseline "-"): a failing scenario is reported, not judged.
import { readFileSync, readdirSync, writeFileSync } from "node:fs";
import { join } from "node:path";

const [resultsDir, baselinePath, mode = "gate"] = process.argv.slice(2);
const reportOnly = mode === "report";
// The baseline's "- name" lines under "server:" (comments stripped); the conformance tool
// itself parses the file properly, this only labels the summary.
const expected = new Set(
  (baselinePath === "-" ? "" : readFileSync(baselinePath, "utf8"))
    .split("\n")
    .map((line) => line.replace(/#.*/, "").trim())
    .filter((line) => line.startsWith("- "))
    .map((line) => line.slice(2).trim()),
);

const scenarios = [];
for (const entry of readdirSync(resultsDir, { withFileTypes: true })) {
  const m = entry.isDirectory() && entry.name.match(/^server-(.+)-\d{4}-\d\d-\d\dT[\d-]+Z$/);
  if (!m) continue;
  let checks;
  try {
    checks = JSON.parse(readFileSync(join(resultsDir, entry.name, "checks.json"), "utf8"));
  } catch {
    checks = [{ status: "FAILURE", errorMessage: "no readable checks.json" }];
  }
  const count = (s) => checks.filter((c) => c.status === s).length;
  const failures = checks.filter((c) => c.status === "FAILURE" || c.status === "WARNING");
  const ok = failures.length === 0;
  const listed = expected.has(m[1]);
  const verdict = ok ? (listed ? "STALE (passes, remove from baseline)" : "pass")
    : reportOnly ? "fails (reported only)" : listed ? "expected failure" : "UNEXPECTED FAILURE";
  scenarios.push({
    scenario: m[1], verdict, success: count("SUCCESS"), failure: count("FAILURE"), warning: count("WARNING"),
    messages: failures.map((c) => `${c.status} ${c.id ?? ""}: ${c.errorMessage ?? c.description ?? ""}`.trim()),
  });
}

const width = Math.max(0, ...scenarios.map((s) => s.scenario.length));
console.log("\n== conformance summary");
for (const s of scenarios) {
  console.log(`  ${s.scenario.padEnd(width)}  ${s.verdict}  (${s.success} ok, ${s.failure} failed, ${s.warning} warnings)`);
  if (s.verdict === "UNEXPECTED FAILURE" || reportOnly) for (const msg of s.messages) console.log(`      ${msg}`);
}
const n = (v) => scenarios.filter((s) => s.verdict.startsWith(v)).length;
const totals = { scenarios: scenarios.length, pass: n("pass"), expected_failure: n("expected"), unexpected_failure: n("UNEXPECTED"), stale: n("STALE"), reported_failure: n("fails") };
if (reportOnly) console.log(`  scenarios ${totals.scenarios}: ${totals.pass} pass, ${totals.reported_failure} fail (reported only)`);
else console.log(`  scenarios ${totals.scenarios}: ${totals.pass} pass, ${totals.expected_failure} expected failures (baseline), ` +
  `${totals.unexpected_failure} unexpected failures, ${totals.stale} stale baseline entries`);
writeFileSync(join(resultsDir, "summary.json"), JSON.stringify({ totals, scenarios }, null, 2) + "\n");

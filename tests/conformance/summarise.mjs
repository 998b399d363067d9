// Summarises a conformance results directory (written by `conformance server -o DIR`): one
// line per scenario with its check counts and whether the baseline expects it to fail, a
// closing count, and the same as summary.json beside the results.
//   node summarise.mjs RESULTS_DIR BASELINE_YAML|- [gate|report] [REQUIREMENTS_YAML|-]
// "report" (pending scenarios, baseline "-"): a failing scenario is reported, not judged.
// REQUIREMENTS_YAML (a run with --requirements R): the suite's requirements/R.yaml; the
// scenarios it does not score (its `not_scored` list: extensions, pending ones) are
// reported, not judged, as the tool does.
//
// A baseline entry is a scenario name (the whole scenario may fail) or, for suite 0.2 and
// later, `scenario:check-id` (only that check may fail; the scenario's other checks stay
// enforced).  The verdicts follow the tool's rules: a failure or warning that no entry
// covers is UNEXPECTED; an entry whose scenario (or check) passes is STALE.  The tool
// itself parses the files properly and decides the exit status; this only labels.
import { readFileSync, readdirSync, writeFileSync } from "node:fs";
import { join } from "node:path";

const [resultsDir, baselinePath, mode = "gate", requirementsPath = "-"] = process.argv.slice(2);
const reportOnly = mode === "report";

// The "- entry" lines under a top-level "server:" key (comments stripped).  Enough for
// the baseline files and the suite's requirement files, which are flat lists.
function serverList(text, key = "server") {
  const out = [];
  let inside = false;
  for (const raw of text.split("\n")) {
    const line = raw.replace(/#.*/, "").trimEnd();
    if (!line.trim()) continue;
    if (/^\S/.test(line)) {
      inside = line.trim() === `${key}:`;
      continue;
    }
    const m = inside && line.match(/^\s+-\s+(\S+)$/);
    if (m) out.push(m[1]);
  }
  return out;
}

const entries = baselinePath === "-" ? [] : serverList(readFileSync(baselinePath, "utf8"));
const wholeScenarios = new Set(entries.filter((e) => !e.includes(":")));
const checkEntries = new Map(); // scenario -> Set(check id)
for (const e of entries.filter((x) => x.includes(":"))) {
  const [scenario, check] = [e.slice(0, e.indexOf(":")), e.slice(e.indexOf(":") + 1)];
  if (!checkEntries.has(scenario)) checkEntries.set(scenario, new Set());
  checkEntries.get(scenario).add(check);
}
// Scored scenarios of a requirement set; null = every scenario is judged.
const scored = requirementsPath === "-" ? null : new Set(serverList(readFileSync(requirementsPath, "utf8")));

const severity = { FAILURE: 3, WARNING: 2, SUCCESS: 1 };
const failed = (c) => c.status === "FAILURE" || c.status === "WARNING";

const scenarios = [];
for (const entry of readdirSync(resultsDir, { withFileTypes: true })) {
  const m = entry.isDirectory() && entry.name.match(/^server-(.+)-\d{4}-\d\d-\d\dT[\d-]+Z$/);
  if (!m) continue;
  const name = m[1];
  let checks;
  try {
    checks = JSON.parse(readFileSync(join(resultsDir, entry.name, "checks.json"), "utf8"));
  } catch {
    checks = [{ id: name, status: "FAILURE", errorMessage: "no checks.json: the scenario threw before it reported (see output.txt)" }];
  }
  // One verdict per check id, the most severe occurrence first (ids repeat in a run).
  const byId = new Map();
  for (const c of checks) {
    const prev = byId.get(c.id);
    if (!prev || (severity[c.status] ?? 0) > (severity[prev.status] ?? 0)) byId.set(c.id, c);
  }
  const count = (s) => checks.filter((c) => c.status === s).length;
  const failures = [...byId.values()].filter(failed);
  const listedChecks = checkEntries.get(name) ?? new Set();
  const unexpected = wholeScenarios.has(name) ? [] : failures.filter((c) => !listedChecks.has(c.id));
  const staleChecks = [...listedChecks].filter((id) => byId.get(id)?.status === "SUCCESS");
  let verdict;
  if (scored && !scored.has(name)) {
    verdict = failures.length ? "not scored: fails (reported only)" : "not scored: passes";
  } else if (reportOnly) {
    verdict = failures.length ? "fails (reported only)" : "pass";
  } else if (wholeScenarios.has(name)) {
    verdict = failures.length ? "expected failure" : "STALE (passes now: an improvement, remove it from the baseline)";
  } else if (unexpected.length) {
    verdict = "UNEXPECTED FAILURE (a regression from the baseline)";
  } else if (staleChecks.length) {
    verdict = `STALE (checks pass now: an improvement, remove ${staleChecks.map((id) => `${name}:${id}`).join(", ")})`;
  } else if (failures.length) {
    verdict = `expected failure (${failures.length} check${failures.length === 1 ? "" : "s"} in baseline)`;
  } else {
    verdict = "pass";
  }
  const shown = verdict.startsWith("UNEXPECTED") ? unexpected : failures;
  scenarios.push({
    scenario: name, verdict, success: count("SUCCESS"), failure: count("FAILURE"), warning: count("WARNING"),
    messages: shown.map((c) => `${c.status} ${c.id ?? ""}: ${c.errorMessage ?? c.description ?? ""}`.trim()),
  });
}
scenarios.sort((a, b) => a.scenario.localeCompare(b.scenario));

const width = Math.max(0, ...scenarios.map((s) => s.scenario.length));
console.log("\n== conformance summary");
for (const s of scenarios) {
  console.log(`  ${s.scenario.padEnd(width)}  ${s.verdict}  (${s.success} ok, ${s.failure} failed, ${s.warning} warnings)`);
  if (s.verdict.startsWith("UNEXPECTED") || s.verdict.startsWith("fails") || s.verdict.startsWith("not scored: fails"))
    for (const msg of s.messages) console.log(`      ${msg.slice(0, 400)}`);
}
const n = (prefix) => scenarios.filter((s) => s.verdict.startsWith(prefix)).length;
const totals = {
  scenarios: scenarios.length,
  pass: n("pass"),
  expected_failure: n("expected"),
  unexpected_failure: n("UNEXPECTED"),
  stale: n("STALE"),
  reported_failure: n("fails") + n("not scored: fails"),
  not_scored: n("not scored"),
  checks: {
    success: scenarios.reduce((a, s) => a + s.success, 0),
    failure: scenarios.reduce((a, s) => a + s.failure, 0),
    warning: scenarios.reduce((a, s) => a + s.warning, 0),
  },
};
if (reportOnly) console.log(`  scenarios ${totals.scenarios}: ${totals.pass} pass, ${totals.reported_failure} fail (reported only)`);
else
  console.log(`  scenarios ${totals.scenarios}: ${totals.pass} pass, ${totals.expected_failure} expected failures (baseline), ` +
    `${totals.unexpected_failure} unexpected failures (regressions), ${totals.stale} stale baseline entries (improvements)` +
    (totals.not_scored ? `, ${totals.not_scored} not scored (${n("not scored: fails")} of them failing)` : "") +
    `; checks ${totals.checks.success} ok, ${totals.checks.failure} failed, ${totals.checks.warning} warnings`);
writeFileSync(join(resultsDir, "summary.json"), JSON.stringify({ totals, scenarios }, null, 2) + "\n");

// The server binary as a child process, as the node harnesses (tests/e2e, tests/browser)
// start it for HTTP: its logs collected, stopped with SIGTERM (SIGKILL 10 s later), and its
// log free of sanitizer reports.  Node's built-in modules only (see net.mjs).
import { spawn } from "node:child_process";
import { existsSync } from "node:fs";
import assert from "node:assert/strict";

// What the ASan+UBSan build prints when it finds a bug.
const SANITIZER_REPORTS = ["ERROR: AddressSanitizer", "ERROR: LeakSanitizer", "runtime error:"];

export function assertNoSanitizerReport(log) {
  for (const needle of SANITIZER_REPORTS) {
    assert.ok(!log.includes(needle), `sanitizer report in the server's log:\n${log.slice(-4000)}`);
  }
}

const SETPRIV = "/usr/bin/setpriv";

/**
 * spawn(binary, argv, options), the child getting SIGTERM if this process dies first
 * (setpriv --pdeathsig, then exec: the same pid): a harness that node's test runner kills
 * on its timeout leaves no HTTP server behind (stdio servers end on their stdin's EOF).
 */
export function spawnOrphanProof(binary, argv, options = {}) {
  if (!existsSync(SETPRIV)) return spawn(binary, argv, options);
  return spawn(SETPRIV, ["--pdeathsig", "TERM", "--", binary, ...argv], options);
}

/**
 * Spawns binary with argv, stdin closed (an HTTP server has no business with it: a binary that
 * still serves stdio exits at once instead of hanging).  Returns { proc, log(), stdout(),
 * exit(), stop() }: exit() is null while it runs, then { code, signal }; stop() ends it (if
 * it still runs) and resolves once it is gone.
 */
export function spawnServer(binary, argv, options = {}) {
  const proc = spawnOrphanProof(binary, argv, { stdio: ["ignore", "pipe", "pipe"], ...options });
  let log = "";
  let stdout = "";
  proc.stderr.on("data", (c) => (log += c.toString()));
  proc.stdout.on("data", (c) => (stdout += c.toString()));
  let exit = null;
  const exited = new Promise((r) => proc.once("exit", (code, signal) => r((exit = { code, signal }))));
  const stop = async () => {
    if (exit === null) {
      proc.kill("SIGTERM");
      const killer = setTimeout(() => proc.kill("SIGKILL"), 10000);
      await exited;
      clearTimeout(killer);
    }
  };
  return { proc, log: () => log, stdout: () => stdout, exit: () => exit, stop };
}

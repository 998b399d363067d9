#!/usr/bin/env bash
# End-to-end tests: real MCP clients (the official TypeScript SDK, v1 and v2, and the
# Inspector CLI, v1 and v2) against the server binary. Installs the pinned npm packages into
# tests/e2e/node_modules with `npm ci` when package-lock.json changed (a stamp file remembers
# the lock it installed), then runs every tests/e2e/test/*.test.mjs with node's built-in
# test runner, on the Node 22 that the npm package `node` (pinned in package.json) provides:
# Inspector 2.12.0 needs Node >= 22.19 and the machine's Node is 20.
#
# Tests that need what the server does not do yet (protocol 2026-07-28, tasks) are named in
# expected-failures.txt with the reason: they run, and their failure is reported as XFAIL
# (a TODO of node:test), not a failure; a listed test that passes (XPASS) fails the run
# (remove its line), and so does a line that names no test. Only what the server lacks is
# listed: a failure of what it does today (the handshake era) always fails the run.
#
#   tests/e2e/run.sh [node --test options, e.g. --test-name-pattern=progress] [test files]
#
# Environment:
#   MPS_BINARY            the server binary (default: build/mcp-python-exec-sandbox)
#   MPS_TEST_BACKEND      sandbox backend the servers run with (default: none)
#   MPS_E2E_REQUIRE_HTTP  1 = fail, rather than skip, when the binary has no HTTP transport
#   MPS_E2E_OFFLINE       1 = install only from npm's local cache (npm ci --offline)
# Exits non-zero if any test fails.
set -euo pipefail
cd "$(dirname "$0")"
root=$(cd ../.. && pwd)

export MPS_BINARY=${MPS_BINARY:-$root/build/mcp-python-exec-sandbox}
if [ ! -x "$MPS_BINARY" ]; then
  echo "e2e: no server binary at $MPS_BINARY (build it, or set MPS_BINARY)" >&2
  exit 1
fi
for tool in node npm; do
  if ! command -v "$tool" >/dev/null; then
    echo "e2e: $tool is required (Node.js >= 20 with npm)" >&2
    exit 1
  fi
done
node_major=$(node -p 'process.versions.node.split(".")[0]')
if [ "$node_major" -lt 20 ]; then
  echo "e2e: Node.js >= 20 is required, found $(node --version)" >&2
  exit 1
fi

# Install exactly what the lock file says, and only when it changed: a repeated run needs
# no network at all, and a fresh one reads npm's cache before the registry.
stamp=node_modules/.mps-e2e-lock.sha256
want=$(sha256sum package-lock.json | cut -d' ' -f1)
if [ ! -f "$stamp" ] || [ "$(cat "$stamp")" != "$want" ]; then
  echo "== e2e: npm ci (package-lock.json changed or node_modules missing)"
  npm_flags=(--prefer-offline --no-audit --no-fund --loglevel=error)
  if [ "${MPS_E2E_OFFLINE:-0}" = 1 ]; then npm_flags=(--offline --no-audit --no-fund --loglevel=error); fi
  npm ci "${npm_flags[@]}"
  echo "$want" >"$stamp"
fi

# The tests run on the Node 22 of the lock, whatever the machine has.
node_bin=$PWD/node_modules/.bin/node
if [ ! -x "$node_bin" ] || [ "$("$node_bin" -p 'process.versions.node.split(".")[0]')" -lt 22 ]; then
  echo "e2e: Node >= 22 expected at $node_bin (the npm package node of package.json)" >&2
  exit 1
fi

echo "== e2e: node $("$node_bin" --version), server $("$MPS_BINARY" --version), backend ${MPS_TEST_BACKEND:-none}"
# One test file at a time (each starts its own servers; the progress tests compare arrival
# order with the script's pace); a hung test fails after 2 minutes instead of hanging CI.
files=()
options=()
for arg in "$@"; do
  case "$arg" in
    *.mjs) files+=("$arg") ;;
    *) options+=("$arg") ;;
  esac
done
# Without file or option arguments the run is complete, and an entry of expected-failures.txt
# that names no test fails it (lib/xfail-reporter.mjs).
full=0
if [ ${#files[@]} -eq 0 ] && [ ${#options[@]} -eq 0 ]; then full=1; fi
# The self-test of the expected-failures mechanism first (a second), then the real tests.
[ ${#files[@]} -gt 0 ] || files=(selftest/*.selftest.mjs test/*.test.mjs)
status_file=$(mktemp "${TMPDIR:-/tmp}/mps-e2e-xfail.XXXXXX")
trap 'rm -f "$status_file"' EXIT
rc=0
MPS_E2E_FULL_RUN=$full MPS_E2E_XFAIL_STATUS=$status_file \
  "$node_bin" --test --test-concurrency=1 --test-timeout=120000 \
  --test-reporter=spec --test-reporter-destination=stdout \
  --test-reporter=./lib/xfail-reporter.mjs --test-reporter-destination=stdout \
  "${options[@]}" "${files[@]}" || rc=$?
if [ "$rc" -eq 0 ] && grep -q '"unmatched":\["' "$status_file"; then
  echo "e2e: FAILED: expected-failures.txt has lines that name no test (UNMATCHED above)" >&2
  rc=1
fi
if [ "$rc" -ne 0 ]; then
  echo "e2e: FAILED (exit $rc): a test failed that expected-failures.txt does not list, or a listed one passes (XPASS)" >&2
fi
exit "$rc"

#!/usr/bin/env bash
# End-to-end tests: real MCP clients (the official TypeScript SDK, the Inspector CLI) against
# the server binary. Installs the pinned npm packages into tests/e2e/node_modules with
# `npm ci` when package-lock.json changed (a stamp file remembers the lock it installed),
# then runs every tests/e2e/test/*.test.mjs with node's built-in test runner.
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

echo "== e2e: node $(node --version), server $("$MPS_BINARY" --version), backend ${MPS_TEST_BACKEND:-none}"
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
[ ${#files[@]} -gt 0 ] || files=(test/*.test.mjs)
exec node --test --test-reporter=spec --test-concurrency=1 --test-timeout=120000 "${options[@]}" "${files[@]}"

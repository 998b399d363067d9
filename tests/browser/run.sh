#!/usr/bin/env bash
# Browser tests of the playground page and the MCP App (issue 23): Debian's chromium
# (deploy/install-deps.sh installs it) driven by playwright-core, pinned by package-lock.json
# and installed into tests/browser/node_modules with `npm ci` when the lock changed (never a
# browser of playwright's own: it downloads one, which fails here).  Runs every *.test.mjs
# with node's test runner, one file at a time; screenshots and the app's recorded result go
# to <build>/browser-screenshots/ (CI keeps them as artifacts).
#
#   tests/browser/run.sh [node --test options] [test files]
#
# Environment: MPS_BINARY (default build/mcp-python-exec-sandbox), MPS_TEST_BACKEND (none),
# MPS_CHROMIUM (/usr/bin/chromium), MPS_SCREENSHOT_DIR, MPS_BROWSER_OFFLINE=1 (npm cache only).
set -euo pipefail
cd "$(dirname "$0")"
root=$(cd ../.. && pwd)
export MPS_BINARY=${MPS_BINARY:-$root/build/mcp-python-exec-sandbox}
[ -x "$MPS_BINARY" ] || { echo "browser: no server binary at $MPS_BINARY" >&2; exit 1; }
chromium=${MPS_CHROMIUM:-/usr/bin/chromium}
[ -x "$chromium" ] || { echo "browser: no $chromium (deploy/install-deps.sh installs Debian's chromium)" >&2; exit 1; }
command -v npm >/dev/null || { echo "browser: npm is required" >&2; exit 1; }

stamp=node_modules/.mps-browser-lock.sha256
want=$(sha256sum package-lock.json | cut -d' ' -f1)
if [ ! -f "$stamp" ] || [ "$(cat "$stamp")" != "$want" ]; then
  echo "== browser: npm ci (package-lock.json changed or node_modules missing)"
  flags=(--prefer-offline --no-audit --no-fund --loglevel=error)
  [ "${MPS_BROWSER_OFFLINE:-0}" = 1 ] && flags=(--offline --no-audit --no-fund --loglevel=error)
  PLAYWRIGHT_SKIP_BROWSER_DOWNLOAD=1 npm ci "${flags[@]}"
  echo "$want" >"$stamp"
fi

files=()
options=()
for arg in "$@"; do
  case "$arg" in
    *.mjs) files+=("$arg") ;;
    *) options+=("$arg") ;;
  esac
done
[ ${#files[@]} -gt 0 ] || files=(*.test.mjs)
echo "== browser: $("$chromium" --version 2>/dev/null | head -n1), node $(node --version), server $("$MPS_BINARY" --version)"
# A hung test fails after 3 minutes instead of hanging CI.
node --test --test-concurrency=1 --test-timeout=180000 "${options[@]}" "${files[@]}"

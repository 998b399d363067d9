#!/usr/bin/env bash
# Runs the MCP conformance suite (@modelcontextprotocol/conformance, server mode) against the
# product binary over Streamable HTTP, with baseline.yml as the expected failures, and
# summarises the result. Skips (exit 0, with a message) while the binary has no HTTP
# transport.
#
#   tests/conformance/run.sh [conformance server options, e.g. --scenario tools-list --verbose]
#
# Environment:
#   MPS_BINARY             the server binary (default: build/mcp-python-exec-sandbox)
#   MPS_BUILD_DIR          where results go, as <dir>/conformance-results (default: the binary's directory)
#   MPS_TEST_BACKEND       sandbox backend of the server (default: none)
#   MPS_CONFORMANCE_SUITE  active (default), all or pending
#   MPS_E2E_REQUIRE_HTTP   1 = fail, rather than skip, when the binary has no HTTP transport
#   MPS_CONFORMANCE_NPM_DIR  where the suite and Node 22 are installed (default: .cache/conformance-npm)
#
# The suite needs Node >= 22 (fs.globSync); the machine's Node is 20, so the npm package
# `node` (pinned in package.json) provides Node 22, first on PATH for the suite only. It is
# installed with `npm ci` from package-lock.json, only when the lock changed, outside the
# source tree (236 MB), and only once the server actually speaks HTTP.
# The suite cannot send headers, so the server runs without bearer tokens, on loopback.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)

binary=${MPS_BINARY:-$root/build/mcp-python-exec-sandbox}
build_dir=${MPS_BUILD_DIR:-$(dirname "$binary")}
results=$build_dir/conformance-results
backend=${MPS_TEST_BACKEND:-none}
suite=${MPS_CONFORMANCE_SUITE:-active}
npm_dir=${MPS_CONFORMANCE_NPM_DIR:-$root/.cache/conformance-npm}

if [ ! -x "$binary" ]; then
  echo "conformance: no server binary at $binary (build it, or set MPS_BINARY)" >&2
  exit 1
fi
for tool in node npm; do
  if ! command -v "$tool" >/dev/null; then
    echo "conformance: $tool is required (Node.js with npm)" >&2
    exit 1
  fi
done

work=$(mktemp -d "${TMPDIR:-/tmp}/mps-conformance.XXXXXX")
server_pid=
server_log=$work/server.log
cleanup() {
  local rc=$?
  if [ -n "$server_pid" ] && kill -0 "$server_pid" 2>/dev/null; then
    kill -TERM "$server_pid" 2>/dev/null || true
    for _ in $(seq 100); do kill -0 "$server_pid" 2>/dev/null || break; sleep 0.1; done
    kill -KILL "$server_pid" 2>/dev/null || true
    wait "$server_pid" 2>/dev/null || true
  fi
  # Under the sanitizer build, a report in the server's log fails the run.
  if [ -f "$server_log" ] && grep -qE 'ERROR: (Address|Leak)Sanitizer|runtime error:' "$server_log"; then
    echo "conformance: sanitizer report in the server's log:" >&2
    tail -n 60 "$server_log" >&2
    [ "$rc" -eq 0 ] && rc=1
  fi
  rm -rf "$work"
  exit "$rc"
}
trap cleanup EXIT

# ---------------------------------------------------------------- start the server over HTTP
port=$(node -e 'const s = require("net").createServer().listen(0, "127.0.0.1", () => { console.log(s.address().port); s.close(); });')
url="http://127.0.0.1:$port/mcp"
# stdin is /dev/null: a binary that still serves stdio exits at once instead of hanging.
"$binary" --transport http --host 127.0.0.1 --port "$port" --path /mcp \
  --sandbox-backend "$backend" --state-dir "$work/state" </dev/null >"$work/server.out" 2>"$server_log" &
server_pid=$!

listening=0
for _ in $(seq 300); do # 15 s
  if ! kill -0 "$server_pid" 2>/dev/null; then break; fi
  if (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; then listening=1; break; fi
  sleep 0.05
done

if [ "$listening" = 0 ]; then
  status=0
  if ! kill -0 "$server_pid" 2>/dev/null; then
    wait "$server_pid" || status=$?
    server_pid=
  fi
  why=
  if [ "$status" = 2 ] && grep -q "Invalid transport" "$server_log"; then
    why="the binary rejects --transport http (exit 2, Invalid transport)"
  elif grep -qE "unrecognized arguments: --(transport|host|port|path)" "$server_log"; then
    why="the binary does not know the HTTP flags yet"
  elif grep -q "serving on stdio" "$server_log"; then
    why="the binary accepts --transport http but still serves stdio (HTTP transport not wired in yet)"
  fi
  if [ -n "$why" ] && [ "${MPS_E2E_REQUIRE_HTTP:-0}" != 1 ]; then
    echo "conformance: skipped: HTTP transport not available: $why"
    exit 0
  fi
  echo "conformance: the server did not listen on $url (exit status $status${why:+; $why}):" >&2
  tail -n 40 "$server_log" >&2
  exit 1
fi

# ---------------------------------------------------------------- install the suite and Node 22
mkdir -p "$npm_dir"
want=$(cat "$here/package.json" "$here/package-lock.json" | sha256sum | cut -d' ' -f1)
stamp=$npm_dir/node_modules/.mps-conformance-lock.sha256
if [ ! -f "$stamp" ] || [ "$(cat "$stamp")" != "$want" ]; then
  echo "== conformance: npm ci in $npm_dir (package-lock.json changed or nothing installed)"
  cp "$here/package.json" "$here/package-lock.json" "$npm_dir/"
  (cd "$npm_dir" && npm ci --prefer-offline --no-audit --no-fund --loglevel=error)
  echo "$want" >"$stamp"
fi
export PATH="$npm_dir/node_modules/.bin:$PATH"
node_major=$(node -p 'process.versions.node.split(".")[0]')
if [ "$node_major" -lt 22 ]; then
  echo "conformance: Node >= 22 expected from $npm_dir/node_modules/.bin, got $(node --version)" >&2
  exit 1
fi

# ---------------------------------------------------------------- run
rm -rf "$results"
mkdir -p "$results"
echo "== conformance: suite $suite against $url (server $("$binary" --version), backend $backend, node $(node --version))"
set +e
conformance server --url "$url" --suite "$suite" -o "$results" --expected-failures "$here/baseline.yml" "$@" \
  >"$results/output.txt" 2>&1
rc=$?
set -e
# The tool's own verdict on the baseline (expected / stale / unexpected), then our summary.
sed -n '/=== SUMMARY ===/,$p' "$results/output.txt"
node "$here/summarise.mjs" "$results" "$here/baseline.yml"
echo "   full output: $results/output.txt; checks: $results/server-*/checks.json"
if ! kill -0 "$server_pid" 2>/dev/null; then
  echo "conformance: the server died during the run:" >&2
  tail -n 40 "$server_log" >&2
  exit 1
fi
if [ "$rc" -ne 0 ]; then
  echo "conformance: FAILED (exit $rc): a scenario failed that baseline.yml does not expect, or a listed one now passes" >&2
  exit "$rc"
fi
echo "conformance: passed (all failures expected by baseline.yml)"

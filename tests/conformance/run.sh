#!/usr/bin/env bash
# Runs the MCP conformance suite (@modelcontextprotocol/conformance, server mode) over
# Streamable HTTP, three times, and summarises each run:
#   1. the product binary, active suite, with baseline.yml as the expected failures (the
#      scenarios that need the suite's fixture tools, resources and prompts);
#   2. the fixture server (fixture.c: the same router and transport plus every fixture),
#      active suite, with fixture-baseline.yml (empty: everything must pass);
#   3. the fixture server, pending suite, reported only (never fails the run).
# Skips (exit 0, with a message) while the product binary has no HTTP transport.
#
#   tests/conformance/run.sh [conformance server options, e.g. --scenario tools-list --verbose]
#
# Options go to runs 1 and 2; with options, run 3 is left out.
#
# Environment:
#   MPS_BINARY             the server binary (default: build/mcp-python-exec-sandbox)
#   MPS_CONFORMANCE_FIXTURE  the fixture server (default: mps-conformance-fixture beside MPS_BINARY)
#   MPS_BUILD_DIR          where results go (default: the binary's directory), as
#                          <dir>/conformance-results (product), conformance-results-fixture and
#                          conformance-results-pending
#   MPS_TEST_BACKEND       sandbox backend of the servers (default: none)
#   MPS_CONFORMANCE_SUITE  active (default), all or pending, for runs 1 and 2 (run 3 only with active)
#   MPS_E2E_REQUIRE_HTTP   1 = fail, rather than skip, when the binary has no HTTP transport
#   MPS_CONFORMANCE_NPM_DIR  where the suite and Node 22 are installed (default: .cache/conformance-npm)
#
# The suite needs Node >= 22 (fs.globSync); the machine's Node is 20, so the npm package
# `node` (pinned in package.json) provides Node 22, first on PATH for the suite only. It is
# installed with `npm ci` from package-lock.json, only when the lock changed, outside the
# source tree (236 MB), and only once the server actually speaks HTTP.
# The suite cannot send headers, so the servers run without bearer tokens, on loopback.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)

binary=${MPS_BINARY:-$root/build/mcp-python-exec-sandbox}
fixture=${MPS_CONFORMANCE_FIXTURE:-$(dirname "$binary")/mps-conformance-fixture}
build_dir=${MPS_BUILD_DIR:-$(dirname "$binary")}
results=$build_dir/conformance-results
fixture_results=$build_dir/conformance-results-fixture
pending_results=$build_dir/conformance-results-pending
backend=${MPS_TEST_BACKEND:-none}
suite=${MPS_CONFORMANCE_SUITE:-active}
npm_dir=${MPS_CONFORMANCE_NPM_DIR:-$root/.cache/conformance-npm}

if [ ! -x "$binary" ]; then
  echo "conformance: no server binary at $binary (build it, or set MPS_BINARY)" >&2
  exit 1
fi
if [ ! -x "$fixture" ]; then
  echo "conformance: no fixture server at $fixture (build the mps-conformance-fixture target," \
    "or set MPS_CONFORMANCE_FIXTURE)" >&2
  exit 1
fi
for tool in node npm; do
  if ! command -v "$tool" >/dev/null; then
    echo "conformance: $tool is required (Node.js with npm)" >&2
    exit 1
  fi
done

work=$(mktemp -d "${TMPDIR:-/tmp}/mps-conformance.XXXXXX")
server_pids=()
server_logs=()
stop_server() {
  local pid=$1
  if kill -0 "$pid" 2>/dev/null; then
    kill -TERM "$pid" 2>/dev/null || true
    for _ in $(seq 100); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    kill -KILL "$pid" 2>/dev/null || true
  fi
  wait "$pid" 2>/dev/null || true
}
cleanup() {
  local rc=$?
  local pid log
  for pid in "${server_pids[@]}"; do stop_server "$pid"; done
  # Under the sanitizer build, a report in a server's log fails the run.
  for log in "${server_logs[@]}"; do
    if [ -f "$log" ] && grep -qE 'ERROR: (Address|Leak)Sanitizer|runtime error:' "$log"; then
      echo "conformance: sanitizer report in $(basename "$log" .log)'s log:" >&2
      tail -n 60 "$log" >&2
      [ "$rc" -eq 0 ] && rc=1
    fi
  done
  rm -rf "$work"
  exit "$rc"
}
trap cleanup EXIT

# start_server NAME BINARY: starts BINARY over HTTP on a free loopback port; sets
# server_pid, server_log and url.  Returns 0 once it listens, 1 if it died or never listened
# (15 s).  stdin is /dev/null: a binary that still serves stdio exits at once.
start_server() {
  local name=$1 bin=$2 port
  port=$(node -e 'const s = require("net").createServer().listen(0, "127.0.0.1", () => { console.log(s.address().port); s.close(); });')
  url="http://127.0.0.1:$port/mcp"
  server_log=$work/$name.log
  "$bin" --transport http --host 127.0.0.1 --port "$port" --path /mcp \
    --sandbox-backend "$backend" --state-dir "$work/state-$name" </dev/null >"$work/$name.out" 2>"$server_log" &
  server_pid=$!
  server_pids+=("$server_pid")
  server_logs+=("$server_log")
  for _ in $(seq 300); do
    kill -0 "$server_pid" 2>/dev/null || return 1
    if (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; then return 0; fi
    sleep 0.05
  done
  return 1
}

# ---------------------------------------------------------------- start the product over HTTP
product_pid=
if start_server product "$binary"; then
  product_pid=$server_pid
else
  status=0
  if ! kill -0 "$server_pid" 2>/dev/null; then wait "$server_pid" || status=$?; fi
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
product_url=$url
product_log=$server_log

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

# run_suite DIR BASELINE|- MODE URL [conformance options...]: runs the suite into DIR (emptied
# first), prints the tool's summary and ours; sets suite_rc to the tool's exit status.  MODE
# "gate" checks BASELINE; "report" only reports (for pending scenarios, no baseline).
run_suite() {
  local dir=$1 baseline=$2 mode=$3 target=$4
  shift 4
  local expect=()
  [ "$baseline" != - ] && expect=(--expected-failures "$baseline")
  rm -rf "$dir"
  mkdir -p "$dir"
  set +e
  conformance server --url "$target" -o "$dir" "${expect[@]}" "$@" >"$dir/output.txt" 2>&1
  suite_rc=$?
  set -e
  # The tool's own verdict on the baseline (expected / stale / unexpected), then our summary.
  sed -n '/=== SUMMARY ===/,$p' "$dir/output.txt"
  node "$here/summarise.mjs" "$dir" "$baseline" "$mode"
  echo "   full output: $dir/output.txt; checks: $dir/server-*/checks.json"
}

# server_alive PID LOG NAME: fails (with the log's tail) if the server died during the runs.
server_alive() {
  if ! kill -0 "$1" 2>/dev/null; then
    echo "conformance: the $3 died during the run:" >&2
    tail -n 40 "$2" >&2
    return 1
  fi
}

failed=0

# ---------------------------------------------------------------- 1. the product
echo "== conformance: suite $suite against the product at $product_url (server $("$binary" --version), backend $backend, node $(node --version))"
run_suite "$results" "$here/baseline.yml" gate "$product_url" --suite "$suite" "$@"
product_rc=$suite_rc
server_alive "$product_pid" "$product_log" "product server" || failed=1
if [ "$product_rc" -ne 0 ]; then
  echo "conformance: product FAILED (exit $product_rc): a scenario failed that baseline.yml does not expect, or a listed one now passes" >&2
  failed=1
fi
stop_server "$product_pid"

# ---------------------------------------------------------------- 2. and 3. the fixture server
if ! start_server fixture "$fixture"; then
  echo "conformance: the fixture server did not listen on $url:" >&2
  tail -n 40 "$server_log" >&2
  exit 1
fi
fixture_pid=$server_pid
fixture_log=$server_log
echo
echo "== conformance: suite $suite against the fixture server at $url ($fixture)"
run_suite "$fixture_results" "$here/fixture-baseline.yml" gate "$url" --suite "$suite" "$@"
fixture_rc=$suite_rc
if [ "$fixture_rc" -ne 0 ]; then
  echo "conformance: fixture FAILED (exit $fixture_rc): a scenario failed that fixture-baseline.yml does not expect, or a listed one now passes" >&2
  failed=1
fi
if [ "$suite" = active ] && [ $# -eq 0 ]; then
  echo
  echo "== conformance: pending scenarios against the fixture server (reported, not gating)"
  run_suite "$pending_results" - report "$url" --suite pending
  [ "$suite_rc" -eq 0 ] || echo "conformance: pending scenarios: some fail (exit $suite_rc); reported only"
fi
server_alive "$fixture_pid" "$fixture_log" "fixture server" || failed=1

if [ "$failed" -ne 0 ]; then
  echo "conformance: FAILED" >&2
  exit 1
fi
echo "conformance: passed (product: only the failures baseline.yml expects; fixture server: the whole suite)"

#!/usr/bin/env bash
# Runs the MCP conformance suite (@modelcontextprotocol/conformance, server mode) over
# Streamable HTTP against the product binary and the fixture server, and summarises each
# run.  Two releases of the suite are installed side by side (package.json):
#
#   0.1.16 (the handshake era only; what CI has always run):
#     1. the product, active suite, baseline.yml;
#     2. the fixture server (fixture.c: the same router and transport plus every fixture),
#        active suite, fixture-baseline.yml (empty: everything must pass);
#     3. the fixture server, pending suite, reported only (never fails the run);
#   0.2.0-alpha.12 ("next": both eras), for each revision R in 2026-07-28 and 2025-11-25,
#   in two modes, --requirements R and then --spec-version R --suite all:
#     4. the product, baseline-R.yml;
#     5. the fixture server, fixture-baseline-R.yml.
#     A requirement set runs exactly the scenarios revision R requires, frozen at its
#     release, at R's wire (it implies --spec-version R).  Its not-scored scenarios (the
#     tasks extension, the suite's pending ones) run and are reported, and never fail
#     the run.  --spec-version R --suite all runs every scenario of R the suite has now,
#     the pending ones gated too (and no tasks-extension one: they carry no version).
#     One baseline serves both modes; its entries for pending scenarios only matter in
#     the second.  A baseline records today's failures, scenario by scenario or check by
#     check: a failure it does not list is a regression and fails the run; a listed one
#     that passes is an improvement, reported as STALE, and fails the run too until its
#     line goes (so the list only shrinks).
# Skips (exit 0, with a message) while the product binary has no HTTP transport.
#
#   tests/conformance/run.sh [conformance server options, e.g. --scenario tools-list --verbose]
#
# Options go to the gated runs (1, 2, 4, 5); with options, run 3 is left out and runs 4
# and 5 use only --spec-version R (the tool refuses to combine --requirements with
# --scenario, --suite or --spec-version).
#
# Environment:
#   MPS_BINARY             the server binary (default: build/mcp-python-exec-sandbox)
#   MPS_CONFORMANCE_FIXTURE  the fixture server (default: mps-conformance-fixture beside MPS_BINARY)
#   MPS_BUILD_DIR          where results go (default: the binary's directory), as
#                          <dir>/conformance-results (product), conformance-results-fixture,
#                          conformance-results-pending, and for the next suite
#                          conformance-next-R (product) and conformance-next-R-fixture,
#                          conformance-next-R-spec-version and conformance-next-R-spec-version-fixture
#   MPS_TEST_BACKEND       sandbox backend of the servers (default: none)
#   MPS_CONFORMANCE_SUITE  active (default), all or pending, for runs 1 and 2 (run 3 only with active)
#   MPS_CONFORMANCE_RUNS   which releases run: "0.1.16 next" (default), "0.1.16" or "next"
#   MPS_CONFORMANCE_NEXT_REVISIONS  revisions for runs 4 and 5 (default "2026-07-28 2025-11-25")
#   MPS_CONFORMANCE_NEXT_MODE  the modes of runs 4 and 5: "requirements spec-version"
#                          (default), "requirements" or "spec-version"
#   MPS_E2E_REQUIRE_HTTP   1 = fail, rather than skip, when the binary has no HTTP transport
#   MPS_CONFORMANCE_NPM_DIR  where the suites and Node 22 are installed (default: .cache/conformance-npm)
#
# The suites need Node >= 22 (fs.globSync); the machine's Node is 20, so the npm package
# `node` (pinned in package.json) provides Node 22, first on PATH for the suites only.  They
# are installed with `npm ci` from package-lock.json, only when the lock changed, outside
# the source tree (about 250 MB), and only once the server actually speaks HTTP.  The next
# release is installed under the alias `conformance-next` and run by its path: both
# releases name their command `conformance`.
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
releases=${MPS_CONFORMANCE_RUNS:-0.1.16 next}
next_revisions=${MPS_CONFORMANCE_NEXT_REVISIONS:-2026-07-28 2025-11-25}
next_modes=${MPS_CONFORMANCE_NEXT_MODE:-requirements spec-version}
npm_dir=${MPS_CONFORMANCE_NPM_DIR:-$root/.cache/conformance-npm}

run_legacy_release=0
run_next_release=0
for r in $releases; do
  case "$r" in
    0.1.16) run_legacy_release=1 ;;
    next) run_next_release=1 ;;
    *)
      echo "conformance: MPS_CONFORMANCE_RUNS: unknown release '$r' (0.1.16 or next)" >&2
      exit 2
      ;;
  esac
done
for m in $next_modes; do
  case "$m" in
    requirements | spec-version) ;;
    *)
      echo "conformance: MPS_CONFORMANCE_NEXT_MODE: unknown mode '$m' (requirements, spec-version or both)" >&2
      exit 2
      ;;
  esac
done
# The tool refuses --requirements beside --scenario and friends: options mean spec-version.
[ $# -eq 0 ] || next_modes=spec-version

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

# ---------------------------------------------------------------- install the suites and Node 22
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
# Run by path: node_modules/.bin/conformance is 0.1.16's.
conformance_0116=$npm_dir/node_modules/@modelcontextprotocol/conformance/dist/index.js
conformance_next=$npm_dir/node_modules/conformance-next/dist/index.js
next_version=$(node -p "require('$npm_dir/node_modules/conformance-next/package.json').version")

# run_suite TOOL DIR BASELINE|- MODE URL REQUIREMENTS|- [conformance options...]: runs the
# suite at TOOL into DIR (emptied first), prints the tool's summary and ours; sets suite_rc
# to the tool's exit status.  MODE "gate" checks BASELINE; "report" only reports (pending
# scenarios, no baseline).  REQUIREMENTS is the suite's requirement file when the run uses
# --requirements: its not-scored scenarios are reported, never judged.
run_suite() {
  local tool=$1 dir=$2 baseline=$3 mode=$4 target=$5 requirements=$6
  shift 6
  local expect=()
  [ "$baseline" != - ] && expect=(--expected-failures "$baseline")
  rm -rf "$dir"
  mkdir -p "$dir"
  local started=$SECONDS
  set +e
  node "$tool" server --url "$target" -o "$dir" "${expect[@]}" "$@" >"$dir/output.txt" 2>&1
  suite_rc=$?
  set -e
  # The tool's own verdict on the baseline (expected / stale / unexpected), then our summary.
  sed -n '/=== SUMMARY ===/,$p' "$dir/output.txt"
  node "$here/summarise.mjs" "$dir" "$baseline" "$mode" "$requirements"
  echo "   $((SECONDS - started)) s; full output: $dir/output.txt; checks: $dir/server-*/checks.json"
}

# server_alive PID LOG NAME: fails (with the log's tail) if the server died during the runs.
server_alive() {
  if ! kill -0 "$1" 2>/dev/null; then
    echo "conformance: the $3 died during the run:" >&2
    tail -n 40 "$2" >&2
    return 1
  fi
}

# next_selection MODE R [options]: the arguments that select revision R's scenarios in the
# next suite (into next_args), the requirement file its summary uses (into
# next_requirements) and the suffix of its results directory (into next_suffix).
next_selection() {
  local mode=$1 rev=$2 shift_args=("${@:3}")
  if [ "$mode" = requirements ]; then
    next_suffix=
    next_args=(--requirements "$rev")
    next_requirements=$npm_dir/node_modules/conformance-next/requirements/$rev.yaml
  else
    next_suffix=-spec-version
    next_args=(--spec-version "$rev")
    if [ ${#shift_args[@]} -gt 0 ]; then next_args+=("${shift_args[@]}"); else next_args+=(--suite all); fi
    next_requirements=-
  fi
}

failed=0

# ---------------------------------------------------------------- the product
if [ "$run_legacy_release" = 1 ]; then
  echo "== conformance 0.1.16: suite $suite against the product at $product_url (server $("$binary" --version), backend $backend, node $(node --version))"
  run_suite "$conformance_0116" "$results" "$here/baseline.yml" gate "$product_url" - --suite "$suite" "$@"
  if [ "$suite_rc" -ne 0 ]; then
    echo "conformance: product FAILED (exit $suite_rc): a scenario failed that baseline.yml does not expect, or a listed one now passes" >&2
    failed=1
  fi
fi
if [ "$run_next_release" = 1 ]; then
  for mode in $next_modes; do
    for rev in $next_revisions; do
      next_selection "$mode" "$rev" "$@"
      echo
      echo "== conformance $next_version: ${next_args[*]} against the product at $product_url"
      run_suite "$conformance_next" "$build_dir/conformance-next-$rev$next_suffix" "$here/baseline-$rev.yml" gate \
        "$product_url" "$next_requirements" "${next_args[@]}"
      if [ "$suite_rc" -ne 0 ]; then
        echo "conformance: product FAILED at $rev, ${next_args[*]} (exit $suite_rc): a scenario or check failed" \
          "that baseline-$rev.yml does not expect (a regression), or a listed one passes (an improvement: remove its line)" >&2
        failed=1
      fi
    done
  done
fi
server_alive "$product_pid" "$product_log" "product server" || failed=1
stop_server "$product_pid"

# ---------------------------------------------------------------- the fixture server
if ! start_server fixture "$fixture"; then
  echo "conformance: the fixture server did not listen on $url:" >&2
  tail -n 40 "$server_log" >&2
  exit 1
fi
fixture_pid=$server_pid
fixture_log=$server_log
if [ "$run_legacy_release" = 1 ]; then
  echo
  echo "== conformance 0.1.16: suite $suite against the fixture server at $url ($fixture)"
  run_suite "$conformance_0116" "$fixture_results" "$here/fixture-baseline.yml" gate "$url" - --suite "$suite" "$@"
  if [ "$suite_rc" -ne 0 ]; then
    echo "conformance: fixture FAILED (exit $suite_rc): a scenario failed that fixture-baseline.yml does not expect, or a listed one now passes" >&2
    failed=1
  fi
  if [ "$suite" = active ] && [ $# -eq 0 ]; then
    echo
    echo "== conformance 0.1.16: pending scenarios against the fixture server (reported, not gating)"
    run_suite "$conformance_0116" "$pending_results" - report "$url" - --suite pending
    [ "$suite_rc" -eq 0 ] || echo "conformance: pending scenarios: some fail (exit $suite_rc); reported only"
  fi
fi
if [ "$run_next_release" = 1 ]; then
  for mode in $next_modes; do
    for rev in $next_revisions; do
      next_selection "$mode" "$rev" "$@"
      echo
      echo "== conformance $next_version: ${next_args[*]} against the fixture server at $url"
      run_suite "$conformance_next" "$build_dir/conformance-next-$rev$next_suffix-fixture" "$here/fixture-baseline-$rev.yml" gate \
        "$url" "$next_requirements" "${next_args[@]}"
      if [ "$suite_rc" -ne 0 ]; then
        echo "conformance: fixture FAILED at $rev, ${next_args[*]} (exit $suite_rc): a scenario or check failed" \
          "that fixture-baseline-$rev.yml does not expect (a regression), or a listed one passes (an improvement: remove its line)" >&2
        failed=1
      fi
      # The suite does not score the tasks extension's scenarios; the fixture passes every
      # one of them, and must go on doing so (the router's tasks, input_required and
      # promotion are exercised nowhere else).
      unscored_failed=$(node -p "require('$build_dir/conformance-next-$rev$next_suffix-fixture/summary.json').totals.reported_failure")
      if [ "$unscored_failed" != 0 ]; then
        echo "conformance: fixture FAILED at $rev, ${next_args[*]}: $unscored_failed not-scored scenarios" \
          "(the tasks extension's) failed; the fixture passes all of them" >&2
        failed=1
      fi
    done
  done
fi
server_alive "$fixture_pid" "$fixture_log" "fixture server" || failed=1

if [ "$failed" -ne 0 ]; then
  echo "conformance: FAILED" >&2
  exit 1
fi
echo "conformance: passed (every failure is one a baseline expects, and no baseline entry passes)"

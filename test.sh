#!/usr/bin/env bash
# The test command: installs whatever is missing, builds, and runs the test suites: every
# one in a normal build, then those about the server's own memory again under
# AddressSanitizer + UndefinedBehaviorSanitizer.  Exits non-zero on any failure.
# docs/testing.md ("Tiers") says which test runs where.
#
#   ./test.sh            the submission tier (what CI runs)
#   ./test.sh --quick    the normal build only (no sanitizer pass)
#   ./test.sh --full     the long tier (nightly): the submission tier, plus the tests marked
#                        long, the ASan build's whole suite (both backends, the container
#                        backends, conformance, e2e), a fuzz campaign and the chaos
#                        driver's long campaign
set -euo pipefail
cd "$(dirname "$0")"

quick=0
full=0
for arg in "$@"; do
  case "$arg" in
    --quick) quick=1 ;;
    --full) full=1 ;;
    *) echo "usage: $0 [--quick | --full]" >&2; exit 2 ;;
  esac
done
if [ "$quick" = 1 ] && [ "$full" = 1 ]; then
  echo "usage: $0 [--quick | --full]" >&2
  exit 2
fi

./deploy/install-deps.sh --test

jobs=$(nproc 2>/dev/null || echo 2)
# As root the server can always use cgroups on our machines: their tests must run, not skip.
if [ "$(id -u)" = 0 ]; then
  export MPS_TEST_REQUIRE_CGROUPS=1
fi
# No server a test starts warms the package cache from the public index (it would send a
# DNS query off the machine at least); the test of warming opts in with a loopback index.
export MCP_PY_SANDBOX_WARM_CACHE=0
# pytest comes from Debian's python3-pytest: use the system interpreter, whatever PATH says.
# Every run lists its 30 slowest tests, and a test still running after $test_timeout seconds
# fails with its name and its threads' stacks (pytest-timeout, Debian's
# python3-pytest-timeout): a hang names its test instead of stalling the run.
test_timeout=${MPS_TEST_TIMEOUT:-600}
PYTEST=(/usr/bin/python3 -m pytest -q -p no:cacheprovider --durations=30 --timeout="$test_timeout")
# The submission tier leaves out the tests marked long (conftest.py); --full runs them.
if [ "$full" = 1 ]; then not_long=""; else not_long="not long"; fi

# Every stage's header carries the time (UTC) and how long the run has taken so far, and the
# end lists each stage's own length, so that a CI log shows where the minutes go.
t0=$(date +%s)
stage_times=()
stage() {
  local now
  now=$(date +%s)
  printf '== [%s +%d:%02d] %s\n' "$(date -u -d "@$now" +%T)" $(((now - t0) / 60)) $(((now - t0) % 60)) "$*"
}
# note_time NAME SECONDS: a line of the summary at the end.
note_time() { stage_times+=("$(printf '%5ds  %s' "$2" "$1")"); }
# timed NAME CMD...: runs CMD and notes how long it took (a failure ends the run as before).
timed() {
  local name=$1 start
  shift
  start=$(date +%s)
  "$@"
  note_time "$name" $(($(date +%s) - start))
}

# The docker and podman backends on real engines: deploy/container-engine.sh starts them by
# hand and builds the image (registry-free); the engines that came up are tested, and the
# ones it started are stopped at the end.  A machine where neither can run says so loudly.
engines=()
engine_reason=""
if [ "$(id -u)" = 0 ]; then
  mkdir -p build
  for e in docker podman; do
    if ./deploy/container-engine.sh setup "$e" >"build/engine-setup-$e.log" 2>&1; then
      engines+=("$e")
    else
      engine_reason+="$e: $(tail -n 3 "build/engine-setup-$e.log" | tr '\n' ' ') "
    fi
  done
  # (a fleet still running beside a failed ASan suite goes first: fleet_start; and an ASan
  # build still compiling beside a failed normal suite: asan_build_start)
  trap 'clients_stop; asan_stop; fleet_stop; ./deploy/container-engine.sh stop all >/dev/null 2>&1 || true' EXIT
else
  engine_reason="not root (the engine setup starts dockerd and runs debootstrap)"
  trap 'clients_stop; asan_stop' EXIT
fi
export MPS_TEST_CONTAINER_ENGINES="${engines[*]}"
if [ ${#engines[@]} -eq 0 ]; then
  echo "== SKIPPED: the docker/podman backends on a real engine: $engine_reason" >&2
fi

build() {
  local dir=$1
  shift
  # Both builds compile through ccache (Debian's, from deploy/install-deps.sh) into the user's
  # cache (~/.cache/ccache): a submission recompiles only what it changed.  The base directory
  # and the unhashed working directory let a fresh clone at another path hit as well.
  local launcher=()
  if command -v ccache >/dev/null 2>&1; then launcher=(-DCMAKE_C_COMPILER_LAUNCHER=ccache); fi
  CCACHE_BASEDIR="$PWD" CCACHE_NOHASHDIR=true cmake -S . -B "$dir" -DMPS_WERROR=ON "${launcher[@]}" "$@" >/dev/null
  CCACHE_BASEDIR="$PWD" CCACHE_NOHASHDIR=true cmake --build "$dir" -j"$jobs" >/dev/null
}

# The ASan build compiles in the background from the end of the normal build on, at the
# lowest priority: it takes the CPU the normal build's suites leave idle (they wait on
# processes, engines and browsers far more than they compute), and is ready, or nearly, when
# its own suites start (asan_build_wait).
asan_pid=""
asan_build_start() {
  export -f build
  export jobs
  # A session of its own, so that asan_stop ends the whole compile (make, the compilers).
  # (-O1, as AddressSanitizer's own documentation suggests: the sanitized server and tests run
  # about twice as fast as at -O0, and every check still holds)
  # Its outcome goes to build/asan-build.rc: the shell that waits for it may be a subshell
  # (asan_suite_start), which cannot wait for its parent's child.
  rm -f build/asan-build.rc build/asan-build.secs
  setsid nice -n 19 bash -c '(set -e; start=$(date +%s); build build-asan -DCMAKE_BUILD_TYPE=Debug -DCMAKE_C_FLAGS_DEBUG="-O1 -g" -DMPS_SANITIZE=ON
    echo $(($(date +%s) - start)) >build/asan-build.secs); echo $? >build/asan-build.rc' >build/asan-build.log 2>&1 &
  asan_pid=$!
}
asan_stop() {
  if [ -n "${asan_suite_pid:-}" ]; then
    kill_tree "$asan_suite_pid"
    wait "$asan_suite_pid" 2>/dev/null || true
    asan_suite_pid=""
    echo "== stopped unfinished: the ASan+UBSan build's suites in the background; the end of build-asan/suite.log:"
    tail -n 60 build-asan/suite.log 2>/dev/null || true
  fi
  [ -n "${asan_pid:-}" ] || return 0
  kill -- -"$asan_pid" 2>/dev/null || true
  wait "$asan_pid" 2>/dev/null || true
}
asan_build_wait() {
  local rc
  local waited=0
  while [ ! -s build/asan-build.rc ] && [ "$waited" -lt 3600 ]; do
    sleep 1
    waited=$((waited + 1))
  done
  rc=$(cat build/asan-build.rc 2>/dev/null || echo 1)
  stage "the ASan+UBSan build (compiled in the background beside the normal build's suites)"
  cat build/asan-build.log
  [ "$rc" = 0 ] || return "$rc"
  note_time "the ASan+UBSan build (in the background, niced)" "$(cat build/asan-build.secs)"
}

# The suites on the real engines: the normal build's container backends, then the fleet
# (issue 22: the server's image, nginx x3, a swarm stack, the Kubernetes manifests; about
# deployment, not sanitizers: the normal build's binary only).  They wait on engines,
# containers and servers far more than they compute, so they run in the background, one after
# the other (the fleet must find no container of another suite), from the end of the normal
# build's ctest on, beside the integration suites; a container suite of the ASan build
# (--full) waits for them before it uses the engine (fleet_wait), and so does the end of the
# run.  The suites that need docker run where the engine came up; nginx and the Kubernetes
# schemas run everywhere.
fleet_pid=""
fleet_start() {
  local dir=$1 name=$2
  local fleet=(kubernetes nginx)
  if [[ " $MPS_TEST_CONTAINER_ENGINES " == *" docker "* ]]; then
    fleet=(kubernetes container nginx swarm)
  else
    echo "== SKIPPED: the fleet's image and swarm suites (no docker engine: $engine_reason)" >&2
  fi
  fleet_title="the fleet: ${fleet[*]} (tests/fleet: the server's image, nginx x3, a swarm stack, the Kubernetes manifests)"
  container_title="$name: the container backends on real engines ($MPS_TEST_CONTAINER_ENGINES)"
  rm -f build/container.log build/container.secs build/fleet.log build/fleet.secs
  # (--full: the nginx suite's load at full size, 200 sessions x 20 calls instead of 60 x 10)
  (
    rc=0
    if [ -n "$MPS_TEST_CONTAINER_ENGINES" ]; then
      start=$(date +%s)
      MPS_BINARY="$PWD/$dir/mcp-python-exec-sandbox" "${PYTEST[@]}" tests/integration/test_container_real.py \
        >build/container.log 2>&1 || rc=$?
      echo $(($(date +%s) - start)) >build/container.secs
    fi
    start=$(date +%s)
    MPS_FLEET_FULL=$full MPS_BINARY="$PWD/$dir/mcp-python-exec-sandbox" tests/fleet/run.sh "${fleet[@]}" \
      >build/fleet.log 2>&1 || rc=$?
    echo $(($(date +%s) - start)) >build/fleet.secs
    exit "$rc"
  ) &
  fleet_pid=$!
}
# kill_tree PID: PID and every process below it (the suites' node and pytest processes).
kill_tree() {
  local c
  kill -STOP "$1" 2>/dev/null || true
  for c in $(pgrep -P "$1"); do kill_tree "$c"; done
  kill -TERM "$1" 2>/dev/null || true
  kill -CONT "$1" 2>/dev/null || true
}
# (a run that failed before fleet_wait: what the engines' suites had printed by then)
fleet_stop() {
  [ -n "${fleet_pid:-}" ] || return 0
  kill_tree "$fleet_pid"
  wait "$fleet_pid" 2>/dev/null || true
  fleet_pid=""
  local f
  for f in build/container.log build/fleet.log; do
    [ -f "$f" ] || continue
    echo "== stopped unfinished: the engines' suites in the background; the end of $f:"
    tail -n 40 "$f"
  done
}
fleet_wait() {
  [ -n "$fleet_pid" ] || return 0
  local rc=0
  wait "$fleet_pid" || rc=$?
  fleet_pid=""
  if [ -f build/container.log ]; then
    stage "$container_title (in the background)"
    cat build/container.log
    [ -f build/container.secs ] && note_time "normal build: container backends (in the background)" "$(cat build/container.secs)"
  fi
  stage "normal build: $fleet_title (in the background)"
  cat build/fleet.log
  [ -f build/fleet.secs ] && note_time "normal build: the fleet (in the background)" "$(cat build/fleet.secs)"
  return "$rc"
}

# The integration suites run under pytest-xdist (each test waits on the processes it starts
# far more than it computes).  Measured on two shared cores: four tests at once keep the
# CPU busy (two workers a backend with both backends side by side; four a backend took the
# same time with every test twice as long, and eight a backend thrashed: tests bounding a
# build's or a kill's time failed).  MPS_TEST_WORKERS sets another count for each pass.
#
# Which tests a pass runs is a marker expression (conftest.py's tables, docs/testing.md
# "Tiers"): the normal build runs every test on bwrap but the sandbox_independent ones (their
# servers use the none backend whatever MPS_TEST_BACKEND says), which run in the none pass,
# with those marked none_pass (the none backend's own run path); the ASan build runs the
# tests marked asan on the none backend; --full runs every test in the none pass too.
#
# What must not run beside other tests of the same run:
# - test_network.py's network namespace has fixed addresses and host routes to them: the
#   module is one xdist group (--dist loadgroup), so one worker makes the namespace once.
# - The tests marked serial (conftest.py; test_scheduling.py, and the tests that bound how
#   long a timeout's kill or a SIGTERM'd server's exit takes) judge time against the script's
#   own sleeps: they run after the parallel pass, one at a time (-n 0), the passes side by
#   side as before.
# Everything else asserts about its own server only: its own pids and descendants, cgroups
# named after its server's pid, markers carrying the test process's pid, its own state and
# temporary directories, ports the kernel picked.
workers=${MPS_TEST_WORKERS:-2}
# mexpr EXPR...: the non-empty expressions joined by "and".
mexpr() {
  local out="" e
  for e in "$@"; do
    [ -n "$e" ] && out="${out:+$out and }($e)"
  done
  printf '%s' "$out"
}
# integration DIR NAME WORKERS BACKEND=EXPR...: one pytest pass for each BACKEND=EXPR (the
# tests EXPR selects, on that backend; an empty EXPR: every test), side by side, WORKERS
# xdist workers each; then each pass's serial tests, one at a time.
integration() {
  local dir=$1 name=$2 n=$3 spec backend expr failed=0 start i rc
  shift 3
  local specs=("$@") pids=() rcs=() what=""
  for spec in "${specs[@]}"; do
    backend=${spec%%=*} expr=${spec#*=}
    what+="${what:+; }$backend${expr:+: $expr}"
  done
  start=$(date +%s)
  local hook_backend=${integration_hook%%:*} hook_i=""
  for spec in "${specs[@]}"; do
    backend=${spec%%=*} expr=${spec#*=}
    [ -n "$integration_hook" ] && [ "$backend" = "$hook_backend" ] && hook_i=${#pids[@]}
    rm -rf "/tmp/mps-it-$dir-$backend.$$"
    MPS_TEST_BACKEND=$backend MPS_BINARY="$PWD/$dir/mcp-python-exec-sandbox" "${PYTEST[@]}" tests/integration \
      --ignore=tests/integration/test_container_real.py --basetemp="/tmp/mps-it-$dir-$backend.$$" \
      -n "$n" --dist loadgroup -m "$(mexpr "not serial" "$expr" "$not_long")" >"$dir/integration-$backend.log" 2>&1 &
    pids+=($!)
  done
  # (the hook's pass first: its command starts when that pass's parallel run ends, beside the
  # others' still running)
  if [ -n "$hook_i" ]; then
    rc=0
    wait "${pids[$hook_i]}" || rc=$?
    rcs[$hook_i]=$rc
    ${integration_hook#*:}
  fi
  for i in "${!specs[@]}"; do
    [ "$i" = "$hook_i" ] && rc=${rcs[$i]} || { rc=0; wait "${pids[$i]}" || rc=$?; }
    [ "$rc" = 5 ] && rc=0 # (5: no test selected)
    rcs[$i]=$rc
  done
  note_time "$name: integration tests, parallel pass ($what)" $(($(date +%s) - start))
  # (what the hook started ends before the serial tests, which judge time)
  [ -z "$hook_i" ] || ${integration_join:-true} || failed=1
  start=$(date +%s)
  pids=()
  for spec in "${specs[@]}"; do
    backend=${spec%%=*} expr=${spec#*=}
    echo "-- the tests marked serial, one at a time" >>"$dir/integration-$backend.log"
    MPS_TEST_BACKEND=$backend MPS_BINARY="$PWD/$dir/mcp-python-exec-sandbox" "${PYTEST[@]}" tests/integration \
      --ignore=tests/integration/test_container_real.py --basetemp="/tmp/mps-it-$dir-$backend.$$/serial" \
      -n 0 -m "$(mexpr "serial" "$expr" "$not_long")" >>"$dir/integration-$backend.log" 2>&1 &
    pids+=($!)
  done
  for i in "${!specs[@]}"; do
    spec=${specs[$i]}
    backend=${spec%%=*} expr=${spec#*=}
    rc=0
    wait "${pids[$i]}" || rc=$?
    [ "$rc" = 5 ] && rc=0
    stage "$name: integration tests (the real binary over stdio and HTTP, sandbox backend $backend${expr:+, the tests: $expr}; $n xdist workers, then the serial tests)"
    cat "$dir/integration-$backend.log"
    rm -rf "/tmp/mps-it-$dir-$backend.$$"
    [ "$rc" = 0 ] && [ "${rcs[$i]}" = 0 ] || failed=1
  done
  note_time "$name: integration tests, serial pass" $(($(date +%s) - start))
  [ "$failed" = 0 ]
}

ctest_stage() {
  local dir=$1 name=$2
  stage "$name: unit tests, sandbox tests and fuzz-corpus replays (ctest)"
  timed "$name: ctest" ctest --test-dir "$dir" --output-on-failure -j"$jobs"
}
container_stage() {
  local dir=$1 name=$2
  [ -n "$MPS_TEST_CONTAINER_ENGINES" ] || return 0
  stage "$name: the container backends on real engines ($MPS_TEST_CONTAINER_ENGINES)"
  MPS_BINARY="$PWD/$dir/mcp-python-exec-sandbox" timed "$name: container backends" "${PYTEST[@]}" tests/integration/test_container_real.py
}
clients_stage() {
  local dir=$1 name=$2
  stage "$name: MCP conformance suites (0.1.16, and 0.2.0-alpha.12 for both eras) over Streamable HTTP"
  MPS_E2E_REQUIRE_HTTP=1 MPS_BINARY="$PWD/$dir/mcp-python-exec-sandbox" timed "$name: conformance" tests/conformance/run.sh
  stage "$name: end-to-end tests with real MCP clients (TypeScript SDK v1 and v2, Inspector CLI v1 and v2)"
  MPS_E2E_REQUIRE_HTTP=1 MPS_BINARY="$PWD/$dir/mcp-python-exec-sandbox" timed "$name: e2e" tests/e2e/run.sh
}

# The normal build's package, conformance, e2e and browser suites.
clients_normal() {
  local dir=$1 name=$2
  if [ "$(id -u)" = 0 ]; then
    # Packaging is not about sanitizers: the normal build's .deb only.
    stage "$name: the Debian package (built, installed into a fresh bookworm root, run, purged)"
    timed "$name: the Debian package" tests/package/test-deb.sh "$dir"
    stage "$name: deploy/install-deps.sh (the runtime set pulls no test tool; nothing left enabled; a fresh bookworm root)"
    timed "$name: install-deps" tests/package/test-install-deps.sh
  else
    echo "== SKIPPED: the Debian package test (needs root: chroot and mounts)" >&2
  fi
  clients_stage "$dir" "$name"
  # The page is the same in both builds (what it drives is tested above): the normal one only.
  stage "$name: browser tests of the playground page and the MCP App (chromium, playwright-core; screenshots in $dir/browser-screenshots/)"
  MPS_BINARY="$PWD/$dir/mcp-python-exec-sandbox" timed "$name: browser" tests/browser/run.sh
}
# In the submission tier they start in the background when the none pass's parallel run ends
# (it ends minutes before the bwrap pass's: they take its idle share of the machine), and end
# before the serial tests; their output and lengths are printed when they end.
clients_pid=""
clients_start() {
  rm -f build/clients.log build/clients.times
  (
    set -e
    note_time() { printf '%5ds  %s\n' "$2" "$1" >>build/clients.times; }
    clients_normal build "normal build"
  ) >build/clients.log 2>&1 &
  clients_pid=$!
}
clients_wait() {
  local rc=0 line
  [ -n "$clients_pid" ] || return 0
  wait "$clients_pid" || rc=$?
  clients_pid=""
  echo "== (the normal build's package, conformance, e2e and browser suites ran in the background beside the bwrap pass:)"
  cat build/clients.log
  if [ -f build/clients.times ]; then
    while IFS= read -r line; do stage_times+=("$line"); done <build/clients.times
  fi
  return "$rc"
}
clients_stop() {
  [ -n "${clients_pid:-}" ] || return 0
  kill_tree "$clients_pid"
  wait "$clients_pid" 2>/dev/null || true
  clients_pid=""
  echo "== stopped unfinished: the package, conformance, e2e and browser suites in the background; the end of build/clients.log:"
  tail -n 60 build/clients.log 2>/dev/null || true
}
# (when the bwrap pass's parallel run ends: the ASan build's suites start, and the clients
# end, before the serial tests)
clients_join() {
  [ "$quick" = 1 ] || asan_suite_start
  clients_wait
}
integration_hook=""
integration_join=""

# The normal build: every suite; the engines' suites (container backends, then the fleet) in
# the background beside the rest.
suite_normal() {
  local dir=build name="normal build"
  ctest_stage "$dir" "$name"
  fleet_start "$dir" "$name"
  # The none pass: the sandbox_independent tests, and of the others those marked none_pass
  # (the none backend's own run path, and what differs on it); --full: every test.
  local none_expr="sandbox_independent or none_pass"
  [ "$full" = 0 ] || none_expr=""
  if [ "$full" = 0 ]; then
    integration_hook="none:clients_start" integration_join=clients_join
  fi
  integration "$dir" "$name" "$workers" "bwrap=not sandbox_independent" "none=$none_expr" || return 1
  integration_hook="" integration_join=""
  [ "$quick" = 1 ] || [ "$full" = 1 ] || [ -n "$asan_suite_pid" ] || asan_suite_start
  [ "$full" = 0 ] || clients_normal "$dir" "$name"
}

# The ASan+UBSan build: the unit tests, the fuzz replays and the integration tests about the
# server's own memory (marked asan), on the none backend (the sandbox's own code runs in the
# unit and sandbox tests).  --full: every suite but the package, the browser and the fleet,
# on both backends, as the normal build.
suite_asan() {
  local dir=build-asan name="ASan+UBSan build"
  ctest_stage "$dir" "$name"
  if [ "$full" = 1 ]; then
    integration "$dir" "$name" "$workers" "bwrap=not sandbox_independent" "none=" || return 1
    # Its container suite asserts the engine holds no container but its own.
    fleet_wait || return 1
    container_stage "$dir" "$name"
    clients_stage "$dir" "$name"
  else
    integration "$dir" "$name" "${MPS_TEST_ASAN_WORKERS:-$((2 * workers))}" "none=asan" || return 1
  fi
}

# The submission tier runs the ASan build's suites in the background, from the end of the
# normal build's integration suites on, beside its package, conformance, e2e and browser
# suites (which wait on processes and pages far more than they compute); their output and
# lengths are printed when they end (asan_suite_wait).
asan_suite_pid=""
asan_suite_start() {
  mkdir -p build-asan
  rm -f build-asan/suite.log build-asan/suite.times
  (
    # (its integration passes start nothing when a pass ends: the normal build's hook is not
    # theirs)
    integration_hook="" integration_join=""
    note_time() { printf '%5ds  %s\n' "$2" "$1" >>build-asan/suite.times; }
    asan_build_wait
    export ASAN_OPTIONS=detect_leaks=1:abort_on_error=0:halt_on_error=1
    export UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
    suite_asan
  ) >build-asan/suite.log 2>&1 &
  asan_suite_pid=$!
}
asan_suite_wait() {
  local rc=0 line
  wait "$asan_suite_pid" || rc=$?
  asan_suite_pid=""
  cat build-asan/suite.log
  if [ -f build-asan/suite.times ]; then
    while IFS= read -r line; do stage_times+=("$line"); done <build-asan/suite.times
  fi
  return "$rc"
}

# --full: what is too slow for every submission.
long_tier() {
  stage "long tier: the fuzz campaign (tests/fuzz/campaign.sh, ${MPS_FULL_FUZZ_RUNS:=1000000} executions a target, corpus not merged)"
  timed "long tier: fuzz campaign" tests/fuzz/campaign.sh --no-merge --runs "$MPS_FULL_FUZZ_RUNS"
  if [ -f tests/integration/test_chaos.py ]; then
    stage "long tier: the chaos driver's long campaign (${MPS_FULL_CHAOS_SECONDS:=600} s, ASan+UBSan build, none backend)"
    MPS_CHAOS_SECONDS=$MPS_FULL_CHAOS_SECONDS MPS_TEST_BACKEND=none MPS_BINARY="$PWD/build-asan/mcp-python-exec-sandbox" \
      timed "long tier: chaos campaign" "${PYTEST[@]}" --timeout=$((MPS_FULL_CHAOS_SECONDS * 3 + 600)) \
      tests/integration/test_chaos.py
  fi
}

stage "format: every .c and .h file as .clang-format has it (clang-format 14)"
git ls-files '*.c' '*.h' | xargs clang-format --dry-run --Werror

stage "layers: every #include follows the layer table, no include cycles (and the check's self-test)"
/usr/bin/python3 scripts/check-layers.py
/usr/bin/python3 scripts/check-layers.py --self-test

stage "the normal build (RelWithDebInfo)"
timed "the normal build" build build -DCMAKE_BUILD_TYPE=RelWithDebInfo
[ "$quick" = 1 ] || asan_build_start
# The playground's editor bundle (CodeMirror, from npm), before the package test packs it.
stage "the playground's editor bundle (ui/build.sh)"
timed "the editor bundle" ui/build.sh build
suite_normal

if [ "$full" = 1 ]; then
  asan_build_wait
  export ASAN_OPTIONS=detect_leaks=1:abort_on_error=0:halt_on_error=1
  export UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
  suite_asan
elif [ "$quick" = 0 ]; then
  asan_suite_wait
fi
fleet_wait
[ "$full" = 0 ] || long_tier
stage "all tests passed; each stage's length (some ran side by side):"
printf '%s\n' "${stage_times[@]}"

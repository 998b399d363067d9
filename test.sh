#!/usr/bin/env bash
# The test command: installs whatever is missing, builds, and runs every test suite,
# first in a normal build, then again under AddressSanitizer + UndefinedBehaviorSanitizer.
# Exits non-zero on any failure.
#
#   ./test.sh            everything (what CI runs)
#   ./test.sh --quick    the normal build only (no sanitizer pass)
set -euo pipefail
cd "$(dirname "$0")"

quick=0
for arg in "$@"; do
  case "$arg" in
    --quick) quick=1 ;;
    *) echo "usage: $0 [--quick]" >&2; exit 2 ;;
  esac
done

./deploy/install-deps.sh

jobs=$(nproc 2>/dev/null || echo 2)
# As root the server can always use cgroups on our machines: their tests must run, not skip.
if [ "$(id -u)" = 0 ]; then
  export MPS_TEST_REQUIRE_CGROUPS=1
fi
# No server a test starts warms the package cache from the public index (it would send a
# DNS query off the machine at least); the test of warming opts in with a loopback index.
export MCP_PY_SANDBOX_WARM_CACHE=0
# pytest comes from Debian's python3-pytest: use the system interpreter, whatever PATH says.
PYTEST=(/usr/bin/python3 -m pytest -q -p no:cacheprovider)

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
  # (a fleet still running beside a failed ASan suite goes first: fleet_start)
  trap 'fleet_stop; ./deploy/container-engine.sh stop all >/dev/null 2>&1 || true' EXIT
else
  engine_reason="not root (the engine setup starts dockerd and runs debootstrap)"
fi
export MPS_TEST_CONTAINER_ENGINES="${engines[*]}"
if [ ${#engines[@]} -eq 0 ]; then
  echo "== SKIPPED: the docker/podman backends on a real engine: $engine_reason" >&2
fi

build() {
  local dir=$1
  shift
  cmake -S . -B "$dir" -DMPS_WERROR=ON "$@" >/dev/null
  cmake --build "$dir" -j"$jobs" >/dev/null
}

# The fleet (issue 22: the server's image, nginx x3, a swarm stack, the Kubernetes manifests)
# is about deployment, not sanitizers: the normal build's binary only.  Its suites wait on
# containers and servers far more than they compute, so they run beside the ASan build
# (fleet_start), and the ASan suite waits for them before it uses the engine (fleet_wait).
# The suites that need docker run where the engine came up; nginx and the Kubernetes
# schemas run everywhere.
fleet_pid=""
fleet_start() {
  local fleet=(kubernetes nginx)
  if [[ " $MPS_TEST_CONTAINER_ENGINES " == *" docker "* ]]; then
    fleet=(kubernetes container nginx swarm)
  else
    echo "== SKIPPED: the fleet's image and swarm suites (no docker engine: $engine_reason)" >&2
  fi
  fleet_title="the fleet: ${fleet[*]} (tests/fleet: the server's image, nginx x3, a swarm stack, the Kubernetes manifests)"
  MPS_BINARY="$PWD/build/mcp-python-exec-sandbox" tests/fleet/run.sh "${fleet[@]}" >build/fleet.log 2>&1 &
  fleet_pid=$!
}
fleet_stop() {
  [ -n "${fleet_pid:-}" ] || return 0
  pkill -P "$fleet_pid" 2>/dev/null || true
  kill "$fleet_pid" 2>/dev/null || true
  wait "$fleet_pid" 2>/dev/null || true
}
fleet_wait() {
  [ -n "$fleet_pid" ] || return 0
  local rc=0
  wait "$fleet_pid" || rc=$?
  fleet_pid=""
  echo "== normal build: $fleet_title"
  cat build/fleet.log
  return "$rc"
}

suite() {
  local dir=$1 name=$2
  echo "== $name: unit tests, sandbox tests and fuzz-corpus replays (ctest)"
  ctest --test-dir "$dir" --output-on-failure -j"$jobs" # check_layers_symbols: no call cycles
  # The two backends' integration suites run side by side (each test waits on processes far
  # more than it computes); each has its own pytest base directory and log, shown in turn.
  local backend pids=() failed=0
  for backend in bwrap none; do
    local base="/tmp/mps-it-$backend.$$"
    rm -rf "$base"
    MPS_TEST_BACKEND=$backend MPS_BINARY="$PWD/$dir/mcp-python-exec-sandbox" "${PYTEST[@]}" tests/integration \
      --ignore=tests/integration/test_container_real.py --basetemp="$base" >"$dir/integration-$backend.log" 2>&1 &
    pids+=($!)
  done
  local i=0
  for backend in bwrap none; do
    local rc=0
    wait "${pids[$i]}" || rc=$?
    echo "== $name: integration tests (the real binary over stdio, sandbox backend $backend)"
    cat "$dir/integration-$backend.log"
    rm -rf "/tmp/mps-it-$backend.$$"
    [ "$rc" = 0 ] || failed=1
    i=$((i + 1))
  done
  [ "$failed" = 0 ] || return 1
  # The ASan build's container suite asserts the engine holds no container but its own: the
  # fleet, which runs beside this build (fleet_start), must be over first.
  if [ "$dir" != build ]; then fleet_wait || return 1; fi
  if [ -n "$MPS_TEST_CONTAINER_ENGINES" ]; then
    echo "== $name: the container backends on real engines ($MPS_TEST_CONTAINER_ENGINES)"
    MPS_BINARY="$PWD/$dir/mcp-python-exec-sandbox" "${PYTEST[@]}" tests/integration/test_container_real.py
  fi
  if [ "$dir" = build ] && [ "$(id -u)" = 0 ]; then
    # Packaging is not about sanitizers: the normal build's .deb only.
    echo "== $name: the Debian package (built, installed into a fresh bookworm root, run, purged)"
    tests/package/test-deb.sh "$dir"
  elif [ "$dir" = build ]; then
    echo "== SKIPPED: the Debian package test (needs root: chroot and mounts)" >&2
  fi
  echo "== $name: MCP conformance suites (0.1.16, and 0.2.0-alpha.12 for both eras) over Streamable HTTP"
  MPS_E2E_REQUIRE_HTTP=1 MPS_BINARY="$PWD/$dir/mcp-python-exec-sandbox" tests/conformance/run.sh
  echo "== $name: end-to-end tests with real MCP clients (TypeScript SDK v1 and v2, Inspector CLI v1 and v2)"
  MPS_E2E_REQUIRE_HTTP=1 MPS_BINARY="$PWD/$dir/mcp-python-exec-sandbox" tests/e2e/run.sh
  if [ "$dir" = build ]; then
    # The page is the same in both builds (what it drives is tested above): the normal one only.
    echo "== $name: browser tests of the playground page and the MCP App (chromium, playwright-core; screenshots in $dir/browser-screenshots/)"
    MPS_BINARY="$PWD/$dir/mcp-python-exec-sandbox" tests/browser/run.sh
  fi
}

echo "== format: every .c and .h file as .clang-format has it (clang-format 14)"
git ls-files '*.c' '*.h' | xargs clang-format --dry-run --Werror

echo "== layers: every #include follows the layer table, no include cycles (and the check's self-test)"
/usr/bin/python3 scripts/check-layers.py
/usr/bin/python3 scripts/check-layers.py --self-test

build build -DCMAKE_BUILD_TYPE=RelWithDebInfo
# The playground's editor bundle (CodeMirror, from npm), before the package test packs it.
echo "== the playground's editor bundle (ui/build.sh)"
ui/build.sh build
suite build "normal build"
fleet_start
[ "$quick" = 0 ] || fleet_wait

if [ "$quick" = 0 ]; then
  build build-asan -DCMAKE_BUILD_TYPE=Debug -DMPS_SANITIZE=ON
  export ASAN_OPTIONS=detect_leaks=1:abort_on_error=0:halt_on_error=1
  export UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
  suite build-asan "ASan+UBSan build"
fi
echo "== all tests passed"

#!/usr/bin/env bash
# The benchmark command (not part of the test run):
#
#   bench/run.sh            # full run, about 5-8 minutes
#   bench/run.sh --quick    # fewer samples, under 2 minutes
#   bench/run.sh --cases 1,4 [--quick]
#
# Installs what is missing (the build dependencies, wrk, and the pinned TypeScript reference
# server into bench/node_modules from bench/package-lock.json), builds a release binary in
# build-bench/, runs every case (bench/bench.py) and writes bench/results/latest.json and
# bench/results/latest.md.  Loopback only.  Run as root (bubblewrap, apt-get), like ./run.sh.
set -euo pipefail
cd "$(dirname "$0")/.."

./deploy/install-deps.sh --test

if ! command -v wrk >/dev/null 2>&1; then
  echo "bench: installing wrk" >&2
  export DEBIAN_FRONTEND=noninteractive
  apt-get install -y -qq --no-install-recommends wrk >/dev/null 2>&1 ||
    { apt-get update -qq && apt-get install -y -qq --no-install-recommends wrk >/dev/null; } ||
    echo "bench: wrk could not be installed; the HTTP throughput case will say so" >&2
fi

# The reference server, exactly as locked.  Reinstalled only when the lock file changed.
if [ ! -f bench/node_modules/.package-lock.json ] ||
   [ bench/package-lock.json -nt bench/node_modules/.package-lock.json ]; then
  echo "bench: installing the reference server (npm ci)" >&2
  (cd bench && npm ci --no-audit --no-fund --loglevel=error >/dev/null) ||
    echo "bench: npm ci failed; the HTTP throughput case will say so" >&2
fi

cmake -S . -B build-bench -DCMAKE_BUILD_TYPE=Release -DMPS_TESTS=OFF >/dev/null
cmake --build build-bench -j"$(nproc 2>/dev/null || echo 2)" >/dev/null

exec /usr/bin/python3 bench/bench.py --binary build-bench/mcp-python-exec-sandbox "$@"

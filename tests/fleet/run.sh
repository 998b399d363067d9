#!/usr/bin/env bash
# The fleet suites (issue 22): the server's own image on the real engine, nginx in front of
# three instances, a one-node swarm stack, and the Kubernetes manifests against the API's
# schemas.  Installs the pinned npm packages into tests/fleet/node_modules with `npm ci` when
# package-lock.json changed, builds the image once per content (deploy/container/build.sh),
# runs the suites with node's test runner, and leaves no container, service, swarm or nginx
# behind (the trap sweeps what a crashed test left).
#
#   tests/fleet/run.sh [kubernetes] [container] [nginx] [swarm]     (default: all four)
#
# Environment:
#   MPS_BINARY        the server binary of the nginx suite (default: build/mcp-python-exec-sandbox)
#   MPS_TEST_BACKEND  the nginx suite's instances' sandbox (default bwrap)
# An engine that does not answer is started with deploy/container-engine.sh (and stopped
# again at the end); test.sh starts it itself before its suites.
set -euo pipefail
cd "$(dirname "$0")"
root=$(cd ../.. && pwd)
export MPS_BINARY=${MPS_BINARY:-$root/build/mcp-python-exec-sandbox}

suites=("$@")
[ ${#suites[@]} -gt 0 ] || suites=(kubernetes container nginx swarm)
for s in "${suites[@]}"; do
  case "$s" in kubernetes | container | nginx | swarm) ;; *) echo "usage: $0 [kubernetes] [container] [nginx] [swarm]" >&2; exit 2 ;; esac
done
want() { local s; for s in "${suites[@]}"; do [ "$s" = "$1" ] && return 0; done; return 1; }

stamp=node_modules/.mps-fleet-lock.sha256
lock=$(sha256sum package-lock.json | cut -d' ' -f1)
if [ ! -f "$stamp" ] || [ "$(cat "$stamp")" != "$lock" ]; then
  echo "== fleet: npm ci (package-lock.json changed or node_modules missing)"
  npm ci --prefer-offline --no-audit --no-fund --loglevel=error
  echo "$lock" >"$stamp"
fi

label=io.github.mcp-python-exec-sandbox.fleet
started_engine=0
swarm_ours=0
cleanup() {
  if docker version >/dev/null 2>&1; then
    if [ "$swarm_ours" = 1 ] || [ -f /tmp/mps-fleet-swarm.ours ]; then
      docker stack rm mps-fleet >/dev/null 2>&1 || true
      # The replicas' containers (deploy/swarm/launch.py's), should a launcher have left one.
      local n rids
      for n in 1 2 3 4 5 6 7 8; do
        rids=$(docker ps -aq --filter "label=io.github.mcp-python-exec-sandbox.replica-of=mps-fleet_server-slot$n" 2>/dev/null || true)
        if [ -n "$rids" ]; then docker rm -f -v $rids >/dev/null 2>&1 || true; fi
      done
      docker swarm leave --force >/dev/null 2>&1 || true
      rm -f /tmp/mps-fleet-swarm.ours
    fi
    local ids
    ids=$(docker ps -aq --filter "label=$label" 2>/dev/null || true)
    if [ -n "$ids" ]; then docker rm -f -v $ids >/dev/null 2>&1 || true; fi
  fi
  # nginx processes a test started (each writes its pid file under a directory of its own).
  local pidfile
  for pidfile in /tmp/mps-fleet-nginx-*/nginx.pid; do
    [ -f "$pidfile" ] || continue
    kill "$(cat "$pidfile")" 2>/dev/null || true
    rm -rf "$(dirname "$pidfile")"
  done
  if [ "$started_engine" = 1 ]; then "$root/deploy/container-engine.sh" stop docker >/dev/null 2>&1 || true; fi
}
trap cleanup EXIT

rc=0
# The image suite's test process (where a cancelled file was seen) records where each of its
# promises was made (trace-pending.mjs), and names those still pending should node:test
# cancel the file with its event loop empty.  (trace=1 run ...: not the nginx suite's
# thousands of calls.)
run() {
  local name=$1 out st=0 env=(env)
  echo "== fleet: $name"
  shift
  local pending
  pending=$(mktemp)
  if [ "${trace:-0}" = 1 ]; then
    env+=(NODE_OPTIONS="${NODE_OPTIONS:+$NODE_OPTIONS }--import=$PWD/trace-pending.mjs" MPS_TRACE_PENDING_FILE="$pending")
  fi
  out=$(mktemp)
  "${env[@]}" node --test --test-concurrency=1 --test-timeout=600000 --test-reporter=spec "$@" 2>&1 | tee "$out" || st=$?
  # node:test cancels a whole file when its event loop empties while a test's promise is
  # pending ("Promise resolution is still pending but the event loop has already resolved"):
  # a failure like any other, and the trace (trace=1) says where each pending promise of the
  # tests was made.  (The image suite's was a fetch of the published port: lib.mjs get().)
  if [ "$st" != 0 ] && [ -s "$pending" ] &&
    grep -q "Promise resolution is still pending but the event loop has already resolved" "$out"; then
    echo "== fleet: $name: where the promises still pending were made (trace-pending.mjs):"
    cat "$pending"
  fi
  rm -f "$out" "$pending"
  [ "$st" = 0 ] || rc=1
}

if want kubernetes; then
  run "the Kubernetes manifests (deploy/kubernetes/) against the API's JSON schemas" kubernetes.test.mjs
fi

if want container || want swarm; then
  if ! timeout 10 docker version >/dev/null 2>&1; then
    "$root/deploy/container-engine.sh" setup docker >&2
    started_engine=1
  fi
  MPS_SERVER_IMAGE=$("$root/deploy/container/build.sh") || { echo "fleet: FAILED: building the server's image" >&2; exit 1; }
  export MPS_SERVER_IMAGE
fi
if want swarm; then
  MPS_NGINX_IMAGE=$(MPS_IMAGE_DOCKERFILE=deploy/swarm/nginx.Dockerfile MPS_IMAGE_PATHS="deploy/nginx deploy/swarm" \
    MPS_SERVER_IMAGE=mcp-python-exec-sandbox-nginx "$root/deploy/container/build.sh") ||
    { echo "fleet: FAILED: building the nginx image" >&2; exit 1; }
  export MPS_NGINX_IMAGE
fi
if want container; then
  trace=1 run "the server's image ($MPS_SERVER_IMAGE): bubblewrap in a container, both eras over HTTP" container.test.mjs
fi
if want nginx; then
  run "nginx (TLS, routing by session, id and principal, every endpoint) in front of the instances" nginx.test.mjs
fi
if want swarm; then
  run "a one-node swarm: the stack of deploy/swarm/ (bubblewrap replicas), scaled 2 -> 4 -> 2" swarm.test.mjs
fi
exit "$rc"

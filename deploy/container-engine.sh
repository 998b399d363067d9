#!/usr/bin/env bash
# Sets up a container engine and the docker backend's image on a machine without a registry
# or systemd (ours: see docs/security.md, "The docker and podman backends"), and takes it down.
#
#   deploy/container-engine.sh setup [docker|podman|all]   start the engine(s), build the image
#   deploy/container-engine.sh stop  [docker|podman|all]   remove our containers, stop what we started
#   deploy/container-engine.sh env                         prints MPS_DOCKER_IMAGE=... for eval
#   deploy/container-engine.sh base-tarball                the debootstrap base's tarball (made
#                                                          if missing; tests/package/ unpacks it)
#
# setup is idempotent: an engine that already answers is used as it is (and not stopped by
# `stop`), an image that is already there is kept.  The base image is made with debootstrap
# (Debian's python3, python3-venv and python3-pip, nothing from a registry) and imported; its
# tarball is cached under the state directory, so a rerun takes seconds, a new machine about a
# minute.  profiles/Dockerfile then builds the backend's image FROM that base (BASE build arg).
#
# Environment: MPS_ENGINE_STATE (default /var/lib/mcp-python-exec-sandbox/engine),
# MPS_DOCKER_IMAGE (default mcp-python-exec-sandbox:py3.12), MPS_DEBIAN_MIRROR (default: the
# first deb.debian.org-style URI apt uses), MPS_DEBIAN_SUITE (default bookworm).
set -euo pipefail
cd "$(dirname "$0")/.."

state=${MPS_ENGINE_STATE:-/var/lib/mcp-python-exec-sandbox/engine}
image=${MPS_DOCKER_IMAGE:-mcp-python-exec-sandbox:py3.12}
suite=${MPS_DEBIAN_SUITE:-bookworm}
base_image=mcp-python-exec-sandbox-base:$suite
label=io.github.mcp-python-exec-sandbox.run

log() { echo "container-engine: $*" >&2; }

mirror() {
  if [ -n "${MPS_DEBIAN_MIRROR:-}" ]; then
    echo "$MPS_DEBIAN_MIRROR"
    return
  fi
  local uri
  uri=$(grep -hs -m1 -E '^URIs: ' /etc/apt/sources.list.d/*.sources | awk '{print $2}' || true)
  [ -n "$uri" ] || uri=$(grep -hs -m1 -E '^deb ' /etc/apt/sources.list | awk '{print $2}' || true)
  echo "${uri:-http://deb.debian.org/debian}"
}

# --------------------------------------------------------------- engines

docker_up() { timeout 10 docker version --format '{{.Server.Version}}' >/dev/null 2>&1; }

start_docker() {
  if docker_up; then
    log "dockerd already answers"
    return 0
  fi
  command -v dockerd >/dev/null || { log "dockerd is not installed"; return 1; }
  mkdir -p "$state"
  # A stale pid file (an engine that died with the machine) keeps dockerd from starting.
  if [ -f /run/docker.pid ] && ! kill -0 "$(cat /run/docker.pid)" 2>/dev/null; then
    rm -f /run/docker.pid
  fi
  log "starting dockerd (log: $state/dockerd.log)"
  setsid dockerd --host unix:///run/docker.sock >"$state/dockerd.log" 2>&1 </dev/null &
  echo $! >"$state/dockerd.started"
  for _ in $(seq 1 60); do
    if docker_up; then return 0; fi
    if ! kill -0 "$(cat "$state/dockerd.started")" 2>/dev/null; then break; fi
    sleep 0.5
  done
  log "dockerd did not come up:"
  tail -n 20 "$state/dockerd.log" >&2 || true
  return 1
}

stop_docker() {
  if docker_up; then
    local ids
    ids=$(docker ps -aq --filter "label=$label" || true)
    if [ -n "$ids" ]; then docker rm -f $ids >/dev/null 2>&1 || true; fi
  fi
  [ -f "$state/dockerd.started" ] || return 0
  local pid
  pid=$(cat "$state/dockerd.started")
  rm -f "$state/dockerd.started"
  kill -0 "$pid" 2>/dev/null || return 0
  log "stopping dockerd (pid $pid)"
  kill -TERM "$pid"
  for _ in $(seq 1 40); do
    kill -0 "$pid" 2>/dev/null || return 0
    sleep 0.5
  done
  kill -KILL "$pid" 2>/dev/null || true
}

# podman has no daemon: "starting" it is its configuration.  Root here lacks CAP_SYS_RESOURCE,
# so podman's default rlimits (raised above the current hard limits) fail; the backend passes
# explicit --ulimit values, and this makes plain `podman run` (the image build) work too.
# The limits podman's containers get.  runc cannot raise RLIMIT_NPROC past what it holds
# itself (32768 here, below root's hard limit), so a fixed, modest nproc (the pids cgroup
# is the real cap) and the current hard nofile.
podman_ulimits() {
  local nofile
  nofile=$(ulimit -Hn)
  [ "$nofile" = unlimited ] && nofile=1048576
  echo "--ulimit nofile=$nofile:$nofile --ulimit nproc=4096:4096"
}

podman_configure() {
  command -v podman >/dev/null || { log "podman is not installed"; return 1; }
  local conf=/etc/containers/containers.conf
  if ! grep -qs '^default_ulimits' "$conf"; then
    mkdir -p /etc/containers
    local nofile nproc=4096
    nofile=$(ulimit -Hn)
    [ "$nofile" = unlimited ] && nofile=1048576
    if grep -qs '^\[containers\]' "$conf"; then
      sed -i "/^\[containers\]/a default_ulimits = [\"nofile=$nofile:$nofile\", \"nproc=$nproc:$nproc\"]" "$conf"
    else
      printf '[containers]\ndefault_ulimits = ["nofile=%s:%s", "nproc=%s:%s"]\n' \
        "$nofile" "$nofile" "$nproc" "$nproc" >>"$conf"
    fi
    log "set default_ulimits in $conf"
  fi
  timeout 20 podman info --format '{{.Version.Version}}' >/dev/null
}

stop_podman() {
  command -v podman >/dev/null || return 0
  local ids
  ids=$(podman ps -aq --filter "label=$label" 2>/dev/null || true)
  if [ -n "$ids" ]; then podman rm -f $ids >/dev/null 2>&1 || true; fi
}

# --------------------------------------------------------------- images

base_tarball() {
  local tar="$state/debootstrap-$suite.tar"
  if [ -s "$tar" ]; then
    echo "$tar"
    return 0
  fi
  mkdir -p "$state"
  local root
  root=$(mktemp -d "$state/rootfs.XXXXXX")
  # shellcheck disable=SC2064
  trap "rm -rf '$root'" RETURN
  log "debootstrap $suite from $(mirror) (about a minute)"
  debootstrap --variant=minbase --include=python3,python3-venv,python3-pip \
    "$suite" "$root" "$(mirror)" >"$state/debootstrap.log" 2>&1 || {
    tail -n 20 "$state/debootstrap.log" >&2
    return 1
  }
  # Nothing of the host's apt state, logs or caches goes into the image.
  rm -rf "$root"/var/cache/apt/archives/*.deb "$root"/var/lib/apt/lists/* "$root"/var/log/*
  tar -C "$root" -cf "$tar.part" .
  mv "$tar.part" "$tar"
  echo "$tar"
}

# $1: the client (docker or podman).
build_image() {
  local cli=$1
  if "$cli" image inspect "$image" >/dev/null 2>&1 && [ "${MPS_ENGINE_REBUILD:-0}" != 1 ]; then
    log "$cli: image $image is there"
    return 0
  fi
  local tar
  tar=$(base_tarball)
  if ! "$cli" image inspect "$base_image" >/dev/null 2>&1; then
    log "$cli: importing $base_image"
    "$cli" import "$tar" "$base_image" >/dev/null
  fi
  log "$cli: building $image from $base_image"
  local args=(build -t "$image" --build-arg "BASE=$base_image" --build-arg UV_VERSION= profiles/)
  if [ "$cli" = docker ]; then
    DOCKER_BUILDKIT=0 docker "${args[@]}" >"$state/build-docker.log" 2>&1 || {
      tail -n 30 "$state/build-docker.log" >&2
      return 1
    }
  else
    # buildah's RUN steps ignore default_ulimits: the same explicit limits, as the backend.
    podman "${args[@]}" --network none $(podman_ulimits) >"$state/build-podman.log" 2>&1 || {
      tail -n 30 "$state/build-podman.log" >&2
      return 1
    }
  fi
}

# --------------------------------------------------------------- main

cmd=${1:-setup}
which=${2:-docker}
case "$which" in docker | podman | all) ;; *) echo "usage: $0 setup|stop|env|base-tarball [docker|podman|all]" >&2; exit 2 ;; esac
want() { [ "$which" = all ] || [ "$which" = "$1" ]; }

case "$cmd" in
  setup)
    ./deploy/install-deps.sh --test
    if [ "$(id -u)" -ne 0 ]; then
      log "needs root (it starts dockerd and runs debootstrap)"
      exit 1
    fi
    if want docker; then start_docker && build_image docker; fi
    if want podman; then podman_configure && build_image podman; fi
    ;;
  stop)
    if want docker; then stop_docker; fi
    if want podman; then stop_podman; fi
    ;;
  env)
    echo "MPS_DOCKER_IMAGE=$image"
    ;;
  base-tarball)
    ./deploy/install-deps.sh --test >&2
    base_tarball
    ;;
  *)
    echo "usage: $0 setup|stop|env|base-tarball [docker|podman|all]" >&2
    exit 2
    ;;
esac

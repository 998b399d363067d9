#!/usr/bin/env bash
# Builds the server's image (deploy/container/Dockerfile) from the files git tracks or would track in this
# tree (committed or not; nothing else: no build directory, no node_modules), and tags it
# by their content, so an unchanged tree is never built twice:
#
#   deploy/container/build.sh            prints the image's name (NAME:TAG)
#
# Environment: MPS_SERVER_IMAGE (default mcp-python-exec-sandbox-server), MPS_IMAGE_DOCKERFILE
# (default deploy/container/Dockerfile; deploy/swarm/nginx.Dockerfile builds the swarm's
# nginx front the same way), MPS_SERVER_BASE
# (default: the debootstrap base of deploy/container-engine.sh, imported if the engine lacks
# it, else debian:bookworm-slim), MPS_CONTAINER_CLI (default docker), MPS_ENGINE_REBUILD=1 to rebuild.
set -euo pipefail
cd "$(dirname "$0")/../.."
cli=${MPS_CONTAINER_CLI:-docker}
dockerfile=${MPS_IMAGE_DOCKERFILE:-deploy/container/Dockerfile}
name=${MPS_SERVER_IMAGE:-mcp-python-exec-sandbox-server}
base=${MPS_SERVER_BASE:-}
if [ -z "$base" ]; then
  base=mcp-python-exec-sandbox-base:bookworm
  if ! "$cli" image inspect "$base" >/dev/null 2>&1; then
    # The debootstrap base of deploy/container-engine.sh (its cached tarball, made if
    # missing, as root), else the registry's Debian.
    if [ "$(id -u)" = 0 ] && tar=$(deploy/container-engine.sh base-tarball 2>/dev/null); then
      "$cli" import "$tar" "$base" >/dev/null
    else
      base=debian:bookworm-slim
    fi
  fi
fi
log() { echo "server-image: $*" >&2; }

ctx=$(mktemp -d /tmp/mps-image-ctx.XXXXXX)
trap 'rm -rf "$ctx"' EXIT
# A reproducible tarball of the files git tracks or would (not ignored), as they are: its hash (with
# the base's id) is the tag.
# Only what the image's build reads, so that a change to the tests or the docs of the
# fleet does not rebuild it (MPS_IMAGE_PATHS: git pathspecs, for another Dockerfile).
if [ -n "${MPS_IMAGE_PATHS:-}" ]; then
  read -r -a paths <<<"$MPS_IMAGE_PATHS"
else
  paths=(. ':!:tests' ':!:bench' ':!:deploy/kubernetes' ':!:deploy/swarm' ':!:deploy/nginx')
fi
git ls-files -z --cached --others --exclude-standard -- "${paths[@]}" |
  while IFS= read -r -d '' f; do [ -e "$f" ] && printf '%s\0' "$f"; done |
  tar --null -T - --sort=name --mtime=@0 --owner=0 --group=0 --numeric-owner -cf "$ctx/context.tar"
base_id=$("$cli" image inspect --format '{{.Id}}' "$base" 2>/dev/null || echo "$base")
tag=$( (sha256sum <"$ctx/context.tar"; echo "$base_id $dockerfile") | sha256sum | cut -c1-16)
image="$name:$tag"
if "$cli" image inspect "$image" >/dev/null 2>&1 && [ "${MPS_ENGINE_REBUILD:-0}" != 1 ]; then
  log "$image is there"
else
  log "building $image from $base (log: $ctx/build.log, shown on failure)"
  if [ "$cli" = docker ]; then
    DOCKER_BUILDKIT=0 docker build -q -f "$dockerfile" --build-arg "BASE=$base" \
      --label "io.github.mcp-python-exec-sandbox.content=$tag" -t "$image" - <"$ctx/context.tar" \
      >"$ctx/build.log" 2>&1 || { tail -n 40 "$ctx/build.log" >&2; exit 1; }
  else
    "$cli" build -q -f "$dockerfile" --build-arg "BASE=$base" -t "$image" - \
      <"$ctx/context.tar" >"$ctx/build.log" 2>&1 || { tail -n 40 "$ctx/build.log" >&2; exit 1; }
  fi
fi
"$cli" tag "$image" "$name:latest"
# Older builds of this name are kept no longer (one image per content: the disk would fill).
"$cli" images --format '{{.Repository}}:{{.Tag}}' "$name" | grep -vxF -e "$image" -e "$name:latest" |
  while read -r old; do "$cli" rmi "$old" >/dev/null 2>&1 || true; done || true
# And the build stages of older builds (untagged; the newest stays, for its cached layers).
"$cli" images -q --filter dangling=true --filter label=io.github.mcp-python-exec-sandbox.stage=build | tail -n +2 |
  while read -r old; do "$cli" rmi "$old" >/dev/null 2>&1 || true; done || true
echo "$image"

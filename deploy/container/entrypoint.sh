#!/bin/sh
# The server image's entry point: the installed config (/etc/mcp-python-exec-sandbox/
# config.toml) with the container's listening address, and the settings a deployment
# changes most, from the environment; any argument is passed on as a flag (and wins).
#
#   MPS_PORT             port to listen on (default 8080; MPS_PORT_BASE + MPS_SLOT wins)
#   MPS_PORT_BASE, MPS_SLOT   a port per replica on a host network (swarm: {{.Task.Slot}})
#   MPS_HOST             address to listen on (default 0.0.0.0: the container's own)
#   MPS_SANDBOX_BACKEND  bwrap (default) or none (the runtime isolates: gVisor, Kata)
#   MPS_DRAIN_SECONDS    how long running calls may finish after SIGTERM (default 30)
#   MPS_TOKEN_FILE       bearer tokens, NAME:TOKEN per line (default: the installed file)
#   MPS_EXTRA_ARGS       more flags, split on spaces
#
#   container-entrypoint --healthcheck   exits 0 when this container's server is ready
#                                        (GET /readyz on the port computed as below)
set -eu
port=${MPS_PORT:-8080}
if [ -n "${MPS_PORT_BASE:-}" ] && [ -n "${MPS_SLOT:-}" ]; then
  port=$((MPS_PORT_BASE + MPS_SLOT))
fi
if [ "${1:-}" = --healthcheck ]; then
  host=${MPS_HOST:-0.0.0.0}
  [ "$host" = 0.0.0.0 ] && host=127.0.0.1
  exec python3 -c 'import sys, urllib.request
urllib.request.urlopen(f"http://{sys.argv[1]}:{sys.argv[2]}/readyz", timeout=3)' "$host" "$port"
fi
# shellcheck disable=SC2086
exec /usr/bin/mcp-python-exec-sandbox \
  --profile /etc/mcp-python-exec-sandbox/config.toml \
  --state-dir /var/lib/mcp-python-exec-sandbox \
  --audit-log - \
  --host "${MPS_HOST:-0.0.0.0}" --port "$port" \
  --sandbox-backend "${MPS_SANDBOX_BACKEND:-bwrap}" \
  --drain-seconds "${MPS_DRAIN_SECONDS:-30}" \
  --auth-token-file "${MPS_TOKEN_FILE:-/etc/mcp-python-exec-sandbox/tokens}" \
  ${MPS_EXTRA_ARGS:-} "$@"

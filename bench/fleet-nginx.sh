#!/usr/bin/env bash
# Calls per second through nginx (deploy/nginx/, TLS) to 1 and to 3 instances of the server
# on loopback, with tests/fleet/load.mjs (the SDK v1 client: S sessions x C calls, W at a
# time).  Figures, not a test: docs/operations.md quotes them with the machine's load.
#
#   bench/fleet-nginx.sh [SESSIONS [CALLS [WORKERS [EXEC_EVERY]]]]    (default 60 20 24 1)
#
# EXEC_EVERY 1: every call is execute_python; 5: every fifth, validate_script between.
# Environment: MPS_BINARY (default build/mcp-python-exec-sandbox), MPS_TEST_BACKEND (bwrap).
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
sessions=${1:-60} calls=${2:-20} workers=${3:-24} every=${4:-1}
binary=${MPS_BINARY:-$root/build/mcp-python-exec-sandbox}
backend=${MPS_TEST_BACKEND:-bwrap}
[ -d tests/fleet/node_modules ] || (cd tests/fleet && npm ci --prefer-offline --no-audit --no-fund --loglevel=error)

work=$(mktemp -d /tmp/mps-fleet-bench.XXXXXX)
pids=()
cleanup() {
  local p
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  for p in "${pids[@]}"; do wait "$p" 2>/dev/null || true; done
  rm -rf "$work"
}
trap cleanup EXIT
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }

openssl req -x509 -newkey rsa:2048 -nodes -days 1 -subj "/CN=bench CA" -keyout "$work/ca.key" -out "$work/ca.pem" \
  -addext basicConstraints=critical,CA:TRUE -addext keyUsage=critical,keyCertSign 2>/dev/null
openssl req -newkey rsa:2048 -nodes -subj /CN=localhost -keyout "$work/srv.key" -out "$work/srv.csr" 2>/dev/null
printf 'subjectAltName=IP:127.0.0.1,DNS:localhost\n' >"$work/ext.cnf"
openssl x509 -req -in "$work/srv.csr" -CA "$work/ca.pem" -CAkey "$work/ca.key" -CAcreateserial -days 1 \
  -extfile "$work/ext.cnf" -out "$work/srv.pem" 2>/dev/null
token=$(head -c 24 /dev/urandom | od -An -tx1 | tr -d ' \n')
echo "bench:$token" >"$work/tokens"
chmod 600 "$work/tokens"

run() {
  local n=$1 i ports=()
  local dir="$work/n$n"
  mkdir -p "$dir"/{body,proxy,fastcgi,uwsgi,scgi}
  [ "$(id -u)" = 0 ] && chown nobody "$dir"/{body,proxy,fastcgi,uwsgi,scgi}
  for ((i = 1; i <= n; i++)); do
    local port
    port=$(free_port)
    ports+=("$port")
    "$binary" --transport http --host 127.0.0.1 --port "$port" --state-dir "$dir/state$i" --route "i$i" --sandbox-backend "$backend" \
      --auth-token-file "$work/tokens" --prestart off --max-concurrent 8 --max-token-concurrent 64 --max-token-running 8 \
      --max-sessions-per-token 256 --max-session-concurrent 2 2>"$dir/server$i.log" &
    pids+=($!)
  done
  local front
  front=$(free_port)
  # deploy/nginx/'s files include each other as mcp/..., relative to the configuration's directory.
  mkdir -p "$dir/mcp" && cp "$root"/deploy/nginx/mcp-*.conf "$dir/mcp/"
  {
    [ "$(id -u)" = 0 ] && echo "user nobody nogroup;"
    echo "worker_processes 2; pid $dir/nginx.pid; error_log $dir/error.log warn; events { worker_connections 1024; }"
    echo "http { client_body_temp_path $dir/body; proxy_temp_path $dir/proxy; fastcgi_temp_path $dir/fastcgi;"
    echo "  uwsgi_temp_path $dir/uwsgi; scgi_temp_path $dir/scgi; include $dir/mcp/mcp-maps.conf;"
    echo "  upstream mcp_pool { least_conn; keepalive 32;"
    for p in "${ports[@]}"; do echo "    server 127.0.0.1:$p max_fails=1 fail_timeout=10s;"; done
    echo "  }"
    echo "  upstream mcp_principal { hash \$http_authorization consistent; keepalive 32;"
    for p in "${ports[@]}"; do echo "    server 127.0.0.1:$p max_fails=1 fail_timeout=10s;"; done
    echo "  }"
    for ((i = 1; i <= n; i++)); do echo "  upstream mcp_i$i { server 127.0.0.1:${ports[$((i - 1))]}; keepalive 8; }"; done
    echo "  map \$mcp_route \$mcp_upstream { default \$mcp_unrouted;"
    for ((i = 1; i <= n; i++)); do echo "    i$i mcp_i$i;"; done
    echo "  }"
    echo "  map \$upstream_addr \$mcp_self_route { default \"\";"
    for ((i = 1; i <= n; i++)); do echo "    \"~(^|, )127\\.0\\.0\\.1:${ports[$((i - 1))]}\$\" i$i;"; done
    echo "  }"
    echo "  server { listen 127.0.0.1:$front ssl http2; ssl_certificate $work/srv.pem; ssl_certificate_key $work/srv.key;"
    echo "    access_log off; location = /mcp { include $dir/mcp/mcp-location.conf; }"
    echo "    include $dir/mcp/mcp-gone.conf; }"
    echo "}"
  } >"$dir/nginx.conf"
  nginx -c "$dir/nginx.conf" -p "$dir" -g 'daemon off;' &
  pids+=($!)
  for p in "${ports[@]}"; do
    for _ in $(seq 1 300); do curl -sf "http://127.0.0.1:$p/readyz" >/dev/null && break; sleep 0.2; done
  done
  printf '%d instance(s): ' "$n"
  NODE_EXTRA_CA_CERTS=$work/ca.pem node tests/fleet/load.mjs --url "https://127.0.0.1:$front/mcp" --token "$token" \
    --sessions "$sessions" --calls "$calls" --workers "$workers" --exec-every "$every" --tag "bench$n"
  local p
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  for p in "${pids[@]}"; do wait "$p" 2>/dev/null || true; done
  pids=()
}

echo "bench: $sessions sessions x $calls calls, $workers at a time, python every $every call(s), backend $backend; load: $(cut -d' ' -f1-3 /proc/loadavg)"
run 1
run 3
echo "load after: $(cut -d' ' -f1-3 /proc/loadavg)"

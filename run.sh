#!/usr/bin/env bash
# The run command: installs whatever is missing, builds a release binary, shows client
# configurations, runs a scripted demo call through the real server over stdio, and then
# (on a terminal) serves Streamable HTTP on localhost and prints its URL; Ctrl-C stops it.
#
#   ./run.sh [server flags...]     e.g. ./run.sh --sandbox-backend none --port 9000
set -euo pipefail
cd "$(dirname "$0")"
./deploy/install-deps.sh
cmake -S . -B build -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
cmake --build build -j"$(nproc 2>/dev/null || echo 2)" >/dev/null
bin="$PWD/build/mcp-python-exec-sandbox"

echo "Built $bin"
echo
echo "Client configuration (Claude Desktop, Cursor, and most MCP clients):"
printf '  {"mcpServers": {"python-sandbox": {"command": "%s", "args": []}}}\n' "$bin"
echo "Claude Code:"
printf '  claude mcp add python-sandbox -- %s\n' "$bin"
echo "Over HTTP (web clients; the URL is printed below when the server starts):"
printf '  {"mcpServers": {"python-sandbox": {"type": "http", "url": "http://127.0.0.1:8765/mcp"}}}\n'
echo
echo "Demo: initialize, list the tools, run a script, check the environment:"
/usr/bin/python3 scripts/demo.py "$bin" "$@"

if [ -t 0 ]; then
  echo
  echo "Starting the Streamable HTTP endpoint on localhost (Ctrl-C stops it):"
  exec "$bin" --transport http "$@"
fi

#!/usr/bin/env bash
# The run command: installs whatever is missing, builds a release binary, shows a client
# configuration, runs a scripted demo call through the real server, and then (on a
# terminal) keeps the server running on stdio for you to type JSON-RPC into.
#
#   ./run.sh [server flags...]     e.g. ./run.sh --sandbox-backend none
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
echo
echo "Demo: initialize, list the tools, run a script, check the environment:"
/usr/bin/python3 scripts/demo.py "$bin" "$@"

if [ -t 0 ]; then
  echo
  echo "Serving on stdio now: type one JSON-RPC message per line, Ctrl-D to stop."
  exec "$bin" "$@"
fi

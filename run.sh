#!/usr/bin/env bash
# The run command: installs whatever is missing, builds a release binary, shows client
# configurations, runs a scripted demo call through the real server over stdio, and then
# (on a terminal) serves Streamable HTTP on localhost and prints its URL; Ctrl-C stops it.
#
#   ./run.sh [server flags...]     e.g. ./run.sh --sandbox-backend none --port 9000
set -euo pipefail
cd "$(dirname "$0")"
# What building and running needs, nothing more (./test.sh installs the test set).
./deploy/install-deps.sh
# The unit tests need cmocka (the test set): without it the build leaves them out.
tests=OFF
if pkg-config --exists cmocka 2>/dev/null; then tests=ON; fi
cmake -S . -B build -DCMAKE_BUILD_TYPE=RelWithDebInfo -DMPS_TESTS="$tests" >/dev/null
cmake --build build -j"$(nproc 2>/dev/null || echo 2)" >/dev/null
bin="$PWD/build/mcp-python-exec-sandbox"

echo "Built $bin"
# The playground's code editor (CodeMirror, from npm): built when npm is there; the page works
# without it (a plain text area).  Node is not installed for it unless asked.
if [ "${MPS_UI_INSTALL_NODE:-0}" = 1 ] && ! command -v npm >/dev/null 2>&1; then
  echo "Installing nodejs and npm for the editor bundle (MPS_UI_INSTALL_NODE=1)"
  MPS_DEPS_RUNTIME="nodejs npm" ./deploy/install-deps.sh
fi
if command -v npm >/dev/null 2>&1; then
  # npm's registry may be out of reach here: a short wait, not npm's minutes of retries.
  if npm_config_fetch_retries=1 npm_config_fetch_timeout=30000 ./ui/build.sh build >build/ui-build.log 2>&1; then
    echo "Built the playground's editor: build/mps-ui/editor.js"
  else
    echo "The playground's editor did not build (npm; see build/ui-build.log): the page uses a plain text area"
  fi
else
  echo "The playground's page has a plain text area: for its code editor, install npm"
  echo "  (MPS_UI_INSTALL_NODE=1 ./run.sh, or apt-get install nodejs npm) and run ./run.sh again"
fi
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

#!/usr/bin/env bash
# Builds the playground's optional editor bundle (ui/editor/editor.js + CodeMirror 6 from
# npm, pinned by ui/package-lock.json) into one file with esbuild:
#   ui/build.sh BUILD_DIR      writes BUILD_DIR/mps-ui/editor.js
# where the server finds it (transport/http/ui.c; installed: share/.../ui/editor.js).  The
# bundle is third-party code: built, never committed.  Without it the page still works
# with a plain textarea.  npm ci runs only when the lock file changed (a stamp remembers
# it); MPS_UI_OFFLINE=1 installs from npm's cache only.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
out=${1:?usage: ui/build.sh BUILD_DIR}
mkdir -p "$out/mps-ui"
out=$(cd "$out/mps-ui" && pwd)
cd "$here"
command -v npm >/dev/null || { echo "ui/build.sh: npm is required" >&2; exit 1; }
stamp=node_modules/.mps-ui-lock.sha256
want=$(sha256sum package-lock.json | cut -d' ' -f1)
if [ ! -f "$stamp" ] || [ "$(cat "$stamp")" != "$want" ]; then
  flags=(--prefer-offline --no-audit --no-fund --loglevel=error)
  [ "${MPS_UI_OFFLINE:-0}" = 1 ] && flags=(--offline --no-audit --no-fund --loglevel=error)
  npm ci "${flags[@]}"
  echo "$want" >"$stamp"
fi
./node_modules/.bin/esbuild editor/editor.js --bundle --minify --format=iife \
  --target=es2020 --legal-comments=none --log-level=warning --outfile="$out/editor.js.tmp"
mv "$out/editor.js.tmp" "$out/editor.js"
echo "ui/build.sh: $out/editor.js ($(stat -c %s "$out/editor.js") bytes)"

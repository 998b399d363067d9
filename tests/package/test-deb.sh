#!/usr/bin/env bash
# The Debian package, end to end: builds the .deb from a build directory, installs it with
# apt into a fresh Debian root (the debootstrap base of deploy/container-engine.sh, unpacked
# into a temporary directory and entered with chroot, so the machine itself gets nothing),
# runs the installed binary over stdio and Streamable HTTP (bubblewrap sandbox, under the
# service unit's capability bounding set and no_new_privs), verifies the unit with
# systemd-analyze, purges the package and checks that only the state directory is left.
#
#   tests/package/test-deb.sh BUILD_DIR        (root; apt in the root reaches Debian's mirror)
set -euo pipefail
cd "$(dirname "$0")/../.."
build=$(realpath "${1:?usage: $0 BUILD_DIR}")
unit=deploy/systemd/mcp-python-exec-sandbox.service

say() { echo "package: $*"; }
fail() { echo "package: FAIL: $*" >&2; exit 1; }

[ "$(id -u)" = 0 ] || fail "needs root (chroot, mounts)"
# The playground's editor bundle always goes with the package (docs/operations.md builds it
# before cpack; test.sh does too): a .deb whose page has no editor is a broken package.
[ -f "$build/mps-ui/editor.js" ] ||
  fail "no $build/mps-ui/editor.js: build the editor bundle first (ui/build.sh $build, or cmake --build $build --target ui-bundle)"

say "building the .deb (cpack in $build)"
rm -f "$build"/mcp-python-exec-sandbox_*.deb
(cd "$build" && cpack -G DEB >cpack.log 2>&1) || { tail -n 20 "$build/cpack.log" >&2; fail "cpack"; }
deb=$(ls "$build"/mcp-python-exec-sandbox_*.deb)

say "relocatable: the package's tree unpacked elsewhere finds its own helpers there"
moved=$(mktemp -d /tmp/mps-moved.XXXXXX)
dpkg-deb -x "$deb" "$moved"
version=$("$moved/usr/bin/mcp-python-exec-sandbox" --version)
rm -rf "$moved"
grep -qxF "drop helper: $moved/usr/libexec/mcp-python-exec-sandbox/mps-sandbox-drop" <<<"$version" &&
  grep -qxF "start-up runner: $moved/usr/share/mcp-python-exec-sandbox/runner/runner.py" <<<"$version" ||
  fail "the unpacked tree's --version: $version"

tarball=$(./deploy/container-engine.sh base-tarball 2>"$build/base-tarball.log") ||
  { tail -n 20 "$build/base-tarball.log" >&2; fail "no debootstrap base"; }

root=$(mktemp -d /tmp/mps-deb.XXXXXX)
mounted=()
cleanup() {
  local i
  for ((i = ${#mounted[@]} - 1; i >= 0; i--)); do umount -l "${mounted[$i]}" 2>/dev/null || true; done
  rm -rf --one-file-system "$root"
}
trap cleanup EXIT
tar -C "$root" -xf "$tarball"
# The root is a mount point of its own, so that bubblewrap's pivot_root works inside it.
mount --bind "$root" "$root" && mounted+=("$root")
mount -t proc proc "$root/proc" && mounted+=("$root/proc")
mount --rbind /dev "$root/dev" && mounted+=("$root/dev")
mount --rbind /sys "$root/sys" && mounted+=("$root/sys")
cp /etc/resolv.conf "$root/etc/resolv.conf"
cp /etc/apt/sources.list "$root/etc/apt/" 2>/dev/null || true
cp -r /etc/apt/sources.list.d "$root/etc/apt/" 2>/dev/null || true
cp "$deb" "$root/tmp/pkg.deb"
in_root() { chroot "$root" /usr/bin/env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin HOME=/root "$@"; }

say "installing $(basename "$deb") (and systemd, for systemd-analyze) with apt into a fresh bookworm root"
in_root apt-get update -qq >"$build/apt.log" 2>&1 || { tail -n 20 "$build/apt.log" >&2; fail "apt-get update"; }
DEBIAN_FRONTEND=noninteractive in_root apt-get install -y -qq --no-install-recommends /tmp/pkg.deb systemd \
  >>"$build/apt.log" 2>&1 || { tail -n 30 "$build/apt.log" >&2; fail "apt-get install"; }
in_root dpkg -L mcp-python-exec-sandbox >"$build/package-files.txt"
grep -qxF /usr/share/mcp-python-exec-sandbox/ui/editor.js "$build/package-files.txt" ||
  fail "the package lacks the editor bundle (share/mcp-python-exec-sandbox/ui/editor.js)"

say "the installed binary takes its helpers from the install tree"
version=$(in_root mcp-python-exec-sandbox --version)
echo "$version" | sed 's/^/  /'
for want in "drop helper: /usr/libexec/mcp-python-exec-sandbox/mps-sandbox-drop" \
  "container init: /usr/libexec/mcp-python-exec-sandbox/mps-container-init" \
  "start-up runner: /usr/share/mcp-python-exec-sandbox/runner/runner.py" \
  "profiles: /usr/share/mcp-python-exec-sandbox/profiles"; do
  grep -qxF "$want" <<<"$version" || fail "--version lacks '$want'"
done
[ "$(stat -c %a "$root/etc/mcp-python-exec-sandbox/tokens")" = 600 ] || fail "the token file is not 0600"

# The service's capability bounding set, from the unit itself.
caps=$(sed -n 's/^CapabilityBoundingSet=//p' "$unit" | tr 'A-Z' 'a-z' | sed 's/cap_//g; s/ /,+/g')
[ -n "$caps" ] || fail "no CapabilityBoundingSet in $unit"
as_service() {
  in_root setpriv --no-new-privs --bounding-set "-all,+$caps" --inh-caps -all "$@"
}

say "stdio: a bubblewrap run of the installed binary, under the unit's capabilities"
/usr/bin/python3 tests/package/mcp_check.py stdio -- chroot "$root" /usr/bin/env -i PATH=/usr/bin:/bin MCP_PY_SANDBOX_WARM_CACHE=0 \
  setpriv --no-new-privs --bounding-set "-all,+$caps" --inh-caps -all \
  mcp-python-exec-sandbox --sandbox-backend bwrap --state-dir /var/lib/mcp-python-exec-sandbox --prestart off

say "http: the service's own command line (the installed config, a bearer token)"
echo "tester:$(head -c 24 /dev/urandom | od -An -tx1 | tr -d ' \n')" >>"$root/etc/mcp-python-exec-sandbox/tokens"
token=$(tail -n 1 "$root/etc/mcp-python-exec-sandbox/tokens" | cut -d: -f2)
exec_start=$(sed -n 's/^ExecStart=//p' "$unit")
port=$(/usr/bin/python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
# shellcheck disable=SC2086
MPS_CHECK_TOKEN=$token /usr/bin/python3 tests/package/mcp_check.py http --port "$port" -- \
  chroot "$root" /usr/bin/env -i PATH=/usr/bin:/bin MCP_PY_SANDBOX_WARM_CACHE=0 \
  setpriv --no-new-privs --bounding-set "-all,+$caps" --inh-caps -all \
  $exec_start --port "$port" --prestart off

audit="$root/var/log/mcp-python-exec-sandbox/audit.log"
grep -q '"principal":"tester"' "$audit" || fail "the audit log has no line of the calls: $(cat "$audit" 2>&1)"
! grep -qF "$token" "$audit" || fail "the audit log holds the token"
[ "$(stat -c %a "$audit")" = 600 ] || fail "the audit log is not 0600"

say "systemd-analyze verify $unit (against the installed root)"
SYSTEMD_LOG_LEVEL=warning systemd-analyze verify --root="$root" "$root/usr/lib/systemd/system/mcp-python-exec-sandbox.service" \
  >"$build/systemd-analyze.log" 2>&1 || { cat "$build/systemd-analyze.log" >&2; fail "systemd-analyze verify"; }
if grep -v "^$" "$build/systemd-analyze.log" | grep -v -i "cgroup\|bpf\|Failed to open /dev/tty\|kmsg" | grep -q .; then
  cat "$build/systemd-analyze.log" >&2
  fail "systemd-analyze verify printed warnings"
fi

say "purge: nothing of the package is left but the state directory"
DEBIAN_FRONTEND=noninteractive in_root apt-get purge -y -qq mcp-python-exec-sandbox >>"$build/apt.log" 2>&1 ||
  { tail -n 20 "$build/apt.log" >&2; fail "apt-get purge"; }
left=()
while read -r f; do
  [ -e "$root$f" ] || [ -L "$root$f" ] || continue
  # Directories the package shares with others (/usr/bin, /etc) stay; its own may not.
  if [ -d "$root$f" ] && [ ! -L "$root$f" ]; then
    case "$f" in *mcp-python-exec-sandbox*) ;; *) continue ;; esac
  fi
  left+=("$f")
done <"$build/package-files.txt"
[ ${#left[@]} -eq 0 ] || fail "left after purge: ${left[*]}"
[ ! -e "$root/etc/mcp-python-exec-sandbox" ] || fail "/etc/mcp-python-exec-sandbox is left after purge"
[ -d "$root/var/lib/mcp-python-exec-sandbox" ] || fail "the state directory went with the purge"
[ ! -e "$root/var/log/mcp-python-exec-sandbox" ] || fail "the audit logs are left after purge"
say "ok"

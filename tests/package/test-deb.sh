#!/usr/bin/env bash
# The Debian package, end to end: builds the .deb from a build directory, installs it with
# apt into a fresh Debian root (the debootstrap base of deploy/container-engine.sh, unpacked
# into a temporary directory and entered with chroot, so the machine itself gets nothing),
# runs the installed binary over stdio and Streamable HTTP (bubblewrap sandbox, under the
# service unit's capability bounding set, no_new_privs, and what its namespace and seccomp
# settings do: tests/package/unit-env.sh), reads the server's log priorities back from a real
# journald (journalctl -p), verifies the unit with systemd-analyze (verify, and security below
# 7.0), then plays the package's life with systemd stood in for (a systemctl that records its
# calls and acts on the test's server): an upgrade restarts a running service on the new binary
# and keeps the admin's token file without a prompt, a remove stops it, a purge removes the
# token file, the enablement, the logs, and leaves only the state directory.
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
pkg_version=$(dpkg-deb -f "$deb" Version)
# The same tree as a later version, for the upgrade below.
upgrade_version="$pkg_version+upgrade1"
(cd "$build" && cpack -G DEB -D CPACK_PACKAGE_VERSION="$upgrade_version" >cpack-upgrade.log 2>&1) ||
  { tail -n 20 "$build/cpack-upgrade.log" >&2; fail "cpack (upgrade)"; }
deb_upgrade=$(ls "$build"/mcp-python-exec-sandbox_"$upgrade_version"_*.deb)
[ "$(dpkg-deb -f "$deb_upgrade" Version)" = "$upgrade_version" ] || fail "the upgrade package's version"

say "the control files: a real maintainer, maintainer scripts, no secret as a conffile"
maintainer=$(dpkg-deb -f "$deb" Maintainer)
case "$maintainer" in *localhost* | *root@* | "") fail "Maintainer: $maintainer" ;; esac
control=$(mktemp -d /tmp/mps-control.XXXXXX)
dpkg-deb -e "$deb" "$control"
for f in postinst prerm postrm conffiles; do [ -f "$control/$f" ] || fail "no $f in the package"; done
! grep -q tokens "$control/conffiles" || fail "the token file is a conffile: $(cat "$control/conffiles")"
rm -rf "$control"

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
  # The service the systemctl stand-in started, if a failure left it running.
  [ -f "$root/run/mps-service.pid" ] && kill -KILL "$(cat "$root/run/mps-service.pid")" 2>/dev/null
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
# /usr/local/sbin first: the systemctl stand-in below (apt gives dpkg a PATH of its own).
dpkg_path=(-o DPkg::Path=/usr/local/sbin:/usr/sbin:/usr/bin:/sbin:/bin)
in_root() { chroot "$root" /usr/bin/env -i PATH=/usr/local/sbin:/usr/sbin:/usr/bin:/sbin:/bin HOME=/root "$@"; }

# systemd does not run in the root: a stand-in systemctl records what the maintainer scripts
# ask of it and plays the service (start, stop, try-restart) with the unit's ExecStart on a
# port of its own.  The scripts see systemd only when /run/systemd/system exists (as they
# would on a booted system); before that, they must not call it at all.
service_port=$(/usr/bin/python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
mkdir -p "$root/usr/local/sbin"
cat >"$root/usr/local/sbin/systemctl" <<STUB
#!/bin/sh
echo "\$*" >>/run/mps-systemctl.log
pidfile=/run/mps-service.pid
# (a zombie nobody reaped yet is not running)
running() { [ -f \$pidfile ] && kill -0 "\$(cat \$pidfile)" 2>/dev/null && [ "\$(cut -d' ' -f3 /proc/\$(cat \$pidfile)/stat 2>/dev/null)" != Z ]; }
stop() {
  running || return 0
  kill -TERM "\$(cat \$pidfile)"
  while running; do sleep 0.1; done
  rm -f \$pidfile
}
start() {
  running && return 0
  # (dpkg's and apt's descriptors closed: a server holding them would keep apt waiting)
  MCP_PY_SANDBOX_WARM_CACHE=0 python3 -c 'import os, sys; os.closerange(3, 65536); os.execvp(sys.argv[1], sys.argv[1:])' \\
    setsid $(sed -n 's/^ExecStart=//p' "$unit") --port $service_port --prestart off </dev/null >>/run/mps-service.log 2>&1 &
  echo \$! >\$pidfile
}
verb=
for a in "\$@"; do case "\$a" in --*) ;; *) verb=\$a; break ;; esac; done
case "\$verb" in
  start) start ;;
  stop) stop ;;
  try-restart) if running; then stop; start; fi ;;
  daemon-reload) ;;
  *) exec /usr/bin/systemctl "\$@" ;;
esac
STUB
chmod 755 "$root/usr/local/sbin/systemctl"
: >"$root/run/mps-systemctl.log"

say "installing systemd (for systemd-analyze, journald), then $(basename "$deb") with apt into a fresh bookworm root"
in_root apt-get update -qq >"$build/apt.log" 2>&1 || { tail -n 20 "$build/apt.log" >&2; fail "apt-get update"; }
DEBIAN_FRONTEND=noninteractive in_root apt-get install -y -qq --no-install-recommends systemd \
  >>"$build/apt.log" 2>&1 || { tail -n 30 "$build/apt.log" >&2; fail "apt-get install systemd"; }
DEBIAN_FRONTEND=noninteractive in_root apt-get "${dpkg_path[@]}" install -y -qq --no-install-recommends /tmp/pkg.deb \
  >>"$build/apt.log" 2>&1 || { tail -n 30 "$build/apt.log" >&2; fail "apt-get install"; }
in_root dpkg -L mcp-python-exec-sandbox >"$build/package-files.txt"
grep -qxF /usr/share/mcp-python-exec-sandbox/ui/editor.js "$build/package-files.txt" ||
  fail "the package lacks the editor bundle (share/mcp-python-exec-sandbox/ui/editor.js)"
for f in /usr/share/doc/mcp-python-exec-sandbox/copyright /usr/share/doc/mcp-python-exec-sandbox/changelog.gz \
  /usr/share/mcp-python-exec-sandbox/tokens.template \
  /usr/share/doc/mcp-python-exec-sandbox/examples/mcp-python-exec-sandbox.rules.yml \
  /usr/share/doc/mcp-python-exec-sandbox/examples/mcp-python-exec-sandbox.json; do
  grep -qxF "$f" "$build/package-files.txt" || fail "the package lacks $f"
done
! grep -qxF /etc/mcp-python-exec-sandbox/tokens "$build/package-files.txt" || fail "the package ships the token file itself"
top=$(zcat "$root/usr/share/doc/mcp-python-exec-sandbox/changelog.gz" | head -n 1)
[[ "$top" == "mcp-python-exec-sandbox ($pkg_version) "* ]] || fail "the changelog's first entry is not $pkg_version: $top"
in_root dpkg-query -W -f='${Conffiles}\n' mcp-python-exec-sandbox | grep -q tokens && fail "dpkg keeps the token file as a conffile"
! grep -q "mcp-python-exec-sandbox\|daemon-reload\|try-restart\|^stop" "$root/run/mps-systemctl.log" ||
  fail "without systemd the maintainer scripts called systemctl: $(cat "$root/run/mps-systemctl.log")"

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
cmp -s "$root/etc/mcp-python-exec-sandbox/tokens" "$root/usr/share/mcp-python-exec-sandbox/tokens.template" ||
  fail "the first install's token file is not the template"

# The service's capability bounding set, from the unit itself.
caps=$(sed -n 's/^CapabilityBoundingSet=//p' "$unit" | tr 'A-Z' 'a-z' | sed 's/cap_//g; s/ /,+/g')
[ -n "$caps" ] || fail "no CapabilityBoundingSet in $unit"
# What the unit's namespace and seccomp settings do (ProtectKernelTunables=, PrivateDevices=,
# ProtectProc=, ProcSubset=, SystemCallArchitectures=, RestrictAddressFamilies=), around the
# command: tests/package/unit-env.sh follows the unit.
seccomp_helper="$build/unit-seccomp"
cc -O2 -Wall -o "$seccomp_helper" tests/package/unit-seccomp.c -lseccomp || fail "building unit-seccomp"
as_unit=(unshare --mount --propagation private "$PWD/tests/package/unit-env.sh" "$PWD/$unit" "$root" "$seccomp_helper" --)

say "the unit's sandboxing, reproduced: tunables read-only, no device but the pseudo-devices, only its socket families"
"${as_unit[@]}" chroot "$root" /usr/bin/env -i PATH=/usr/bin:/bin python3 -c '
import os, socket
assert not os.access("/proc/sys/kernel/domainname", os.W_OK) or not os.path.exists("/proc/sys"), "tunables writable"
assert sorted(os.listdir("/dev")) <= ["fd", "full", "mqueue", "null", "ptmx", "pts", "random", "shm", "stderr", "stdin",
                                      "stdout", "tty", "urandom", "zero"], os.listdir("/dev")
socket.socket(socket.AF_INET6).close()
try:
    socket.socket(socket.AF_PACKET, socket.SOCK_RAW)
    raise AssertionError("AF_PACKET allowed")
except OSError as e:
    assert e.errno == 97, e
' || fail "the unit's sandboxing is not what it says"

say "stdio: a bubblewrap run of the installed binary, under the unit's capabilities and sandboxing"
/usr/bin/python3 tests/package/mcp_check.py stdio -- "${as_unit[@]}" chroot "$root" /usr/bin/env -i PATH=/usr/bin:/bin MCP_PY_SANDBOX_WARM_CACHE=0 \
  setpriv --no-new-privs --bounding-set "-all,+$caps" --inh-caps -all \
  mcp-python-exec-sandbox --sandbox-backend bwrap --state-dir /var/lib/mcp-python-exec-sandbox --prestart off

say "http: the service's own command line (the installed config, a bearer token)"
echo "tester:$(head -c 24 /dev/urandom | od -An -tx1 | tr -d ' \n')" >>"$root/etc/mcp-python-exec-sandbox/tokens"
token=$(tail -n 1 "$root/etc/mcp-python-exec-sandbox/tokens" | cut -d: -f2)
exec_start=$(sed -n 's/^ExecStart=//p' "$unit")
port=$(/usr/bin/python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
# shellcheck disable=SC2086
MPS_CHECK_TOKEN=$token /usr/bin/python3 tests/package/mcp_check.py http --port "$port" -- \
  "${as_unit[@]}" chroot "$root" /usr/bin/env -i PATH=/usr/bin:/bin MCP_PY_SANDBOX_WARM_CACHE=0 \
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

say "journal: the server's priorities reach a real journald (journalctl -p warning finds the warnings, only them)"
systemd-machine-id-setup --root="$root" >/dev/null 2>&1 || in_root systemd-machine-id-setup >/dev/null
mkdir -p "$root/run/systemd/journal"
chroot "$root" /lib/systemd/systemd-journald >"$build/journald.log" 2>&1 &
journald=$!
stop_journald() { kill "$journald" 2>/dev/null || true; wait "$journald" 2>/dev/null || true; }
trap 'stop_journald; cleanup' EXIT
for _ in $(seq 200); do [ -S "$root/run/systemd/journal/stdout" ] && break; sleep 0.1; done
[ -S "$root/run/systemd/journal/stdout" ] || { cat "$build/journald.log" >&2; fail "journald did not start"; }
jport=$(/usr/bin/python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
# systemd-cat connects stdout and stderr to the journal as systemd does for a service;
# JOURNAL_STREAM names that stream (as systemd sets it), whether systemd-cat sets it or not.
# A --metrics-token naming nobody: a warning at start.
# shellcheck disable=SC2086
chroot "$root" /usr/bin/env -i PATH=/usr/bin:/bin MCP_PY_SANDBOX_WARM_CACHE=0 systemd-cat -t mps-journal-test \
  /bin/sh -c 'JOURNAL_STREAM=$(stat -L -c %d:%i /proc/self/fd/2) exec "$@"' sh \
  $exec_start --port "$jport" --prestart off --metrics-token no-such-operator &
jserver=$!
journal() { in_root journalctl -q --no-pager -o cat -t mps-journal-test "$@" 2>/dev/null; }
for _ in $(seq 600); do journal -p warning | grep -q no-such-operator && journal | grep -q "listening on" && break; sleep 0.1; done
kill -TERM "$jserver" 2>/dev/null || true
wait "$jserver" || true
for _ in $(seq 100); do journal | grep -q "drain: done" && break; sleep 0.1; done
journal -o short-monitor >"$build/journal.txt" || true
warnings=$(journal -p warning)
grep -q "metrics-token no-such-operator: no token of that name" <<<"$warnings" ||
  { cat "$build/journal.txt" >&2; fail "journalctl -p warning lacks the server's warning"; }
! grep -q "draining\|drain: done" <<<"$warnings" || fail "journalctl -p warning shows info lines: $warnings"
journal -p info | grep -q "drain: done" || fail "the drain's end is not in the journal at info"
journal -p notice | grep -q "listening on" || fail "the listening line is not a notice"
! journal | grep -q '^<[0-7]>' || fail "a priority prefix reached the journal as text"
stop_journald
trap cleanup EXIT

say "systemd-analyze security: the unit's exposure is below 7.0"
SYSTEMD_LOG_LEVEL=warning systemd-analyze security --offline=yes --root="$root" \
  "$root/usr/lib/systemd/system/mcp-python-exec-sandbox.service" >"$build/systemd-security.txt" 2>&1 || true
exposure=$(sed -n 's/.*Overall exposure level for .*: \([0-9.]*\) .*/\1/p' "$build/systemd-security.txt")
[ -n "$exposure" ] || { cat "$build/systemd-security.txt" >&2; fail "systemd-analyze security printed no exposure"; }
echo "  exposure: $exposure"
awk -v e="$exposure" 'BEGIN { exit !(e < 7.0) }' || fail "systemd-analyze security: $exposure (not below 7.0)"

say "upgrade (systemd stood in for): a running service restarts on the new binary; the token file stays, no prompt"
mkdir -p "$root/run/systemd/system"
: >"$root/run/mps-systemctl.log"
in_root systemctl start mcp-python-exec-sandbox.service
ready() { /usr/bin/python3 - "$service_port" <<'PY'
import sys, urllib.request
try:
    urllib.request.urlopen(f"http://127.0.0.1:{sys.argv[1]}/readyz", timeout=2).read()
except Exception:
    sys.exit(1)
PY
}
for _ in $(seq 300); do ready && break; sleep 0.1; done
ready || fail "the service did not start: $(tail -n 20 "$root/run/mps-service.log")"
old_pid=$(cat "$root/run/mps-service.pid")
echo "admin:$(head -c 24 /dev/urandom | od -An -tx1 | tr -d ' \n')" >>"$root/etc/mcp-python-exec-sandbox/tokens"
cp -p "$root/etc/mcp-python-exec-sandbox/tokens" "$build/tokens.before"
# (Were the token file a conffile, a template that changed would make dpkg ask about it.)
cp "$deb_upgrade" "$root/tmp/pkg-upgrade.deb"
: >"$root/run/mps-systemctl.log"
DEBIAN_FRONTEND=noninteractive in_root apt-get "${dpkg_path[@]}" install -y -qq --no-install-recommends /tmp/pkg-upgrade.deb \
  >"$build/apt-upgrade.log" 2>&1 </dev/null || { tail -n 30 "$build/apt-upgrade.log" >&2; fail "apt-get install (upgrade)"; }
[ "$(in_root dpkg-query -W -f='${Version}' mcp-python-exec-sandbox)" = "$upgrade_version" ] || fail "not upgraded"
! grep -qi "configuration file" "$build/apt-upgrade.log" || fail "the upgrade asked about a configuration file: $(cat "$build/apt-upgrade.log")"
cmp -s "$build/tokens.before" "$root/etc/mcp-python-exec-sandbox/tokens" || fail "the upgrade changed the token file"
[ "$(stat -c %a "$root/etc/mcp-python-exec-sandbox/tokens")" = 600 ] || fail "the token file is not 0600 after the upgrade"
grep -qx "try-restart mcp-python-exec-sandbox.service" "$root/run/mps-systemctl.log" ||
  fail "the upgrade did not restart the service: $(cat "$root/run/mps-systemctl.log")"
! grep -q "^stop" "$root/run/mps-systemctl.log" || fail "the upgrade stopped the service (prerm upgrade)"
new_pid=$(cat "$root/run/mps-service.pid")
[ "$new_pid" != "$old_pid" ] && kill -0 "$new_pid" || fail "the service was not restarted"
[[ "$(readlink "/proc/$new_pid/exe")" != *deleted* ]] || fail "the restarted service runs the old binary"
for _ in $(seq 300); do ready && break; sleep 0.1; done
ready || fail "the restarted service is not ready"

say "remove: stops the service, keeps the configuration and the token file"
ln -sf /lib/systemd/system/mcp-python-exec-sandbox.service "$root/etc/systemd/system/multi-user.target.wants/" 2>/dev/null ||
  { mkdir -p "$root/etc/systemd/system/multi-user.target.wants" &&
    ln -sf /lib/systemd/system/mcp-python-exec-sandbox.service "$root/etc/systemd/system/multi-user.target.wants/"; }
: >"$root/run/mps-systemctl.log"
DEBIAN_FRONTEND=noninteractive in_root apt-get "${dpkg_path[@]}" remove -y -qq mcp-python-exec-sandbox >>"$build/apt.log" 2>&1 ||
  { tail -n 20 "$build/apt.log" >&2; fail "apt-get remove"; }
grep -qx "stop mcp-python-exec-sandbox.service" "$root/run/mps-systemctl.log" ||
  fail "remove did not stop the service: $(cat "$root/run/mps-systemctl.log")"
# (gone, or a zombie its parent has not reaped yet)
! kill -0 "$new_pid" 2>/dev/null || [ "$(cut -d' ' -f3 "/proc/$new_pid/stat" 2>/dev/null)" = Z ] ||
  fail "the service still runs after remove"
[ -f "$root/etc/mcp-python-exec-sandbox/tokens" ] && [ -f "$root/etc/mcp-python-exec-sandbox/config.toml" ] ||
  fail "remove took the configuration"

say "purge (without systemd: no systemctl call): nothing of the package is left but the state directory"
rm -rf "$root/run/systemd/system"
: >"$root/run/mps-systemctl.log"
DEBIAN_FRONTEND=noninteractive in_root apt-get "${dpkg_path[@]}" purge -y -qq mcp-python-exec-sandbox >>"$build/apt.log" 2>&1 ||
  { tail -n 20 "$build/apt.log" >&2; fail "apt-get purge"; }
! grep -q "mcp-python-exec-sandbox\|daemon-reload\|try-restart\|^stop" "$root/run/mps-systemctl.log" ||
  fail "purge without systemd called systemctl: $(cat "$root/run/mps-systemctl.log")"
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
[ ! -e "$root/etc/mcp-python-exec-sandbox" ] || fail "/etc/mcp-python-exec-sandbox is left after purge: $(ls -la "$root/etc/mcp-python-exec-sandbox")"
[ ! -e "$root/etc/systemd/system/multi-user.target.wants/mcp-python-exec-sandbox.service" ] &&
  [ ! -L "$root/etc/systemd/system/multi-user.target.wants/mcp-python-exec-sandbox.service" ] || fail "the enablement is left after purge"
[ -d "$root/var/lib/mcp-python-exec-sandbox" ] || fail "the state directory went with the purge"
[ ! -e "$root/var/log/mcp-python-exec-sandbox" ] || fail "the audit logs are left after purge"
say "ok"

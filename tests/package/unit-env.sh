#!/usr/bin/env bash
# What the unit's namespace and seccomp settings do, for a command started outside systemd
# in a Debian root (tests/package/test-deb.sh has no running systemd):
#   unshare --mount --propagation private tests/package/unit-env.sh UNIT ROOT UNIT_SECCOMP -- COMMAND...
# In the private mount namespace it applies, to ROOT, each of these the unit sets:
#   ProcSubset=pid, ProtectProc=   a /proc of ROOT's own with subset=pid and hidepid=
#   ProtectKernelTunables=yes      /proc/sys and friends, and /sys (but /sys/fs/cgroup, which
#                                  systemd leaves to ProtectControlGroups=), read-only
#   PrivateDevices=yes             a /dev of its own: null, zero, full, random, urandom, tty,
#                                  pts, shm, mqueue
# then runs COMMAND (chroot ROOT ... as the caller says) under UNIT_SECCOMP for
# SystemCallArchitectures=native and RestrictAddressFamilies=.  Each setting the unit does not
# set is left alone: the emulation follows the unit.
set -euo pipefail
unit=$1 root=$2 seccomp=$3
shift 3
[ "${1:-}" = -- ] && shift
setting() { sed -n "s/^$1=//p" "$unit" | tail -n 1; }

subset=$(setting ProcSubset) hidepid=$(setting ProtectProc)
if [ -n "$subset$hidepid" ]; then
  opts=""
  [ -n "$subset" ] && opts="subset=$subset"
  [ -n "$hidepid" ] && opts="${opts:+$opts,}hidepid=$hidepid"
  mount -t proc -o "nosuid,nodev,noexec,$opts" proc "$root/proc"
fi

if [ "$(setting ProtectKernelTunables)" = yes ]; then
  for p in acpi apm asound bus fs irq latency_stats mtrr scsi sys sysrq-trigger timer_stats; do
    [ -e "$root/proc/$p" ] || continue
    mount --bind "$root/proc/$p" "$root/proc/$p"
    mount -o remount,bind,ro "$root/proc/$p"
  done
  # /sys and every mount below it read-only, but the cgroup tree (ProtectControlGroups=).
  findmnt -R -n -r -o TARGET "$root/sys" | while read -r m; do
    case "$m" in "$root/sys/fs/cgroup" | "$root/sys/fs/cgroup/"*) continue ;; esac
    mount -o remount,bind,ro "$m"
  done
fi

if [ "$(setting PrivateDevices)" = yes ]; then
  dev=$(mktemp -d /tmp/mps-unit-dev.XXXXXX)
  mount -t tmpfs -o mode=0755,nosuid,size=4m tmpfs "$dev"
  for d in null zero full random urandom tty; do
    touch "$dev/$d"
    mount --bind "/dev/$d" "$dev/$d"
  done
  mkdir -p "$dev/pts" "$dev/shm" "$dev/mqueue"
  mount -t devpts -o newinstance,ptmxmode=0666,mode=0620 devpts "$dev/pts"
  ln -s pts/ptmx "$dev/ptmx"
  mount -t tmpfs -o mode=1777,nosuid,nodev tmpfs "$dev/shm"
  mount -t mqueue mqueue "$dev/mqueue" 2>/dev/null || true
  ln -s /proc/self/fd "$dev/fd"
  ln -s /proc/self/fd/0 "$dev/stdin"
  ln -s /proc/self/fd/1 "$dev/stdout"
  ln -s /proc/self/fd/2 "$dev/stderr"
  mount --move "$dev" "$root/dev"
  rmdir "$dev"
fi

args=()
[ "$(setting SystemCallArchitectures)" = native ] && args+=(--native)
families=$(setting RestrictAddressFamilies)
[ -n "$families" ] && args+=(--families "$families")
exec "$seccomp" "${args[@]}" -- "$@"

#!/usr/bin/env bash
# deploy/install-deps.sh on a fresh Debian root (the debootstrap base of
# deploy/container-engine.sh, unpacked into a temporary directory and entered with chroot, so
# the machine itself gets nothing):
#   - the runtime set (./run.sh's) pulls none of the test set's tools and daemons: apt-get -s
#     (simulated) in the root lists what it would install, dependencies included;
#   - the two sets are apart, and the test set keeps what ./test.sh needs;
#   - nothing is left enabled: the script really installs a daemon package of the test set
#     (nginx, through MPS_DEPS_TEST; small) into the root, where Debian's postinst enables its
#     unit, and afterwards no new unit is enabled, and it said which it disabled.
#
#   tests/package/test-install-deps.sh        (root; apt in the root reaches Debian's mirror)
set -euo pipefail
cd "$(dirname "$0")/../.."

say() { echo "install-deps: $*"; }
fail() { echo "install-deps: FAIL: $*" >&2; exit 1; }
[ "$(id -u)" = 0 ] || fail "needs root (chroot, mounts)"

# What only tests use (and what those pull in): none of it may come with the runtime set.
test_only=(clang clang-format libcmocka-dev ccache python3-pytest python3-pytest-xdist
  python3-pytest-timeout python3-numpy python3-matplotlib nodejs npm docker.io containerd runc
  podman catatonit debootstrap prometheus chromium nginx nginx-common libnode108)

say "the sets, as the script lists them"
mapfile -t runtime < <(deploy/install-deps.sh --list runtime)
mapfile -t testset < <(deploy/install-deps.sh --list test)
[ ${#runtime[@]} -gt 5 ] || fail "no runtime set: ${runtime[*]}"
for p in "${runtime[@]}"; do
  for t in "${test_only[@]}" "${testset[@]}"; do
    [ "$p" != "$t" ] || fail "the runtime set lists $p, which only tests need"
  done
done
for need in bubblewrap libmicrohttpd-dev libjansson-dev libseccomp-dev libc-ares-dev python3 python3-venv; do
  printf '%s\n' "${runtime[@]}" | grep -qxF "$need" || fail "the runtime set lacks $need"
done
for need in libcmocka-dev python3-pytest docker.io podman debootstrap prometheus chromium nginx nodejs \
  python3-numpy python3-matplotlib; do
  printf '%s\n' "${testset[@]}" | grep -qxF "$need" || fail "the test set lacks $need"
done
grep -qE '^\./deploy/install-deps\.sh$' run.sh || fail "run.sh does not install the runtime set"
grep -qE '^\./deploy/install-deps\.sh --test$' test.sh || fail "test.sh does not install the test set"

tarball=$(./deploy/container-engine.sh base-tarball 2>/tmp/mps-install-deps-base.log) ||
  { tail -n 20 /tmp/mps-install-deps-base.log >&2; fail "no debootstrap base"; }

root=$(mktemp -d /tmp/mps-install-deps.XXXXXX)
mounted=()
cleanup() {
  local i
  for ((i = ${#mounted[@]} - 1; i >= 0; i--)); do umount -l "${mounted[$i]}" 2>/dev/null || true; done
  rm -rf --one-file-system "$root"
}
trap cleanup EXIT
tar -C "$root" -xf "$tarball"
mount -t proc proc "$root/proc" && mounted+=("$root/proc")
cp /etc/resolv.conf "$root/etc/resolv.conf"
cp /etc/apt/sources.list "$root/etc/apt/" 2>/dev/null || true
cp -r /etc/apt/sources.list.d "$root/etc/apt/" 2>/dev/null || true
mkdir -p "$root/opt/src/deploy"
cp deploy/install-deps.sh "$root/opt/src/deploy/"
in_root() { chroot "$root" /usr/bin/env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin HOME=/root "$@"; }
log=$(mktemp /tmp/mps-install-deps-log.XXXXXX)

say "apt-get update in a fresh bookworm root"
in_root apt-get update -qq >"$log" 2>&1 || { tail -n 20 "$log" >&2; fail "apt-get update"; }

say "the runtime set, simulated (apt-get -s install --no-install-recommends)"
in_root apt-get -s install --no-install-recommends "${runtime[@]}" >"$log" 2>&1 ||
  { tail -n 20 "$log" >&2; fail "apt-get -s install of the runtime set"; }
mapfile -t pulled < <(awk '$1 == "Inst" { print $2 }' "$log")
[ ${#pulled[@]} -gt 20 ] || fail "the simulation installs almost nothing (${#pulled[@]}): $(tail -n 5 "$log")"
for p in "${pulled[@]}"; do
  for t in "${test_only[@]}"; do
    [ "$p" != "$t" ] || fail "the runtime set pulls $p"
  done
  case "$p" in
    docker* | podman* | chromium* | nginx* | prometheus* | nodejs* | npm | clang* | python3-pytest*)
      fail "the runtime set pulls $p" ;;
  esac
done
say "the runtime set installs ${#pulled[@]} packages, none of the test set's"

say "nothing left enabled: the script installs nginx (the test set's stand-in) into the root"
enabled_links() {
  find "$root/etc/systemd/system" -path '*.wants/*' -type l -printf '%P\n' 2>/dev/null | sort
}
before=$(enabled_links)
in_root /usr/bin/env MPS_DEPS_RUNTIME= MPS_DEPS_TEST="nginx" /opt/src/deploy/install-deps.sh --test \
  >"$log" 2>&1 || { tail -n 30 "$log" >&2; fail "install-deps.sh --test (nginx)"; }
in_root dpkg-query -W -f='${Status}' nginx | grep -q 'install ok installed' || fail "nginx was not installed"
# Debian's postinst enabled it (the unit file is there), and the script disabled it again.
[ -n "$(find "$root/lib/systemd/system" "$root/usr/lib/systemd/system" -name nginx.service 2>/dev/null)" ] ||
  fail "nginx brought no unit: the check proves nothing"
after=$(enabled_links)
[ "$before" = "$after" ] || fail "left enabled: $(comm -13 <(echo "$before") <(echo "$after") | tr '\n' ' ')"
grep -q 'disabled what these packages enabled.*nginx.service' "$log" || fail "it did not say what it disabled: $(cat "$log")"
[ ! -e "$root/usr/sbin/policy-rc.d" ] || fail "policy-rc.d left behind"

say "a second run installs nothing and needs no network"
in_root /usr/bin/env MPS_DEPS_RUNTIME= MPS_DEPS_TEST="nginx" /opt/src/deploy/install-deps.sh --test >"$log" 2>&1 ||
  fail "second run: $(cat "$log")"
[ ! -s "$log" ] || fail "second run said: $(cat "$log")"
rm -f "$log"
say "PASS"

#!/usr/bin/env bash
# Installs the Debian packages mcp-python-exec-sandbox needs, in two sets:
#
#   deploy/install-deps.sh              the runtime set: what building and running the server
#                                       needs (./run.sh); no daemon, no browser, no test tool
#   deploy/install-deps.sh --test       the runtime set and the test set (./test.sh): cmocka,
#                                       pytest, clang, node, the container engines, chromium,
#                                       nginx, prometheus, debootstrap, Debian's numpy and
#                                       matplotlib
#   deploy/install-deps.sh --list runtime|test    prints a set, one package a line
#
# Idempotent: does nothing (and needs no network) when every package is present.  Nothing is
# started, and no service is left enabled that was not enabled before: the units the test set's
# packages bring (docker, containerd, nginx, prometheus, podman's) are disabled right after they
# are installed, and the script says so.  The tests start what they need by hand, on loopback
# (deploy/container-engine.sh for the engines).
#
# MPS_DEPS_RUNTIME / MPS_DEPS_TEST replace a set (tests/package/test-install-deps.sh uses them
# to install one small daemon instead of the whole test set).
set -euo pipefail

runtime=(
  build-essential cmake pkg-config
  libmicrohttpd-dev libjansson-dev libssl-dev uuid-dev libseccomp-dev libc-ares-dev
  bubblewrap python3 python3-venv python3-pip
  iproute2 ca-certificates procps util-linux openssl
)
test_only=(
  clang clang-format libcmocka-dev ccache curl
  python3-pytest python3-pytest-xdist python3-pytest-timeout
  python3-numpy python3-matplotlib
  nodejs npm
  docker.io podman catatonit debootstrap
  prometheus
  chromium
  nginx
)
if [ -n "${MPS_DEPS_RUNTIME+x}" ]; then read -r -a runtime <<<"$MPS_DEPS_RUNTIME"; fi
if [ -n "${MPS_DEPS_TEST+x}" ]; then read -r -a test_only <<<"$MPS_DEPS_TEST"; fi

want_test=0
case "${1:-}" in
  "") ;;
  --test) want_test=1 ;;
  --list)
    case "${2:-}" in
      runtime) printf '%s\n' "${runtime[@]}" ;;
      test) printf '%s\n' "${test_only[@]}" ;;
      *) echo "usage: $0 [--test | --list runtime|test]" >&2; exit 2 ;;
    esac
    exit 0
    ;;
  *) echo "usage: $0 [--test | --list runtime|test]" >&2; exit 2 ;;
esac

packages=("${runtime[@]}")
if [ "$want_test" = 1 ]; then packages+=("${test_only[@]}"); fi

installed() { dpkg-query -W -f='${Status}' "$1" 2>/dev/null | grep -q 'install ok installed'; }

missing=()
for p in "${packages[@]}"; do
  # npm ships inside some nodejs packages and separately in Debian's.
  if [ "$p" = npm ] && command -v npm >/dev/null 2>&1; then continue; fi
  installed "$p" || missing+=("$p")
done

if [ ${#missing[@]} -eq 0 ]; then
  exit 0
fi

if [ "$(id -u)" -ne 0 ]; then
  SUDO=sudo
else
  SUDO=
fi
if [ "$want_test" = 1 ]; then
  echo "install-deps: installing (the test set included) ${missing[*]}" >&2
else
  echo "install-deps: installing what building and running needs: ${missing[*]}" >&2
fi
export DEBIAN_FRONTEND=noninteractive

# Every package's units as they are now, to tell afterwards which ones the install enabled.
unit_state() {
  local d
  for d in /etc/systemd/system/*.wants /etc/systemd/system/*.requires; do
    if [ -d "$d" ]; then find "$d" -maxdepth 1 -type l -printf '%f\n'; fi
  done 2>/dev/null | sort -u
  return 0
}
before_units=$(unit_state)
before_pkgs=$(dpkg-query -W -f='${Package}\n' 2>/dev/null | sort -u)

# Packages with a daemon (prometheus, docker.io, nginx) are installed, never started: the tests
# start what they need on loopback.  A policy-rc.d of the machine's own is left as it is.
guard=
if [ ! -e /usr/sbin/policy-rc.d ]; then
  printf '#!/bin/sh\nexit 101\n' | $SUDO tee /usr/sbin/policy-rc.d >/dev/null
  $SUDO chmod 755 /usr/sbin/policy-rc.d
  guard=1
  trap '$SUDO rm -f /usr/sbin/policy-rc.d' EXIT
fi
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >&2
if [ -n "$guard" ]; then
  $SUDO rm -f /usr/sbin/policy-rc.d
  trap - EXIT
fi

# Debian enables the units of what it installs (deb-systemd-helper, also where systemd does
# not run): after the next boot dockerd, nginx on :80 and Prometheus on :9090 would run.  What
# this install newly enabled, of the packages it newly installed, is disabled again.
new_pkgs=$(comm -13 <(echo "$before_pkgs") <(dpkg-query -W -f='${Package}\n' 2>/dev/null | sort -u))
new_units=$(comm -13 <(echo "$before_units") <(unit_state))
disabled=()
if [ -n "$new_pkgs" ] && [ -n "$new_units" ]; then
  for pkg in $new_pkgs; do
    case "$pkg" in systemd | systemd-*) continue ;; esac # the init system's own units stay
    while read -r f; do
      u=$(basename "$f")
      grep -qxF "$u" <<<"$new_units" || continue
      if command -v systemctl >/dev/null 2>&1 && $SUDO systemctl disable --quiet "$u" 2>/dev/null; then
        :
      elif command -v deb-systemd-helper >/dev/null 2>&1; then
        $SUDO deb-systemd-helper disable "$u" >/dev/null 2>&1 || true
      fi
      # Whatever did it, no link of it is left in a .wants or .requires directory.
      $SUDO find /etc/systemd/system -path '*/*.wants/*' -name "$u" -type l -delete 2>/dev/null || true
      $SUDO find /etc/systemd/system -path '*/*.requires/*' -name "$u" -type l -delete 2>/dev/null || true
      disabled+=("$u")
    done < <(dpkg -L "$pkg" 2>/dev/null | grep -E '/systemd/system/[^/]+\.(service|socket|timer|path)$' || true)
  done
fi
if [ ${#disabled[@]} -gt 0 ]; then
  echo "install-deps: disabled what these packages enabled, so that nothing starts at boot: ${disabled[*]}" >&2
  echo "install-deps: (the tests start what they need by hand; to use one yourself: systemctl enable --now UNIT)" >&2
fi

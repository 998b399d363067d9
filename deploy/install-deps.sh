#!/usr/bin/env bash
# Installs the Debian packages needed to build, run and test mcp-python-exec-sandbox.
# Idempotent: does nothing (and needs no network) when every package is present.
set -euo pipefail

packages=(
  build-essential cmake pkg-config clang clang-format
  libmicrohttpd-dev libjansson-dev libssl-dev uuid-dev libseccomp-dev libcmocka-dev
  libc-ares-dev iproute2
  bubblewrap python3 python3-venv python3-pip python3-pytest python3-pytest-xdist python3-pytest-timeout ccache ca-certificates curl procps
  nodejs
  docker.io podman catatonit debootstrap
  systemd util-linux
  prometheus
  chromium
  nginx openssl
)

missing=()
for p in "${packages[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed'; then
    missing+=("$p")
  fi
done

# npm ships inside some nodejs packages and separately in Debian's.
if ! command -v npm >/dev/null 2>&1; then
  missing+=(npm)
fi

if [ ${#missing[@]} -eq 0 ]; then
  exit 0
fi

if [ "$(id -u)" -ne 0 ]; then
  SUDO=sudo
else
  SUDO=
fi
echo "install-deps: installing ${missing[*]}" >&2
export DEBIAN_FRONTEND=noninteractive
# Packages with a daemon (prometheus, docker.io) are installed, never started: the tests start
# what they need on loopback.  A policy-rc.d of the machine's own is left as it is.
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

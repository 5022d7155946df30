#!/usr/bin/env bash
# Installs what the tests drive, from Debian's packages, only when missing.
# Safe to run again: a machine that has everything installs nothing.
set -euo pipefail

packages=(
  xrdp xorgxrdp freerdp2-x11 xvfb xterm imagemagick   # RDP host, client, display, screenshots
  freeradius freeradius-utils                          # central policy (RADIUS) tests
  haproxy                                              # baseline relay for benchmarks
  libnbd-bin qemu-utils                                # NBD clients for the vDisk streaming tests
)

if ! command -v go >/dev/null 2>&1 && [ -x /usr/local/go/bin/go ]; then
  export PATH=/usr/local/go/bin:$PATH
fi
if ! command -v go >/dev/null 2>&1; then
  echo "install-deps: Go is not installed; deskway needs the Go toolchain named in go.mod (go.dev/dl)" >&2
  exit 1
fi

missing=()
for p in "${packages[@]}"; do
  [[ $p == \#* ]] && continue
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  if [ "$(id -u)" != 0 ]; then
    echo "install-deps: need root to install: ${missing[*]}" >&2
    exit 1
  fi
  echo "install-deps: installing ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
  # Debian starts these on install; tests start their own on loopback.
  for svc in xrdp xrdp-sesman freeradius haproxy; do
    systemctl disable --now "$svc" >/dev/null 2>&1 || service "$svc" stop >/dev/null 2>&1 || true
  done
  pkill -x xrdp-sesman 2>/dev/null || true
  pkill -x xrdp 2>/dev/null || true
  pkill -x freeradius 2>/dev/null || true
  pkill -x haproxy 2>/dev/null || true
fi
echo "install-deps: all test dependencies present"

#!/usr/bin/env bash
# Builds the browser RDP client the portal embeds: installs the npm
# packages pinned in web/package-lock.json and copies their modules into
# internal/web/static/vendor (not committed). Idempotent: does nothing when
# the copies are newer than the lockfile.
set -euo pipefail
cd "$(dirname "$0")/.."
out=internal/web/static/vendor
if [[ -f $out/iron-remote-desktop-rdp.js && $out/iron-remote-desktop-rdp.js -nt web/package-lock.json ]]; then
  exit 0
fi
if ! command -v npm >/dev/null; then
  echo "web-assets: installing Node.js and npm (Debian packages)"
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq nodejs npm >/dev/null
fi
(cd web && npm ci --no-audit --no-fund --loglevel=error)
mkdir -p "$out"
cp web/node_modules/@devolutions/iron-remote-desktop/iron-remote-desktop.js \
   web/node_modules/@devolutions/iron-remote-desktop-rdp/iron-remote-desktop-rdp.js "$out/"
echo "web-assets: browser client in $out"

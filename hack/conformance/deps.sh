#!/usr/bin/env bash
# Installs the Debian packages whose programs the e2e agnhost image carries
# (internal/images.E2ETools: curl, GNU wget, OpenBSD nc, ss, bash), only when one is
# missing. Run by `make conformance` after `make deps`.
set -euo pipefail

# file:package pairs.
need=(/usr/bin/curl:curl /usr/bin/wget:wget /bin/nc.openbsd:netcat-openbsd /bin/ss:iproute2 /bin/bash:bash)

missing=()
for pair in "${need[@]}"; do
  [ -x "${pair%%:*}" ] || missing+=("${pair##*:}")
done
[ ${#missing[@]} -eq 0 ] && exit 0

if [ "$(id -u)" -ne 0 ] || ! command -v apt-get >/dev/null; then
  echo "missing packages: ${missing[*]} (install them as root; on Debian: apt-get install ${missing[*]})" >&2
  exit 1
fi
echo "installing: ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null

#!/usr/bin/env bash
# Installs the Debian packages whose programs the e2e images carry
# (lab/images: E2ETools for agnhost: curl, GNU wget, OpenBSD nc, ss,
# bash, dash; E2EDnsTools for jessie-dnsutils: dig, host, nslookup, getent;
# bash-static, the busybox image's sh),
# only when one is missing, and checks that busybox-static is the version
# the images pin (lab/images.BusyboxDebVersion, whose /bin/busybox
# checksum mkimages verifies). Run by `make conformance` after `make deps`.
set -euo pipefail

# file:package pairs.
need=(/usr/bin/curl:curl /usr/bin/wget:wget /bin/nc.openbsd:netcat-openbsd /bin/ss:iproute2 /bin/bash:bash
  /bin/dash:dash /usr/bin/dig:bind9-dnsutils /usr/bin/getent:libc-bin /bin/busybox:busybox-static /bin/bash-static:bash-static)
busybox_version='1:1.35.0-4+deb12u1+b1'

missing=()
for pair in "${need[@]}"; do
  [ -x "${pair%%:*}" ] || missing+=("${pair##*:}")
done
have=$(dpkg-query -W -f '${Version}' busybox-static 2>/dev/null || true)
if [ -n "$have" ] && [ "$have" != "$busybox_version" ]; then
  missing+=("busybox-static=$busybox_version")
fi
[ ${#missing[@]} -eq 0 ] && exit 0

if [ "$(id -u)" -ne 0 ] || ! command -v apt-get >/dev/null; then
  echo "missing packages: ${missing[*]} (install them as root; on Debian: apt-get install ${missing[*]})" >&2
  exit 1
fi
echo "installing: ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq --no-install-recommends --allow-downgrades "${missing[@]}" >/dev/null

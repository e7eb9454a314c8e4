#!/usr/bin/env bash
# Installs the Debian packages the lab and the tests need, only those whose
# command is missing. Run by `make deps` (a prerequisite of lab, test and
# bench); a no-op on a machine that has them all.
set -euo pipefail

# command:package pairs.
need=(
  clang:clang llc:llvm bpftool:bpftool ip:iproute2 nft:nftables conntrack:conntrack
  tcpdump:tcpdump curl:curl ping:iputils-ping ethtool:ethtool iperf3:iperf3
  traceroute:traceroute nsenter:util-linux
  # flanneld (the flannel lab) clears the iptables rules of its other mode.
  iptables:iptables
  containerd:containerd ctr:containerd runc:runc
)
# Headers without a command.
files=(/usr/include/bpf/bpf_helpers.h:libbpf-dev)

missing=()
for pair in "${need[@]}"; do
  command -v "${pair%%:*}" >/dev/null 2>&1 || missing+=("${pair##*:}")
done
for pair in "${files[@]}"; do
  [ -e "${pair%%:*}" ] || missing+=("${pair##*:}")
done
# /bin/busybox goes into the agnhost image: it must be the static build.
if [ ! -x /bin/busybox ] || ldd /bin/busybox >/dev/null 2>&1; then
  missing+=(busybox-static)
fi
[ ${#missing[@]} -eq 0 ] && exit 0

mapfile -t missing < <(printf '%s\n' "${missing[@]}" | sort -u)
if [ "$(id -u)" -ne 0 ] || ! command -v apt-get >/dev/null; then
  echo "missing packages: ${missing[*]} (install them as root; on Debian: apt-get install ${missing[*]})" >&2
  exit 1
fi
echo "installing: ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null

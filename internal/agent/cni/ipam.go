package cni

import (
	"net/netip"
)

// gateway is the first address of a block: the pods' default gateway,
// answered by the node (a permanent neighbour in each pod).
func gateway(block netip.Prefix) netip.Addr { return block.Masked().Addr().Next() }

// pickAddr returns the lowest address of block that is not the network
// address, the gateway, the IPv4 broadcast address or in used (every address in use on the
// node, whatever its network).
func pickAddr(block netip.Prefix, used map[netip.Addr]bool) (netip.Addr, bool) {
	block = block.Masked()
	gw := gateway(block)
	for a := gw.Next(); block.Contains(a); a = a.Next() {
		if a.Is4() && !block.Contains(a.Next()) {
			break // the broadcast address
		}
		if !used[a] {
			return a, true
		}
	}
	return netip.Addr{}, false
}

package ipam

import (
	"encoding/hex"
	"fmt"
	"net"
	"net/netip"
)

// L2Gateway is the gateway of an l2 network in one family: the first
// address of its prefix, the same on every node (an anycast gateway, so a
// guest that moves keeps a valid neighbour entry for it).
func L2Gateway(prefix netip.Prefix) netip.Addr { return prefix.Masked().Addr().Next() }

// L2Assignable tells whether a is an address an l2 network may give an
// endpoint: inside prefix, and neither the network address, the gateway
// nor (IPv4) the broadcast address.
func L2Assignable(prefix netip.Prefix, a netip.Addr) bool {
	prefix = prefix.Masked()
	if !prefix.Contains(a) || a == prefix.Addr() || a == L2Gateway(prefix) {
		return false
	}
	return !a.Is4() || a != lastAddr(prefix)
}

// L2Next returns the first assignable address of prefix after a (from
// the start when a is invalid), and false when none is left.
func L2Next(prefix netip.Prefix, a netip.Addr) (netip.Addr, bool) {
	prefix = prefix.Masked()
	if !a.IsValid() {
		a = prefix.Addr()
	}
	for a = a.Next(); a.IsValid() && prefix.Contains(a); a = a.Next() {
		if L2Assignable(prefix, a) {
			return a, true
		}
	}
	return netip.Addr{}, false
}

// L2Capacity is the number of assignable addresses of prefix, saturated
// at 2^31-1 (for status fields).
func L2Capacity(prefix netip.Prefix) int32 {
	host := prefix.Addr().BitLen() - prefix.Bits()
	if host >= 31 {
		return 1<<31 - 1
	}
	n := int64(1)<<host - 2 // the network address and the gateway
	if prefix.Addr().Is4() {
		n-- // the broadcast address
	}
	return int32(max(n, 0))
}

func lastAddr(p netip.Prefix) netip.Addr {
	b := p.Masked().Addr().AsSlice()
	host := len(b)*8 - p.Bits()
	for i := len(b) - 1; i >= 0 && host > 0; i-- {
		n := min(host, 8)
		b[i] |= byte(1<<n - 1)
		host -= n
	}
	a, _ := netip.AddrFromSlice(b)
	return a
}

// L2MAC is the MAC of an endpoint whose first address is a: 0a:58 and the
// IPv4 address (as OVN-Kubernetes derives it, so a guest moved from there
// keeps its MAC), or 0a:59 and the low 32 bits of an IPv6 address; salt
// (0 first) perturbs the low bits when that MAC is taken. Locally
// administered unicast.
func L2MAC(a netip.Addr, salt uint32) net.HardwareAddr {
	b := a.AsSlice()
	mac := net.HardwareAddr{0x0a, 0x58, 0, 0, 0, 0}
	if a.Is6() {
		mac[1] = 0x59
	}
	low := b[len(b)-4:]
	v := (uint32(low[0])<<24 | uint32(low[1])<<16 | uint32(low[2])<<8 | uint32(low[3])) ^ salt
	mac[2], mac[3], mac[4], mac[5] = byte(v>>24), byte(v>>16), byte(v>>8), byte(v)
	return mac
}

// L2Claimable tells whether an endpoint may claim mac for itself (ask for
// it, or have it learned): unicast, not zero, and outside 0a:58-0a:5a,
// which the IPAM derives (L2MAC, L2GatewayMAC): holding one of those would
// squat on the address it derives from.
func L2Claimable(mac net.HardwareAddr) bool {
	return len(mac) == 6 && mac[0]&1 == 0 && mac.String() != "00:00:00:00:00:00" &&
		(mac[0] != 0x0a || mac[1] < 0x58 || mac[1] > 0x5a)
}

// L2GatewayMAC is the gateway's MAC in l2 network id, the same on every
// node: 0a:5a and the network ID; never an endpoint's (L2MAC).
func L2GatewayMAC(id int32) net.HardwareAddr {
	return net.HardwareAddr{0x0a, 0x5a, 0, 0, byte(id >> 8), byte(id)}
}

// NeighborName is the name of the Neighbor holding address a in network:
// the object is the claim, so two endpoints can never be given a.
func NeighborName(network string, a netip.Addr) string {
	if a.Is4() {
		return fmt.Sprintf("%s.v4-%s", network, hex.EncodeToString(a.AsSlice()))
	}
	return fmt.Sprintf("%s.v6-%s", network, hex.EncodeToString(a.AsSlice()))
}

// FDBEntryName is the name of the FDBEntry holding mac in network (the
// claim on the MAC).
func FDBEntryName(network string, mac net.HardwareAddr) string {
	return fmt.Sprintf("%s.%s", network, hex.EncodeToString(mac))
}

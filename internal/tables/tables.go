// Package tables holds the values of a node's data plane tables as plain
// Go data: the networks it knows, the routes of each network, the policies
// between networks, and the layout of an SRv6 SID. The model computes them
// from API objects and the datapath package writes them into eBPF maps;
// this package does neither, so the model stays pure (no cilium/ebpf, no
// netlink) and the datapath knows nothing of Kubernetes.
package tables

import "net/netip"

// SID function layout (bpf/include/lace.h): byte 8 of the SID is the
// behaviour, bytes 12-15 the network ID.
const (
	sidBehaviourByte = 8
	sidNetByte       = 12
	// BehaviourL3Decap decapsulates and looks the inner packet up in the
	// network named by the SID (End.DT46 semantics).
	BehaviourL3Decap = 1
)

// SID returns the SID of behaviour for network netID inside locator (a /64).
func SID(locator netip.Prefix, behaviour uint8, netID uint32) netip.Addr {
	b := locator.Masked().Addr().As16()
	b[sidBehaviourByte] = behaviour
	b[sidNetByte], b[sidNetByte+1], b[sidNetByte+2], b[sidNetByte+3] = byte(netID>>24), byte(netID>>16), byte(netID>>8), byte(netID)
	return netip.AddrFrom16(b)
}

// Route sends a prefix of a network either to this node's pods (Local) or
// encapsulated to SID.
type Route struct {
	NetID  uint32
	Prefix netip.Prefix
	SID    netip.Addr
	Local  bool
}

// Network is what the data plane knows of a network.
type Network struct {
	ID        uint32
	Anonymous bool
}

// Policy lets network Src initiate traffic to network Dst.
type Policy struct{ Src, Dst uint32 }

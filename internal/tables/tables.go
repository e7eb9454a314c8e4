// Package tables holds the values of a node's data plane tables as plain
// Go data: the networks it knows, each source network's view (a
// longest-prefix table), the external prefixes that classify plain-IP
// sources, and the layout of an SRv6 SID. The model computes them from API
// objects and the datapath package writes them into eBPF maps; this package
// does neither, so the model stays pure (no cilium/ebpf, no netlink) and the
// datapath knows nothing of Kubernetes.
package tables

import (
	"net"
	"net/netip"
	"slices"
)

// SID function layout (bpf/include/lace.h): byte 8 of the SID is the
// behaviour, bytes 10-11 the source network ID (the context the flow comes
// from, so the receiving node records it in conntrack and sends replies
// back in it), bytes 12-15 the destination network ID.
const (
	sidBehaviourByte = 8
	sidSrcNetByte    = 10
	sidNetByte       = 12
	// BehaviourL3Decap decapsulates and looks the inner packet up in the
	// destination network named by the SID (End.DT46 semantics).
	BehaviourL3Decap = 1
	// BehaviourL2IP carries an IP packet of an l2 network whose Ethernet
	// header the receiver rebuilds from the network's neighbour table
	// (End.DT2U, its frame's IP payload only: GSO survives the way it does
	// for an l3 packet).
	BehaviourL2IP = 4
	// BehaviourL2Flood carries an l2 network's broadcast or multicast
	// frame whole (End.DT2M, next header 143) to every port of the network
	// on the receiving node.
	BehaviourL2Flood = 3
)

// L2FloodNode is another node with ports in l2 network NetID: a flooded
// frame of the network goes to it at SID (its DT2M SID).
type L2FloodNode struct {
	NetID uint32
	SID   netip.Addr
}

// L2Neighbor is an entry of an l2 network's neighbour table: the MAC an
// ARP request or neighbour solicitation for Addr is answered with, and
// the MAC a frame from Addr carries.
type L2Neighbor struct {
	NetID uint32
	Addr  netip.Addr
	MAC   net.HardwareAddr
	// Router: the network's anycast gateway (its advertisement says so).
	Router bool
}

// FDBEntry is an entry of an l2 network's forwarding database: where a
// frame to MAC goes. One of IfIndex (a port on this node), Gateway (the
// anycast gateway, routed) or SID (another node: the SID of the network
// in its locator, whose behaviour byte the sender sets) is set.
//
// A MAC with a standby location (a live migration's target: a second pod
// of its IPAMClaim on another node) carries it too, StandbyIfIndex (a port
// here) or StandbySID (another node): the data plane moves the MAC there
// when it shows up there, before the API says so. The node's sync gives
// the cluster's view (SID or Here, StandbySID or StandbyHere); the ports
// are the pods' (datapath merges both).
type FDBEntry struct {
	NetID   uint32
	MAC     net.HardwareAddr
	IfIndex uint32
	Gateway bool
	SID     netip.Addr
	// Seq is the MAC's move sequence (its FDBEntry's, low 32 bits): a move
	// the data plane made holds for that sequence only.
	Seq            uint32
	StandbyIfIndex uint32
	StandbySID     netip.Addr
	// Here: the MAC lives on this node (at its pod's port) and has a
	// standby on another node. StandbyHere: its standby is this node's
	// pod holding it.
	Here, StandbyHere bool
}

// SID returns the SID of behaviour inside locator (a /64) for a packet of
// source network srcNet to destination network dstNet. Network IDs are 16
// bits (the controller's MaxNetworkID).
func SID(locator netip.Prefix, behaviour uint8, srcNet, dstNet uint32) netip.Addr {
	b := locator.Masked().Addr().As16()
	b[sidBehaviourByte] = behaviour
	b[sidSrcNetByte], b[sidSrcNetByte+1] = byte(srcNet>>8), byte(srcNet)
	b[sidNetByte], b[sidNetByte+1], b[sidNetByte+2], b[sidNetByte+3] = byte(dstNet>>24), byte(dstNet>>16), byte(dstNet>>8), byte(dstNet)
	return netip.AddrFrom16(b)
}

// RouteKind says what a view entry does with a new flow.
type RouteKind uint8

// Route kinds (route_val.flags in bpf/include/maps.h).
const (
	// RouteRemote: a block of a pod network on another node: encapsulate
	// to SID.
	RouteRemote RouteKind = iota
	// RouteLocal: a block of a pod network on this node: deliver.
	RouteLocal
	// RouteSubnet: a pod network's subnet outside any block: there is no
	// pod there (no-endpoint), and the subnet shadows external prefixes.
	RouteSubnet
	// RouteExternal: prefixes of an external network in the view. From a
	// pod: leave through the underlay with SNAT to the node address. From
	// the underlay: transit, which a node never does.
	RouteExternal
	// RouteDeny: an external network's prefix that is not in the view
	// (the outside address belongs to it, not to a broader network that
	// is): isolated.
	RouteDeny
)

// Route is one entry of a source network's view: NetID is the source
// network whose view it belongs to, DstNet the network the prefix belongs
// to. Closed marks the own entries of an anonymous network that no policy
// opens to itself: new flows are refused (anonymous-network) but replies of
// its pods' flows still route through them.
type Route struct {
	NetID  uint32
	Prefix netip.Prefix
	Kind   RouteKind
	DstNet uint32
	SID    netip.Addr // RouteRemote only
	Closed bool
}

// Classifier assigns plain-IP sources (outside hosts, node host stacks) in
// Prefix to the external network NetID, by longest prefix.
type Classifier struct {
	NetID  uint32
	Prefix netip.Prefix
}

// InsideKind says why a prefix is inside the cluster.
type InsideKind uint32

// Inside kinds (bpf/include/maps.h INSIDE_*).
const (
	InsidePodSubnet    InsideKind = 1
	InsideServiceRange InsideKind = 2
	InsideLocator      InsideKind = 3
)

// Inside is a prefix no outside host has an address in: a pod network's
// subnet, a service range or a node's SRv6 locator. Plain IP from the
// fabric with a source in it is spoofed and dropped.
type Inside struct {
	Prefix netip.Prefix
	Kind   InsideKind
}

// NodeLocator binds a node's underlay address (an outer source of SRv6) to
// its locator: decapsulation accepts a pod source only from the node
// whose locator holds the pod's block.
type NodeLocator struct {
	Addr    netip.Addr
	Locator netip.Prefix
}

// Network is what the data plane knows of a network: that it exists (a SID
// naming another is refused at decapsulation).
type Network struct {
	ID        uint32
	Anonymous bool
}

// RouteService is a view entry for a service VIP (a /32 or /128) the view
// may reach: DstNet is the service's network, in whose context its
// endpoints are resolved and reached.
const RouteService RouteKind = RouteDeny + 1

// Service is one service port as this node's data plane serves it: a VIP,
// protocol and port, and the endpoints eligible on this node (after
// readiness, terminating fallback, traffic policies and distribution).
type Service struct {
	VIP   netip.Addr
	Proto uint8 // IPPROTO_TCP, IPPROTO_UDP or IPPROTO_SCTP
	Port  uint16
	// NetID is the service's network.
	NetID    uint32
	Backends []Backend
	// Lingering are the endpoints of the service port's slices that are
	// not Backends here (not ready, terminating and unused, left out by a
	// traffic policy or topology), sorted; usually none. A connection to
	// one of them keeps it (graceful termination, a node whose status
	// lapsed), while one to an endpoint that left the slices altogether
	// is forgotten: its address may be given to another pod.
	Lingering []Backend
	// Drop says what happens without backends: false answers ICMP port
	// unreachable (no endpoints at all), true drops silently (endpoints
	// exist but none is eligible here: internalTrafficPolicy Local), as
	// kube-proxy does.
	Drop bool
	// AffinitySeconds is the ClientIP session affinity timeout; 0 for none.
	AffinitySeconds uint32
	// Frontend is what VIP is: the service's ClusterIP (the zero value)
	// or one of its external frontends. An external frontend is admitted
	// as ClusterIP:ClusterPort (the service's, of VIP's family) is: a
	// source reaches it only when its view reaches that ClusterIP.
	Frontend    Frontend
	ClusterIP   netip.Addr
	ClusterPort uint16
	// Local is externalTrafficPolicy Local: Backends are this node's, the
	// client's address is kept, and in-cluster clients (pods, the node)
	// use the ClusterIP's backends. Otherwise an outside client's flow to
	// a backend on another node leaves from the node's address.
	Local bool
	// Closed: a NodePort on a node address whose external network no
	// policy opens to the service's network; it drops (frontend-closed).
	Closed bool
	// SourceRanges are the loadBalancerSourceRanges (LoadBalancer and
	// external IPs): other sources are dropped (source-range). Sorted.
	SourceRanges []netip.Prefix
}

// Frontend says how a service is reached at a Service's VIP.
type Frontend uint8

// Frontends.
const (
	FrontendClusterIP Frontend = iota
	FrontendNodePort
	FrontendLoadBalancer
	FrontendExternalIP
	// FrontendHostPort is a pod's hostPort on a node address, or on the
	// loopback address for the node's own sockets only. Its one backend
	// is the pod; ClusterIP and ClusterPort are the pod's address and
	// container port, and a source reaches it only when its view reaches
	// that pod.
	FrontendHostPort
)

func (f Frontend) String() string {
	switch f {
	case FrontendNodePort:
		return "NodePort"
	case FrontendLoadBalancer:
		return "LoadBalancer"
	case FrontendExternalIP:
		return "ExternalIP"
	case FrontendHostPort:
		return "HostPort"
	}
	return "ClusterIP"
}

// External tells whether the frontend is reached from outside the
// cluster.
func (s *Service) External() bool { return s.Frontend != FrontendClusterIP }

// FrontendKey names one service port, an entry of lace_services: the
// order of the desired services (by address, protocol, then port).
type FrontendKey struct {
	VIP   netip.Addr
	Proto uint8
	Port  uint16
}

// Key is s's entry's key.
func (s *Service) Key() FrontendKey { return FrontendKey{s.VIP, s.Proto, s.Port} }

// FindFrontend is the place of k's entry in l, sorted by key (the desired
// services' order), and whether it is there.
func FindFrontend(l []Service, k FrontendKey) (int, bool) {
	return slices.BinarySearchFunc(l, k, func(s Service, k FrontendKey) int { return s.Key().Compare(k) })
}

// Compare orders keys as the desired services are sorted.
func (k FrontendKey) Compare(o FrontendKey) int {
	if c := k.VIP.Compare(o.VIP); c != 0 {
		return c
	}
	if k.Proto != o.Proto {
		return int(k.Proto) - int(o.Proto)
	}
	return int(k.Port) - int(o.Port)
}

// NodeNetID is the nodes' own context (NODE_NET_ID in lace.h): a network
// ID no Network is given. SIDs naming it carry the flows an external
// frontend sends from its node's address to an endpoint on another node,
// and their answers.
const NodeNetID = 1<<16 - 1

// Backend is one endpoint of a service port.
type Backend struct {
	Addr netip.Addr
	Port uint16
}

package model

import (
	"net/netip"
	"sort"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"

	lacev1 "github.com/lace-cni/lace/api/v1alpha1"
	"github.com/lace-cni/lace/internal/tables"
)

// NodeInput is everything a node's desired data plane depends on.
type NodeInput struct {
	Node            string
	Networks        []lacev1.Network
	Allocations     []lacev1.Allocation
	Underlays       []lacev1.UnderlayEndpoint
	RoutingPolicies []lacev1.NetworkRoutingPolicy
}

// LocatorRoute sends a node's locator over the underlay to its address.
type LocatorRoute struct {
	Node    string
	Locator netip.Prefix
	Via     netip.Addr
}

// Block is one of this node's blocks of an l3 network.
type Block struct {
	Network string
	NetID   uint32
	Prefix  netip.Prefix
}

// NodeState is the desired data plane of one node. Slices are sorted so
// that two computations of the same input compare equal.
type NodeState struct {
	// Locator is this node's own SRv6 locator (invalid until assigned).
	Locator  netip.Prefix
	Networks []tables.Network
	Routes   []tables.Route
	Policies []tables.Policy
	// Nodes are the underlay addresses of every node (decap sources).
	Nodes         []netip.Addr
	LocatorRoutes []LocatorRoute
	// Blocks are this node's blocks, for pod IPAM.
	Blocks []Block
}

// NetworkIDs maps network names to their IDs (networks without an ID yet
// are absent).
func NetworkIDs(nets []lacev1.Network) map[string]uint32 {
	out := map[string]uint32{}
	for _, n := range nets {
		if n.Status.ID > 0 {
			out[n.Name] = uint32(n.Status.ID)
		}
	}
	return out
}

// ComputeNode derives the desired data plane of in.Node.
func ComputeNode(in NodeInput) NodeState {
	var st NodeState
	ids := NetworkIDs(in.Networks)
	byName := map[string]*lacev1.Network{}
	for i := range in.Networks {
		n := &in.Networks[i]
		byName[n.Name] = n
		if n.Status.ID > 0 {
			st.Networks = append(st.Networks, tables.Network{ID: uint32(n.Status.ID), Anonymous: n.Spec.Anonymous})
		}
	}
	locators := map[string]netip.Prefix{}
	for _, u := range in.Underlays {
		loc, err := netip.ParsePrefix(string(u.Spec.Locator))
		if err != nil || !loc.Addr().Is6() {
			continue
		}
		locators[u.Spec.Node] = loc.Masked()
		var via netip.Addr
		for _, a := range u.Spec.Addresses {
			ip, err := netip.ParseAddr(string(a))
			if err != nil || !ip.Is6() {
				continue
			}
			st.Nodes = append(st.Nodes, ip)
			if !via.IsValid() {
				via = ip
			}
		}
		if u.Spec.Node == in.Node {
			st.Locator = loc.Masked()
		} else if via.IsValid() {
			st.LocatorRoutes = append(st.LocatorRoutes, LocatorRoute{Node: u.Spec.Node, Locator: loc.Masked(), Via: via})
		}
	}
	for _, a := range in.Allocations {
		// A block being released is withdrawn first (two-phase release).
		if a.DeletionTimestamp != nil {
			continue
		}
		nw := byName[a.Spec.Network]
		id, ok := ids[a.Spec.Network]
		if nw == nil || !ok || nw.Spec.Type != lacev1.NetworkTypeL3 {
			continue
		}
		for _, s := range a.Spec.Prefixes {
			p, err := netip.ParsePrefix(string(s))
			if err != nil {
				continue
			}
			if a.Spec.Node == in.Node {
				st.Routes = append(st.Routes, tables.Route{NetID: id, Prefix: p, Local: true})
				st.Blocks = append(st.Blocks, Block{Network: a.Spec.Network, NetID: id, Prefix: p})
				continue
			}
			loc, ok := locators[a.Spec.Node]
			if !ok {
				continue // the owner has no locator yet: nothing to route to
			}
			st.Routes = append(st.Routes, tables.Route{NetID: id, Prefix: p, SID: tables.SID(loc, tables.BehaviourL3Decap, id)})
		}
	}
	st.Policies = Policies(in.Networks, in.RoutingPolicies)
	sortState(&st)
	return st
}

// Policies expands NetworkRoutingPolicies into (source, destination)
// network ID pairs.
func Policies(nets []lacev1.Network, policies []lacev1.NetworkRoutingPolicy) []tables.Policy {
	seen := map[tables.Policy]bool{}
	var out []tables.Policy
	for _, p := range policies {
		src, err1 := metav1.LabelSelectorAsSelector(p.Spec.SrcSelector)
		dst, err2 := metav1.LabelSelectorAsSelector(p.Spec.DestSelector)
		if err1 != nil || err2 != nil || p.Spec.SrcSelector == nil || p.Spec.DestSelector == nil {
			continue
		}
		for _, s := range nets {
			if s.Status.ID == 0 || !src.Matches(labels.Set(s.Labels)) {
				continue
			}
			for _, d := range nets {
				if d.Status.ID == 0 || !dst.Matches(labels.Set(d.Labels)) {
					continue
				}
				pol := tables.Policy{Src: uint32(s.Status.ID), Dst: uint32(d.Status.ID)}
				if !seen[pol] {
					seen[pol] = true
					out = append(out, pol)
				}
			}
		}
	}
	return out
}

func sortState(st *NodeState) {
	sort.Slice(st.Networks, func(i, j int) bool { return st.Networks[i].ID < st.Networks[j].ID })
	sort.Slice(st.Routes, func(i, j int) bool {
		a, b := st.Routes[i], st.Routes[j]
		if a.NetID != b.NetID {
			return a.NetID < b.NetID
		}
		return a.Prefix.String() < b.Prefix.String()
	})
	sort.Slice(st.Policies, func(i, j int) bool {
		a, b := st.Policies[i], st.Policies[j]
		return a.Src < b.Src || (a.Src == b.Src && a.Dst < b.Dst)
	})
	sort.Slice(st.Nodes, func(i, j int) bool { return st.Nodes[i].Less(st.Nodes[j]) })
	sort.Slice(st.LocatorRoutes, func(i, j int) bool { return st.LocatorRoutes[i].Node < st.LocatorRoutes[j].Node })
	sort.Slice(st.Blocks, func(i, j int) bool {
		a, b := st.Blocks[i], st.Blocks[j]
		return a.Network < b.Network || (a.Network == b.Network && a.Prefix.Addr().Less(b.Prefix.Addr()))
	})
}

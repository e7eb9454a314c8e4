package model

import (
	"fmt"
	"net/netip"
	"slices"
	"sort"

	corev1 "k8s.io/api/core/v1"

	lacev1 "github.com/lace-cni/lace/api/v1alpha1"
)

// UnderlayInput is what decides which of the addresses the nodes write in
// their own UnderlayEndpoints are believed.
//
// An agent writes its node's UnderlayEndpoint and the admission policy
// checks only that it is its own: the addresses in it are whatever the
// node says. Every consumer (the trusted SRv6 outer sources, the node
// context's routes, the host routes, the addresses externalIPs may not
// claim) reads them through AcceptUnderlays, so that a node cannot claim
// another node's address, an outside host's, or addresses that are pods',
// services' or the operator's.
type UnderlayInput struct {
	Underlays []lacev1.UnderlayEndpoint
	// Nodes are the Node objects. When a node's Node lists InternalIP or
	// ExternalIP addresses (kubelet-reported), only those are accepted
	// from its UnderlayEndpoint.
	Nodes    []corev1.Node
	Networks []lacev1.Network
	// ServiceCIDRs, LoadBalancerPools and AllowedExternalIPs are address
	// space that is never a node's.
	ServiceCIDRs       []netip.Prefix
	LoadBalancerPools  []lacev1.LoadBalancerClass
	AllowedExternalIPs []netip.Prefix
}

// RefusedUnderlayAddress is an address of an UnderlayEndpoint that is not
// believed, and why.
type RefusedUnderlayAddress struct {
	Node    string
	Address string
	Reason  string // UnderlayAddress* reasons
	Message string
}

// Reasons an underlay address is refused.
const (
	UnderlayAddressInvalid    = "InvalidAddress"
	UnderlayAddressNotNodes   = "NotReportedByNode"
	UnderlayAddressReserved   = "ReservedAddress"
	UnderlayAddressClaimedBy  = "ClaimedByOtherNode"
	UnderlayAddressDuplicated = "DuplicateAddress"
)

// AcceptUnderlays returns the UnderlayEndpoints with only their accepted
// addresses (new objects sharing everything but spec.addresses with the
// input, which is not modified: callers pass cached objects), in input
// order, and the refused addresses sorted by node and address.
//
// An address is refused when it does not parse; when the node's Node
// reports addresses and this is not one of them; when it lies in a pod
// network's subnet, a service range, a LoadBalancer pool or the external
// IP allow-list; and when another node claims it too and that claim is
// older (creationTimestamp, then name: the first node to say so keeps it,
// a later one cannot take it over).
func AcceptUnderlays(in UnderlayInput) ([]lacev1.UnderlayEndpoint, []RefusedUnderlayAddress) {
	reported := map[string][]netip.Addr{}
	for _, n := range in.Nodes {
		for _, a := range n.Status.Addresses {
			if a.Type != corev1.NodeInternalIP && a.Type != corev1.NodeExternalIP {
				continue
			}
			if ip, err := netip.ParseAddr(a.Address); err == nil {
				reported[n.Name] = append(reported[n.Name], ip.Unmap())
			}
		}
	}
	type space struct {
		p    netip.Prefix
		r    IPRange
		what string
	}
	var reserved []space
	for _, n := range in.Networks {
		if n.Spec.Type == lacev1.NetworkTypeExternal {
			continue
		}
		for _, sub := range []*lacev1.Subnet{n.Spec.IPv4Subnet, n.Spec.IPv6Subnet} {
			if sub == nil {
				continue
			}
			if p, err := netip.ParsePrefix(string(sub.Prefix)); err == nil {
				reserved = append(reserved, space{p: p.Masked(), what: "the subnet of network " + n.Name})
			}
		}
	}
	for _, p := range in.ServiceCIDRs {
		reserved = append(reserved, space{p: p, what: "service range " + p.String()})
	}
	for _, p := range in.AllowedExternalIPs {
		reserved = append(reserved, space{p: p, what: "the external IP allow-list (" + p.String() + ")"})
	}
	for _, c := range in.LoadBalancerPools {
		for _, s := range c.Spec.Addresses {
			if r, err := ParseAddressRange(s); err == nil {
				reserved = append(reserved, space{r: r, what: "the pool of LoadBalancerClass " + c.Name})
			}
		}
	}

	var refused []RefusedUnderlayAddress
	refuse := func(node, addr, reason, format string, args ...any) {
		refused = append(refused, RefusedUnderlayAddress{Node: node, Address: addr, Reason: reason, Message: fmt.Sprintf(format, args...)})
	}
	// First what each endpoint may claim at all, then who keeps a shared one.
	cand := make([][]netip.Addr, len(in.Underlays))
	for i := range in.Underlays {
		u := &in.Underlays[i]
		node := u.Spec.Node
		rep, checks := reported[node]
	addrs:
		for _, s := range u.Spec.Addresses {
			a, err := netip.ParseAddr(string(s))
			if err != nil || a.Zone() != "" {
				refuse(node, string(s), UnderlayAddressInvalid, "%q is not an IP address", s)
				continue
			}
			a = a.Unmap()
			if checks && !slices.Contains(rep, a) {
				refuse(node, a.String(), UnderlayAddressNotNodes, "%s is not among the addresses Node %s reports", a, node)
				continue
			}
			for _, r := range reserved {
				if (r.p.IsValid() && r.p.Contains(a)) || (!r.p.IsValid() && r.r.Contains(a)) {
					refuse(node, a.String(), UnderlayAddressReserved, "%s lies in %s", a, r.what)
					continue addrs
				}
			}
			if slices.Contains(cand[i], a) {
				continue // listed twice by one node: harmless
			}
			cand[i] = append(cand[i], a)
		}
	}
	order := make([]int, len(in.Underlays))
	for i := range order {
		order[i] = i
	}
	sort.SliceStable(order, func(x, y int) bool {
		a, b := &in.Underlays[order[x]], &in.Underlays[order[y]]
		if !a.CreationTimestamp.Equal(&b.CreationTimestamp) {
			return a.CreationTimestamp.Before(&b.CreationTimestamp)
		}
		return a.Name < b.Name
	})
	owner := map[netip.Addr]string{}
	keep := make([][]netip.Addr, len(in.Underlays))
	for _, i := range order {
		node := in.Underlays[i].Spec.Node
		for _, a := range cand[i] {
			if o, taken := owner[a]; taken {
				reason := UnderlayAddressClaimedBy
				if o == node {
					reason = UnderlayAddressDuplicated // two endpoints naming one node
				}
				refuse(node, a.String(), reason, "%s is already node %s's (the older claim)", a, o)
				continue
			}
			owner[a] = node
			keep[i] = append(keep[i], a)
		}
	}

	out := make([]lacev1.UnderlayEndpoint, len(in.Underlays))
	for i := range in.Underlays {
		out[i] = in.Underlays[i]
		out[i].Spec.Addresses = nil
		for _, a := range keep[i] {
			out[i].Spec.Addresses = append(out[i].Spec.Addresses, lacev1.IPAddress(a.String()))
		}
	}
	sort.SliceStable(refused, func(x, y int) bool {
		if refused[x].Node != refused[y].Node {
			return refused[x].Node < refused[y].Node
		}
		return refused[x].Address < refused[y].Address
	})
	return out, refused
}

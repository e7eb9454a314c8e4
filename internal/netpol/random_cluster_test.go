package netpol

import (
	"fmt"
	"net/netip"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// The ClusterPolicy half of gen: both tiers, every action (and now and
// then an unknown one), priorities drawn from a few values so that ties
// are common, peers of every kind over the same small pools as the pods
// and ipBlocks, and now and then something unrecognised.

var nodeKeys, nodeValues = []string{"role", "zone"}, []string{"w", "c", "z1"}

func (g gen) nodes() []Node {
	var ns []Node
	for i := range g.pick(4) {
		n := Node{Name: fmt.Sprintf("n%d", i), Labels: g.labels(nodeKeys, nodeValues)}
		if g.chance(0.1) && i > 0 { // a duplicate name: the first entry counts
			n.Name = fmt.Sprintf("n%d", i-1)
		}
		// From the pods' own pools now and then: a pod on a node address.
		for range 1 + g.pick(2) {
			if g.chance(0.3) {
				n.Addrs = append(n.Addrs, v6(g.pick(34)))
			} else {
				n.Addrs = append(n.Addrs, v4(g.pick(34)))
			}
		}
		ns = append(ns, n)
	}
	return ns
}

func (g gen) clusterPolicy(i int) ClusterPolicy {
	p := ClusterPolicy{
		Name:     fmt.Sprintf("cnp%d", i),
		Tier:     pickOf(g, TierAdmin, TierBaseline),
		Priority: int32(g.pick(3)),
	}
	if g.chance(0.05) && i > 0 { // a duplicate name: the first entry counts
		p.Name = fmt.Sprintf("cnp%d", i-1)
	}
	if g.chance(0.03) {
		p.Tier = 3
	}
	switch g.pick(10) {
	case 0, 1, 2, 3:
		p.Subject.Namespaces = g.selector(nsKeys, nsValues)
	case 4, 5, 6, 7:
		p.Subject.Pods = &NamespacedPod{PodSelector: *g.selector(podKeys, podValues)}
		if g.chance(0.5) {
			p.Subject.Pods.NamespaceSelector = *g.selector(nsKeys, nsValues)
		}
	case 8:
		p.Subject.Namespaces = &metav1.LabelSelector{}
	case 9:
		if g.chance(0.5) { // both: selects nothing
			p.Subject.Namespaces = &metav1.LabelSelector{}
			p.Subject.Pods = &NamespacedPod{}
		}
	}
	for range g.pick(4) {
		p.Ingress = append(p.Ingress, g.clusterRule())
	}
	for range g.pick(4) {
		p.Egress = append(p.Egress, g.clusterRule())
	}
	return p
}

func (g gen) clusterRule() ClusterRule {
	r := ClusterRule{Action: pickOf(g, ActionAccept, ActionDeny, ActionPass)}
	if g.chance(0.03) {
		r.Action = pickOf(g, Action(0), Action(9))
	}
	n := pickOf(g, 1, 1, 1, 2, 3)
	if g.chance(0.03) {
		n = 0
	}
	for range n {
		r.Peers = append(r.Peers, g.clusterPeer())
	}
	for range pickOf(g, 0, 0, 1, 1, 2, 3) {
		r.Protocols = append(r.Protocols, g.clusterProtocol())
	}
	return r
}

func (g gen) clusterPeer() ClusterPeer {
	switch g.pick(14) {
	case 0, 1:
		return ClusterPeer{Namespaces: g.selector(nsKeys, nsValues)}
	case 2, 3:
		p := ClusterPeer{Pods: &NamespacedPod{PodSelector: *g.selector(podKeys, podValues)}}
		if g.chance(0.5) {
			p.Pods.NamespaceSelector = *g.selector(nsKeys, nsValues)
		}
		return p
	case 4, 5, 6, 7:
		var p ClusterPeer
		for range 1 + g.pick(3) {
			pf := g.prefix(g.chance(0.4))
			if g.chance(0.2) { // host bits set: must be masked
				pf = netip.PrefixFrom(pf.Addr().Next(), pf.Bits())
			}
			p.Networks = append(p.Networks, pf)
		}
		if g.chance(0.03) {
			p.Networks = append(p.Networks, netip.Prefix{})
		}
		return p
	case 8, 9, 10:
		return ClusterPeer{Nodes: g.selector(nodeKeys, nodeValues)}
	case 11:
		return ClusterPeer{Namespaces: &metav1.LabelSelector{}}
	case 12:
		if g.chance(0.5) {
			return ClusterPeer{} // unrecognised: none
		}
		return ClusterPeer{Namespaces: &metav1.LabelSelector{}, Nodes: &metav1.LabelSelector{}} // unrecognised: two
	}
	return ClusterPeer{Pods: &NamespacedPod{}}
}

func (g gen) clusterProtocol() ClusterProtocol {
	proto := pickOf(g, tcp, udp, sctp)
	switch g.pick(9) {
	case 0, 1, 2:
		return ClusterProtocol{Protocol: proto, Port: uint16(pickOf(g, genPortNumbers...))}
	case 3, 4:
		lo := uint16(pickOf(g, genPortNumbers...))
		hi := uint16(min(int(lo)+1+g.pick(3000), 65535))
		if g.chance(0.1) {
			hi = lo - uint16(g.pick(2)) // End <= Port: invalid
		}
		return ClusterProtocol{Protocol: proto, Port: lo, End: hi}
	case 5, 6, 7:
		return ClusterProtocol{NamedPort: pickOf(g, append(genPortNames, "nope")...)}
	}
	// Invalid, each its own way.
	return pickOf(g,
		ClusterProtocol{Protocol: proto},
		ClusterProtocol{Port: 80},
		ClusterProtocol{Protocol: "ICMP", Port: 80},
		ClusterProtocol{Protocol: proto, NamedPort: "http"},
		ClusterProtocol{NamedPort: "http", Port: 80})
}

// clusterProbes adds the edges of every network and port range, and the
// nodes' addresses, to probes' lists.
func clusterProbes(in Input, addPeer func(netip.Addr), ports []uint16) []uint16 {
	for _, n := range in.Nodes {
		for _, a := range n.Addrs {
			addPeer(a)
		}
	}
	for _, p := range in.ClusterPolicies {
		for _, r := range append(append([]ClusterRule(nil), p.Ingress...), p.Egress...) {
			for _, pe := range r.Peers {
				for _, pf := range pe.Networks {
					if !pf.IsValid() {
						continue
					}
					first, last := pf.Masked().Addr(), lastAddr(pf.Masked())
					addPeer(first)
					addPeer(first.Prev())
					addPeer(last)
					addPeer(last.Next())
				}
			}
			for _, pr := range r.Protocols {
				ports = append(ports, pr.Port-1, pr.Port, pr.Port+1, pr.End-1, pr.End, pr.End+1)
			}
		}
	}
	return ports
}

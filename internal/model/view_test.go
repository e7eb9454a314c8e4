package model

import (
	"fmt"
	"math/rand/v2"
	"net/netip"
	"reflect"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	lacev1 "github.com/lace-cni/lace/api/v1alpha1"
	"github.com/lace-cni/lace/internal/tables"
)

// TestViewsAgreeWithReach compares the views ComputeNode writes into the
// data plane with the oracle, which is written apart from them, over random
// topologies: for every source network and many destination addresses, a
// longest-prefix lookup in the source's view must give what Reach answers.
func TestViewsAgreeWithReach(t *testing.T) {
	var stats viewCheckStats
	seeds := uint64(300)
	if testing.Short() {
		seeds = 40
	}
	for seed := range seeds {
		g := randomTopology(seed)
		g.check(t, &stats)
		if t.Failed() {
			t.Fatalf("seed %d failed; topology:\n%s", seed, g)
		}
	}
	t.Logf("%d pod questions (%d allowed), %d outside questions (%d allowed), %d from outside",
		stats.pod, stats.podAllowed, stats.outside, stats.outsideAllowed, stats.fromOutside)
	if stats.podAllowed == 0 || stats.outsideAllowed == 0 || stats.pod == stats.podAllowed || stats.fromOutside == 0 {
		t.Errorf("the random topologies exercise too little: %+v", stats)
	}
}

type viewCheckStats struct {
	pod, podAllowed, outside, outsideAllowed, fromOutside int
}

type genTopology struct {
	seed   uint64
	nets   []lacev1.Network
	pols   []lacev1.NetworkRoutingPolicy
	allocs []lacev1.Allocation
	ueps   []lacev1.UnderlayEndpoint
	// dsts are the destination addresses asked about; outside the
	// addresses that may also be sources.
	dsts, outside []netip.Addr
}

func (g genTopology) String() string {
	s := ""
	for _, n := range g.nets {
		s += fmt.Sprintf("  network %s id=%d type=%s anonymous=%v labels=%v", n.Name, n.Status.ID, n.Spec.Type, n.Spec.Anonymous, n.Labels)
		for _, sn := range []*lacev1.Subnet{n.Spec.IPv4Subnet, n.Spec.IPv6Subnet} {
			if sn != nil {
				s += " " + string(sn.Prefix)
			}
		}
		s += fmt.Sprintf(" %v\n", n.Spec.ExternalPrefixes)
	}
	for _, p := range g.pols {
		s += fmt.Sprintf("  policy %s %v -> %v\n", p.Name, p.Spec.SrcSelector.MatchLabels, p.Spec.DestSelector.MatchLabels)
	}
	for _, a := range g.allocs {
		s += fmt.Sprintf("  allocation %s on %s %v deleting=%v\n", a.Spec.Network, a.Spec.Node, a.Spec.Prefixes, a.DeletionTimestamp != nil)
	}
	for _, u := range g.ueps {
		s += fmt.Sprintf("  node %s locator %s\n", u.Spec.Node, u.Spec.Locator)
	}
	return s
}

var (
	genV4Subnets = []string{"10.1.0.0/16", "10.2.0.0/16", "10.1.0.0/17", "10.1.128.0/17", "10.3.0.0/16", "10.2.0.0/16"}
	genV6Subnets = []string{"fd00:1::/48", "fd00:2::/48", "fd00:1::/56", "fd00:3::/48"}
	// External prefixes: some outside every pod subnet, some inside one
	// (shadowed by it, or more specific than it and holding blocks), some
	// equal to a subnet or a block, some holding pod subnets.
	genExternal = []string{"192.168.0.0/16", "192.168.1.0/24", "10.1.5.0/24", "10.0.0.0/8", "10.1.0.0/23", "10.2.3.0/24",
		"10.1.0.0/16", "10.1.1.0/24", "172.16.0.0/12", "fd00:1:0:5::/64", "2001:db8::/32", "fd00::/16", "fd00:2:0:1::/64"}
	genOutside = []string{"8.8.8.8", "192.168.1.77", "192.168.7.7", "10.1.5.9", "10.9.9.9", "10.1.1.200", "10.1.0.77", "10.2.3.3",
		"172.16.3.4", "2001:db8::7", "2606:4700::1111", "fd00:1:0:5::9", "fd00:9::9", "fd00:2:0:1::33"}
	genPodNames = []string{"red", "blue", "green", "cyan", "pink", "teal"}
	genExtNames = []string{"corp", "lab", "alt", "dmz"}
)

// chooser is where a generator takes its choices from: a seeded
// *rand.Rand, or a fuzz input's bytes (fuzz_model_test.go).
type chooser interface {
	IntN(n int) int
	Shuffle(n int, swap func(i, j int))
	Perm(n int) []int
}

func randomTopology(seed uint64) genTopology {
	return genTopologyFrom(rand.New(rand.NewPCG(seed, 0x1ace)), seed)
}

// genTopologyFrom builds a topology from rng's choices; seed only names
// it (and seeds the shuffles of check).
func genTopologyFrom(rng chooser, seed uint64) genTopology {
	g := genTopology{seed: seed}
	label := func(n *lacev1.Network) {
		if rng.IntN(10) < 6 {
			n.Labels["tier"] = []string{"a", "b"}[rng.IntN(2)]
		}
		if rng.IntN(2) == 0 {
			n.Labels["vrf"] = []string{"x", "y"}[rng.IntN(2)]
		}
	}
	names := append([]string(nil), genPodNames...)
	rng.Shuffle(len(names), func(i, j int) { names[i], names[j] = names[j], names[i] })
	for _, name := range names[:3+rng.IntN(4)] {
		var prefixes []string
		if rng.IntN(100) < 85 {
			prefixes = append(prefixes, genV4Subnets[rng.IntN(len(genV4Subnets))])
		}
		if len(prefixes) == 0 || rng.IntN(2) == 0 {
			prefixes = append(prefixes, genV6Subnets[rng.IntN(len(genV6Subnets))])
		}
		n := l3(name, nil, prefixes...)
		if rng.IntN(6) == 0 {
			n.Spec.Type = lacev1.NetworkTypeL2
			for _, s := range []*lacev1.Subnet{n.Spec.IPv4Subnet, n.Spec.IPv6Subnet} {
				if s != nil {
					s.HostLocalPrefixLength = nil
				}
			}
		}
		n.Spec.Anonymous = rng.IntN(4) == 0
		label(&n)
		g.nets = append(g.nets, n)
	}
	if rng.IntN(10) < 7 {
		w := external("world", "0.0.0.0/0", "::/0")
		label(&w)
		g.nets = append(g.nets, w)
	}
	ext := append([]string(nil), genExtNames...)
	rng.Shuffle(len(ext), func(i, j int) { ext[i], ext[j] = ext[j], ext[i] })
	for _, name := range ext[:rng.IntN(4)] {
		var prefixes []string
		for range 1 + rng.IntN(3) {
			p := genExternal[rng.IntN(len(genExternal))]
			if !containsStr(prefixes, p) {
				prefixes = append(prefixes, p)
			}
		}
		n := external(name, prefixes...)
		label(&n)
		g.nets = append(g.nets, n)
	}
	rng.Shuffle(len(g.nets), func(i, j int) { g.nets[i], g.nets[j] = g.nets[j], g.nets[i] })
	ids := rng.Perm(len(g.nets))
	for i := range g.nets {
		// Now and then a network not in the data plane yet.
		if rng.IntN(12) > 0 {
			g.nets[i].Status.ID = int32(ids[i] + 1)
		}
	}

	nodes := []string{"n1", "n2", "n3"}[:2+rng.IntN(2)]
	for i, node := range nodes {
		// Now and then another node without a locator yet.
		if i > 0 && rng.IntN(8) == 0 {
			continue
		}
		g.ueps = append(g.ueps, lacev1.UnderlayEndpoint{Spec: lacev1.UnderlayEndpointSpec{Node: node,
			Addresses: []lacev1.IPAddress{lacev1.IPAddress(fmt.Sprintf("fd00:30::%d", i+1))}, Locator: lacev1.CIDR(fmt.Sprintf("fd1a:ce:0:%d::/64", i+1))}})
	}
	now := metav1.Now()
	for _, n := range g.nets {
		for _, s := range []*lacev1.Subnet{n.Spec.IPv4Subnet, n.Spec.IPv6Subnet} {
			if s == nil {
				continue
			}
			sub := netip.MustParsePrefix(string(s.Prefix))
			for i := range 6 {
				b := genBlock(sub, i)
				g.dsts = append(g.dsts, offset(b.Addr(), 5))
				if n.Spec.Type != lacev1.NetworkTypeL3 || rng.IntN(3) == 0 {
					continue // not allocated: its addresses are in the subnet outside any block
				}
				a := alloc(n.Name, nodes[rng.IntN(len(nodes))], b.String())
				a.Name += fmt.Sprint(".", len(g.allocs))
				if rng.IntN(10) == 0 {
					a.DeletionTimestamp = &now
				}
				g.allocs = append(g.allocs, a)
			}
			g.dsts = append(g.dsts, offset(genBlock(sub, 100).Addr(), 7))
		}
	}
	for _, n := range g.nets {
		for _, p := range n.Spec.ExternalPrefixes {
			a := offset(netip.MustParsePrefix(string(p)).Addr(), 9)
			g.outside = append(g.outside, a)
		}
	}
	for _, s := range genOutside {
		g.outside = append(g.outside, netip.MustParseAddr(s))
	}
	g.dsts = append(g.dsts, g.outside...)

	var pod, all []string
	for _, n := range g.nets {
		all = append(all, n.Name)
		if n.Spec.Type != lacev1.NetworkTypeExternal {
			pod = append(pod, n.Name)
		}
	}
	pick := func(list []string) string { return list[rng.IntN(len(list))] }
	polNames := rng.Perm(100)
	for i := range rng.IntN(8) {
		name := fmt.Sprintf("p%02d", polNames[i])
		sel := func() map[string]string {
			return [](map[string]string){{"tier": "a"}, {"tier": "b"}, {"vrf": "x"}, {"vrf": "y"}, {netLabel: pick(all)}}[rng.IntN(5)]
		}
		var p lacev1.NetworkRoutingPolicy
		switch rng.IntN(6) {
		case 0: // one way
			p = byName(pick(all), pick(all))
		case 1: // both directions
			a, b := pick(all), pick(all)
			p = byName(a, b)
			r := byName(b, a)
			r.Name = name + "r"
			g.pols = append(g.pols, r)
		case 2: // a label mesh
			s := sel()
			p = nrp("", s, s)
		case 3: // labels on both sides
			p = nrp("", sel(), sel())
		case 4: // a self policy, mostly on an anonymous network
			n := pick(pod)
			for _, nw := range g.nets {
				if nw.Spec.Anonymous && rng.IntN(2) == 0 {
					n = nw.Name
				}
			}
			p = byName(n, n)
		case 5: // pods out to an external network, or in from one
			var exts []string
			for _, n := range g.nets {
				if n.Spec.Type == lacev1.NetworkTypeExternal {
					exts = append(exts, n.Name)
				}
			}
			if len(exts) == 0 {
				continue
			}
			if rng.IntN(2) == 0 {
				p = nrp("", sel(), map[string]string{netLabel: pick(exts)})
			} else {
				p = byName(pick(exts), pick(pod))
			}
		}
		p.Name = name
		g.pols = append(g.pols, p)
	}
	return g
}

func containsStr(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

// genBlock is block i of a subnet: a /24 of an IPv4 subnet, a /64 of an
// IPv6 one.
func genBlock(sub netip.Prefix, i int) netip.Prefix {
	if sub.Addr().Is4() {
		b := sub.Addr().As4()
		b[2] += byte(i)
		return netip.PrefixFrom(netip.AddrFrom4(b), 24)
	}
	b := sub.Addr().As16()
	b[7] += byte(i)
	return netip.PrefixFrom(netip.AddrFrom16(b), 64)
}

func offset(a netip.Addr, n int) netip.Addr {
	for range n {
		a = a.Next()
	}
	return a
}

// lpm is the data plane's lookup: the longest prefix of view netID holding a.
func lpm(routes []tables.Route, netID uint32, a netip.Addr) (tables.Route, bool) {
	var best tables.Route
	found := false
	for _, r := range routes {
		if r.NetID == netID && r.Prefix.Contains(a) && (!found || r.Prefix.Bits() > best.Prefix.Bits()) {
			best, found = r, true
		}
	}
	return best, found
}

func (g genTopology) check(t *testing.T, stats *viewCheckStats) {
	in := NodeInput{Node: "n1", Networks: g.nets, Allocations: g.allocs, Underlays: g.ueps, RoutingPolicies: g.pols}
	st := ComputeNode(in)
	topo := Topology{Networks: g.nets, RoutingPolicies: g.pols}

	// The same objects in another order give the same tables.
	rng := rand.New(rand.NewPCG(g.seed, 7))
	shuffled := NodeInput{Node: "n1", Underlays: g.ueps,
		Networks:        append([]lacev1.Network(nil), g.nets...),
		Allocations:     append([]lacev1.Allocation(nil), g.allocs...),
		RoutingPolicies: append([]lacev1.NetworkRoutingPolicy(nil), g.pols...)}
	rng.Shuffle(len(shuffled.Networks), func(i, j int) {
		shuffled.Networks[i], shuffled.Networks[j] = shuffled.Networks[j], shuffled.Networks[i]
	})
	rng.Shuffle(len(shuffled.Allocations), func(i, j int) {
		shuffled.Allocations[i], shuffled.Allocations[j] = shuffled.Allocations[j], shuffled.Allocations[i]
	})
	rng.Shuffle(len(shuffled.RoutingPolicies), func(i, j int) {
		shuffled.RoutingPolicies[i], shuffled.RoutingPolicies[j] = shuffled.RoutingPolicies[j], shuffled.RoutingPolicies[i]
	})
	if st2 := ComputeNode(shuffled); !reflect.DeepEqual(st, st2) {
		t.Errorf("seed %d: the order of the inputs changes the tables", g.seed)
	}
	keys := map[string]bool{}
	for _, r := range st.Routes {
		k := fmt.Sprint(r.NetID, r.Prefix)
		if keys[k] {
			t.Errorf("seed %d: two routes for %s", g.seed, k)
		}
		keys[k] = true
		if r.Prefix != r.Prefix.Masked() {
			t.Errorf("seed %d: route %s has host bits", g.seed, r.Prefix)
		}
	}

	ready := map[string]lacev1.Network{}
	byID := map[uint32]string{}
	for _, n := range g.nets {
		if n.Status.ID > 0 {
			ready[n.Name] = n
			byID[uint32(n.Status.ID)] = n.Name
		}
	}
	locators := map[string]netip.Prefix{}
	for _, u := range g.ueps {
		locators[u.Spec.Node] = netip.MustParsePrefix(string(u.Spec.Locator))
	}
	// blockOf finds the live block of network n holding a, and its node.
	blockOf := func(n string, a netip.Addr) (string, bool) {
		for _, al := range g.allocs {
			if al.Spec.Network == n && al.DeletionTimestamp == nil && netip.MustParsePrefix(string(al.Spec.Prefixes[0])).Contains(a) {
				return al.Spec.Node, true
			}
		}
		return "", false
	}
	subnetsOf := func(n lacev1.Network) []netip.Prefix {
		var out []netip.Prefix
		for _, s := range []*lacev1.Subnet{n.Spec.IPv4Subnet, n.Spec.IPv6Subnet} {
			if s != nil {
				out = append(out, netip.MustParsePrefix(string(s.Prefix)))
			}
		}
		return out
	}
	desc := func(r tables.Route, ok bool) string {
		if !ok {
			return "no entry"
		}
		return fmt.Sprintf("%s %s -> %s closed=%v sid=%s", r.Prefix, kindNames[r.Kind], byID[r.DstNet], r.Closed, r.SID)
	}

	// checkPod compares the view of source network srcNet (already
	// decided by Reach for src) with Reach for a pod of d at a.
	checkPod := func(src Endpoint, srcNet string, d lacev1.Network, a netip.Addr) {
		v := Reach(topo, src, Endpoint{Kind: EndpointPod, Network: d.Name, Addr: a}, "tcp", 80)
		if v.SrcNetwork != srcNet {
			t.Errorf("seed %d: %s is in %s, Reach says %s (%s)", g.seed, src, srcNet, v.SrcNetwork, v.Rule)
			return
		}
		r, ok := lpm(st.Routes, uint32(ready[srcNet].Status.ID), a)
		toD := ok && r.DstNet == uint32(d.Status.ID) && r.Kind <= tables.RouteSubnet
		if v.Allowed != (toD && !r.Closed) {
			t.Errorf("seed %d: %s -> pod of %s at %s: Reach allowed=%v (%s), view of %s gives %s",
				g.seed, src, d.Name, a, v.Allowed, v.Rule, srcNet, desc(r, ok))
			return
		}
		if toD && r.Closed && v.Reason != DropAnonymous {
			t.Errorf("seed %d: %s -> pod of %s at %s: view of %s gives a closed entry, Reach says %q (%s)",
				g.seed, src, d.Name, a, srcNet, v.Reason, v.Rule)
		}
		if v.Reason == DropAnonymous && toD && !r.Closed {
			t.Errorf("seed %d: %s -> pod of %s at %s: Reach says anonymous-network, view of %s gives %s",
				g.seed, src, d.Name, a, srcNet, desc(r, ok))
		}
		stats.pod++
		if !v.Allowed {
			return
		}
		stats.podAllowed++
		// At block granularity: deliver here, or encapsulate to the owner
		// with the flow's source and destination networks in the SID.
		node, inBlock := blockOf(d.Name, a)
		loc, hasLoc := locators[node]
		switch {
		case !inBlock || (node != "n1" && !hasLoc):
			if r.Kind != tables.RouteSubnet {
				t.Errorf("seed %d: %s -> %s in no routable block of %s: view gives %s", g.seed, src, a, d.Name, desc(r, ok))
			}
		case node == "n1":
			if r.Kind != tables.RouteLocal {
				t.Errorf("seed %d: %s -> %s in a local block of %s: view gives %s", g.seed, src, a, d.Name, desc(r, ok))
			}
		default:
			want := tables.SID(loc, tables.BehaviourL3Decap, uint32(ready[srcNet].Status.ID), uint32(d.Status.ID))
			if r.Kind != tables.RouteRemote || r.SID != want {
				t.Errorf("seed %d: %s -> %s in a block of %s on %s: view gives %s, want remote sid %s", g.seed, src, a, d.Name, node, desc(r, ok), want)
			}
		}
	}

	for _, sn := range g.nets {
		if sn.Status.ID <= 0 || sn.Spec.Type == lacev1.NetworkTypeExternal {
			continue
		}
		for _, sub := range subnetsOf(sn) {
			src := Endpoint{Kind: EndpointPod, Network: sn.Name, Addr: offset(sub.Addr(), 2), NodeName: "n1"}
			for _, a := range g.dsts {
				if a.Is4() != src.Addr.Is4() {
					continue
				}
				// As an outside address.
				v := Reach(topo, src, Endpoint{Kind: EndpointOutside, Addr: a}, "tcp", 80)
				r, ok := lpm(st.Routes, uint32(sn.Status.ID), a)
				if ok && r.Closed && (v.Allowed || v.Reason != DropAnonymous) {
					// A closed anonymous network's own subnets stay
					// its own: the data plane drops as anonymous-network
					// whatever the question calls the address.
					t.Errorf("seed %d: %s -> outside %s in its closed own subnet: Reach %v %q (%s), want anonymous-network",
						g.seed, src, a, v.Allowed, v.Reason, v.Rule)
				} else if v.Allowed != (ok && r.Kind == tables.RouteExternal && !r.Closed) {
					t.Errorf("seed %d: %s -> outside %s: Reach allowed=%v (%s), view of %s gives %s",
						g.seed, src, a, v.Allowed, v.Rule, sn.Name, desc(r, ok))
				} else if v.Allowed && (!v.SNAT || v.DstNetwork != byID[r.DstNet]) {
					t.Errorf("seed %d: %s -> outside %s: Reach goes to %s (snat %v), view to %s", g.seed, src, a, v.DstNetwork, v.SNAT, desc(r, ok))
				}
				stats.outside++
				if v.Allowed {
					stats.outsideAllowed++
				}
				// As a pod of every pod network whose subnet holds it.
				for _, d := range ready {
					if d.Spec.Type != lacev1.NetworkTypeExternal && coveredBy(subnetsOf(d), netip.PrefixFrom(a, a.BitLen())) {
						checkPod(src, sn.Name, d, a)
					}
				}
			}
		}
	}

	// From outside: the source is classified by the classifiers, and the
	// external network's view decides. One source per external network
	// (and one unclassified) is enough: the view is the network's.
	seen := map[string]bool{}
	for _, s := range g.outside {
		src := Endpoint{Kind: EndpointOutside, Addr: s}
		var cls *tables.Classifier
		for i, c := range st.Classifiers {
			if c.Prefix.Contains(s) && (cls == nil || c.Prefix.Bits() > cls.Prefix.Bits()) {
				cls = &st.Classifiers[i]
			}
		}
		if cls == nil {
			if v := Reach(topo, src, Endpoint{Kind: EndpointOutside, Addr: s}, "tcp", 80); v.Reason != DropUnclassified {
				t.Errorf("seed %d: %s is in no classifier, Reach classifies it into %s", g.seed, s, v.SrcNetwork)
			}
			continue
		}
		if k := fmt.Sprint(cls.NetID, s.Is4()); seen[k] {
			continue
		} else {
			seen[k] = true
		}
		for _, d := range ready {
			if d.Spec.Type == lacev1.NetworkTypeExternal {
				continue
			}
			for _, a := range g.dsts {
				if a.Is4() == s.Is4() && coveredBy(subnetsOf(d), netip.PrefixFrom(a, a.BitLen())) {
					stats.fromOutside++
					checkPod(src, byID[cls.NetID], d, a)
				}
			}
		}
	}
}

package model

import (
	"fmt"
	"hash/fnv"
	"math/rand/v2"
	"net/netip"
	"reflect"
	"slices"
	"testing"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	lacev1 "github.com/lace-cni/lace/api/v1alpha1"
	"github.com/lace-cni/lace/internal/tables"
)

// The model's random tests (view_test.go, services_reach_test.go) draw
// their topologies from a seeded generator; the fuzz targets here draw
// the same generators' choices from the fuzz input instead, so coverage
// steers which topologies are tried. Every topology is valid as the API
// admits it; what is checked is the generators' own oracle (the data
// plane's views agree with Reach, whatever the order of the objects),
// determinism, and a small reference written here from docs/topology.md.

// byteChooser takes each choice from the next byte of a fuzz input,
// modulo its range, so a small change of the input is a small change of
// the topology; past the end of the input the choices come from a
// generator seeded by the input (its first options are the rare ones:
// a network without an ID, no policies).
type byteChooser struct {
	b    []byte
	rest *rand.Rand
}

func newByteChooser(data []byte) *byteChooser {
	return &byteChooser{b: data, rest: rand.New(rand.NewPCG(seedOf(data), 0xb17e))}
}

func (c *byteChooser) IntN(n int) int {
	switch {
	case n <= 1:
		return 0
	case len(c.b) == 0:
		return c.rest.IntN(n)
	}
	v := int(c.b[0]) % n
	c.b = c.b[1:]
	return v
}

func (c *byteChooser) Shuffle(n int, swap func(i, j int)) {
	for i := n - 1; i > 0; i-- {
		swap(i, c.IntN(i+1))
	}
}

func (c *byteChooser) Perm(n int) []int {
	p := make([]int, n)
	for i := range p {
		p[i] = i
	}
	c.Shuffle(n, func(i, j int) { p[i], p[j] = p[j], p[i] })
	return p
}

func seedOf(data []byte) uint64 {
	h := fnv.New64a()
	_, _ = h.Write(data)
	return h.Sum64()
}

// fuzzSeeds are the inputs every model fuzz target starts from: a few
// short ones (the rest of each topology is drawn from its hash).
func fuzzSeeds(f *testing.F) {
	f.Add([]byte{})
	for seed := range uint64(8) {
		rng := rand.New(rand.NewPCG(seed, 0xf22))
		b := make([]byte, 32)
		for i := range b {
			b[i] = byte(rng.Uint32())
		}
		f.Add(b)
	}
}

// matchesNet is a NetworkRoutingPolicy selector as the API defines it, for
// the generators' selectors (matchLabels only): nil selects nothing,
// empty everything.
func matchesNet(sel *metav1.LabelSelector, n lacev1.Network) bool {
	if sel == nil || len(sel.MatchExpressions) > 0 {
		return false
	}
	for k, v := range sel.MatchLabels {
		if l, ok := n.Labels[k]; !ok || l != v {
			return false
		}
	}
	return true
}

// FuzzTopology builds networks, NetworkRoutingPolicies, allocations and
// nodes from the input, and checks: ComputeNode's views agree with Reach
// and do not depend on the objects' order (genTopology.check); both are
// deterministic; and Reach agrees with this reference:
//   - two pods of one network reach each other, unless it is anonymous
//     or an external prefix more specific than its subnet covers the
//     destination (the external network then wins the lookup);
//   - pods of an anonymous network without a policy selecting it on both
//     sides do not;
//   - a pod never reaches a pod of another network no policy grants it;
//   - a node reaches the pods on it;
//   - an outside address no external prefix covers reaches no pod;
//   - a reply comes back exactly when the flow was admitted.
func FuzzTopology(f *testing.F) {
	fuzzSeeds(f)
	f.Fuzz(func(t *testing.T, data []byte) {
		g := genTopologyFrom(newByteChooser(data), seedOf(data))
		var stats viewCheckStats
		g.check(t, &stats)
		checkReachReference(t, g)
		if t.Failed() {
			t.Fatalf("topology:\n%s", g)
		}
	})
}

func checkReachReference(t *testing.T, g genTopology) {
	in := NodeInput{Node: "n1", Networks: g.nets, Allocations: g.allocs, Underlays: g.ueps, RoutingPolicies: g.pols}
	if a, b := ComputeNode(in), ComputeNode(in); !reflect.DeepEqual(a, b) {
		t.Errorf("ComputeNode of the same input twice differs")
	}
	topo := Topology{Networks: g.nets, RoutingPolicies: g.pols}
	var ready []lacev1.Network
	for _, n := range g.nets {
		if n.Status.ID > 0 {
			ready = append(ready, n)
		}
	}
	granted := func(src, dst lacev1.Network) bool {
		return slices.ContainsFunc(g.pols, func(p lacev1.NetworkRoutingPolicy) bool {
			return matchesNet(p.Spec.SrcSelector, src) && matchesNet(p.Spec.DestSelector, dst)
		})
	}
	external := func(n lacev1.Network) bool { return n.Spec.Type == lacev1.NetworkTypeExternal }
	// covered is the longest external prefix of a ready network holding a.
	covered := func(a netip.Addr) (netip.Prefix, bool) {
		var best netip.Prefix
		for _, n := range ready {
			for _, c := range n.Spec.ExternalPrefixes {
				if p := netip.MustParsePrefix(string(c)); external(n) && p.Contains(a) && (!best.IsValid() || p.Bits() > best.Bits()) {
					best = p
				}
			}
		}
		return best, best.IsValid()
	}
	subnets := func(n lacev1.Network) []netip.Prefix {
		var out []netip.Prefix
		for _, s := range []*lacev1.Subnet{n.Spec.IPv4Subnet, n.Spec.IPv6Subnet} {
			if s != nil {
				out = append(out, netip.MustParsePrefix(string(s.Prefix)))
			}
		}
		return out
	}
	reach := func(src, dst Endpoint) Verdict {
		v := Reach(topo, src, dst, "tcp", 80)
		if w := Reach(topo, src, dst, "tcp", 80); !reflect.DeepEqual(v, w) {
			t.Errorf("%s -> %s: Reach answers %+v, then %+v", src, dst, v, w)
		}
		if r := ReachReply(topo, src, dst, "tcp", 80); r.Allowed != v.Allowed {
			t.Errorf("%s -> %s: the flow allowed=%v (%s), its reply allowed=%v", src, dst, v.Allowed, v.Rule, r.Allowed)
		}
		return v
	}
	for _, n := range ready {
		if external(n) {
			continue
		}
		for _, sub := range subnets(n) {
			src := Endpoint{Kind: EndpointPod, Network: n.Name, Addr: offset(sub.Addr(), 2), NodeName: "n1"}
			dst := Endpoint{Kind: EndpointPod, Network: n.Name, Addr: offset(sub.Addr(), 5), NodeName: "n2"}
			v := reach(src, dst)
			ext, shadowed := covered(dst.Addr)
			shadowed = shadowed && ext.Bits() > sub.Bits()
			anonymous := n.Spec.Anonymous && n.Spec.Type != lacev1.NetworkTypeL2
			switch {
			case !anonymous && !shadowed && !v.Allowed:
				t.Errorf("%s -> %s, its own network's: denied (%s)", src, dst, v.Rule)
			case anonymous && !granted(n, n) && v.Allowed:
				t.Errorf("%s -> %s in anonymous %s, which no policy opens to itself: allowed (%s)", src, dst, n.Name, v.Rule)
			}
			host := Endpoint{Kind: EndpointNode, NodeName: "n1", Addr: netip.MustParseAddr("192.0.2.1")}
			if src.Addr.Is6() {
				host.Addr = netip.MustParseAddr("2001:db8:ffff::1")
			}
			if v := reach(host, src); !v.Allowed {
				t.Errorf("node n1 -> its own %s: denied (%s)", src, v.Rule)
			}
			for _, m := range ready {
				if external(m) || m.Name == n.Name || granted(n, m) {
					continue
				}
				for _, msub := range subnets(m) {
					if msub.Addr().Is4() != sub.Addr().Is4() {
						continue
					}
					dst := Endpoint{Kind: EndpointPod, Network: m.Name, Addr: offset(msub.Addr(), 5), NodeName: "n2"}
					if v := reach(src, dst); v.Allowed {
						t.Errorf("%s -> %s, of a network no policy grants %s: allowed (%s)", src, dst, n.Name, v.Rule)
					}
				}
			}
		}
	}
	for _, a := range g.outside {
		if _, ok := covered(a); ok {
			continue
		}
		for _, n := range ready {
			for _, sub := range subnets(n) {
				if external(n) || sub.Addr().Is4() != a.Is4() {
					continue
				}
				dst := Endpoint{Kind: EndpointPod, Network: n.Name, Addr: offset(sub.Addr(), 5), NodeName: "n2"}
				if v := reach(Endpoint{Kind: EndpointOutside, Addr: a}, dst); v.Allowed || v.Reason != DropUnclassified {
					t.Errorf("outside %s, in no external prefix -> %s: allowed=%v %q (%s)", a, dst, v.Allowed, v.Reason, v.Rule)
				}
			}
		}
	}
}

// FuzzServiceTopology adds Services, EndpointSlices, NetworkEndpoints
// and ServiceRoutingPolicies to a fuzzed topology, and checks: the VIP
// entries of the views agree with Reach (genServiceTopology.check);
// ComputeDesired of the same objects, in any order, is the same; every
// entry serves its Service's VIP in its Service's network with backends
// of its Service's slices only; and Reach agrees with this reference:
// a pod reaches the VIPs of its own network's Services unless the
// network is anonymous, and never those of a network neither a
// NetworkRoutingPolicy nor a ServiceRoutingPolicy grants it.
func FuzzServiceTopology(f *testing.F) {
	fuzzSeeds(f)
	f.Fuzz(func(t *testing.T, data []byte) {
		c := newByteChooser(data)
		g := genServiceTopologyFrom(c, c, seedOf(data))
		var stats svcCheckStats
		g.check(t, &stats)
		checkServiceReference(t, g)
		checkDesired(t, g, c)
		if t.Failed() {
			t.Fatalf("topology:\n%s", g)
		}
	})
}

func checkServiceReference(t *testing.T, g genServiceTopology) {
	topo := Topology{Networks: g.nets, RoutingPolicies: g.pols, ServiceRoutingPolicies: g.srps, Services: g.services, Namespaces: g.ns}
	byName := map[string]lacev1.Network{}
	for _, n := range g.nets {
		if n.Status.ID > 0 {
			byName[n.Name] = n
		}
	}
	grants := func(src, dst lacev1.Network) bool {
		for _, p := range g.pols {
			if matchesNet(p.Spec.SrcSelector, src) && matchesNet(p.Spec.DestSelector, dst) {
				return true
			}
		}
		// Any ServiceRoutingPolicy from src may grant: only those that
		// cannot are left for the reference.
		return slices.ContainsFunc(g.srps, func(p lacev1.ServiceRoutingPolicy) bool { return matchesNet(p.Spec.SrcSelector, src) })
	}
	for _, n := range byName {
		if n.Spec.Type == lacev1.NetworkTypeExternal {
			continue
		}
		for _, svc := range g.services {
			m, bound := byName[svc.Network]
			if !bound || m.Spec.Type == lacev1.NetworkTypeExternal {
				continue
			}
			for _, vip := range svc.VIPs {
				src := Endpoint{Kind: EndpointPod, Network: n.Name, Addr: netip.MustParseAddr("10.0.0.2"), NodeName: "n1"}
				if vip.Is6() {
					src.Addr = netip.MustParseAddr("fd00::2")
				}
				dst := Endpoint{Kind: EndpointService, Namespace: svc.Namespace, Name: svc.Name, Addr: vip}
				v := Reach(topo, src, dst, "tcp", 80)
				switch {
				case m.Name == n.Name && !IsAnonymous(&n) && !v.Allowed:
					t.Errorf("pod of %s -> VIP %s of its own network's service %s/%s: denied (%s)", n.Name, vip, svc.Namespace, svc.Name, v.Rule)
				case m.Name != n.Name && !grants(n, m) && v.Allowed:
					t.Errorf("pod of %s -> VIP %s of service %s/%s in %s, which no policy grants it: allowed (%s)", n.Name, vip, svc.Namespace, svc.Name, m.Name, v.Rule)
				}
			}
		}
	}
}

// checkDesired serves g's services: each bound by a NetworkBindingPolicy
// of its own to its network, with a slice of two ready endpoints (pods of
// that network when it has a subnet of the VIP's family).
func checkDesired(t *testing.T, g genServiceTopology, c chooser) {
	in := DesiredInput{Node: "n1", Networks: g.nets, Allocations: g.allocs, RoutingPolicies: g.pols, Underlays: g.ueps,
		ServiceRoutingPolicies: g.srps, Namespaces: g.ns,
		ServiceCIDRs: []networkingv1.ServiceCIDR{{ObjectMeta: metav1.ObjectMeta{Name: "kubernetes"},
			Spec: networkingv1.ServiceCIDRSpec{CIDRs: []string{"10.96.0.0/16", "fd00:96::/112"}}}}}
	subnet := map[string]map[bool]netip.Prefix{}
	for _, n := range g.nets {
		subnet[n.Name] = map[bool]netip.Prefix{}
		for _, s := range []*lacev1.Subnet{n.Spec.IPv4Subnet, n.Spec.IPv6Subnet} {
			if s != nil {
				p := netip.MustParsePrefix(string(s.Prefix))
				subnet[n.Name][p.Addr().Is4()] = p
			}
		}
	}
	backends := map[netip.Addr][]netip.Addr{} // by VIP
	network := map[netip.Addr]string{}
	for i, s := range g.services {
		svc := &corev1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: s.Namespace, Name: s.Name, Labels: map[string]string{"svc": s.Name}},
			Spec: corev1.ServiceSpec{Type: corev1.ServiceTypeClusterIP, Ports: []corev1.ServicePort{{Name: "http", Protocol: corev1.ProtocolTCP, Port: 80}}}}
		for _, vip := range s.VIPs {
			svc.Spec.ClusterIPs = append(svc.Spec.ClusterIPs, vip.String())
			network[vip] = s.Network
			fam := discoveryv1.AddressTypeIPv4
			if vip.Is6() {
				fam = discoveryv1.AddressTypeIPv6
			}
			sl := &discoveryv1.EndpointSlice{ObjectMeta: metav1.ObjectMeta{Namespace: s.Namespace, Name: fmt.Sprintf("%s-%s", s.Name, fam),
				Labels: map[string]string{discoveryv1.LabelServiceName: s.Name}}, AddressType: fam,
				Ports: []discoveryv1.EndpointPort{{Name: ptr.To("http"), Port: ptr.To[int32](8080), Protocol: ptr.To(corev1.ProtocolTCP)}}}
			for j := range 2 {
				p, ok := subnet[s.Network][vip.Is4()]
				if !ok {
					continue
				}
				a := offset(p.Addr(), 10+2*i+j)
				pod := fmt.Sprintf("%s-%d-%d", s.Name, len(backends[vip]), j)
				sl.Endpoints = append(sl.Endpoints, discoveryv1.Endpoint{Addresses: []string{a.String()},
					Conditions: discoveryv1.EndpointConditions{Ready: ptr.To(true)}})
				ne := svNE(pod, s.Network, []string{"n1", "n2"}[j], "uid-"+pod, a.String())
				ne.Namespace = s.Namespace
				in.NetworkEndpoints = append(in.NetworkEndpoints, ne)
				backends[vip] = append(backends[vip], a)
			}
			in.EndpointSlices = append(in.EndpointSlices, sl)
		}
		svc.Spec.ClusterIP = svc.Spec.ClusterIPs[0]
		in.Services = append(in.Services, svc)
		in.BindingPolicies = append(in.BindingPolicies, policy("bind-"+s.Name, s.Network, 100, lacev1.MatchKindService, map[string]string{"svc": s.Name}, nil))
	}
	d, err := ComputeDesired(in)
	if err != nil {
		t.Fatal(err)
	}
	if again, _ := ComputeDesired(in); !reflect.DeepEqual(d, again) {
		t.Errorf("ComputeDesired of the same input twice differs")
	}
	shuffled := in
	shuffled.Services, shuffled.EndpointSlices = slices.Clone(in.Services), slices.Clone(in.EndpointSlices)
	shuffled.Networks, shuffled.NetworkEndpoints = slices.Clone(in.Networks), slices.Clone(in.NetworkEndpoints)
	c.Shuffle(len(shuffled.Services), func(i, j int) {
		shuffled.Services[i], shuffled.Services[j] = shuffled.Services[j], shuffled.Services[i]
	})
	c.Shuffle(len(shuffled.EndpointSlices), func(i, j int) {
		shuffled.EndpointSlices[i], shuffled.EndpointSlices[j] = shuffled.EndpointSlices[j], shuffled.EndpointSlices[i]
	})
	c.Shuffle(len(shuffled.Networks), func(i, j int) {
		shuffled.Networks[i], shuffled.Networks[j] = shuffled.Networks[j], shuffled.Networks[i]
	})
	c.Shuffle(len(shuffled.NetworkEndpoints), func(i, j int) {
		shuffled.NetworkEndpoints[i], shuffled.NetworkEndpoints[j] = shuffled.NetworkEndpoints[j], shuffled.NetworkEndpoints[i]
	})
	if other, _ := ComputeDesired(shuffled); !reflect.DeepEqual(d.NodeState, other.NodeState) || !reflect.DeepEqual(d.Services, other.Services) {
		t.Errorf("the order of the objects changes the node's desired state")
	}
	ids := NetworkIDs(g.nets)
	for _, e := range d.NodeState.Services {
		name, ok := network[e.VIP]
		if !ok || e.Frontend != tables.FrontendClusterIP {
			t.Errorf("entry %s:%d is no ClusterIP of the services", e.VIP, e.Port)
			continue
		}
		if id, ok := ids[name]; !ok || e.NetID != id {
			t.Errorf("VIP %s of a service bound to %s is served in network id %d", e.VIP, name, e.NetID)
		}
		for _, b := range e.Backends {
			if !slices.Contains(backends[e.VIP], b.Addr) {
				t.Errorf("VIP %s has backend %s, which is not one of its service's endpoints %v", e.VIP, b.Addr, backends[e.VIP])
			}
		}
	}
}

package model

import (
	"fmt"
	"math/rand/v2"
	"net/netip"
	"strings"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	lacev1 "github.com/lace-cni/lace/api/v1alpha1"
	"github.com/lace-cni/lace/internal/tables"
)

// TestServiceViewsAgreeWithReach compares the VIP entries ComputeNode
// writes into every view with the oracle, written apart from them, over
// random topologies with services and ServiceRoutingPolicies: for every
// pod network with an ID and every VIP of every service, the network's
// view holds a RouteService entry for the VIP, naming the service's
// network, exactly when Reach allows a pod of that network to reach it;
// and the same for a node, by the external network its address
// classifies into.
func TestServiceViewsAgreeWithReach(t *testing.T) {
	var stats svcCheckStats
	seeds := uint64(400)
	if testing.Short() {
		seeds = 60
	}
	for seed := range seeds {
		g := randomServiceTopology(seed)
		g.check(t, &stats)
		if t.Failed() {
			t.Fatalf("seed %d failed; topology:\n%s", seed, g)
		}
	}
	t.Logf("%+v", stats)
	if stats.own == 0 || stats.nrp == 0 || stats.srp == 0 || stats.closed == 0 || stats.refused == 0 || stats.nsMiss == 0 || stats.denied == 0 || stats.node == 0 {
		t.Errorf("the random topologies exercise too little: %+v", stats)
	}
}

type svcCheckStats struct {
	// allowed by rule; denied, among them closed anonymous own networks,
	// refused peerings and SRPs whose namespaceSelector did not match.
	own, nrp, srp, denied, closed, refused, nsMiss int
	// node counts VIPs a node's sockets reach.
	node int
	// fallThrough counts denied VIPs whose address the view still resolves
	// to an external network (the packet would leave with SNAT rather than
	// be counted as isolated): not a disagreement about the VIP entries,
	// which is what this test compares, but worth knowing.
	fallThrough int
}

type genServiceTopology struct {
	genTopology
	srps     []lacev1.ServiceRoutingPolicy
	services []BoundService
	ns       map[string]map[string]string
}

func (g genServiceTopology) String() string {
	s := g.genTopology.String()
	for _, p := range g.srps {
		var src map[string]string
		if p.Spec.SrcSelector != nil {
			src = p.Spec.SrcSelector.MatchLabels
		}
		s += fmt.Sprintf("  srp %s %v -> name=%q labels=%v ns=%v\n", p.Name, src, p.Spec.DestSelector.Name,
			p.Spec.DestSelector.MatchLabels, metav1.FormatLabelSelector(p.Spec.NamespaceSelector))
	}
	for _, svc := range g.services {
		s += fmt.Sprintf("  service %s/%s in %s %v\n", svc.Namespace, svc.Name, svc.Network, svc.VIPs)
	}
	for n, l := range g.ns {
		s += fmt.Sprintf("  namespace %s %v\n", n, l)
	}
	return s
}

func randomServiceTopology(seed uint64) genServiceTopology {
	return genServiceTopologyFrom(rand.New(rand.NewPCG(seed, 0x1ace)), rand.New(rand.NewPCG(seed, 0x5e7c)), seed)
}

// genServiceTopologyFrom builds a topology from net's choices and its
// services and ServiceRoutingPolicies from rng's.
func genServiceTopologyFrom(net, rng chooser, seed uint64) genServiceTopology {
	g := genServiceTopology{genTopology: genTopologyFrom(net, seed)}
	g.ns = map[string]map[string]string{"prod": {"env": "prod"}, "dev": {"env": "dev"}, "ops": {"env": "ops", "team": "infra"}}
	namespaces := []string{"prod", "dev", "ops", "bare"} // bare has no labels
	var all []string
	for _, n := range g.nets {
		all = append(all, n.Name)
	}
	all = append(all, "ghost") // a service bound to a network that does not exist
	pick := func(list []string) string { return list[rng.IntN(len(list))] }
	for i := range 2 + rng.IntN(6) {
		svc := BoundService{Namespace: pick(namespaces), Name: fmt.Sprintf("s%d", i), Network: pick(all)}
		switch rng.IntN(3) {
		case 0:
			svc.VIPs = []netip.Addr{netip.AddrFrom4([4]byte{10, 96, 0, byte(10 + i)})}
		case 1:
			svc.VIPs = []netip.Addr{netip.MustParseAddr(fmt.Sprintf("fd00:96::%x", 10+i))}
		default:
			svc.VIPs = []netip.Addr{netip.AddrFrom4([4]byte{10, 96, 0, byte(10 + i)}), netip.MustParseAddr(fmt.Sprintf("fd00:96::%x", 10+i))}
		}
		g.services = append(g.services, svc)
	}
	sel := func() map[string]string {
		return []map[string]string{{"tier": "a"}, {"tier": "b"}, {"vrf": "x"}, {"vrf": "y"}, {netLabel: pick(all)}}[rng.IntN(5)]
	}
	for i := range rng.IntN(5) {
		p := lacev1.ServiceRoutingPolicy{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("srp%d", rng.IntN(100))}}
		if rng.IntN(12) > 0 {
			p.Spec.SrcSelector = &metav1.LabelSelector{MatchLabels: sel()}
		}
		switch rng.IntN(8) {
		case 0, 1, 2:
			p.Spec.DestSelector.Name = pick(all)
		case 3, 4, 5:
			p.Spec.DestSelector.MatchLabels = sel()
		case 6:
			p.Spec.DestSelector.MatchExpressions = []metav1.LabelSelectorRequirement{{Key: "tier", Operator: metav1.LabelSelectorOpExists}}
		default: // neither: selects nothing
		}
		switch rng.IntN(5) {
		case 0:
			p.Spec.NamespaceSelector = &metav1.LabelSelector{MatchLabels: map[string]string{"env": "prod"}}
		case 1:
			p.Spec.NamespaceSelector = &metav1.LabelSelector{MatchExpressions: []metav1.LabelSelectorRequirement{
				{Key: "env", Operator: metav1.LabelSelectorOpIn, Values: []string{"prod", "dev"}}}}
		case 2:
			p.Spec.NamespaceSelector = &metav1.LabelSelector{}
		}
		p.Name += fmt.Sprint(".", i)
		g.srps = append(g.srps, p)
	}
	return g
}

func (g genServiceTopology) check(t *testing.T, stats *svcCheckStats) {
	var vips []ServiceVIPs
	for _, s := range g.services {
		// Field by field, not a conversion: the two types are kept apart
		// on purpose and may diverge.
		vips = append(vips, ServiceVIPs{Namespace: s.Namespace, Name: s.Name, Network: s.Network, VIPs: s.VIPs}) //lint:ignore S1016 see above
	}
	st := ComputeNode(NodeInput{Node: "n1", Networks: g.nets, Allocations: g.allocs, Underlays: g.ueps, RoutingPolicies: g.pols,
		Services: vips, ServiceRoutingPolicies: g.srps, Namespaces: g.ns})
	topo := Topology{Networks: g.nets, RoutingPolicies: g.pols, ServiceRoutingPolicies: g.srps, Services: g.services, Namespaces: g.ns}

	ids := NetworkIDs(g.nets)
	svcRoutes := map[string]tables.Route{} // "netID prefix"
	for _, r := range st.Routes {
		if r.Kind == tables.RouteService {
			svcRoutes[fmt.Sprint(r.NetID, " ", r.Prefix)] = r
		}
	}
	matched := 0
	for _, sn := range g.nets {
		if sn.Status.ID <= 0 || sn.Spec.Type == lacev1.NetworkTypeExternal {
			continue
		}
		id := uint32(sn.Status.ID)
		for _, svc := range g.services {
			for _, a := range svc.VIPs {
				// The oracle reads only the family of a pod source's
				// address.
				srcAddr := netip.MustParseAddr("10.0.0.2")
				if a.Is6() {
					srcAddr = netip.MustParseAddr("fd00::2")
				}
				src := Endpoint{Kind: EndpointPod, Network: sn.Name, Addr: srcAddr, NodeName: "n1"}
				v := Reach(topo, src, Endpoint{Kind: EndpointService, Namespace: svc.Namespace, Name: svc.Name, Addr: a}, "tcp", 80)
				p := netip.PrefixFrom(a, a.BitLen())
				r, held := svcRoutes[fmt.Sprint(id, " ", p)]
				if held {
					matched++
				}
				if v.Allowed != held {
					t.Errorf("seed %d: pod of %s -> service %s/%s (network %s) VIP %s: Reach allowed=%v (%s), view holds a service entry: %v",
						g.seed, sn.Name, svc.Namespace, svc.Name, svc.Network, a, v.Allowed, v.Rule, held)
					continue
				}
				if held && (r.DstNet != ids[svc.Network] || v.DstNetwork != svc.Network || v.DstPrefix != p) {
					t.Errorf("seed %d: pod of %s -> %s: the view's entry names network id %d, Reach %s %s (want %s id %d)",
						g.seed, sn.Name, a, r.DstNet, v.DstNetwork, v.DstPrefix, svc.Network, ids[svc.Network])
				}
				switch {
				case v.Allowed && v.ServicePolicy != "":
					stats.srp++
				case v.Allowed && v.Policy != "" && svc.Network != sn.Name:
					stats.nrp++
				case v.Allowed:
					stats.own++
				default:
					stats.denied++
					if r, ok := lpm(st.Routes, id, a); ok && r.Kind == tables.RouteExternal {
						stats.fallThrough++
					}
				}
				if !v.Allowed && v.Reason != "" && v.Reason != DropIsolated {
					t.Errorf("seed %d: pod of %s -> %s denied as %q (%s), want isolated", g.seed, sn.Name, a, v.Reason, v.Rule)
				}
				if strings.Contains(v.Rule, "its own services are out of its view") {
					stats.closed++
				}
				if strings.Contains(v.Rule, "conflict:") {
					stats.refused++
				}
				if strings.Contains(v.Rule, "only in namespaces matching") {
					stats.nsMiss++
				}
			}
		}
	}
	// Nothing else: every service entry of a pod network's view is one of
	// the pairs above. (External networks' views hold VIPs too: for the
	// nodes, below.)
	podNet := map[uint32]bool{}
	for _, n := range g.nets {
		if n.Status.ID > 0 && n.Spec.Type != lacev1.NetworkTypeExternal {
			podNet[uint32(n.Status.ID)] = true
		}
	}
	pods := 0
	for _, r := range svcRoutes {
		if podNet[r.NetID] {
			pods++
		}
	}
	if pods != matched {
		t.Errorf("seed %d: pod networks' views hold %d service entries, the (network, VIP) pairs match %d", g.seed, pods, matched)
	}
	// From outside the cluster no VIP is reached (the underlay drops
	// service entries as isolated); a node's sockets reach the VIPs the
	// view of the network its address classifies into holds (bpf/sock.c:
	// a service entry naming the service's network), and none when no
	// classifier covers it.
	for _, svc := range g.services {
		for _, a := range svc.VIPs {
			dst := Endpoint{Kind: EndpointService, Namespace: svc.Namespace, Name: svc.Name, Addr: a}
			for _, s := range g.outside {
				if s.Is4() != a.Is4() {
					continue
				}
				if v := Reach(topo, Endpoint{Kind: EndpointOutside, Addr: s}, dst, "tcp", 80); v.Allowed {
					t.Errorf("seed %d: outside %s reaches VIP %s (%s)", g.seed, s, a, v.Rule)
				}
				var cls *tables.Classifier
				for i, c := range st.Classifiers {
					if c.Prefix.Contains(s) && (cls == nil || c.Prefix.Bits() > cls.Prefix.Bits()) {
						cls = &st.Classifiers[i]
					}
				}
				held := false
				if cls != nil {
					r, ok := svcRoutes[fmt.Sprint(cls.NetID, " ", netip.PrefixFrom(a, a.BitLen()))]
					held = ok && r.DstNet == ids[svc.Network]
				}
				v := Reach(topo, Endpoint{Kind: EndpointNode, NodeName: "n1", Addr: s}, dst, "tcp", 80)
				if v.Allowed != held {
					t.Errorf("seed %d: node at %s (classified by %v) -> service %s/%s (network %s) VIP %s: Reach allowed=%v (%s), its view holds it: %v",
						g.seed, s, cls, svc.Namespace, svc.Name, svc.Network, a, v.Allowed, v.Rule, held)
				}
				if !v.Allowed && v.Reason != "" && v.Reason != DropIsolated {
					t.Errorf("seed %d: node at %s -> %s denied as %q (%s), want isolated", g.seed, s, a, v.Reason, v.Rule)
				}
				if v.Allowed {
					stats.node++
				}
			}
		}
	}
}

package model

import (
	"net/netip"
	"slices"
	"strings"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	lacev1 "github.com/lace-cni/lace/api/v1alpha1"
)

// The label the chart puts on every network (deploy/helm/lace/values.yaml).
const netLabel = "lace-cni.io/network"

// l3 is a ready l3 network with the given subnets and labels (besides the
// chart's name label).
func l3(name string, kv map[string]string, prefixes ...string) lacev1.Network {
	n := lacev1.Network{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{netLabel: name}},
		Spec: lacev1.NetworkSpec{Type: lacev1.NetworkTypeL3}}
	for k, v := range kv {
		n.Labels[k] = v
	}
	l := int32(24)
	for _, p := range prefixes {
		s := &lacev1.Subnet{Prefix: lacev1.CIDR(p), HostLocalPrefixLength: &l}
		if netip.MustParsePrefix(p).Addr().Is4() {
			n.Spec.IPv4Subnet = s
		} else {
			n.Spec.IPv6Subnet = s
		}
	}
	return n
}

func anon(n lacev1.Network) lacev1.Network {
	n.Spec.Anonymous = true
	return n
}

func external(name string, prefixes ...string) lacev1.Network {
	n := lacev1.Network{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{netLabel: name}},
		Spec: lacev1.NetworkSpec{Type: lacev1.NetworkTypeExternal}}
	for _, p := range prefixes {
		n.Spec.ExternalPrefixes = append(n.Spec.ExternalPrefixes, lacev1.CIDR(p))
	}
	return n
}

func nrp(name string, src, dst map[string]string) lacev1.NetworkRoutingPolicy {
	return lacev1.NetworkRoutingPolicy{ObjectMeta: metav1.ObjectMeta{Name: name}, Spec: lacev1.NetworkRoutingPolicySpec{
		SrcSelector:  &metav1.LabelSelector{MatchLabels: src},
		DestSelector: &metav1.LabelSelector{MatchLabels: dst},
	}}
}

// byName is a policy src -> dst selecting on the chart's name label.
func byName(src, dst string) lacev1.NetworkRoutingPolicy {
	return nrp(src+"-to-"+dst, map[string]string{netLabel: src}, map[string]string{netLabel: dst})
}

// topology gives every network an ID, in order.
func topology(nets []lacev1.Network, pols ...lacev1.NetworkRoutingPolicy) Topology {
	for i := range nets {
		nets[i].Status.ID = int32(i + 1)
	}
	return Topology{Networks: nets, RoutingPolicies: pols}
}

func pod(network, addr, node string) Endpoint {
	return Endpoint{Kind: EndpointPod, Network: network, Addr: netip.MustParseAddr(addr), NodeName: node}
}

func outside(addr string) Endpoint {
	return Endpoint{Kind: EndpointOutside, Addr: netip.MustParseAddr(addr)}
}

func hostOf(node, addr string) Endpoint {
	return Endpoint{Kind: EndpointNode, NodeName: node, Addr: netip.MustParseAddr(addr)}
}

// chart is what every install ships (external-networks.md, defaults), plus the
// networks a case adds.
func chart(more []lacev1.Network, pols ...lacev1.NetworkRoutingPolicy) Topology {
	nets := append([]lacev1.Network{
		l3("default", nil, "10.244.0.0/16", "fd00:244::/56"),
		external("world", "0.0.0.0/0", "::/0"),
	}, more...)
	return topology(nets, append([]lacev1.NetworkRoutingPolicy{byName("default", "world"), byName("world", "default")}, pols...)...)
}

type reachCase struct {
	name string
	// rule cites what the case checks.
	rule     string
	topo     Topology
	src, dst Endpoint
	// reply asks ReachReply (the answer to a flow src opened to dst).
	reply   bool
	allowed bool
	reason  DropReason
	// ruleHas are substrings the verdict's Rule must hold.
	ruleHas []string
	srcNet  string
	snat    bool
}

func runReach(t *testing.T, cases []reachCase) {
	t.Helper()
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			var v Verdict
			if c.reply {
				v = ReachReply(c.topo, c.src, c.dst, "tcp", 80)
			} else {
				v = Reach(c.topo, c.src, c.dst, "tcp", 80)
			}
			if v.Allowed != c.allowed || v.Reason != c.reason {
				t.Errorf("%s\n%s -> %s: allowed=%v reason=%q (%s), want allowed=%v reason=%q",
					c.rule, c.src, c.dst, v.Allowed, v.Reason, v.Rule, c.allowed, c.reason)
			}
			for _, s := range c.ruleHas {
				if !strings.Contains(v.Rule, s) {
					t.Errorf("%s\nrule %q lacks %q", c.rule, v.Rule, s)
				}
			}
			if c.srcNet != "" && v.SrcNetwork != c.srcNet {
				t.Errorf("%s\nsource classified into %q, want %q", c.rule, v.SrcNetwork, c.srcNet)
			}
			if v.SNAT != c.snat {
				t.Errorf("%s\nSNAT %v, want %v", c.rule, v.SNAT, c.snat)
			}
		})
	}
}

// TestReachSpecExamples applies the two NetworkRoutingPolicies of
// docs/topology.md as written.
func TestReachSpecExamples(t *testing.T) {
	directional := topology([]lacev1.Network{
		l3("frontend", map[string]string{"tier": "frontend"}, "10.10.0.0/16"),
		l3("backend", map[string]string{"tier": "backend"}, "10.20.0.0/16"),
	}, nrp("frontend-to-backend", map[string]string{"tier": "frontend"}, map[string]string{"tier": "backend"}))
	mesh := topology([]lacev1.Network{
		l3("red", map[string]string{"vrf": "prod"}, "10.1.0.0/16"),
		l3("blue", map[string]string{"vrf": "prod"}, "10.2.0.0/16"),
		l3("green", map[string]string{"vrf": "dev"}, "10.3.0.0/16"),
	}, nrp("prod-mesh", map[string]string{"vrf": "prod"}, map[string]string{"vrf": "prod"}))
	fe, be := pod("frontend", "10.10.1.5", "n1"), pod("backend", "10.20.2.5", "n2")
	red, blue, green := pod("red", "10.1.1.5", "n1"), pod("blue", "10.2.1.5", "n2"), pod("green", "10.3.1.5", "n1")
	runReach(t, []reachCase{
		{name: "frontend initiates to backend", rule: "topology.md: traffic may be initiated from the source toward the destination",
			topo: directional, src: fe, dst: be, allowed: true, ruleHas: []string{"NetworkRoutingPolicy frontend-to-backend (frontend -> backend)"}},
		{name: "backend cannot initiate to frontend", rule: "topology.md: not the other way around",
			topo: directional, src: be, dst: fe, reason: DropIsolated, ruleHas: []string{"no view", "backend -> frontend"}},
		{name: "backend replies to frontend", rule: "topology.md: return traffic of an established flow is always allowed back via conntrack",
			topo: directional, src: fe, dst: be, reply: true, allowed: true, ruleHas: []string{"reply", "frontend-to-backend", "conntrack"}},
		{name: "no reply where no flow was admitted", rule: "topology.md direction and return: replies only of an admitted flow",
			topo: directional, src: be, dst: fe, reply: true, reason: DropIsolated, ruleHas: []string{"no admitted flow"}},
		{name: "mesh red to blue", rule: "topology.md: one label on both sides lets every network reach every other",
			topo: mesh, src: red, dst: blue, allowed: true, ruleHas: []string{"prod-mesh (red -> blue)"}},
		{name: "mesh blue to red", rule: "topology.md: ... in both directions",
			topo: mesh, src: blue, dst: red, allowed: true, ruleHas: []string{"prod-mesh (blue -> red)"}},
		{name: "mesh member reaches its own network", rule: "topology.md view: its own subnets",
			topo: mesh, src: red, dst: pod("red", "10.1.2.9", "n2"), allowed: true, ruleHas: []string{"own network red"}},
		{name: "outside the mesh stays isolated", rule: "networks.md: networks are isolated by default",
			topo: mesh, src: red, dst: green, reason: DropIsolated},
		{name: "nor does it reach in", rule: "networks.md: networks are isolated by default",
			topo: mesh, src: green, dst: red, reason: DropIsolated},
	})
}

// TestReachAnonymous: networks.md (anonymous) and topology.md (what a
// network sees, first bullet).
func TestReachAnonymous(t *testing.T) {
	closed := topology([]lacev1.Network{
		anon(l3("vault", nil, "10.50.0.0/16")),
		l3("app", nil, "10.60.0.0/16"),
	}, byName("vault", "app"), byName("app", "vault"))
	opened := topology([]lacev1.Network{
		anon(l3("vault", nil, "10.50.0.0/16")),
	}, byName("vault", "vault"))
	// Selected as source by one policy and as destination by another, but
	// on both sides by none: still closed.
	half := topology([]lacev1.Network{
		anon(l3("vault", map[string]string{"zone": "a"}, "10.50.0.0/16")),
		l3("app", map[string]string{"zone": "a"}, "10.60.0.0/16"),
	}, nrp("vault-out", map[string]string{netLabel: "vault"}, map[string]string{netLabel: "app"}),
		nrp("into-zone", map[string]string{netLabel: "app"}, map[string]string{"zone": "a"}))
	v1, v2 := pod("vault", "10.50.1.5", "n1"), pod("vault", "10.50.2.5", "n2")
	runReach(t, []reachCase{
		{name: "anonymous network cannot reach itself", rule: "networks.md: reaching the network, even from its own endpoints, requires an explicit policy",
			topo: closed, src: v1, dst: v2, reason: DropAnonymous, ruleHas: []string{"anonymous network vault without self policy"}},
		{name: "anonymous network reaches its peers", rule: "topology.md: subnets of every D with S -> D",
			topo: closed, src: v1, dst: pod("app", "10.60.1.5", "n1"), allowed: true, ruleHas: []string{"vault-to-app"}},
		{name: "peers reach an anonymous network", rule: "topology.md: anonymous only removes the own subnets from the own view",
			topo: closed, src: pod("app", "10.60.1.5", "n1"), dst: v1, allowed: true, ruleHas: []string{"app-to-vault"}},
		{name: "self policy opens it", rule: "topology.md: unless a NetworkRoutingPolicy selects S on both sides",
			topo: opened, src: v1, dst: v2, allowed: true, ruleHas: []string{"vault-to-vault opens anonymous network vault to itself"}},
		{name: "selected on each side by different policies keeps it closed", rule: "topology.md: a policy selects S on both sides",
			topo: half, src: v1, dst: v2, reason: DropAnonymous},
		{name: "that policy still reaches the others", rule: "topology.md: subnets of every D with S -> D",
			topo: half, src: v1, dst: pod("app", "10.60.1.5", "n1"), allowed: true, ruleHas: []string{"vault-out"}},
	})
}

// TestReachExternal: external-networks.md (where a packet comes from; pods to
// outside; defaults shipped with every install).
func TestReachExternal(t *testing.T) {
	def := pod("default", "10.244.1.5", "n1")
	iso := pod("isolated", "10.70.1.5", "n1")
	shipped := chart([]lacev1.Network{l3("isolated", nil, "10.70.0.0/16")})
	corp := chart([]lacev1.Network{external("corp", "192.0.2.0/24")})
	noWorld := topology([]lacev1.Network{
		l3("default", nil, "10.244.0.0/16"),
		external("corp", "192.0.2.0/24"),
	}, byName("corp", "default"))
	runReach(t, []reachCase{
		{name: "world reaches default", rule: "external-networks.md defaults: world -> default; external -> pod with a policy",
			topo: shipped, src: outside("203.0.113.9"), dst: def, allowed: true, srcNet: "world", ruleHas: []string{"world-to-default (world -> default)"}},
		{name: "world reaches default over IPv6", rule: "external-networks.md: classification by longest prefix, both families",
			topo: shipped, src: outside("2001:db8::9"), dst: pod("default", "fd00:244::1:5", "n2"), allowed: true, srcNet: "world"},
		{name: "world does not reach an isolated network", rule: "external-networks.md defaults: every network an operator adds is isolated",
			topo: shipped, src: outside("203.0.113.9"), dst: iso, srcNet: "world", reason: DropIsolated, ruleHas: []string{"world -> isolated"}},
		{name: "default reaches outside with SNAT", rule: "external-networks.md pods to outside: SNAT to the node's underlay address",
			topo: shipped, src: def, dst: outside("203.0.113.9"), allowed: true, snat: true, ruleHas: []string{"default-to-world", "SNAT"}},
		{name: "outside answers default", rule: "topology.md direction and return: replies through conntrack",
			topo: shipped, src: def, dst: outside("203.0.113.9"), reply: true, allowed: true, snat: true, ruleHas: []string{"reply"}},
		{name: "isolated network does not reach outside", rule: "topology.md: a view holds only directly granted networks",
			topo: shipped, src: iso, dst: outside("203.0.113.9"), reason: DropIsolated, ruleHas: []string{"belongs to external network world"}},
		{name: "unclassified source is dropped", rule: "external-networks.md where a packet comes from: no match, no network, dropped and counted",
			topo: noWorld, src: outside("198.51.100.7"), dst: pod("default", "10.244.1.5", "n1"), reason: DropUnclassified, ruleHas: []string{"unclassified"}},
		{name: "a classified source with a policy", rule: "external-networks.md pods to outside: external -> pod when a policy allows",
			topo: noWorld, src: outside("192.0.2.7"), dst: pod("default", "10.244.1.5", "n1"), allowed: true, srcNet: "corp"},
		{name: "more specific external network classifies the source", rule: "external-networks.md: longest prefix match across all external networks",
			topo: corp, src: outside("192.0.2.7"), dst: def, srcNet: "corp", reason: DropIsolated},
		{name: "world in the view does not reach into corp", rule: "external-networks.md: an address belongs to the external network of longest prefix; topology.md: every network added is isolated",
			topo: corp, src: def, dst: outside("192.0.2.7"), reason: DropIsolated, ruleHas: []string{"external network corp"}},
	})
}

// TestReachLongestPrefix: topology.md, a view is a longest-prefix table; a
// more specific pod subnet wins over 0.0.0.0/0.
func TestReachLongestPrefix(t *testing.T) {
	tp := chart([]lacev1.Network{l3("backend", nil, "10.20.0.0/16")}, byName("default", "backend"))
	def := pod("default", "10.244.1.5", "n1")
	runReach(t, []reachCase{
		{name: "own subnet beats world", rule: "topology.md: a more specific pod subnet wins",
			topo: tp, src: def, dst: pod("default", "10.244.2.5", "n2"), allowed: true, ruleHas: []string{"own network default"}},
		{name: "peer subnet beats world", rule: "topology.md: a more specific pod subnet wins",
			topo: tp, src: def, dst: pod("backend", "10.20.0.5", "n2"), allowed: true, ruleHas: []string{"default-to-backend"}},
		{name: "an outside address under a pod subnet is shadowed", rule: "topology.md: destinations resolve by longest prefix in the view",
			topo: tp, src: def, dst: outside("10.20.0.5"), reason: DropIsolated, ruleHas: []string{"pod network backend (10.20.0.0/16)"}},
	})
}

// TestReachOverlap: topology.md, two overlapping pod networks never in one
// view; the own network wins, then the earlier policy name.
func TestReachOverlap(t *testing.T) {
	nets := func() []lacev1.Network {
		return []lacev1.Network{
			l3("src", nil, "10.9.0.0/16"),
			l3("a", nil, "10.1.0.0/16"),
			l3("b", nil, "10.1.0.0/24"),
			l3("twin", nil, "10.9.0.0/16"),
		}
	}
	aFirst := topology(nets(), nrp("1-a", map[string]string{netLabel: "src"}, map[string]string{netLabel: "a"}),
		nrp("2-b", map[string]string{netLabel: "src"}, map[string]string{netLabel: "b"}),
		byName("src", "twin"))
	bFirst := topology(nets(), nrp("2-a", map[string]string{netLabel: "src"}, map[string]string{netLabel: "a"}),
		nrp("1-b", map[string]string{netLabel: "src"}, map[string]string{netLabel: "b"}))
	s := pod("src", "10.9.1.5", "n1")
	runReach(t, []reachCase{
		{name: "earlier policy's peer is in", rule: "topology.md: among peers, the earlier policy name",
			topo: aFirst, src: s, dst: pod("a", "10.1.0.5", "n1"), allowed: true, ruleHas: []string{"1-a"}},
		{name: "later overlapping peer is refused", rule: "topology.md: refused for that pair, naming both networks and the prefix",
			topo: aFirst, src: s, dst: pod("b", "10.1.0.5", "n2"), reason: DropNoEndpoint,
			ruleHas: []string{"conflict", "2-b", "src -> b", "b 10.1.0.0/24", "a 10.1.0.0/16"}},
		{name: "the other order wins the other way", rule: "topology.md: among peers, the earlier policy name",
			topo: bFirst, src: s, dst: pod("b", "10.1.0.5", "n2"), allowed: true, ruleHas: []string{"1-b"}},
		{name: "and refuses a", rule: "topology.md: refused for that pair",
			topo: bFirst, src: s, dst: pod("a", "10.1.0.5", "n1"), reason: DropNoEndpoint, ruleHas: []string{"conflict", "2-a", "a 10.1.0.0/16", "b 10.1.0.0/24"}},
		{name: "own network always wins", rule: "topology.md: the source's own network always wins",
			topo: aFirst, src: s, dst: pod("twin", "10.9.1.6", "n1"), reason: DropNoEndpoint, ruleHas: []string{"conflict", "src-to-twin", "twin 10.9.0.0/16", "src 10.9.0.0/16"}},
		{name: "own pods at that address stay reachable", rule: "topology.md: the source's own network always wins",
			topo: aFirst, src: s, dst: pod("src", "10.9.1.6", "n1"), allowed: true, ruleHas: []string{"own network src"}},
	})
	v := ViewOf(aFirst, "src")
	if len(v.Refused) != 2 || v.Refused[0].Dst != "b" || v.Refused[1].Dst != "twin" {
		t.Errorf("refused %+v, want b then twin", v.Refused)
	}
	if got := v.Refused[0].String(); got != "NetworkRoutingPolicy 2-b refused for src -> b: b 10.1.0.0/24 overlaps a 10.1.0.0/16" {
		t.Errorf("conflict reads %q", got)
	}
	// The pair is refused, not the policy: a overlaps nothing in a's own view.
	if w := ViewOf(aFirst, "a"); len(w.Refused) != 0 {
		t.Errorf("a's view refused %+v", w.Refused)
	}
}

// TestReachNoTransit: topology.md, nothing transits.
func TestReachNoTransit(t *testing.T) {
	tp := topology([]lacev1.Network{
		l3("a", nil, "10.1.0.0/16"), l3("b", nil, "10.2.0.0/16"), l3("c", nil, "10.3.0.0/16"),
	}, byName("a", "b"), byName("b", "c"))
	a, b, c := pod("a", "10.1.0.5", "n1"), pod("b", "10.2.0.5", "n1"), pod("c", "10.3.0.5", "n2")
	// Nor through an external network: a pod subnet outside the view is
	// not reached by leaving for world.
	viaWorld := chart([]lacev1.Network{l3("x", nil, "10.80.0.0/16")}, byName("x", "world"))
	runReach(t, []reachCase{
		{name: "a to b", rule: "topology.md: S -> D", topo: tp, src: a, dst: b, allowed: true},
		{name: "b to c", rule: "topology.md: S -> D", topo: tp, src: b, dst: c, allowed: true},
		{name: "a to c", rule: "topology.md: a view holds only directly granted networks",
			topo: tp, src: a, dst: c, reason: DropIsolated, ruleHas: []string{"no view", "a -> c"}},
		{name: "x to default through world", rule: "topology.md: nothing transits (not through an external network either)",
			topo: viaWorld, src: pod("x", "10.80.0.5", "n1"), dst: pod("default", "10.244.0.5", "n2"), reason: DropIsolated},
	})
}

// TestReachNode: topology.md, the node itself.
func TestReachNode(t *testing.T) {
	tp := chart([]lacev1.Network{l3("isolated", nil, "10.70.0.0/16")})
	bare := topology([]lacev1.Network{l3("isolated", nil, "10.70.0.0/16")})
	n1 := hostOf("n1", "172.30.0.11")
	runReach(t, []reachCase{
		{name: "node reaches its own pod in an isolated network", rule: "topology.md: the node reaches the pods on it whatever the policies",
			topo: tp, src: n1, dst: pod("isolated", "10.70.1.5", "n1"), allowed: true, ruleHas: []string{"node reaches its own pods"}},
		{name: "with no external network at all", rule: "topology.md: whatever the policies",
			topo: bare, src: n1, dst: pod("isolated", "10.70.1.5", "n1"), allowed: true},
		{name: "node to another node's isolated pod is outside", rule: "external-networks.md: otherwise node processes are classified by their underlay address",
			topo: tp, src: n1, dst: pod("isolated", "10.70.2.5", "n2"), srcNet: "world", reason: DropIsolated},
		{name: "node to another node's default pod via world", rule: "external-networks.md: classified by underlay address, then world -> default",
			topo: tp, src: n1, dst: pod("default", "10.244.2.5", "n2"), srcNet: "world", allowed: true, ruleHas: []string{"world-to-default"}},
		{name: "node to another node's pod, unclassified", rule: "external-networks.md: no match, dropped",
			topo: bare, src: n1, dst: pod("isolated", "10.70.2.5", "n2"), reason: DropUnclassified},
		{name: "own pod answers its node", rule: "topology.md direction and return",
			topo: bare, src: n1, dst: pod("isolated", "10.70.1.5", "n1"), reply: true, allowed: true},
	})
}

// TestReachNotReady: a network without an ID is not in the data plane yet.
func TestReachNotReady(t *testing.T) {
	tp := topology([]lacev1.Network{l3("a", nil, "10.1.0.0/16"), l3("b", nil, "10.2.0.0/16")}, byName("a", "b"))
	tp.Networks[1].Status.ID = 0
	v := Reach(tp, pod("a", "10.1.0.5", "n1"), pod("b", "10.2.0.5", "n1"), "tcp", 80)
	if v.Allowed || !strings.Contains(v.Rule, "invalid question") {
		t.Errorf("verdict %+v, want an invalid question", v)
	}
	if w := ViewOf(tp, "a"); len(w.Entries) != 1 {
		t.Errorf("view %+v holds a network without an ID", w.Entries)
	}
}

// srp is a ServiceRoutingPolicy from the networks labelled src to dst,
// scoped to the namespaces matching ns (nil: every namespace).
func srp(name string, src map[string]string, dst lacev1.ServiceSelector, ns *metav1.LabelSelector) lacev1.ServiceRoutingPolicy {
	return lacev1.ServiceRoutingPolicy{ObjectMeta: metav1.ObjectMeta{Name: name}, Spec: lacev1.ServiceRoutingPolicySpec{
		SrcSelector: &metav1.LabelSelector{MatchLabels: src}, DestSelector: dst, NamespaceSelector: ns}}
}

func service(ns, name, network string, vips ...string) BoundService {
	s := BoundService{Namespace: ns, Name: name, Network: network}
	for _, v := range vips {
		s.VIPs = append(s.VIPs, netip.MustParseAddr(v))
	}
	return s
}

func vip(ns, name, addr string) Endpoint {
	return Endpoint{Kind: EndpointService, Namespace: ns, Name: name, Addr: netip.MustParseAddr(addr)}
}

// TestReachServices: topology.md, third bullet of "What a network reaches"
// (the VIPs of services bound to S, to every D with S -> D, and to the
// networks a ServiceRoutingPolicy from S selects), and docs/topology.md
// "Service peering".
func TestReachServices(t *testing.T) {
	tp := chart([]lacev1.Network{
		l3("frontend", map[string]string{"tier": "frontend"}, "10.10.0.0/16"),
		l3("backend", map[string]string{"tier": "backend"}, "10.20.0.0/16"),
		l3("payments", map[string]string{"pci": "yes"}, "10.30.0.0/16"),
		l3("green", map[string]string{"colour": "green"}, "10.31.0.0/16"),
		anon(l3("vault", nil, "10.40.0.0/16")),
		anon(l3("sandbox", nil, "10.41.0.0/16")),
		// twin overlaps frontend: frontend's peering to it is refused.
		l3("twin", map[string]string{"tier": "backend"}, "10.10.0.0/16"),
		l3("lonely", nil, "10.50.0.0/16"),
		l3("unready", nil, "10.60.0.0/16"),
	}, nrp("frontend-to-backend", map[string]string{"tier": "frontend"}, map[string]string{"tier": "backend"}),
		byName("sandbox", "sandbox"))
	tp.Networks[len(tp.Networks)-1].Status.ID = 0
	tp.ServiceRoutingPolicies = []lacev1.ServiceRoutingPolicy{
		// docs/topology.md's example: by name, every namespace.
		srp("frontend-to-payments", map[string]string{"tier": "frontend"}, lacev1.ServiceSelector{Name: "payments"}, nil),
		// By labels, prod namespaces only.
		srp("green-to-pci-prod", map[string]string{"colour": "green"}, lacev1.ServiceSelector{MatchLabels: map[string]string{"pci": "yes"}},
			&metav1.LabelSelector{MatchLabels: map[string]string{"env": "prod"}}),
		// An empty namespaceSelector admits every namespace.
		srp("lonely-to-twin", map[string]string{netLabel: "lonely"}, lacev1.ServiceSelector{Name: "twin"}, &metav1.LabelSelector{}),
		// Grants the VIP despite the refused peering: VIPs overlap nothing.
		srp("frontend-to-twin", map[string]string{"tier": "frontend"}, lacev1.ServiceSelector{Name: "twin"},
			&metav1.LabelSelector{MatchLabels: map[string]string{"env": "prod"}}),
		// Opens a network's services to the nodes (their sockets).
		srp("world-to-payments", map[string]string{netLabel: "world"}, lacev1.ServiceSelector{Name: "payments"}, nil),
		// Selects nothing: neither a name nor labels.
		srp("empty-dest", map[string]string{netLabel: "lonely"}, lacev1.ServiceSelector{}, nil),
	}
	tp.Services = []BoundService{
		service("default", "kubernetes", "default", "10.96.0.1", "fd00:96::1"),
		service("shop", "api", "backend", "10.96.0.20"),
		service("prod", "charge", "payments", "10.96.0.30", "fd00:96::30"),
		service("dev", "charge", "payments", "10.96.0.31"),
		service("vault", "kms", "vault", "10.96.0.40"),
		service("sandbox", "play", "sandbox", "10.96.0.41"),
		service("prod", "mirror", "twin", "10.96.0.50"),
		service("dev", "mirror", "twin", "10.96.0.51"),
		service("default", "new", "unready", "10.96.0.60"),
	}
	tp.Namespaces = map[string]map[string]string{"prod": {"env": "prod"}, "dev": {"env": "dev"}}
	def, fe, be := pod("default", "10.244.1.5", "n1"), pod("frontend", "10.10.1.5", "n1"), pod("backend", "10.20.1.5", "n2")
	green, vault, sandbox, lonely := pod("green", "10.31.1.5", "n1"), pod("vault", "10.40.1.5", "n1"), pod("sandbox", "10.41.1.5", "n1"), pod("lonely", "10.50.1.5", "n2")
	runReach(t, []reachCase{
		{name: "own network", rule: "topology.md: the VIPs of services bound to S",
			topo: tp, src: def, dst: vip("default", "kubernetes", "10.96.0.1"), allowed: true, ruleHas: []string{"own network default"}},
		{name: "own network over IPv6", rule: "services.md: a VIP per family",
			topo: tp, src: pod("default", "fd00:244::5", "n1"), dst: vip("default", "kubernetes", "fd00:96::1"), allowed: true, ruleHas: []string{"own network default"}},
		{name: "found by its VIP alone", rule: "topology.md: the VIPs of services bound to S",
			topo: tp, src: def, dst: Endpoint{Kind: EndpointService, Addr: netip.MustParseAddr("10.96.0.1")}, allowed: true, ruleHas: []string{"own network default"}},
		{name: "peer by NetworkRoutingPolicy", rule: "topology.md: peering to a network implicitly makes that network's services reachable",
			topo: tp, src: fe, dst: vip("shop", "api", "10.96.0.20"), allowed: true, ruleHas: []string{"NetworkRoutingPolicy frontend-to-backend (frontend -> backend)"}},
		{name: "not the other way", rule: "topology.md: a NetworkRoutingPolicy is directional",
			topo: tp, src: be, dst: vip("default", "kubernetes", "10.96.0.1"), reason: DropIsolated,
			ruleHas: []string{"no view: no NetworkRoutingPolicy backend -> default", "no ServiceRoutingPolicy from backend selects the services of default", "(service default/kubernetes)"}},
		{name: "ServiceRoutingPolicy by name", rule: "topology.md: destSelector name: payments",
			topo: tp, src: fe, dst: vip("dev", "charge", "10.96.0.31"), allowed: true,
			ruleHas: []string{"ServiceRoutingPolicy frontend-to-payments (frontend -> the services of payments: VIPs only, not the pods)"}},
		{name: "ServiceRoutingPolicy grants the VIP, not the pods", rule: "topology.md: the source can use the VIPs but cannot route to the network's pods",
			topo: tp, src: fe, dst: pod("payments", "10.30.1.5", "n2"), reason: DropIsolated, ruleHas: []string{"no NetworkRoutingPolicy frontend -> payments"}},
		{name: "ServiceRoutingPolicy by labels, namespace matching", rule: "topology.md: a namespaceSelector scopes the destination to services in namespaces whose labels match",
			topo: tp, src: pod("green", "fd00:31::5", "n1"), dst: vip("prod", "charge", "fd00:96::30"), allowed: true, ruleHas: []string{"ServiceRoutingPolicy green-to-pci-prod (green -> the services of payments"}},
		{name: "ServiceRoutingPolicy by labels, namespace not matching", rule: "topology.md: ... in namespaces whose labels match",
			topo: tp, src: green, dst: vip("dev", "charge", "10.96.0.31"), reason: DropIsolated,
			ruleHas: []string{"ServiceRoutingPolicy green-to-pci-prod selects the services of payments only in namespaces matching env=prod, not dev"}},
		{name: "empty namespaceSelector admits every namespace", rule: "topology.md: an empty selector (the default) admits services from every namespace",
			topo: tp, src: lonely, dst: vip("dev", "mirror", "10.96.0.51"), allowed: true, ruleHas: []string{"ServiceRoutingPolicy lonely-to-twin"}},
		{name: "a destSelector without name or labels selects nothing", rule: "policy_types.go: destSelector needs a name or labels",
			topo: tp, src: lonely, dst: vip("prod", "charge", "10.96.0.30"), reason: DropIsolated},
		{name: "closed anonymous network does not reach its own services", rule: "topology.md: the VIPs of services bound to S (same anonymous rule)",
			topo: tp, src: vault, dst: vip("vault", "kms", "10.96.0.40"), reason: DropIsolated,
			ruleHas: []string{"anonymous network vault without self policy: its own services are out of its view too"}},
		{name: "a self policy opens them", rule: "topology.md: unless a NetworkRoutingPolicy selects S on both sides",
			topo: tp, src: sandbox, dst: vip("sandbox", "play", "10.96.0.41"), allowed: true, ruleHas: []string{"NetworkRoutingPolicy sandbox-to-sandbox opens anonymous network sandbox to itself"}},
		{name: "conflict-refused peer's services", rule: "topology.md: a refused peering puts nothing of the peer in the view",
			topo: tp, src: fe, dst: vip("dev", "mirror", "10.96.0.51"), reason: DropIsolated,
			ruleHas: []string{"conflict: NetworkRoutingPolicy frontend-to-backend refused for frontend -> twin", "ServiceRoutingPolicy frontend-to-twin selects the services of twin only in namespaces matching env=prod, not dev"}},
		{name: "a ServiceRoutingPolicy still grants a refused peer's VIP", rule: "topology.md: an SRP grants the VIP only (which overlaps nothing)",
			topo: tp, src: fe, dst: vip("prod", "mirror", "10.96.0.50"), allowed: true, ruleHas: []string{"ServiceRoutingPolicy frontend-to-twin"}},
		{name: "outside source", rule: "a ClusterIP is not reachable from outside the cluster (its frontends are)",
			topo: tp, src: outside("203.0.113.9"), dst: vip("default", "kubernetes", "10.96.0.1"), srcNet: "world", reason: DropIsolated,
			ruleHas: []string{"a ClusterIP is reached from pods and nodes only; outside clients use"}},
		{name: "node source by NetworkRoutingPolicy", rule: "external-networks.md: node processes are sources like any outside host, classified by their address (world -> default)",
			topo: tp, src: hostOf("n1", "172.30.0.11"), dst: vip("default", "kubernetes", "10.96.0.1"), srcNet: "world", allowed: true,
			ruleHas: []string{"NetworkRoutingPolicy world-to-default (world -> default)"}},
		{name: "node source by ServiceRoutingPolicy", rule: "external-networks.md: node processes are sources like any outside host",
			topo: tp, src: hostOf("n1", "172.30.0.11"), dst: vip("prod", "charge", "10.96.0.30"), srcNet: "world", allowed: true,
			ruleHas: []string{"ServiceRoutingPolicy world-to-payments (world -> the services of payments"}},
		{name: "node source, not granted", rule: "topology.md: every network an operator adds is isolated",
			topo: tp, src: hostOf("n1", "172.30.0.11"), dst: vip("shop", "api", "10.96.0.20"), srcNet: "world", reason: DropIsolated,
			ruleHas: []string{"no NetworkRoutingPolicy world -> backend"}},
		{name: "node source, unclassified", rule: "bpf/sock.c: the view of no network holds no VIP (counted isolated)",
			topo: func() Topology {
				u := tp
				u.Networks = slices.DeleteFunc(slices.Clone(tp.Networks), func(n lacev1.Network) bool { return n.Name == "world" })
				return u
			}(),
			src: hostOf("n1", "172.30.0.11"), dst: vip("default", "kubernetes", "10.96.0.1"), reason: DropIsolated,
			ruleHas: []string{"unclassified: no external network's prefix covers node address 172.30.0.11, so its sockets reach no VIP"}},
		{name: "reply", rule: "topology.md direction and return",
			topo: tp, src: fe, dst: vip("shop", "api", "10.96.0.20"), reply: true, allowed: true, ruleHas: []string{"reply of a flow admitted by NetworkRoutingPolicy frontend-to-backend"}},
		{name: "unknown service", rule: "a service bound to no network is not served",
			topo: tp, src: def, dst: vip("default", "ghost", "10.96.0.99"), ruleHas: []string{"invalid question: service default/ghost is not in the topology"}},
		{name: "not its VIP", rule: "the question names a VIP of the service",
			topo: tp, src: def, dst: vip("default", "kubernetes", "10.96.0.20"), ruleHas: []string{"invalid question: 10.96.0.20 is not a VIP of service default/kubernetes"}},
		{name: "no service's VIP", rule: "the question names a VIP of the service",
			topo: tp, src: def, dst: Endpoint{Kind: EndpointService, Addr: netip.MustParseAddr("10.96.9.9")}, ruleHas: []string{"invalid question: 10.96.9.9 is the VIP of no service"}},
		{name: "bound to a network without an ID", rule: "services.md: a service whose network is not in the data plane is not served",
			topo: tp, src: def, dst: vip("default", "new", "10.96.0.60"), ruleHas: []string{"invalid question: service default/new is bound to unready"}},
		{name: "a service is no source", rule: "services are destinations only",
			topo: tp, src: vip("default", "kubernetes", "10.96.0.1"), dst: def, ruleHas: []string{"invalid question: source kind"}},
	})
	v := Reach(tp, green, vip("prod", "charge", "10.96.0.30"), "tcp", 443)
	if v.ServicePolicy != "green-to-pci-prod" || v.Policy != "" || v.DstNetwork != "payments" || v.DstPrefix != netip.MustParsePrefix("10.96.0.30/32") {
		t.Errorf("verdict %+v: want the SRP named, network payments, view entry 10.96.0.30/32", v)
	}
	v = Reach(tp, fe, vip("shop", "api", "10.96.0.20"), "tcp", 443)
	if v.Policy != "frontend-to-backend" || v.ServicePolicy != "" || v.DstNetwork != "backend" {
		t.Errorf("verdict %+v: want the NRP named, network backend", v)
	}
}

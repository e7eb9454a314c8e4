package netpol

import (
	"fmt"
	"math/rand/v2"
	"net/netip"
	"testing"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"
)

// gen draws small random inputs that hit every corner the compiler has:
// few labels (so selectors overlap), two networks reusing one address
// pool, duplicate addresses, ipBlocks with excepts over the pods' own
// addresses in both families, named ports that resolve differently per
// pod, ranges, ClusterPolicies of both tiers over the same pools and
// nodes (random_cluster_test.go), and now and then something the API
// server would reject.
type gen struct{ r *rand.Rand }

func (g gen) pick(n int) int         { return g.r.IntN(n) }
func (g gen) chance(p float64) bool  { return g.r.Float64() < p }
func pickOf[T any](g gen, xs ...T) T { return xs[g.pick(len(xs))] }
func (g gen) label(keys, values []string) (k, v string) {
	return pickOf(g, keys...), pickOf(g, values...)
}

var (
	genNamespaces = []string{"n0", "n1", "n2"}
	genPortNames  = []string{"http", "dns", "metrics"}
)

func (g gen) labels(keys, values []string) map[string]string {
	m := map[string]string{}
	for range g.pick(3) {
		k, v := g.label(keys, values)
		m[k] = v
	}
	return m
}

func (g gen) selector(keys, values []string) *metav1.LabelSelector {
	s := &metav1.LabelSelector{}
	switch g.pick(6) {
	case 0: // empty: everything
	case 1, 2:
		k, v := g.label(keys, values)
		s.MatchLabels = map[string]string{k: v}
	case 3:
		k, v := g.label(keys, values)
		op := pickOf(g, metav1.LabelSelectorOpIn, metav1.LabelSelectorOpNotIn)
		s.MatchExpressions = []metav1.LabelSelectorRequirement{{Key: k, Operator: op, Values: []string{v, pickOf(g, values...)}}}
	case 4:
		k, _ := g.label(keys, values)
		op := pickOf(g, metav1.LabelSelectorOpExists, metav1.LabelSelectorOpDoesNotExist)
		s.MatchExpressions = []metav1.LabelSelectorRequirement{{Key: k, Operator: op}}
	case 5:
		if g.chance(0.3) {
			return badSel()
		}
		k, v := g.label(keys, values)
		s.MatchLabels = map[string]string{k: v, "tier": pickOf(g, "fe", "be")}
	}
	return s
}

var podKeys, podValues = []string{"app", "tier"}, []string{"a", "b", "fe", "be"}
var nsKeys, nsValues = []string{"team", "env"}, []string{"x", "y", "prod"}

// v4 and v6 pools: small enough that pods, blocks and probes collide.
func v4(i int) netip.Addr { return netip.AddrFrom4([4]byte{10, 0, 0, byte(i)}) }
func v6(i int) netip.Addr {
	return netip.AddrFrom16([16]byte{0: 0xfd, 15: byte(i)})
}

func (g gen) prefix(six bool) netip.Prefix {
	if g.chance(0.1) {
		if six {
			return netip.MustParsePrefix("::/0")
		}
		return netip.MustParsePrefix(pickOf(g, "0.0.0.0/0", "192.168.0.0/16"))
	}
	a, max := v4(g.pick(32)), 32
	if six {
		a, max = v6(g.pick(32)), 128
	}
	p, _ := a.Prefix(max - g.pick(6))
	return p
}

func (g gen) ipBlock() networkingv1.NetworkPolicyPeer {
	six := g.chance(0.4)
	cidr := g.prefix(six)
	b := &networkingv1.IPBlock{CIDR: cidr.String()}
	if g.chance(0.3) { // host bits set: must be masked
		b.CIDR = fmt.Sprintf("%s/%d", cidr.Addr().Next(), cidr.Bits())
	}
	for range g.pick(3) {
		// An except inside the cidr, mostly; now and then outside it.
		bits := cidr.Bits() + 1 + g.pick(max(1, cidr.Addr().BitLen()-cidr.Bits()))
		bits = min(bits, cidr.Addr().BitLen())
		a := cidr.Addr()
		for range g.pick(8) {
			a = a.Next()
		}
		if g.chance(0.1) {
			a = g.prefix(six).Addr()
		}
		e, _ := a.Prefix(bits)
		b.Except = append(b.Except, e.String())
	}
	if g.chance(0.03) {
		b.Except = append(b.Except, "garbage")
	}
	return networkingv1.NetworkPolicyPeer{IPBlock: b}
}

func (g gen) peer() networkingv1.NetworkPolicyPeer {
	switch g.pick(10) {
	case 0, 1:
		return podPeer(g.selector(podKeys, podValues))
	case 2, 3:
		return nsPeer(g.selector(nsKeys, nsValues))
	case 4:
		return bothPeer(g.selector(nsKeys, nsValues), g.selector(podKeys, podValues))
	case 5, 6, 7:
		return g.ipBlock()
	case 8:
		if g.chance(0.3) {
			p := g.ipBlock()
			p.PodSelector = &metav1.LabelSelector{}
			return p
		}
		return networkingv1.NetworkPolicyPeer{}
	}
	return podPeer(&metav1.LabelSelector{})
}

var genPortNumbers = []int32{1, 53, 80, 1000, 2000, 8080, 65535}

func (g gen) port() networkingv1.NetworkPolicyPort {
	var p networkingv1.NetworkPolicyPort
	if !g.chance(0.3) {
		p.Protocol = ptr.To(pickOf(g, tcp, udp, sctp, tcp, udp, corev1.Protocol("ICMP")))
	}
	switch g.pick(7) {
	case 0: // every port of the protocol
	case 1, 2:
		p.Port = ptr.To(intstr.FromInt32(pickOf(g, genPortNumbers...)))
	case 3:
		lo := pickOf(g, genPortNumbers...)
		hi := lo + int32(g.pick(3000))
		if g.chance(0.1) {
			hi = lo - 1
		}
		p.Port, p.EndPort = ptr.To(intstr.FromInt32(lo)), ptr.To(min(hi, 65535))
	case 4, 5, 6:
		p.Port = ptr.To(intstr.FromString(pickOf(g, append(genPortNames, "nope")...)))
	}
	return p
}

func (g gen) rulePeers() []networkingv1.NetworkPolicyPeer {
	var ps []networkingv1.NetworkPolicyPeer
	for range pickOf(g, 0, 0, 1, 1, 2, 3) {
		ps = append(ps, g.peer())
	}
	return ps
}

func (g gen) rulePorts() []networkingv1.NetworkPolicyPort {
	var ps []networkingv1.NetworkPolicyPort
	for range pickOf(g, 0, 0, 1, 1, 2, 3) {
		ps = append(ps, g.port())
	}
	return ps
}

func (g gen) input() Input {
	in := Input{Namespaces: map[string]map[string]string{}}
	for _, ns := range genNamespaces {
		if !g.chance(0.2) {
			in.Namespaces[ns] = g.labels(nsKeys, nsValues)
		}
	}
	nPods := 4 + g.pick(7)
	for i := range nPods {
		p := Pod{
			Namespace: pickOf(g, genNamespaces...),
			Name:      fmt.Sprintf("p%d", i),
			Labels:    g.labels(podKeys, podValues),
			NetID:     uint32(1 + g.pick(2)),
		}
		if g.chance(0.05) && i > 0 { // a duplicate name: the first entry counts
			p.Name = fmt.Sprintf("p%d", i-1)
		}
		if !g.chance(0.1) {
			p.Addrs = append(p.Addrs, v4(1+g.pick(12)))
		}
		if g.chance(0.5) {
			p.Addrs = append(p.Addrs, v6(1+g.pick(12)))
		}
		for range g.pick(5) {
			p.Ports = append(p.Ports, Port{
				Name:     pickOf(g, append(genPortNames, "")...),
				Protocol: pickOf(g, "", tcp, udp, sctp),
				Port:     pickOf(g, genPortNumbers...),
			})
		}
		in.Pods = append(in.Pods, p)
		if g.chance(0.6) {
			in.Local = append(in.Local, Local{Namespace: p.Namespace, Name: p.Name, Ifindex: uint32(100 + i)})
		}
	}
	for range 2 + g.pick(5) {
		subjects := metav1.LabelSelector{}
		if g.chance(0.6) {
			subjects = *g.selector(podKeys, podValues)
		}
		p := pol(pickOf(g, genNamespaces...), fmt.Sprintf("pol%d", g.pick(5)), subjects)
		switch g.pick(5) {
		case 1:
			p.Spec.PolicyTypes = []networkingv1.PolicyType{networkingv1.PolicyTypeIngress}
		case 2:
			p.Spec.PolicyTypes = []networkingv1.PolicyType{networkingv1.PolicyTypeEgress}
		case 3:
			p.Spec.PolicyTypes = []networkingv1.PolicyType{networkingv1.PolicyTypeIngress, networkingv1.PolicyTypeEgress}
		}
		if g.chance(0.8) {
			p.Spec.Ingress = []networkingv1.NetworkPolicyIngressRule{}
			for range g.pick(4) {
				p.Spec.Ingress = append(p.Spec.Ingress, allowIn(g.rulePeers(), g.rulePorts()...))
			}
		}
		if g.chance(0.6) {
			p.Spec.Egress = []networkingv1.NetworkPolicyEgressRule{}
			for range g.pick(4) {
				p.Spec.Egress = append(p.Spec.Egress, allowOut(g.rulePeers(), g.rulePorts()...))
			}
		}
		in.Policies = append(in.Policies, p)
	}
	in.Nodes = g.nodes()
	for i := range g.pick(6) {
		in.ClusterPolicies = append(in.ClusterPolicies, g.clusterPolicy(i))
	}
	return in
}

// probes lists the peers and ports worth asking about: every pod address
// in both networks, the pools around them, the edges of every block, and
// the edges of every port range and named port.
func probes(in Input) ([]PeerKey, []uint16) {
	var peers []PeerKey
	addPeer := func(a netip.Addr) {
		if a.IsValid() {
			peers = append(peers, PeerKey{1, a}, PeerKey{2, a})
		}
	}
	for i := range 34 {
		addPeer(v4(i))
		addPeer(v6(i))
	}
	addPeer(netip.MustParseAddr("192.168.7.7"))
	addPeer(netip.MustParseAddr("2001:db8::1"))
	ports := []uint16{0, 1, 2, 52, 53, 54, 79, 80, 81, 999, 1000, 1001, 1999, 2000, 2001, 8080, 32768, 65534, 65535}
	for _, p := range in.Policies {
		var all []networkingv1.NetworkPolicyPeer
		var pps []networkingv1.NetworkPolicyPort
		for _, r := range p.Spec.Ingress {
			all, pps = append(all, r.From...), append(pps, r.Ports...)
		}
		for _, r := range p.Spec.Egress {
			all, pps = append(all, r.To...), append(pps, r.Ports...)
		}
		for _, pe := range all {
			if pe.IPBlock == nil {
				continue
			}
			for _, s := range append([]string{pe.IPBlock.CIDR}, pe.IPBlock.Except...) {
				pf, err := netip.ParsePrefix(s)
				if err != nil {
					continue
				}
				first := pf.Masked().Addr()
				last := lastAddr(pf.Masked())
				addPeer(first)
				addPeer(first.Prev())
				addPeer(last)
				addPeer(last.Next())
			}
		}
		for _, pp := range pps {
			if pp.EndPort != nil {
				e := uint16(*pp.EndPort)
				ports = append(ports, e-1, e, e+1)
			}
		}
	}
	return peers, clusterProbes(in, addPeer, ports)
}

func lastAddr(p netip.Prefix) netip.Addr {
	b := p.Addr().AsSlice()
	for i := p.Bits(); i < len(b)*8; i++ {
		b[i/8] |= 0x80 >> (i % 8)
	}
	a, _ := netip.AddrFromSlice(b)
	return a
}

// TestCompileAgreesWithDecide: on many random small inputs, the compiled
// tables decide every sampled packet exactly as the reference does,
// attribution included. A failure prints the seed: rerun it alone with
// -run 'TestCompileAgreesWithDecide/seed=N'.
func TestCompileAgreesWithDecide(t *testing.T) {
	seeds := 400
	if testing.Short() {
		seeds = 100
	}
	for seed := range seeds {
		t.Run(fmt.Sprintf("seed=%d", seed), func(t *testing.T) {
			checkAgreement(t, uint64(seed), 600)
		})
	}
}

func checkAgreement(t *testing.T, seed uint64, samples int) {
	t.Helper()
	g := gen{rand.New(rand.NewPCG(seed, 0x6e6574706f6c))}
	in := g.input()
	tab := Compile(in)
	checkInvariants(t, tab)
	if len(in.Local) == 0 {
		return
	}
	peers, ports := probes(in)
	failures := 0
	for range samples {
		// Mostly packets of pods some policy applies to (Decide names a
		// policy, or the tables look up), where the tables have something
		// to get wrong.
		l, dir := pickOf(g, in.Local...), pickOf(g, Ingress, Egress)
		for try := 0; try < 3; try++ {
			if _, p, _ := Decide(in, l.Namespace, l.Name, dir, PeerKey{}, icmp, 0); p != 0 || tab.Endpoints[l.Ifindex].Lookup&dir != 0 {
				break
			}
			l, dir = pickOf(g, in.Local...), pickOf(g, Ingress, Egress)
		}
		peer := pickOf(g, peers...)
		if pod := pickOf(g, in.Pods...); g.chance(0.5) && len(pod.Addrs) > 0 {
			peer = PeerKey{pod.NetID, pickOf(g, pod.Addrs...)}
		}
		proto := pickOf(g, tcp, udp, sctp, icmp)
		port := pickOf(g, ports...)
		if g.chance(0.1) {
			port = uint16(g.r.UintN(65536))
		}
		if d := agree(in, tab, l, dir, peer, proto, port); d != "" {
			t.Errorf("seed %d: %s", seed, d)
			if failures++; failures > 5 {
				return
			}
		}
	}
}

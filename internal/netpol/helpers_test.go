package netpol

import (
	"fmt"
	"net/netip"
	"slices"
	"testing"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"
)

// Builders that keep the tables of cases readable.

type polOpt func(*networkingv1.NetworkPolicy)

func pol(ns, name string, podSel metav1.LabelSelector, opts ...polOpt) *networkingv1.NetworkPolicy {
	p := &networkingv1.NetworkPolicy{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Spec:       networkingv1.NetworkPolicySpec{PodSelector: podSel},
	}
	for _, o := range opts {
		o(p)
	}
	return p
}

// ingress sets the ingress rules; with no argument, `ingress: []`.
func ingress(rules ...networkingv1.NetworkPolicyIngressRule) polOpt {
	return func(p *networkingv1.NetworkPolicy) {
		p.Spec.Ingress = append([]networkingv1.NetworkPolicyIngressRule{}, rules...)
	}
}

func egress(rules ...networkingv1.NetworkPolicyEgressRule) polOpt {
	return func(p *networkingv1.NetworkPolicy) {
		p.Spec.Egress = append([]networkingv1.NetworkPolicyEgressRule{}, rules...)
	}
}

func types(ts ...networkingv1.PolicyType) polOpt {
	return func(p *networkingv1.NetworkPolicy) { p.Spec.PolicyTypes = ts }
}

func allowIn(peers []networkingv1.NetworkPolicyPeer, ports ...networkingv1.NetworkPolicyPort) networkingv1.NetworkPolicyIngressRule {
	return networkingv1.NetworkPolicyIngressRule{From: peers, Ports: ports}
}

func allowOut(peers []networkingv1.NetworkPolicyPeer, ports ...networkingv1.NetworkPolicyPort) networkingv1.NetworkPolicyEgressRule {
	return networkingv1.NetworkPolicyEgressRule{To: peers, Ports: ports}
}

func peers(ps ...networkingv1.NetworkPolicyPeer) []networkingv1.NetworkPolicyPeer { return ps }

func sel(kv ...string) metav1.LabelSelector {
	s := metav1.LabelSelector{}
	for i := 0; i+1 < len(kv); i += 2 {
		if s.MatchLabels == nil {
			s.MatchLabels = map[string]string{}
		}
		s.MatchLabels[kv[i]] = kv[i+1]
	}
	return s
}

func selp(kv ...string) *metav1.LabelSelector { s := sel(kv...); return &s }

// badSel is a selector the API server would reject.
func badSel() *metav1.LabelSelector {
	return &metav1.LabelSelector{MatchExpressions: []metav1.LabelSelectorRequirement{{Key: "app", Operator: "Bogus"}}}
}

func podPeer(s *metav1.LabelSelector) networkingv1.NetworkPolicyPeer {
	return networkingv1.NetworkPolicyPeer{PodSelector: s}
}

func nsPeer(s *metav1.LabelSelector) networkingv1.NetworkPolicyPeer {
	return networkingv1.NetworkPolicyPeer{NamespaceSelector: s}
}

func bothPeer(ns, pod *metav1.LabelSelector) networkingv1.NetworkPolicyPeer {
	return networkingv1.NetworkPolicyPeer{NamespaceSelector: ns, PodSelector: pod}
}

func block(cidr string, except ...string) networkingv1.NetworkPolicyPeer {
	return networkingv1.NetworkPolicyPeer{IPBlock: &networkingv1.IPBlock{CIDR: cidr, Except: except}}
}

func port(proto corev1.Protocol, n int32) networkingv1.NetworkPolicyPort {
	p := networkingv1.NetworkPolicyPort{Port: ptr.To(intstr.FromInt32(n))}
	if proto != "" {
		p.Protocol = ptr.To(proto)
	}
	return p
}

func portRangeOf(proto corev1.Protocol, lo, hi int32) networkingv1.NetworkPolicyPort {
	p := port(proto, lo)
	p.EndPort = ptr.To(hi)
	return p
}

func namedPort(proto corev1.Protocol, name string) networkingv1.NetworkPolicyPort {
	p := networkingv1.NetworkPolicyPort{Port: ptr.To(intstr.FromString(name))}
	if proto != "" {
		p.Protocol = ptr.To(proto)
	}
	return p
}

func allPortsOf(proto corev1.Protocol) networkingv1.NetworkPolicyPort {
	return networkingv1.NetworkPolicyPort{Protocol: ptr.To(proto)}
}

func addr(s string) netip.Addr { return netip.MustParseAddr(s) }

func addrs(ss ...string) []netip.Addr {
	var out []netip.Addr
	for _, s := range ss {
		out = append(out, addr(s))
	}
	return out
}

func pk(net uint32, a string) PeerKey { return PeerKey{NetID: net, Addr: addr(a)} }

// protoNum is the data plane's protocol number of a Decide protocol; a
// port-less protocol carries port 0.
func protoNum(p corev1.Protocol, port uint16) (uint8, uint16) {
	switch p {
	case corev1.ProtocolTCP:
		return 6, port
	case corev1.ProtocolUDP:
		return 17, port
	case corev1.ProtocolSCTP:
		return 132, port
	}
	return 0, 0
}

// agree checks that the compiled tables decide a packet as Decide does,
// attribution included; it returns a description of the difference.
func agree(in Input, tab Tables, l Local, dir Dir, peer PeerKey, proto corev1.Protocol, port uint16) string {
	wantAllow, wantPol, wantRule := Decide(in, l.Namespace, l.Name, dir, peer, proto, port)
	pn, pp := protoNum(proto, port)
	gotAllow, gotPol, gotRule := tab.Lookup(l.Ifindex, dir, peer, pn, pp)
	if gotAllow != wantAllow || gotPol != wantPol || (wantRule >= 0 && int(gotRule) != wantRule) {
		return fmt.Sprintf("%s/%s dir %d peer %d/%s %q %d: Decide (%v, %#x, %d), Lookup (%v, %#x, %d) [class %#x]",
			l.Namespace, l.Name, dir, peer.NetID, peer.Addr, proto, port,
			wantAllow, wantPol, wantRule, gotAllow, gotPol, gotRule, tab.classOf(peer))
	}
	return ""
}

// checkInvariants checks the shape of the tables the data plane relies on.
func checkInvariants(t *testing.T, tab Tables) {
	t.Helper()
	for k, c := range tab.Peers {
		if c == 0 {
			t.Errorf("Peers[%v] is class 0", k)
		}
	}
	for p := range tab.CIDRs {
		if p != p.Masked() {
			t.Errorf("CIDR %s not masked", p)
		}
	}
	for ifx, ep := range tab.Endpoints {
		if ep.Lookup == 0 || ep.Isolated&^ep.Lookup != 0 {
			t.Errorf("endpoint %d: Lookup %b, Isolated %b", ifx, ep.Lookup, ep.Isolated)
		}
		if (ep.Isolated&Ingress != 0) != (ep.DenyIn != 0) || (ep.Isolated&Egress != 0) != (ep.DenyOut != 0) {
			t.Errorf("endpoint %d: %+v", ifx, ep)
		}
		for _, id := range []uint32{ep.DenyIn, ep.DenyOut} {
			if _, ok := tab.Policies[id]; id != 0 && !ok {
				t.Errorf("endpoint %d: policy %#x not in Policies", ifx, id)
			}
		}
	}
	type group struct {
		ifindex, class uint32
		dir            Dir
	}
	byGroup := map[group][]VerdictKey{}
	catchAll := map[group]Verdict{}
	for k, v := range tab.Verdicts {
		if k.PrefixLen == 72 {
			catchAll[group{k.Ifindex, k.Class, k.Dir}] = v
		}
	}
	for k, v := range tab.Verdicts {
		ep, ok := tab.Endpoints[k.Ifindex]
		if !ok || ep.Lookup&k.Dir == 0 {
			t.Errorf("verdict %+v for an endpoint not looked up that way", k)
		}
		miss := Verdict{Allow: true}
		if ep.Isolated&k.Dir != 0 {
			miss = Verdict{Policy: ep.DenyOut}
			if k.Dir == Ingress {
				miss = Verdict{Policy: ep.DenyIn}
			}
		}
		ref, known := tab.Policies[v.Policy]
		switch {
		case v.Policy == 0:
			// "No tier decided": a pass counted on no policy, only where
			// no NetworkPolicy isolates (there it is final).
			if !v.Allow || v.Rule != 0 || ep.Isolated&k.Dir != 0 {
				t.Errorf("verdict %+v: %+v", k, v)
			}
		case !known:
			t.Errorf("verdict %+v: %+v names an unknown policy", k, v)
		case ref.Kind == kindNetworkPolicy && (ep.Isolated&k.Dir == 0 || (!v.Allow && v != miss)):
			// A NetworkPolicy decides only where it isolates, and it
			// denies only as a miss (its first isolating policy).
			t.Errorf("verdict %+v: %+v from %+v", k, v, ref)
		}
		if _, ok := catchAll[group{k.Ifindex, k.Class, k.Dir}]; v == miss && (k.PrefixLen == 72 || !ok) {
			t.Errorf("verdict %+v: %+v says what a miss says", k, v)
		}
		switch {
		case k.PrefixLen == 72:
			if k.Proto != 0 || k.Port != 0 {
				t.Errorf("verdict %+v: bits past the prefix", k)
			}
		case k.PrefixLen >= 80 && k.PrefixLen <= 96:
			if !slices.Contains([]uint8{6, 17, 132}, k.Proto) || k.Port&^portMask(int(k.PrefixLen)-80) != 0 {
				t.Errorf("verdict %+v: bad proto or bits past the prefix", k)
			}
		default:
			t.Errorf("verdict %+v: prefix length", k)
		}
		g := group{k.Ifindex, k.Class, k.Dir}
		byGroup[g] = append(byGroup[g], k)
		if ca, ok := catchAll[g]; ok && k.PrefixLen != 72 && ca == v {
			t.Errorf("verdict %+v repeats its prefix-72 entry", k)
		}
	}
	// Entries never overlap, except port entries under a prefix-72 one
	// (they name an earlier rule than the catch-all).
	for g, keys := range byGroup {
		for i, a := range keys {
			for _, b := range keys[i+1:] {
				if a.PrefixLen == 72 || b.PrefixLen == 72 || a.Proto != b.Proto {
					continue
				}
				n := min(a.PrefixLen, b.PrefixLen) - 80
				if a.Port&portMask(int(n)) == b.Port&portMask(int(n)) {
					t.Errorf("%+v: entries %+v and %+v overlap", g, a, b)
				}
			}
		}
	}
}

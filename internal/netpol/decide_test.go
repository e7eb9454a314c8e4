package netpol

import (
	"testing"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

const (
	tcp  = corev1.ProtocolTCP
	udp  = corev1.ProtocolUDP
	sctp = corev1.ProtocolSCTP
	icmp = corev1.Protocol("") // a protocol without ports
)

// world is the cluster of the hand-written cases. c/x sits in network 2 at
// the address a/web has in network 1.
func world(policies ...*networkingv1.NetworkPolicy) Input {
	return Input{
		Policies: policies,
		Namespaces: map[string]map[string]string{
			"a": {"team": "a", "env": "prod"},
			"b": {"team": "b", "env": "prod"},
			"c": {"team": "c"},
			// "d" has no entry: no labels.
		},
		Pods: []Pod{
			{Namespace: "a", Name: "web", Labels: map[string]string{"app": "web"}, NetID: 1, Addrs: addrs("10.0.0.1", "fd00::1"),
				Ports: []Port{{Name: "http", Port: 80}, {Name: "metrics", Protocol: tcp, Port: 9090}, {Name: "dns", Protocol: udp, Port: 53}}},
			{Namespace: "a", Name: "web2", Labels: map[string]string{"app": "web"}, NetID: 1, Addrs: addrs("10.0.0.2"),
				Ports: []Port{{Name: "http", Protocol: tcp, Port: 8080}}},
			{Namespace: "a", Name: "db", Labels: map[string]string{"app": "db"}, NetID: 1, Addrs: addrs("10.0.0.3")},
			{Namespace: "b", Name: "client", Labels: map[string]string{"app": "client"}, NetID: 1, Addrs: addrs("10.0.0.4", "fd00::4")},
			{Namespace: "b", Name: "web", Labels: map[string]string{"app": "web"}, NetID: 1, Addrs: addrs("10.0.0.5"),
				Ports: []Port{{Name: "http", Port: 80}}},
			{Namespace: "c", Name: "x", Labels: map[string]string{"app": "x"}, NetID: 2, Addrs: addrs("10.0.0.1")},
			{Namespace: "d", Name: "y", Labels: map[string]string{"app": "y"}, NetID: 1, Addrs: addrs("10.0.0.6")},
		},
		Local: []Local{
			{Namespace: "a", Name: "web", Ifindex: 10}, {Namespace: "a", Name: "web2", Ifindex: 11},
			{Namespace: "a", Name: "db", Ifindex: 12}, {Namespace: "b", Name: "client", Ifindex: 20},
			{Namespace: "b", Name: "web", Ifindex: 21}, {Namespace: "c", Name: "x", Ifindex: 30},
			{Namespace: "d", Name: "y", Ifindex: 40},
		},
	}
}

// The world's pods as peers.
var (
	aWeb     = pk(1, "10.0.0.1")
	aWeb6    = pk(1, "fd00::1")
	aWeb2    = pk(1, "10.0.0.2")
	aDB      = pk(1, "10.0.0.3")
	bClient  = pk(1, "10.0.0.4")
	bClient6 = pk(1, "fd00::4")
	bWeb     = pk(1, "10.0.0.5")
	cX       = pk(2, "10.0.0.1")
	dY       = pk(1, "10.0.0.6")
)

type packet struct {
	subject string // "ns/name"
	dir     Dir
	peer    PeerKey
	proto   corev1.Protocol
	port    uint16
}

type want struct {
	allow  bool
	policy string // "ns/name", "" for none
	rule   int    // -1 for none
}

var (
	open = want{true, "", -1}
)

func allowed(policy string, rule int) want { return want{true, policy, rule} }
func denied(policy string) want            { return want{false, policy, -1} }

// TestDecideSemantics: each NetworkPolicy rule, with hand-written
// expectations, through Decide and through Compile + Lookup.
func TestDecideSemantics(t *testing.T) {
	all := metav1.LabelSelector{}
	cases := []struct {
		name     string
		policies []*networkingv1.NetworkPolicy
		checks   []struct {
			p packet
			w want
		}
	}{
		{"no policy allows everything", nil, checks(
			pkt("a/web", Ingress, bClient, tcp, 80), open,
			pkt("a/web", Egress, bClient, icmp, 0), open)},
		{"ingress: [] isolates ingress only", pols(pol("a", "deny", all, ingress())), checks(
			pkt("a/web", Ingress, bClient, tcp, 80), denied("a/deny"),
			pkt("a/db", Ingress, aWeb, icmp, 0), denied("a/deny"),
			pkt("a/web", Egress, bClient, tcp, 80), open,
			pkt("b/client", Ingress, aWeb, tcp, 80), open)},
		{"an egress section implies Egress", pols(pol("a", "p", all, egress(allowOut(peers(podPeer(selp("app", "db"))))))), checks(
			pkt("a/web", Egress, bClient, tcp, 80), denied("a/p"),
			pkt("a/web", Egress, aDB, tcp, 80), allowed("a/p", 0),
			pkt("a/web", Ingress, bClient, tcp, 80), denied("a/p"))},
		{"policyTypes Egress ignores ingress rules", pols(pol("a", "p", all, types(networkingv1.PolicyTypeEgress), ingress(allowIn(nil)))), checks(
			pkt("a/web", Ingress, bClient, tcp, 80), open,
			pkt("a/web", Egress, bClient, tcp, 80), denied("a/p"))},
		{"podSelector picks the subjects", pols(pol("a", "p", sel("app", "db"), ingress())), checks(
			pkt("a/web", Ingress, bClient, tcp, 80), open,
			pkt("a/db", Ingress, bClient, tcp, 80), denied("a/p"),
			pkt("b/web", Ingress, bClient, tcp, 80), open)},
		{"an invalid podSelector selects nothing", pols(pol("a", "p", *badSel(), ingress())), checks(
			pkt("a/web", Ingress, bClient, tcp, 80), open)},
		{"peer podSelector: the policy's namespace", pols(pol("a", "p", sel("app", "web"), ingress(allowIn(peers(podPeer(selp("app", "web"))))))), checks(
			pkt("a/web", Ingress, aWeb2, tcp, 80), allowed("a/p", 0),
			pkt("a/web", Ingress, bWeb, tcp, 80), denied("a/p"),
			pkt("a/web", Ingress, bClient, tcp, 80), denied("a/p"))},
		{"peer namespaceSelector alone: every pod there", pols(pol("a", "p", all, ingress(allowIn(peers(nsPeer(selp("team", "b"))))))), checks(
			pkt("a/web", Ingress, bClient, tcp, 80), allowed("a/p", 0),
			pkt("a/web", Ingress, bWeb, udp, 9), allowed("a/p", 0),
			pkt("a/web", Ingress, aDB, tcp, 80), denied("a/p"))},
		{"empty namespaceSelector: every namespace, only pods", pols(pol("a", "p", all, ingress(allowIn(peers(nsPeer(&all)))))), checks(
			pkt("a/web", Ingress, dY, tcp, 80), allowed("a/p", 0),
			pkt("a/web", Ingress, cX, tcp, 80), allowed("a/p", 0),
			pkt("a/web", Ingress, pk(1, "192.168.1.1"), tcp, 80), denied("a/p"),
			pkt("a/web", Ingress, pk(2, "10.0.0.3"), tcp, 80), denied("a/p"))},
		{"both selectors: pods there", pols(pol("a", "p", all, ingress(allowIn(peers(bothPeer(selp("env", "prod"), selp("app", "web"))))))), checks(
			pkt("a/db", Ingress, bWeb, tcp, 80), allowed("a/p", 0),
			pkt("a/db", Ingress, aWeb2, tcp, 80), allowed("a/p", 0),
			pkt("a/db", Ingress, bClient, tcp, 80), denied("a/p"),
			pkt("a/db", Ingress, dY, tcp, 80), denied("a/p"))},
		{"a namespace without labels", pols(pol("a", "p", all, ingress(allowIn(peers(nsPeer(&metav1.LabelSelector{
			MatchExpressions: []metav1.LabelSelectorRequirement{{Key: "env", Operator: metav1.LabelSelectorOpDoesNotExist}}})))))), checks(
			pkt("a/web", Ingress, dY, tcp, 80), allowed("a/p", 0),
			pkt("a/web", Ingress, cX, tcp, 80), allowed("a/p", 0),
			pkt("a/web", Ingress, bClient, tcp, 80), denied("a/p"))},
		{"an invalid peer selector matches nothing", pols(pol("a", "p", all, ingress(allowIn(peers(podPeer(badSel()), nsPeer(badSel())))))), checks(
			pkt("a/web", Ingress, aDB, tcp, 80), denied("a/p"))},
		{"ipBlock with except, non-pod addresses", pols(pol("a", "p", all, ingress(allowIn(peers(block("192.168.0.0/16", "192.168.1.0/24")))))), checks(
			pkt("a/web", Ingress, pk(1, "192.168.2.3"), tcp, 80), allowed("a/p", 0),
			pkt("a/web", Ingress, pk(9, "192.168.255.255"), tcp, 80), allowed("a/p", 0),
			pkt("a/web", Ingress, pk(1, "192.168.1.7"), tcp, 80), denied("a/p"),
			pkt("a/web", Ingress, bClient, tcp, 80), denied("a/p"))},
		{"ipBlock matches pod addresses in any network", pols(pol("a", "p", sel("app", "db"), ingress(allowIn(peers(block("10.0.0.0/30")))))), checks(
			pkt("a/db", Ingress, cX, tcp, 80), allowed("a/p", 0),
			pkt("a/db", Ingress, aWeb, tcp, 80), allowed("a/p", 0),
			pkt("a/db", Ingress, pk(7, "10.0.0.2"), tcp, 80), allowed("a/p", 0),
			pkt("a/db", Ingress, bClient, tcp, 80), denied("a/p"))},
		{"ipBlock IPv6", pols(pol("a", "p", all, egress(allowOut(peers(block("fd00::/120", "fd00::4/126")))))), checks(
			pkt("a/db", Egress, aWeb6, tcp, 80), allowed("a/p", 0),
			pkt("a/db", Egress, bClient6, tcp, 80), denied("a/p"),
			pkt("a/db", Egress, pk(1, "fd00::7"), tcp, 80), denied("a/p"),
			pkt("a/db", Egress, pk(1, "fd00::8"), tcp, 80), allowed("a/p", 0),
			pkt("a/db", Egress, aWeb, tcp, 80), denied("a/p"))},
		{"pod peers are per network", pols(pol("c", "p", all, ingress(allowIn(peers(podPeer(selp("app", "x"))))))), checks(
			pkt("c/x", Ingress, cX, tcp, 80), allowed("c/p", 0),
			pkt("c/x", Ingress, aWeb, tcp, 80), denied("c/p"))},
		{"port protocol defaults to TCP", pols(pol("a", "p", all, ingress(allowIn(nil, port("", 80))))), checks(
			pkt("a/web", Ingress, bClient, tcp, 80), allowed("a/p", 0),
			pkt("a/web", Ingress, bClient, udp, 80), denied("a/p"),
			pkt("a/web", Ingress, bClient, tcp, 81), denied("a/p"),
			pkt("a/web", Ingress, bClient, icmp, 0), denied("a/p"))},
		{"endPort range", pols(pol("a", "p", all, ingress(allowIn(nil, portRangeOf(sctp, 1000, 2000))))), checks(
			pkt("a/web", Ingress, bClient, sctp, 999), denied("a/p"),
			pkt("a/web", Ingress, bClient, sctp, 1000), allowed("a/p", 0),
			pkt("a/web", Ingress, bClient, sctp, 1500), allowed("a/p", 0),
			pkt("a/web", Ingress, bClient, sctp, 2000), allowed("a/p", 0),
			pkt("a/web", Ingress, bClient, sctp, 2001), denied("a/p"),
			pkt("a/web", Ingress, bClient, tcp, 1500), denied("a/p"))},
		{"a port without a number: every port of the protocol", pols(pol("a", "p", all, ingress(allowIn(nil, allPortsOf(udp))))), checks(
			pkt("a/web", Ingress, bClient, udp, 0), allowed("a/p", 0),
			pkt("a/web", Ingress, bClient, udp, 65535), allowed("a/p", 0),
			pkt("a/web", Ingress, bClient, tcp, 53), denied("a/p"))},
		{"port-less protocols need a rule without ports", pols(pol("a", "p", all, ingress(allowIn(nil, port(tcp, 80)), allowIn(peers(podPeer(selp("app", "db"))))))), checks(
			pkt("a/web", Ingress, bClient, icmp, 0), denied("a/p"),
			pkt("a/web", Ingress, aDB, icmp, 0), allowed("a/p", 1),
			pkt("a/web", Ingress, aDB, tcp, 80), allowed("a/p", 0),
			pkt("a/web", Ingress, aDB, udp, 7), allowed("a/p", 1))},
		{"ingress named port: the subject's own", pols(pol("a", "p", all, ingress(allowIn(nil, namedPort("", "http"))))), checks(
			pkt("a/web", Ingress, bClient, tcp, 80), allowed("a/p", 0),
			pkt("a/web", Ingress, bClient, tcp, 8080), denied("a/p"),
			pkt("a/web2", Ingress, bClient, tcp, 8080), allowed("a/p", 0),
			pkt("a/web2", Ingress, bClient, tcp, 80), denied("a/p"),
			pkt("a/db", Ingress, bClient, tcp, 80), denied("a/p"))},
		{"named port protocol", pols(pol("a", "p", all, ingress(allowIn(nil, namedPort(udp, "dns"), namedPort(tcp, "metrics"), namedPort(udp, "metrics"))))), checks(
			pkt("a/web", Ingress, bClient, udp, 53), allowed("a/p", 0),
			pkt("a/web", Ingress, bClient, tcp, 53), denied("a/p"),
			pkt("a/web", Ingress, bClient, tcp, 9090), allowed("a/p", 0),
			pkt("a/web", Ingress, bClient, udp, 9090), denied("a/p"))},
		{"egress named port: the peer's", pols(pol("a", "p", sel("app", "db"), egress(allowOut(peers(nsPeer(&all)), namedPort("", "http"))))), checks(
			pkt("a/db", Egress, aWeb, tcp, 80), allowed("a/p", 0),
			pkt("a/db", Egress, aWeb2, tcp, 8080), allowed("a/p", 0),
			pkt("a/db", Egress, aWeb2, tcp, 80), denied("a/p"),
			pkt("a/db", Egress, bWeb, tcp, 80), allowed("a/p", 0),
			pkt("a/db", Egress, bClient, tcp, 80), denied("a/p"))},
		{"egress named port never matches a non-pod", pols(pol("a", "p", sel("app", "db"), egress(allowOut(peers(block("0.0.0.0/0")), namedPort("", "http"))))), checks(
			pkt("a/db", Egress, pk(1, "192.168.1.1"), tcp, 80), denied("a/p"),
			pkt("a/db", Egress, pk(2, "10.0.0.2"), tcp, 8080), denied("a/p"),
			pkt("a/db", Egress, aWeb2, tcp, 8080), allowed("a/p", 0),
			pkt("a/db", Egress, aWeb, tcp, 80), allowed("a/p", 0))},
		{"an unresolved named port matches nothing", pols(pol("a", "p", all, ingress(allowIn(nil, namedPort("", "nope"))))), checks(
			pkt("a/web", Ingress, bClient, tcp, 80), denied("a/p"))},
		{"union of policies; the first allowing rule is named", pols(
			pol("a", "p2", all, ingress(allowIn(nil, port(tcp, 80)), allowIn(nil))),
			pol("a", "p1", sel("app", "web"), ingress(allowIn(peers(podPeer(selp("app", "db"))), port(tcp, 5432), port(tcp, 80))))), checks(
			pkt("a/web", Ingress, aDB, tcp, 5432), allowed("a/p1", 0),
			pkt("a/web", Ingress, aDB, tcp, 80), allowed("a/p1", 0),
			pkt("a/web", Ingress, bClient, tcp, 80), allowed("a/p2", 0),
			pkt("a/web", Ingress, bClient, tcp, 81), allowed("a/p2", 1),
			pkt("a/web", Ingress, bClient, icmp, 0), allowed("a/p2", 1),
			pkt("a/db", Ingress, aWeb, tcp, 5432), allowed("a/p2", 1))},
		{"denials count on the first isolating policy", pols(
			pol("a", "z", all, ingress(), types(networkingv1.PolicyTypeIngress, networkingv1.PolicyTypeEgress)),
			pol("a", "m", sel("app", "web"), ingress())), checks(
			pkt("a/web", Ingress, bClient, tcp, 80), denied("a/m"),
			pkt("a/web", Egress, bClient, tcp, 80), denied("a/z"),
			pkt("a/db", Ingress, bClient, tcp, 80), denied("a/z"))},
		{"invalid port entries allow nothing", pols(pol("a", "p", all, ingress(allowIn(nil,
			port(tcp, 0), portRangeOf(tcp, 2000, 1000), port(tcp, 70000), allPortsOf("ICMP"),
			networkingv1.NetworkPolicyPort{EndPort: ptr32(90)},
			func() networkingv1.NetworkPolicyPort { p := namedPort(tcp, "http"); p.EndPort = ptr32(90); return p }())))), checks(
			pkt("a/web", Ingress, bClient, tcp, 80), denied("a/p"),
			pkt("a/web", Ingress, bClient, tcp, 0), denied("a/p"),
			pkt("a/web", Ingress, bClient, tcp, 1500), denied("a/p"),
			pkt("a/web", Ingress, bClient, icmp, 0), denied("a/p"))},
		{"invalid peers match nothing", pols(pol("a", "p", all, ingress(allowIn(peers(
			networkingv1.NetworkPolicyPeer{},
			networkingv1.NetworkPolicyPeer{PodSelector: &all, IPBlock: &networkingv1.IPBlock{CIDR: "0.0.0.0/0"}},
			block("10.0.0.0/8", "bogus"),
			block("not-a-cidr")))))), checks(
			pkt("a/web", Ingress, bClient, tcp, 80), denied("a/p"),
			pkt("a/web", Ingress, pk(1, "10.9.9.9"), tcp, 80), denied("a/p"))},
		{"a policy in another namespace selects none of ours", pols(pol("b", "p", all, ingress())), checks(
			pkt("a/web", Ingress, bClient, tcp, 80), open,
			pkt("b/client", Ingress, aWeb, tcp, 80), denied("b/p"))},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			in := world(tc.policies...)
			tab := Compile(in)
			checkInvariants(t, tab)
			for _, c := range tc.checks {
				wantPol := uint32(0)
				if c.w.policy != "" {
					ns, name, _ := cut(c.w.policy)
					wantPol = PolicyID(kindNetworkPolicy, ns, name)
				}
				ns, name, _ := cut(c.p.subject)
				allow, pol, rule := Decide(in, ns, name, c.p.dir, c.p.peer, c.p.proto, c.p.port)
				if allow != c.w.allow || pol != wantPol || rule != c.w.rule {
					t.Errorf("Decide %+v = (%v, %#x, %d), want %+v (%#x)", c.p, allow, pol, rule, c.w, wantPol)
				}
				l := localOf(in, ns, name)
				if d := agree(in, tab, l, c.p.dir, c.p.peer, c.p.proto, c.p.port); d != "" {
					t.Errorf("tables disagree: %s", d)
				}
			}
		})
	}
}

func ptr32(v int32) *int32 { return &v }

func pols(ps ...*networkingv1.NetworkPolicy) []*networkingv1.NetworkPolicy { return ps }

func pkt(subject string, dir Dir, peer PeerKey, proto corev1.Protocol, port uint16) packet {
	return packet{subject, dir, peer, proto, port}
}

// checks pairs packets with their expectations: packet, want, packet, ...
func checks(args ...any) []struct {
	p packet
	w want
} {
	var out []struct {
		p packet
		w want
	}
	for i := 0; i+1 < len(args); i += 2 {
		out = append(out, struct {
			p packet
			w want
		}{args[i].(packet), args[i+1].(want)})
	}
	return out
}

func cut(s string) (string, string, bool) {
	for i := range s {
		if s[i] == '/' {
			return s[:i], s[i+1:], true
		}
	}
	return s, "", false
}

func localOf(in Input, ns, name string) Local {
	for _, l := range in.Local {
		if l.Namespace == ns && l.Name == name {
			return l
		}
	}
	return Local{}
}

// TestDecideUnknownPod: a pod Decide does not know is not isolated, and a
// Local whose pod is not in Pods gets no endpoint.
func TestDecideUnknownPod(t *testing.T) {
	in := world(pol("a", "deny", metav1.LabelSelector{}, ingress()))
	in.Local = append(in.Local, Local{Namespace: "a", Name: "ghost", Ifindex: 99})
	if allow, p, r := Decide(in, "a", "ghost", Ingress, bClient, tcp, 80); !allow || p != 0 || r != -1 {
		t.Errorf("Decide of an unknown pod = (%v, %#x, %d)", allow, p, r)
	}
	tab := Compile(in)
	if _, ok := tab.Endpoints[99]; ok {
		t.Errorf("a Local not in Pods has an endpoint")
	}
	if _, ok := tab.Endpoints[10]; !ok {
		t.Errorf("a/web is not isolated")
	}
}

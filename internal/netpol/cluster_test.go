package netpol

import (
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// Builders for ClusterPolicies.

type cnpOpt func(*ClusterPolicy)

func cnp(name string, tier Tier, prio int32, subject ClusterSubject, opts ...cnpOpt) ClusterPolicy {
	p := ClusterPolicy{Name: name, Tier: tier, Priority: prio, Subject: subject}
	for _, o := range opts {
		o(&p)
	}
	return p
}

func admin(name string, prio int32, subject ClusterSubject, opts ...cnpOpt) ClusterPolicy {
	return cnp(name, TierAdmin, prio, subject, opts...)
}

func baseline(name string, prio int32, subject ClusterSubject, opts ...cnpOpt) ClusterPolicy {
	return cnp(name, TierBaseline, prio, subject, opts...)
}

func cIn(rules ...ClusterRule) cnpOpt  { return func(p *ClusterPolicy) { p.Ingress = rules } }
func cOut(rules ...ClusterRule) cnpOpt { return func(p *ClusterPolicy) { p.Egress = rules } }

func crule(a Action, peers []ClusterPeer, protos ...ClusterProtocol) ClusterRule {
	return ClusterRule{Action: a, Peers: peers, Protocols: protos}
}

func cpeers(ps ...ClusterPeer) []ClusterPeer { return ps }

// onNS selects the pods of the namespaces with these labels (none: all).
func onNS(kv ...string) ClusterSubject { return ClusterSubject{Namespaces: selp(kv...)} }

func onPods(ns, pod metav1.LabelSelector) ClusterSubject {
	return ClusterSubject{Pods: &NamespacedPod{NamespaceSelector: ns, PodSelector: pod}}
}

func toNS(s *metav1.LabelSelector) ClusterPeer { return ClusterPeer{Namespaces: s} }

func toPods(ns, pod metav1.LabelSelector) ClusterPeer {
	return ClusterPeer{Pods: &NamespacedPod{NamespaceSelector: ns, PodSelector: pod}}
}

func toNets(cidrs ...string) ClusterPeer {
	var ps []netip.Prefix
	for _, c := range cidrs {
		ps = append(ps, netip.MustParsePrefix(c))
	}
	return ClusterPeer{Networks: ps}
}

func toNodes(s *metav1.LabelSelector) ClusterPeer { return ClusterPeer{Nodes: s} }

func cport(proto corev1.Protocol, n uint16) ClusterProtocol {
	return ClusterProtocol{Protocol: proto, Port: n}
}

func crange(proto corev1.Protocol, lo, hi uint16) ClusterProtocol {
	return ClusterProtocol{Protocol: proto, Port: lo, End: hi}
}

func cnamed(name string) ClusterProtocol { return ClusterProtocol{NamedPort: name} }

func deniedBy(policy string, rule int) want { return want{false, policy, rule} }

// wantID resolves a want's policy: "cnp:name" or NetworkPolicy "ns/name".
func wantID(s string) uint32 {
	if name, ok := strings.CutPrefix(s, "cnp:"); ok {
		return PolicyID(kindClusterNetworkPolicy, "", name)
	}
	if s == "" {
		return 0
	}
	ns, name, _ := cut(s)
	return PolicyID(kindNetworkPolicy, ns, name)
}

// clusterNodes are the world's nodes.
func clusterNodes() []Node {
	return []Node{
		{Name: "n1", Labels: map[string]string{"role": "worker", "kubernetes.io/os": "linux"}, Addrs: addrs("192.168.0.1", "fd01::1")},
		{Name: "n2", Labels: map[string]string{"role": "control", "kubernetes.io/os": "linux"}, Addrs: addrs("192.168.0.2")},
	}
}

// TestClusterSemantics: each ClusterNetworkPolicy rule and its interplay
// with NetworkPolicy, with hand-written expectations, through Decide and
// through Compile + Lookup.
func TestClusterSemantics(t *testing.T) {
	all := metav1.LabelSelector{}
	teamB := selp("team", "b")
	cases := []struct {
		name   string
		nps    []*networkingv1.NetworkPolicy
		cnps   []ClusterPolicy
		nodes  []Node // nil: clusterNodes()
		checks []struct {
			p packet
			w want
		}
	}{
		{name: "an Admin Deny beats a NetworkPolicy allow",
			nps:  pols(pol("a", "np", all, ingress(allowIn(peers(nsPeer(teamB)))))),
			cnps: []ClusterPolicy{admin("deny-b", 10, onNS("team", "a"), cIn(crule(ActionDeny, cpeers(toPods(sel("team", "b"), sel("app", "client"))))))},
			checks: checks(
				pkt("a/web", Ingress, bClient, tcp, 80), deniedBy("cnp:deny-b", 0),
				pkt("a/web", Ingress, bWeb, tcp, 80), allowed("a/np", 0),
				pkt("a/web", Ingress, dY, tcp, 80), denied("a/np"),
				pkt("b/web", Ingress, bClient, tcp, 80), open,
				pkt("a/web", Egress, bClient, tcp, 80), open)},
		{name: "an Admin Accept beats NetworkPolicy isolation",
			nps: pols(pol("a", "iso", all, ingress(), types(networkingv1.PolicyTypeIngress, networkingv1.PolicyTypeEgress))),
			cnps: []ClusterPolicy{admin("ok", 10, onPods(all, sel("app", "web")),
				cIn(crule(ActionAccept, cpeers(toNS(teamB)), cport(tcp, 80))),
				cOut(crule(ActionAccept, cpeers(toNets("10.0.0.0/29")))))},
			checks: checks(
				pkt("a/web", Ingress, bClient, tcp, 80), allowed("cnp:ok", 0),
				pkt("a/web", Ingress, bClient, tcp, 81), denied("a/iso"),
				pkt("a/db", Ingress, bClient, tcp, 80), denied("a/iso"),
				pkt("a/web", Egress, aDB, icmp, 0), allowed("cnp:ok", 0),
				pkt("a/web", Egress, pk(1, "192.168.1.1"), udp, 53), denied("a/iso"),
				// Not isolated, yet the allow is the policy's.
				pkt("b/web", Ingress, bClient, tcp, 80), allowed("cnp:ok", 0))},
		{name: "an Admin Pass hands over to NetworkPolicy",
			nps: pols(pol("a", "np", sel("app", "web"), ingress(allowIn(peers(nsPeer(teamB)), port(tcp, 80))))),
			cnps: []ClusterPolicy{admin("gate", 10, onNS("team", "a"),
				cIn(crule(ActionPass, cpeers(toNS(teamB))), crule(ActionDeny, cpeers(toNS(&all)))))},
			checks: checks(
				pkt("a/web", Ingress, bClient, tcp, 80), allowed("a/np", 0),
				pkt("a/web", Ingress, bClient, tcp, 81), denied("a/np"),
				pkt("a/web", Ingress, dY, tcp, 80), deniedBy("cnp:gate", 1),
				pkt("a/db", Ingress, bClient, tcp, 81), open,
				pkt("a/db", Ingress, cX, tcp, 80), deniedBy("cnp:gate", 1),
				pkt("a/db", Ingress, pk(1, "192.168.1.1"), tcp, 80), open)},
		{name: "a Pass goes on to Baseline where no NetworkPolicy isolates",
			nps: pols(pol("a", "np", sel("app", "web"), ingress(allowIn(peers(nsPeer(teamB)), port(tcp, 80))))),
			cnps: []ClusterPolicy{
				admin("gate", 10, onNS("team", "a"), cIn(crule(ActionPass, cpeers(toNS(teamB))))),
				baseline("floor", 5, onNS("team", "a"), cIn(
					crule(ActionDeny, cpeers(toPods(sel("team", "b"), sel("app", "client")))),
					crule(ActionAccept, cpeers(toNS(&all))))),
			},
			checks: checks(
				pkt("a/db", Ingress, bClient, tcp, 80), deniedBy("cnp:floor", 0),
				pkt("a/db", Ingress, bWeb, tcp, 80), allowed("cnp:floor", 1),
				pkt("a/web", Ingress, bClient, tcp, 80), allowed("a/np", 0),
				pkt("a/web", Ingress, bClient, tcp, 81), denied("a/np"),
				pkt("a/web", Ingress, dY, tcp, 80), denied("a/np"),
				pkt("a/db", Ingress, pk(1, "8.8.8.8"), tcp, 80), open)},
		{name: "a Baseline Deny is overridden by a NetworkPolicy allow",
			nps:  pols(pol("a", "np", sel("app", "web"), ingress(allowIn(peers(nsPeer(teamB)))))),
			cnps: []ClusterPolicy{baseline("floor", 1, onNS("team", "a"), cIn(crule(ActionDeny, cpeers(toNS(&all)))))},
			checks: checks(
				pkt("a/web", Ingress, bClient, tcp, 80), allowed("a/np", 0),
				pkt("a/web", Ingress, dY, tcp, 80), denied("a/np"),
				pkt("a/db", Ingress, bClient, tcp, 80), deniedBy("cnp:floor", 0),
				pkt("a/db", Ingress, pk(1, "8.8.8.8"), tcp, 80), open,
				pkt("a/db", Egress, bClient, tcp, 80), open)},
		{name: "a Baseline Pass leaves the default",
			cnps: []ClusterPolicy{baseline("floor", 1, onNS("team", "a"), cIn(
				crule(ActionPass, cpeers(toNS(teamB))), crule(ActionDeny, cpeers(toNS(&all)))))},
			checks: checks(
				pkt("a/db", Ingress, bClient, tcp, 80), open,
				pkt("a/db", Ingress, dY, tcp, 80), deniedBy("cnp:floor", 1))},
		{name: "priority first, then name; Admin before Baseline whatever the priority",
			cnps: []ClusterPolicy{
				admin("b-accept", 10, onNS("team", "a"), cIn(crule(ActionAccept, cpeers(toNS(teamB))))),
				admin("a-deny", 10, onNS("team", "a"), cIn(crule(ActionDeny, cpeers(toNS(teamB))))),
				admin("z-first", 5, onNS("team", "a"), cIn(crule(ActionAccept, cpeers(toPods(all, sel("app", "client")))))),
				baseline("bl", 0, onNS("team", "a"), cIn(crule(ActionDeny, cpeers(toNS(&all))))),
			},
			checks: checks(
				pkt("a/web", Ingress, bClient, tcp, 80), allowed("cnp:z-first", 0),
				pkt("a/web", Ingress, bWeb, tcp, 80), deniedBy("cnp:a-deny", 0),
				pkt("a/web", Ingress, aDB, tcp, 80), deniedBy("cnp:bl", 0))},
		{name: "rule order within a policy",
			cnps: []ClusterPolicy{admin("ordered", 1, onNS("team", "a"), cIn(
				crule(ActionAccept, cpeers(toNS(teamB)), cport(tcp, 80)),
				crule(ActionDeny, cpeers(toNS(teamB))),
				crule(ActionAccept, cpeers(toNS(teamB)))))},
			checks: checks(
				pkt("a/web", Ingress, bClient, tcp, 80), allowed("cnp:ordered", 0),
				pkt("a/web", Ingress, bClient, tcp, 81), deniedBy("cnp:ordered", 1),
				pkt("a/web", Ingress, bClient, udp, 80), deniedBy("cnp:ordered", 1),
				pkt("a/web", Ingress, bClient, icmp, 0), deniedBy("cnp:ordered", 1))},
		{name: "a network matches pod addresses of any network (0.0.0.0/0 blocks pod-to-pod)",
			cnps: []ClusterPolicy{admin("no-v4", 1, onNS("team", "a"), cOut(
				crule(ActionPass, cpeers(toPods(sel("team", "b"), sel("app", "client")))),
				crule(ActionDeny, cpeers(toNets("0.0.0.0/0")))))},
			checks: checks(
				pkt("a/web", Egress, bClient, tcp, 80), open,
				pkt("a/web", Egress, bWeb, tcp, 80), deniedBy("cnp:no-v4", 1),
				pkt("a/web", Egress, cX, tcp, 80), deniedBy("cnp:no-v4", 1),
				pkt("a/web", Egress, pk(2, "10.0.0.4"), tcp, 80), deniedBy("cnp:no-v4", 1),
				pkt("a/web", Egress, pk(1, "8.8.8.8"), icmp, 0), deniedBy("cnp:no-v4", 1),
				pkt("a/web", Egress, aDB, icmp, 0), deniedBy("cnp:no-v4", 1),
				pkt("a/web", Egress, bClient6, tcp, 80), open,
				pkt("a/web", Ingress, bWeb, tcp, 80), open)},
		{name: "nodes peers: the selected nodes' addresses, in any network, egress only",
			cnps: []ClusterPolicy{admin("nodes", 1, onNS("team", "a"),
				cOut(crule(ActionAccept, cpeers(toNodes(selp("role", "worker")))), crule(ActionDeny, cpeers(toNets("192.168.0.0/16", "fd01::/64")))),
				cIn(crule(ActionDeny, cpeers(toNodes(&all)))))},
			checks: checks(
				pkt("a/web", Egress, pk(1, "192.168.0.1"), tcp, 80), allowed("cnp:nodes", 0),
				pkt("a/web", Egress, pk(5, "192.168.0.1"), icmp, 0), allowed("cnp:nodes", 0),
				pkt("a/web", Egress, pk(1, "fd01::1"), udp, 53), allowed("cnp:nodes", 0),
				pkt("a/web", Egress, pk(1, "192.168.0.2"), tcp, 80), deniedBy("cnp:nodes", 1),
				pkt("a/web", Egress, pk(1, "192.168.0.3"), tcp, 80), deniedBy("cnp:nodes", 1),
				pkt("a/web", Egress, bClient, tcp, 80), open,
				pkt("a/web", Ingress, pk(1, "192.168.0.1"), tcp, 80), open)},
		{name: "a pod holding a node's address is matched by its nodes peer",
			nodes: append(clusterNodes(), Node{Name: "n3", Labels: map[string]string{"role": "worker"}, Addrs: addrs("10.0.0.6")},
				Node{Name: "n3", Labels: map[string]string{"role": "worker"}, Addrs: addrs("10.0.0.5")}), // a second n3: ignored
			cnps: []ClusterPolicy{admin("nodes", 1, onNS("team", "a"), cOut(crule(ActionDeny, cpeers(toNodes(selp("role", "worker"))))))},
			checks: checks(
				pkt("a/web", Egress, dY, tcp, 80), deniedBy("cnp:nodes", 0),
				pkt("a/web", Egress, pk(2, "10.0.0.6"), tcp, 80), deniedBy("cnp:nodes", 0),
				pkt("a/web", Egress, bWeb, tcp, 80), open,
				pkt("a/web", Egress, bClient, tcp, 80), open)},
		{name: "ingress named port: the subject's own, any protocol",
			cnps: []ClusterPolicy{admin("named-in", 1, onNS("team", "a"), cIn(
				crule(ActionAccept, cpeers(toNS(&all)), cnamed("http"), cnamed("dns")),
				crule(ActionDeny, cpeers(toNS(&all)))))},
			checks: checks(
				pkt("a/web", Ingress, bClient, tcp, 80), allowed("cnp:named-in", 0),
				pkt("a/web", Ingress, bClient, tcp, 8080), deniedBy("cnp:named-in", 1),
				pkt("a/web", Ingress, bClient, udp, 53), allowed("cnp:named-in", 0),
				pkt("a/web", Ingress, bClient, tcp, 53), deniedBy("cnp:named-in", 1),
				pkt("a/web2", Ingress, bClient, tcp, 8080), allowed("cnp:named-in", 0),
				pkt("a/web2", Ingress, bClient, tcp, 80), deniedBy("cnp:named-in", 1),
				pkt("a/db", Ingress, bClient, tcp, 80), deniedBy("cnp:named-in", 1),
				pkt("a/web", Ingress, bClient, icmp, 0), deniedBy("cnp:named-in", 1))},
		{name: "egress named port: the peer's, never a non-pod's",
			cnps: []ClusterPolicy{admin("named-out", 1, onNS("team", "a"), cOut(
				crule(ActionAccept, cpeers(toNS(&all)), cnamed("http")),
				crule(ActionDeny, cpeers(toNS(&all)), cnamed("metrics")),
				crule(ActionDeny, cpeers(toNets("0.0.0.0/0")))))},
			checks: checks(
				pkt("a/db", Egress, aWeb, tcp, 80), allowed("cnp:named-out", 0),
				pkt("a/db", Egress, aWeb, tcp, 9090), deniedBy("cnp:named-out", 1),
				pkt("a/db", Egress, aWeb, udp, 80), deniedBy("cnp:named-out", 2),
				pkt("a/db", Egress, aWeb2, tcp, 8080), allowed("cnp:named-out", 0),
				pkt("a/db", Egress, aWeb2, tcp, 80), deniedBy("cnp:named-out", 2),
				pkt("a/db", Egress, bWeb, tcp, 80), allowed("cnp:named-out", 0),
				pkt("a/db", Egress, bClient, tcp, 80), deniedBy("cnp:named-out", 2),
				pkt("a/db", Egress, cX, tcp, 80), deniedBy("cnp:named-out", 2),
				pkt("a/db", Egress, pk(1, "192.168.1.1"), tcp, 80), deniedBy("cnp:named-out", 2))},
		{name: "unrecognised peers fail closed: Accept matches nothing, Deny and Pass every peer",
			cnps: []ClusterPolicy{
				admin("accept-bad", 1, onNS("team", "a"), cIn(crule(ActionAccept, cpeers(ClusterPeer{}, toNS(teamB))))),
				admin("deny-bad", 2, onNS("team", "a"), cIn(crule(ActionDeny,
					cpeers(ClusterPeer{Namespaces: &all, Pods: &NamespacedPod{}}, toNS(selp("team", "nobody"))), cport(tcp, 22)))),
				admin("pass-bad", 3, onNS("team", "a"), cIn(crule(ActionPass, cpeers(toNS(badSel())), cport(udp, 53)))),
				admin("deny-none", 4, onNS("team", "a"), cIn(crule(ActionDeny, nil, cport(udp, 54)))),
				admin("deny-badnet", 5, onNS("team", "a"), cOut(crule(ActionDeny, cpeers(ClusterPeer{Networks: []netip.Prefix{{}}}), cport(tcp, 1)))),
				baseline("floor", 1, onNS("team", "a"), cIn(crule(ActionDeny, cpeers(toNS(teamB))))),
			},
			checks: checks(
				pkt("a/db", Ingress, bClient, tcp, 80), deniedBy("cnp:floor", 0),
				pkt("a/db", Ingress, dY, tcp, 22), deniedBy("cnp:deny-bad", 0),
				pkt("a/db", Ingress, pk(1, "8.8.8.8"), tcp, 22), deniedBy("cnp:deny-bad", 0),
				pkt("a/db", Ingress, dY, tcp, 80), open,
				pkt("a/db", Ingress, bClient, udp, 53), deniedBy("cnp:floor", 0),
				pkt("a/db", Ingress, dY, udp, 53), open,
				pkt("a/db", Ingress, dY, udp, 54), deniedBy("cnp:deny-none", 0),
				pkt("a/db", Ingress, pk(1, "8.8.8.8"), udp, 54), deniedBy("cnp:deny-none", 0),
				pkt("a/db", Egress, pk(1, "8.8.8.8"), tcp, 1), deniedBy("cnp:deny-badnet", 0),
				pkt("a/db", Egress, pk(1, "8.8.8.8"), tcp, 2), open)},
		{name: "ingress networks and nodes match nothing",
			nps: pols(pol("a", "iso", all, ingress())),
			cnps: []ClusterPolicy{admin("in", 1, onNS("team", "a"), cIn(
				crule(ActionAccept, cpeers(toNets("0.0.0.0/0"), toNodes(&all))),
				crule(ActionDeny, cpeers(toNets("0.0.0.0/0"), toNodes(&all)))))},
			checks: checks(
				pkt("a/web", Ingress, bClient, tcp, 80), denied("a/iso"),
				pkt("a/web", Ingress, pk(1, "192.168.0.1"), tcp, 80), denied("a/iso"),
				pkt("a/web", Egress, bClient, tcp, 80), open)},
		{name: "invalid protocols: nothing in an Accept, every port of the protocol (or everything) in a Deny",
			nps: pols(pol("a", "iso", sel("app", "web"), ingress(allowIn(nil)))),
			cnps: []ClusterPolicy{
				admin("acc", 1, onNS("team", "a"), cIn(crule(ActionAccept, cpeers(toNS(&all)),
					ClusterProtocol{Protocol: tcp}, crange(tcp, 90, 90), ClusterProtocol{Port: 80}, ClusterProtocol{NamedPort: "http", Protocol: tcp}))),
				admin("deny", 2, onNS("team", "a"), cIn(crule(ActionDeny, cpeers(toNS(teamB)), crange(udp, 100, 50)))),
				admin("deny-any", 3, onNS("team", "a"), cIn(crule(ActionDeny, cpeers(toNS(selp("team", "c"))), ClusterProtocol{Protocol: "ICMP"}))),
			},
			checks: checks(
				pkt("a/web", Ingress, dY, tcp, 90), allowed("a/iso", 0),
				pkt("a/web", Ingress, dY, tcp, 80), allowed("a/iso", 0),
				pkt("a/web", Ingress, bClient, udp, 7), deniedBy("cnp:deny", 0),
				pkt("a/web", Ingress, bClient, tcp, 7), allowed("a/iso", 0),
				pkt("a/web", Ingress, cX, icmp, 0), deniedBy("cnp:deny-any", 0),
				pkt("a/web", Ingress, cX, sctp, 1), deniedBy("cnp:deny-any", 0),
				pkt("a/db", Ingress, dY, tcp, 80), open)},
		{name: "port ranges include both ends",
			cnps: []ClusterPolicy{admin("ranges", 1, onNS("team", "a"), cIn(crule(ActionDeny, cpeers(toNS(&all)),
				crange(tcp, 80, 8080), crange(udp, 53, 5353), crange(sctp, 9003, 9005))))},
			checks: checks(
				pkt("a/web", Ingress, bClient, tcp, 79), open,
				pkt("a/web", Ingress, bClient, tcp, 80), deniedBy("cnp:ranges", 0),
				pkt("a/web", Ingress, bClient, tcp, 8080), deniedBy("cnp:ranges", 0),
				pkt("a/web", Ingress, bClient, tcp, 8081), open,
				pkt("a/web", Ingress, bClient, udp, 52), open,
				pkt("a/web", Ingress, bClient, udp, 53), deniedBy("cnp:ranges", 0),
				pkt("a/web", Ingress, bClient, udp, 5353), deniedBy("cnp:ranges", 0),
				pkt("a/web", Ingress, bClient, udp, 5354), open,
				pkt("a/web", Ingress, bClient, sctp, 9002), open,
				pkt("a/web", Ingress, bClient, sctp, 9003), deniedBy("cnp:ranges", 0),
				pkt("a/web", Ingress, bClient, sctp, 9005), deniedBy("cnp:ranges", 0),
				pkt("a/web", Ingress, bClient, sctp, 9006), open,
				pkt("a/web", Ingress, bClient, icmp, 0), open)},
		{name: "overlapping networks and overlapping pod networks are never confused",
			cnps: []ClusterPolicy{
				admin("pods-x", 0, onNS("team", "a"), cOut(crule(ActionDeny, cpeers(toPods(all, sel("app", "x")))))),
				admin("narrow", 1, onNS("team", "a"), cOut(crule(ActionAccept, cpeers(toNets("10.0.0.0/30"))))),
				admin("wide", 2, onNS("team", "a"), cOut(crule(ActionDeny, cpeers(toNets("10.0.0.0/24"))))),
			},
			checks: checks(
				pkt("a/db", Egress, aWeb, tcp, 80), allowed("cnp:narrow", 0),
				pkt("a/db", Egress, cX, tcp, 80), deniedBy("cnp:pods-x", 0),
				pkt("a/db", Egress, aWeb2, tcp, 80), allowed("cnp:narrow", 0),
				pkt("a/db", Egress, pk(2, "10.0.0.2"), tcp, 80), allowed("cnp:narrow", 0),
				pkt("a/db", Egress, bClient, tcp, 80), deniedBy("cnp:wide", 0),
				pkt("a/db", Egress, pk(1, "10.0.1.1"), tcp, 80), open,
				pkt("a/db", Egress, aWeb6, tcp, 80), open)},
		{name: "subjects: exactly one field, a valid selector, a known tier; an unknown action denies",
			cnps: []ClusterPolicy{
				admin("both", 1, ClusterSubject{Namespaces: &all, Pods: &NamespacedPod{}}, cIn(crule(ActionDeny, cpeers(toNS(&all))))),
				admin("none", 1, ClusterSubject{}, cIn(crule(ActionDeny, cpeers(toNS(&all))))),
				admin("bad", 1, ClusterSubject{Namespaces: badSel()}, cIn(crule(ActionDeny, cpeers(toNS(&all))))),
				cnp("tier7", 7, 1, onNS(), cIn(crule(ActionDeny, cpeers(toNS(&all))))),
				admin("web-anywhere", 2, onPods(all, sel("app", "web")), cIn(crule(Action(9), cpeers(toNS(selp("team", "c")))))),
				admin("web-in-b", 3, onPods(sel("team", "b"), sel("app", "web")), cIn(crule(ActionDeny, cpeers(toNS(teamB))))),
			},
			checks: checks(
				pkt("a/db", Ingress, bClient, tcp, 80), open,
				pkt("b/web", Ingress, bClient, tcp, 80), deniedBy("cnp:web-in-b", 0),
				pkt("a/web", Ingress, cX, tcp, 80), deniedBy("cnp:web-anywhere", 0),
				pkt("b/web", Ingress, cX, tcp, 80), deniedBy("cnp:web-anywhere", 0),
				pkt("a/web", Ingress, bClient, tcp, 80), open)},
		{name: "of two policies with one name the first counts, whatever its tier",
			cnps: []ClusterPolicy{
				baseline("dup", 1, onNS(), cIn(crule(ActionDeny, cpeers(toNS(&all))))),
				admin("dup", 1, onNS(), cIn(crule(ActionAccept, cpeers(toNS(&all))))),
			},
			nps: pols(pol("a", "iso", all, ingress())),
			checks: checks(
				pkt("a/web", Ingress, bClient, tcp, 80), denied("a/iso"),
				pkt("b/web", Ingress, bClient, tcp, 80), deniedBy("cnp:dup", 0))},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			in := world(tc.nps...)
			in.ClusterPolicies = tc.cnps
			in.Nodes = tc.nodes
			if in.Nodes == nil {
				in.Nodes = clusterNodes()
			}
			tab := Compile(in)
			checkInvariants(t, tab)
			for _, c := range tc.checks {
				wantPol := wantID(c.w.policy)
				ns, name, _ := cut(c.p.subject)
				allow, pol, rule := Decide(in, ns, name, c.p.dir, c.p.peer, c.p.proto, c.p.port)
				if allow != c.w.allow || pol != wantPol || rule != c.w.rule {
					t.Errorf("Decide %+v = (%v, %#x, %d), want %+v (%#x)", c.p, allow, pol, rule, c.w, wantPol)
				}
				if d := agree(in, tab, localOf(in, ns, name), c.p.dir, c.p.peer, c.p.proto, c.p.port); d != "" {
					t.Errorf("tables disagree: %s", d)
				}
			}
		})
	}
}

// TestClusterEndpoints: Lookup holds the directions a ClusterPolicy rule
// applies in, Isolated only NetworkPolicy's; endpoints no rule applies to
// are left out, and so are rules that cannot match.
func TestClusterEndpoints(t *testing.T) {
	in := world(pol("a", "iso", sel("app", "web"), ingress()))
	in.ClusterPolicies = []ClusterPolicy{
		admin("out", 1, onPods(metav1.LabelSelector{}, sel("app", "db")), cOut(crule(ActionDeny, cpeers(toNets("8.8.8.8/32"))))),
		admin("dead", 1, onNS("team", "b"), cIn(crule(ActionAccept, nil)), cOut(crule(ActionAccept, cpeers(toNodes(selp("role", "nowhere")))))),
		baseline("in", 1, onNS("team", "c"), cIn(crule(ActionPass, cpeers(toNS(&metav1.LabelSelector{}))))),
	}
	in.Nodes = clusterNodes()
	tab := Compile(in)
	checkInvariants(t, tab)
	np := PolicyID(kindNetworkPolicy, "a", "iso")
	want := map[uint32]Endpoint{
		10: {Lookup: Ingress, Isolated: Ingress, DenyIn: np},
		11: {Lookup: Ingress, Isolated: Ingress, DenyIn: np},
		12: {Lookup: Egress},
		30: {Lookup: Ingress},
	}
	if !mapsEqual(tab.Endpoints, want) {
		t.Errorf("endpoints %+v, want %+v", tab.Endpoints, want)
	}
	// A pass alone decides nothing: no entry for c/x.
	for k := range tab.Verdicts {
		if k.Ifindex == 30 {
			t.Errorf("entry %+v for a Baseline Pass", k)
		}
	}
	if _, ok := tab.Policies[PolicyID(kindClusterNetworkPolicy, "", "dead")]; ok {
		t.Errorf("a policy whose rules cannot match is in Policies")
	}
	if ref := tab.Policies[PolicyID(kindClusterNetworkPolicy, "", "out")]; ref != (PolicyRef{Kind: "ClusterNetworkPolicy", Name: "out"}) {
		t.Errorf("ref %+v", ref)
	}
	if allow, p, _ := tab.Lookup(12, Egress, pk(1, "8.8.8.8"), 6, 80); allow || p != PolicyID(kindClusterNetworkPolicy, "", "out") {
		t.Errorf("a/db to 8.8.8.8: (%v, %#x)", allow, p)
	}
	if allow, p, _ := tab.Lookup(12, Egress, pk(1, "8.8.4.4"), 6, 80); !allow || p != 0 {
		t.Errorf("a/db to 8.8.4.4: (%v, %#x), want a miss that passes", allow, p)
	}
}

func mapsEqual[K comparable, V comparable](a, b map[K]V) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if w, ok := b[k]; !ok || w != v {
			return false
		}
	}
	return true
}

// TestClusterEntries: the entries of one endpoint and one class, for
// rule sets whose encoding is known; among them the two spelling out a
// miss's meaning under a shorter entry.
func TestClusterEntries(t *testing.T) {
	everyone := cpeers(toNS(&metav1.LabelSelector{}))
	for _, tc := range []struct {
		name string
		np   bool // isolate a/s for ingress, allowing only TCP 81
		cnps []ClusterPolicy
		want []string // proto/port/prefix verdict policy rule
	}{
		{"a Pass under a Deny, not isolated: an undecided pass", false,
			[]ClusterPolicy{admin("p", 1, onNS(), cIn(crule(ActionPass, everyone, cport(tcp, 80)), crule(ActionDeny, everyone)))},
			[]string{"0/0/72 deny p r1", "6/80/96 allow - r0"}},
		{"a Pass under a Deny, isolated: the NetworkPolicy's allow and its miss", true,
			[]ClusterPolicy{admin("p", 1, onNS(), cIn(crule(ActionPass, everyone, crange(tcp, 80, 81)), crule(ActionDeny, everyone)))},
			[]string{"0/0/72 deny p r1", "6/80/96 deny a/np r0", "6/81/96 allow a/np r0"}},
		{"a Baseline Accept, not isolated, is named", false,
			[]ClusterPolicy{baseline("b", 1, onNS(), cIn(crule(ActionAccept, everyone)))},
			[]string{"0/0/72 allow b r0"}},
		{"a Baseline Accept under isolation is never reached", true,
			[]ClusterPolicy{baseline("b", 1, onNS(), cIn(crule(ActionAccept, everyone)))},
			[]string{"6/81/96 allow a/np r0"}},
		{"an Admin Accept shadows the NetworkPolicy", true,
			[]ClusterPolicy{admin("a", 1, onNS(), cIn(crule(ActionAccept, everyone, crange(tcp, 80, 83))))},
			[]string{"6/80/94 allow a r0"}},
		{"Deny then Accept by port, merged where the decision does not change", false,
			[]ClusterPolicy{admin("a", 1, onNS(), cIn(crule(ActionDeny, everyone, cport(udp, 5)), crule(ActionAccept, everyone, crange(udp, 4, 7))))},
			[]string{"17/4/96 allow a r1", "17/5/96 deny a r0", "17/6/95 allow a r1"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			in := Input{
				ClusterPolicies: tc.cnps,
				Pods:            []Pod{{Namespace: "a", Name: "s", NetID: 1, Addrs: addrs("10.0.0.1")}},
				Local:           []Local{{Namespace: "a", Name: "s", Ifindex: 1}},
			}
			if tc.np {
				in.Policies = pols(pol("a", "np", metav1.LabelSelector{}, ingress(allowIn(nil, port(tcp, 81)))))
			}
			tab := Compile(in)
			checkInvariants(t, tab)
			var got []string
			for k, v := range tab.Verdicts {
				if k.Class != tab.Peers[pk(1, "10.0.0.1")] {
					continue // only the class of a/s itself, which everyone matches
				}
				verdict, name := "deny", "-"
				if v.Allow {
					verdict = "allow"
				}
				if ref, ok := tab.Policies[v.Policy]; ok {
					name = ref.Name
					if ref.Namespace != "" {
						name = ref.Namespace + "/" + ref.Name
					}
				}
				got = append(got, fmt.Sprintf("%d/%d/%d %s %s r%d", k.Proto, k.Port, k.PrefixLen, verdict, name, v.Rule))
			}
			slices.Sort(got)
			slices.Sort(tc.want)
			if !slices.Equal(got, tc.want) {
				t.Errorf("entries %v, want %v", got, tc.want)
			}
		})
	}
}

// TestClusterCIDRs: networks and the matching nodes' addresses (host
// prefixes) are CIDR regions; a node no peer selects is not.
func TestClusterCIDRs(t *testing.T) {
	in := world()
	in.Nodes = clusterNodes()
	in.ClusterPolicies = []ClusterPolicy{admin("p", 1, onNS("team", "a"), cOut(
		crule(ActionAccept, cpeers(toNodes(selp("role", "worker")))),
		crule(ActionDeny, cpeers(toNets("172.16.0.0/12"))),
	))}
	tab := Compile(in)
	checkInvariants(t, tab)
	for _, s := range []string{"192.168.0.1/32", "fd01::1/128", "172.16.0.0/12"} {
		if c := tab.CIDRs[netip.MustParsePrefix(s)]; c == 0 {
			t.Errorf("CIDRs[%s] = %#x, want a class", s, c)
		}
	}
	if len(tab.CIDRs) != 3 {
		t.Errorf("CIDRs %v, want 3", tab.CIDRs)
	}
}

package netpol

import (
	"fmt"
	"math/rand/v2"
	"net/netip"
	"slices"
	"testing"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// benchInput is a cluster of 20 namespaces and 1,000 pods (100 on this
// node) under 1,000 policies shaped like real ones: an app's pods open a
// named port and a range to front-ends of some teams and HTTPS to a
// partner range; every third policy also restricts egress to DNS, the
// internet but not the cluster, and the next app's named port.
func benchInput() Input {
	in := Input{Namespaces: map[string]map[string]string{}}
	for n := range 20 {
		in.Namespaces[fmt.Sprintf("ns%d", n)] = map[string]string{"team": fmt.Sprintf("t%d", n%5), "env": []string{"prod", "dev"}[n%2]}
	}
	for i := range 1000 {
		p := Pod{
			Namespace: fmt.Sprintf("ns%d", i%20),
			Name:      fmt.Sprintf("pod%d", i),
			Labels:    map[string]string{"app": fmt.Sprintf("app%d", i%50), "tier": []string{"fe", "be", "db"}[i%3], "version": fmt.Sprintf("v%d", i%4)},
			NetID:     1,
			Addrs: []netip.Addr{
				netip.AddrFrom4([4]byte{10, byte(i / 250), byte(i % 250), 10}),
				netip.AddrFrom16([16]byte{0: 0xfd, 13: byte(i / 250), 14: byte(i % 250), 15: 10}),
			},
			Ports: []Port{{Name: "http", Port: 80}, {Name: "metrics", Port: 9090}, {Name: "dns", Protocol: udp, Port: 53}},
		}
		if i%10 == 3 {
			p.NetID = 2
		}
		if i%7 == 0 {
			p.Ports[0].Port = 8080
		}
		in.Pods = append(in.Pods, p)
		if i%10 == 0 {
			in.Local = append(in.Local, Local{Namespace: p.Namespace, Name: p.Name, Ifindex: uint32(1000 + i)})
		}
	}
	for i := range 1000 {
		ingressRules := []networkingv1.NetworkPolicyIngressRule{
			allowIn(peers(bothPeer(selp("team", fmt.Sprintf("t%d", i%5)), selp("tier", "fe"))),
				namedPort(tcp, "http"), portRangeOf(tcp, 8000, 8999)),
			allowIn(peers(block(fmt.Sprintf("172.16.%d.0/24", i%256), fmt.Sprintf("172.16.%d.128/25", i%256))), port(tcp, 443)),
		}
		p := pol(fmt.Sprintf("ns%d", i%20), fmt.Sprintf("pol%d", i), sel("app", fmt.Sprintf("app%d", i%50)), ingress(ingressRules...))
		if i%3 == 0 {
			p.Spec.PolicyTypes = []networkingv1.PolicyType{networkingv1.PolicyTypeIngress, networkingv1.PolicyTypeEgress}
			p.Spec.Egress = []networkingv1.NetworkPolicyEgressRule{
				allowOut(peers(nsPeer(&metav1.LabelSelector{})), namedPort(udp, "dns")),
				allowOut(peers(block("0.0.0.0/0", "10.0.0.0/8")), port(tcp, 443)),
				allowOut(peers(podPeer(selp("app", fmt.Sprintf("app%d", (i+1)%50)))), namedPort(tcp, "http")),
			}
		}
		in.Policies = append(in.Policies, p)
	}
	return in
}

// BenchmarkCompile1000: one node's full compilation at that scale.
func BenchmarkCompile1000(b *testing.B) {
	in := benchInput()
	b.ReportAllocs()
	var tab Tables
	for b.Loop() {
		tab = Compile(in)
	}
	// Set after the loop: the timer's reset would drop them.
	b.ReportMetric(float64(len(tab.Verdicts)), "verdicts")
	b.ReportMetric(float64(countClasses(tab)), "classes")
}

// benchClusterInput is benchInput under 50 ClusterNetworkPolicies on 20
// nodes, shaped like an administrator's. In the Admin tier, per team:
// pass the next team's range of ports on to NetworkPolicy but deny it to
// the team after, deny one app's metrics, accept front-ends' http; accept
// the API servers on the control nodes, deny the metadata address, pass
// production namespaces and deny HTTPS to a partner range. In the Baseline
// tier, per environment and tier: accept production's http and deny the
// rest, accept the cluster's range and deny SMTP anywhere else.
// Priorities repeat, so names break ties. The NetworkPolicies of two apps
// are left out, so that the Baseline tier decides for their pods.
func benchClusterInput() Input {
	in := benchInput()
	in.Policies = slices.DeleteFunc(in.Policies, func(p *networkingv1.NetworkPolicy) bool {
		app := p.Spec.PodSelector.MatchLabels["app"]
		return app == "app0" || app == "app10"
	})
	for n := range 20 {
		role := "worker"
		if n < 3 {
			role = "control"
		}
		in.Nodes = append(in.Nodes, Node{
			Name:   fmt.Sprintf("node%d", n),
			Labels: map[string]string{"role": role, "zone": fmt.Sprintf("z%d", n%4)},
			Addrs:  []netip.Addr{netip.AddrFrom4([4]byte{192, 168, 1, byte(n)}), netip.AddrFrom16([16]byte{0: 0xfd, 1: 1, 15: byte(n)})},
		})
	}
	all := &metav1.LabelSelector{}
	for i := range 50 {
		name := fmt.Sprintf("cnp%02d", i)
		if i%2 == 0 {
			in.ClusterPolicies = append(in.ClusterPolicies, admin(name, int32(i%10), onNS("team", fmt.Sprintf("t%d", i%5)),
				cIn(
					crule(ActionPass, cpeers(toNS(selp("team", fmt.Sprintf("t%d", (i+1)%5)))), crange(tcp, 8000, 8999)),
					crule(ActionDeny, cpeers(toNS(selp("team", fmt.Sprintf("t%d", (i+2)%5)))), crange(tcp, 8000, 8999)),
					crule(ActionDeny, cpeers(toPods(metav1.LabelSelector{}, sel("app", fmt.Sprintf("app%d", i)))), cnamed("metrics")),
					crule(ActionAccept, cpeers(toPods(metav1.LabelSelector{}, sel("tier", "fe"))), cnamed("http"))),
				cOut(
					crule(ActionAccept, cpeers(toNodes(selp("role", "control"))), cport(tcp, 6443)),
					crule(ActionDeny, cpeers(toNets("169.254.169.254/32"))),
					crule(ActionPass, cpeers(toNS(selp("env", "prod")))),
					crule(ActionDeny, cpeers(toNets(fmt.Sprintf("172.16.%d.0/24", i))), cport(tcp, 443)))))
			continue
		}
		subject := onPods(sel("env", []string{"prod", "dev"}[i%4/2]), sel("tier", []string{"fe", "be", "db"}[i%3]))
		in.ClusterPolicies = append(in.ClusterPolicies, baseline(name, int32(i%7), subject,
			cIn(
				crule(ActionAccept, cpeers(toNS(selp("env", "prod"))), cnamed("http")),
				crule(ActionDeny, cpeers(toNS(all)))),
			cOut(
				crule(ActionAccept, cpeers(toNets("10.0.0.0/8", "fd00::/8"))),
				crule(ActionDeny, cpeers(toNets("0.0.0.0/0", "::/0")), cport(tcp, 25)))))
	}
	return in
}

// BenchmarkCompileCluster: BenchmarkCompile1000 plus 50 ClusterPolicies.
func BenchmarkCompileCluster(b *testing.B) {
	in := benchClusterInput()
	b.ReportAllocs()
	var tab Tables
	for b.Loop() {
		tab = Compile(in)
	}
	b.ReportMetric(float64(len(tab.Verdicts)), "verdicts")
	b.ReportMetric(float64(countClasses(tab)), "classes")
}

// TestCompileAgreesAtScale: the benchmarks' inputs, where locals share
// rule sets (and so cached entries), checked against Decide on a sample.
func TestCompileAgreesAtScale(t *testing.T) {
	if testing.Short() {
		t.Skip("Decide is slow on 1,000 policies")
	}
	for _, tc := range []struct {
		name   string
		in     Input
		protos []corev1.Protocol // TCP more often where the ClusterPolicies' ports are
	}{
		{"NetworkPolicy", benchInput(), []corev1.Protocol{tcp, udp, icmp}},
		{"ClusterNetworkPolicy", benchClusterInput(), []corev1.Protocol{tcp, tcp, tcp, udp, icmp}},
	} {
		in := tc.in
		t.Run(tc.name, func(t *testing.T) {
			tab := Compile(in)
			checkInvariants(t, tab)
			g := gen{rand.New(rand.NewPCG(7, 7))}
			for range 300 {
				l := pickOf(g, in.Local...)
				peer := pickOf(g, in.Pods...)
				key := PeerKey{NetID: peer.NetID, Addr: pickOf(g, peer.Addrs...)}
				if g.chance(0.3) {
					key = PeerKey{NetID: 1, Addr: pickOf(g, addr("172.16.3.7"), addr("172.16.3.200"), addr("8.8.8.8"), addr("10.1.1.1"),
						addr("169.254.169.254"), addr("192.168.1.1"), addr("192.168.1.7"), addr("fd01::2"))}
				}
				proto := pickOf(g, tc.protos...)
				port := pickOf(g, uint16(25), 53, 80, 443, 6443, 7999, 8000, 8080, 8500, 8999, 9090)
				if d := agree(in, tab, l, pickOf(g, Ingress, Egress), key, proto, port); d != "" {
					t.Error(d)
				}
			}
		})
	}
}

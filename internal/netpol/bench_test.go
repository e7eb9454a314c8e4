package netpol

import (
	"fmt"
	"math/rand/v2"
	"net/netip"
	"testing"

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

// TestCompileAgreesAtScale: the benchmark's input, where locals share rule
// sets (and so cached entries), checked against Decide on a sample.
func TestCompileAgreesAtScale(t *testing.T) {
	if testing.Short() {
		t.Skip("Decide is slow on 1,000 policies")
	}
	in := benchInput()
	tab := Compile(in)
	checkInvariants(t, tab)
	g := gen{rand.New(rand.NewPCG(7, 7))}
	for range 300 {
		l := pickOf(g, in.Local...)
		peer := pickOf(g, in.Pods...)
		key := PeerKey{NetID: peer.NetID, Addr: pickOf(g, peer.Addrs...)}
		if g.chance(0.3) {
			key = PeerKey{NetID: 1, Addr: pickOf(g, addr("172.16.3.7"), addr("172.16.3.200"), addr("8.8.8.8"), addr("10.1.1.1"))}
		}
		proto := pickOf(g, tcp, udp, icmp)
		port := pickOf(g, uint16(53), 80, 443, 7999, 8000, 8080, 8999, 9090)
		if d := agree(in, tab, l, pickOf(g, Ingress, Egress), key, proto, port); d != "" {
			t.Error(d)
		}
	}
}

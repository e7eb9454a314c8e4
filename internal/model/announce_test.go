package model

import (
	"fmt"
	"net/netip"
	"testing"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	lacev1 "github.com/lace-cni/lace/api/v1alpha1"
)

// TestRendezvousNode: every caller agrees, whatever the candidates'
// order; removing a node moves only the VIPs it held; VIPs spread.
func TestRendezvousNode(t *testing.T) {
	nodes := []string{"n1", "n2", "n3", "n4"}
	held := map[string]int{}
	for i := range 200 {
		vip := netip.AddrFrom4([4]byte{10, 0, byte(i / 256), byte(i)})
		a := RendezvousNode(vip, nodes)
		if b := RendezvousNode(vip, []string{"n4", "n2", "n3", "n1"}); a != b {
			t.Fatalf("%s: %s in one order, %s in another", vip, a, b)
		}
		held[a]++
		without := []string{}
		for _, n := range nodes {
			if n != "n3" {
				without = append(without, n)
			}
		}
		if c := RendezvousNode(vip, without); a != "n3" && c != a {
			t.Errorf("%s moved from %s to %s when n3 left", vip, a, c)
		}
	}
	for _, n := range nodes {
		if held[n] < 25 {
			t.Errorf("node %s announces %d of 200 VIPs: %v", n, held[n], held)
		}
	}
	if RendezvousNode(netip.MustParseAddr("10.0.0.1"), nil) != "" {
		t.Error("an announcer without candidates")
	}
}

// TestAnnouncements: only Lace classes' VIPs in their pools; the class's
// nodeSelector, liveness and (Local) a ready endpoint decide who may
// announce.
func TestAnnouncements(t *testing.T) {
	node := func(name, zone string) *corev1.Node {
		return &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{"zone": zone}}}
	}
	classes := []lacev1.LoadBalancerClass{
		{ObjectMeta: metav1.ObjectMeta{Name: "a"}, Spec: lacev1.LoadBalancerClassSpec{Default: true,
			Addresses: []lacev1.AddressRange{"192.0.2.0/28"}}},
		{ObjectMeta: metav1.ObjectMeta{Name: "b"}, Spec: lacev1.LoadBalancerClassSpec{Addresses: []lacev1.AddressRange{"198.51.100.0/28"},
			NodeSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"zone": "x"}}}},
	}
	lb := func(name, ip string, class *string, local bool) *corev1.Service {
		s := &corev1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: name}, Spec: corev1.ServiceSpec{
			Type: corev1.ServiceTypeLoadBalancer, LoadBalancerClass: class}}
		if local {
			s.Spec.ExternalTrafficPolicy = corev1.ServiceExternalTrafficPolicyLocal
		}
		s.Status.LoadBalancer.Ingress = []corev1.LoadBalancerIngress{{IP: ip}}
		return s
	}
	in := AnnounceInput{
		Classes: classes,
		Services: []*corev1.Service{
			lb("default", "192.0.2.1", nil, false),
			lb("zoned", "198.51.100.1", ptr.To("lace-cni.io/b"), false),
			lb("local", "192.0.2.2", nil, true),
			lb("other", "192.0.2.3", ptr.To("example.com/lb"), false),
			lb("outside", "203.0.113.1", nil, false), // not in its pool
		},
		Slices: []*discoveryv1.EndpointSlice{{
			ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "local-1", Labels: map[string]string{discoveryv1.LabelServiceName: "local"}},
			Endpoints: []discoveryv1.Endpoint{{Addresses: []string{"10.0.0.1"}, NodeName: ptr.To("n3")},
				{Addresses: []string{"10.0.0.2"}, NodeName: ptr.To("n2"), Conditions: discoveryv1.EndpointConditions{Ready: ptr.To(false)}}}}},
		Nodes: []*corev1.Node{node("n1", "x"), node("n2", "x"), node("n3", "y")},
		Alive: map[string]bool{"n1": true, "n2": true, "n3": true},
	}
	got := map[string]string{}
	for _, a := range Announcements(in) {
		got[a.Service.Name] = fmt.Sprintf("%s %s %d", a.VIP, a.Node, a.Eligible)
	}
	want := map[string]string{
		"default": "192.0.2.1 " + RendezvousNode(netip.MustParseAddr("192.0.2.1"), []string{"n1", "n2", "n3"}) + " 3",
		"zoned":   "198.51.100.1 " + RendezvousNode(netip.MustParseAddr("198.51.100.1"), []string{"n1", "n2"}) + " 2",
		"local":   "192.0.2.2 n3 1",
	}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("announcements %v, want %v", got, want)
	}
	// n3 dies: the Local service has no eligible node left.
	in.Alive["n3"] = false
	for _, a := range Announcements(in) {
		if a.Service.Name == "local" && (a.Node != "" || a.Eligible != 0) {
			t.Errorf("local announced by %q with n3 dead", a.Node)
		}
		if a.Service.Name == "default" && a.Node == "n3" {
			t.Error("default still announced by dead n3")
		}
	}
}

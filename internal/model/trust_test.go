package model

import (
	"maps"
	"net/netip"
	"slices"
	"testing"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	lacev1 "github.com/lace-cni/lace/api/v1alpha1"
	"github.com/lace-cni/lace/internal/tables"
)

// Regression tests for what a compromised node writes in its OWN objects
// (the admission policy lets those through); see docs/security.md §8.

func svBackends(st ServiceState) []string {
	svcs, _, _ := svRender(st)
	return svcs
}

// A NetworkEndpoint of node n1, in any namespace, claiming the API server's
// address in another network must not take the backend out of the
// kubernetes Service: the endpoint names no node, so no node speaks for it.
func TestNetworkEndpointCannotClaimOutsideAddress(t *testing.T) {
	in := svInput()
	in.Services = []corev1.Service{svService("kubernetes", "10.96.0.1", []corev1.ServicePort{svPort("https", corev1.ProtocolTCP, 443)})}
	in.EndpointSlices = append(in.EndpointSlices, svSlice("kubernetes", "kubernetes",
		[]discoveryv1.EndpointPort{svSPort("https", corev1.ProtocolTCP, 6443)}, svEp("172.18.0.10", "")))
	before := svBackends(ComputeServices(in))
	for _, ns := range []string{"evil", "default", "kube-system"} {
		in.NetworkEndpoints = []lacev1.NetworkEndpoint{{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "x",
			Labels: map[string]string{"lace-cni.io/node": "n1"}},
			Spec: lacev1.NetworkEndpointSpec{Network: "red", Node: "n1", Addresses: []lacev1.IPAddress{"172.18.0.10"}}}}
		after := ComputeServices(in)
		if got := svBackends(after); !slices.Equal(got, before) || len(after.Excluded) != 0 {
			t.Errorf("NetworkEndpoint %s/x of n1 claiming the API server address: services %v (want %v), excluded %v",
				ns, got, before, after.Excluded)
		}
	}
}

// n1 squats the NetworkEndpoint name of n2's pod (and its UID) before n2's
// agent writes it: the pod stays a backend.
func TestNetworkEndpointSquatIgnored(t *testing.T) {
	in := svInput()
	in.Services = []corev1.Service{svService("web", "10.96.0.10", svHTTP)}
	in.EndpointSlices = []discoveryv1.EndpointSlice{svWeb(svEp("10.1.2.5", "n2", targetPod("web-0", "uid-w")))}
	want := svBackends(ComputeServices(in))
	for _, name := range []string{"web-0", "other"} {
		in.NetworkEndpoints = []lacev1.NetworkEndpoint{{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: name,
			Labels: map[string]string{lacev1.LabelPodUID: "uid-w", lacev1.LabelNode: "n1"}},
			Spec: lacev1.NetworkEndpointSpec{Network: "red", Node: "n1", Addresses: []lacev1.IPAddress{"10.1.2.5"}}}}
		st := ComputeServices(in)
		if got := svBackends(st); !slices.Equal(got, want) || len(st.Excluded) != 0 {
			t.Errorf("n1's NetworkEndpoint default/%s for n2's pod: services %v (want %v), excluded %v", name, got, want, st.Excluded)
		}
	}
	// n2's own NetworkEndpoint for its pod still decides.
	in.NetworkEndpoints = []lacev1.NetworkEndpoint{svNE("web-0", "red", "n2", "uid-w", "10.1.2.5")}
	if st := ComputeServices(in); len(st.Excluded) != 1 {
		t.Errorf("n2's own NetworkEndpoint in red for a service of default: excluded %v, want the pod", st.Excluded)
	}
	// ... but not with another pod's UID (a recreated pod's stale object).
	in.NetworkEndpoints = []lacev1.NetworkEndpoint{svNE("web-0", "red", "n2", "uid-old", "10.9.9.9")}
	if st := ComputeServices(in); len(st.Excluded) != 0 {
		t.Errorf("stale NetworkEndpoint of another UID: excluded %v", st.Excluded)
	}
}

func trustUEP(node, loc string, created int, addrs ...string) lacev1.UnderlayEndpoint {
	u := lacev1.UnderlayEndpoint{ObjectMeta: metav1.ObjectMeta{Name: node, CreationTimestamp: metav1.Unix(int64(1000+created), 0)},
		Spec: lacev1.UnderlayEndpointSpec{Node: node, Locator: lacev1.CIDR(loc)}}
	for _, a := range addrs {
		u.Spec.Addresses = append(u.Spec.Addresses, lacev1.IPAddress(a))
	}
	return u
}

func nodeReporting(name string, addrs ...string) corev1.Node {
	n := corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name}}
	for _, a := range addrs {
		n.Status.Addresses = append(n.Status.Addresses, corev1.NodeAddress{Type: corev1.NodeInternalIP, Address: a})
	}
	n.Status.Addresses = append(n.Status.Addresses, corev1.NodeAddress{Type: corev1.NodeHostName, Address: name})
	return n
}

// n1 (compromised, and its endpoint the newer) claims n2's underlay
// address and an outside host's: whatever the list order, fc00::2 is
// trusted as n2's only and routed to n2's locator only.
func TestUnderlayClaimOfAnotherNodeRefused(t *testing.T) {
	for _, withNodes := range []bool{false, true} {
		for _, order := range [][2]int{{0, 1}, {1, 0}} {
			two := []lacev1.UnderlayEndpoint{
				trustUEP("n2", "fd00:2::/48", 1, "fc00::2"),
				trustUEP("n1", "fd00:1::/48", 2, "fc00::1", "fc00::2", "2001:db8::666"),
			}
			ueps := []lacev1.UnderlayEndpoint{two[order[0]], two[order[1]], trustUEP("n3", "fd00:3::/48", 0, "fc00::3")}
			in := UnderlayInput{Underlays: ueps}
			if withNodes {
				in.Nodes = []corev1.Node{nodeReporting("n1", "fc00::1", "2001:db8::666"), nodeReporting("n2", "fc00::2"), nodeReporting("n3", "fc00::3")}
			}
			acc, refused := AcceptUnderlays(in)
			st := ComputeNode(NodeInput{Node: "n3", Underlays: acc})
			want := []netip.Addr{netip.MustParseAddr("2001:db8::666"), netip.MustParseAddr("fc00::1"), netip.MustParseAddr("fc00::2"), netip.MustParseAddr("fc00::3")}
			got := slices.Clone(st.Nodes)
			slices.SortFunc(got, netip.Addr.Compare)
			if !slices.Equal(slices.Compact(got), want) || len(got) != len(st.Nodes) {
				t.Errorf("nodes %v order %v: trusted sources %v, want %v once each", withNodes, order, st.Nodes, want)
			}
			var sids []string
			for _, r := range st.Routes {
				if r.NetID == tables.NodeNetID && r.Prefix == netip.MustParsePrefix("fc00::2/128") {
					sids = append(sids, r.SID.String())
				}
			}
			if len(sids) != 1 || !netip.MustParsePrefix("fd00:2::/48").Contains(netip.MustParseAddr(sids[0])) {
				t.Errorf("nodes %v order %v: node-context routes to fc00::2 via %v, want one, to n2's locator", withNodes, order, sids)
			}
			reason := UnderlayAddressClaimedBy
			if withNodes {
				reason = UnderlayAddressNotNodes
			}
			if len(refused) != 1 || refused[0].Node != "n1" || refused[0].Address != "fc00::2" || refused[0].Reason != reason {
				t.Errorf("nodes %v order %v: refused %+v, want n1's fc00::2 (%s)", withNodes, order, refused, reason)
			}
		}
	}
	// The older claim keeps it, not the first listed: n1 first, older, and
	// n2's Node does not report fc00::2 (so only n1 may have it).
	acc, refused := AcceptUnderlays(UnderlayInput{Underlays: []lacev1.UnderlayEndpoint{
		trustUEP("n2", "fd00:2::/48", 5, "fc00::2"), trustUEP("n1", "fd00:1::/48", 1, "fc00::2")}})
	if len(acc[0].Spec.Addresses) != 0 || len(acc[1].Spec.Addresses) != 1 || len(refused) != 1 || refused[0].Node != "n2" {
		t.Errorf("older claim: accepted %v / %v, refused %+v", acc[0].Spec.Addresses, acc[1].Spec.Addresses, refused)
	}
}

// With the Node listing its addresses, an address the kubelet does not
// report is refused; so are addresses of pods, services, pools and the
// external-IP allow-list, whatever the Node says.
func TestUnderlayAddressesBounded(t *testing.T) {
	in := UnderlayInput{
		Underlays: []lacev1.UnderlayEndpoint{trustUEP("n1", "fd00:1::/48", 1,
			"fc00::1", "192.168.50.1", "2001:db8::666", "10.1.0.9", "10.96.0.1", "192.0.2.7", "198.51.100.5", "not-an-ip")},
		Nodes: []corev1.Node{nodeReporting("n1", "fc00::1", "192.168.50.1", "10.1.0.9", "10.96.0.1", "192.0.2.7", "198.51.100.5")},
		Networks: []lacev1.Network{{ObjectMeta: metav1.ObjectMeta{Name: "red"}, Spec: lacev1.NetworkSpec{Type: lacev1.NetworkTypeL3,
			IPv4Subnet: &lacev1.Subnet{Prefix: "10.1.0.0/16"}}}},
		ServiceCIDRs:       []netip.Prefix{netip.MustParsePrefix("10.96.0.0/12")},
		AllowedExternalIPs: []netip.Prefix{netip.MustParsePrefix("192.0.2.0/24")},
		LoadBalancerPools: []lacev1.LoadBalancerClass{{ObjectMeta: metav1.ObjectMeta{Name: "pub"},
			Spec: lacev1.LoadBalancerClassSpec{Addresses: []lacev1.AddressRange{"198.51.100.1-198.51.100.9"}}}},
	}
	acc, refused := AcceptUnderlays(in)
	if got := acc[0].Spec.Addresses; !slices.Equal(got, []lacev1.IPAddress{"fc00::1", "192.168.50.1"}) {
		t.Errorf("accepted %v, want fc00::1 192.168.50.1", got)
	}
	reasons := map[string]string{}
	for _, r := range refused {
		reasons[r.Address] = r.Reason
	}
	want := map[string]string{"2001:db8::666": UnderlayAddressNotNodes, "10.1.0.9": UnderlayAddressReserved, "10.96.0.1": UnderlayAddressReserved,
		"192.0.2.7": UnderlayAddressReserved, "198.51.100.5": UnderlayAddressReserved, "not-an-ip": UnderlayAddressInvalid}
	if !maps.Equal(reasons, want) {
		t.Errorf("refused %v, want %v", reasons, want)
	}
	if len(in.Underlays[0].Spec.Addresses) != 8 {
		t.Errorf("input modified: %v", in.Underlays[0].Spec.Addresses)
	}
}

// n1 puts a Service's external IP in its UnderlayEndpoint: the external IP
// stays served (it is on the allow-list, which no node address may be in).
func TestUnderlayCannotReserveExternalIP(t *testing.T) {
	in := svInput()
	in.AllowedExternalIPs = []netip.Prefix{netip.MustParsePrefix("192.0.2.0/24")}
	s := svService("web", "10.96.0.10", svHTTP)
	s.Spec.ExternalIPs = []string{"192.0.2.7"}
	ueps, _ := AcceptUnderlays(UnderlayInput{Underlays: []lacev1.UnderlayEndpoint{trustUEP("n1", "fd00:1::/48", 1, "fc00::1", "192.0.2.7")},
		Networks: in.Networks, AllowedExternalIPs: in.AllowedExternalIPs})
	pr := ExternalIPProblems(ExternalIPInput{Networks: in.Networks, BindingPolicies: in.BindingPolicies, Namespaces: in.Namespaces,
		Services: []corev1.Service{s}, Allowed: in.AllowedExternalIPs, Reserved: ReservedFor(ueps, in.Networks, nil)})
	if len(pr) != 0 {
		t.Errorf("external IP refused because a node claimed it: %v", pr)
	}
}

package model

import (
	"net/netip"
	"slices"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	lacev1 "github.com/lace-cni/lace/api/v1alpha1"
)

// Regression tests for a hostile review of the external IP rules: each
// names the way a newer Service got an older one's address.

func xipProblems(in ServiceInput) map[ServiceKey][]ExternalIPRefusal {
	return ExternalIPProblems(ExternalIPInput{Networks: in.Networks, BindingPolicies: in.BindingPolicies,
		Namespaces: in.Namespaces, Services: in.Services, Reserved: in.Reserved, Allowed: in.AllowedExternalIPs})
}

// TestExternalIPSloppyClusterIPNoAdvantage: a ClusterIP written with
// leading zeros (the API server accepts them) is the same address to the
// entries, the owners and the views: the newer Service does not take the
// older one's external IP by being unknown to the owners, and its
// ClusterIP is in the views.
func TestExternalIPSloppyClusterIPNoAdvantage(t *testing.T) {
	in := svInput()
	in.Namespaces["aaa"] = nil
	in.AllowedExternalIPs = []netip.Prefix{netip.MustParsePrefix("192.0.2.0/24")}
	victim := svService("victim", "10.96.0.10", svHTTP, born(10, "b"), xips("192.0.2.5"))
	att := svService("att", "010.096.000.020", svHTTP, born(99999, "z"), xips("192.0.2.5"))
	att.Namespace = "aaa" // first by namespace and name
	in.Services = []corev1.Service{victim, att}
	st := ComputeServices(in)
	if got := externalEntries(st); !slices.Equal(got, []string{"192.0.2.5:80 via 10.96.0.10"}) {
		t.Errorf("served %v, want the older victim's only", got)
	}
	if got := ExternalIPProblem(xipProblems(in)[ServiceKeyOf("aaa", "att")]); !strings.HasPrefix(got, "ExternalIPContested: ") {
		t.Errorf("att's problem %q, want ExternalIPContested", got)
	}
	want := netip.MustParseAddr("10.96.0.20")
	for _, v := range BoundServiceVIPs(in.Services, st.Bound) {
		if v.Name == "att" && !slices.Equal(v.VIPs, []netip.Addr{want}) {
			t.Errorf("views see att's VIPs as %v, want [%s]", v.VIPs, want)
		}
	}
	if r := NewServiceEnv(in).Compute(&in.Services[1], nil); !slices.Equal(r.VIPs, []netip.Addr{want}) {
		t.Errorf("att's result VIPs %v, want [%s]", r.VIPs, want)
	}
	// An old object with spec.clusterIP only (no clusterIPs) is seen too.
	old := svService("old", "", svHTTP)
	old.Spec.ClusterIP = "10.96.0.30"
	in.Services = []corev1.Service{old}
	if r := NewServiceEnv(in).Compute(&in.Services[0], nil); len(r.VIPs) != 1 {
		t.Errorf("clusterIP-only Service: VIPs %v", r.VIPs)
	}
}

// TestExternalIPOneOwnerPerAddress: an address belongs to one Service
// across ports and protocols. A newer Service naming the older one's
// external IP on another port or protocol is refused on all of them
// (reported as contested), and so is one naming a load balancer address,
// served or ipMode Proxy.
func TestExternalIPOneOwnerPerAddress(t *testing.T) {
	in := svInput()
	in.AllowedExternalIPs = []netip.Prefix{netip.MustParsePrefix("192.0.2.0/24")}
	victim := svService("victim", "10.96.0.10", []corev1.ServicePort{svPort("https", corev1.ProtocolTCP, 443)}, born(10, "b"), xips("192.0.2.5"))
	attPorts := []corev1.ServicePort{svPort("q", corev1.ProtocolUDP, 443), svPort("h", corev1.ProtocolTCP, 80)}
	att := svService("att", "10.96.0.20", attPorts, born(99, "z"), xips("192.0.2.5"))
	for _, order := range [][]corev1.Service{{victim, att}, {att, victim}} {
		in.Services = order
		if got := externalEntries(ComputeServices(in)); !slices.Equal(got, []string{"192.0.2.5:443 via 10.96.0.10"}) {
			t.Errorf("served %v, want only the victim's 443", got)
		}
		p := xipProblems(in)
		if got := ExternalIPProblem(p[ServiceKeyOf("default", "att")]); !strings.HasPrefix(got, "ExternalIPContested: ") ||
			!strings.Contains(got, "default/victim") {
			t.Errorf("att's problem %q, want ExternalIPContested naming default/victim", got)
		}
		if _, ok := p[ServiceKeyOf("default", "victim")]; ok {
			t.Errorf("the owner is reported: %v", p)
		}
	}

	for _, mode := range []*corev1.LoadBalancerIPMode{nil, ptrTo(corev1.LoadBalancerIPModeProxy)} {
		lb := svService("lb", "10.96.0.30", []corev1.ServicePort{svPort("https", corev1.ProtocolTCP, 443)}, born(500, "y"), func(s *corev1.Service) {
			s.Spec.Type = corev1.ServiceTypeLoadBalancer
			s.Status.LoadBalancer.Ingress = []corev1.LoadBalancerIngress{{IP: "192.0.2.9", IPMode: mode}}
		})
		att := svService("att", "10.96.0.20", attPorts, born(1, "a"), xips("192.0.2.9"))
		in.Services = []corev1.Service{att, lb}
		if got := externalEntries(ComputeServices(in)); len(got) != 0 {
			t.Errorf("ipMode %v: an external IP on a load balancer address is served: %v", mode, got)
		}
		if got := ExternalIPProblem(xipProblems(in)[ServiceKeyOf("default", "att")]); !strings.Contains(got, "ExternalIPContested") ||
			!strings.Contains(got, "default/lb") {
			t.Errorf("ipMode %v: att's problem %q", mode, got)
		}
	}
}

func ptrTo[T any](v T) *T { return &v }

// TestLoadBalancerUnknownClassHoldsNothing: a Service naming a Lace class
// that does not exist (made up, or deleted) holds no address: no class's
// namespaceSelector was checked for it. It used to keep what it held, so
// LoadBalancer -> NodePort -> LoadBalancer with a made-up class kept an
// address the real class refuses its namespace.
func TestLoadBalancerUnknownClassHoldsNothing(t *testing.T) {
	c := lbPool("p", true, "192.0.2.0/28")
	c.Spec.NamespaceSelector = &metav1.LabelSelector{MatchLabels: map[string]string{"lb": "yes"}}
	ghost := "lace-cni.io/ghost"
	s := lbSvc("held", 1, &ghost, v4only, "192.0.2.7")
	res := AllocateLoadBalancers([]lacev1.LoadBalancerClass{c}, []corev1.Service{s}, map[string]map[string]string{"ns": {}}, LBAvoid{})
	st, ok := res.Services["ns/held"]
	if !ok || len(st.IPs) != 0 || st.Reason != LBReasonNoClass {
		t.Errorf("Service of a made-up class: %+v (present %v), want no address and NoLoadBalancerClass", st, ok)
	}
}

// TestLoadBalancerPoolAvoids: a pool never hands out a reserved address
// (a node's, say) nor another Service's admitted external IP, whether
// free for the taking or asked for; a held reserved address is released;
// the class says what of its pool is excluded. A lone new Service's
// address follows its UID, not the lowest free one, so creating and
// deleting Services in order does not walk to a chosen address.
func TestLoadBalancerPoolAvoids(t *testing.T) {
	c := lbPool("p", true, "192.0.2.0/29") // .1 to .6
	avoid := LBAvoid{Reserved: []netip.Prefix{netip.MustParsePrefix("192.0.2.1/32"), netip.MustParsePrefix("192.0.2.2/31")},
		AllowedExternalIPs: []netip.Prefix{netip.MustParsePrefix("192.0.2.0/24")}}
	xip := svService("xip", "10.96.0.10", svHTTP, xips("192.0.2.4"))
	xip.Namespace = "ns"
	node := lbSvc("onnode", 1, nil, v4only, "192.0.2.2")
	ask := lbSvc("ask", 2, nil, v4only)
	ask.Spec.LoadBalancerIP = "192.0.2.4"
	var svcs = []corev1.Service{xip, node, ask}
	for i := range 3 {
		s := lbSvc("new"+string(rune('a'+i)), 10+i, nil, v4only)
		s.UID = types.UID("uid-" + string(rune('a'+i)))
		svcs = append(svcs, s)
	}
	res := AllocateLoadBalancers([]lacev1.LoadBalancerClass{c}, svcs, map[string]map[string]string{"ns": nil}, avoid)
	for k, st := range res.Services {
		for _, a := range st.IPs {
			if a.Less(netip.MustParseAddr("192.0.2.4")) || a == netip.MustParseAddr("192.0.2.4") {
				t.Errorf("%s got %s: reserved, or another Service's external IP", k, a)
			}
		}
	}
	if st := res.Services["ns/onnode"]; len(st.IPs) == 0 {
		t.Errorf("onnode: %+v, want a new address for the reserved one it held", st)
	}
	if st := res.Services["ns/ask"]; len(st.IPs) != 0 || st.Reason != LBReasonAddressConflict || !strings.Contains(st.Message, "external IP of ns/xip") {
		t.Errorf("ask for another Service's external IP: %+v, want AddressConflict", st)
	}
	if ex := res.Classes["p"].Excluded; !strings.Contains(ex, "192.0.2.1/32") || !strings.Contains(ex, "192.0.2.2/31") ||
		!strings.Contains(ex, "192.0.2.4 (external IP of ns/xip)") {
		t.Errorf("class p: Excluded %q", ex)
	}

	// Lone Services with different UIDs land all over the pool.
	big := lbPool("big", true, "198.51.100.0/24")
	seen := map[netip.Addr]bool{}
	for i := range 20 {
		s := lbSvc("lone", 1, nil, v4only)
		s.UID = types.UID("lone-" + string(rune('a'+i)))
		res := AllocateLoadBalancers([]lacev1.LoadBalancerClass{big}, []corev1.Service{s}, nil, LBAvoid{})
		seen[res.Services["ns/lone"].IPs[0]] = true
	}
	if len(seen) < 15 {
		t.Errorf("20 lone Services got %d distinct addresses: %v, want them spread by UID", len(seen), seen)
	}
}

// TestReservedHostsNodesAndAPIServer: every Node's status addresses
// (another NIC, a cloud ExternalIP) and the API server's (the
// default/kubernetes EndpointSlice) are reserved: an allowed external IP
// there is refused.
func TestReservedHostsNodesAndAPIServer(t *testing.T) {
	nodes := []corev1.Node{{Status: corev1.NodeStatus{Addresses: []corev1.NodeAddress{
		{Type: corev1.NodeInternalIP, Address: "172.30.0.11"}, {Type: corev1.NodeExternalIP, Address: "192.0.2.50"},
		{Type: corev1.NodeHostName, Address: "n1"}}}}}
	api := &discoveryv1.EndpointSlice{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "kubernetes",
		Labels: map[string]string{discoveryv1.LabelServiceName: "kubernetes"}},
		Endpoints: []discoveryv1.Endpoint{{Addresses: []string{"192.0.2.60"}}}}
	other := api.DeepCopy()
	other.Namespace, other.Endpoints[0].Addresses = "tenant", []string{"192.0.2.70"}
	got := ReservedHosts(nodes, []*discoveryv1.EndpointSlice{api, other})
	want := []netip.Prefix{netip.MustParsePrefix("172.30.0.11/32"), netip.MustParsePrefix("192.0.2.50/32"), netip.MustParsePrefix("192.0.2.60/32")}
	if !slices.Equal(got, want) {
		t.Fatalf("ReservedHosts %v, want %v (not a tenant's slice named kubernetes)", got, want)
	}
	in := svInput()
	in.Reserved = got
	in.AllowedExternalIPs = []netip.Prefix{netip.MustParsePrefix("192.0.2.0/24")}
	in.Services = []corev1.Service{svService("s", "10.96.0.10", svHTTP, xips("192.0.2.50", "192.0.2.60", "192.0.2.70"))}
	if got := externalEntries(ComputeServices(in)); !slices.Equal(got, []string{"192.0.2.70:80 via 10.96.0.10"}) {
		t.Errorf("served %v, want only 192.0.2.70 (not the node's ExternalIP nor the API server)", got)
	}
}

// TestParseAllowedExternalIPsCanonical: a CIDR with host bits set is
// refused with the two readings it may have meant, not silently widened.
func TestParseAllowedExternalIPsCanonical(t *testing.T) {
	_, _, err := ParseAllowedExternalIPs([]string{"198.51.100.0/24", "192.0.2.5/16"})
	if err == nil || !strings.Contains(err.Error(), "host bits") || !strings.Contains(err.Error(), "192.0.0.0/16") ||
		!strings.Contains(err.Error(), "192.0.2.5/32") {
		t.Errorf("192.0.2.5/16: %v, want a host bits error naming 192.0.0.0/16 and 192.0.2.5/32", err)
	}
	got, warn, err := ParseAllowedExternalIPs([]string{" 198.51.100.0/24", "203.0.113.7", "0.0.0.0/0", ""})
	if err != nil || len(got) != 3 || got[1] != netip.MustParsePrefix("203.0.113.7/32") || len(warn) != 1 {
		t.Errorf("canonical list: %v %v %v", got, warn, err)
	}
}

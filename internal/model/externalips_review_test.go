package model

import (
	"net/netip"
	"slices"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

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
	res := AllocateLoadBalancers([]lacev1.LoadBalancerClass{c}, []corev1.Service{s}, map[string]map[string]string{"ns": {}})
	st, ok := res.Services["ns/held"]
	if !ok || len(st.IPs) != 0 || st.Reason != LBReasonNoClass {
		t.Errorf("Service of a made-up class: %+v (present %v), want no address and NoLoadBalancerClass", st, ok)
	}
}

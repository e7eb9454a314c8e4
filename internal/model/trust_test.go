package model

import (
	"slices"
	"testing"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	lacev1 "github.com/lace-cni/lace/api/v1alpha1"
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
			Labels: map[string]string{labelNEPodUID: "uid-w", "lace-cni.io/node": "n1"}},
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

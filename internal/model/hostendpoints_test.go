package model

import (
	"net/netip"
	"testing"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
)

// TestHostEndpointsGate: an endpoint at a node's address is served only
// when it names a hostNetwork pod of the Service's namespace on that very
// node; one at the API server's address only for default/kubernetes.
// EndpointSlices of selector-less Services are the tenant's to write, so
// neither may come from the slice alone.
func TestHostEndpointsGate(t *testing.T) {
	node := func(name, addr string) corev1.Node {
		return corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name},
			Status: corev1.NodeStatus{Addresses: []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: addr}}}}
	}
	hostPod := func(ns, name, node, uid string) corev1.Pod {
		return corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, UID: types.UID(uid)},
			Spec: corev1.PodSpec{NodeName: node, HostNetwork: true}}
	}
	kube := svSlice("kubernetes", "kubernetes", []discoveryv1.EndpointPort{svSPort("https", corev1.ProtocolTCP, 6443)},
		svEp("172.30.0.1", ""))
	nodes := []corev1.Node{node("n1", "172.30.0.11"), node("n2", "172.30.0.12")}
	pods := []corev1.Pod{hostPod("default", "hn", "n2", "u1"), hostPod("other", "elsewhere", "n2", "u2")}
	cases := []struct {
		name  string
		ep    discoveryv1.Endpoint
		serve bool
	}{
		{"a hostNetwork pod on the address's node", svEp("172.30.0.12", "n2", targetPod("hn", "u1")), true},
		{"naming no pod", svEp("172.30.0.12", "n2"), false},
		{"a pod that is on another node", svEp("172.30.0.11", "n1", targetPod("hn", "u1")), false},
		{"a pod of another namespace", svEp("172.30.0.12", "n2", func(e *discoveryv1.Endpoint) {
			e.TargetRef = &corev1.ObjectReference{Kind: "Pod", Namespace: "other", Name: "elsewhere"}
		}), false},
		{"another pod's UID", svEp("172.30.0.12", "n2", targetPod("hn", "u9")), false},
		{"the API server's address", svEp("172.30.0.1", "", targetPod("hn", "u1")), false},
		{"an outside address", svEp("192.0.2.7", ""), true},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			in := svInput()
			web := svWeb(c.ep)
			in.Services = []corev1.Service{svService("web", "10.96.0.10", svHTTP),
				svService("kubernetes", "10.96.0.1", []corev1.ServicePort{svPort("https", corev1.ProtocolTCP, 443)})}
			in.EndpointSlices = []discoveryv1.EndpointSlice{web, kube}
			slices := []*discoveryv1.EndpointSlice{&in.EndpointSlices[0], &in.EndpointSlices[1]}
			in.HostEndpoints = NewHostEndpoints(nodes, nil, slices, pods)
			st := ComputeServices(in)
			served := map[string]bool{}
			for _, s := range st.Services {
				for _, b := range s.Backends {
					served[s.VIP.String()+"->"+b.Addr.String()] = true
				}
			}
			if got := served["10.96.0.10->"+c.ep.Addresses[0]]; got != c.serve {
				t.Errorf("endpoint %s served: %v, want %v", c.ep.Addresses[0], got, c.serve)
			}
			if !served["10.96.0.1->172.30.0.1"] {
				t.Errorf("default/kubernetes lost its API server endpoint")
			}
			// A refused endpoint is reported left out, with why (the
			// controller's annotation and Event).
			var reported []ExcludedEndpoint
			for _, x := range st.Excluded {
				if x.Refused != "" {
					reported = append(reported, x)
				}
			}
			if c.serve && len(reported) != 0 || !c.serve && (len(reported) != 1 || reported[0].Addr.String() != c.ep.Addresses[0] || reported[0].Service != "web") {
				t.Errorf("refused endpoints reported %+v; want %v", reported, map[bool]string{true: "none", false: c.ep.Addresses[0] + " of web"}[c.serve])
			}
		})
	}
	if (HostEndpoints{}).Refused(&corev1.Service{}, &discoveryv1.Endpoint{}, netip.MustParseAddr("172.30.0.12")) != "" {
		t.Error("the zero HostEndpoints refuses")
	}
}

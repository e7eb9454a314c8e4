package model

import (
	"net/netip"
	"testing"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// TestHostEndpointsSpecialAddrs: an EndpointSlice is the tenant's to
// write, and unlike Endpoints (ValidateNonSpecialIP) its validation lets
// loopback, link-local and unspecified addresses through. Served, such an
// endpoint points the node's own sockets (translate in sock.c) at
// 127.0.0.1:<any port> (etcd, the kubelet's healthz, containerd), and a
// frontend's flow from outside (xlb_in, ROUTE_EXTERNAL) at the link-local
// metadata server from the node's address. None may be served, whatever
// pod it names.
func TestHostEndpointsSpecialAddrs(t *testing.T) {
	nodes := []corev1.Node{{ObjectMeta: metav1.ObjectMeta{Name: "n1"},
		Status: corev1.NodeStatus{Addresses: []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: "172.30.0.11"}}}}}
	h := NewHostEndpoints(nodes, nil, nil, nil)
	svc := &corev1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "web"}}
	for _, a := range []string{"127.0.0.1", "127.1.2.3", "::1", "169.254.169.254", "fe80::1", "0.0.0.0", "::",
		"224.0.0.1", "ff02::1"} {
		ep := discoveryv1.Endpoint{Addresses: []string{a}}
		if why := h.Refused(svc, &ep, netip.MustParseAddr(a)); why == "" {
			t.Errorf("endpoint at %s served: want refused", a)
		}
	}
	// An ordinary outside address stays served.
	ep := discoveryv1.Endpoint{Addresses: []string{"192.0.2.7"}}
	if why := h.Refused(svc, &ep, netip.MustParseAddr("192.0.2.7")); why != "" {
		t.Errorf("outside endpoint refused: %s", why)
	}
}

package model

import (
	"fmt"
	"net/netip"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
)

// Hostile review rev18 (PoC, failing on purpose).
//
// TestRev18RefusedReportUnbounded: a tenant writes EndpointSlices of its
// own selector-less Service full of distinct loopback addresses (127/8:
// 16M of them; EndpointSlice validation lets them through). Each is
// refused and reported once per address, with no cap: the controller
// (internal/controller/service.go Reconcile) joins them all into the
// lace-cni.io/refused-endpoints annotation and, with ~60 bytes of reason
// each, into the EndpointRefused Event's message. Core/v1 Events have no
// message limit on the API (NoteLengthLimit applies to events.k8s.io
// only) and client-go's recorder does not truncate, so 19 slices of 1000
// endpoints (~1.1 MB of slices) keep the annotation under the 256 KiB
// object limit (the patch succeeds) and make every change of one address
// a ~1.4 MB Event (the spam filter admits 25 at once, then one per 5 min,
// per Service; Events live an hour), an amplification into etcd.
func TestRev18RefusedReportUnbounded(t *testing.T) {
	nodes := []corev1.Node{{ObjectMeta: metav1.ObjectMeta{Name: "n1"},
		Status: corev1.NodeStatus{Addresses: []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: "172.30.0.11"}}}}}
	in := svInput()
	in.Services = []corev1.Service{svService("web", "10.96.0.10", svHTTP)}
	n := 0
	for s := 0; s < 19; s++ {
		var eps []discoveryv1.Endpoint
		for i := 0; i < 1000; i++ {
			n++
			eps = append(eps, svEp(fmt.Sprintf("127.%d.%d.%d", n>>16, (n>>8)&255, n&255), ""))
		}
		in.EndpointSlices = append(in.EndpointSlices, svSlice("web", fmt.Sprintf("web-%d", s), svHTTPSlicePorts, eps...))
	}
	in.HostEndpoints = NewHostEndpoints(nodes, nil, nil, nil)
	st := ComputeServices(in)
	var refused, why []string
	for _, x := range st.Excluded {
		if x.Refused != "" {
			refused = append(refused, x.Addr.String())
			why = append(why, fmt.Sprintf("%s (%s)", x.Addr, x.Refused))
		}
	}
	annotation := strings.Join(refused, ",")
	message := "endpoints not served: " + strings.Join(why, ", ")
	t.Logf("%d refused: annotation %d bytes (object limit 262144), Event message %d bytes", len(refused), len(annotation), len(message))
	if len(annotation) >= 256*1024 {
		t.Fatalf("annotation over the object limit: the patch fails (and no Event) - retune the PoC")
	}
	if len(message) > 16*1024 {
		t.Errorf("one Service's EndpointRefused message is %d bytes: no cap on what a tenant's slices make the controller write", len(message))
	}
}

// TestRev18NodeAddressClaimedByAnotherNode: NewHostEndpoints maps each
// Node status address to the last node listing it (nodes come from an
// informer cache: no order). Node status is the kubelet's to write
// (NodeRestriction lets a node edit only its own, with any addresses), and
// only accepted UnderlayEndpoints override it. A compromised node n3
// listing n1's ExternalIP (not on n1's underlay) makes the gate refuse
// n1's real hostNetwork endpoints there (or, listed first, not) and admit
// an endpoint at n1's address naming a hostNetwork pod on n3.
func TestRev18NodeAddressClaimedByAnotherNode(t *testing.T) {
	node := func(name string, addrs ...string) corev1.Node {
		n := corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name}}
		for _, a := range addrs {
			n.Status.Addresses = append(n.Status.Addresses, corev1.NodeAddress{Type: corev1.NodeExternalIP, Address: a})
		}
		return n
	}
	hostPod := func(name, node string) corev1.Pod {
		return corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: name, UID: types.UID(name)},
			Spec: corev1.PodSpec{NodeName: node, HostNetwork: true}}
	}
	pods := []corev1.Pod{hostPod("ingress-n1", "n1"), hostPod("mine-n3", "n3")}
	svc := &corev1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "web"}}
	addr := netip.MustParseAddr("198.51.100.1")
	for _, order := range [][]corev1.Node{
		{node("n1", "198.51.100.1"), node("n3", "198.51.100.3", "198.51.100.1")},
		{node("n3", "198.51.100.3", "198.51.100.1"), node("n1", "198.51.100.1")},
	} {
		h := NewHostEndpoints(order, nil, nil, pods)
		real := discoveryv1.Endpoint{Addresses: []string{addr.String()}, TargetRef: &corev1.ObjectReference{Kind: "Pod", Name: "ingress-n1", UID: "ingress-n1"}}
		forged := discoveryv1.Endpoint{Addresses: []string{addr.String()}, TargetRef: &corev1.ObjectReference{Kind: "Pod", Name: "mine-n3", UID: "mine-n3"}}
		if why := h.Refused(svc, &real, addr); why != "" {
			t.Errorf("order %s,%s: n1's own hostNetwork endpoint refused: %s", order[0].Name, order[1].Name, why)
		}
		if why := h.Refused(svc, &forged, addr); why == "" {
			t.Errorf("order %s,%s: endpoint at n1's address naming a pod on n3 served", order[0].Name, order[1].Name)
		}
	}
}

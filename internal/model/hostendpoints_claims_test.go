package model

import (
	"net/netip"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	lacev1 "github.com/lace-cni/lace/api/v1alpha1"
)

// TestHostEndpointsAddressClaimedByTwoNodes: a Node's status is its
// kubelet's to write, with any addresses. A compromised node n3 listing
// n1's ExternalIP (not on n1's underlay) used to take that address in the
// gate when the informer listed n3 last (an endpoint at n1's address
// naming a hostNetwork pod on n3 was served; n1's own refused), or not,
// by list order. Now an address two nodes claim maps to neither, in any
// order: an endpoint there is refused with the claimants named; an
// accepted UnderlayEndpoint naming the address settles it for its node;
// n3's own address stays n3's.
func TestHostEndpointsAddressClaimedByTwoNodes(t *testing.T) {
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
	ep := func(addr netip.Addr, pod string) *discoveryv1.Endpoint {
		return &discoveryv1.Endpoint{Addresses: []string{addr.String()},
			TargetRef: &corev1.ObjectReference{Kind: "Pod", Name: pod, UID: types.UID(pod)}}
	}
	pods := []corev1.Pod{hostPod("ingress-n1", "n1"), hostPod("mine-n3", "n3")}
	svc := &corev1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "web"}}
	contested, n3own := netip.MustParseAddr("198.51.100.1"), netip.MustParseAddr("198.51.100.3")
	orders := [][]corev1.Node{
		{node("n1", "198.51.100.1"), node("n3", "198.51.100.3", "198.51.100.1")},
		{node("n3", "198.51.100.3", "198.51.100.1"), node("n1", "198.51.100.1")},
	}
	var first HostEndpoints
	for i, order := range orders {
		h := NewHostEndpoints(order, nil, nil, pods)
		if i == 0 {
			first = h
		} else if !h.Equal(first) {
			t.Errorf("the gate depends on the order the nodes are listed in")
		}
		for _, pod := range []string{"ingress-n1", "mine-n3"} {
			why := h.Refused(svc, ep(contested, pod), contested)
			if !strings.Contains(why, "n1, n3") {
				t.Errorf("order %s,%s: endpoint at %s (claimed by n1 and n3) naming %s: refused %q, want refused naming both claimants",
					order[0].Name, order[1].Name, contested, pod, why)
			}
		}
		if why := h.Refused(svc, ep(n3own, "mine-n3"), n3own); why != "" {
			t.Errorf("n3's own address, naming n3's hostNetwork pod: refused %q", why)
		}
		// An accepted UnderlayEndpoint names n1's address: n1's.
		ueps := []lacev1.UnderlayEndpoint{{Spec: lacev1.UnderlayEndpointSpec{Node: "n1", Addresses: []lacev1.IPAddress{"198.51.100.1"}}}}
		h = NewHostEndpoints(order, ueps, nil, pods)
		if why := h.Refused(svc, ep(contested, "ingress-n1"), contested); why != "" {
			t.Errorf("order %s,%s, underlay names n1: n1's own hostNetwork endpoint refused: %s", order[0].Name, order[1].Name, why)
		}
		if why := h.Refused(svc, ep(contested, "mine-n3"), contested); why == "" {
			t.Errorf("order %s,%s, underlay names n1: endpoint at n1's address naming a pod on n3 served", order[0].Name, order[1].Name)
		}
	}
}

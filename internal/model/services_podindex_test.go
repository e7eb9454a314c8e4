package model

import (
	"net/netip"
	"testing"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"

	lacev1 "github.com/lace-cni/lace/api/v1alpha1"
)

// TestPodIndexOfLooksUpEachOnce: the endpoints of a Service's slices
// look up each (node, address) and each target pod once, however many
// endpoints repeat them, and an endpoint on no node looks nothing up
// (ComputeServices reads nothing for it); what is found is indexed.
func TestPodIndexOfLooksUpEachOnce(t *testing.T) {
	ep := func(addr, node, pod string) discoveryv1.Endpoint {
		e := discoveryv1.Endpoint{Addresses: []string{addr}}
		if node != "" {
			e.NodeName = ptr.To(node)
		}
		if pod != "" {
			e.TargetRef = &corev1.ObjectReference{Kind: "Pod", Name: pod}
		}
		return e
	}
	sl := discoveryv1.EndpointSlice{ObjectMeta: metav1.ObjectMeta{Namespace: "a"}, Endpoints: []discoveryv1.Endpoint{
		ep("10.0.0.1", "n1", "p"), ep("10.0.0.1", "n1", "p"), ep("10.0.0.1", "n2", ""),
		ep("10.0.0.2", "", "q"), ep("::ffff:10.0.0.1", "n1", "")}}
	ne := &lacev1.NetworkEndpoint{ObjectMeta: metav1.ObjectMeta{Namespace: "a", Name: "p"},
		Spec: lacev1.NetworkEndpointSpec{Node: "n1", Network: "x", Addresses: []lacev1.IPAddress{"10.0.0.1"}}}
	addrs, names := map[string]int{}, map[types.NamespacedName]int{}
	ix, err := PodIndexOf([]discoveryv1.EndpointSlice{sl, sl}, func(node string, a netip.Addr) ([]*lacev1.NetworkEndpoint, error) {
		addrs[NodeAddrKey(node, a)]++
		if node == "n1" && a == netip.MustParseAddr("10.0.0.1") {
			return []*lacev1.NetworkEndpoint{ne}, nil
		}
		return nil, nil
	}, func(n types.NamespacedName) (*lacev1.NetworkEndpoint, error) {
		names[n]++
		return nil, nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if want := map[string]int{"n1/10.0.0.1": 1, "n2/10.0.0.1": 1}; len(addrs) != len(want) || addrs["n1/10.0.0.1"] != 1 || addrs["n2/10.0.0.1"] != 1 {
		t.Errorf("address lookups %v, want %v", addrs, want)
	}
	// p was found by its address first; q's endpoint is on no node.
	if len(names) != 0 {
		t.Errorf("name lookups %v, want none", names)
	}
	if ix.Get(types.NamespacedName{Namespace: "a", Name: "p"}) != ne {
		t.Errorf("the NetworkEndpoint found is not indexed")
	}
}

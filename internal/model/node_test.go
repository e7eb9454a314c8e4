package model

import (
	"net/netip"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	lacev1 "github.com/lace-cni/lace/api/v1alpha1"
	"github.com/lace-cni/lace/internal/tables"
)

func TestComputeNode(t *testing.T) {
	now := metav1.Now()
	nets := []lacev1.Network{
		{ObjectMeta: metav1.ObjectMeta{Name: "red", Labels: map[string]string{"vrf": "prod"}}, Spec: lacev1.NetworkSpec{Type: lacev1.NetworkTypeL3}, Status: lacev1.NetworkStatus{ID: 1}},
		{ObjectMeta: metav1.ObjectMeta{Name: "anon", Labels: map[string]string{"vrf": "prod"}}, Spec: lacev1.NetworkSpec{Type: lacev1.NetworkTypeL3, Anonymous: true}, Status: lacev1.NetworkStatus{ID: 2}},
		{ObjectMeta: metav1.ObjectMeta{Name: "new"}, Spec: lacev1.NetworkSpec{Type: lacev1.NetworkTypeL3}},
	}
	alloc := func(network, node, prefix string, deleting bool) lacev1.Allocation {
		a := lacev1.Allocation{Spec: lacev1.AllocationSpec{Network: network, Node: node, Prefixes: []lacev1.CIDR{lacev1.CIDR(prefix)}}}
		if deleting {
			a.DeletionTimestamp = &now
		}
		return a
	}
	in := NodeInput{
		Node:     "n1",
		Networks: nets,
		Allocations: []lacev1.Allocation{
			alloc("red", "n1", "10.1.1.0/24", false),
			alloc("red", "n2", "10.1.2.0/24", false),
			alloc("red", "n3", "10.1.3.0/24", true),  // being released: withdrawn
			alloc("new", "n2", "10.9.2.0/24", false), // no ID yet: not routed
			alloc("red", "n4", "10.1.4.0/24", false), // n4 has no locator yet
		},
		Underlays: []lacev1.UnderlayEndpoint{
			{Spec: lacev1.UnderlayEndpointSpec{Node: "n1", Addresses: []lacev1.IPAddress{"172.30.0.11", "fd00:30::11"}, Locator: "fd1a:ce:0:1::/64"}},
			{Spec: lacev1.UnderlayEndpointSpec{Node: "n2", Addresses: []lacev1.IPAddress{"172.30.0.12", "fd00:30::12"}, Locator: "fd1a:ce:0:2::/64"}},
		},
		RoutingPolicies: []lacev1.NetworkRoutingPolicy{{Spec: lacev1.NetworkRoutingPolicySpec{
			SrcSelector:  &metav1.LabelSelector{MatchLabels: map[string]string{"vrf": "prod"}},
			DestSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"vrf": "prod"}},
		}}},
	}
	st := ComputeNode(in)
	if st.Locator.String() != "fd1a:ce:0:1::/64" {
		t.Errorf("locator %s", st.Locator)
	}
	wantRoutes := []tables.Route{
		{NetID: 1, Prefix: netip.MustParsePrefix("10.1.1.0/24"), Local: true},
		{NetID: 1, Prefix: netip.MustParsePrefix("10.1.2.0/24"), SID: netip.MustParseAddr("fd1a:ce:0:2:100:0:0:1")},
	}
	if len(st.Routes) != len(wantRoutes) {
		t.Fatalf("routes %+v, want %+v", st.Routes, wantRoutes)
	}
	for i := range wantRoutes {
		if st.Routes[i] != wantRoutes[i] {
			t.Errorf("route %d: %+v, want %+v", i, st.Routes[i], wantRoutes[i])
		}
	}
	if len(st.Networks) != 2 || !st.Networks[1].Anonymous {
		t.Errorf("networks %+v", st.Networks)
	}
	if len(st.Policies) != 4 {
		t.Errorf("policies %+v, want the 4 pairs of the prod group", st.Policies)
	}
	if len(st.LocatorRoutes) != 1 || st.LocatorRoutes[0].Via.String() != "fd00:30::12" {
		t.Errorf("locator routes %+v", st.LocatorRoutes)
	}
	if len(st.Nodes) != 2 {
		t.Errorf("nodes %v", st.Nodes)
	}
	if len(st.Blocks) != 1 || st.Blocks[0].Prefix.String() != "10.1.1.0/24" {
		t.Errorf("blocks %+v", st.Blocks)
	}
}

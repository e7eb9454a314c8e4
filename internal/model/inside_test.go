package model

import (
	"net/netip"
	"reflect"
	"testing"

	lacev1 "github.com/lace-cni/lace/api/v1alpha1"
	"github.com/lace-cni/lace/internal/tables"
)

// TestInsidePrefixes: every pod network's subnet (with or without an ID or
// a block here), the service ranges and every node's locator (this node's
// too) are inside; external prefixes are not.
func TestInsidePrefixes(t *testing.T) {
	nets := []lacev1.Network{l3("red", nil, "10.1.0.0/16"), l3("new", nil, "10.9.0.0/16"), external("world", "0.0.0.0/0", "::/0")}
	nets[0].Status.ID, nets[2].Status.ID = 1, 3
	in := NodeInput{Node: "n1", Networks: nets, Underlays: testUnderlays,
		ServiceCIDRs: []netip.Prefix{netip.MustParsePrefix("10.96.0.0/12"), netip.MustParsePrefix("fd00:96::/108")}}
	st := ComputeNode(in)
	p := netip.MustParsePrefix
	want := []tables.Inside{
		{Prefix: p("10.1.0.0/16"), Kind: tables.InsidePodSubnet},
		{Prefix: p("10.9.0.0/16"), Kind: tables.InsidePodSubnet},
		{Prefix: p("10.96.0.0/12"), Kind: tables.InsideServiceRange},
		{Prefix: p("fd00:96::/108"), Kind: tables.InsideServiceRange},
		{Prefix: p("fd1a:ce:0:1::/64"), Kind: tables.InsideLocator},
		{Prefix: p("fd1a:ce:0:2::/64"), Kind: tables.InsideLocator},
	}
	if !reflect.DeepEqual(st.Inside, want) {
		t.Errorf("inside prefixes\n got %v\nwant %v", st.Inside, want)
	}
}

package lab

import (
	"net/netip"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	lacev1 "github.com/lace-cni/lace/api/v1alpha1"
	"github.com/lace-cni/lace/internal/model"
)

// demoOracleTopology is the demo's objects with the chart's defaults, every
// network given an ID as the controller would.
func demoOracleTopology() model.Topology {
	nets, _, nrps := demoTopology()
	t := model.Topology{}
	for _, n := range nets {
		t.Networks = append(t.Networks, *n)
	}
	t.Networks = append(t.Networks,
		lacev1.Network{ObjectMeta: metav1.ObjectMeta{Name: "default", Labels: map[string]string{lacev1.LabelNetwork: "default"}},
			Spec: lacev1.NetworkSpec{Type: lacev1.NetworkTypeL3,
				IPv4Subnet: &lacev1.Subnet{Prefix: "10.244.0.0/16", HostLocalPrefixLength: ptr.To[int32](24)},
				IPv6Subnet: &lacev1.Subnet{Prefix: "fd00:244::/56", HostLocalPrefixLength: ptr.To[int32](64)}}},
		lacev1.Network{ObjectMeta: metav1.ObjectMeta{Name: "world", Labels: map[string]string{lacev1.LabelNetwork: "world"}},
			Spec: lacev1.NetworkSpec{Type: lacev1.NetworkTypeExternal, ExternalPrefixes: []lacev1.CIDR{"0.0.0.0/0", "::/0"}}})
	for i := range t.Networks {
		t.Networks[i].Status.ID = int32(i + 1)
	}
	for _, p := range nrps {
		t.RoutingPolicies = append(t.RoutingPolicies, *p)
	}
	for _, pair := range [][2]string{{"default", "world"}, {"world", "default"}} {
		t.RoutingPolicies = append(t.RoutingPolicies, lacev1.NetworkRoutingPolicy{
			ObjectMeta: metav1.ObjectMeta{Name: pair[0] + "-to-" + pair[1]},
			Spec: lacev1.NetworkRoutingPolicySpec{
				SrcSelector:  &metav1.LabelSelector{MatchLabels: map[string]string{lacev1.LabelNetwork: pair[0]}},
				DestSelector: &metav1.LabelSelector{MatchLabels: map[string]string{lacev1.LabelNetwork: pair[1]}},
			}})
	}
	return t
}

// TestDemoTopologyShape checks that the objects the demo creates give the
// shape its legend promises, per the oracle, in both families.
func TestDemoTopologyShape(t *testing.T) {
	topo := demoOracleTopology()
	// A pod per network, on two nodes so that a sandbox pair is two pods.
	pod := func(network string, v4, v6 string, node string) [2]model.Endpoint {
		return [2]model.Endpoint{
			{Kind: model.EndpointPod, Network: network, Addr: netip.MustParseAddr(v4), NodeName: node},
			{Kind: model.EndpointPod, Network: network, Addr: netip.MustParseAddr(v6), NodeName: node},
		}
	}
	outside := func(v4, v6 netip.Addr) [2]model.Endpoint {
		return [2]model.Endpoint{{Kind: model.EndpointOutside, Addr: v4}, {Kind: model.EndpointOutside, Addr: v6}}
	}
	eps := map[string][2]model.Endpoint{
		"default":  pod("default", "10.244.1.2", "fd00:244:0:1::2", "n1"),
		"frontend": pod("frontend", "10.10.2.2", "fd00:10:0:2::2", "n2"),
		"backend":  pod("backend", "10.20.3.2", "fd00:20:0:3::2", "n3"),
		"shared":   pod("shared", "10.30.1.2", "fd00:31:0:1::2", "n1"),
		"sandbox1": pod("sandbox", "10.40.2.2", "fd00:40:0:2::2", "n2"),
		"sandbox2": pod("sandbox", "10.40.3.2", "fd00:40:0:3::2", "n3"),
		"world":    outside(ExternalUnderlay()),
		"partner":  outside(ExternalServedAddrs()),
	}
	allowed := map[[2]string]bool{
		{"frontend", "backend"}: true,
		{"frontend", "shared"}:  true,
		{"backend", "shared"}:   true,
		{"shared", "frontend"}:  true,
		{"shared", "backend"}:   true,
		{"frontend", "partner"}: true,
		{"default", "world"}:    true,
		{"world", "default"}:    true,
	}
	for src, se := range eps {
		for dst, de := range eps {
			if src == dst || (se[0].Kind == model.EndpointOutside && de[0].Kind == model.EndpointOutside) {
				continue
			}
			for f := range 2 {
				v := model.Reach(topo, se[f], de[f], "TCP", demoPort)
				if v.Allowed != allowed[[2]string{src, dst}] {
					t.Errorf("%s -> %s (%s): allowed %v, want %v: %s", src, dst, de[f].Addr, v.Allowed, !v.Allowed, v.Rule)
				}
			}
		}
	}
}

func TestDemoPods(t *testing.T) {
	c := DefaultConfig()
	got := demoPods(c)
	want := []demoPodSpec{
		{"default-n1", "default", "n1"}, {"frontend-n2", "frontend", "n2"}, {"backend-n3", "backend", "n3"},
		{"shared-n1", "shared", "n1"}, {"sandbox1-n2", "sandbox", "n2"}, {"sandbox2-n3", "sandbox", "n3"},
	}
	if len(got) != len(want) {
		t.Fatalf("demoPods = %v, want %v", got, want)
	}
	for i := range want {
		if got[i] != want[i] {
			t.Errorf("pod %d = %v, want %v", i, got[i], want[i])
		}
	}
	// One node: the two sandbox pods still get distinct names.
	c.Nodes = 1
	seen := map[string]bool{}
	for _, p := range demoPods(c) {
		if seen[p.name] {
			t.Errorf("one node: pod name %s twice", p.name)
		}
		seen[p.name] = true
	}
}

func TestDemoCellText(t *testing.T) {
	yes, no := model.Verdict{Allowed: true}, model.Verdict{}
	for _, tc := range []struct {
		c    demoCell
		want string
	}{
		{demoCell{skip: true}, "-"},
		{demoCell{measured: [2]bool{true, true}, expected: [2]model.Verdict{yes, yes}}, "yes (yes)"},
		{demoCell{measured: [2]bool{true, false}, expected: [2]model.Verdict{yes, yes}}, "v4 only (yes) !"},
		{demoCell{measured: [2]bool{false, true}, expected: [2]model.Verdict{no, yes}}, "v6 only (v6 only)"},
		{demoCell{expected: [2]model.Verdict{no, no}}, "no (no)"},
	} {
		if got := tc.c.text(); got != tc.want {
			t.Errorf("text() = %q, want %q", got, tc.want)
		}
	}
}

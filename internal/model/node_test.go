package model

import (
	"fmt"
	"net/netip"
	"reflect"
	"sort"
	"strings"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	lacev1 "github.com/lace-cni/lace/api/v1alpha1"
	"github.com/lace-cni/lace/internal/tables"
)

// The two nodes of the view tests: n1 is the node computed, n2 another.
var testUnderlays = []lacev1.UnderlayEndpoint{
	{Spec: lacev1.UnderlayEndpointSpec{Node: "n1", Addresses: []lacev1.IPAddress{"172.30.0.11", "fd00:30::11"}, Locator: "fd1a:ce:0:1::/64"}},
	{Spec: lacev1.UnderlayEndpointSpec{Node: "n2", Addresses: []lacev1.IPAddress{"172.30.0.12", "fd00:30::12"}, Locator: "fd1a:ce:0:2::/64"}},
}

func alloc(network, node string, prefixes ...string) lacev1.Allocation {
	a := lacev1.Allocation{ObjectMeta: metav1.ObjectMeta{Name: network + "." + node},
		Spec: lacev1.AllocationSpec{Network: network, Node: node}}
	for _, p := range prefixes {
		a.Spec.Prefixes = append(a.Spec.Prefixes, lacev1.CIDR(p))
	}
	return a
}

func TestComputeNode(t *testing.T) {
	now := metav1.Now()
	deleting := alloc("red", "n3", "10.1.3.0/24")
	deleting.DeletionTimestamp = &now
	nets := []lacev1.Network{
		l3("red", map[string]string{"vrf": "prod"}, "10.1.0.0/16"),
		anon(l3("anon", map[string]string{"vrf": "prod"}, "10.5.0.0/16")),
		l3("new", nil, "10.9.0.0/16"),
	}
	nets[0].Status.ID, nets[1].Status.ID = 1, 2
	in := NodeInput{
		Node:     "n1",
		Networks: nets,
		Allocations: []lacev1.Allocation{
			alloc("red", "n1", "10.1.1.0/24"),
			alloc("red", "n2", "10.1.2.0/24"),
			deleting,                          // being released: withdrawn
			alloc("new", "n2", "10.9.2.0/24"), // no ID yet: not routed
			alloc("red", "n4", "10.1.4.0/24"), // n4 has no locator yet
		},
		Underlays: testUnderlays,
	}
	st := ComputeNode(in)
	if st.Locator.String() != "fd1a:ce:0:1::/64" {
		t.Errorf("locator %s", st.Locator)
	}
	p := netip.MustParsePrefix
	wantRoutes := []tables.Route{
		{NetID: 1, Prefix: p("10.1.0.0/16"), Kind: tables.RouteSubnet, DstNet: 1},
		{NetID: 1, Prefix: p("10.1.1.0/24"), Kind: tables.RouteLocal, DstNet: 1},
		{NetID: 1, Prefix: p("10.1.2.0/24"), Kind: tables.RouteRemote, DstNet: 1, SID: netip.MustParseAddr("fd1a:ce:0:2:100:1:0:1")},
		// Other pod networks' subnets are denied, never outside addresses.
		{NetID: 1, Prefix: p("10.5.0.0/16"), Kind: tables.RouteDeny, DstNet: 2},
		{NetID: 2, Prefix: p("10.1.0.0/16"), Kind: tables.RouteDeny, DstNet: 1},
		// Anonymous, and no policy at all: its own subnet stays, closed.
		{NetID: 2, Prefix: p("10.5.0.0/16"), Kind: tables.RouteSubnet, DstNet: 2, Closed: true},
		// The nodes' own context: the other nodes' addresses at their
		// locators (n4 has none yet).
		{NetID: tables.NodeNetID, Prefix: p("172.30.0.12/32"), Kind: tables.RouteRemote, DstNet: tables.NodeNetID,
			SID: netip.MustParseAddr("fd1a:ce:0:2:100:ffff:0:ffff")},
		{NetID: tables.NodeNetID, Prefix: p("fd00:30::12/128"), Kind: tables.RouteRemote, DstNet: tables.NodeNetID,
			SID: netip.MustParseAddr("fd1a:ce:0:2:100:ffff:0:ffff")},
	}
	if !reflect.DeepEqual(st.Routes, wantRoutes) {
		t.Errorf("routes\n%+v, want\n%+v", st.Routes, wantRoutes)
	}
	if len(st.Networks) != 3 || !st.Networks[1].Anonymous || st.Networks[2].ID != tables.NodeNetID {
		t.Errorf("networks %+v", st.Networks)
	}
	if len(st.Classifiers) != 0 {
		t.Errorf("classifiers %+v without external networks", st.Classifiers)
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

var kindNames = map[tables.RouteKind]string{tables.RouteRemote: "remote", tables.RouteLocal: "local",
	tables.RouteSubnet: "subnet", tables.RouteExternal: "external", tables.RouteDeny: "deny"}

// views renders the routes of a state as "prefix kind network[ closed]",
// per source network name.
func views(nets []lacev1.Network, st NodeState) map[string][]string {
	names := map[uint32]string{}
	for _, n := range nets {
		names[uint32(n.Status.ID)] = n.Name
	}
	out := map[string][]string{}
	for _, r := range st.Routes {
		s := fmt.Sprintf("%s %s %s", r.Prefix, kindNames[r.Kind], names[r.DstNet])
		if r.Closed {
			s += " closed"
		}
		out[names[r.NetID]] = append(out[names[r.NetID]], s)
	}
	for _, v := range out {
		sort.Strings(v)
	}
	return out
}

// blocks12 gives every l3 network with an IPv4 subnet a.b.0.0/16 the blocks
// a.b.1.0/24 on n1 and a.b.2.0/24 on n2.
func blocks12(nets []lacev1.Network) []lacev1.Allocation {
	var out []lacev1.Allocation
	for _, n := range nets {
		if n.Spec.Type != lacev1.NetworkTypeL3 || n.Spec.IPv4Subnet == nil {
			continue
		}
		b := netip.MustParsePrefix(string(n.Spec.IPv4Subnet.Prefix)).Addr().As4()
		out = append(out, alloc(n.Name, "n1", fmt.Sprintf("%d.%d.1.0/24", b[0], b[1])),
			alloc(n.Name, "n2", fmt.Sprintf("%d.%d.2.0/24", b[0], b[1])))
	}
	return out
}

func own(prefix16 string, name string, closed bool) []string {
	c := ""
	if closed {
		c = " closed"
	}
	base := strings.TrimSuffix(prefix16, "0.0/16")
	return []string{prefix16 + " subnet " + name + c, base + "1.0/24 local " + name + c, base + "2.0/24 remote " + name + c}
}

func cat(parts ...[]string) []string {
	var out []string
	for _, p := range parts {
		out = append(out, p...)
	}
	sort.Strings(out)
	return out
}

func TestViews(t *testing.T) {
	prod := map[string]string{"vrf": "prod"}
	red, blue, green := own("10.1.0.0/16", "red", false), own("10.2.0.0/16", "blue", false), own("10.3.0.0/16", "green", false)
	for _, c := range []struct {
		name string
		nets []lacev1.Network
		pols []lacev1.NetworkRoutingPolicy
		// want are the views checked (others are not).
		want map[string][]string
	}{
		{name: "isolation: each network sees its own only",
			nets: []lacev1.Network{l3("red", nil, "10.1.0.0/16"), l3("blue", nil, "10.2.0.0/16")},
			want: map[string][]string{"red": cat(red, []string{"10.2.0.0/16 deny blue"}), "blue": cat([]string{"10.1.0.0/16 deny red"}, blue)}},
		{name: "one-way policy",
			nets: []lacev1.Network{l3("red", nil, "10.1.0.0/16"), l3("blue", nil, "10.2.0.0/16")},
			pols: []lacev1.NetworkRoutingPolicy{byName("red", "blue")},
			want: map[string][]string{"red": cat(red, blue), "blue": cat([]string{"10.1.0.0/16 deny red"}, blue)}},
		{name: "mesh: one label on both sides, l2 networks included",
			nets: []lacev1.Network{l3("red", prod, "10.1.0.0/16"), l3("blue", prod, "10.2.0.0/16"),
				l3("green", nil, "10.3.0.0/16"), l2("flat", prod, "10.4.0.0/16")},
			pols: []lacev1.NetworkRoutingPolicy{nrp("mesh", prod, prod)},
			want: map[string][]string{"red": cat(red, blue, []string{"10.3.0.0/16 deny green", "10.4.0.0/16 subnet flat"}),
				"blue":  cat(red, blue, []string{"10.3.0.0/16 deny green", "10.4.0.0/16 subnet flat"}),
				"green": cat([]string{"10.1.0.0/16 deny red", "10.2.0.0/16 deny blue"}, green, []string{"10.4.0.0/16 deny flat"}),
				"flat":  cat(red, blue, []string{"10.3.0.0/16 deny green", "10.4.0.0/16 subnet flat"})}},
		{name: "anonymous without self policy: own entries closed, peers open",
			nets: []lacev1.Network{anon(l3("red", prod, "10.1.0.0/16")), l3("blue", nil, "10.2.0.0/16")},
			// Selected as source by one policy and destination by another,
			// on both sides by none.
			pols: []lacev1.NetworkRoutingPolicy{byName("red", "blue"), nrp("into-prod", map[string]string{netLabel: "blue"}, prod)},
			want: map[string][]string{"red": cat(own("10.1.0.0/16", "red", true), blue), "blue": cat(blue, red)}},
		{name: "anonymous opened by a self policy",
			nets: []lacev1.Network{anon(l3("red", nil, "10.1.0.0/16"))},
			pols: []lacev1.NetworkRoutingPolicy{byName("red", "red")},
			want: map[string][]string{"red": red}},
		{name: "overlapping peers: the later is refused, the other stays",
			nets: []lacev1.Network{l3("red", nil, "10.1.0.0/16"), l3("blue", nil, "10.2.0.0/16"),
				l3("cyan", nil, "10.2.0.0/16"), l3("shadow", nil, "10.1.128.0/17"), l3("green", nil, "10.3.0.0/16")},
			// blue comes before cyan by network name in one policy; shadow
			// overlaps red's own subnet; green is granted by a later policy.
			pols: []lacev1.NetworkRoutingPolicy{nrp("a-peers", map[string]string{netLabel: "red"}, nil), byName("red", "green")},
			want: map[string][]string{"red": cat(red, blue, green)}},
		{name: "world does not reach into a more specific external network outside the view",
			nets: []lacev1.Network{l3("red", nil, "10.1.0.0/16"), external("world", "0.0.0.0/0", "::/0"), external("corp", "192.168.0.0/16")},
			pols: []lacev1.NetworkRoutingPolicy{byName("red", "world")},
			want: map[string][]string{
				"red":  cat(red, []string{"0.0.0.0/0 external world", "::/0 external world", "192.168.0.0/16 deny corp"}),
				"corp": {"0.0.0.0/0 deny world", "10.1.0.0/16 deny red", "192.168.0.0/16 external corp", "::/0 deny world"},
			}},
		{name: "a pod subnet of the view holds an out-of-view external prefix: no deny",
			nets: []lacev1.Network{l3("red", nil, "10.1.0.0/16"), external("world", "0.0.0.0/0"), external("corp", "10.1.5.0/24")},
			pols: []lacev1.NetworkRoutingPolicy{byName("red", "world")},
			want: map[string][]string{"red": cat(red, []string{"0.0.0.0/0 external world"})}},
		{name: "the external network's own view: its prefixes and the pod networks it may reach",
			nets: []lacev1.Network{l3("red", nil, "10.1.0.0/16"), l3("blue", nil, "10.2.0.0/16"),
				external("world", "0.0.0.0/0", "::/0"), external("corp", "192.168.0.0/16")},
			pols: []lacev1.NetworkRoutingPolicy{byName("world", "red")},
			want: map[string][]string{
				"world": cat(red, []string{"0.0.0.0/0 external world", "10.2.0.0/16 deny blue", "::/0 external world", "192.168.0.0/16 deny corp"}),
				"corp":  {"0.0.0.0/0 deny world", "10.1.0.0/16 deny red", "10.2.0.0/16 deny blue", "192.168.0.0/16 external corp", "::/0 deny world"},
			}},
		{name: "two external networks with the same prefix: the earlier name owns it",
			nets: []lacev1.Network{l3("red", nil, "10.1.0.0/16"), external("corp", "192.168.0.0/16"), external("alt", "192.168.0.0/16")},
			pols: []lacev1.NetworkRoutingPolicy{byName("red", "corp")},
			want: map[string][]string{"red": cat(red, []string{"192.168.0.0/16 deny alt"})}},
		{name: "a nil selector selects nothing",
			nets: []lacev1.Network{l3("red", nil, "10.1.0.0/16"), l3("blue", nil, "10.2.0.0/16")},
			pols: []lacev1.NetworkRoutingPolicy{{ObjectMeta: metav1.ObjectMeta{Name: "nil-dst"},
				Spec: lacev1.NetworkRoutingPolicySpec{SrcSelector: &metav1.LabelSelector{}}}},
			want: map[string][]string{"red": cat(red, []string{"10.2.0.0/16 deny blue"})}},
		{name: "an external prefix of the view more specific than a pod subnet takes the blocks inside it",
			// lab (10.1.0.0/23) holds red's block on n1; an outside
			// address in corp (inside lab, not in the view) still
			// resolves to red's block, which therefore reappears there.
			nets: []lacev1.Network{l3("red", nil, "10.1.0.0/16"), external("lab", "10.1.0.0/23"), external("corp", "10.1.1.128/25")},
			pols: []lacev1.NetworkRoutingPolicy{byName("red", "lab")},
			want: map[string][]string{"red": {"10.1.0.0/16 subnet red", "10.1.0.0/23 external lab", "10.1.1.128/25 local red", "10.1.2.0/24 remote red"}}},
	} {
		t.Run(c.name, func(t *testing.T) {
			nets := topology(c.nets, c.pols...).Networks
			st := ComputeNode(NodeInput{Node: "n1", Networks: nets, Allocations: blocks12(nets), Underlays: testUnderlays,
				RoutingPolicies: c.pols})
			got := views(nets, st)
			for name, want := range c.want {
				if !reflect.DeepEqual(got[name], want) {
					t.Errorf("view of %s:\n  %s\nwant\n  %s", name, strings.Join(got[name], "\n  "), strings.Join(want, "\n  "))
				}
			}
		})
	}
}

func l2(name string, kv map[string]string, prefix string) lacev1.Network {
	n := l3(name, kv)
	n.Spec.Type = lacev1.NetworkTypeL2
	n.Spec.IPv4Subnet = &lacev1.Subnet{Prefix: lacev1.CIDR(prefix)}
	return n
}

// TestViewSIDs: a remote block's SID names the node's locator, the source
// network (the view) and the destination network, 16 bits each.
func TestViewSIDs(t *testing.T) {
	nets := []lacev1.Network{l3("red", nil, "10.1.0.0/16"), l3("blue", nil, "10.2.0.0/16")}
	nets[0].Status.ID, nets[1].Status.ID = 0x1234, 0xfffe
	pols := []lacev1.NetworkRoutingPolicy{byName("red", "blue")}
	st := ComputeNode(NodeInput{Node: "n1", Networks: nets, Allocations: blocks12(nets), Underlays: testUnderlays, RoutingPolicies: pols})
	want := map[string]string{
		"4660 10.1.2.0/24":  "fd1a:ce:0:2:100:1234:0:1234", // red's own block: red -> red
		"4660 10.2.2.0/24":  "fd1a:ce:0:2:100:1234:0:fffe", // red -> blue
		"65534 10.2.2.0/24": "fd1a:ce:0:2:100:fffe:0:fffe", // blue's own
		// The nodes' context: n2's addresses.
		"65535 172.30.0.12/32":  "fd1a:ce:0:2:100:ffff:0:ffff",
		"65535 fd00:30::12/128": "fd1a:ce:0:2:100:ffff:0:ffff",
	}
	got := map[string]string{}
	for _, r := range st.Routes {
		if r.Kind == tables.RouteRemote {
			got[fmt.Sprint(r.NetID, " ", r.Prefix)] = r.SID.String()
		}
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("SIDs %v, want %v", got, want)
	}
}

func TestClassifiers(t *testing.T) {
	nets := topology([]lacev1.Network{l3("red", nil, "10.1.0.0/16"), external("world", "0.0.0.0/0", "::/0"),
		external("corp", "192.168.0.0/16", "10.0.0.0/8"), external("alt", "192.168.0.0/16")}).Networks
	st := ComputeNode(NodeInput{Node: "n1", Networks: nets})
	var got []string
	for _, c := range st.Classifiers {
		got = append(got, fmt.Sprint(c.Prefix, " ", c.NetID))
	}
	// IDs in order: red 1, world 2, corp 3, alt 4.
	want := []string{"0.0.0.0/0 2", "10.0.0.0/8 3", "192.168.0.0/16 4", "::/0 2"}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("classifiers %v, want %v", got, want)
	}
}

// BenchmarkComputeNode: a mesh of 20 dual-stack networks with a block on
// each of 200 nodes, and a few external networks.
func BenchmarkComputeNode(b *testing.B) {
	in := NodeInput{Node: "n0"}
	mesh := map[string]string{"mesh": "yes"}
	for i := range 20 {
		n := l3(fmt.Sprintf("net%02d", i), mesh, fmt.Sprintf("10.%d.0.0/16", i), fmt.Sprintf("fd00:%x::/48", i))
		n.Status.ID = int32(i + 1)
		in.Networks = append(in.Networks, n)
		for j := range 200 {
			in.Allocations = append(in.Allocations, alloc(n.Name, fmt.Sprintf("n%d", j),
				fmt.Sprintf("10.%d.%d.0/24", i, j), fmt.Sprintf("fd00:%x:0:%x::/64", i, j)))
		}
	}
	for j := range 200 {
		in.Underlays = append(in.Underlays, lacev1.UnderlayEndpoint{Spec: lacev1.UnderlayEndpointSpec{Node: fmt.Sprintf("n%d", j),
			Addresses: []lacev1.IPAddress{lacev1.IPAddress(fmt.Sprintf("fd00:30::%x", j+1))}, Locator: lacev1.CIDR(fmt.Sprintf("fd1a:ce:0:%x::/64", j+1))}})
	}
	w, c := external("world", "0.0.0.0/0", "::/0"), external("corp", "192.168.0.0/16", "10.5.3.0/24", "172.16.0.0/12")
	w.Status.ID, c.Status.ID = 100, 101
	w.Labels["mesh"] = "yes"
	in.Networks = append(in.Networks, w, c)
	in.RoutingPolicies = []lacev1.NetworkRoutingPolicy{nrp("mesh", mesh, mesh)}
	b.ResetTimer()
	for range b.N {
		st := ComputeNode(in)
		if len(st.Routes) < 20*20*400 {
			b.Fatalf("%d routes", len(st.Routes))
		}
	}
}

// TestServiceRoutes: a VIP is in the view of its service's network (unless
// that network is anonymous and closed), of every network a policy grants
// the service's network, and of the sources of a ServiceRoutingPolicy
// selecting the network (by name or labels) in a matching namespace.
func TestServiceRoutes(t *testing.T) {
	nets := topology([]lacev1.Network{l3("red", map[string]string{"tier": "db"}, "10.1.0.0/16"), l3("blue", nil, "10.2.0.0/16"),
		l3("green", nil, "10.3.0.0/16"), l3("pink", nil, "10.4.0.0/16"), anon(l3("shy", nil, "10.5.0.0/16"))}).Networks
	vip := netip.MustParseAddr("10.96.0.10")
	vip6 := netip.MustParseAddr("fd00:96::10")
	srp := func(name string, src string, dst lacev1.ServiceSelector, ns map[string]string) lacev1.ServiceRoutingPolicy {
		p := lacev1.ServiceRoutingPolicy{ObjectMeta: metav1.ObjectMeta{Name: name}, Spec: lacev1.ServiceRoutingPolicySpec{
			SrcSelector: &metav1.LabelSelector{MatchLabels: map[string]string{netLabel: src}}, DestSelector: dst}}
		if ns != nil {
			p.Spec.NamespaceSelector = &metav1.LabelSelector{MatchLabels: ns}
		}
		return p
	}
	in := NodeInput{Node: "n1", Networks: nets, Allocations: blocks12(nets), Underlays: testUnderlays,
		RoutingPolicies: []lacev1.NetworkRoutingPolicy{byName("blue", "red")},
		Services: []ServiceVIPs{
			{Namespace: "prod", Name: "db", Network: "red", VIPs: []netip.Addr{vip, vip6}},
			{Namespace: "dev", Name: "db", Network: "red", VIPs: []netip.Addr{netip.MustParseAddr("10.96.0.11")}},
			{Namespace: "prod", Name: "quiet", Network: "shy", VIPs: []netip.Addr{netip.MustParseAddr("10.96.0.12")}},
		},
		ServiceRoutingPolicies: []lacev1.ServiceRoutingPolicy{
			srp("green-to-db", "green", lacev1.ServiceSelector{MatchLabels: map[string]string{"tier": "db"}}, map[string]string{"env": "prod"}),
			srp("pink-to-red", "pink", lacev1.ServiceSelector{Name: "red"}, nil),
		},
		Namespaces: map[string]map[string]string{"prod": {"env": "prod"}, "dev": {"env": "dev"}},
	}
	st := ComputeNode(in)
	ids := NetworkIDs(nets)
	got := map[string][]string{}
	for _, r := range st.Routes {
		if r.Kind != tables.RouteService {
			continue
		}
		for name, id := range ids {
			if id == r.NetID {
				got[name] = append(got[name], r.Prefix.String())
				if r.DstNet != ids["red"] && r.DstNet != ids["shy"] {
					t.Errorf("VIP %s in %s's view names network %d", r.Prefix, name, r.DstNet)
				}
			}
		}
	}
	want := map[string][]string{
		"red":   {"10.96.0.10/32", "10.96.0.11/32", "fd00:96::10/128"}, // own services
		"blue":  {"10.96.0.10/32", "10.96.0.11/32", "fd00:96::10/128"}, // blue -> red
		"green": {"10.96.0.10/32", "fd00:96::10/128"},                  // SRP by label, prod only
		"pink":  {"10.96.0.10/32", "10.96.0.11/32", "fd00:96::10/128"}, // SRP by name
	}
	for _, name := range []string{"red", "blue", "green", "pink", "shy"} {
		sort.Strings(got[name])
		if !reflect.DeepEqual(got[name], want[name]) {
			t.Errorf("VIPs in the view of %s: %v, want %v", name, got[name], want[name])
		}
	}
	// An SRP grants the VIP, not the network.
	for _, r := range st.Routes {
		if r.NetID == ids["green"] && r.DstNet == ids["red"] && r.Kind != tables.RouteService && r.Kind != tables.RouteDeny {
			t.Errorf("green's view holds %s of red (%v): an SRP grants VIPs only", r.Prefix, r.Kind)
		}
	}
}

// TestUngrantedVIPIsDenied: a VIP the view does not reach is denied (by
// the service range's deny entry) where an external prefix of the view
// (world) would otherwise take it out with SNAT.
func TestUngrantedVIPIsDenied(t *testing.T) {
	nets := topology([]lacev1.Network{l3("red", nil, "10.1.0.0/16"), l3("blue", nil, "10.2.0.0/16"),
		external("world", "0.0.0.0/0")}).Networks
	vip := netip.MustParseAddr("10.96.0.10")
	st := ComputeNode(NodeInput{Node: "n1", Networks: nets, Allocations: blocks12(nets), Underlays: testUnderlays,
		RoutingPolicies: []lacev1.NetworkRoutingPolicy{byName("red", "world")},
		Services:        []ServiceVIPs{{Namespace: "x", Name: "db", Network: "blue", VIPs: []netip.Addr{vip}}},
		ServiceCIDRs:    []netip.Prefix{netip.MustParsePrefix("10.96.0.0/16")}})
	ids := NetworkIDs(nets)
	kinds := map[uint32]tables.RouteKind{}
	for _, r := range st.Routes {
		if r.Prefix == netip.PrefixFrom(vip, 32) {
			kinds[r.NetID] = r.Kind
		}
	}
	if r, ok := lpm(st.Routes, ids["red"], vip); !ok || r.Kind != tables.RouteDeny {
		t.Errorf("blue's VIP resolves in red's view (world in it) to %+v (%v), want a deny entry", r, ok)
	}
	if k := kinds[ids["blue"]]; k != tables.RouteService {
		t.Errorf("blue's own VIP: %v, want a service entry", k)
	}
	// The rest of the service range is denied where world would take it.
	var denied bool
	for _, r := range st.Routes {
		if r.NetID == ids["red"] && r.Prefix == netip.MustParsePrefix("10.96.0.0/16") {
			denied = r.Kind == tables.RouteDeny
		}
	}
	if !denied {
		t.Errorf("red's view does not deny the service range")
	}
}

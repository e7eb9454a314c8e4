package model

import (
	"fmt"
	"net/netip"
	"reflect"
	"strings"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	lacev1 "github.com/lace-cni/lace/api/v1alpha1"
)

// nbr and fdb are held for the holder named after their MAC: a
// Neighbor joins the FDBEntry of its MAC.
func nbr(network, addr, mac string) lacev1.Neighbor {
	return lacev1.Neighbor{ObjectMeta: metav1.ObjectMeta{Name: network + "." + addr, Labels: map[string]string{lacev1.LabelEndpointUID: "uid-" + strings.ToLower(mac)}},
		Spec: lacev1.NeighborSpec{Network: network, Address: lacev1.IPAddress(addr), MAC: lacev1.MACAddress(mac)}}
}

func fdb(network, mac, node string) lacev1.FDBEntry {
	return lacev1.FDBEntry{ObjectMeta: metav1.ObjectMeta{Name: network + "." + mac, Labels: map[string]string{lacev1.LabelEndpointUID: "uid-" + strings.ToLower(mac)}},
		Spec: lacev1.FDBEntrySpec{Network: network, MAC: lacev1.MACAddress(mac), Node: node}}
}

// TestL2HostRoutes: an l2 subnet spans nodes, so views route its addresses
// one by one to the node their MAC lives on (Neighbor, then FDBEntry), in
// the network's own view and in every view a policy opens to it; an
// address without a located MAC, outside the subnet, or on a node without
// a locator is not routed (the subnet's entry answers no-endpoint).
func TestL2HostRoutes(t *testing.T) {
	nets := []lacev1.Network{l2("vms", map[string]string{"t": "a"}, "10.50.0.0/24"), l3("red", map[string]string{"t": "b"}, "10.1.0.0/16")}
	nets[0].Status.ID, nets[1].Status.ID = 5, 1
	now := metav1.Now()
	gone := fdb("vms", "0a:58:0a:32:00:09", "n1")
	gone.DeletionTimestamp = &now
	stray := nbr("vms", "10.50.0.8", "0a:58:0a:32:00:03")
	stray.Labels[lacev1.LabelEndpointUID] = "another"
	in := NodeInput{Node: "n1", Networks: nets, Allocations: blocks12(nets), Underlays: testUnderlays,
		RoutingPolicies: []lacev1.NetworkRoutingPolicy{byName("red", "vms")},
		Neighbors: []lacev1.Neighbor{
			nbr("vms", "10.50.0.2", "0a:58:0a:32:00:02"), // here
			nbr("vms", "10.50.0.3", "0a:58:0a:32:00:03"), // on n2
			nbr("vms", "10.50.0.4", "0a:58:0a:32:00:04"), // its MAC is nowhere
			nbr("vms", "10.50.0.5", "0a:58:0a:32:00:05"), // on n4, without a locator
			nbr("vms", "10.99.0.6", "0a:58:0a:32:00:06"), // outside the subnet
			nbr("vms", "10.50.0.9", "0a:58:0a:32:00:09"), // its FDBEntry is being deleted
			nbr("red", "10.1.1.7", "0a:58:0a:01:01:07"),  // not an l2 network
			stray, // another holder's MAC
		},
		FDBEntries: []lacev1.FDBEntry{
			fdb("vms", "0A:58:0A:32:00:02", "n1"), fdb("vms", "0a:58:0a:32:00:03", "n2"), fdb("vms", "0a:58:0a:32:00:05", "n4"),
			fdb("vms", "0a:58:0a:32:00:06", "n1"), gone, fdb("red", "0a:58:0a:01:01:07", "n1"),
		},
	}
	st := ComputeNode(in)
	v := views(nets, st)
	hosts := func(view string) []string {
		var out []string
		for _, r := range v[view] {
			if len(r) > 9 && r[:5] == "10.50" {
				out = append(out, r)
			}
		}
		return out
	}
	want := []string{"10.50.0.0/24 subnet vms", "10.50.0.2/32 local vms", "10.50.0.3/32 remote vms"}
	if got := hosts("vms"); !reflect.DeepEqual(got, want) {
		t.Errorf("vms's own view: %v, want %v", got, want)
	}
	if got := hosts("red"); !reflect.DeepEqual(got, want) {
		t.Errorf("red's view (a policy opens vms to it): %v, want %v", got, want)
	}

	// The neighbour table holds every located address of the subnet; the
	// FDB the MACs on other nodes with a locator, by the SID of vms there
	// (this node's own ports are the CNI server's).
	var gotN []string
	for _, n := range st.L2Neighbors {
		gotN = append(gotN, fmt.Sprintf("%d %s %s", n.NetID, n.Addr, n.MAC))
	}
	wantN := []string{"5 10.50.0.2 0a:58:0a:32:00:02", "5 10.50.0.3 0a:58:0a:32:00:03", "5 10.50.0.5 0a:58:0a:32:00:05"}
	if !reflect.DeepEqual(gotN, wantN) {
		t.Errorf("neighbours %v, want %v", gotN, wantN)
	}
	var gotF []string
	for _, f := range st.L2FDB {
		gotF = append(gotF, fmt.Sprintf("%d %s %s", f.NetID, f.MAC, f.SID))
	}
	wantF := []string{"5 0a:58:0a:32:00:03 fd1a:ce:0:2:400:5:0:5"}
	if !reflect.DeepEqual(gotF, wantF) {
		t.Errorf("fdb %v, want %v", gotF, wantF)
	}
	// Flooded frames go to the other nodes with ports in the network and
	// a locator: n2 (n4 has none; this node's own ports are local).
	var gotFl []string
	for _, f := range st.L2Flood {
		gotFl = append(gotFl, fmt.Sprintf("%d %s", f.NetID, f.SID))
	}
	if want := []string{"5 fd1a:ce:0:2:300:5:0:5"}; !reflect.DeepEqual(gotFl, want) {
		t.Errorf("flood nodes %v, want %v", gotFl, want)
	}
}

// TestL2NeverAnonymous: an l2 network stored with anonymous set (before
// the API refused it) is open, as its switched ports behave: the data
// plane's network entry, the views and the oracle agree.
func TestL2NeverAnonymous(t *testing.T) {
	nets := []lacev1.Network{l2("vms", nil, "10.50.0.0/24"), l3("sandbox", nil, "10.1.0.0/16")}
	nets[0].Status.ID, nets[1].Status.ID = 5, 1
	nets[0].Spec.Anonymous, nets[1].Spec.Anonymous = true, true
	st := ComputeNode(NodeInput{Node: "n1", Networks: nets, Allocations: blocks12(nets), Underlays: testUnderlays})
	for _, n := range st.Networks {
		if want := n.ID == 1; n.Anonymous != want {
			t.Errorf("network %d: anonymous %v, want %v", n.ID, n.Anonymous, want)
		}
	}
	topo := Topology{Networks: nets}
	a, b := netip.MustParseAddr("10.50.0.2"), netip.MustParseAddr("10.50.0.3")
	v := Reach(topo, Endpoint{Kind: EndpointPod, Network: "vms", Addr: a, NodeName: "n1"},
		Endpoint{Kind: EndpointPod, Network: "vms", Addr: b, NodeName: "n2"}, "tcp", 80)
	if !v.Allowed {
		t.Errorf("two pods of an l2 network stored as anonymous: %s, want allowed", v.Rule)
	}
	s4, s5 := netip.MustParseAddr("10.1.1.4"), netip.MustParseAddr("10.1.2.5")
	if v := Reach(topo, Endpoint{Kind: EndpointPod, Network: "sandbox", Addr: s4, NodeName: "n1"},
		Endpoint{Kind: EndpointPod, Network: "sandbox", Addr: s5, NodeName: "n2"}, "tcp", 80); v.Allowed {
		t.Errorf("two pods of an anonymous l3 network: allowed (%s), want denied", v.Rule)
	}
}

// TestL2Learning: the node learns on the l2 networks that say so, and
// places at its ports only the learned MACs published for this node with
// the endpoint they are held for; assigned MACs, other nodes' and those of
// a network that does not learn are not its to place.
func TestL2Learning(t *testing.T) {
	learning := l2("vms", nil, "10.50.0.0/24")
	learning.Spec.L2 = &lacev1.L2Options{Learning: true}
	quiet := l2("quiet", nil, "10.51.0.0/24")
	learned := func(network, mac, node, ep string) lacev1.FDBEntry {
		f := fdb(network, mac, node)
		f.Spec.Learned = true
		if ep != "" {
			f.Annotations = map[string]string{lacev1.AnnotationEndpoint: ep}
		}
		return f
	}
	in := NodeInput{Node: "n1", Networks: []lacev1.Network{learning, quiet},
		FDBEntries: []lacev1.FDBEntry{
			learned("vms", "52:54:00:00:00:02", "n1", "default/b"),
			learned("vms", "52:54:00:00:00:01", "n1", "default/a"),
			learned("vms", "52:54:00:00:00:03", "n2", "default/c"),
			learned("vms", "52:54:00:00:00:04", "n1", ""),
			fdb("vms", "0a:58:0a:32:00:05", "n1"),
			learned("quiet", "52:54:00:00:00:05", "n1", "default/d"),
		}}
	ids := map[string]uint32{"vms": 7, "quiet": 8}
	nets, got := l2Learning(in, ids)
	if fmt.Sprint(nets) != "[7]" {
		t.Errorf("learning networks %v, want [7]", nets)
	}
	want := "[{7 52:54:00:00:00:01 default/a} {7 52:54:00:00:00:02 default/b}]"
	if fmt.Sprint(got) != want {
		t.Errorf("learned MACs here %v, want %s", got, want)
	}
}

// TestL2Standby: a MAC with a standby (a live migration's target) carries
// it on every node: where it lives, the standby's SID; on the standby's
// node, that its pod there is the standby; elsewhere, both. The standby's
// node hears the network's floods. A learned MAC has no standby.
func TestL2Standby(t *testing.T) {
	nets := []lacev1.Network{l2("vms", nil, "10.50.0.0/24")}
	nets[0].Status.ID = 5
	underlays := append(append([]lacev1.UnderlayEndpoint(nil), testUnderlays...),
		lacev1.UnderlayEndpoint{Spec: lacev1.UnderlayEndpointSpec{Node: "n3", Addresses: []lacev1.IPAddress{"fd00:30::13"}, Locator: "fd1a:ce:0:3::/64"}})
	f := fdb("vms", "52:54:00:00:00:01", "n1")
	f.Spec.Standby, f.Spec.Sequence = "n2", 4
	learned := fdb("vms", "52:54:00:00:00:02", "n1")
	learned.Spec.Standby, learned.Spec.Learned = "n2", true
	in := NodeInput{Networks: nets, Underlays: underlays,
		Neighbors:  []lacev1.Neighbor{nbr("vms", "10.50.0.2", "52:54:00:00:00:01"), nbr("vms", "10.50.0.3", "52:54:00:00:00:02")},
		FDBEntries: []lacev1.FDBEntry{f, learned}}
	for node, want := range map[string][]string{
		"n1": {"52:54:00:00:00:01 here seq 4 standby fd1a:ce:0:2:400:5:0:5"},
		"n2": {"52:54:00:00:00:01 at fd1a:ce:0:1:400:5:0:5 seq 4 standby here", "52:54:00:00:00:02 at fd1a:ce:0:1:400:5:0:5 seq 0"},
		"n3": {"52:54:00:00:00:01 at fd1a:ce:0:1:400:5:0:5 seq 4 standby fd1a:ce:0:2:400:5:0:5", "52:54:00:00:00:02 at fd1a:ce:0:1:400:5:0:5 seq 0"},
	} {
		in.Node = node
		st := ComputeNode(in)
		var got []string
		for _, e := range st.L2FDB {
			s := e.MAC.String()
			if e.Here {
				s += " here"
			} else {
				s += " at " + e.SID.String()
			}
			s += fmt.Sprintf(" seq %d", e.Seq)
			if e.StandbyHere {
				s += " standby here"
			} else if e.StandbySID.IsValid() {
				s += " standby " + e.StandbySID.String()
			}
			got = append(got, s)
		}
		if !reflect.DeepEqual(got, want) {
			t.Errorf("%s: fdb %v, want %v", node, got, want)
		}
		var flood []string
		for _, fl := range st.L2Flood {
			flood = append(flood, fl.SID.String())
		}
		if node == "n1" && !reflect.DeepEqual(flood, []string{"fd1a:ce:0:2:300:5:0:5"}) {
			t.Errorf("n1 floods to %v, want the standby's node", flood)
		}
	}
}

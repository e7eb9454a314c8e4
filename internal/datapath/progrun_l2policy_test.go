package datapath

import (
	"net"
	"net/netip"
	"testing"

	"github.com/lace-cni/lace/internal/netpol"
)

// TestProgL2Policy: frames switched inside an l2 network are decided by
// NetworkPolicy as routed packets are: at the sender's port (egress) and
// at the receiver's, on its node (ingress), a reply of an admitted flow
// passing through conntrack, a refusal counted as policy; a port no
// policy has a say on switches as before.
func TestProgL2Policy(t *testing.T) {
	d := progL2NodesDatapath(t)
	const classA, classC = 5, 6
	sync := func(tb netpol.Tables) {
		t.Helper()
		tb.Policies = map[uint32]netpol.PolicyRef{polDenyIn: {Kind: "NetworkPolicy", Namespace: "ns", Name: "in"},
			polDenyOut: {Kind: "NetworkPolicy", Namespace: "ns", Name: "out"}, polAllow: {Kind: "NetworkPolicy", Namespace: "ns", Name: "allow"}}
		if err := d.SyncPolicies(tb); err != nil {
			t.Fatal(err)
		}
	}
	mySID := SID(progLocator, BehaviourL2IP, progNet, progNet)
	if err := d.UpsertEndpoint(Endpoint{NetID: progNet, Addr: l2B4, IfIndex: l2PortB, PodMAC: l2MACB, HostMAC: l2MACGw}); err != nil {
		t.Fatal(err)
	}
	aToB := func(sport, dport uint16) []byte {
		return fromMAC(l2MACA, ether(l2MACB, 0x0800, ipv4(l2A4, l2B4, 17, udp(sport, dport))))
	}
	bToA := func(sport, dport uint16) []byte {
		return fromMAC(l2MACB, ether(l2MACA, 0x0800, ipv4(l2B4, l2A4, 17, udp(sport, dport))))
	}
	cToB := func(sport, dport uint16) []byte {
		return srv6(progPeerV6, mySID, ipv4(l2C4, l2B4, 17, udp(sport, dport)), true)
	}
	// Ahead of any policy, a later reply must not find a flow: nothing is
	// tracked for ports no policy has a say on.
	onlyDrop(t, d, "", func() {
		if v, _ := runL2(t, d, l2PortA, aToB(999, 7)); v != actRedirect {
			t.Errorf("no policy: verdict %d, want switched", v)
		}
	})

	// B's ingress: UDP 7 from A only (C is another class, admitted nowhere).
	sync(netpol.Tables{
		Endpoints: map[uint32]netpol.Endpoint{l2PortB: {Lookup: netpol.Ingress, Isolated: netpol.Ingress, DenyIn: polDenyIn}},
		Peers:     map[netpol.PeerKey]uint32{{NetID: progNet, Addr: l2A4}: classA, {NetID: progNet, Addr: l2C4}: classC},
		Verdicts: map[netpol.VerdictKey]netpol.Verdict{
			{Ifindex: l2PortB, Class: classA, Dir: netpol.Ingress, Proto: 17, Port: 7, PrefixLen: 96}: {Policy: polAllow, Allow: true},
		},
	})
	for _, c := range []struct {
		name   string
		run    func() uint32
		want   uint32
		reason string
	}{
		{"A to B's admitted port, on this node", func() uint32 { v, _ := runL2(t, d, l2PortA, aToB(1000, 7)); return v }, actRedirect, ""},
		{"B's reply to A", func() uint32 { v, _ := runL2(t, d, l2PortB, bToA(7, 1000)); return v }, actRedirect, ""},
		{"A to another port of B", func() uint32 { v, _ := runL2(t, d, l2PortA, aToB(1001, 8)); return v }, actShot, "policy"},
		{"C from another node to B", func() uint32 { v, _ := runUnderlay(t, d, cToB(2000, 7)); return v }, actShot, "policy"},
		{"B opens a flow to A (its egress is open)", func() uint32 { v, _ := runL2(t, d, l2PortB, bToA(3000, 53)); return v }, actRedirect, ""},
		{"A's reply to B's flow", func() uint32 { v, _ := runL2(t, d, l2PortA, aToB(53, 3000)); return v }, actRedirect, ""},
		{"a reply before any flow", func() uint32 { v, _ := runL2(t, d, l2PortA, aToB(7, 999)); return v }, actShot, "policy"},
	} {
		t.Run(c.name, func(t *testing.T) {
			onlyDrop(t, d, c.reason, func() {
				if v := c.run(); v != c.want {
					t.Errorf("verdict %d, want %d", v, c.want)
				}
			})
		})
	}
	if n := policyDrops(t, d, polDenyIn); n != 3 {
		t.Errorf("drops counted on B's isolating policy: %d, want 3", n)
	}

	// A's egress shut: nothing A opens leaves, to a port here or to C on
	// another node; what C opens to A is answered.
	sync(netpol.Tables{
		Endpoints: map[uint32]netpol.Endpoint{l2PortA: {Lookup: netpol.Egress, Isolated: netpol.Egress, DenyOut: polDenyOut}},
	})
	onlyDrop(t, d, "policy", func() {
		if v, _ := runL2(t, d, l2PortA, fromMAC(l2MACA, ether(l2MACC, 0x0800, ipv4(l2A4, l2C4, 17, udp(4000, 7))))); v != actShot {
			t.Errorf("A to C: verdict %d, want dropped", v)
		}
	})
	onlyDrop(t, d, "policy", func() {
		if v, _ := runL2(t, d, l2PortA, aToB(4001, 7)); v != actShot {
			t.Errorf("A to B: verdict %d, want dropped", v)
		}
	})
	onlyDrop(t, d, "", func() {
		if v, _ := runUnderlay(t, d, srv6(progPeerV6, mySID, ipv4(l2C4, l2A4, 17, udp(5000, 7)), true)); v != actRedirect {
			t.Errorf("C to A: verdict %d, want delivered", v)
		}
	})
	// The answer leaves for C's node (where the test's missing underlay
	// route stops it): past the policy.
	onlyDrop(t, d, "no-underlay-route", func() {
		runL2(t, d, l2PortA, fromMAC(l2MACA, ether(l2MACC, 0x0800, ipv4(l2A4, l2C4, 17, udp(7, 5000)))))
	})
}

// TestProgL2PolicyFloodAndNames: a port a policy isolates for egress
// floods no IP frame (a broadcast is no flow a rule can admit); and a pod
// cannot record a flow in another's name by sending to a third port's MAC
// with the other's address (both found by review).
func TestProgL2PolicyFloodAndNames(t *testing.T) {
	d := progL2NodesDatapath(t)
	sync := func(tb netpol.Tables) {
		t.Helper()
		tb.Policies = map[uint32]netpol.PolicyRef{polDenyIn: {Kind: "NetworkPolicy", Namespace: "ns", Name: "in"},
			polDenyOut: {Kind: "NetworkPolicy", Namespace: "ns", Name: "out"}}
		if err := d.SyncPolicies(tb); err != nil {
			t.Fatal(err)
		}
	}
	bcast := net.HardwareAddr{0xff, 0xff, 0xff, 0xff, 0xff, 0xff}
	// B isolated for egress: no IP broadcast leaves it.
	sync(netpol.Tables{Endpoints: map[uint32]netpol.Endpoint{l2PortB: {Lookup: netpol.Egress, Isolated: netpol.Egress, DenyOut: polDenyOut}}})
	onlyDrop(t, d, "policy", func() {
		runL2(t, d, l2PortB, fromMAC(l2MACB, ether(bcast, 0x0800, ipv4(l2B4, netip.MustParseAddr("10.70.1.255"), 17, udp(68, 67)))))
	})

	// A third port A2 sends to A's MAC with B's address: A (which has a
	// say) would key the flow by B, and B's packets to A2 would pass B's
	// shut egress as replies.
	const portA2 = 5003
	macA2, a2 := net.HardwareAddr{0x0a, 0x58, 10, 70, 1, 5}, netip.MustParseAddr("10.70.1.5")
	for _, err := range []error{
		d.UpsertPort(Port{IfIndex: portA2, NetID: progNet, V4: a2, L2: true}),
		d.SyncL2Local([]L2Neighbor{{NetID: progNet, Addr: l2A4, MAC: l2MACA}, {NetID: progNet, Addr: l2B4, MAC: l2MACB},
			{NetID: progNet, Addr: a2, MAC: macA2}, {NetID: progNet, Addr: l2Gw4, MAC: l2MACGw, Router: true}},
			[]FDBEntry{{NetID: progNet, MAC: l2MACA, IfIndex: l2PortA}, {NetID: progNet, MAC: l2MACB, IfIndex: l2PortB},
				{NetID: progNet, MAC: macA2, IfIndex: portA2}, {NetID: progNet, MAC: l2MACGw, Gateway: true}}),
	} {
		if err != nil {
			t.Fatal(err)
		}
	}
	sync(netpol.Tables{Endpoints: map[uint32]netpol.Endpoint{
		l2PortB: {Lookup: netpol.Egress, Isolated: netpol.Egress, DenyOut: polDenyOut}, l2PortA: {Lookup: netpol.Ingress}}})
	bToA2 := fromMAC(l2MACB, ether(macA2, 0x0800, ipv4(l2B4, a2, 17, udp(5000, 53))))
	onlyDrop(t, d, "policy", func() { runL2(t, d, l2PortB, bToA2) })
	onlyDrop(t, d, "l2-frame-not-carried", func() {
		runL2(t, d, portA2, fromMAC(macA2, ether(l2MACA, 0x0800, ipv4(a2, l2B4, 17, udp(53, 5000)))))
	})
	onlyDrop(t, d, "policy", func() { runL2(t, d, l2PortB, bToA2) })
}

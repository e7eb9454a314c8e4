package datapath

import (
	"context"
	"net"
	"net/netip"
	"testing"
	"time"
)

// TestProgL2Learns: a port of a learning network reports what its
// network does not know (a MAC, an address, a MAC that lives elsewhere)
// through the ring, once per gap, and drops the frame as l2-learning
// until the binding is in the tables; a port of another network reports
// nothing and drops as before; the gateway's MAC and multicast sources
// are never learned.
func TestProgL2Learns(t *testing.T) {
	d := progL2Datapath(t)
	const portC = 5003
	macC := net.HardwareAddr{0x0a, 0x58, 10, 70, 1, 4}
	guest := net.HardwareAddr{0x52, 0x54, 0, 0x12, 0x34, 0x56}
	c4, c6 := netip.MustParseAddr("10.70.1.4"), netip.MustParseAddr("fd00:70:0:1::4")
	static4, static6 := netip.MustParseAddr("10.70.1.200"), netip.MustParseAddr("fd00:70:0:1::c8")
	if err := d.UpsertPort(Port{IfIndex: portC, NetID: progNet, V4: c4, V6: c6, L2: true, Learn: true}); err != nil {
		t.Fatal(err)
	}
	neigh := []L2Neighbor{
		{NetID: progNet, Addr: l2A4, MAC: l2MACA}, {NetID: progNet, Addr: l2A6, MAC: l2MACA},
		{NetID: progNet, Addr: l2B4, MAC: l2MACB}, {NetID: progNet, Addr: l2B6, MAC: l2MACB},
		{NetID: progNet, Addr: c4, MAC: macC}, {NetID: progNet, Addr: c6, MAC: macC},
		{NetID: progNet, Addr: l2Gw4, MAC: l2MACGw, Router: true}, {NetID: progNet, Addr: l2Gw6, MAC: l2MACGw, Router: true},
	}
	fdb := []FDBEntry{
		{NetID: progNet, MAC: l2MACA, IfIndex: l2PortA}, {NetID: progNet, MAC: l2MACB, IfIndex: l2PortB},
		{NetID: progNet, MAC: macC, IfIndex: portC}, {NetID: progNet, MAC: l2MACGw, Gateway: true},
	}
	if err := d.SyncL2Local(neigh, fdb); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	learned := make(chan L2Learned, 64)
	done := make(chan error, 1)
	go func() { done <- d.ReadL2Learned(ctx, func(l L2Learned) { learned <- l }) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("ReadL2Learned: %v", err)
		}
	})
	// Each case starts a new gap: the test does not wait it out.
	newGap := func() {
		for _, p := range []uint32{portC, l2PortA} {
			_ = d.l2.LaceL2LearnGap.Delete(p)
		}
	}
	expect := func(want L2Learned) {
		t.Helper()
		select {
		case got := <-learned:
			if got.IfIndex != want.IfIndex || got.NetID != want.NetID || got.MAC.String() != want.MAC.String() || got.Addr != want.Addr {
				t.Errorf("learned %+v, want %+v", got, want)
			}
		case <-time.After(5 * time.Second):
			t.Fatalf("no learning report, want %+v", want)
		}
	}
	udp4 := func(src net.HardwareAddr, from netip.Addr) []byte {
		return fromMAC(src, ether(l2MACB, 0x0800, ipv4(from, l2B4, 17, udp(1000, 7))))
	}
	udp6 := func(src net.HardwareAddr, from netip.Addr) []byte {
		return fromMAC(src, ether(l2MACB, 0x86dd, ipv6(from, l2B6, 17, udp(1000, 7))))
	}
	run := func(name string, port uint32, pkt []byte, want uint32, reason string) {
		t.Helper()
		newGap()
		onlyDrop(t, d, reason, func() {
			if got, _ := runL2(t, d, port, pkt); got != want {
				t.Errorf("%s: verdict %d, want %d", name, got, want)
			}
		})
	}

	run("a guest's MAC and static address", portC, udp4(guest, static4), actShot, "l2-learning")
	expect(L2Learned{IfIndex: portC, NetID: progNet, MAC: guest, Addr: static4})
	// Within the gap: dropped, not reported again.
	onlyDrop(t, d, "l2-learning", func() { runL2(t, d, portC, udp6(guest, static6)) })
	run("a guest's MAC, IPv6", portC, udp6(guest, static6), actShot, "l2-learning")
	expect(L2Learned{IfIndex: portC, NetID: progNet, MAC: guest, Addr: static6})
	run("the port's MAC with an unknown address", portC, udp4(macC, static4), actShot, "l2-learning")
	expect(L2Learned{IfIndex: portC, NetID: progNet, MAC: macC, Addr: static4})
	run("a gratuitous ARP of an unknown address", portC, fromMAC(guest, arpRequest(guest, static4, static4)), actShot, "l2-learning")
	expect(L2Learned{IfIndex: portC, NetID: progNet, MAC: guest, Addr: static4})
	run("a MAC that lives at another port", portC, udp4(l2MACA, static4), actShot, "l2-learning")
	expect(L2Learned{IfIndex: portC, NetID: progNet, MAC: l2MACA, Addr: static4})
	run("DAD of an unknown MAC: the MAC alone", portC, fromMAC(guest, neighbourSolicitation(netip.IPv6Unspecified(), static6, guest)), actShot, "l2-learning")
	expect(L2Learned{IfIndex: portC, NetID: progNet, MAC: guest})

	// Never learned, never reported: the next report is the marker's.
	run("the gateway's MAC", portC, udp4(l2MACGw, static4), actShot, "l2-spoofed-mac")
	run("a multicast source MAC", portC, udp4(net.HardwareAddr{0x01, 0, 0x5e, 0, 0, 1}, static4), actShot, "l2-spoofed-mac")
	run("a port that does not learn, unknown MAC", l2PortA, udp4(guest, static4), actShot, "l2-spoofed-mac")
	run("a port that does not learn, unknown address", l2PortA, udp4(l2MACA, static4), actShot, "spoofed-source")
	run("a port that does not learn, ARP from an unknown address", l2PortA, fromMAC(l2MACA, arpRequest(l2MACA, static4, l2B4)), actShot, "spoofed-source")
	run("an unspecified source (DHCP)", portC, udp4(macC, netip.IPv4Unspecified()), actShot, "spoofed-source")
	run("a link-local source", portC, udp6(macC, netip.MustParseAddr("fe80::1")), actShot, "spoofed-source")
	run("marker", portC, udp6(macC, static6), actShot, "l2-learning")
	expect(L2Learned{IfIndex: portC, NetID: progNet, MAC: macC, Addr: static6})

	// Published (the agent's local entries): the guest is switched, its
	// address answered; the address is the guest MAC's only.
	if err := d.SyncL2Local(append(neigh, L2Neighbor{NetID: progNet, Addr: static4, MAC: guest}),
		append(fdb, FDBEntry{NetID: progNet, MAC: guest, IfIndex: portC})); err != nil {
		t.Fatal(err)
	}
	run("the learned guest to a peer", portC, udp4(guest, static4), actRedirect, "")
	run("the learned guest asks for a peer", portC, fromMAC(guest, arpRequest(guest, static4, l2B4)), actRedirect, "")
	run("a peer to the learned guest", l2PortB, fromMAC(l2MACB, ether(guest, 0x0800, ipv4(l2B4, static4, 17, udp(7, 1000)))), actRedirect, "")
	run("the learned address from the port's own MAC", portC, udp4(macC, static4), actShot, "l2-learning")
	expect(L2Learned{IfIndex: portC, NetID: progNet, MAC: macC, Addr: static4})
	run("the learned address from another port", l2PortA, udp4(l2MACA, static4), actShot, "spoofed-source")
}

// TestProgL2LearnedFromNode: a switched packet from another node to an
// address learned at a port here is delivered to that port, addressed to
// the learned MAC; not when the port does not learn (no-endpoint): an
// address is reached through the neighbour table only on a learning port.
func TestProgL2LearnedFromNode(t *testing.T) {
	d := progL2NodesDatapath(t)
	guest := net.HardwareAddr{0x52, 0x54, 0, 0x12, 0x34, 0x56}
	static4 := netip.MustParseAddr("10.70.1.200")
	if err := d.SyncL2Local([]L2Neighbor{
		{NetID: progNet, Addr: l2A4, MAC: l2MACA}, {NetID: progNet, Addr: static4, MAC: guest},
		{NetID: progNet, Addr: l2Gw4, MAC: l2MACGw, Router: true},
	}, []FDBEntry{
		{NetID: progNet, MAC: l2MACA, IfIndex: l2PortA}, {NetID: progNet, MAC: guest, IfIndex: l2PortA},
		{NetID: progNet, MAC: l2MACGw, Gateway: true},
	}); err != nil {
		t.Fatal(err)
	}
	pkt := func() []byte {
		return srv6(progPeerV6, SID(progLocator, BehaviourL2IP, progNet, progNet), ipv4(l2C4, static4, 17, udp(1000, 7)), true)
	}
	onlyDrop(t, d, "no-endpoint", func() {
		if ret, _ := runUnderlay(t, d, pkt()); ret != actShot {
			t.Errorf("verdict %d on a port that does not learn, want drop", ret)
		}
	})
	if err := d.UpsertPort(Port{IfIndex: l2PortA, NetID: progNet, V4: l2A4, V6: l2A6, L2: true, Learn: true}); err != nil {
		t.Fatal(err)
	}
	var ret uint32
	var out []byte
	onlyDrop(t, d, "", func() { ret, out = runUnderlay(t, d, pkt()) })
	if ret != actRedirect || !bytesEqual(out[0:6], guest) || !bytesEqual(out[6:12], l2MACC) {
		t.Fatalf("verdict %d, frame % x: want a redirect to %s from %s", ret, out[:14], guest, l2MACC)
	}
	// A source learned on the peer node (no view routes it) is placed
	// there by its Neighbor and FDB entry: taken from that node only.
	remoteGuest := net.HardwareAddr{0x52, 0x54, 0, 0x12, 0x34, 0x57}
	remote4 := netip.MustParseAddr("10.70.1.201")
	if err := d.SyncL2Cluster([]L2Neighbor{{NetID: progNet, Addr: l2C4, MAC: l2MACC}, {NetID: progNet, Addr: remote4, MAC: remoteGuest}},
		[]FDBEntry{{NetID: progNet, MAC: l2MACC, SID: SID(progOther, BehaviourL2IP, progNet, progNet)},
			{NetID: progNet, MAC: remoteGuest, SID: SID(progOther, BehaviourL2IP, progNet, progNet)}}, nil); err != nil {
		t.Fatal(err)
	}
	fromRemote := srv6(progPeerV6, SID(progLocator, BehaviourL2IP, progNet, progNet), ipv4(remote4, l2A4, 17, udp(1000, 7)), true)
	onlyDrop(t, d, "", func() {
		if ret, out = runUnderlay(t, d, fromRemote); ret != actRedirect || !bytesEqual(out[6:12], remoteGuest) {
			t.Errorf("from a learned source on the peer: verdict %d, frame % x", ret, out[:14])
		}
	})
	if err := d.SyncL2Cluster([]L2Neighbor{{NetID: progNet, Addr: l2C4, MAC: l2MACC}, {NetID: progNet, Addr: remote4, MAC: remoteGuest}},
		[]FDBEntry{{NetID: progNet, MAC: l2MACC, SID: SID(progOther, BehaviourL2IP, progNet, progNet)},
			{NetID: progNet, MAC: remoteGuest, SID: SID(netip.MustParsePrefix("fd1a:ce:0:3::/64"), BehaviourL2IP, progNet, progNet)}}, nil); err != nil {
		t.Fatal(err)
	}
	onlyDrop(t, d, "decap-foreign-source", func() {
		if ret, _ := runUnderlay(t, d, fromRemote); ret != actShot {
			t.Errorf("from a source whose MAC lives on a third node: verdict %d, want drop", ret)
		}
	})
}

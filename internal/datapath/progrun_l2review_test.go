package datapath

import (
	"fmt"
	"net"
	"net/netip"
	"testing"
)

// Findings of the hostile review of the l2 data plane (issue 20): each
// test is an attack a tenant's pod (or a node) could make.

// neighbourAdvert is an unsolicited advertisement that target is at mac
// (override set), as a poisoner sends it to a peer, hop limit 255; ext
// are IPv6 extension headers put before the ICMPv6 header (each given
// with its own next-header byte at [0], which is patched).
func neighbourAdvert(src, dst, target netip.Addr, mac net.HardwareAddr, ext ...[]byte) (next byte, payload []byte) {
	m := make([]byte, 32)
	m[0] = 136
	m[4] = 0x20 // override
	tg := target.As16()
	copy(m[8:24], tg[:])
	m[24], m[25] = 2, 1 // target link-layer address
	copy(m[26:32], mac)
	next = 58
	for i := len(ext) - 1; i >= 0; i-- {
		h := append([]byte(nil), ext[i]...)
		kind := h[0]
		h[0] = next
		payload = append(h, payload...)
		next = kind
	}
	payload = append(payload, m...)
	return next, payload
}

// extHdr makes an extension header of kind (0, 43 or 60: 8 bytes of
// padding; 44: an atomic fragment header) whose [0] neighbourAdvert
// replaces with the next header; the kind travels in [0] until then.
func extHdr(kind byte) []byte {
	h := make([]byte, 8)
	h[0] = kind
	if kind != 44 {
		h[2], h[3] = 1, 4 // PadN of 4 after the 2 header bytes
	}
	return h
}

// TestProgL2ReviewHiddenND: a pod that puts an extension header
// (destination options, hop-by-hop, an atomic fragment) before an
// ICMPv6 neighbour advertisement must not get it to a peer: the peer's
// stack processes the advertisement after the extension header and
// believes the gateway (or any address) is at the attacker's MAC, which
// then receives the peer's traffic (ND poisoning inside the segment,
// what answering ND from the table is there to prevent). Neither on the
// node (switched to the peer's port) nor across nodes (carried as the IP
// packet to the peer's node), nor delivered by the receiving node from
// another (a compromised node's pod sends it).
func TestProgL2ReviewHiddenND(t *testing.T) {
	d := progL2NodesDatapath(t)
	for _, kind := range []byte{60, 0, 44, 43} {
		next, pl := neighbourAdvert(l2A6, l2B6, l2Gw6, l2MACA, extHdr(kind))
		ip := ipv6(l2A6, l2B6, 0, pl)
		ip[6], ip[7] = next, 255
		t.Run(fmt.Sprintf("on the node, behind %d", kind), func(t *testing.T) {
			onlyDrop(t, d, "l2-not-forwarded", func() {
				if got, _ := runL2(t, d, l2PortA, fromMAC(l2MACA, ether(l2MACB, 0x86dd, ip))); got != actShot {
					t.Errorf("verdict %d: an advertisement behind extension header %d reached a peer", got, kind)
				}
			})
		})
		ipC := ipv6(l2A6, l2C6, 0, pl)
		ipC[6], ipC[7] = next, 255
		t.Run(fmt.Sprintf("to another node, behind %d", kind), func(t *testing.T) {
			onlyDrop(t, d, "l2-not-forwarded", func() {
				if got, _ := runL2(t, d, l2PortA, fromMAC(l2MACA, ether(l2MACC, 0x86dd, ipC))); got != actShot {
					t.Errorf("verdict %d: an advertisement behind extension header %d left for another node", got, kind)
				}
			})
		})
		in := ipv6(l2C6, l2A6, 0, pl)
		in[6], in[7] = next, 255
		t.Run(fmt.Sprintf("from another node, behind %d", kind), func(t *testing.T) {
			onlyDrop(t, d, "l2-not-forwarded", func() {
				if got, _ := runUnderlay(t, d, srv6(progPeerV6, SID(progLocator, BehaviourL2IP, progNet, progNet), in, false)); got != actShot {
					t.Errorf("verdict %d: an advertisement behind extension header %d from another node was delivered", got, kind)
				}
			})
		})
	}
	// A plain advertisement from another node (no extension header) is
	// not delivered either: ND is answered on each node, never carried.
	next, pl := neighbourAdvert(l2C6, l2A6, l2Gw6, l2MACC)
	in := ipv6(l2C6, l2A6, next, pl)
	in[7] = 255
	onlyDrop(t, d, "l2-not-forwarded", func() {
		if got, _ := runUnderlay(t, d, srv6(progPeerV6, SID(progLocator, BehaviourL2IP, progNet, progNet), in, false)); got != actShot {
			t.Errorf("verdict %d: an advertisement from another node was delivered", got)
		}
	})
	// Ordinary traffic with a destination option still flows.
	pl2 := append(extHdr(60), udp(1000, 7)...)
	pl2[0] = 17
	ip := ipv6(l2A6, l2B6, 60, pl2)
	onlyDrop(t, d, "", func() {
		if got, _ := runL2(t, d, l2PortA, fromMAC(l2MACA, ether(l2MACB, 0x86dd, ip))); got != actRedirect {
			t.Errorf("verdict %d: UDP behind a destination option was not switched", got)
		}
	})
}

// TestProgL2ReviewForeignNetworksNotHeld: the cluster's part of the l2
// tables (every l2 network's every address, from Neighbors and
// FDBEntries) is held on a node only for the networks that have a port
// there: nothing of the data plane reads another network's entries
// (from_l2 reads its port's network, the receiver needs a local endpoint),
// and holding them all lets one large network (a tenant's claims outlive
// its pods) fill lace_l2_neigh on every node, after which no new port of
// any network gets its entries (its frames are dropped as spoofed, its
// ARP unanswered).
func TestProgL2ReviewForeignNetworksNotHeld(t *testing.T) {
	d := progL2Datapath(t)
	other := progNet + 5
	base := netip.MustParseAddr("10.200.0.0")
	var neigh []L2Neighbor
	var fdb []FDBEntry
	// Addresses 10.200.0.1 on, one MAC each (by index).
	b := base.As4()
	for i := 1; i <= 65536; i++ {
		v := uint32(b[0])<<24 | uint32(b[1])<<16 | uint32(b[2])<<8 | uint32(b[3]) + uint32(i)
		a := netip.AddrFrom4([4]byte{byte(v >> 24), byte(v >> 16), byte(v >> 8), byte(v)})
		mac := net.HardwareAddr{0x0a, 0x58, byte(v >> 24), byte(v >> 16), byte(v >> 8), byte(v)}
		neigh = append(neigh, L2Neighbor{NetID: other, Addr: a, MAC: mac})
		if i <= 100 {
			fdb = append(fdb, FDBEntry{NetID: other, MAC: mac, SID: SID(progOther, BehaviourL2IP, other, other)})
		}
	}
	// What the cluster sync says fails or not: the point is the ports.
	_ = d.SyncL2Cluster(neigh, fdb, nil)
	got, err := d.L2Neighbors()
	if err != nil {
		t.Fatal(err)
	}
	held := 0
	for _, n := range got {
		if n.NetID == other {
			held++
		}
	}
	if held != 0 {
		t.Errorf("%d neighbours of network %d, which has no port on the node, are held", held, other)
	}
	// A new port of the node's network gets its entries: its ARP is
	// answered.
	c4 := netip.MustParseAddr("10.70.1.9")
	cMAC := net.HardwareAddr{0x0a, 0x58, 10, 70, 1, 9}
	if err := d.SyncL2Local([]L2Neighbor{
		{NetID: progNet, Addr: l2A4, MAC: l2MACA}, {NetID: progNet, Addr: c4, MAC: cMAC},
		{NetID: progNet, Addr: l2Gw4, MAC: l2MACGw, Router: true},
	}, []FDBEntry{
		{NetID: progNet, MAC: l2MACA, IfIndex: l2PortA}, {NetID: progNet, MAC: cMAC, IfIndex: 5003},
		{NetID: progNet, MAC: l2MACGw, Gateway: true},
	}); err != nil {
		t.Fatalf("a new port's entries were not written: %v", err)
	}
	onlyForwarded(t, d, "l2-answered", func() { runL2(t, d, l2PortA, fromMAC(l2MACA, arpRequest(l2MACA, l2A4, c4))) })
	// The network arrives on the node (a port of it): its entries follow.
	if err := d.SyncL2Cluster(neigh[:3], fdb[:3], nil); err != nil {
		t.Fatal(err)
	}
	if err := d.SyncL2Local([]L2Neighbor{{NetID: other, Addr: netip.MustParseAddr("10.200.1.1"), MAC: cMAC}},
		[]FDBEntry{{NetID: other, MAC: cMAC, IfIndex: 5003}}); err != nil {
		t.Fatal(err)
	}
	got, err = d.L2Neighbors()
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 4 {
		t.Errorf("with a port of network %d: neighbours %v, want its own and the cluster's 3", other, got)
	}
}

// icmpErr is an ICMP (v4: type 3 code 4, fragmentation needed, MTU 552) or
// ICMPv6 (type 2, packet too big, MTU 1280) error from src to dst quoting
// a UDP datagram from qs to qd.
func icmpErr(src, dst, qs, qd netip.Addr) []byte {
	if src.Is4() {
		m := []byte{3, 4, 0, 0, 0, 0, 0x02, 0x28}
		return ipv4(src, dst, 1, append(m, ipv4(qs, qd, 17, udp(5353, 53))...))
	}
	m := []byte{2, 0, 0, 0, 0, 0, 0x05, 0x00}
	return ipv6(src, dst, 58, append(m, ipv6(qs, qd, 17, udp(5353, 53))...))
}

// TestProgL2ReviewForeignICMPError: a pod cannot tell a peer of its
// segment that the peer's flows to some other host have a tiny path MTU
// (or were refused): a switched ICMP error must quote a packet the
// receiver sent to the sender, on the node, to another node, and from
// another node. One about the receiver's packet to the sender passes.
func TestProgL2ReviewForeignICMPError(t *testing.T) {
	d := progL2NodesDatapath(t)
	ext4, ext6 := netip.MustParseAddr("8.8.8.8"), netip.MustParseAddr("2001:4860::8888")
	mySID := SID(progLocator, BehaviourL2IP, progNet, progNet)
	for _, c := range []struct {
		name, reason string
		run          func() uint32
		want         uint32
	}{
		{"v4 on the node, about the peer's flow elsewhere", "icmp-error-no-flow", func() uint32 {
			r, _ := runL2(t, d, l2PortA, fromMAC(l2MACA, ether(l2MACB, 0x0800, icmpErr(l2A4, l2B4, l2B4, ext4))))
			return r
		}, actShot},
		{"v6 on the node, about the peer's flow elsewhere", "icmp-error-no-flow", func() uint32 {
			r, _ := runL2(t, d, l2PortA, fromMAC(l2MACA, ether(l2MACB, 0x86dd, icmpErr(l2A6, l2B6, l2B6, ext6))))
			return r
		}, actShot},
		{"v4 to another node, about the peer's flow elsewhere", "icmp-error-no-flow", func() uint32 {
			r, _ := runL2(t, d, l2PortA, fromMAC(l2MACA, ether(l2MACC, 0x0800, icmpErr(l2A4, l2C4, l2C4, ext4))))
			return r
		}, actShot},
		{"v6 from another node, about the pod's flow elsewhere", "icmp-error-in-no-flow", func() uint32 {
			r, _ := runUnderlay(t, d, srv6(progPeerV6, mySID, icmpErr(l2C6, l2A6, l2A6, ext6), false))
			return r
		}, actShot},
		{"v4 on the node, about the peer's packet to the sender", "", func() uint32 {
			r, _ := runL2(t, d, l2PortA, fromMAC(l2MACA, ether(l2MACB, 0x0800, icmpErr(l2A4, l2B4, l2B4, l2A4))))
			return r
		}, actRedirect},
		{"v6 from another node, about the pod's packet to the sender", "", func() uint32 {
			r, _ := runUnderlay(t, d, srv6(progPeerV6, mySID, icmpErr(l2C6, l2A6, l2A6, l2C6), false))
			return r
		}, actRedirect},
	} {
		t.Run(c.name, func(t *testing.T) {
			onlyDrop(t, d, c.reason, func() {
				if got := c.run(); got != c.want {
					t.Errorf("verdict %d, want %d", got, c.want)
				}
			})
		})
	}
}

// TestProgL2ReviewFloodFromNode: a flooded frame from another node (a
// compromised one: its agent writes the frame) is taken only with the IP
// source of its MAC, and never as neighbour discovery: a multicast
// advertisement to all nodes would move every port's gateway entry to
// the sender's MAC in one frame.
func TestProgL2ReviewFloodFromNode(t *testing.T) {
	d := progL2NodesDatapath(t)
	mySID := SID(progLocator, BehaviourL2Flood, progNet, progNet)
	allNodes := netip.MustParseAddr("ff02::1")
	mcast := net.HardwareAddr{0x33, 0x33, 0, 0, 0, 1}
	flooded := func(proto uint16, payload []byte) []byte {
		inner := fromMAC(l2MACC, ether(mcast, proto, payload))
		return ether(unicastMAC, 0x86dd, ipv6(progPeerV6, mySID, 143, inner))
	}
	next, pl := neighbourAdvert(l2C6, allNodes, l2Gw6, l2MACC)
	na := ipv6(l2C6, allNodes, next, pl)
	na[7] = 255
	next, pl = neighbourAdvert(l2C6, allNodes, l2Gw6, l2MACC, extHdr(60))
	naExt := ipv6(l2C6, allNodes, next, pl)
	naExt[7] = 255
	for _, c := range []struct {
		name, reason string
		pkt          []byte
	}{
		{"an advertisement to all nodes", "l2-not-forwarded", flooded(0x86dd, na)},
		{"an advertisement behind a destination option", "l2-not-forwarded", flooded(0x86dd, naExt)},
		{"from another pod's address", "decap-foreign-source", flooded(0x86dd, ipv6(l2A6, allNodes, 17, udp(1, 7)))},
		{"from the gateway's address", "decap-foreign-source", flooded(0x0800, ipv4(l2Gw4, netip.MustParseAddr("10.70.1.255"), 17, udp(67, 68)))},
	} {
		t.Run(c.name, func(t *testing.T) {
			onlyDrop(t, d, c.reason, func() {
				if ret, _ := runUnderlay(t, d, c.pkt); ret != actShot {
					t.Errorf("verdict %d, want drop", ret)
				}
			})
		})
	}
	onlyForwarded(t, d, "flooded", func() {
		onlyDrop(t, d, "", func() {
			runUnderlay(t, d, flooded(0x86dd, ipv6(l2C6, allNodes, 17, udp(1, 7))))
		})
	})
}

package datapath

import (
	"encoding/binary"
	"net"
	"net/netip"
	"testing"

	"github.com/cilium/ebpf"
)

// The l2 test world: network progNet is an l2 network on this node with
// ports A and B (host-side ifindexes l2PortA, l2PortB) and its anycast
// gateway.
const (
	l2PortA = 5001
	l2PortB = 5002
)

var (
	l2MACA  = net.HardwareAddr{0x0a, 0x58, 10, 70, 1, 2}
	l2MACB  = net.HardwareAddr{0x0a, 0x58, 10, 70, 1, 3}
	l2MACGw = net.HardwareAddr{0x0a, 0x5a, 0, 0, 0, 7}
	l2A4    = netip.MustParseAddr("10.70.1.2")
	l2B4    = netip.MustParseAddr("10.70.1.3")
	l2Gw4   = netip.MustParseAddr("10.70.1.1")
	l2A6    = netip.MustParseAddr("fd00:70:0:1::2")
	l2B6    = netip.MustParseAddr("fd00:70:0:1::3")
	l2Gw6   = netip.MustParseAddr("fd00:70:0:1::1")
)

func progL2Datapath(t *testing.T) *Datapath {
	t.Helper()
	d := progDatapath(t)
	for _, err := range []error{
		d.SetConfig(Config{UnderlayIP: progNodeV6, UnderlayIPv4: progNodeV4, Locator: progLocator, UnderlayIfIndex: 1, GuardUnderlay: true}),
		d.UpsertPort(Port{IfIndex: l2PortA, NetID: progNet, V4: l2A4, V6: l2A6, L2: true}),
		d.UpsertPort(Port{IfIndex: l2PortB, NetID: progNet, V4: l2B4, V6: l2B6, L2: true}),
		// An l3 port: from_l2 is never its program.
		d.UpsertPort(Port{IfIndex: progPort, NetID: progNet, V4: progPodV4, V6: progPodV6}),
		d.SyncL2Local([]L2Neighbor{
			{NetID: progNet, Addr: l2A4, MAC: l2MACA}, {NetID: progNet, Addr: l2A6, MAC: l2MACA},
			{NetID: progNet, Addr: l2B4, MAC: l2MACB}, {NetID: progNet, Addr: l2B6, MAC: l2MACB},
			{NetID: progNet, Addr: l2Gw4, MAC: l2MACGw, Router: true}, {NetID: progNet, Addr: l2Gw6, MAC: l2MACGw, Router: true},
		}, []FDBEntry{
			{NetID: progNet, MAC: l2MACA, IfIndex: l2PortA}, {NetID: progNet, MAC: l2MACB, IfIndex: l2PortB},
			{NetID: progNet, MAC: l2MACGw, Gateway: true},
		}),
	} {
		if err != nil {
			t.Fatal(err)
		}
	}
	return d
}

// fromMAC sets a frame's source MAC.
func fromMAC(src net.HardwareAddr, pkt []byte) []byte {
	copy(pkt[6:12], src)
	return pkt
}

func runL2(t *testing.T, d *Datapath, port uint32, pkt []byte) (uint32, []byte) {
	t.Helper()
	out := make([]byte, len(pkt)+256)
	opts := &ebpf.RunOptions{Data: pkt, DataOut: out, Context: skbCtx(port)}
	ret, err := d.l2.FromL2.Run(opts)
	if err != nil {
		t.Fatalf("BPF_PROG_RUN: %v", err)
	}
	return ret, opts.DataOut
}

// onlyForwarded runs f and checks that forwarding counter what moved by
// exactly one.
func onlyForwarded(t *testing.T, d *Datapath, what string, f func()) {
	t.Helper()
	before, err := d.Forwarded()
	if err != nil {
		t.Fatal(err)
	}
	f()
	after, err := d.Forwarded()
	if err != nil {
		t.Fatal(err)
	}
	if after[what] != before[what]+1 {
		t.Errorf("forwarding counter %s went %d -> %d, want +1", what, before[what], after[what])
	}
}

// TestProgL2Answers: a port's ARP requests and neighbour solicitations for
// addresses its network holds (a peer's, the gateway's) are answered in
// place and sent back to it, the gateway's advertisement with the router
// flag; nothing else about address resolution leaves the port.
func TestProgL2Answers(t *testing.T) {
	d := progL2Datapath(t)
	for _, c := range []struct {
		target netip.Addr
		mac    net.HardwareAddr
	}{{l2B4, l2MACB}, {l2Gw4, l2MACGw}} {
		var ret uint32
		var out []byte
		onlyDrop(t, d, "", func() {
			onlyForwarded(t, d, "l2-answered", func() {
				ret, out = runL2(t, d, l2PortA, fromMAC(l2MACA, arpRequest(l2MACA, l2A4, c.target)))
			})
		})
		if ret != actRedirect {
			t.Fatalf("ARP for %s: verdict %d, want a redirect back to the port", c.target, ret)
		}
		a := out[14:]
		if !bytesEqual(out[0:6], l2MACA) || !bytesEqual(out[6:12], c.mac) || binary.BigEndian.Uint16(a[6:]) != 2 ||
			!bytesEqual(a[8:14], c.mac) || netip.AddrFrom4([4]byte(a[14:18])) != c.target ||
			!bytesEqual(a[18:24], l2MACA) || netip.AddrFrom4([4]byte(a[24:28])) != l2A4 {
			t.Errorf("ARP reply for %s: % x", c.target, out[:42])
		}
	}
	for _, c := range []struct {
		src, target netip.Addr
		mac         net.HardwareAddr
		router      bool
	}{
		{l2A6, l2B6, l2MACB, false},
		{l2A6, l2Gw6, l2MACGw, true},
		{netip.MustParseAddr("fe80::858:aff:fe46:102"), l2Gw6, l2MACGw, true}, // from the port's link-local address
	} {
		var ret uint32
		var out []byte
		onlyForwarded(t, d, "l2-answered", func() {
			ret, out = runL2(t, d, l2PortA, fromMAC(l2MACA, neighbourSolicitation(c.src, c.target, l2MACA)))
		})
		if ret != actRedirect {
			t.Fatalf("NS for %s: verdict %d, want a redirect back to the port", c.target, ret)
		}
		ip, na := out[14:54], out[54:86]
		flags := byte(0x60)
		if c.router {
			flags = 0xe0
		}
		if !bytesEqual(out[0:6], l2MACA) || !bytesEqual(out[6:12], c.mac) || ip[7] != 255 ||
			netip.AddrFrom16([16]byte(ip[8:24])) != c.target || netip.AddrFrom16([16]byte(ip[24:40])) != c.src ||
			na[0] != 136 || na[4] != flags || netip.AddrFrom16([16]byte(na[8:24])) != c.target || na[24] != 2 || !bytesEqual(na[26:32], c.mac) {
			t.Errorf("NA for %s: % x", c.target, out[:86])
		}
		if !icmp6ChecksumOK(out[14:86]) {
			t.Errorf("NA for %s: the ICMPv6 checksum does not verify", c.target)
		}
	}
}

// TestProgL2Refuses: every frame a port may not send is dropped under its
// reason, and what a port may send goes where its destination MAC says.
func TestProgL2Refuses(t *testing.T) {
	d := progL2Datapath(t)
	bcast := net.HardwareAddr{0xff, 0xff, 0xff, 0xff, 0xff, 0xff}
	other := net.HardwareAddr{0x0a, 0x58, 10, 70, 1, 99}
	udpTo := func(dst net.HardwareAddr, src, to netip.Addr) []byte {
		if src.Is4() {
			return fromMAC(l2MACA, ether(dst, 0x0800, ipv4(src, to, 17, udp(1000, 7))))
		}
		return fromMAC(l2MACA, ether(dst, 0x86dd, ipv6(src, to, 17, udp(1000, 7))))
	}
	arpWithSender := func(sha net.HardwareAddr) []byte {
		return fromMAC(l2MACA, arpRequest(sha, l2A4, l2B4))
	}
	cases := []struct {
		name   string
		port   uint32
		pkt    []byte
		want   uint32
		reason string
	}{
		{"ARP for an address the network does not hold", l2PortA, fromMAC(l2MACA, arpRequest(l2MACA, l2A4, netip.MustParseAddr("10.70.1.77"))), actShot, "l2-unknown-neighbour"},
		{"ARP probe (duplicate detection)", l2PortA, fromMAC(l2MACA, arpRequest(l2MACA, netip.IPv4Unspecified(), l2B4)), actShot, "l2-not-forwarded"},
		{"gratuitous ARP", l2PortA, fromMAC(l2MACA, arpRequest(l2MACA, l2A4, l2A4)), actShot, "l2-not-forwarded"},
		{"ARP from another port's address", l2PortA, fromMAC(l2MACA, arpRequest(l2MACA, l2B4, l2Gw4)), actShot, "spoofed-source"},
		{"ARP whose sender MAC is not the frame's", l2PortA, arpWithSender(l2MACB), actShot, "l2-spoofed-mac"},
		{"a frame from another port's MAC", l2PortA, fromMAC(l2MACB, ether(l2MACGw, 0x0800, ipv4(l2B4, l2Gw4, 17, udp(1, 7)))), actShot, "l2-spoofed-mac"},
		{"a frame from an unknown MAC", l2PortA, fromMAC(other, ether(l2MACB, 0x0800, ipv4(l2A4, l2B4, 17, udp(1, 7)))), actShot, "l2-spoofed-mac"},
		{"duplicate address detection", l2PortA, fromMAC(l2MACA, neighbourSolicitation(netip.IPv6Unspecified(), l2A6, l2MACA)), actShot, "l2-not-forwarded"},
		{"NS from another port's address", l2PortA, fromMAC(l2MACA, neighbourSolicitation(l2B6, l2Gw6, l2MACA)), actShot, "spoofed-source"},
		{"NS for an address the network does not hold", l2PortA, fromMAC(l2MACA, neighbourSolicitation(l2A6, netip.MustParseAddr("fd00:70:0:1::77"), l2MACA)), actShot, "l2-unknown-neighbour"},
		{"IPv4 from another port's address", l2PortA, udpTo(l2MACB, l2B4, l2B4), actShot, "spoofed-source"},
		{"IPv6 from another port's address", l2PortA, udpTo(l2MACB, l2B6, l2B6), actShot, "spoofed-source"},
		// Flooded: consumed, copied to no one here (no other port, no node).
		{"IPv4 broadcast", l2PortA, udpTo(bcast, l2A4, netip.MustParseAddr("10.70.1.255")), actShot, ""},
		{"to an unknown MAC", l2PortA, udpTo(other, l2A4, l2B4), actShot, "l2-unknown-destination"},
		{"back to its own MAC", l2PortA, udpTo(l2MACA, l2A4, l2A4), actShot, "l2-unknown-destination"},
		{"not IP", l2PortA, fromMAC(l2MACA, ether(l2MACB, 0x88cc, make([]byte, 46))), actShot, "link-local"},
		{"from a port of an l3 network", progPort, fromMAC(l2MACA, ether(l2MACB, 0x0800, ipv4(progPodV4, l2B4, 17, udp(1, 7)))), actShot, "unknown-port"},
		// Switched on the node: IPv4 and IPv6 to a peer's MAC.
		{"IPv4 to a peer", l2PortA, udpTo(l2MACB, l2A4, l2B4), actRedirect, ""},
		{"IPv6 to a peer", l2PortA, udpTo(l2MACB, l2A6, l2B6), actRedirect, ""},
		// Routed: a frame to the gateway continues in from_pod, which
		// judges it as an l3 pod's (a connection to the node is no
		// answer: dropped under from_pod's own reason).
		{"IPv4 to the gateway, for the node", l2PortA, fromMAC(l2MACA, ether(l2MACGw, 0x0800, ipv4(l2A4, progNodeV4, 6, tcpSYN(999, 10250)))), actShot, "to-node-not-answer"},
		{"IPv6 to the gateway, for the node", l2PortA, fromMAC(l2MACA, ether(l2MACGw, 0x86dd, ipv6(l2A6, progNodeV6, 6, tcpSYN(999, 10250)))), actShot, "to-node-not-answer"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			onlyDrop(t, d, c.reason, func() {
				if got, _ := runL2(t, d, c.port, c.pkt); got != c.want {
					t.Errorf("verdict %d, want %d", got, c.want)
				}
			})
		})
	}
	t.Run("switched frames are counted", func(t *testing.T) {
		onlyForwarded(t, d, "switched", func() { runL2(t, d, l2PortA, udpTo(l2MACB, l2A4, l2B4)) })
	})
	// Without the routing program in its slot (an agent that failed
	// half-way through loading), a frame to the gateway is dropped, not
	// switched or passed to the node.
	t.Run("gateway without the routing program", func(t *testing.T) {
		if err := d.l2.LaceL2Jump.Delete(uint32(0)); err != nil {
			t.Fatal(err)
		}
		onlyDrop(t, d, "l2-no-router", func() {
			if got, _ := runL2(t, d, l2PortA, fromMAC(l2MACA, ether(l2MACGw, 0x0800, ipv4(l2A4, progNodeV4, 6, tcpSYN(999, 10250))))); got != actShot {
				t.Errorf("verdict %d, want drop", got)
			}
		})
	})
}

// TestSyncL2: the tables follow the desired state exactly; a removed
// neighbour and MAC are gone.
func TestSyncL2Local(t *testing.T) {
	d := progL2Datapath(t)
	if err := d.SyncL2Local([]L2Neighbor{{NetID: progNet, Addr: l2A4, MAC: l2MACA}},
		[]FDBEntry{{NetID: progNet, MAC: l2MACA, IfIndex: l2PortA}}); err != nil {
		t.Fatal(err)
	}
	n, err := d.L2Neighbors()
	if err != nil {
		t.Fatal(err)
	}
	f, err := d.FDB()
	if err != nil {
		t.Fatal(err)
	}
	if len(n) != 1 || n[0].Addr != l2A4 || !bytesEqual(n[0].MAC, l2MACA) || len(f) != 1 || f[0].IfIndex != l2PortA {
		t.Errorf("after sync: neighbours %v, fdb %v", n, f)
	}
	if err := d.SyncL2Local([]L2Neighbor{{NetID: progNet, Addr: l2A4}}, nil); err == nil {
		t.Error("a neighbour without a MAC was accepted")
	}
	onlyDrop(t, d, "l2-unknown-neighbour", func() { runL2(t, d, l2PortA, fromMAC(l2MACA, arpRequest(l2MACA, l2A4, l2B4))) })
}

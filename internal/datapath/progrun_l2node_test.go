package datapath

import (
	"encoding/binary"
	"net"
	"net/netip"
	"os"
	"testing"

	"github.com/lace-cni/lace/internal/tables"
	"github.com/vishvananda/netlink"
)

// The l2 world across nodes: port C (l2C4/l2C6, MAC l2MACC) of network
// progNet lives on the peer node (progPeerV6, locator progOther).
var (
	l2MACC = net.HardwareAddr{0x0a, 0x58, 10, 70, 1, 4}
	l2C4   = netip.MustParseAddr("10.70.1.4")
	l2C6   = netip.MustParseAddr("fd00:70:0:1::4")
	l2Sub4 = netip.MustParsePrefix("10.70.1.0/24")
	l2Sub6 = netip.MustParsePrefix("fd00:70:0:1::/64")
)

func progL2NodesDatapath(t *testing.T) *Datapath {
	t.Helper()
	d := progL2Datapath(t)
	cRoute := func(a netip.Addr, loc netip.Prefix) Route {
		return Route{NetID: progNet, DstNet: progNet, Prefix: netip.PrefixFrom(a, a.BitLen()), SID: SID(loc, BehaviourL3Decap, progNet, progNet)}
	}
	for _, err := range []error{
		d.UpsertNodeLocator(NodeLocator{Addr: progPeerV6, Locator: progOther}),
		d.UpsertInside(Inside{Prefix: l2Sub4, Kind: tables.InsidePodSubnet}),
		d.UpsertInside(Inside{Prefix: l2Sub6, Kind: tables.InsidePodSubnet}),
		d.UpsertRoute(Route{NetID: progNet, DstNet: progNet, Prefix: l2Sub4, Kind: tables.RouteSubnet}),
		d.UpsertRoute(Route{NetID: progNet, DstNet: progNet, Prefix: l2Sub6, Kind: tables.RouteSubnet}),
		d.UpsertRoute(cRoute(l2C4, progOther)), d.UpsertRoute(cRoute(l2C6, progOther)),
		d.UpsertEndpoint(Endpoint{NetID: progNet, Addr: l2A4, IfIndex: l2PortA, PodMAC: l2MACA, HostMAC: l2MACGw}),
		d.UpsertEndpoint(Endpoint{NetID: progNet, Addr: l2A6, IfIndex: l2PortA, PodMAC: l2MACA, HostMAC: l2MACGw}),
		d.SyncL2Cluster([]L2Neighbor{{NetID: progNet, Addr: l2C4, MAC: l2MACC}, {NetID: progNet, Addr: l2C6, MAC: l2MACC}},
			[]FDBEntry{{NetID: progNet, MAC: l2MACC, SID: SID(progOther, BehaviourL2IP, progNet, progNet)}},
			[]L2FloodNode{{NetID: progNet, SID: SID(progOther, BehaviourL2Flood, progNet, progNet)}}),
	} {
		if err != nil {
			t.Fatal(err)
		}
	}
	return d
}

// TestProgL2ToNode: a unicast IP frame to a MAC on another node leaves as
// its IP packet in SRv6 to the network's SID_L2_IP SID in that node's
// locator, TTL untouched (switched); a frame whose IP destination is not
// that MAC's address is not carried.
func TestProgL2ToNode(t *testing.T) {
	d := progL2NodesDatapath(t)
	for _, c := range []struct {
		name string
		pkt  []byte
		next byte
	}{
		{"IPv4", fromMAC(l2MACA, ether(l2MACC, 0x0800, ipv4(l2A4, l2C4, 17, udp(1000, 7)))), 4},
		{"IPv6", fromMAC(l2MACA, ether(l2MACC, 0x86dd, ipv6(l2A6, l2C6, 17, udp(1000, 7)))), 41},
	} {
		t.Run(c.name, func(t *testing.T) {
			var out []byte
			// The test's namespace has no underlay route: the FIB lookup
			// after the encapsulation is what fails.
			onlyDrop(t, d, "no-underlay-route", func() { _, out = runL2(t, d, l2PortA, c.pkt) })
			want := SID(progOther, BehaviourL2IP, progNet, progNet).As16()
			if binary.BigEndian.Uint16(out[12:14]) != 0x86dd || out[14+6] != c.next || [16]byte(out[14+24:14+40]) != want {
				t.Fatalf("not encapsulated to the SID_L2_IP SID: % x", out[:60])
			}
			inner := out[14+40:]
			if (c.next == 4 && inner[8] != 64) || (c.next == 41 && inner[7] != 64) {
				t.Errorf("the inner TTL changed: % x", inner[:12])
			}
		})
	}
	onlyDrop(t, d, "l2-frame-not-carried", func() {
		runL2(t, d, l2PortA, fromMAC(l2MACA, ether(l2MACC, 0x0800, ipv4(l2A4, l2B4, 17, udp(1000, 7)))))
	})
}

// TestProgL2FromNode: SRv6 to this node's SID_L2_IP SID is delivered to
// the port holding the destination, rebuilt with the source's MAC from
// the neighbour table and the TTL kept; switching across networks, an
// unknown source and a source another node holds are refused.
func TestProgL2FromNode(t *testing.T) {
	d := progL2NodesDatapath(t)
	mySID := SID(progLocator, BehaviourL2IP, progNet, progNet)
	for _, c := range []struct {
		name  string
		inner []byte
		v4    bool
	}{
		{"IPv4", ipv4(l2C4, l2A4, 17, udp(1000, 7)), true},
		{"IPv6", ipv6(l2C6, l2A6, 17, udp(1000, 7)), false},
	} {
		t.Run(c.name, func(t *testing.T) {
			var ret uint32
			var out []byte
			onlyDrop(t, d, "", func() { ret, out = runUnderlay(t, d, srv6(progPeerV6, mySID, c.inner, c.v4)) })
			if ret != actRedirect {
				t.Fatalf("verdict %d, want a redirect to the port", ret)
			}
			if !bytesEqual(out[0:6], l2MACA) || !bytesEqual(out[6:12], l2MACC) || !bytesEqual(out[14:14+len(c.inner)], c.inner) {
				t.Errorf("delivered frame % x, want %s <- %s carrying the inner packet unchanged", out[:40], l2MACA, l2MACC)
			}
		})
	}
	other := netip.MustParsePrefix("fd1a:ce:0:3::/64")
	stranger := netip.MustParseAddr("10.70.1.9")
	for _, err := range []error{
		d.UpsertNetwork(Network{ID: progNet + 1}),
		// 10.70.1.9 is routed to a third node.
		d.UpsertRoute(Route{NetID: progNet, DstNet: progNet, Prefix: netip.PrefixFrom(stranger, 32), SID: SID(other, BehaviourL3Decap, progNet, progNet)}),
	} {
		if err != nil {
			t.Fatal(err)
		}
	}
	for _, c := range []struct {
		name, reason string
		pkt          []byte
	}{
		{"from another network", "decap-unknown-sid", srv6(progPeerV6, SID(progLocator, BehaviourL2IP, progNet+1, progNet), ipv4(l2C4, l2A4, 17, udp(1, 7)), true)},
		{"a source another node holds", "decap-foreign-source", srv6(progPeerV6, mySID, ipv4(stranger, l2A4, 17, udp(1, 7)), true)},
		{"a source no Neighbor holds", "decap-foreign-source", srv6(progPeerV6, mySID, ipv4(netip.MustParseAddr("10.70.1.10"), l2A4, 17, udp(1, 7)), true)},
		{"to no port here", "no-endpoint", srv6(progPeerV6, mySID, ipv4(l2C4, l2B4, 17, udp(1, 7)), true)},
	} {
		t.Run(c.name, func(t *testing.T) {
			onlyDrop(t, d, c.reason, func() {
				if ret, _ := runUnderlay(t, d, c.pkt); ret != actShot {
					t.Errorf("verdict %d, want drop", ret)
				}
			})
		})
	}
}

// TestProgL2Flood: a broadcast from a port is copied to the network's
// other ports and sent whole (next header 143) to the DT2M SID of every
// other node with ports in the network, the frame itself consumed; a
// flooded frame from a node is taken only from the node its source MAC
// lives on, only as a broadcast or multicast of IP (or as what a learning
// network looks for: TestProgL2UnknownFromNode).
func TestProgL2Flood(t *testing.T) {
	d := progL2NodesDatapath(t)
	if err := d.SyncL2Local([]L2Neighbor{{NetID: progNet, Addr: l2A4, MAC: l2MACA}},
		[]FDBEntry{{NetID: progNet, MAC: l2MACA, IfIndex: l2PortA}, {NetID: progNet, MAC: l2MACB, IfIndex: l2PortB}}); err != nil {
		t.Fatal(err)
	}
	bcast := net.HardwareAddr{0xff, 0xff, 0xff, 0xff, 0xff, 0xff}
	frame := fromMAC(l2MACA, ether(bcast, 0x0800, ipv4(l2A4, netip.MustParseAddr("10.70.1.255"), 17, udp(1000, 7))))
	orig := append([]byte(nil), frame...)
	var ret uint32
	var out []byte
	onlyForwarded(t, d, "flooded", func() {
		// One remote node, whose underlay route the test namespace lacks.
		onlyDrop(t, d, "no-underlay-route", func() { ret, out = runL2(t, d, l2PortA, frame) })
	})
	want := SID(progOther, BehaviourL2Flood, progNet, progNet).As16()
	if ret != actShot || binary.BigEndian.Uint16(out[12:14]) != 0x86dd || out[14+6] != 143 || [16]byte(out[14+24:14+40]) != want ||
		!bytesEqual(out[54:54+len(orig)], orig) {
		t.Errorf("verdict %d, frame % x: want it consumed, left encapsulated whole to the DT2M SID", ret, out[:80])
	}

	mySID := SID(progLocator, BehaviourL2Flood, progNet, progNet)
	flooded := func(src net.HardwareAddr, dst net.HardwareAddr, proto uint16, payload []byte) []byte {
		inner := fromMAC(src, ether(dst, proto, payload))
		return ether(unicastMAC, 0x86dd, ipv6(progPeerV6, mySID, 143, inner))
	}
	bc := ipv4(l2C4, netip.MustParseAddr("10.70.1.255"), 17, udp(1000, 7))
	t.Run("from the node its MAC lives on", func(t *testing.T) {
		onlyForwarded(t, d, "flooded", func() {
			onlyDrop(t, d, "", func() {
				if ret, _ := runUnderlay(t, d, flooded(l2MACC, bcast, 0x0800, bc)); ret != actShot {
					t.Errorf("verdict %d, want the frame consumed (copied to the ports)", ret)
				}
			})
		})
	})
	for _, c := range []struct {
		name, reason string
		pkt          []byte
	}{
		{"a MAC that lives elsewhere", "decap-foreign-source", flooded(l2MACA, bcast, 0x0800, bc)},
		{"an unknown MAC", "decap-foreign-source", flooded(net.HardwareAddr{0x0a, 0x58, 10, 70, 1, 99}, bcast, 0x0800, bc)},
		{"unicast to a MAC placed here", "l2-unknown-destination", flooded(l2MACC, l2MACA, 0x0800, bc)},
		{"not IP", "decap-bad-protocol", flooded(l2MACC, bcast, 0x88cc, make([]byte, 46))},
		{"not Ethernet", "decap-bad-protocol", ether(unicastMAC, 0x86dd, ipv6(progPeerV6, mySID, 4, bc))},
	} {
		t.Run(c.name, func(t *testing.T) {
			onlyDrop(t, d, c.reason, func() {
				if ret, _ := runUnderlay(t, d, c.pkt); ret != actShot {
					t.Errorf("verdict %d, want drop", ret)
				}
			})
		})
	}
}

// TestProgL2FloodUnresolvedNextHop: a flood to a node whose next hop the
// kernel has not resolved yet is not lost: the frame itself goes there
// through the kernel's neighbour resolution (bpf_redirect_neigh) instead
// of a clone, which cannot be sent without the next hop's MAC (CI lost
// every flood to the other node this way once the fabric's neighbour had
// aged out). Only one node can take the frame itself: a second unresolved
// one misses this flood, counted.
func TestProgL2FloodUnresolvedNextHop(t *testing.T) {
	d := progL2NodesDatapath(t)
	if !ownNetns() {
		t.Fatal("not in a network namespace of the test's own (TestMain)")
	}
	third := netip.MustParsePrefix("fd1a:ce:0:3::/64") // a third node's locator
	la := netlink.NewLinkAttrs()
	la.Name = "lfl2A"
	if err := netlink.LinkAdd(&netlink.Veth{LinkAttrs: la, PeerName: "lfl2B"}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if l, err := netlink.LinkByName("lfl2A"); err == nil {
			_ = netlink.LinkDel(l)
		}
	})
	a, err := netlink.LinkByName("lfl2A")
	if err != nil {
		t.Fatal(err)
	}
	b, err := netlink.LinkByName("lfl2B")
	if err != nil {
		t.Fatal(err)
	}
	for _, err := range []error{
		netlink.LinkSetUp(a), netlink.LinkSetUp(b),
		os.WriteFile("/proc/sys/net/ipv6/conf/lfl2A/forwarding", []byte("1"), 0o644),
		// No neighbour entry for the gateway: the FIB answers NO_NEIGH.
		netlink.RouteAdd(&netlink.Route{LinkIndex: a.Attrs().Index, Dst: &net.IPNet{IP: progOther.Addr().AsSlice(), Mask: net.CIDRMask(64, 128)}, Gw: net.ParseIP("fe80::1")}),
		netlink.RouteAdd(&netlink.Route{LinkIndex: a.Attrs().Index, Dst: &net.IPNet{IP: third.Addr().AsSlice(), Mask: net.CIDRMask(64, 128)}, Gw: net.ParseIP("fe80::2")}),
		d.SyncL2Cluster([]L2Neighbor{{NetID: progNet, Addr: l2C4, MAC: l2MACC}, {NetID: progNet, Addr: l2C6, MAC: l2MACC}},
			[]FDBEntry{{NetID: progNet, MAC: l2MACC, SID: SID(progOther, BehaviourL2IP, progNet, progNet)}},
			[]L2FloodNode{{NetID: progNet, SID: SID(progOther, BehaviourL2Flood, progNet, progNet)},
				{NetID: progNet, SID: SID(third, BehaviourL2Flood, progNet, progNet)}}),
		d.SetConfig(Config{UnderlayIP: progNodeV6, UnderlayIPv4: progNodeV4, Locator: progLocator, UnderlayIfIndex: uint32(a.Attrs().Index), GuardUnderlay: true}),
		d.SyncL2Local([]L2Neighbor{{NetID: progNet, Addr: l2A4, MAC: l2MACA}},
			[]FDBEntry{{NetID: progNet, MAC: l2MACA, IfIndex: l2PortA}, {NetID: progNet, MAC: l2MACB, IfIndex: l2PortB}}),
	} {
		if err != nil {
			t.Fatal(err)
		}
	}
	bcast := net.HardwareAddr{0xff, 0xff, 0xff, 0xff, 0xff, 0xff}
	frame := fromMAC(l2MACA, ether(bcast, 0x0800, ipv4(l2A4, netip.MustParseAddr("10.70.1.255"), 17, udp(1000, 7))))
	orig := append([]byte(nil), frame...)
	var ret uint32
	var out []byte
	onlyForwarded(t, d, "flooded", func() {
		onlyDrop(t, d, "no-underlay-route", func() { ret, out = runL2(t, d, l2PortA, frame) })
	})
	want := SID(progOther, BehaviourL2Flood, progNet, progNet).As16()
	// The kernel resolves only for a frame not addressed to a multicast
	// MAC (the flood's own).
	if ret != actRedirect || out[0]&1 != 0 || out[14+6] != 143 || [16]byte(out[14+24:14+40]) != want || !bytesEqual(out[54:54+len(orig)], orig) {
		t.Errorf("verdict %d, frame % x: want it redirected through neighbour resolution, encapsulated whole to the DT2M SID", ret, out[:80])
	}
}

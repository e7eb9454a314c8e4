package datapath

import (
	"encoding/binary"
	"net"
	"net/netip"
	"testing"
)

// A learning port L of progNet on this node, beside the nodes' world of
// progL2NodesDatapath (port C on the peer node).
var (
	l2MACL  = net.HardwareAddr{0x0a, 0x58, 10, 70, 1, 5}
	l2L4    = netip.MustParseAddr("10.70.1.5")
	l2L6    = netip.MustParseAddr("fd00:70:0:1::5")
	silent4 = netip.MustParseAddr("10.70.1.200")
	silent6 = netip.MustParseAddr("fd00:70:0:1::c8")
	silentM = net.HardwareAddr{0x52, 0x54, 0, 0x69, 0, 0xc8}
)

const l2PortL = 5005

// toMAC addresses frame pkt to dst.
func toMAC(dst net.HardwareAddr, pkt []byte) []byte {
	copy(pkt[0:6], dst)
	return pkt
}

func progL2UnknownDatapath(t *testing.T) *Datapath {
	t.Helper()
	d := progL2NodesDatapath(t)
	if err := d.UpsertPort(Port{IfIndex: l2PortL, NetID: progNet, V4: l2L4, V6: l2L6, L2: true, Learn: true}); err != nil {
		t.Fatal(err)
	}
	if err := d.SyncL2Local([]L2Neighbor{
		{NetID: progNet, Addr: l2A4, MAC: l2MACA}, {NetID: progNet, Addr: l2A6, MAC: l2MACA},
		{NetID: progNet, Addr: l2L4, MAC: l2MACL}, {NetID: progNet, Addr: l2L6, MAC: l2MACL},
	}, []FDBEntry{
		{NetID: progNet, MAC: l2MACA, IfIndex: l2PortA}, {NetID: progNet, MAC: l2MACL, IfIndex: l2PortL},
	}); err != nil {
		t.Fatal(err)
	}
	return d
}

// TestProgL2UnknownFlooded: on a learning network, what looks for an
// address or MAC the network does not know (a silent guest's: an ARP
// request, a plain neighbour solicitation, a unicast frame to an unknown
// MAC) is flooded, counted l2-unknown-flooded, and leaves whole to the
// other node's DT2M SID; a solicitation whose link-layer option is not its
// sender's MAC, or from a link-local address, is not, nor a unicast
// question (a neighbour's revalidation), nor a frame to an unknown MAC
// whose destination is an address the network holds (it belongs to that
// address's MAC: no learning port may read it) or that is an ICMP error;
// a port that does not learn drops all of it as before. An advertisement from an address the
// network does not hold yet is reported for learning, as a gratuitous ARP
// is.
func TestProgL2UnknownFlooded(t *testing.T) {
	d := progL2UnknownDatapath(t)
	dt2m := SID(progOther, BehaviourL2Flood, progNet, progNet).As16()
	unknownUnicast := func(src net.HardwareAddr, from netip.Addr) []byte {
		return fromMAC(src, ether(silentM, 0x0800, ipv4(from, silent4, 17, udp(1000, 7))))
	}
	for _, c := range []struct {
		name string
		pkt  []byte
	}{
		{"an ARP request for an unknown address", fromMAC(l2MACL, arpRequest(l2MACL, l2L4, silent4))},
		{"a solicitation for an unknown address", fromMAC(l2MACL, neighbourSolicitation(l2L6, silent6, l2MACL))},
		{"a frame to an unknown MAC", unknownUnicast(l2MACL, l2L4)},
	} {
		t.Run(c.name, func(t *testing.T) {
			orig := append([]byte(nil), c.pkt...)
			var ret uint32
			var out []byte
			onlyForwarded(t, d, "l2-unknown-flooded", func() {
				// The peer node's underlay route is not in the test's namespace.
				onlyDrop(t, d, "no-underlay-route", func() { ret, out = runL2(t, d, l2PortL, c.pkt) })
			})
			if ret != actShot || binary.BigEndian.Uint16(out[12:14]) != 0x86dd || out[14+6] != 143 ||
				[16]byte(out[14+24:14+40]) != dt2m || !bytesEqual(out[54:54+len(orig)], orig) {
				t.Errorf("verdict %d, frame % x: want it consumed, left encapsulated whole to the DT2M SID", ret, out[:80])
			}
			// A short frame (the ARP request) crosses padded with zeros to
			// Ethernet's 60 bytes, which its receiver needs to decapsulate it.
			want := len(orig)
			if binary.BigEndian.Uint16(orig[12:14]) == 0x0806 {
				want = max(want, 60)
			}
			if got := int(binary.BigEndian.Uint16(out[14+4 : 14+6])); got != want ||
				!bytesEqual(out[54+len(orig):54+want], make([]byte, want-len(orig))) {
				t.Errorf("carried a frame of %d bytes, % x, want %d, padded with zeros", got, out[54:54+got], want)
			}
		})
	}
	otherMAC := net.HardwareAddr{0x0a, 0x58, 10, 70, 1, 0x63}
	for _, c := range []struct {
		name   string
		port   uint32
		pkt    []byte
		reason string
	}{
		{"a solicitation naming another MAC", l2PortL, fromMAC(l2MACL, neighbourSolicitation(l2L6, silent6, otherMAC)), "l2-unknown-neighbour"},
		{"a solicitation from a link-local address", l2PortL,
			fromMAC(l2MACL, neighbourSolicitation(netip.MustParseAddr("fe80::5"), silent6, l2MACL)), "l2-unknown-neighbour"},
		{"a frame to an unknown MAC for an address the network holds", l2PortL,
			fromMAC(l2MACL, ether(silentM, 0x0800, ipv4(l2L4, l2A4, 17, udp(1000, 7)))), "l2-unknown-destination"},
		{"an ICMP error to an unknown MAC", l2PortL,
			fromMAC(l2MACL, ether(silentM, 0x0800, ipv4(l2L4, silent4, 1, []byte{3, 3, 0, 0, 0, 0, 0, 0}))), "icmp-error-no-flow"},
		{"a unicast ARP request for an unknown address", l2PortL, toMAC(silentM, fromMAC(l2MACL, arpRequest(l2MACL, l2L4, silent4))), "l2-unknown-neighbour"},
		{"not learning: an ARP request", l2PortA, fromMAC(l2MACA, arpRequest(l2MACA, l2A4, silent4)), "l2-unknown-neighbour"},
		{"not learning: a solicitation", l2PortA, fromMAC(l2MACA, neighbourSolicitation(l2A6, silent6, l2MACA)), "l2-unknown-neighbour"},
		{"not learning: a frame to an unknown MAC", l2PortA, unknownUnicast(l2MACA, l2A4), "l2-unknown-destination"},
	} {
		t.Run(c.name, func(t *testing.T) {
			onlyDrop(t, d, c.reason, func() {
				if ret, _ := runL2(t, d, c.port, c.pkt); ret != actShot {
					t.Errorf("verdict %d, want drop", ret)
				}
			})
		})
	}
	t.Run("an advertisement of an unknown address", func(t *testing.T) {
		_ = d.l2.LaceL2LearnGap.Delete(uint32(l2PortL))
		next, na := neighbourAdvert(silent6, l2A6, silent6, l2MACL)
		ip := ipv6(silent6, l2A6, next, na)
		ip[7] = 255
		onlyDrop(t, d, "l2-learning", func() { runL2(t, d, l2PortL, fromMAC(l2MACL, ether(l2MACA, 0x86dd, ip))) })
	})
}

// TestProgL2UnknownFromNode: what a learning network floods to find an
// unknown address or MAC is taken from the node its sender lives on: an
// ARP request from its sender's own address, a plain solicitation, a
// unicast frame to a MAC this node does not place (l2-unknown-flooded);
// not a request from an address its MAC does not hold, a solicitation
// naming another MAC, a question for an address this node holds (answered
// on every node, never carried), a frame to a MAC placed here or to an
// unknown MAC for an address held here, an ICMP error or a solicitation to
// an unknown MAC, a DAD
// probe, an ARP request shorter than Ethernet's 60 bytes (its sender pads
// it).
func TestProgL2UnknownFromNode(t *testing.T) {
	d := progL2UnknownDatapath(t)
	mySID := SID(progLocator, BehaviourL2Flood, progNet, progNet)
	flooded := func(src, dst net.HardwareAddr, proto uint16, payload []byte) []byte {
		inner := fromMAC(src, ether(dst, proto, payload))
		return ether(unicastMAC, 0x86dd, ipv6(progPeerV6, mySID, 143, inner))
	}
	// Another node's frame as it asks: arpRequest and neighbourSolicitation
	// make whole frames, padded as their sender pads them (to 60 bytes).
	asks := func(f []byte) []byte {
		if len(f) < 60 {
			f = append(f, make([]byte, 60-len(f))...)
		}
		return flooded(l2MACC, net.HardwareAddr(f[0:6]), binary.BigEndian.Uint16(f[12:14]), f[14:])
	}
	ns := func(src, target netip.Addr, sha net.HardwareAddr) []byte {
		return asks(neighbourSolicitation(src, target, sha))
	}
	otherMAC := net.HardwareAddr{0x0a, 0x58, 10, 70, 1, 0x63}
	for _, c := range []struct {
		name, reason string
		pkt          []byte
	}{
		{"an ARP request for an unknown address", "", asks(arpRequest(l2MACC, l2C4, silent4))},
		{"a solicitation for an unknown address", "", ns(l2C6, silent6, l2MACC)},
		{"a frame to an unknown MAC", "", flooded(l2MACC, silentM, 0x0800, ipv4(l2C4, silent4, 17, udp(1000, 7)))},
		{"an ARP request from an address not its MAC's", "decap-foreign-source", asks(arpRequest(l2MACC, silent4, l2L4))},
		{"an ARP request naming another MAC", "decap-foreign-source", asks(arpRequest(otherMAC, l2C4, silent4))},
		{"an ARP request for an address held here", "l2-unknown-neighbour", asks(arpRequest(l2MACC, l2C4, l2L4))},
		{"an ARP probe", "l2-not-forwarded", asks(arpRequest(l2MACC, netip.IPv4Unspecified(), silent4))},
		{"an unpadded ARP request (no sender of ours)", "header-adjust-failed",
			flooded(l2MACC, net.HardwareAddr{0xff, 0xff, 0xff, 0xff, 0xff, 0xff}, 0x0806, arpRequest(l2MACC, l2C4, silent4)[14:])},
		{"a solicitation naming another MAC", "l2-not-forwarded", ns(l2C6, silent6, otherMAC)},
		{"a solicitation for an address held here", "l2-unknown-neighbour", ns(l2C6, l2L6, l2MACC)},
		{"a frame to an unknown MAC for an address held here", "l2-unknown-destination",
			flooded(l2MACC, silentM, 0x0800, ipv4(l2C4, l2L4, 17, udp(1000, 7)))},
		{"an ICMP error to an unknown MAC", "l2-unknown-destination",
			flooded(l2MACC, silentM, 0x0800, ipv4(l2C4, silent4, 1, []byte{3, 3, 0, 0, 0, 0, 0, 0}))},
		{"a solicitation to an unknown MAC", "l2-not-forwarded", asks(toMAC(silentM, neighbourSolicitation(l2C6, silent6, l2MACC)))},
		{"a frame to a MAC placed here", "l2-unknown-destination", flooded(l2MACC, l2MACL, 0x0800, ipv4(l2C4, l2L4, 17, udp(1000, 7)))},
	} {
		t.Run(c.name, func(t *testing.T) {
			run := func() {
				onlyDrop(t, d, c.reason, func() {
					if ret, _ := runUnderlay(t, d, c.pkt); ret != actShot {
						t.Errorf("verdict %d, want the frame consumed", ret)
					}
				})
			}
			if c.reason == "" {
				onlyForwarded(t, d, "l2-unknown-flooded", run)
			} else {
				run()
			}
		})
	}
}

package datapath

import (
	"net/netip"
	"testing"

	"github.com/cilium/ebpf"

	"github.com/lace-cni/lace/internal/tables"
)

// Regression tests for the review of the isolation work (docs/security.md
// sections 4, 5, 8). Each asserts the fixed behaviour: exactly one drop
// counter moves.

// TestProgMarkedForgeryWithForeignSource: SO_MARK needs only CAP_NET_RAW
// (Linux 5.17+), so a hostNetwork pod can set LACE_MARK_ENCAP on a raw
// socket. The mark must not let SRv6 leave from ANOTHER node's outer
// source, nor a marked non-IPv6 frame leave at all.
func TestProgMarkedForgeryWithForeignSource(t *testing.T) {
	d := progWorldDatapath(t)
	peerSID := SID(progOther, BehaviourL3Decap, progNet, progNet)
	inner := ipv4(netip.MustParseAddr("10.70.2.2"), netip.MustParseAddr("10.70.3.2"), 17, udp(1000, 7))
	for name, pkt := range map[string][]byte{
		"SRv6 from the peer's address":          srv6(progPeerV6, peerSID, inner, true),
		"IPv4 (Lace encapsulates only in IPv6)": inner,
	} {
		onlyDrop(t, d, "node-forged-underlay", func() {
			ret, err := d.underlay.ToUnderlay.Run(&ebpf.RunOptions{Data: pkt, Context: skbMarkCtx(laceMarkEncap)})
			if err != nil {
				t.Fatal(err)
			}
			if ret != actShot {
				t.Errorf("%s, marked: verdict %d, want a drop", name, ret)
			}
		})
	}
}

// TestProgForeignSourceViaNodesContext (review R2): decap-foreign-source
// used to be skipped when the SID's source network is the nodes' context
// (0xffff), so any node claimed any pod of any other node (or of this
// node's own block). There the inner source must not be inside.
func TestProgForeignSourceViaNodesContext(t *testing.T) {
	d := progWorldDatapath(t)
	if err := d.UpsertNetwork(Network{ID: tables.NodeNetID}); err != nil { // as model/node.go:164
		t.Fatal(err)
	}
	third, thirdLoc := netip.MustParseAddr("fd00:99::3"), netip.MustParsePrefix("fd1a:ce:0:3::/64")
	for _, err := range []error{
		d.UpsertNode(third), d.UpsertNodeLocator(NodeLocator{Addr: third, Locator: thirdLoc}),
		d.UpsertRoute(Route{NetID: progNet, DstNet: progNet, Prefix: netip.MustParsePrefix("10.70.1.0/24"), Kind: tables.RouteLocal}),
	} {
		if err != nil {
			t.Fatal(err)
		}
	}
	sid := SID(progLocator, BehaviourL3Decap, tables.NodeNetID, progNet)
	for i, src := range []string{"10.70.2.2" /* the peer's pod */, "10.70.1.3" /* our own block */} {
		onlyDrop(t, d, "decap-foreign-source", func() {
			underlayVerdict(t, d, srv6(third, sid, ipv4(netip.MustParseAddr(src), progPodV4, 17, udp(uint16(5000+i), 7)), true), actShot)
		})
	}
}

// TestProgNonIPImpersonation (review R4): to_underlay looked only at the
// IPv4/IPv6 EtherTypes. A gratuitous ARP claiming another node's IPv4
// address, an unsolicited Neighbour Advertisement for another node's IPv6
// address (from a link-local source), and a VLAN-tagged frame carrying
// SRv6 from another node's address are each node-forged-underlay; the
// same frames for this node's own addresses pass.
func TestProgNonIPImpersonation(t *testing.T) {
	d := progWorldDatapath(t)
	peerV4, ownV4 := netip.MustParseAddr("172.31.0.2"), netip.MustParseAddr("172.31.0.1")
	for _, err := range []error{d.UpsertNode(peerV4), d.UpsertNode(ownV4), d.UpsertHostAddr(ownV4)} {
		if err != nil {
			t.Fatal(err)
		}
	}
	na := func(target netip.Addr) []byte {
		b := make([]byte, 32)
		b[0] = 136
		b[4] = 0x20 // override
		tg := target.As16()
		copy(b[8:24], tg[:])
		b[24], b[25] = 2, 1 // target link-layer address: ours
		copy(b[26:32], unicastMAC)
		return ether(unicastMAC, 0x86dd, ipv6(netip.MustParseAddr("fe80::1"), netip.MustParseAddr("ff02::1"), 58, b))
	}
	tag := func(frame []byte, tpid uint16) []byte {
		return append(append(append([]byte{}, frame[:12]...), byte(tpid>>8), byte(tpid), 0x00, 0x00), frame[12:]...)
	}
	inner := ipv4(netip.MustParseAddr("10.70.2.2"), netip.MustParseAddr("10.70.3.2"), 17, udp(1000, 7))
	forged := srv6(progPeerV6, SID(progOther, BehaviourL3Decap, progNet, progNet), inner, true)
	for _, c := range []struct {
		name string
		pkt  []byte
	}{
		{"gratuitous ARP for another node's address", arpRequest(unicastMAC, peerV4, peerV4)},
		{"unsolicited NA for another node's address", na(progPeerV6)},
		{"802.1Q priority-tagged SRv6 from another node", tag(forged, 0x8100)},
		{"802.1ad-tagged SRv6 from another node", tag(forged, 0x88a8)},
	} {
		onlyDrop(t, d, "node-forged-underlay", func() {
			ret, err := d.underlay.ToUnderlay.Run(&ebpf.RunOptions{Data: c.pkt, Context: skbMarkCtx(0)})
			if err != nil {
				t.Fatal(err)
			}
			if ret != actShot {
				t.Errorf("%s: verdict %d, want a drop", c.name, ret)
			}
		})
	}
	for name, pkt := range map[string][]byte{
		"gratuitous ARP for our own address":     arpRequest(unicastMAC, ownV4, ownV4),
		"NA for our own address":                 na(progNodeV6),
		"tagged plain IPv6 from our own address": tag(ipv6(progNodeV6, progPeerV6, 17, udp(1, 2)), 0x8100),
	} {
		ret, err := d.underlay.ToUnderlay.Run(&ebpf.RunOptions{Data: pkt, Context: skbMarkCtx(0)})
		if err != nil {
			t.Fatal(err)
		}
		if ret != actOK {
			t.Errorf("%s: verdict %d, want it to pass", name, ret)
		}
	}
}

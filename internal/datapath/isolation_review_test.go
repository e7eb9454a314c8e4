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

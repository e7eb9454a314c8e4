package datapath

import (
	"net/netip"
	"testing"

	"github.com/cilium/ebpf"
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
		"SRv6 from the peer's address": srv6(progPeerV6, peerSID, inner, true),
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

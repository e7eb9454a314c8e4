package datapath

import (
	"net/netip"
	"testing"

	"github.com/cilium/ebpf"
)

// TestProgThirdVLANTag: to_underlay reads two VLAN tags; a frame with a
// third one carried SRv6 from another node's address (or anything) past
// its checks. A frame still tagged after two tags is node-forged-underlay,
// whatever it carries; two tags around this node's own traffic still pass.
func TestProgThirdVLANTag(t *testing.T) {
	d := progWorldDatapath(t)
	tag := func(frame []byte, tpids ...uint16) []byte {
		out := append([]byte{}, frame[:12]...)
		for _, tp := range tpids {
			out = append(out, byte(tp>>8), byte(tp), 0x00, 0x00)
		}
		return append(out, frame[12:]...)
	}
	inner := ipv4(netip.MustParseAddr("10.70.2.2"), netip.MustParseAddr("10.70.3.2"), 17, udp(1000, 7))
	forged := srv6(progPeerV6, SID(progOther, BehaviourL3Decap, progNet, progNet), inner, true)
	own := ether(unicastMAC, 0x86dd, ipv6(progNodeV6, progPeerV6, 17, udp(1, 2)))
	run := func(pkt []byte) uint32 {
		ret, err := d.underlay.ToUnderlay.Run(&ebpf.RunOptions{Data: pkt, Context: skbMarkCtx(0)})
		if err != nil {
			t.Fatal(err)
		}
		return ret
	}
	for name, pkt := range map[string][]byte{
		"SRv6 from another node behind 802.1ad, 802.1Q, 802.1Q": tag(forged, 0x88a8, 0x8100, 0x8100),
		"SRv6 from another node behind four 802.1Q tags":        tag(forged, 0x8100, 0x8100, 0x8100, 0x8100),
		"plain IPv6 from our own address behind three tags":     tag(own, 0x8100, 0x8100, 0x8100),
	} {
		onlyDrop(t, d, "node-forged-underlay", func() {
			if ret := run(pkt); ret != actShot {
				t.Errorf("%s: verdict %d, want a drop", name, ret)
			}
		})
	}
	if ret := run(tag(own, 0x88a8, 0x8100)); ret != actOK {
		t.Errorf("our own IPv6 behind two tags: verdict %d, want it to pass", ret)
	}
}

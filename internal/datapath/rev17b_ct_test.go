package datapath

import (
	"net/netip"
	"testing"
)

// A spoofed outside host handshakes blindly with a NodePort whose
// endpoint is on this node; the pod resets the blind ACK; the spoofer
// ignores the reset and sends one more ACK. The pod's reset left this node
// from the pod itself (nobody on the path forged it): the host it was sent
// to speaking on must not revive the flow to the established 6 h in
// lace_ct.
func TestRev17bBlindHandshakeRevivedAfterPodReset(t *testing.T) {
	d := nodePortWorld(t, progPodV4)
	c := netip.MustParseAddr("203.0.113.5")
	if v, _ := runUnder(t, d, ether(unicastMAC, 0x0800, ipv4(c, progNodeV4, 6, seg4(5555, 30080, 0x02)))); v != actRedirect {
		t.Fatalf("SYN verdict %d", v)
	}
	runPod(t, d, ether(unicastMAC, 0x0800, ipv4(progPodV4, c, 6, seg4(8080, 5555, 0x12))))     // SYN-ACK (to nobody)
	runUnder(t, d, ether(unicastMAC, 0x0800, ipv4(c, progNodeV4, 6, seg4(5555, 30080, 0x10)))) // blind ACK
	runPod(t, d, ether(unicastMAC, 0x0800, ipv4(progPodV4, c, 6, seg4(8080, 5555, 0x04))))     // the pod resets it
	runUnder(t, d, ether(unicastMAC, 0x0800, ipv4(c, progNodeV4, 6, seg4(5555, 30080, 0x10)))) // the spoofer ignores it
	noLongEntries(t, d, "REVIVED", "after the pod reset the blind handshake")
}

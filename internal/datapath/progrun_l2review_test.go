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

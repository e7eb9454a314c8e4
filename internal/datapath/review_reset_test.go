package datapath

import (
	"encoding/binary"
	"net/netip"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// TestXLBReviewLostHandshakeResetByItsOwnACK: a flood churns lace_ct_new
// (32,768 entries, any frontend's unanswered flows share it), so an
// honest client's pending entry can be evicted between its SYN and its
// last ACK. xlb_port is designed for that: the ACK re-finds the port and
// endpoint its SYN had (TestCTLostHandshakeKeepsEndpoint). But the
// mapping it re-finds is its own, still XLB_REV_HALF_OPEN (only
// xlb_port_held clears it, which the lost entry skipped), and its owner
// is "missing": so the client's own ACK is preceded by a reset with
// sequence number ISN+1 from the same node port to the same endpoint,
// exactly what the endpoint's SYN_RECV request accepts. The endpoint
// drops the request, the ACK that follows meets no connection and is
// answered with a reset: a handshake that would have completed fails.
func TestXLBReviewLostHandshakeResetByItsOwnACK(t *testing.T) {
	remote := netip.MustParseAddr("10.70.2.5")
	d := nodePortWorld(t, remote)
	capture := resetWorld(t, d)
	client := netip.AddrPortFrom(netip.MustParseAddr("203.0.113.5"), 40000)
	const isn = 0x11223344
	if v, _ := runUnder(t, d, synWithSeq(client, progNodeV4, 30080, isn)); v != actRedirect {
		t.Fatalf("SYN: verdict %d", v)
	}
	if got := capture.resets(300 * time.Millisecond); len(got) != 0 {
		t.Fatalf("the SYN sent %d resets", len(got))
	}
	p := nodePortFlow(t, d, client).SNATPort

	// The flood evicts the pending entry (as TestCTLostHandshakeKeepsEndpoint).
	evictPending(t, d)

	// The client's last ACK (the SYN-ACK crossed before the eviction).
	ack := seg4(client.Port(), 30080, 0x10)
	binary.BigEndian.PutUint32(ack[4:8], isn+1)
	binary.BigEndian.PutUint32(ack[8:12], 0x99999999)
	cs, nd := client.Addr().As4(), progNodeV4.As4()
	binary.BigEndian.PutUint16(ack[16:18], tcpSum4(cs[:], nd[:], ack))
	if v, _ := runUnder(t, d, ether(unicastMAC, 0x0800, ipv4(client.Addr(), progNodeV4, 6, ack))); v != actRedirect {
		t.Fatalf("ACK: verdict %d", v)
	}
	if got := nodePortFlow(t, d, client).SNATPort; got != p {
		t.Fatalf("the ACK left on port %d, the SYN on %d", got, p)
	}
	for _, r := range capture.resets(500 * time.Millisecond) {
		if r.sport == p {
			t.Errorf("KILLED: the client's own ACK was preceded by %+v: RST %s:%d -> %s:%d seq %#x (= its ISN+1: the endpoint drops the handshake the ACK completes)",
				r, r.src, r.sport, r.dst, r.dport, r.seq)
		}
	}
}

// TestXLBReviewLaterFragmentClonedAsReset: frag.h gives a later fragment its
// first's TCP flags, so a later fragment of a SYN is is_tcp_syn: when its
// flow's pending entry is lost between the fragments, xlb_in reads its
// "ISN" from the fragment's payload, and the reset ahead is "made" of the
// fragment: tcp_reset_clone writes the sequence number, the RST word and a
// compensating checksum word into the payload (offsets 4, 12, 16) and
// sends that copy first. It leaves as a duplicate of the real fragment
// (same ID, same offset) with altered bytes; a receiver's reassembly keeps
// the first copy of an exact duplicate (IPFRAG_DUP) and the TCP checksum
// still adds up.
func TestXLBReviewLaterFragmentClonedAsReset(t *testing.T) {
	remote := netip.MustParseAddr("10.70.2.5")
	d := nodePortWorld(t, remote)
	capture := resetWorld(t, d)
	client := netip.AddrPortFrom(netip.MustParseAddr("203.0.113.5"), 40001)
	// A SYN with 24 bytes of data (TFO), in two fragments.
	seg := tcpSYN(client.Port(), 30080)
	binary.BigEndian.PutUint32(seg[4:8], 0x55667788)
	data := make([]byte, 48)
	for i := range data {
		data[i] = 0xA0 + byte(i)
	}
	first := ipv4(client.Addr(), progNodeV4, 6, append(seg, data[:4]...)) // 24 bytes of L4
	binary.BigEndian.PutUint16(first[4:6], 0x4242)
	binary.BigEndian.PutUint16(first[6:8], 0x2000) // MF, offset 0
	if v, _ := runUnder(t, d, ether(unicastMAC, 0x0800, first)); v != actRedirect {
		t.Fatalf("first fragment: verdict %d", v)
	}
	capture.resets(200 * time.Millisecond)
	evictPending(t, d)
	later := ipv4(client.Addr(), progNodeV4, 6, data[4:28])
	binary.BigEndian.PutUint16(later[4:6], 0x4242)
	binary.BigEndian.PutUint16(later[6:8], 3) // offset 24, last
	before := forwarded(t, d)["reset-ahead"]
	vr, _ := runUnder(t, d, ether(unicastMAC, 0x0800, later))
	// What left the underlay while the program ran (the clone only).
	frames := capture.raw(300 * time.Millisecond)
	t.Logf("later fragment verdict %d, reset-ahead +%d, %d frames left", vr, forwarded(t, d)["reset-ahead"]-before, len(frames))
	for _, f := range frames {
		if len(f) < 14+40+20 || f[14+6] != 4 {
			continue
		}
		ip := f[14+40:]
		if binary.BigEndian.Uint16(ip[4:6]) != 0x4242 {
			continue
		}
		pl := ip[20:binary.BigEndian.Uint16(ip[2:4])]
		if string(pl) != string(data[4:28]) {
			t.Errorf("CORRUPT DUPLICATE: fragment (id 0x4242, offset %d) left as % x, sent % x", binary.BigEndian.Uint16(ip[6:8])&0x1fff*8, pl, data[4:28])
		}
	}
}

// raw returns every frame read off the underlay's far end until nothing
// came for quiet.
func (c *resetCapture) raw(quiet time.Duration) [][]byte {
	c.t.Helper()
	tv := unix.NsecToTimeval(quiet.Nanoseconds())
	if err := unix.SetsockoptTimeval(c.fd, unix.SOL_SOCKET, unix.SO_RCVTIMEO, &tv); err != nil {
		c.t.Fatal(err)
	}
	var out [][]byte
	for {
		buf := make([]byte, 2048)
		n, _, err := unix.Recvfrom(c.fd, buf, 0)
		if err != nil {
			return out
		}
		out = append(out, buf[:n])
	}
}

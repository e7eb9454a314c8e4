package datapath

import (
	"encoding/binary"
	"net/netip"
	"testing"
)

// Review of frag.h (issue 18): fragments must get their first fragment's
// decision, including what the decision reads beyond the ports.

// fragPkt builds an IP fragment of protocol proto from src to dst with ID
// id at byte offset off (a multiple of 8), more fragments to come when mf.
// IPv4 gets a valid header checksum; IPv6 a fragment header right after
// the fixed one.
func fragPkt(src, dst netip.Addr, proto byte, id uint32, off int, mf bool, payload []byte) []byte {
	fo := uint16(off / 8)
	if src.Is4() {
		b := ipv4(src, dst, proto, payload)
		binary.BigEndian.PutUint16(b[4:6], uint16(id))
		if mf {
			fo |= 0x2000
		}
		binary.BigEndian.PutUint16(b[6:8], fo)
		binary.BigEndian.PutUint16(b[10:12], onesSum(b[:20]))
		return ether(unicastMAC, 0x0800, b)
	}
	fh := make([]byte, 8, 8+len(payload))
	fh[0] = proto
	v := fo << 3
	if mf {
		v |= 1
	}
	binary.BigEndian.PutUint16(fh[2:4], v)
	binary.BigEndian.PutUint32(fh[4:8], id)
	return ether(unicastMAC, 0x86dd, ipv6(src, dst, 44, append(fh, payload...)))
}

// A pod opens connections to its node only where its view holds the
// node's address (TestProgPodRefuses: "a new connection to the node" is
// dropped to-node-not-answer). A SYN cut in fragments must be refused the
// same way: its later fragment carries no TCP header, so it must take the
// first's flags with its ports; otherwise it passes as "not a SYN", an
// answer, and reaches the node's stack (which holds it for reassembly:
// orphans fill the node's reassembly memory, 30 s each).
func TestRevFragSYNLaterToNodeRefused(t *testing.T) {
	for _, f := range fragFamilies() {
		t.Run(f.name, func(t *testing.T) {
			d := progPodDatapath(t)
			body := make([]byte, 64)
			var v1, v2 uint32
			moved := snatDrops(t, d, func() {
				v1, _ = runPod(t, d, fragPkt(f.pod, f.node, 6, 0x6001, 0, true, append(tcpSYN(40000, 22), body...)))
				v2, _ = runPod(t, d, fragPkt(f.pod, f.node, 6, 0x6001, 88, false, body))
			})
			if v1 != actShot {
				t.Fatalf("first fragment of a SYN to the node: verdict %d, want a drop", v1)
			}
			if v2 != actShot || moved["to-node-not-answer"] != 2 {
				t.Errorf("BYPASS: the SYN's later fragment to the node: verdict %d (0 = to the node's stack), drops %v; want both fragments dropped to-node-not-answer", v2, moved)
			}
		})
	}
}

// RFC 1858's tiny fragment: a first IPv4 fragment of 8 bytes holds the
// TCP ports and sequence number but not the flags (byte 13); the second,
// at offset 8, holds the rest of the header with SYN. Neither looks like a
// SYN to from_pod, both reach the node's stack, which reassembles a SYN
// to a port the pod's view never granted: the node answers SYN-ACK, the
// pod's ACK is an "answer", and the pod has a connection to the node.
// (IPv6: the node's stack itself drops a first fragment whose upper-layer
// header is cut, RFC 7112.) A TCP first fragment that does not hold the
// whole TCP header must be dropped.
func TestRevFragTinyTCPFirstToNodeRefused(t *testing.T) {
	d := progPodDatapath(t)
	syn := tcpSYN(40000, 22)
	var v1, v2 uint32
	moved := snatDrops(t, d, func() {
		v1, _ = runPod(t, d, fragPkt(progPodV4, progNodeV4, 6, 0x6002, 0, true, syn[:8]))
		v2, _ = runPod(t, d, fragPkt(progPodV4, progNodeV4, 6, 0x6002, 8, false, syn[8:]))
	})
	if v1 != actShot || v2 != actShot {
		t.Errorf("BYPASS: a SYN to the node split after its 8th byte: verdicts %d, %d (0 = to the node's stack), drops %v; want both dropped", v1, v2, moved)
	}
	// The same SYN whole is refused (the baseline).
	if v, _ := runPod(t, d, fragPkt(progPodV4, progNodeV4, 6, 0, 0, false, syn)); v != actShot {
		t.Errorf("a whole SYN to the node: verdict %d, want a drop", v)
	}
}

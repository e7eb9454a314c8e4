package datapath

import (
	"net/netip"
	"testing"

	"github.com/cilium/ebpf"

	"github.com/lace-cni/lace/internal/tables"
)

// runToUnderlayFwd runs to_underlay on pkt as the kernel presents a packet
// it forwards (from_pod's redirect of a pod's packet): received on the
// pod's veth, so skb_iif is that interface, never 0.
func runToUnderlayFwd(t *testing.T, d *Datapath, ifindex uint32, pkt []byte) (uint32, []byte) {
	t.Helper()
	out := make([]byte, len(pkt)+256)
	opts := &ebpf.RunOptions{Data: pkt, DataOut: out, Context: skbCtx(ifindex)}
	ret, err := d.underlay.ToUnderlay.Run(opts)
	if err != nil {
		t.Fatal(err)
	}
	return ret, opts.DataOut
}

// TestHostAnswerFragmentIDReuse: host_answer's record of a hostNetwork
// frontend's fragmented answer (lace_frags, keyed {node, client, proto,
// IP ID}, 10 s) is the node stack's alone (hostile review rev18, F1).
//
//   - The node's own datagram to the same client that reuses the ID
//     within the 10 s (the IPv4 ID is 16 bits) keeps all its fragments
//     from the node's address: its untranslated first fragment clears the
//     record. Before, its later fragments left from the external IP and
//     the datagram never reassembled.
//   - A pod (CAP_NET_RAW: it picks the ID) sends the client a fragmented
//     datagram with the answer's ID, SNAT'd by from_pod to the node's
//     address. Its later fragment (payload the pod chose) must leave from
//     the node's address, not the other tenant's external IP, whether its
//     first fragment left before the answer's first or after; and the
//     pod's fragments must not disturb the answer's record: the answer's
//     later fragment still leaves from the external IP.
func TestHostAnswerFragmentIDReuse(t *testing.T) {
	ext := map[bool]netip.Addr{true: netip.MustParseAddr("198.51.100.10"), false: netip.MustParseAddr("2001:db8:e::10")}
	for _, f := range hostEPFamilies {
		t.Run(f.name, func(t *testing.T) {
			d := hostEPDatapath(t, f)
			e := ext[f.node.Is4()]
			here := []tables.Backend{{Addr: f.node, Port: 53}}
			if _, err := d.ApplyServices([]Service{
				{VIP: f.clusterIP, Proto: 17, Port: 53, NetID: progNet, Backends: here},
				{VIP: e, Proto: 17, Port: 53, NetID: progNet, Backends: here, Frontend: tables.FrontendExternalIP, ClusterIP: f.clusterIP, ClusterPort: 53},
			}); err != nil {
				t.Fatal(err)
			}
			ip := func(src, dst netip.Addr, l4 []byte) []byte {
				if src.Is4() {
					return ether(unicastMAC, f.ethType, ipv4(src, dst, 17, l4))
				}
				return ether(unicastMAC, f.ethType, ipv6(src, dst, 17, l4))
			}
			v, out := runUnder(t, d, ip(f.client, e, udp20(5555, 53)))
			if dst := pktDst(out); v != actOK || dst != netip.AddrPortFrom(f.node, 53) {
				t.Fatalf("query to the external IP: verdict %d to %s, want the host stack on :53", v, dst)
			}
			srcOf := func(pkt []byte) netip.Addr { s, _ := f.addrs(pkt); return s.Addr() }
			answerFirst := func(id uint32) {
				t.Helper()
				_, out := runToUnderlay(t, d, fragPkt(f.node, f.client, 17, id, 0, true, append(udp20(53, 5555), make([]byte, 28)...)))
				if s := srcOf(out); s != e {
					t.Fatalf("the answer's first fragment (ID %#x) left from %s, want %s", id, s, e)
				}
			}
			answerLater := func(id uint32) netip.Addr {
				_, out := runToUnderlay(t, d, fragPkt(f.node, f.client, 17, id, 48, false, make([]byte, 16)))
				return srcOf(out)
			}
			pod := progPodV4
			if !f.node.Is4() {
				pod = progPodV6
			}
			// The pod's fragments as they reach the underlay: SNAT'd by
			// from_pod, then forwarded.
			podFrag := func(id uint32, first bool) netip.Addr {
				t.Helper()
				pkt := fragPkt(pod, f.client, 17, id, 48, false, []byte("FORGED-BY-A-POD!"))
				if first {
					pkt = fragPkt(pod, f.client, 17, id, 0, true, append(udp20(41000, 5555), make([]byte, 28)...))
				}
				_, snat := runPod(t, d, pkt)
				if s := srcOf(snat); s != f.node {
					t.Fatalf("setup: from_pod left the pod's fragment (ID %#x, first %v) from %s, want SNAT to %s", id, first, s, f.node)
				}
				_, out := runToUnderlayFwd(t, d, progPort, snat)
				return srcOf(out)
			}

			// The frontend's fragmented answer: its later fragment
			// leaves from the external IP (TestProgHostAnswerFragments).
			answerFirst(0x4242)
			if s := answerLater(0x4242); s != e {
				t.Fatalf("setup: the answer's later fragment left from %s, want %s", s, e)
			}
			// The node's own datagram (port 54, no frontend's) to the same
			// client with the same ID, within 10 s.
			_, _ = runToUnderlay(t, d, fragPkt(f.node, f.client, 17, 0x4242, 0, true, append(udp20(54, 5555), make([]byte, 28)...)))
			if s := answerLater(0x4242); s != f.node {
				t.Errorf("the node's own later fragment left from %s (the external IP's), want %s as its first fragment", s, f.node)
			}

			// A pod's datagram with the ID of an answer in flight.
			answerFirst(0x4343)
			if s := podFrag(0x4343, true); s != f.node {
				t.Errorf("the pod's first fragment left from %s, want %s", s, f.node)
			}
			if s := podFrag(0x4343, false); s != f.node {
				t.Errorf("a pod's SNAT later fragment left the node from %s, another tenant's external IP", s)
			}
			if s := answerLater(0x4343); s != e {
				t.Errorf("after the pod's fragments, the answer's later fragment left from %s, want %s: a pod cleared another tenant's record", s, e)
			}

			// The pod's first fragment before the answer's first, its
			// later one after.
			if s := podFrag(0x4444, true); s != f.node {
				t.Errorf("the pod's first fragment left from %s, want %s", s, f.node)
			}
			answerFirst(0x4444)
			if s := podFrag(0x4444, false); s != f.node {
				t.Errorf("a pod's SNAT later fragment (its first before the answer's) left the node from %s, another tenant's external IP", s)
			}
			if s := answerLater(0x4444); s != e {
				t.Errorf("the answer's later fragment left from %s, want %s", s, e)
			}
		})
	}
}

package datapath

import (
	"net/netip"
	"testing"

	"github.com/lace-cni/lace/internal/tables"
)

// Hostile review rev18 (PoC, failing on purpose).
//
// TestRev18HostAnswerIDReuseTranslatesOwnFragment: host_answer's record
// (lace_frags, 10 s) is keyed by {node, client, proto, IP ID} only. The
// node's own large datagram to the same client that reuses the ID within
// those 10 s (the IPv4 ID is 16 bits, from a counter shared per
// destination: the client itself can wrap it by asking the frontend for
// ~6,600 large answers a second, or a forger can in its name) keeps its
// first fragment untouched but has its later fragments rewritten to leave
// from the frontend's address (an external IP here), so the datagram
// never reassembles, and a node's traffic leaves under a Service's
// address it never used.
func TestRev18HostAnswerIDReuseTranslatesOwnFragment(t *testing.T) {
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
			// The frontend's fragmented answer, ID 0x4242: recorded.
			_, _ = runToUnderlay(t, d, fragPkt(f.node, f.client, 17, 0x4242, 0, true, append(udp20(53, 5555), make([]byte, 28)...)))
			_, out = runToUnderlay(t, d, fragPkt(f.node, f.client, 17, 0x4242, 48, false, make([]byte, 16)))
			if src, _ := f.addrs(out); src.Addr() != e {
				t.Fatalf("the answer's own later fragment left from %s, want %s (setup)", src.Addr(), e)
			}
			// The node's own datagram (port 54, no frontend's) to the same
			// client, same ID, within 10 s.
			_, _ = runToUnderlay(t, d, fragPkt(f.node, f.client, 17, 0x4242, 0, true, append(udp20(54, 5555), make([]byte, 28)...)))
			_, out = runToUnderlay(t, d, fragPkt(f.node, f.client, 17, 0x4242, 48, false, make([]byte, 16)))
			if src, _ := f.addrs(out); src.Addr() != f.node {
				t.Errorf("the node's own later fragment left from %s (the external IP's), want %s as its first fragment", src.Addr(), f.node)
			}
			// A tenant's pod (CAP_NET_RAW: it picks the ID) sends the same
			// client a fragmented datagram with the ID of the answer:
			// SNAT gives it the node's address, and to_underlay's
			// host_answer then rewrites its later fragment (payload the
			// pod chose) to leave from the other tenant's external IP.
			pod := progPodV4
			if !f.node.Is4() {
				pod = progPodV6
			}
			_, first := runPod(t, d, fragPkt(pod, f.client, 17, 0x4242, 0, true, append(udp20(41000, 5555), make([]byte, 28)...)))
			_, _ = runToUnderlay(t, d, first)
			_, later := runPod(t, d, fragPkt(pod, f.client, 17, 0x4242, 48, false, []byte("FORGED-BY-A-POD!")))
			if s, _ := f.addrs(later); s.Addr() != f.node {
				t.Fatalf("setup: the pod's later fragment left SNAT from %s, want %s", s.Addr(), f.node)
			}
			_, out = runToUnderlay(t, d, later)
			if src, _ := f.addrs(out); src.Addr() != f.node {
				t.Errorf("a pod's SNAT later fragment left the node from %s, another tenant's external IP", src.Addr())
			}
		})
	}
}

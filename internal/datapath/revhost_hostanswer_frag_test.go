//go:build revhost

package datapath

import (
	"net/netip"
	"testing"

	"github.com/lace-cni/lace/internal/tables"
)

// TestProgHostAnswerFragments: a hostNetwork UDP server behind a
// NodePort (a node-local DNS cache) answers an outside client; an answer
// larger than the MTU leaves the node's stack in fragments, and
// host_answer passes every fragment untranslated (p.frag): the first,
// which carries the ports, leaves from the node's own address and the
// server's real port instead of the NodePort, so the client never
// matches it (and learns the endpoint's port). The first fragment must
// leave from the NodePort as an unfragmented answer does (and its later
// fragments with the frontend's address).
func TestProgHostAnswerFragments(t *testing.T) {
	f := hostEPFamilies[0]
	d := hostEPDatapath(t, f)
	here := []tables.Backend{{Addr: f.node, Port: 53}}
	if _, err := d.ApplyServices([]Service{
		{VIP: f.clusterIP, Proto: 17, Port: 53, NetID: progNet, Backends: here},
		{VIP: f.node, Proto: 17, Port: 30053, NetID: progNet, Backends: here, Frontend: tables.FrontendNodePort, ClusterIP: f.clusterIP, ClusterPort: 53},
	}); err != nil {
		t.Fatal(err)
	}
	v, out := runUnder(t, d, ether(unicastMAC, 0x0800, ipv4(f.client, f.node, 17, udp20(5555, 30053))))
	if dst := pktDst(out); v != actOK || dst != netip.AddrPortFrom(f.node, 53) {
		t.Fatalf("query to the NodePort: verdict %d to %s, want the host stack on :53", v, dst)
	}
	// The unfragmented answer is translated.
	_, out = runToUnderlay(t, d, ether(unicastMAC, 0x0800, ipv4(f.node, f.client, 17, udp20(53, 5555))))
	if src, _ := f.addrs(out); src != netip.AddrPortFrom(f.node, 30053) {
		t.Fatalf("unfragmented answer leaves from %s, want the NodePort", src)
	}
	payload := append(udp20(53, 5555), make([]byte, 28)...)
	_, out = runToUnderlay(t, d, fragPkt(f.node, f.client, 17, 0x4242, 0, true, payload))
	if src, _ := f.addrs(out); src != netip.AddrPortFrom(f.node, 30053) {
		t.Errorf("the answer's first fragment leaves from %s, want the NodePort %s:30053", src, f.node)
	}
}

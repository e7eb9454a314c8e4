//go:build revfrag

package datapath

import (
	"net/netip"
	"testing"

	"github.com/lace-cni/lace/internal/tables"
)

// An outside host may forge any outside source (only inside ones are
// refused, outside_spoofed). A first fragment rewrites the record of its
// key whatever it held (BPF_ANY), and nothing but the ID ties a later
// fragment to it. So a forger who sends, in client V's name and with the
// ID of V's datagram in flight to tenant A's NodePort, a first fragment to
// a NodePort of its own (tenant B, endpoint on this node) turns V's
// remaining fragments to B's endpoint: V's payload for A is delivered to
// B's pod (which sees it on a raw socket). A live record must not be
// repointed to other ports by another first fragment.
func TestRevFragForgedFirstDoesNotRepointDatagram(t *testing.T) {
	d := progPodDatapath(t)
	client, be := netip.MustParseAddr("203.0.113.5"), netip.MustParseAddr("10.70.2.5")
	revfragNodePort(t, d, client, be)
	// Tenant B's NodePort 30099, its endpoint the pod on this node.
	bip := netip.MustParseAddr("10.96.0.99")
	fragMust(t, d.UpsertRoute(Route{NetID: snatWorld, Prefix: netip.PrefixFrom(bip, 32), Kind: tables.RouteService, DstNet: progNet}))
	bes := []tables.Backend{{Addr: be, Port: 9300}}
	mine := []tables.Backend{{Addr: progPodV4, Port: 9999}}
	if _, err := d.ApplyServices([]Service{
		{VIP: netip.MustParseAddr("10.96.0.10"), Proto: 17, Port: 82, NetID: progNet, Backends: bes},
		{VIP: progNodeV4, Proto: 17, Port: 30082, NetID: progNet, Backends: bes, Frontend: tables.FrontendNodePort, ClusterIP: netip.MustParseAddr("10.96.0.10"), ClusterPort: 82},
		{VIP: bip, Proto: 17, Port: 99, NetID: progNet, Backends: mine},
		{VIP: progNodeV4, Proto: 17, Port: 30099, NetID: progNet, Backends: mine, Frontend: tables.FrontendNodePort, ClusterIP: bip, ClusterPort: 99},
	}); err != nil {
		t.Fatal(err)
	}
	const id = 0x5a5a
	// V's first fragment to A's NodePort.
	runUnder(t, d, fragPkt(client, progNodeV4, 17, id, 0, true, append(udp(6000, 30082), fragPayload...)))
	// The forger, as V, the same ID, to its own NodePort.
	if v, out := runUnder(t, d, fragPkt(client, progNodeV4, 17, id, 0, true, append(udp(6001, 30099), fragPayload...))); v != actRedirect {
		t.Fatalf("the forged first fragment to B's NodePort: verdict %d; want it delivered (%x)", v, out[:40])
	}
	// V's later fragment.
	v, out := runUnder(t, d, fragPkt(client, progNodeV4, 17, id, 1448, false, fragPayload))
	if _, dst := ipAddrs(out, 14); dst == progPodV4 {
		t.Errorf("HIJACK: client %s's later fragment to A's NodePort was delivered to B's endpoint %s (verdict %d)", client, dst, v)
	}
}

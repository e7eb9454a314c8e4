//go:build rev17b

package datapath

import (
	"net/netip"
	"testing"

	"github.com/lace-cni/lace/internal/tables"
)

// A spoofing outside host assures UDP flows blindly: a datagram from a
// forged source to a pod's UDP server (DNS), the pod's answer (to the
// forged source, never seen), the same datagram again. Each such flow is
// assured and lands in lace_ct for 120 s: two packets a flow, about 2,200
// packets a second keep lace_ct full, and an idle established TCP flow of
// another tenant is evicted. Open limit (not fixed): fails.
func TestRev17bBlindUDPExchangesEvictEstablished(t *testing.T) {
	d := progPodDatapath(t)
	ext4 := netip.MustParseAddr("172.31.0.200")
	for _, err := range []error{
		d.UpsertNetwork(Network{ID: snatWorld}),
		d.UpsertClassifier(Classifier{NetID: snatWorld, Prefix: netip.MustParsePrefix("0.0.0.0/0")}),
		d.UpsertRoute(Route{NetID: snatWorld, Prefix: netip.MustParsePrefix("0.0.0.0/0"), Kind: tables.RouteExternal, DstNet: snatWorld}),
		d.UpsertRoute(Route{NetID: snatWorld, Prefix: netip.MustParsePrefix("10.70.1.0/24"), Kind: tables.RouteLocal, DstNet: progNet}),
		d.UpsertRoute(Route{NetID: progNet, Prefix: netip.MustParsePrefix("0.0.0.0/0"), Kind: tables.RouteExternal, DstNet: snatWorld}),
	} {
		if err != nil {
			t.Fatal(err)
		}
	}
	runUnder(t, d, ether(unicastMAC, 0x0800, ipv4(ext4, progPodV4, 6, seg4(999, 7, 0x02))))
	runPod(t, d, ether(unicastMAC, 0x0800, ipv4(progPodV4, ext4, 6, seg4(7, 999, 0x12))))
	runUnder(t, d, ether(unicastMAC, 0x0800, ipv4(ext4, progPodV4, 6, seg4(999, 7, 0x10))))
	has := func() bool {
		flows, err := d.Conntrack()
		if err != nil {
			t.Fatal(err)
		}
		for _, f := range flows {
			if f.Remote == netip.AddrPortFrom(ext4, 999) && f.Assured && !f.New {
				return true
			}
		}
		return false
	}
	if !has() {
		t.Fatal("the victim's handshake left no assured flow")
	}
	n := int(d.pod.LaceCt.MaxEntries()) + 8192
	for i := range n {
		src := netip.AddrFrom4([4]byte{172, 31, byte(1 + i/60000), 200})
		sp := uint16(1000 + i%60000)
		runUnder(t, d, ether(unicastMAC, 0x0800, ipv4(src, progPodV4, 17, udp(sp, 53))))
		runPod(t, d, ether(unicastMAC, 0x0800, ipv4(progPodV4, src, 17, udp(53, sp))))
		runUnder(t, d, ether(unicastMAC, 0x0800, ipv4(src, progPodV4, 17, udp(sp, 53))))
	}
	if !has() {
		t.Errorf("EVICTED: %d blind UDP exchanges from forged sources pushed an established TCP flow out of lace_ct", n)
	}
}

// An outside flood of UDP datagrams from forged sources to a pod's UDP
// server (DNS) outruns lace_ct_new before the pod answers (70,000 here;
// in a lab, a rate times the server's answer latency above 32,768, as a
// forwarding resolver waiting on its upstream). The answers whose entry
// the flood evicted find no flow and leave as new flows the pod opened:
// each takes a node port (lace_snat) and an entry in lace_ct_local, the
// pods' own pending budget that docs/security.md section 7 says a flood from outside never
// reaches; another pod's pending connect is evicted and its answer is
// dropped. Open limit (not fixed): fails.
func TestRev17bOutsideFloodSpillsIntoPodPending(t *testing.T) {
	d := progPodDatapath(t)
	for _, err := range []error{
		d.UpsertNetwork(Network{ID: snatWorld}),
		d.UpsertClassifier(Classifier{NetID: snatWorld, Prefix: netip.MustParsePrefix("0.0.0.0/0")}),
		d.UpsertRoute(Route{NetID: snatWorld, Prefix: netip.MustParsePrefix("0.0.0.0/0"), Kind: tables.RouteExternal, DstNet: snatWorld}),
		d.UpsertRoute(Route{NetID: snatWorld, Prefix: netip.MustParsePrefix("10.70.1.0/24"), Kind: tables.RouteLocal, DstNet: progNet}),
		d.UpsertRoute(Route{NetID: progNet, Prefix: netip.MustParsePrefix("0.0.0.0/0"), Kind: tables.RouteExternal, DstNet: snatWorld}),
	} {
		if err != nil {
			t.Fatal(err)
		}
	}
	dst := netip.MustParseAddrPort("198.51.100.7:53")
	P := leaves(t, d, 17, 41000, dst) // the pod's pending connect
	const n = 70000
	src := func(i int) (netip.Addr, uint16) {
		return netip.AddrFrom4([4]byte{172, 31, byte(1 + i/60000), 200}), uint16(1000 + i%60000)
	}
	for i := range n {
		a, p := src(i)
		runUnder(t, d, ether(unicastMAC, 0x0800, ipv4(a, progPodV4, 17, udp(p, 53))))
	}
	spilled := 0
	for i := range n {
		a, p := src(i)
		if _, out := runPod(t, d, ether(unicastMAC, 0x0800, ipv4(progPodV4, a, 17, udp(53, p)))); netip.AddrFrom4([4]byte(out[26:30])) == progNodeV4 {
			spilled++
		}
	}
	if spilled > 0 {
		t.Errorf("SPILLED: %d of the pod's %d answers to a flood from outside left as flows the pod opened, each on a node port", spilled, n)
	}
	moved := snatDrops(t, d, func() {
		if v := snatReply(t, d, 17, dst, P); v != actRedirect {
			t.Errorf("the pod's pending connect lost its answer (verdict %d)", v)
		}
	})
	if len(moved) != 0 {
		t.Errorf("drops %v; want the pending connect's answer delivered", moved)
	}
}

package datapath

import (
	"net/netip"
	"testing"

	"github.com/lace-cni/lace/internal/tables"
)

// TestCTOutsideFloodKeepsPodPending: a host outside floods a pod with
// new flows (70,000 distinct tuples, more than twice what the pending maps
// hold), each sent twice so that every flood entry is referenced and beats
// the kernel LRU's second chance. The pod's own connects, sent before the
// flood and not answered yet, must survive it: their answers arrive after
// the flood and are delivered. With one pending map shared by both
// origins, the flood evicts them and the answers are dropped snat-closed.
func TestCTOutsideFloodKeepsPodPending(t *testing.T) {
	d := snatDatapath(t)
	for _, err := range []error{
		d.UpsertClassifier(Classifier{NetID: snatWorld, Prefix: netip.MustParsePrefix("0.0.0.0/0")}),
		d.UpsertRoute(Route{NetID: snatWorld, Prefix: netip.MustParsePrefix("10.70.1.0/24"), Kind: tables.RouteLocal, DstNet: progNet}),
	} {
		if err != nil {
			t.Fatal(err)
		}
	}
	dst := netip.MustParseAddrPort("198.51.100.7:443")
	udst := netip.MustParseAddrPort("198.51.100.8:53")
	const pending = 64
	tcpPorts := make([]uint16, pending)
	udpPorts := make([]uint16, pending)
	for i := range pending {
		tcpPorts[i] = leaves(t, d, 6, uint16(41000+i), dst)
		udpPorts[i] = leaves(t, d, 17, uint16(42000+i), udst)
	}

	const flood = 70000
	floodDrops := snatDrops(t, d, func() {
		for i := range flood {
			src := netip.AddrFrom4([4]byte{172, 31, byte(1 + i/60000), 200})
			pkt := ether(unicastMAC, 0x0800, ipv4(src, progPodV4, 6, seg4(uint16(1000+i%60000), 7, 0x02)))
			for range 2 {
				if v, _ := runUnder(t, d, pkt); v != actRedirect {
					t.Fatalf("flood SYN %d: verdict %d, want it delivered (a new flow from outside)", i, v)
				}
			}
		}
	})
	if len(floodDrops) != 0 {
		t.Errorf("the flood itself was dropped: %v", floodDrops)
	}

	delivered := 0
	moved := snatDrops(t, d, func() {
		for i := range pending {
			if snatReply(t, d, 6, dst, tcpPorts[i]) == actRedirect {
				delivered++
			}
			if snatReply(t, d, 17, udst, udpPorts[i]) == actRedirect {
				delivered++
			}
		}
	})
	if delivered != 2*pending || len(moved) != 0 {
		t.Errorf("EVICTED: %d of the pod's %d pending flows answered after the flood, drops %v; want all, none dropped",
			delivered, 2*pending, moved)
	}
	sizes, err := d.MapSizes()
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("after the flood: %d established, %d pending from outside, %d pending of pods; %d of %d answers delivered",
		sizes["conntrack"], sizes["conntrack-new"], sizes["conntrack-local"], delivered, 2*pending)
}

package datapath

import (
	"net/netip"
	"testing"
)

// A frontend with 65,536 endpoints (one more than lace_services' 16-bit
// count holds) is left out and reported by Apply; the other Services are
// still programmed. Before the fix Apply returned an error before writing
// anything, so every sync failed and a restarted agent never became Ready.
func TestServiceApplySkipsOverfullFrontend(t *testing.T) {
	d := loadSized(t, tempPinDir(t), MapSizes{})
	big := Service{VIP: netip.MustParseAddr("10.98.0.1"), Proto: 6, Port: 80, NetID: 1}
	for j := range 1 << 16 {
		big.Backends = append(big.Backends, Backend{Addr: netip.AddrFrom4([4]byte{10, 2, byte(j >> 8), byte(j)}), Port: 80})
	}
	victim := budgetSvc(1, 3)
	tab := NewServiceTable(d)
	if _, err := tab.Apply([]Service{big, victim}); err != nil {
		t.Fatalf("Apply: %v", err)
	}
	if n, _ := d.countEntries(d.pod.LaceServices); n != 1 {
		t.Fatalf("services written: %d, want the victim's 1", n)
	}
	var v podSvcVal
	if err := d.pod.LaceServices.Lookup(svcKey(victim), &v); err != nil || v.Count != 3 {
		t.Fatalf("victim: %+v %v", v, err)
	}
	bigKey := big.Key()
	if why := tab.Skipped()[bigKey]; why == "" {
		t.Fatalf("big service not reported: %v", tab.Skipped())
	}
	if n, _ := d.countEntries(d.pod.LaceBackends); n != 3 {
		t.Fatalf("backends written: %d, want 3", n)
	}
	// The next Apply without it reports nothing.
	if _, err := tab.Apply([]Service{victim}); err != nil || len(tab.Skipped()) != 0 {
		t.Fatalf("Apply: %v, skipped %v", err, tab.Skipped())
	}
}

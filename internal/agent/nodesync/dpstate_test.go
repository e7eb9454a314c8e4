package nodesync

import (
	"net/netip"
	"testing"

	"github.com/lace-cni/lace/internal/datapath"
)

// TestUnflushedKeptOnceUntilLiveAgain: the endpoints whose flows are
// still to forget (a flush failed) are kept each once however often they
// leave again (a pod flapping its readiness adds nothing), and dropped
// when they are a backend of their service again (a flush then would
// reset their live flows).
func TestUnflushedKeptOnceUntilLiveAgain(t *testing.T) {
	d := tableDP{unflushed: &datapath.Gone{}}
	vip := netip.MustParseAddr("10.96.0.10")
	k := datapath.ServiceKey{VIP: vip, Proto: 6, Port: 80}
	ep := datapath.Backend{Addr: netip.MustParseAddr("10.70.1.3"), Port: 8080}
	other := datapath.Backend{Addr: netip.MustParseAddr("10.70.1.4"), Port: 8080}
	without := []datapath.Service{{VIP: vip, Proto: 6, Port: 80, Backends: []datapath.Backend{other}}}
	for range 100 {
		d.keepUnflushed(datapath.Gone{Left: map[datapath.ServiceKey][]datapath.Backend{k: {ep}},
			Unlisted: map[datapath.ServiceKey][]datapath.Backend{k: {ep}}}, without, nil)
	}
	if got := d.unflushed.Left[k]; len(got) != 1 || got[0] != ep {
		t.Fatalf("after 100 departures of one endpoint, to flush: %v, want [%v]", got, ep)
	}
	if got := d.unflushed.Unlisted[k]; len(got) != 1 || got[0] != ep {
		t.Fatalf("after 100 departures of one endpoint from the slices, to flush: %v, want [%v]", got, ep)
	}
	// Back in the slices, not ready: its connections are live again, its
	// datagram flows still to forget.
	lingers := []datapath.Service{{VIP: vip, Proto: 6, Port: 80, Backends: []datapath.Backend{other}, Lingering: []datapath.Backend{ep}}}
	d.keepUnflushed(datapath.Gone{}, lingers, []datapath.ServiceKey{k}) // a step naming k
	if got, ok := d.unflushed.Unlisted[k]; ok {
		t.Errorf("the endpoint is in the slices again and its connections still to flush: %v", got)
	}
	if got := d.unflushed.Left[k]; len(got) != 1 {
		t.Errorf("a lingering endpoint's datagram flows are no longer to flush: %v", got)
	}
	back := []datapath.Service{{VIP: vip, Proto: 6, Port: 80, Backends: []datapath.Backend{other, ep}}}
	d.keepUnflushed(datapath.Gone{}, back, nil)
	if got, ok := d.unflushed.Left[k]; ok {
		t.Errorf("the endpoint is a backend again and still to flush: %v", got)
	}
}

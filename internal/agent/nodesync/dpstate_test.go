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
	d := tableDP{unflushed: new(map[datapath.ServiceKey][]datapath.Backend)}
	vip := netip.MustParseAddr("10.96.0.10")
	k := datapath.ServiceKey{VIP: vip, Proto: 6, Port: 80}
	ep := datapath.Backend{Addr: netip.MustParseAddr("10.70.1.3"), Port: 8080}
	other := datapath.Backend{Addr: netip.MustParseAddr("10.70.1.4"), Port: 8080}
	without := []datapath.Service{{VIP: vip, Proto: 6, Port: 80, Backends: []datapath.Backend{other}}}
	for range 100 {
		d.keepUnflushed(map[datapath.ServiceKey][]datapath.Backend{k: {ep}}, without)
	}
	if got := (*d.unflushed)[k]; len(got) != 1 || got[0] != ep {
		t.Fatalf("after 100 departures of one endpoint, to flush: %v, want [%v]", got, ep)
	}
	back := []datapath.Service{{VIP: vip, Proto: 6, Port: 80, Backends: []datapath.Backend{other, ep}}}
	d.keepUnflushed(nil, back)
	if got, ok := (*d.unflushed)[k]; ok {
		t.Errorf("the endpoint is a backend again and still to flush: %v", got)
	}
}

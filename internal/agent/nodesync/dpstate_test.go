package nodesync

import (
	"errors"
	"net/netip"
	"testing"

	"github.com/lace-cni/lace/internal/datapath"
)

// routeTable is a RouteTable that counts reads and writes and can refuse
// one prefix.
type routeTable struct {
	have          map[routeKey]datapath.Route
	reads, writes int
	refuse        netip.Prefix
}

func (r *routeTable) UpsertRoute(rt datapath.Route) error {
	if rt.Prefix == r.refuse {
		return errors.New("map full")
	}
	r.writes++
	r.have[routeKey{rt.NetID, rt.Prefix}] = rt
	return nil
}

func (r *routeTable) DeleteRoute(netID uint32, p netip.Prefix) error {
	r.writes++
	delete(r.have, routeKey{netID, p})
	return nil
}

func (r *routeTable) Routes() ([]datapath.Route, error) {
	r.reads++
	var out []datapath.Route
	for _, rt := range r.have {
		out = append(out, rt)
	}
	return out, nil
}

// TestRouteMirror: the views map is read back once (what an earlier agent
// left is adopted, and removed when not wanted), then diffed in memory;
// the same desired slice costs nothing; a refused write is tried again;
// another data plane is read again.
func TestRouteMirror(t *testing.T) {
	p := func(s string) netip.Prefix { return netip.MustParsePrefix(s) }
	left := datapath.Route{NetID: 1, Prefix: p("10.0.0.0/24")}
	stale := datapath.Route{NetID: 1, Prefix: p("10.9.0.0/24")}
	dp := &routeTable{have: map[routeKey]datapath.Route{{1, left.Prefix}: left, {1, stale.Prefix}: stale}}
	var m routeMirror
	want := []datapath.Route{left, {NetID: 1, Prefix: p("10.1.0.0/24")}}
	if err := m.sync(dp, want); err != nil {
		t.Fatal(err)
	}
	if dp.reads != 1 || dp.writes != 2 || len(dp.have) != 2 {
		t.Fatalf("first sync: %d reads, %d writes (want 1 and 2: one added, one stale removed), map %v", dp.reads, dp.writes, dp.have)
	}
	if err := m.sync(dp, want); err != nil || dp.reads != 1 || dp.writes != 2 {
		t.Errorf("same slice again: %v, %d reads, %d writes", err, dp.reads, dp.writes)
	}
	// A new slice with a refused route: the error is reported, the others
	// written, and the refused one tried again at the next sync.
	dp.refuse = p("10.2.0.0/24")
	want = append([]datapath.Route{}, want[0], datapath.Route{NetID: 1, Prefix: dp.refuse})
	if err := m.sync(dp, want); err == nil {
		t.Error("a refused route was not reported")
	}
	dp.refuse = netip.Prefix{}
	writes := dp.writes
	if err := m.sync(dp, want); err != nil || dp.writes != writes+1 || dp.reads != 1 {
		t.Errorf("retry: %v, %d writes (want %d), %d reads", err, dp.writes, writes+1, dp.reads)
	}
	if _, ok := dp.have[routeKey{1, p("10.2.0.0/24")}]; !ok || len(dp.have) != 2 {
		t.Errorf("map after retry: %v", dp.have)
	}
	// Another data plane (a reload): read back again.
	other := &routeTable{have: map[routeKey]datapath.Route{}}
	if err := m.sync(other, want); err != nil || other.reads != 1 || len(other.have) != 2 {
		t.Errorf("new data plane: %v, %d reads, map %v", err, other.reads, other.have)
	}
}

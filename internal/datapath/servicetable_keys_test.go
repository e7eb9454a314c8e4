package datapath

import (
	"maps"
	"math/rand"
	"net/netip"
	"reflect"
	"slices"
	"testing"

	"github.com/lace-cni/lace/internal/tables"
)

// TestServiceTableApplyKeysMatchesApply: applying only the keys that
// changed (ApplyKeys, the agent's step from the merge it last applied)
// writes the maps exactly as a whole Apply of the same desired state does,
// and reports the same endpoints gone: over random changes of ClusterIPs,
// their Local NodePorts (whose flows follow the ClusterIP's endpoints),
// lingering endpoints, source ranges and affinity, services coming and
// going, keys named that did not change, and a restarted agent.
func TestServiceTableApplyKeysMatchesApply(t *testing.T) {
	whole, keyed := progDatapath(t), progDatapath(t)
	wt, kt := NewServiceTable(whole), NewServiceTable(keyed)
	rng := rand.New(rand.NewSource(11))
	node := netip.MustParseAddr("192.0.2.10")
	backend := func() Backend {
		return Backend{Addr: netip.AddrFrom4([4]byte{10, 1, byte(rng.Intn(3)), byte(rng.Intn(6))}), Port: 8080}
	}
	// svc is service i: its ClusterIP and, for some, a Local NodePort.
	svc := func(i int) []Service {
		c := Service{VIP: netip.AddrFrom4([4]byte{10, 96, 0, byte(i)}), Proto: 6, Port: 80, NetID: 1}
		for range rng.Intn(5) {
			if b := backend(); !slices.Contains(c.Backends, b) && !slices.Contains(c.Lingering, b) {
				if rng.Intn(4) == 0 {
					c.Lingering = append(c.Lingering, b)
				} else {
					c.Backends = append(c.Backends, b)
				}
			}
		}
		slices.SortFunc(c.Lingering, func(a, b Backend) int { return a.Addr.Compare(b.Addr) })
		if rng.Intn(4) == 0 {
			c.AffinitySeconds = 60
		}
		out := []Service{c}
		if i%3 == 0 {
			np := c
			np.VIP, np.Port, np.Frontend, np.ClusterIP, np.ClusterPort = node, uint16(30000+i), tables.FrontendNodePort, c.VIP, c.Port
			np.Local, np.Lingering = rng.Intn(2) == 0, nil
			if len(c.Backends) > 0 {
				np.Backends = c.Backends[:rng.Intn(len(c.Backends)+1)]
			}
			if rng.Intn(2) == 0 {
				np.SourceRanges = []netip.Prefix{netip.MustParsePrefix("198.51.100.0/24")}
			}
			out = append(out, np)
		}
		return out
	}
	have := map[int][]Service{}
	var prev map[int][]Service
	for round := range 60 {
		switch round {
		case 0:
			for i := range 40 {
				have[i] = svc(i)
			}
		case 30:
			// A restarted agent: its first apply is whole, and sweeps.
			wt, kt = NewServiceTable(whole), NewServiceTable(keyed)
		default:
			for range 1 + rng.Intn(4) {
				i := rng.Intn(50)
				if _, ok := have[i]; ok && rng.Intn(3) == 0 {
					delete(have, i)
				} else {
					have[i] = svc(i)
				}
			}
		}
		var cur []Service
		for _, ss := range have {
			for _, s := range ss {
				s.Backends = slices.Clone(s.Backends)
				cur = append(cur, s)
			}
		}
		slices.SortFunc(cur, func(a, b Service) int { return a.Key().Compare(b.Key()) })
		keys := changedKeys(prev, have)
		// A key named that did not change costs a look, nothing else.
		if len(cur) > 0 {
			keys = append(keys, cur[rng.Intn(len(cur))].Key())
		}
		gotGone, err := kt.ApplyKeys(cur, keys)
		if err != nil {
			t.Fatalf("round %d: keyed: %v", round, err)
		}
		wantGone, err := wt.Apply(cur)
		if err != nil {
			t.Fatalf("round %d: whole: %v", round, err)
		}
		for what, pair := range map[string][2]map[ServiceKey][]Backend{
			"left": {gotGone.Left, wantGone.Left}, "unlisted": {gotGone.Unlisted, wantGone.Unlisted}, "listed": {gotGone.Listed, wantGone.Listed}} {
			if !reflect.DeepEqual(sortedGone(pair[0]), sortedGone(pair[1])) {
				t.Fatalf("round %d: %s %v, a whole apply's %v", round, what, pair[0], pair[1])
			}
		}
		got, err := keyed.Services()
		if err != nil {
			t.Fatal(err)
		}
		ref, err := whole.Services()
		if err != nil {
			t.Fatal(err)
		}
		if !reflect.DeepEqual(sortServices(got), sortServices(ref)) {
			t.Fatalf("round %d: the maps hold %d services, a whole apply's %d", round, len(got), len(ref))
		}
		if n, m := countEntries(t, keyed), countEntries(t, whole); n != m {
			t.Fatalf("round %d: %d backends, a whole apply's %d", round, n, m)
		}
		if n, m := iterCount(t, keyed.pod.LaceSrcRanges), iterCount(t, whole.pod.LaceSrcRanges); n != m {
			t.Fatalf("round %d: %d source ranges, a whole apply's %d", round, n, m)
		}
		prev = maps.Clone(have)
	}
}

// changedKeys are the keys of the services that changed between a and b
// (added, removed or any of their entries changed), every frontend of
// each, old and new, as the agent's merge names them: a Local NodePort is
// named when its ClusterIP's endpoints change, though its own entry may
// not (its flows follow the ClusterIP's endpoints that left).
func changedKeys(a, b map[int][]Service) []ServiceKey {
	var out []ServiceKey
	for i := range 64 {
		if reflect.DeepEqual(a[i], b[i]) {
			continue
		}
		for _, s := range append(slices.Clone(a[i]), b[i]...) {
			out = append(out, s.Key())
		}
	}
	return out
}

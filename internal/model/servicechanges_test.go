package model

import (
	"net/netip"
	"slices"
	"testing"

	"github.com/lace-cni/lace/internal/tables"
)

// TestServiceChangesSince: the keys since a merge are every step's from
// it, each once and sorted; nothing when it is the same merge or the
// steps named none; not known (compare everything) before the log's
// reach, for merge 0, or after a whole merge.
func TestServiceChangesSince(t *testing.T) {
	key := func(i int) tables.FrontendKey {
		return tables.FrontendKey{VIP: netip.AddrFrom4([4]byte{10, 96, 0, byte(i)}), Proto: 6, Port: 80}
	}
	c := ServiceChanges{}.Next(1, nil) // a whole merge
	if _, ok := c.Since(0); ok {
		t.Fatal("merge 0 is known")
	}
	c = c.Next(2, []tables.FrontendKey{key(3), key(5)})
	c = c.Next(3, []tables.FrontendKey{})
	c = c.Next(4, []tables.FrontendKey{key(1), key(3)})
	for _, tc := range []struct {
		since uint64
		want  []tables.FrontendKey
		ok    bool
	}{
		{1, []tables.FrontendKey{key(1), key(3), key(5)}, true},
		{2, []tables.FrontendKey{key(1), key(3)}, true},
		{3, []tables.FrontendKey{key(1), key(3)}, true},
		{4, []tables.FrontendKey{}, true},
		{0, nil, false},
		{9, nil, false},
	} {
		got, ok := c.Since(tc.since)
		if ok != tc.ok || !slices.Equal(got, tc.want) || ok && got == nil {
			t.Errorf("since %d: %v, %v; want %v, %v (nil only when not known)", tc.since, got, ok, tc.want, tc.ok)
		}
	}
	// Steps that named nothing are nothing, not "everything".
	e := ServiceChanges{}.Next(1, nil).Next(2, []tables.FrontendKey{}).Next(3, []tables.FrontendKey{})
	if got, ok := e.Since(1); !ok || got == nil || len(got) != 0 {
		t.Errorf("two empty steps: %v, %v", got, ok)
	}
	// The log reaches back maxServiceLog steps; a whole merge starts anew.
	for g := uint64(5); g <= 5+maxServiceLog; g++ {
		c = c.Next(g, []tables.FrontendKey{key(int(g))})
	}
	if _, ok := c.Since(4); ok {
		t.Error("merge 4 is known after more steps than the log holds")
	}
	if _, ok := c.Since(c.Gen - maxServiceLog); !ok {
		t.Errorf("merge %d, %d steps back, is not known", c.Gen-maxServiceLog, maxServiceLog)
	}
	if c = c.Next(c.Gen+1, nil); len(c.Log) != 0 {
		t.Errorf("a whole merge keeps a log of %d steps", len(c.Log))
	}
	if _, ok := c.Since(c.Gen - 1); ok {
		t.Error("the merge before a whole merge is known")
	}
}

// TestServiceChangesBetween: beside the log's keys, a NodePort closed in
// one of the two lists only and every hostPort of either is visited; one
// closed in both is not (its entry is the same unless the log names it).
// The same merge, closed alike and with no hostPorts, is the same list.
func TestServiceChangesBetween(t *testing.T) {
	key := func(i int) tables.FrontendKey {
		return tables.FrontendKey{VIP: netip.AddrFrom4([4]byte{10, 96, 0, byte(i)}), Proto: 6, Port: 80}
	}
	keys := func(is ...int) []tables.FrontendKey {
		var out []tables.FrontendKey
		for _, i := range is {
			out = append(out, key(i))
		}
		return out
	}
	was := ServiceChanges{}.Next(1, nil)
	was.Gated = keys(2, 3)
	now := was.Next(2, keys(1))
	now.Gated, now.HostPorts = keys(3, 4), keys(9)
	got, ok := now.Between(was)
	slices.SortFunc(got, tables.FrontendKey.Compare)
	if want := keys(1, 2, 4, 9); !ok || !slices.Equal(slices.Compact(got), want) {
		t.Errorf("Between = %v, %v; want %v", got, ok, want)
	}
	if got, ok := now.Between(ServiceChanges{Gen: 7}); ok {
		t.Errorf("Between a merge the log does not reach = %v, true", got)
	}
	same := was
	same.Gated = keys(2, 3)
	if !same.Same(was) {
		t.Error("the same merge, closed alike, is not the same list")
	}
	if other := (ServiceChanges{Gen: 1, Gated: keys(2)}); other.Same(was) {
		t.Error("a list closed otherwise is the same list")
	}
	if hp := (ServiceChanges{Gen: 1, Gated: keys(2, 3), HostPorts: keys(9)}); hp.Same(was) || was.Same(hp) {
		t.Error("a list with hostPorts is the same list")
	}
	if (ServiceChanges{}).Same(ServiceChanges{}) {
		t.Error("a list of no merge is the same list")
	}
}

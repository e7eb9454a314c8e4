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

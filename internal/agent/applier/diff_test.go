package applier

import (
	"sort"
	"testing"
)

func TestSyncListTouchesOnlyTheDifference(t *testing.T) {
	type item struct {
		k string
		v int
	}
	cur := []item{{"a", 1}, {"b", 2}, {"c", 3}}
	want := []item{{"a", 1}, {"b", 20}, {"d", 4}}
	var upserts, deletes []string
	err := SyncListEq(cur, want, func(i item) string { return i.k },
		func(i item) error { upserts = append(upserts, i.k); return nil },
		func(i item) error { deletes = append(deletes, i.k); return nil })
	if err != nil {
		t.Fatal(err)
	}
	sort.Strings(upserts)
	if len(upserts) != 2 || upserts[0] != "b" || upserts[1] != "d" {
		t.Errorf("upserts %v, want [b d] (a is unchanged)", upserts)
	}
	if len(deletes) != 1 || deletes[0] != "c" {
		t.Errorf("deletes %v, want [c]", deletes)
	}
}

package model

import (
	"slices"
	"testing"
)

// TestFirstSet: values come and go in any order, the first one's removal
// promotes another, and a key with none left is gone from both maps.
func TestFirstSet(t *testing.T) {
	m := NewFirstSet[string, int]()
	vals := func(k string) []int {
		var out []int
		m.Each(k, func(v int) bool { out = append(out, v); return true })
		slices.Sort(out)
		return out
	}
	for v := range 5 {
		m.Add("a", v)
	}
	m.Add("a", 0) // again: still once
	m.Add("b", 9)
	if got := vals("a"); !slices.Equal(got, []int{0, 1, 2, 3, 4}) {
		t.Fatalf("a holds %v", got)
	}
	m.Remove("a", 0)
	m.Remove("a", 3)
	m.Remove("a", 7) // never added
	if got := vals("a"); !slices.Equal(got, []int{1, 2, 4}) {
		t.Fatalf("a holds %v after removals", got)
	}
	for _, v := range []int{1, 2, 4} {
		m.Remove("a", v)
	}
	if _, ok := m.first["a"]; ok || len(m.more["a"]) != 0 || m.more["a"] != nil {
		t.Fatalf("a left behind: first %v more %v", m.first, m.more)
	}
	n := 0
	m.Each("b", func(int) bool { n++; return false })
	if n != 1 || !slices.Equal(vals("b"), []int{9}) {
		t.Fatalf("b: %v", vals("b"))
	}
}

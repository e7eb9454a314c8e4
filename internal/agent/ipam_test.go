package agent

import (
	"net/netip"
	"testing"
)

func TestPickAddr(t *testing.T) {
	b := netip.MustParsePrefix("10.0.0.0/30")
	a, ok := pickAddr(b, nil)
	if !ok || a.String() != "10.0.0.2" {
		t.Fatalf("first = %s %v, want 10.0.0.2", a, ok)
	}
	if _, ok := pickAddr(b, map[netip.Addr]bool{a: true}); ok {
		t.Fatal("a /30 has one pod address; got a second")
	}
	v6 := netip.MustParsePrefix("fd00::/126")
	got := []string{}
	used := map[netip.Addr]bool{}
	for {
		a, ok := pickAddr(v6, used)
		if !ok {
			break
		}
		used[a] = true
		got = append(got, a.String())
	}
	if len(got) != 2 || got[0] != "fd00::2" || got[1] != "fd00::3" {
		t.Fatalf("v6 addresses %v", got)
	}
}

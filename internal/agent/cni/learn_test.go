package cni

import (
	"fmt"
	"testing"

	lacev1 "github.com/lace-cni/lace/api/v1alpha1"
)

func TestMergeLearned(t *testing.T) {
	b := func(mac, addr string, seq int64) lacev1.LearnedBinding {
		return lacev1.LearnedBinding{MAC: lacev1.MACAddress(mac), Address: lacev1.IPAddress(addr), Sequence: seq}
	}
	g, h := "52:54:00:00:00:01", "52:54:00:00:00:02"
	var many []lacev1.LearnedBinding
	for i := range 20 {
		many = append(many, b(fmt.Sprintf("52:54:00:00:01:%02x", i), "", 0))
	}
	for _, c := range []struct {
		name     string
		have, bs []lacev1.LearnedBinding
		want     []lacev1.LearnedBinding
	}{
		{"new", nil, []lacev1.LearnedBinding{b(g, "10.0.0.9", 0)}, []lacev1.LearnedBinding{b(g, "10.0.0.9", 0)}},
		{"again: unchanged", []lacev1.LearnedBinding{b(g, "10.0.0.9", 3)}, []lacev1.LearnedBinding{b(g, "10.0.0.9", 0)}, []lacev1.LearnedBinding{b(g, "10.0.0.9", 3)}},
		{"claimed again after a move: higher sequence, newest last", []lacev1.LearnedBinding{b(g, "10.0.0.9", 0), b(h, "", 0)},
			[]lacev1.LearnedBinding{b(g, "10.0.0.9", 2)}, []lacev1.LearnedBinding{b(h, "", 0), b(g, "10.0.0.9", 2)}},
		{"an address takes its new MAC", []lacev1.LearnedBinding{b(g, "10.0.0.9", 0)}, []lacev1.LearnedBinding{b(h, "10.0.0.9", 1)},
			[]lacev1.LearnedBinding{b(h, "10.0.0.9", 1)}},
		{"the oldest go beyond 16", nil, many, many[4:]},
	} {
		if got := mergeLearned(c.have, c.bs); fmt.Sprint(got) != fmt.Sprint(c.want) {
			t.Errorf("%s: got %v, want %v", c.name, got, c.want)
		}
	}
}

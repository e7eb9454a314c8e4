package cni

import (
	"fmt"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/types"

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

// TestLearnBudget: an endpoint adds learnBurst new bindings at once, then
// one per learnRefill; another endpoint has its own allowance; a refilled
// allowance is forgotten.
func TestLearnBudget(t *testing.T) {
	var l learnState
	a, b := types.NamespacedName{Namespace: "t", Name: "a"}, types.NamespacedName{Namespace: "t", Name: "b"}
	now := time.Unix(1000, 0)
	for i := range learnBurst {
		if !l.take(a, now) {
			t.Fatalf("new binding %d of the burst refused", i+1)
		}
	}
	if l.take(a, now) {
		t.Fatal("a binding beyond the burst taken")
	}
	if !l.take(b, now) {
		t.Fatal("another endpoint shares the first's allowance")
	}
	if l.take(a, now.Add(learnRefill/2)) {
		t.Fatal("a binding taken before the refill")
	}
	if !l.take(a, now.Add(learnRefill)) || l.take(a, now.Add(learnRefill)) {
		t.Fatal("not one binding per refill")
	}
	l.forgetFull(now.Add(learnRefill + learnBurst*learnRefill))
	if len(l.budget) != 0 {
		t.Fatalf("%d allowances left after they refilled", len(l.budget))
	}
}

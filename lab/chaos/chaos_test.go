package chaos

import (
	"context"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"
	"time"
)

func names(fs []*fault) []string {
	var out []string
	for _, f := range fs {
		out = append(out, f.name)
	}
	return out
}

// TestSequenceReplays: a seed draws the same fault sequence every time
// (what makes `make chaos SEED=...` a replay), another seed another one,
// and each round holds every kind once.
func TestSequenceReplays(t *testing.T) {
	seq := func(seed uint64) []string {
		h := &harness{rng: rand.New(rand.NewPCG(seed, 0x1ace))}
		return names(h.sequence(faults))
	}
	a, b, c := seq(7), seq(7), seq(8)
	if !slices.Equal(a, b) {
		t.Fatal("seed 7 drew two different sequences")
	}
	if slices.Equal(a, c) {
		t.Error("seeds 7 and 8 drew the same sequence")
	}
	for r := 0; r+len(faults) <= len(a); r += len(faults) {
		round := slices.Clone(a[r : r+len(faults)])
		slices.Sort(round)
		want := names(faults)
		slices.Sort(want)
		if !slices.Equal(round, want) {
			t.Fatalf("round %d is %v, want every kind once", r/len(faults), round)
		}
	}
}

func TestSelectFaults(t *testing.T) {
	got, err := selectFaults([]string{"etcd-down", "agent-kill"})
	if err != nil || !slices.Equal(names(got), []string{"etcd-down", "agent-kill"}) {
		t.Fatalf("got %v, %v", names(got), err)
	}
	if _, err := selectFaults([]string{"agent-kil"}); err == nil || !strings.Contains(err.Error(), "agent-kill") {
		t.Errorf("a misspelt kind: %v, want an error listing the kinds", err)
	}
}

// TestStateDiff: only entries lost count; entries added (a pod attached)
// do not.
func TestStateDiff(t *testing.T) {
	before := nodeState{"n1": {"lace_routes": {"a": true, "b": true}}}
	if d := before.diff(nodeState{"n1": {"lace_routes": {"a": true, "b": true, "c": true}}}); d != "" {
		t.Errorf("an added entry counted: %s", d)
	}
	if d := before.diff(nodeState{"n1": {"lace_routes": {"a": true}}}); d != "n1 lost 1 of 2 entries of lace_routes" {
		t.Errorf("diff %q", d)
	}
}

// TestMetricSum reads a counter's series and nothing that merely starts
// with its name.
func TestMetricSum(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		_, _ = w.Write([]byte("# HELP x\nlace_x_total{map=\"a\"} 2\nlace_x_total{map=\"b\"} 3\nlace_x_total_other 100\nlace_x_total 1\n"))
	}))
	defer srv.Close()
	n, err := metricSum(context.Background(), srv.Client(), srv.URL, "lace_x_total")
	if err != nil || n != 6 {
		t.Fatalf("sum %g, %v; want 6", n, err)
	}
}

// TestVIPMoveCause: a break through the VIP is put down to the VIP's last
// move within the window before it, excused only when the VIP went back
// to a node it had failed over from.
func TestVIPMoveCause(t *testing.T) {
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	var v vipWatch
	v.moves = []vipMove{{at: t0, from: "n1", to: "n3"}, {at: t0.Add(30 * time.Second), from: "n3", to: "n1"}, {at: t0.Add(60 * time.Second), from: "n1", to: "n2"}}
	if _, _, ok := v.cause(t0.Add(20 * time.Second)); ok {
		t.Error("a break 20 s after the last move is put down to it")
	}
	if m, back, ok := v.cause(t0.Add(32 * time.Second)); !ok || back || m.to != "n1" {
		t.Errorf("before n1 failed over: cause %v back %v ok %v, want the move to n1, not back", m, back, ok)
	}
	v.failedOver("n1")
	if m, back, ok := v.cause(t0.Add(32 * time.Second)); !ok || !back || m.to != "n1" {
		t.Errorf("after n1 failed over: cause %v back %v ok %v, want the move back to n1", m, back, ok)
	}
	if m, back, ok := v.cause(t0.Add(61 * time.Second)); !ok || back || m.to != "n2" {
		t.Errorf("a move to n2, which the VIP never left: cause %v back %v ok %v", m, back, ok)
	}
}

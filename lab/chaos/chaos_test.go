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

// TestVIPMoveCause: a break through the VIP is excused only when every
// move of the VIP just before it went back to a node the VIP had failed
// over from, the first time it went back there: a flap, a second return
// or a move no failover explains fail the run, with the moves named.
func TestVIPMoveCause(t *testing.T) {
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	at := func(s int) time.Time { return t0.Add(time.Duration(s) * time.Second) }
	move := func(s int, from, to string) vipMove {
		return vipMove{since: at(s).Add(-250 * time.Millisecond), at: at(s), from: from, to: to}
	}
	var v vipWatch
	v.failedOver("n1")
	v.record(move(0, "n1", "n3"))   // the failover
	v.record(move(30, "n3", "n1"))  // back
	v.record(move(60, "n1", "n2"))  // nothing explains it
	v.record(move(90, "n2", "n1"))  // n1 again: not a first return
	v.record(move(120, "n1", "n3")) // a flap ...
	v.failedOver("n3")
	v.record(move(121, "n3", "n1")) // ... around n1
	for _, c := range []struct {
		at    int
		moves int
		back  bool
	}{
		{20, 0, false}, // no move just before
		{32, 1, true},  // back to n1 after its failover
		{61, 1, false}, // n1 to n2
		{91, 1, false}, // n1 went back once already
		{122, 2, false},
	} {
		moves, back := v.cause(at(c.at))
		if len(moves) != c.moves || back != c.back {
			t.Errorf("break at %d s: moves %v back %v, want %d moves, back %v", c.at, moves, back, c.moves, c.back)
		}
	}
	// A move seen late (its poll interval began before the break) still
	// counts.
	if moves, _ := v.cause(at(30).Add(-100 * time.Millisecond)); len(moves) != 1 {
		t.Errorf("a break inside the poll interval of the move back: %v", moves)
	}
}

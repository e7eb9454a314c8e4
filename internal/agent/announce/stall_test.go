package announce

import (
	"context"
	"io"
	"log/slog"
	"net/netip"
	"slices"
	"testing"
	"time"

	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"

	"github.com/lace-cni/lace/pkg/scheme"
)

// stallRig is two agents, each on a clock of its own, writing to one API
// server that stalls every write until stallUntil: a write waits for the
// stall's end on its agent's clock, or times out after a lease duration.
// An agent whose tick ran past the next one skips it, as a ticker drops
// ticks.
type stallRig struct {
	t      *testing.T
	now    time.Time
	clocks [2]*time.Time
	ans    [2]*Announcer
	dps    [2]*fakeDP
	// stallUntil: a write lands when called (the fake store itself
	// never waits), its wait is counted on its agent's clock.
	stallUntil time.Time
}

func newStallRig(t *testing.T, dur time.Duration) *stallRig {
	r := &stallRig{t: t, now: time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)}
	store := fake.NewClientBuilder().WithScheme(scheme.Scheme).WithObjects(twoNodesEightVIPs(false)...).Build()
	for i, node := range []string{"n1", "n2"} {
		clk := r.now
		r.clocks[i] = &clk
		stalled := interceptor.NewClient(store, interceptor.Funcs{
			Update: func(ctx context.Context, c client.WithWatch, o client.Object, opts ...client.UpdateOption) error {
				if wait := r.stallUntil.Sub(clk); wait > 0 {
					if wait >= dur {
						clk = clk.Add(dur)
						return context.DeadlineExceeded
					}
					clk = r.stallUntil
				}
				return c.Update(ctx, o, opts...)
			},
		})
		r.ans[i], r.dps[i] = lagAgent(store, stalled, node, dur, &clk)
	}
	return r
}

// tick advances the shared time by a tick and runs each agent whose
// clock is not past it.
func (r *stallRig) tick(dur time.Duration, which ...int) {
	r.t.Helper()
	r.now = r.now.Add(dur/8 + time.Millisecond)
	for _, i := range which {
		if r.clocks[i].After(r.now) {
			continue
		}
		*r.clocks[i] = r.now
		if err := r.ans[i].once(context.Background()); err != nil {
			r.t.Fatal(err)
		}
	}
}

func (r *stallRig) held(i int) []netip.Addr {
	r.dps[i].mu.Lock()
	defer r.dps[i].mu.Unlock()
	out := slices.Clone(r.dps[i].vips)
	slices.SortFunc(out, netip.Addr.Compare)
	return out
}

// TestAnnouncerNoTakeoverAcrossAnAPIStall: the API server stalls every
// write for about a lease duration (etcd's disk on a loaded machine). The
// renewal of one agent times out in it while the other's waits and gets
// through; the second then saw the first silent for a lease and took its
// VIPs, which moved back a tick later (CI's chaos run, a VIP moving n3 to
// n1 in a pod burst that killed n2's agent). Each agent's own wait is
// taken off its peers' silence: no VIP moves, at any phase of the two
// agents' renewals and any stall length around the lease.
func TestAnnouncerNoTakeoverAcrossAnAPIStall(t *testing.T) {
	const dur = pairDur
	for phase := range 4 {
		for _, stall := range []time.Duration{dur - dur/8, dur, dur + dur/8, dur + dur/4, dur + dur/2} {
			r := newStallRig(t, dur)
			for range phase {
				r.tick(dur, 0)
			}
			for range 8 {
				r.tick(dur, 0, 1)
			}
			before := [2][]netip.Addr{r.held(0), r.held(1)}
			if len(before[0]) == 0 || len(before[1]) == 0 {
				t.Fatalf("each node should hold some of the 8 VIPs: %v", before)
			}
			r.stallUntil = r.now.Add(stall)
			for i := range 40 {
				r.tick(dur, 0, 1)
				for a := range 2 {
					for _, v := range r.held(a) {
						if slices.Contains(before[1-a], v) {
							t.Fatalf("phase %d, stall %s: tick %d after the stall began, n%d took %s from n%d",
								phase, stall, i+1, a+1, v, 2-a)
						}
					}
				}
			}
			// Both renew again and hold what they held.
			for a := range 2 {
				if got := r.held(a); !slices.Equal(got, before[a]) {
					t.Errorf("phase %d, stall %s: n%d holds %v after the stall, held %v", phase, stall, a+1, got, before[a])
				}
			}
		}
	}
}

// TestAnnouncerTakesOverWhileTheAPIStalls: a dead peer is still taken over
// while every write of the survivor is slow: promptly when its writes
// wait less than half a lease (no stall credited), and still, later,
// when they wait more (a silence is credited at most a lease).
func TestAnnouncerTakesOverWhileTheAPIStalls(t *testing.T) {
	const dur = pairDur
	for _, c := range []struct {
		wait, within time.Duration
	}{
		{wait: dur/2 - dur/20, within: dur + dur/2},
		{wait: dur/2 + dur/4, within: 2*dur + dur/2},
	} {
		r := newStallRig(t, dur)
		for range 8 {
			r.tick(dur, 0, 1)
		}
		if len(r.held(1)) == 0 {
			t.Fatal("n2 held no VIP")
		}
		// n2 dies; every write of n1 from now on waits c.wait.
		last := r.now
		for len(r.held(0)) < 8 {
			if r.now.Sub(last) > c.within {
				t.Fatalf("writes waiting %s: n2 dead for %s, n1 holds %d of 8, want all within %s",
					c.wait, r.now.Sub(last), len(r.held(0)), c.within)
			}
			r.stallUntil = r.clocks[0].Add(c.wait)
			r.tick(dur, 0)
		}
		t.Logf("writes waiting %s: n1 took n2's VIPs %s after n2's last tick", c.wait, r.now.Sub(last))
		// Slow writes after the takeover give the dead peer nothing back.
		for i := range 16 {
			r.stallUntil = r.clocks[0].Add(dur - dur/20)
			r.tick(dur, 0)
			if got := len(r.held(0)); got != 8 {
				t.Fatalf("writes waiting %s: %d ticks after the takeover, n1 holds %d of 8: a stall revived dead n2", c.wait, i+1, got)
			}
		}
	}
}

// TestCreditStall pins the credit's rule: only a wait of half a lease or
// more counts, it moves a live peer's silence by the wait, at most a
// lease per silence (a renewal starts a new one), never past now, and
// leaves the own node and a peer already taken for dead alone.
func TestCreditStall(t *testing.T) {
	const dur = 2 * time.Second
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	an := New(Options{NodeName: "n1", LeaseDuration: dur}, slog.New(slog.NewTextHandler(io.Discard, nil)), nil, nil, nil, nil)
	an.now = func() time.Time { return now }
	at := now.Add(-dur)
	reset := func() {
		an.seen = map[string]leaseSeen{
			"n1":   {renew: "a", at: at},
			"live": {renew: "a", at: at},
			"dead": {renew: "a", at: at, lapsed: true},
			"new":  {renew: "a", at: now.Add(-dur / 4)},
		}
	}
	for _, c := range []struct {
		name  string
		waits []time.Duration
		live  time.Duration // how far live's at moves
		newer time.Duration // how far new's at moves
	}{
		{"under half a lease", []time.Duration{dur/2 - time.Millisecond}, 0, 0},
		{"half a lease", []time.Duration{dur / 2}, dur / 2, dur / 4},
		{"a timeout", []time.Duration{dur}, dur, dur / 4},
		{"at most a lease per silence", []time.Duration{dur * 3 / 4, dur * 3 / 4}, dur, dur / 4},
	} {
		reset()
		for _, w := range c.waits {
			an.creditStall(w)
		}
		if got := an.seen["live"].at.Sub(at); got != c.live {
			t.Errorf("%s: a live peer's silence moved %s, want %s", c.name, got, c.live)
		}
		if got := an.seen["new"].at.Sub(now.Add(-dur / 4)); got != c.newer {
			t.Errorf("%s: a peer seen a quarter lease ago moved %s, want %s (never past now)", c.name, got, c.newer)
		}
		if an.seen["n1"].at != at || an.seen["dead"].at != at {
			t.Errorf("%s: the own node or a dead peer was credited: %+v", c.name, an.seen)
		}
	}
	// A renewal seen starts a new silence, with a lease of credit again.
	reset()
	an.creditStall(dur)
	an.seen["live"] = leaseSeen{renew: "b", at: now.Add(-dur)}
	an.creditStall(dur)
	if got := an.seen["live"].at; !got.Equal(now) {
		t.Errorf("after a renewal, a second stall moved the live peer to %s, want now (%s)", got, now)
	}
}

package announce

import (
	"bytes"
	"context"
	"io"
	"log/slog"
	"net/netip"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"

	lacev1 "github.com/lace-cni/lace/api/v1alpha1"
	"github.com/lace-cni/lace/pkg/scheme"
)

// laggingCache is an agent's cached client over the API server's store:
// while frozen, reads of Leases (Get and List) return what the store held
// when it froze, as a loaded API server's watch delivers its writes
// seconds late; writes go to the store.
type laggingCache struct {
	frozen atomic.Bool
	snap   coordinationv1.LeaseList
}

func (lc *laggingCache) client(store client.WithWatch) client.WithWatch {
	return interceptor.NewClient(store, interceptor.Funcs{
		Get: func(ctx context.Context, c client.WithWatch, k client.ObjectKey, o client.Object, opts ...client.GetOption) error {
			if l, ok := o.(*coordinationv1.Lease); ok && lc.frozen.Load() {
				for _, s := range lc.snap.Items {
					if s.Namespace == k.Namespace && s.Name == k.Name {
						s.DeepCopyInto(l)
						return nil
					}
				}
			}
			return c.Get(ctx, k, o, opts...)
		},
		List: func(ctx context.Context, c client.WithWatch, l client.ObjectList, opts ...client.ListOption) error {
			if ll, ok := l.(*coordinationv1.LeaseList); ok && lc.frozen.Load() {
				lc.snap.DeepCopyInto(ll)
				return nil
			}
			return c.List(ctx, l, opts...)
		},
	})
}

func (lc *laggingCache) freeze(t *testing.T, store client.Client) {
	t.Helper()
	if err := store.List(context.Background(), &lc.snap); err != nil {
		t.Fatal(err)
	}
	lc.frozen.Store(true)
}

// lagAgent is node's announcer reading through cache and the API server
// (store) directly, on the shared clock.
func lagAgent(store client.WithWatch, cache client.Client, node string, dur time.Duration, clock *time.Time) (*Announcer, *fakeDP) {
	dp := &fakeDP{}
	an := New(Options{NodeName: node, NetNS: "/fake", UnderlayInterface: "eth0", LeaseNamespace: "lace-system", LeaseDuration: dur},
		slog.New(slog.NewTextHandler(io.Discard, nil)), cache, store, dp, listServices{store})
	an.send = func(string, string, [][]byte) error { return nil }
	an.groups = noGroups{}
	an.seen, an.announced = map[string]leaseSeen{}, map[netip.Addr]bool{}
	an.now = func() time.Time { return *clock }
	return an, dp
}

// TestAnnouncerRenewsThroughLaggingCache: with its cache seconds behind
// the API server, an agent keeps renewing its Lease and keeps its VIPs.
// It used to update the Lease as its cache had it: every renewal
// conflicted, the Lease lapsed, and the VIPs moved (the chaos harness's
// 300-pod burst reset the external host's stream through the VIP).
func TestAnnouncerRenewsThroughLaggingCache(t *testing.T) {
	const dur = 2 * time.Second
	clock := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	store := fake.NewClientBuilder().WithScheme(scheme.Scheme).WithObjects(twoNodesEightVIPs(false)...).Build()
	lc := &laggingCache{}
	an, dp := lagAgent(store, lc.client(store), "n1", dur, &clock)
	ctx := context.Background()
	step := func() {
		t.Helper()
		clock = clock.Add(dur / 4)
		if err := an.once(ctx); err != nil {
			t.Fatal(err)
		}
	}
	step()
	step()
	lc.freeze(t, store)
	for i := range 40 {
		step()
		var l coordinationv1.Lease
		if err := store.Get(ctx, client.ObjectKey{Namespace: "lace-system", Name: LeaseName("n1")}, &l); err != nil {
			t.Fatal(err)
		}
		if !l.Spec.RenewTime.Time.Equal(clock) {
			t.Fatalf("cache %s behind: the Lease was last renewed at %s, now is %s", time.Duration(i+1)*dur/4, l.Spec.RenewTime.Time, clock)
		}
		dp.mu.Lock()
		n := len(dp.vips)
		dp.mu.Unlock()
		if n != 8 {
			t.Fatalf("cache %s behind: n1 announces %d of its 8 VIPs", time.Duration(i+1)*dur/4, n)
		}
	}
}

// TestAnnouncerNoTakeoverOnLaggingCache: a peer whose cache lags behind
// (its own renewals missing from it) does not take the VIPs of an agent
// that renews all along; once it catches up and that agent is really
// silent for a lease duration, it does.
func TestAnnouncerNoTakeoverOnLaggingCache(t *testing.T) {
	const dur = pairDur
	r := newPair(t)
	an1, dp1, an2, dp2, count, step := r.an1, r.dp1, r.an2, r.dp2, vipCount, r.step
	for range 4 {
		step(an1, an2)
	}
	held1 := count(dp1)
	if held1 == 0 || held1+count(dp2) != 8 {
		t.Fatalf("before: n1 holds %d, n2 %d of 8", held1, count(dp2))
	}
	r.lc.freeze(t, r.store)
	for i := range 40 {
		step(an1, an2)
		if count(dp1) != held1 || count(dp2) != 8-held1 {
			t.Fatalf("n2's cache %s behind, n1 renewing: n1 holds %d (had %d), n2 %d", time.Duration(i+1)*dur/8, count(dp1), held1, count(dp2))
		}
	}
	r.lc.frozen.Store(false)
	// n1 goes silent: n2, up to date again, takes its VIPs after a lease
	// duration.
	for range 12 {
		step(an2)
	}
	if count(dp2) != 8 {
		t.Fatalf("n1 silent for %s and n2's cache current: n2 holds %d of 8", 12*dur/8, count(dp2))
	}
}

// TestAnnouncerTakesOverThroughFailedRenewals: an agent whose own
// renewals fail now and then (timeouts on a loaded API server), its cache
// current, still takes a dead peer's VIPs after a lease duration and
// keeps them. A lag measured from its last renewal instead of its cache
// counted each failure as the cache lagging, and held the dead peer alive
// (the review's probe: one failure in three, never taken over).
func TestAnnouncerTakesOverThroughFailedRenewals(t *testing.T) {
	const dur = 2 * time.Second
	clock := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	store := fake.NewClientBuilder().WithScheme(scheme.Scheme).WithObjects(twoNodesEightVIPs(false)...).Build()
	var updates atomic.Int32
	flaky := interceptor.NewClient(store, interceptor.Funcs{
		Update: func(ctx context.Context, c client.WithWatch, o client.Object, opts ...client.UpdateOption) error {
			if updates.Add(1)%3 == 0 {
				return context.DeadlineExceeded
			}
			return c.Update(ctx, o, opts...)
		},
	})
	// n2's cache is a tick behind: it shows what the store held before
	// this tick's writes.
	lc := &laggingCache{}
	an1, _ := lagAgent(store, store, "n1", dur, &clock)
	an2, dp2 := lagAgent(store, lc.client(flaky), "n2", dur, &clock)
	ctx := context.Background()
	step := func(ans ...*Announcer) {
		t.Helper()
		clock = clock.Add(dur/8 + time.Millisecond)
		lc.freeze(t, store)
		for _, an := range ans {
			if err := an.once(ctx); err != nil {
				t.Fatal(err)
			}
		}
	}
	for range 4 {
		step(an1, an2)
	}
	// n1 dies.
	for range 16 {
		step(an2)
	}
	for i := range 64 {
		step(an2)
		dp2.mu.Lock()
		n := len(dp2.vips)
		dp2.mu.Unlock()
		if n != 8 {
			t.Fatalf("n1 dead for %s, n2 renewing with one failure in three: n2 holds %d of 8", time.Duration(16+i+1)*(dur/8), n)
		}
	}
}

// TestAnnouncerRestoresItsLease: whoever strips the agent label or the
// holder from the own Lease, the next renewal speaks for the node again
// (without the label, the peers' caches no longer see the node at all).
func TestAnnouncerRestoresItsLease(t *testing.T) {
	const dur = 2 * time.Second
	clock := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	store := fake.NewClientBuilder().WithScheme(scheme.Scheme).WithObjects(twoNodesEightVIPs(false)...).Build()
	an, _ := lagAgent(store, store, "n1", dur, &clock)
	ctx := context.Background()
	key := client.ObjectKey{Namespace: "lace-system", Name: LeaseName("n1")}
	if err := an.once(ctx); err != nil {
		t.Fatal(err)
	}
	var l coordinationv1.Lease
	if err := store.Get(ctx, key, &l); err != nil {
		t.Fatal(err)
	}
	l.Labels = nil
	l.Spec.HolderIdentity = nil
	if err := store.Update(ctx, &l); err != nil {
		t.Fatal(err)
	}
	clock = clock.Add(dur / 4)
	if err := an.once(ctx); err != nil {
		t.Fatal(err)
	}
	if err := store.Get(ctx, key, &l); err != nil {
		t.Fatal(err)
	}
	if l.Labels[lacev1.LabelAgentLease] != "true" || l.Spec.HolderIdentity == nil || *l.Spec.HolderIdentity != "n1" || !l.Spec.RenewTime.Time.Equal(clock) {
		t.Fatalf("after a renewal: labels %v, holder %v, renewed %v (now %s)", l.Labels, l.Spec.HolderIdentity, l.Spec.RenewTime, clock)
	}
}

// TestAnnouncerNoTakeoverAfterHungConnection: an agent whose requests hung
// on a connection the fabric lost (a 30 s cut, noticed 45 s later) renews
// at once on a new connection, while its cache still holds what it held
// before the cut. Its peers' silence there is the cache's: it must not
// take their VIPs. It used to, for a tick (the chaos soak's agent-kill
// after a fabric-link-down: the external host followed the gratuitous ARP
// to the wrong node, and its stream through the VIP was reset later).
func TestAnnouncerNoTakeoverAfterHungConnection(t *testing.T) {
	r := newPair(t)
	an1, dp1, an2, dp2, count, step := r.an1, r.dp1, r.an2, r.dp2, vipCount, r.step
	for range 4 {
		step(an1, an2)
	}
	held1, held2 := count(dp1), count(dp2)
	if held1 == 0 || held1+held2 != 8 {
		t.Fatalf("before: n1 holds %d, n2 %d of 8", held1, held2)
	}
	// n2 is cut off: its cache stops, its ticks hang; n1 goes on.
	r.lc.freeze(t, r.store)
	for range 45 * 8 / 2 {
		step(an1)
	}
	// The connection is found lost; the next requests go through.
	for i := range 4 {
		step(an1, an2)
		if count(dp2) != held2 {
			t.Fatalf("tick %d after n2's requests hung for 45s, its cache as before the cut: n2 holds %d VIPs, had %d", i+1, count(dp2), held2)
		}
	}
}

// pair is n1 reading the API server directly and n2 through a cache that
// can lag, on one clock that each step moves a tick (dur/8) on.
type pair struct {
	an1, an2 *Announcer
	dp1, dp2 *fakeDP
	lc       *laggingCache
	store    client.WithWatch
	step     func(ans ...*Announcer)
}

// pairDur is a pair's lease duration.
const pairDur = 2 * time.Second

func newPair(t *testing.T) *pair {
	const dur = pairDur
	clock := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	r := &pair{lc: &laggingCache{}}
	r.store = fake.NewClientBuilder().WithScheme(scheme.Scheme).WithObjects(twoNodesEightVIPs(false)...).Build()
	r.an1, r.dp1 = lagAgent(r.store, r.store, "n1", dur, &clock)
	r.an2, r.dp2 = lagAgent(r.store, r.lc.client(r.store), "n2", dur, &clock)
	r.step = func(ans ...*Announcer) {
		t.Helper()
		clock = clock.Add(dur / 8)
		for _, an := range ans {
			if err := an.once(context.Background()); err != nil {
				t.Fatal(err)
			}
		}
	}
	return r
}

func vipCount(dp *fakeDP) int { dp.mu.Lock(); defer dp.mu.Unlock(); return len(dp.vips) }

// TestAnnouncerTakesOverSoonAfterLapse: a dead peer's VIPs are taken
// within the lease duration and three ticks of its last renewal, whatever
// the phase of the survivor's renewals, with a cache that shows each
// write from the next tick on: a tick until the survivor sees the last
// renewal, one to notice the lapse, one for its cache to show its own
// renewal after the lapse. A peer's silence counts only as far as the survivor's own
// renewal shows in its cache, so the survivor renews as soon as a lapse
// waits on that alone: waiting for its next quarter-duration renewal, and
// a tick for the cache to show it, made the takeover up to three ticks
// late (TestLoadBalancerL2 measured 3.02 s from the last heartbeat).
func TestAnnouncerTakesOverSoonAfterLapse(t *testing.T) {
	const dur = pairDur
	for phase := range 4 {
		clock := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
		store := fake.NewClientBuilder().WithScheme(scheme.Scheme).WithObjects(twoNodesEightVIPs(false)...).Build()
		lc := &laggingCache{}
		an1, _ := lagAgent(store, store, "n1", dur, &clock)
		an2, dp2 := lagAgent(store, lc.client(store), "n2", dur, &clock)
		var logged bytes.Buffer
		an2.log = slog.New(slog.NewJSONHandler(&logged, nil))
		step := laggedTicks(t, &clock, lc, store, dur)
		// n2 starts phase ticks after n1: its renewals are out of step
		// with n1's by as much.
		for range phase {
			step(an1)
		}
		for range 8 {
			step(an1, an2)
		}
		lastBeat := an1.renewed
		// n1 dies; n2 goes on, a tick at a time.
		held := 0
		var at time.Time
		for range 40 {
			step(an2)
			if held = vipCount(dp2); held == 8 {
				at = clock
				break
			}
		}
		if held != 8 {
			t.Fatalf("phase %d: n1 dead for 5 s: n2 holds %d of 8", phase, held)
		}
		// The takeover names its reason, once.
		if n := strings.Count(logged.String(), `"msg":"agent Lease lapsed","peer":"n1"`); n != 1 {
			t.Errorf("phase %d: n2 logged n1's lapse %d times, want 1:\n%s", phase, n, logged.String())
		}
		// The lease is 7.97 ticks of dur/8+1ms: lapsed at the 8th after
		// n2 first saw the renewal, itself a tick late.
		if ticks := int(at.Sub(lastBeat) / (dur/8 + time.Millisecond)); ticks > 10 {
			t.Errorf("phase %d: n2 took n1's VIPs %d ticks (%s) after n1's last renewal, want <= 10 (seen a tick late, lapsed at 9, renewed there, judged at 10)",
				phase, ticks, at.Sub(lastBeat))
		}
	}
}

// TestAnnouncerNoRenewalStormOnFrozenCache: a cache that stops (a watch
// stalled on a loaded API server) shows every peer lapsed and held alive
// by freshness alone, tick after tick; one renewal after their lapse is
// all they wait for, so the agent keeps its quarter-duration cadence
// rather than writing its Lease every tick, exactly when the API server
// is loaded.
func TestAnnouncerNoRenewalStormOnFrozenCache(t *testing.T) {
	const dur = pairDur
	clock := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	store := fake.NewClientBuilder().WithScheme(scheme.Scheme).WithObjects(twoNodesEightVIPs(false)...).Build()
	var writes atomic.Int32
	counting := interceptor.NewClient(store, interceptor.Funcs{
		Update: func(ctx context.Context, c client.WithWatch, o client.Object, opts ...client.UpdateOption) error {
			if _, ok := o.(*coordinationv1.Lease); ok {
				writes.Add(1)
			}
			return c.Update(ctx, o, opts...)
		},
	})
	lc := &laggingCache{}
	an1, _ := lagAgent(store, store, "n1", dur, &clock)
	an2, _ := lagAgent(store, lc.client(counting), "n2", dur, &clock)
	step := func(ans ...*Announcer) {
		t.Helper()
		clock = clock.Add(dur / 8)
		for _, an := range ans {
			if err := an.once(context.Background()); err != nil {
				t.Fatal(err)
			}
		}
	}
	for range 4 {
		step(an1, an2)
	}
	lc.freeze(t, store)
	writes.Store(0)
	for range 80 {
		step(an1, an2)
	}
	// The cadence alone is a write every other tick: 40.
	if n := writes.Load(); n > 42 {
		t.Errorf("n2 wrote its Lease %d times in 80 ticks with its cache frozen, want about 40 (the cadence)", n)
	}
}

// TestAnnouncerForcedRenewalHangKeepsTTL: a renewal forced by a lapse
// that hangs (a loaded API server) and fails leaves the node's entries
// lapsing no later than its last renewal plus the duration, when the
// peers take over: counted from before the wait, they answered ARP past it.
func TestAnnouncerForcedRenewalHangKeepsTTL(t *testing.T) {
	const dur = pairDur
	clock := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	store := fake.NewClientBuilder().WithScheme(scheme.Scheme).WithObjects(twoNodesEightVIPs(false)...).Build()
	var hang atomic.Bool
	var an2 *Announcer
	slow := interceptor.NewClient(store, interceptor.Funcs{
		Update: func(ctx context.Context, c client.WithWatch, o client.Object, opts ...client.UpdateOption) error {
			if hang.Load() && !an2.lapseWaits.IsZero() {
				clock = clock.Add(1500 * time.Millisecond)
				return context.DeadlineExceeded
			}
			return c.Update(ctx, o, opts...)
		},
	})
	lc := &laggingCache{}
	an1, _ := lagAgent(store, store, "n1", dur, &clock)
	var dp2 *fakeDP
	an2, dp2 = lagAgent(store, lc.client(slow), "n2", dur, &clock)
	tick := laggedTicks(t, &clock, lc, store, dur)
	for range 8 {
		tick(an1, an2)
	}
	// n1 dies; n2's renewals hang once a lapse forces one.
	hang.Store(true)
	for i := range 20 {
		tick(an2)
		dp2.mu.Lock()
		exp, n := clock.Add(dp2.ttl), len(dp2.vips)
		dp2.mu.Unlock()
		if n > 0 && exp.After(an2.renewed.Add(dur)) {
			t.Errorf("tick %d: n2's entries (%d VIPs) lapse at %s, %s past its last renewal and the duration", i, n, exp.Format("05.000"), exp.Sub(an2.renewed.Add(dur)))
		}
	}
}

// laggedTicks returns a step that moves the clock a tick (dur/8 and a
// millisecond, so that a quarter duration is not a whole number of
// ticks) and runs each announcer once, lc showing what store held before
// the step's writes.
func laggedTicks(t *testing.T, clock *time.Time, lc *laggingCache, store client.Client, dur time.Duration) func(...*Announcer) {
	return func(ans ...*Announcer) {
		t.Helper()
		*clock = clock.Add(dur/8 + time.Millisecond)
		lc.freeze(t, store)
		for _, an := range ans {
			if err := an.once(context.Background()); err != nil {
				t.Fatal(err)
			}
		}
	}
}

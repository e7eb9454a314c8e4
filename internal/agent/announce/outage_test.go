package announce

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/netip"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"

	lacev1 "github.com/lace-cni/lace/api/v1alpha1"
	"github.com/lace-cni/lace/pkg/scheme"
)

// graceAgent is node's announcer on c with a restart grace, its data
// plane a fake, its clock *clock.
func graceAgent(c client.Client, node string, dur, grace time.Duration, clock *time.Time) (*Announcer, *fakeDP) {
	dp := &fakeDP{}
	an := New(Options{NodeName: node, NetNS: "/fake", UnderlayInterface: "eth0", LeaseNamespace: "lace-system",
		LeaseDuration: dur, RestartGrace: grace}, slog.New(slog.NewTextHandler(io.Discard, nil)), c, c, dp, listServices{c})
	an.send = func(string, string, [][]byte) error { return nil }
	an.groups = noGroups{}
	an.seen, an.announced = map[string]leaseSeen{}, map[netip.Addr]bool{}
	an.now = func() time.Time { return *clock }
	return an, dp
}

// twoNodesEightVIPs are nodes n1 (cordoned or not) and n2, a default
// class and eight LoadBalancer Services with their VIPs.
func twoNodesEightVIPs(cordoned bool) []client.Object {
	objs := []client.Object{
		&corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n1"}, Spec: corev1.NodeSpec{Unschedulable: cordoned}},
		&corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n2"}},
		&lacev1.LoadBalancerClass{ObjectMeta: metav1.ObjectMeta{Name: "a"}, Spec: lacev1.LoadBalancerClassSpec{Default: true,
			Addresses: []lacev1.AddressRange{"192.0.2.0/28"}}},
	}
	for i := range 8 {
		svc := &corev1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: fmt.Sprintf("web%d", i)},
			Spec: corev1.ServiceSpec{Type: corev1.ServiceTypeLoadBalancer}}
		svc.Status.LoadBalancer.Ingress = []corev1.LoadBalancerIngress{{IP: fmt.Sprintf("192.0.2.%d", i+1)}}
		objs = append(objs, svc)
	}
	return objs
}

// TestAnnouncerFailsStaticThroughOutage: while the API server is down, an
// agent keeps exactly the VIPs it announced (its peers' silence is no
// evidence, and takes none over), and once it is back, a peer that has not
// renewed yet gets a full lease duration before its VIPs move; only a peer
// silent for that long loses them. Before, the first agent to see the API
// again took every peer's VIP for a tick, moving each on the fabric (and
// resetting what external clients held through it).
//
// The renewal that ends an outage may itself have waited for the API
// server up to its timeout (etcd back while the request hung): the peers'
// duration counts from when it returned, not from when the tick that
// made it began. Counted from the tick, a peer whose renewal the cache
// did not show yet was judged dead a moment after the return (seed
// 20261134's etcd-down: n2 took n3's VIP for half a second and reset the
// external stream).
func TestAnnouncerFailsStaticThroughOutage(t *testing.T) {
	const dur = 10 * time.Second
	for _, wait := range []time.Duration{0, dur * 19 / 20} {
		t.Run(fmt.Sprintf("return-waited-%s", wait), func(t *testing.T) { failsStaticThroughOutage(t, dur, wait) })
	}
}

func failsStaticThroughOutage(t *testing.T, dur, wait time.Duration) {
	ctx := context.Background()
	clock := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	objs := twoNodesEightVIPs(false)
	peer := &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Namespace: "lace-system", Name: LeaseName("n2"),
		Labels: map[string]string{lacev1.LabelAgentLease: "true"}},
		Spec: coordinationv1.LeaseSpec{HolderIdentity: ptr.To("n2"), RenewTime: &metav1.MicroTime{Time: clock}}}
	objs = append(objs, peer)
	var down atomic.Bool
	// With wait, every write that fails hangs that long first (the API
	// server held it, etcd did not answer), and so does the first one
	// after the outage, which succeeds; failNext fails one more write
	// once the API answers again.
	var hang time.Duration
	failNext := false
	errDown := errors.New("connection refused")
	c := fake.NewClientBuilder().WithScheme(scheme.Scheme).WithObjects(objs...).WithInterceptorFuncs(interceptor.Funcs{
		Create: func(ctx context.Context, c client.WithWatch, o client.Object, opts ...client.CreateOption) error {
			if down.Load() {
				return errDown
			}
			return c.Create(ctx, o, opts...)
		},
		Update: func(ctx context.Context, c client.WithWatch, o client.Object, opts ...client.UpdateOption) error {
			if down.Load() || failNext {
				clock, failNext = clock.Add(wait), false
				return errDown
			}
			clock, hang = clock.Add(hang), 0
			return c.Update(ctx, o, opts...)
		},
		Get: func(ctx context.Context, c client.WithWatch, k client.ObjectKey, o client.Object, opts ...client.GetOption) error {
			if down.Load() {
				return errDown
			}
			return c.Get(ctx, k, o, opts...)
		},
	}).Build()
	// The reader is the API server itself; the client's lists stand for
	// the agent's cache, which answers (stale) while the server is down.
	reader := fake.NewClientBuilder().WithScheme(scheme.Scheme).WithInterceptorFuncs(interceptor.Funcs{
		List: func(ctx context.Context, _ client.WithWatch, l client.ObjectList, opts ...client.ListOption) error {
			if down.Load() {
				return errDown
			}
			return c.List(ctx, l, opts...)
		},
		Get: func(ctx context.Context, _ client.WithWatch, k client.ObjectKey, o client.Object, opts ...client.GetOption) error {
			if down.Load() {
				return errDown
			}
			return c.Get(ctx, k, o, opts...)
		},
	}).Build()
	dp := &fakeDP{}
	an := New(Options{NodeName: "n1", NetNS: "/fake", UnderlayInterface: "eth0", LeaseNamespace: "lace-system", LeaseDuration: dur},
		slog.New(slog.NewTextHandler(io.Discard, nil)), c, reader, dp, listServices{c})
	an.send = func(string, string, [][]byte) error { return nil }
	an.groups = noGroups{}
	an.seen, an.announced = map[string]leaseSeen{}, map[netip.Addr]bool{}
	an.now = func() time.Time { return clock }
	tick := func(d time.Duration) []netip.Addr {
		t.Helper()
		clock = clock.Add(d)
		if err := an.once(ctx); err != nil {
			t.Fatal(err)
		}
		dp.mu.Lock()
		defer dp.mu.Unlock()
		out := slices.Clone(dp.vips)
		slices.SortFunc(out, netip.Addr.Compare)
		return out
	}

	mine := tick(0)
	if len(mine) == 0 || len(mine) == 8 {
		t.Fatalf("n1 announces %d of 8 VIPs with both nodes alive: the test needs each node to have some", len(mine))
	}
	// n1 renews once more before the outage, n2 does not need to yet:
	// its last renewal is older than n1's, as a peer's always is by a
	// little.
	if got := tick(dur / 4); !slices.Equal(got, mine) {
		t.Fatalf("n1 announces %v, had %v", got, mine)
	}
	down.Store(true)
	for i := range 12 {
		if got := tick(dur / 4); !slices.Equal(got, mine) {
			t.Fatalf("API down for %s: n1 announces %v, had %v", time.Duration(i+1)*dur/4, got, mine)
		}
	}
	down.Store(false)
	// The first renewal after the outage fails too, late: still blind
	// (stamped with the tick's start, the outage looked over a duration
	// ago, and the agent, its own Lease lapsed, withdrew every VIP).
	hang, failNext = wait, wait > 0
	if got := tick(dur / 4); !slices.Equal(got, mine) {
		t.Fatalf("API back, n1's renewal failed: n1 announces %v, had %v", got, mine)
	}
	// Back; n2 has not renewed yet (its Lease is durations old).
	for range 3 {
		if got := tick(dur / 4); !slices.Equal(got, mine) {
			t.Fatalf("API back, n2 not yet renewed: n1 announces %v, had %v", got, mine)
		}
	}
	// n2 stays silent a full duration after the API is back: it is dead.
	if got := tick(dur); len(got) != 8 {
		t.Fatalf("n2 silent for a lease duration after the outage: n1 announces %d VIPs, want all 8", len(got))
	}
}

// TestAnnouncerRestartGrace: an agent stopping for a restart asks for a
// grace on its Lease and keeps its data plane answering that long; its
// peer keeps counting the node alive through the grace (no VIP moves,
// where a plain lease duration would have moved them) and takes the VIPs
// only once it is over. On a cordoned node no grace is asked: the VIPs
// fail over after the lease duration.
func TestAnnouncerRestartGrace(t *testing.T) {
	for _, cordoned := range []bool{false, true} {
		t.Run(fmt.Sprintf("cordoned=%v", cordoned), func(t *testing.T) {
			ctx := context.Background()
			const dur, grace = 10 * time.Second, 60 * time.Second
			clock := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
			c := fake.NewClientBuilder().WithScheme(scheme.Scheme).WithObjects(twoNodesEightVIPs(cordoned)...).Build()
			agent := func(node string) (*Announcer, *fakeDP) { return graceAgent(c, node, dur, grace, &clock) }
			an1, dp1 := agent("n1")
			an2, dp2 := agent("n2")
			count := func(dp *fakeDP) int {
				dp.mu.Lock()
				defer dp.mu.Unlock()
				return len(dp.vips)
			}
			step := func(d time.Duration, ans ...*Announcer) {
				t.Helper()
				clock = clock.Add(d)
				for _, an := range ans {
					if err := an.once(ctx); err != nil {
						t.Fatal(err)
					}
				}
			}
			step(0, an1, an2)
			step(dur/4, an1, an2)
			held := count(dp1)
			if held == 0 || count(dp2) == 0 || held+count(dp2) != 8 {
				t.Fatalf("n1 holds %d VIPs, n2 %d: the test needs both to hold some", held, count(dp2))
			}
			an1.handOver()
			dp1.mu.Lock()
			ttl := dp1.ttl
			dp1.mu.Unlock()
			if !cordoned && ttl != grace {
				t.Errorf("n1's data plane answers for %s after the stop, want the grace %s", ttl, grace)
			}
			// n1 is gone; n2 ticks alone, past the lease duration.
			for range 8 {
				step(dur/4, an2)
			}
			if cordoned {
				if count(dp2) != 8 {
					t.Fatalf("cordoned n1 stopped %s ago: n2 holds %d VIPs, want all 8", 2*dur, count(dp2))
				}
				return
			}
			if count(dp2) != 8-held {
				t.Fatalf("n1 stopped for a restart %s ago (grace %s): n2 holds %d VIPs, want its own %d", 2*dur, grace, count(dp2), 8-held)
			}
			step(grace, an2)
			if count(dp2) != 8 {
				t.Fatalf("n1's grace is over: n2 holds %d VIPs, want all 8", count(dp2))
			}
		})
	}
}

// TestAnnouncerStopMidRenewalKeepsTheGrace: an agent stopped while its
// renewal is in flight (a rolling restart) still hands over with a
// restart grace: the renewal the stop cut short is not an API outage.
// Before, it was taken for one, the agent went blind, asked no grace, and
// the VIP moved (the chaos harness's agent-rolling-restart, seed
// 20261134, with the machine loaded).
func TestAnnouncerStopMidRenewalKeepsTheGrace(t *testing.T) {
	const dur, grace = 10 * time.Second, 60 * time.Second
	clock := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	ctx, stop := context.WithCancel(context.Background())
	var stopping atomic.Bool
	base := fake.NewClientBuilder().WithScheme(scheme.Scheme).WithObjects(twoNodesEightVIPs(false)...).Build()
	// The stop lands while n1's renewal is on the wire; as a real
	// client's, every request after it fails with the context's error.
	c := interceptor.NewClient(base, interceptor.Funcs{
		Update: func(ctx context.Context, cl client.WithWatch, obj client.Object, opts ...client.UpdateOption) error {
			if stopping.Load() {
				stop()
				return ctx.Err()
			}
			return cl.Update(ctx, obj, opts...)
		},
		List: func(ctx context.Context, cl client.WithWatch, list client.ObjectList, opts ...client.ListOption) error {
			if err := ctx.Err(); err != nil {
				return err
			}
			return cl.List(ctx, list, opts...)
		},
	})
	an1, dp1 := graceAgent(c, "n1", dur, grace, &clock)
	for range 2 {
		if err := an1.once(context.Background()); err != nil {
			t.Fatal(err)
		}
		clock = clock.Add(dur / 4)
	}
	dp1.mu.Lock()
	held := len(dp1.vips)
	dp1.mu.Unlock()
	if held == 0 {
		t.Fatal("n1 announces nothing: the test proves nothing")
	}
	stopping.Store(true)
	if err := an1.once(ctx); err != nil {
		t.Fatal(err)
	}
	stopping.Store(false)
	if an1.blind {
		t.Fatal("a renewal cut short by the stop made the agent blind")
	}
	an1.handOver()
	dp1.mu.Lock()
	ttl := dp1.ttl
	dp1.mu.Unlock()
	if ttl != grace {
		t.Errorf("after a stop mid-renewal n1's data plane answers for %s, want the restart grace %s", ttl, grace)
	}
}

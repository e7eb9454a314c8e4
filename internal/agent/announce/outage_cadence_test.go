package announce

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"net/netip"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"

	lacev1 "github.com/lace-cni/lace/api/v1alpha1"
	"github.com/lace-cni/lace/pkg/scheme"
)

type outageRig struct {
	an       *Announcer
	dp       *fakeDP
	clock    *time.Time
	down     *atomic.Bool
	conflict *atomic.Int32 // Updates to refuse with a Conflict
}

func newOutageRig(t *testing.T, dur time.Duration) *outageRig {
	clock := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	objs := twoNodesEightVIPs(false)
	objs = append(objs, &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Namespace: "lace-system", Name: LeaseName("n2"),
		Labels: map[string]string{lacev1.LabelAgentLease: "true"}},
		Spec: coordinationv1.LeaseSpec{HolderIdentity: ptr.To("n2"), RenewTime: &metav1.MicroTime{Time: clock}}})
	r := &outageRig{clock: &clock, down: &atomic.Bool{}, conflict: &atomic.Int32{}}
	errDown := errors.New("connection refused")
	c := fake.NewClientBuilder().WithScheme(scheme.Scheme).WithObjects(objs...).WithInterceptorFuncs(interceptor.Funcs{
		Create: func(ctx context.Context, c client.WithWatch, o client.Object, opts ...client.CreateOption) error {
			if r.down.Load() {
				return errDown
			}
			return c.Create(ctx, o, opts...)
		},
		Update: func(ctx context.Context, c client.WithWatch, o client.Object, opts ...client.UpdateOption) error {
			if r.down.Load() {
				return errDown
			}
			if r.conflict.Load() > 0 {
				r.conflict.Add(-1)
				return apierrors.NewConflict(schema.GroupResource{Group: "coordination.k8s.io", Resource: "leases"}, o.GetName(), errors.New("modified"))
			}
			return c.Update(ctx, o, opts...)
		},
		Get: func(ctx context.Context, c client.WithWatch, k client.ObjectKey, o client.Object, opts ...client.GetOption) error {
			if r.down.Load() {
				return errDown
			}
			return c.Get(ctx, k, o, opts...)
		},
	}).Build()
	reader := fake.NewClientBuilder().WithScheme(scheme.Scheme).WithInterceptorFuncs(interceptor.Funcs{
		List: func(ctx context.Context, _ client.WithWatch, l client.ObjectList, opts ...client.ListOption) error {
			if r.down.Load() {
				return errDown
			}
			return c.List(ctx, l, opts...)
		},
		// The uncached reader reads the same API server.
		Get: func(ctx context.Context, _ client.WithWatch, k client.ObjectKey, o client.Object, opts ...client.GetOption) error {
			if r.down.Load() {
				return errDown
			}
			return c.Get(ctx, k, o, opts...)
		},
	}).Build()
	r.dp = &fakeDP{}
	r.an = New(Options{NodeName: "n1", NetNS: "/fake", UnderlayInterface: "eth0", LeaseNamespace: "lace-system", LeaseDuration: dur},
		slog.New(slog.NewTextHandler(io.Discard, nil)), c, reader, r.dp, listServices{c})
	r.an.send = func(string, string, [][]byte) error { return nil }
	r.an.groups = noGroups{}
	r.an.seen, r.an.announced = map[string]leaseSeen{}, map[netip.Addr]bool{}
	r.an.now = func() time.Time { return *r.clock }
	return r
}

func (r *outageRig) tick(t *testing.T, d time.Duration) []netip.Addr {
	t.Helper()
	*r.clock = r.clock.Add(d)
	if err := r.an.once(context.Background()); err != nil {
		t.Fatal(err)
	}
	r.dp.mu.Lock()
	defer r.dp.mu.Unlock()
	out := slices.Clone(r.dp.vips)
	slices.SortFunc(out, netip.Addr.Compare)
	return out
}

// TestAnnouncerFailsStaticAtRunCadence: Run ticks every duration/8, and
// renew() used to report success without trying when the last try was
// under duration/4 old, failed or not. Every other tick of an outage thus
// looked like "API back":
// blind was cleared and the agent decided; once its own Lease was a
// duration old it counted itself dead and withdrew every VIP, which the
// blind ticks then kept (an empty set).
func TestAnnouncerFailsStaticAtRunCadence(t *testing.T) {
	const dur = 10 * time.Second
	r := newOutageRig(t, dur)
	mine := r.tick(t, 0)
	r.tick(t, dur/4)
	r.down.Store(true)
	for i := range 24 {
		if got := r.tick(t, r.an.tick()); !slices.Equal(got, mine) {
			t.Fatalf("API down for %s (ticking every %s as Run does): n1 announces %v, had %v",
				time.Duration(i+1)*r.an.tick(), r.an.tick(), got, mine)
		}
	}
}

// TestAnnouncerBlindExitFirstRenewalConflicts: when the API is back but
// the first renewal fails for another reason (a Conflict, a 429, the
// admission policy erroring), the agent stays static for a lease duration
// rather than deciding with the pre-outage view (peers a whole outage
// old, its own renewal too), which withdrew its VIPs.
func TestAnnouncerBlindExitFirstRenewalConflicts(t *testing.T) {
	const dur = 10 * time.Second
	r := newOutageRig(t, dur)
	mine := r.tick(t, 0)
	r.tick(t, dur/4)
	r.down.Store(true)
	for range 12 {
		r.tick(t, dur/4)
	}
	r.down.Store(false)
	// Two: the renewal re-reads the Lease after a Conflict and tries once
	// more.
	r.conflict.Store(2)
	if got := r.tick(t, dur/4); !slices.Equal(got, mine) {
		t.Fatalf("API back, first renewal refused with a Conflict: n1 announces %v, had %v", got, mine)
	}
}

// TestAnnouncerStaleGraceRegrantedOnFirstSight: the restart-grace
// annotation stays on the Lease of a node whose successor never comes (a
// node shut down without a cordon, a reboot); a later first sight (an
// agent restart, leaving blind after an outage) must not count that dead
// node alive for a full grace again.
func TestAnnouncerStaleGraceRegrantedOnFirstSight(t *testing.T) {
	ctx := context.Background()
	const dur, grace = 10 * time.Second, 60 * time.Second
	clock := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	c := fake.NewClientBuilder().WithScheme(scheme.Scheme).WithObjects(twoNodesEightVIPs(false)...).Build()
	agent := func(node string) (*Announcer, *fakeDP) { return graceAgent(c, node, dur, grace, &clock) }
	count := func(dp *fakeDP) int { dp.mu.Lock(); defer dp.mu.Unlock(); return len(dp.vips) }
	step := func(d time.Duration, ans ...*Announcer) {
		t.Helper()
		clock = clock.Add(d)
		for _, an := range ans {
			if err := an.once(ctx); err != nil {
				t.Fatal(err)
			}
		}
	}
	an1, _ := agent("n1")
	an2, dp2 := agent("n2")
	step(0, an1, an2)
	step(dur/4, an1, an2)
	an1.handOver() // n1 stops (node shutdown, not cordoned) and never returns
	for range 4 {
		step(grace/2, an2)
	}
	if count(dp2) != 8 {
		t.Fatalf("n1 stopped %s ago: n2 holds %d, want 8", 2*grace, count(dp2))
	}
	// n2's agent restarts (a rolling upgrade): it has no reason to think
	// n1, silent for two graces, is alive.
	an2b, dp2b := agent("n2")
	// First sight counts a silent peer alive for a lease duration (by
	// design); past that, n1 must be dead.
	step(dur/8, an2b)
	for range 12 {
		step(dur/8, an2b)
	}
	if count(dp2b) != 8 {
		t.Fatalf("n1 silent for %s; n2's new agent, %s after its start, holds %d VIPs, want 8 (n1 counted alive again for a grace)",
			2*grace, 13*dur/8, count(dp2b))
	}
}

// TestLeaving: a node taken out of service asks for no restart grace.
func TestLeaving(t *testing.T) {
	ready := corev1.NodeCondition{Type: corev1.NodeReady, Status: corev1.ConditionTrue}
	for _, c := range []struct {
		name string
		node corev1.Node
		want bool
	}{
		{"ready", corev1.Node{Status: corev1.NodeStatus{Conditions: []corev1.NodeCondition{ready}}}, false},
		{"cordoned", corev1.Node{Spec: corev1.NodeSpec{Unschedulable: true}}, true},
		{"agent kept off", corev1.Node{ObjectMeta: metav1.ObjectMeta{Labels: map[string]string{lacev1.LabelAgentStopped: "stopped"}},
			Status: corev1.NodeStatus{Conditions: []corev1.NodeCondition{ready}}}, true},
		{"shutting down", corev1.Node{Status: corev1.NodeStatus{Conditions: []corev1.NodeCondition{{Type: corev1.NodeReady, Status: corev1.ConditionFalse}}}}, true},
		{"out of service", corev1.Node{Spec: corev1.NodeSpec{Taints: []corev1.Taint{{Key: corev1.TaintNodeOutOfService, Effect: corev1.TaintEffectNoExecute}}}}, true},
		{"unreachable", corev1.Node{Spec: corev1.NodeSpec{Taints: []corev1.Taint{{Key: corev1.TaintNodeUnreachable, Effect: corev1.TaintEffectNoSchedule}}}}, true},
	} {
		if got := leaving(&c.node); got != c.want {
			t.Errorf("%s: leaving %v, want %v", c.name, got, c.want)
		}
	}
}

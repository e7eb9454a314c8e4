package nodesync

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net/netip"
	"slices"
	"strconv"
	"testing"

	"github.com/prometheus/client_golang/prometheus/testutil"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/record"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	lacev1 "github.com/lace-cni/lace/api/v1alpha1"
	"github.com/lace-cni/lace/internal/agent/agenttest"
	"github.com/lace-cni/lace/internal/datapath"
	"github.com/lace-cni/lace/internal/model"
	"github.com/lace-cni/lace/pkg/scheme"
)

// storeClient serves the kinds a cluster has many of from slices it
// holds, the same objects each time, as the agent lists them from the
// informers' stores: the scale tests measure the agent, not the fake
// client's deep copies. The agent must not modify them.
type storeClient struct {
	client.Client
	svcs   []corev1.Service
	slices []discoveryv1.EndpointSlice
	neps   []lacev1.NetworkEndpoint
	pods   []corev1.Pod
}

func (c *storeClient) List(ctx context.Context, l client.ObjectList, opts ...client.ListOption) error {
	switch l := l.(type) {
	case *corev1.ServiceList:
		l.Items = c.svcs
	case *discoveryv1.EndpointSliceList:
		l.Items = c.slices
	case *lacev1.NetworkEndpointList:
		l.Items = c.neps
	case *corev1.PodList:
		l.Items = c.pods
	default:
		return c.Client.List(ctx, l, opts...)
	}
	return nil
}

// scaleSyncer is node n1's sync in a cluster of n Services of eps
// endpoints each, every endpoint a pod on another node with its
// NetworkEndpoint, reconciled once.
func scaleSyncer(tb testing.TB, n, eps int) *storeClient {
	tb.Helper()
	w := agenttest.DefaultNetwork("n1", 24)
	sc := &storeClient{Client: fake.NewClientBuilder().WithScheme(scheme.Scheme).WithObjects(w.Objects...).Build()}
	// The API server gives ClusterIPs at random: the services' order by
	// name is not their VIPs'.
	vips := rand.New(rand.NewPCG(7, 7)).Perm(n)
	for i := range n {
		name := fmt.Sprintf("s%05d", i)
		vip := fmt.Sprintf("10.96.%d.%d", vips[i]>>8, vips[i]&255)
		sc.svcs = append(sc.svcs, corev1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: name, ResourceVersion: "1"},
			Spec: corev1.ServiceSpec{Type: corev1.ServiceTypeClusterIP, ClusterIP: vip, ClusterIPs: []string{vip},
				Ports: []corev1.ServicePort{{Name: "http", Port: 80, Protocol: corev1.ProtocolTCP}}}})
		sl := discoveryv1.EndpointSlice{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: name, ResourceVersion: "1",
			Labels: map[string]string{discoveryv1.LabelServiceName: name}}, AddressType: discoveryv1.AddressTypeIPv4,
			Ports: []discoveryv1.EndpointPort{{Name: ptr.To("http"), Port: ptr.To[int32](8080), Protocol: ptr.To(corev1.ProtocolTCP)}}}
		for j := range eps {
			k := i*eps + j
			pod, node := fmt.Sprintf("p%07d", k), fmt.Sprintf("n%d", 2+k%100)
			addr := fmt.Sprintf("10.%d.%d.%d", 100+k>>16, k>>8&255, k&255)
			sl.Endpoints = append(sl.Endpoints, discoveryv1.Endpoint{Addresses: []string{addr}, NodeName: ptr.To(node),
				Conditions: discoveryv1.EndpointConditions{Ready: ptr.To(true)},
				TargetRef:  &corev1.ObjectReference{Kind: "Pod", Namespace: "default", Name: pod}})
			sc.neps = append(sc.neps, lacev1.NetworkEndpoint{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: pod, ResourceVersion: "1"},
				Spec: lacev1.NetworkEndpointSpec{Network: "default", Node: node, Addresses: []lacev1.IPAddress{lacev1.IPAddress(addr)}}})
		}
		sc.slices = append(sc.slices, sl)
	}
	return sc
}

func newScaleSyncer(tb testing.TB, sc *storeClient) *Syncer {
	tb.Helper()
	node := &fakeNode{routes: map[netip.Prefix]netip.Addr{}, addrs: []netip.Addr{netip.MustParseAddr("fd00:30::11")}}
	s := New(Options{NodeName: "n1", NetNS: "/fake", UnderlayInterface: "eth0"}, slog.New(slog.NewTextHandler(io.Discard, nil)),
		sc, record.NewFakeRecorder(100), nil, nil, &scaleDP{fakeDP: newFakeDP(), routes: &appliedSlice[datapath.Route]{}}, node, Capacity{Services: 1 << 20, Backends: 1 << 22, SourceRanges: 1 << 12})
	s.Wire(&fakePods{}, nil, nil)
	// NetworkEndpoints, Services and EndpointSlices come as the
	// informers' events do.
	s.nePending.reg = syncedReg{}
	for i := range sc.neps {
		s.nePending.set(types.NamespacedName{Namespace: sc.neps[i].Namespace, Name: sc.neps[i].Name}, &sc.neps[i])
	}
	s.mirror.regs = append(s.mirror.regs, syncedReg{})
	for i := range sc.svcs {
		s.mirror.setService(model.ServiceKey{Namespace: sc.svcs[i].Namespace, Name: sc.svcs[i].Name}, &sc.svcs[i])
	}
	for i := range sc.slices {
		s.mirror.setSlice(types.NamespacedName{Namespace: sc.slices[i].Namespace, Name: sc.slices[i].Name}, &sc.slices[i], false)
	}
	go func() { _ = s.Run(tb.Context()) }()
	if _, err := s.Reconcile(tb.Context(), reconcile.Request{}); err != nil {
		tb.Fatal(err)
	}
	return s
}

// scaleDP is the fake data plane whose views are synced as tableDP syncs
// them: the same slice again is left alone.
type scaleDP struct {
	*fakeDP
	routes *appliedSlice[datapath.Route]
}

func (d *scaleDP) SyncRoutes(want []datapath.Route) error {
	if d.routes.same(want) {
		return nil
	}
	err := d.fakeDP.SyncRoutes(want)
	d.routes.set(want, err == nil)
	return err
}

// ApplyServices does nothing of the fake's work: a benchmark measures the
// agent's part alone.
func (d *scaleDP) ApplyServices(want []datapath.Service, ch model.ServiceChanges) (datapath.Gone, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	// Not kept: the cache changes its list in place, and nothing here
	// reads it.
	d.servicesApplied = ch
	return datapath.Gone{}, nil
}

type syncedReg struct{}

func (syncedReg) HasSynced() bool { return true }

// BenchmarkReconcileOneEndpointChange: one endpoint of one of 10,000
// Services (10 endpoints each) changes, and the node reconciles: the
// agent's part of the services bench's endpoint change latency.
func BenchmarkReconcileOneEndpointChange(b *testing.B) {
	const n, eps = 10000, 10
	sc := scaleSyncer(b, n, eps)
	s := newScaleSyncer(b, sc)
	b.ReportAllocs()
	b.ResetTimer()
	for i := range b.N {
		// The informer's new object, as its event gives it.
		sl := sc.slices[i%n].DeepCopy()
		sl.ResourceVersion = strconv.Itoa(i + 2)
		sl.Endpoints[0].Conditions.Ready = ptr.To(i%2 == 1)
		s.mirror.mu.Lock()
		s.mirror.setSlice(types.NamespacedName{Namespace: sl.Namespace, Name: sl.Name}, sl, true)
		s.mirror.mu.Unlock()
		if _, err := s.Reconcile(b.Context(), reconcile.Request{}); err != nil {
			b.Fatal(err)
		}
	}
}

// TestPodsElsewhereComputeNoService: a thousand pods created on other
// nodes, none of them a Service's endpoint, compute no service again; a
// NetworkEndpoint that holds one Service's endpoint address computes that
// Service alone, and its answer (the endpoint is another network's) is
// served.
func TestPodsElsewhereComputeNoService(t *testing.T) {
	sc := scaleSyncer(t, 200, 3)
	var c serviceCache
	shared := model.ServiceInput{Node: "n1", Networks: []lacev1.Network{{ObjectMeta: metav1.ObjectMeta{Name: "default"},
		Status: lacev1.NetworkStatus{ID: 1}}, {ObjectMeta: metav1.ObjectMeta{Name: "red"}, Status: lacev1.NetworkStatus{ID: 2}}},
		BindingPolicies: []lacev1.NetworkBindingPolicy{{ObjectMeta: metav1.ObjectMeta{Name: "default"},
			Spec: lacev1.NetworkBindingPolicySpec{Network: "default", Priority: model.CatchAllPriority}}}}
	svcs, sls := ptrs(sc.svcs), ptrs(sc.slices)
	neps := ptrs(sc.neps)
	update := func() model.ServiceState {
		c.indexPods(c.podChanges(neps))
		st, _, _ := c.updateLists(shared, false, svcs, sls)
		return st
	}
	c.indexPods(c.podChanges(neps))
	c.updateLists(shared, true, svcs, sls)
	before := map[model.ServiceKey]*svcEntry{}
	for k, e := range c.entries {
		before[k] = e
	}
	for i := range 1000 {
		neps = append(neps, &lacev1.NetworkEndpoint{ObjectMeta: metav1.ObjectMeta{Namespace: "other", Name: fmt.Sprintf("new%d", i), ResourceVersion: "1"},
			Spec: lacev1.NetworkEndpointSpec{Network: "default", Node: fmt.Sprintf("n%d", 2+i%100),
				Addresses: []lacev1.IPAddress{lacev1.IPAddress(fmt.Sprintf("10.250.%d.%d", i>>8, i&255))}}})
	}
	m0 := testutil.ToFloat64(serviceComputations)
	st := update()
	if n := testutil.ToFloat64(serviceComputations) - m0; n != 0 {
		t.Fatalf("1000 pods no Service selects computed %v services again, want 0", n)
	}
	for k, e := range c.entries {
		if before[k] != e {
			t.Fatalf("service %v computed again", k)
		}
	}
	if len(st.Services) != 200 {
		t.Fatalf("%d services served, want 200", len(st.Services))
	}

	// The pod behind s00007's first endpoint is now red's: s00007 alone
	// is computed again, and leaves it out.
	victim := sc.neps[7*3]
	red := victim.DeepCopy()
	red.ResourceVersion, red.Spec.Network = "2", "red"
	neps[7*3] = red
	m0 = testutil.ToFloat64(serviceComputations)
	st = update()
	if n := testutil.ToFloat64(serviceComputations) - m0; n != 1 {
		t.Fatalf("a NetworkEndpoint of one Service's endpoint computed %v services, want 1", n)
	}
	k := model.ServiceKey{Namespace: "default", Name: "s00007"}
	if before[k] == c.entries[k] {
		t.Fatal("s00007 was not computed again")
	}
	if !slices.ContainsFunc(st.Excluded, func(x model.ExcludedEndpoint) bool {
		return x.Service == "s00007" && x.Addr == netip.MustParseAddr(string(victim.Spec.Addresses[0])) && x.Network == "red"
	}) {
		t.Fatalf("s00007's endpoint at %s is not excluded as red's: %+v", victim.Spec.Addresses[0], st.Excluded)
	}
	// And back: the NetworkEndpoint goes, the endpoint is served again.
	neps = slices.Delete(neps, 7*3, 7*3+1)
	m0 = testutil.ToFloat64(serviceComputations)
	st = update()
	if n := testutil.ToFloat64(serviceComputations) - m0; n != 1 || len(st.Excluded) != 0 {
		t.Fatalf("the NetworkEndpoint's deletion computed %v services (want 1); excluded %+v", n, st.Excluded)
	}
}

// TestPodsElsewhereKickNothing: once the node's services are computed, the
// addresses their results read are the ones whose NetworkEndpoints kick
// the node's sync: a thousand pods created on other nodes kick nothing
// (and are indexed by the next computation all the same), a change of an
// endpoint's NetworkEndpoint kicks, and so does one of this node's.
func TestPodsElsewhereKickNothing(t *testing.T) {
	sc := scaleSyncer(t, 200, 3)
	s := newScaleSyncer(t, sc)
	kicks := 0
	s.nePending.kick = func() { kicks++ }
	if got := len(s.nePending.watched.m); got != 600 {
		t.Fatalf("%d addresses watched after computing 200 services of 3 endpoints, want 600", got)
	}
	h := s.nePending.handler()
	for i := range 1000 {
		h.OnAdd(&lacev1.NetworkEndpoint{ObjectMeta: metav1.ObjectMeta{Namespace: "other", Name: fmt.Sprintf("new%d", i), ResourceVersion: "1"},
			Spec: lacev1.NetworkEndpointSpec{Network: "default", Node: fmt.Sprintf("n%d", 2+i%100),
				Addresses: []lacev1.IPAddress{lacev1.IPAddress(fmt.Sprintf("10.250.%d.%d", i>>8, i&255))}}}, false)
	}
	if kicks != 0 {
		t.Fatalf("1000 pods on other nodes, none an endpoint, kicked %d syncs, want 0", kicks)
	}
	victim := sc.neps[7*3].DeepCopy()
	moved := victim.DeepCopy()
	moved.ResourceVersion, moved.Spec.Network = "2", "red"
	h.OnUpdate(victim, moved)
	if kicks != 1 {
		t.Fatalf("an endpoint's NetworkEndpoint changing network kicked %d syncs, want 1", kicks)
	}
	h.OnAdd(&lacev1.NetworkEndpoint{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "here", ResourceVersion: "1"},
		Spec: lacev1.NetworkEndpointSpec{Network: "default", Node: "n1", Addresses: []lacev1.IPAddress{"10.251.0.1"}}}, false)
	if kicks != 2 {
		t.Fatalf("a NetworkEndpoint of this node kicked %d syncs in all, want 2", kicks)
	}
	// The next sync indexes them all, and the endpoint now red's is left
	// out of s00007.
	if _, err := s.Reconcile(t.Context(), reconcile.Request{}); err != nil {
		t.Fatal(err)
	}
	if s.compute.services.pods.Get(types.NamespacedName{Namespace: "other", Name: "new999"}) == nil {
		t.Error("a pod created elsewhere was not indexed by the next sync")
	}
	e := s.compute.services.entries[model.ServiceKey{Namespace: "default", Name: "s00007"}]
	if e == nil || !slices.ContainsFunc(e.res.Excluded, func(x model.ExcludedEndpoint) bool {
		return x.Addr == netip.MustParseAddr(string(victim.Spec.Addresses[0])) && x.Network == "red"
	}) {
		t.Fatalf("after the kicked sync, s00007 does not leave out its endpoint now red's: %+v", e)
	}
	// A Service gone: its endpoints' addresses are no longer watched, and
	// their NetworkEndpoints kick nothing.
	s.mirror.mu.Lock()
	s.mirror.setService(model.ServiceKey{Namespace: "default", Name: "s00009"}, nil)
	s.mirror.mu.Unlock()
	if _, err := s.Reconcile(t.Context(), reconcile.Request{}); err != nil {
		t.Fatal(err)
	}
	if got := len(s.nePending.watched.m); got != 597 {
		t.Fatalf("%d addresses watched after a service of 3 endpoints went, want 597", got)
	}
	kicks = 0
	gone := sc.neps[9*3].DeepCopy()
	h.OnDelete(gone)
	if kicks != 0 {
		t.Fatalf("the NetworkEndpoint of a deleted Service's endpoint kicked %d syncs, want 0", kicks)
	}
}

// TestSharedWritesComputeWhatTheyReach: a namespace's new labels compute
// its own services again (and bind them by them), not the others'; an
// UnderlayEndpoint's status report (a new resourceVersion, the same
// generation) is no change at all.
func TestSharedWritesComputeWhatTheyReach(t *testing.T) {
	ns := func(name string, labels map[string]string, rv string) corev1.Namespace {
		return corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: labels, ResourceVersion: rv}}
	}
	var cc computeCache
	cc.syncNamespaces([]corev1.Namespace{ns("a", nil, "1"), ns("b", nil, "1")})
	shared := model.ServiceInput{Node: "n1", Namespaces: cc.nsLabels,
		Networks: []lacev1.Network{{ObjectMeta: metav1.ObjectMeta{Name: "default"}, Status: lacev1.NetworkStatus{ID: 1}},
			{ObjectMeta: metav1.ObjectMeta{Name: "red"}, Status: lacev1.NetworkStatus{ID: 2}}},
		BindingPolicies: []lacev1.NetworkBindingPolicy{
			{ObjectMeta: metav1.ObjectMeta{Name: "default"}, Spec: lacev1.NetworkBindingPolicySpec{Network: "default", Priority: model.CatchAllPriority}},
			{ObjectMeta: metav1.ObjectMeta{Name: "red"}, Spec: lacev1.NetworkBindingPolicySpec{Network: "red", Priority: 10,
				NamespaceSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"team": "red"}}}}}}
	var svcs []*corev1.Service
	for i := range 6 {
		vip := fmt.Sprintf("10.96.0.%d", i+1)
		svcs = append(svcs, &corev1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: []string{"a", "b"}[i%2], Name: fmt.Sprintf("s%d", i),
			ResourceVersion: "1"}, Spec: corev1.ServiceSpec{ClusterIP: vip, ClusterIPs: []string{vip}, Ports: []corev1.ServicePort{{Port: 80}}}})
	}
	var c serviceCache
	c.updateLists(shared, true, svcs, nil)
	stale := cc.syncNamespaces([]corev1.Namespace{ns("a", map[string]string{"team": "red"}, "2"), ns("b", nil, "1")})
	if len(stale) != 1 || stale[0] != "a" {
		t.Fatalf("namespaces changed %v, want [a]", stale)
	}
	c.staleNamespaces(stale)
	m0 := testutil.ToFloat64(serviceComputations)
	st, _, _ := c.updateLists(shared, false, svcs, nil)
	if n := testutil.ToFloat64(serviceComputations) - m0; n != 3 {
		t.Fatalf("namespace a's labels computed %v services, want its 3", n)
	}
	for _, b := range st.Bound {
		if want := map[string]string{"a": "red", "b": "default"}[b.Namespace]; b.Network != want {
			t.Errorf("%s/%s bound to %s, want %s", b.Namespace, b.Name, b.Network, want)
		}
	}
	// Nothing new: nothing marked.
	if stale := cc.syncNamespaces([]corev1.Namespace{ns("a", map[string]string{"team": "red"}, "3"), ns("b", nil, "1")}); len(stale) != 0 {
		t.Errorf("an annotation-only write marked %v", stale)
	}

	var v versions
	uep := func(rv string, gen int64) []lacev1.UnderlayEndpoint {
		return []lacev1.UnderlayEndpoint{{ObjectMeta: metav1.ObjectMeta{Name: "n2", UID: "u", ResourceVersion: rv, Generation: gen}}}
	}
	for i, step := range []struct {
		rv   string
		gen  int64
		want bool
	}{{"1", 1, true}, {"2", 1, false}, {"3", 2, true}} {
		u := uep(step.rv, step.gen)
		if got := v.updateSpec(1, func(int) client.Object { return &u[0] }); got != step.want {
			t.Errorf("step %d (rv %s, generation %d): changed %v, want %v", i, step.rv, step.gen, got, step.want)
		}
	}
}

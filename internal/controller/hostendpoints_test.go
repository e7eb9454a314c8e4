package controller

import (
	"context"
	"net/netip"
	"sync/atomic"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/cache/informertest"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"
	"sigs.k8s.io/controller-runtime/pkg/event"

	lacev1 "github.com/lace-cni/lace/api/v1alpha1"
	"github.com/lace-cni/lace/pkg/scheme"
)

// TestHostEndpointsMemo: the gate is built once and kept while nothing it
// is built from changes; an event of any of its kinds (of EndpointSlices,
// the kubernetes Service's only) or a change the reconciler's own
// handlers mark builds it again, from what the cache holds then.
func TestHostEndpointsMemo(t *testing.T) {
	ctx := context.Background()
	node := func(name, addr string) *corev1.Node {
		return &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name},
			Status: corev1.NodeStatus{Addresses: []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: addr}}}}
	}
	var nodeLists atomic.Int32
	c := fake.NewClientBuilder().WithScheme(scheme.Scheme).WithObjects(node("n1", "192.0.2.1")).WithInterceptorFuncs(interceptor.Funcs{
		List: func(ctx context.Context, c client.WithWatch, l client.ObjectList, opts ...client.ListOption) error {
			if _, ok := l.(*corev1.NodeList); ok {
				nodeLists.Add(1)
			}
			return c.List(ctx, l, opts...)
		},
	}).Build()
	infs := &informertest.FakeInformers{Scheme: scheme.Scheme}
	m := &hostEndpointsMemo{}
	if err := m.watch(ctx, infs); err != nil {
		t.Fatal(err)
	}
	builds := func() int32 { return nodeLists.Load() / 2 } // hostEndpoints lists Nodes twice
	get := func(want string, n2 bool) {
		t.Helper()
		h, err := m.get(ctx, c, nil)
		if err != nil {
			t.Fatal(err)
		}
		if h.Nodes[netip.MustParseAddr("192.0.2.1")] != want {
			t.Errorf("192.0.2.1 maps to %q, want %q", h.Nodes[netip.MustParseAddr("192.0.2.1")], want)
		}
		if _, ok := h.Nodes[netip.MustParseAddr("192.0.2.2")]; ok != n2 {
			t.Errorf("192.0.2.2 in the gate: %t, want %t", ok, n2)
		}
	}
	get("n1", false)
	get("n1", false)
	if b := builds(); b != 1 {
		t.Fatalf("two asks with nothing changed built the gate %d times, want 1", b)
	}
	// A Node added: the event builds it again, with the new node.
	if err := c.Create(ctx, node("n2", "192.0.2.2")); err != nil {
		t.Fatal(err)
	}
	fi, err := infs.FakeInformerFor(ctx, &corev1.Node{})
	if err != nil {
		t.Fatal(err)
	}
	fi.Add(node("n2", "192.0.2.2"))
	get("n1", true)
	if b := builds(); b != 2 {
		t.Fatalf("after a Node event: %d builds, want 2", b)
	}
	// Another Service's slice changes nothing of the gate; the kubernetes
	// Service's does.
	si, err := infs.FakeInformerFor(ctx, &discoveryv1.EndpointSlice{})
	if err != nil {
		t.Fatal(err)
	}
	si.Add(&discoveryv1.EndpointSlice{ObjectMeta: metav1.ObjectMeta{Namespace: "t", Name: "web-x",
		Labels: map[string]string{discoveryv1.LabelServiceName: "web"}}})
	get("n1", true)
	if b := builds(); b != 2 {
		t.Fatalf("after another Service's slice: %d builds, want 2", b)
	}
	si.Add(&discoveryv1.EndpointSlice{ObjectMeta: metav1.ObjectMeta{Namespace: metav1.NamespaceDefault, Name: "kubernetes",
		Labels: map[string]string{discoveryv1.LabelServiceName: "kubernetes"}}})
	get("n1", true)
	if b := builds(); b != 3 {
		t.Fatalf("after the kubernetes Service's slice: %d builds, want 3", b)
	}
	// A change a reconciler's handler marks (before its own informer
	// event is handled) builds it again too.
	if err := c.Delete(ctx, node("n2", "")); err != nil {
		t.Fatal(err)
	}
	m.changed()
	get("n1", false)
	if b := builds(); b != 4 {
		t.Fatalf("after changed(): %d builds, want 4", b)
	}
}

// TestHostEndpointsMemoWatchesEveryInput: an event of each kind the gate
// is built from marks it out of date, as does the Service reconciler's
// map function for hostNetwork pods before it enqueues.
func TestHostEndpointsMemoWatchesEveryInput(t *testing.T) {
	ctx := context.Background()
	infs := &informertest.FakeInformers{Scheme: scheme.Scheme}
	m := &hostEndpointsMemo{}
	if err := m.watch(ctx, infs); err != nil {
		t.Fatal(err)
	}
	meta := metav1.ObjectMeta{Name: "x"}
	for _, o := range []client.Object{&corev1.Node{ObjectMeta: meta}, &lacev1.UnderlayEndpoint{ObjectMeta: meta},
		&lacev1.Network{ObjectMeta: meta}, &networkingv1.ServiceCIDR{ObjectMeta: meta},
		&lacev1.LoadBalancerClass{ObjectMeta: meta}, &corev1.Pod{ObjectMeta: meta}} {
		fi, err := infs.FakeInformerFor(ctx, o)
		if err != nil {
			t.Fatal(err)
		}
		g := m.gen.Load()
		fi.Add(o)
		if m.gen.Load() == g {
			t.Errorf("an event of %T left the gate as it was", o)
		}
	}
	r := &ServiceReconciler{Client: fake.NewClientBuilder().WithScheme(scheme.Scheme).Build(), gate: m}
	g := m.gen.Load()
	r.namespaceServices(ctx, &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "t", Name: "h"}})
	if m.gen.Load() == g {
		t.Error("namespaceServices enqueued without marking the gate out of date")
	}
}

// TestHostEndpointsGateChanges: a change of the gate (a second node
// listing n1's address contests it) sends one event, from which every
// Service is reconciled; an event that changes nothing of it sends none.
func TestHostEndpointsGateChanges(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	node := func(name string) *corev1.Node {
		return &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name},
			Status: corev1.NodeStatus{Addresses: []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: "192.0.2.1"}}}}
	}
	c := fake.NewClientBuilder().WithScheme(scheme.Scheme).WithObjects(node("n1")).Build()
	m := &hostEndpointsMemo{}
	out := make(chan event.GenericEvent, 1)
	done := make(chan error, 1)
	go func() { done <- m.watchChanges(ctx, c, nil, 5*time.Millisecond, out) }()
	// checkedPast waits until the watcher compared the gate at gen g or later.
	checkedPast := func(g uint64) {
		t.Helper()
		deadline := time.Now().Add(10 * time.Second)
		for m.checked.Load() < g {
			if time.Now().After(deadline) {
				t.Fatalf("the watcher did not check the gate at gen %d (at %d)", g, m.checked.Load())
			}
			time.Sleep(time.Millisecond)
		}
	}
	m.changed()
	checkedPast(m.gen.Load())
	// Marked out of date, nothing changed: no event.
	m.changed()
	checkedPast(m.gen.Load())
	select {
	case <-out:
		t.Fatal("an event that changed nothing of the gate reconciled every Service")
	default:
	}
	// n2 lists n1's address: the address is contested now.
	if err := c.Create(ctx, node("n2")); err != nil {
		t.Fatal(err)
	}
	m.changed()
	select {
	case <-out:
	case <-time.After(10 * time.Second):
		t.Fatal("the gate changed (192.0.2.1 contested) and no Service was reconciled")
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}

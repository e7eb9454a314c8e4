package announce

import (
	"context"
	"io"
	"log/slog"
	"net"
	"net/netip"
	"slices"
	"sync"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"

	lacev1 "github.com/lace-cni/lace/api/v1alpha1"
	"github.com/lace-cni/lace/pkg/scheme"
)

// fakeDP records what the data plane is told to answer for.
type fakeDP struct {
	mu   sync.Mutex
	vips []netip.Addr
	ttl  time.Duration
}

func (f *fakeDP) SetAnnounced(vips []netip.Addr, _ net.HardwareAddr, ttl time.Duration) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.vips, f.ttl = slices.Clone(vips), ttl
	return nil
}

// listServices lists the fake API's Services and EndpointSlices.
type listServices struct{ c client.Client }

func (l listServices) ListServices(ctx context.Context) ([]*corev1.Service, []*discoveryv1.EndpointSlice, error) {
	var svcs corev1.ServiceList
	var sls discoveryv1.EndpointSliceList
	if err := l.c.List(ctx, &svcs); err != nil {
		return nil, nil, err
	}
	if err := l.c.List(ctx, &sls); err != nil {
		return nil, nil, err
	}
	var out []*corev1.Service
	for i := range svcs.Items {
		out = append(out, &svcs.Items[i])
	}
	var outSl []*discoveryv1.EndpointSlice
	for i := range sls.Items {
		outSl = append(outSl, &sls.Items[i])
	}
	return out, outSl, nil
}

type noGroups struct{}

func (noGroups) Set([]netip.Addr) error { return nil }

// TestAnnouncerTakesAndWithdrawsVIPs: the only live agent renews its
// Lease, has the data plane answer for its class's VIP and announces it
// once when it takes it; a VIP whose Service is gone is withdrawn.
func TestAnnouncerTakesAndWithdrawsVIPs(t *testing.T) {
	ctx := context.Background()
	svc := &corev1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "web"},
		Spec: corev1.ServiceSpec{Type: corev1.ServiceTypeLoadBalancer}}
	svc.Status.LoadBalancer.Ingress = []corev1.LoadBalancerIngress{{IP: "192.0.2.1"}}
	c := fake.NewClientBuilder().WithScheme(scheme.Scheme).WithObjects(
		&corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n1"}},
		&lacev1.LoadBalancerClass{ObjectMeta: metav1.ObjectMeta{Name: "a"}, Spec: lacev1.LoadBalancerClassSpec{Default: true,
			Addresses: []lacev1.AddressRange{"192.0.2.0/28"}}},
		svc).Build()
	dp := &fakeDP{}
	an := New(Options{NodeName: "n1", NetNS: "/fake", UnderlayInterface: "eth0", LeaseNamespace: "lace-system", LeaseDuration: 2 * time.Second},
		slog.New(slog.NewTextHandler(io.Discard, nil)), c, c, dp, listServices{c})
	sent := make(chan []netip.Addr, 4)
	an.send = func(_, _ string, frames [][]byte) error {
		sent <- nil
		return nil
	}
	an.groups = noGroups{}
	an.seen, an.announced = map[string]leaseSeen{}, map[netip.Addr]bool{}

	if err := an.once(ctx); err != nil {
		t.Fatal(err)
	}
	vip := netip.MustParseAddr("192.0.2.1")
	if !slices.Equal(dp.vips, []netip.Addr{vip}) || dp.ttl <= 0 {
		t.Fatalf("data plane answers for %v (ttl %s), want [%s]", dp.vips, dp.ttl, vip)
	}
	var l coordinationv1.Lease
	if err := c.Get(ctx, client.ObjectKey{Namespace: "lace-system", Name: LeaseName("n1")}, &l); err != nil ||
		l.Spec.HolderIdentity == nil || *l.Spec.HolderIdentity != "n1" {
		t.Fatalf("own Lease: %v %+v", err, l.Spec)
	}
	select {
	case <-sent:
	case <-time.After(5 * time.Second):
		t.Fatal("the VIP taken was not announced")
	}
	// Taken already: no new announcement.
	if err := an.once(ctx); err != nil {
		t.Fatal(err)
	}
	if err := c.Delete(ctx, svc); err != nil {
		t.Fatal(err)
	}
	if err := an.once(ctx); err != nil {
		t.Fatal(err)
	}
	if len(dp.vips) != 0 || len(an.announced) != 0 {
		t.Errorf("after the Service left: data plane %v, announced %v", dp.vips, an.announced)
	}
	// The burst of the first take sends three rounds; nothing else came.
	for range 2 {
		select {
		case <-sent:
		case <-time.After(5 * time.Second):
			t.Fatal("the burst stopped short")
		}
	}
	select {
	case <-sent:
		t.Error("a VIP already taken was announced again")
	case <-time.After(100 * time.Millisecond):
	}
}

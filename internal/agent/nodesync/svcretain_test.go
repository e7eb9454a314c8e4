package nodesync

import (
	"fmt"
	"runtime"
	"testing"
	"weak"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/lace-cni/lace/internal/model"
)

// TestServiceCacheKeepsNoReplacedService: after an update that changes
// nothing the agent reads (the controller's binding annotation, dropped by
// the cache transform), the informer holds the new Service and nothing of
// the agent may still hold the old one: at 10,000 Services a second copy
// of each was about 12 MiB of the agent's heap.
func TestServiceCacheKeepsNoReplacedService(t *testing.T) {
	shared := defaultNetworkInput()
	c := serviceCache{mirror: &svcMirror{kick: func() {}}}
	h := c.mirror.serviceHandler()
	var next *corev1.Service
	old := func() weak.Pointer[corev1.Service] {
		svc := &corev1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: "a", Name: "web", ResourceVersion: "1", UID: "u1"},
			Spec: corev1.ServiceSpec{ClusterIP: "10.96.0.10", ClusterIPs: []string{"10.96.0.10"},
				Ports: []corev1.ServicePort{{Name: "http", Port: 80}}}}
		h.OnAdd(svc, false)
		if st, _, _ := c.update(shared, true); len(st.Services) != 1 {
			t.Fatalf("the Service was not computed: %+v", st)
		}
		next = svc.DeepCopy()
		next.ResourceVersion = "2"
		h.OnUpdate(svc, next)
		return weak.Make(svc)
	}()
	// A NetworkEndpoint change computes the service again, from the
	// mirror's (new) object.
	c.stale = map[model.ServiceKey]bool{{Namespace: "a", Name: "web"}: true}
	if st, _, _ := c.update(shared, false); len(st.Services) != 1 {
		t.Fatalf("the Service was lost: %+v", st)
	}
	runtime.GC()
	runtime.GC()
	if old.Value() != nil {
		t.Fatal("the replaced Service is still held beside the informer's new one")
	}
	runtime.KeepAlive(next)
	runtime.KeepAlive(&c)
}

// TestServiceCacheReleasesDeletedServices: once a burst of Services is
// deleted, nothing of the cache holds their entries (results, backends).
// The refs of the frontends' order and the update's scratch lists were
// truncated, not cleared, and kept every entry of the burst alive. A
// burst below and above reuseMax: scratch lists kept and dropped.
func TestServiceCacheReleasesDeletedServices(t *testing.T) {
	for _, n := range []int{500, 3000} {
		t.Run(fmt.Sprint(n), func(t *testing.T) { testReleasesDeleted(t, n) })
	}
}

func testReleasesDeleted(t *testing.T, n int) {
	shared := defaultNetworkInput()
	var c serviceCache
	entries := func() []weak.Pointer[svcEntry] {
		var svcs []*corev1.Service
		var sls []*discoveryv1.EndpointSlice
		for i := range n {
			name, vip := fmt.Sprintf("s%05d", i), fmt.Sprintf("10.96.%d.%d", i>>8, i&255)
			svcs = append(svcs, &corev1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: "a", Name: name, ResourceVersion: "1"},
				Spec: corev1.ServiceSpec{ClusterIP: vip, ClusterIPs: []string{vip}, Ports: []corev1.ServicePort{{Name: "http", Port: 80}}}})
			sls = append(sls, &discoveryv1.EndpointSlice{ObjectMeta: metav1.ObjectMeta{Namespace: "a", Name: name, ResourceVersion: "1",
				Labels: map[string]string{discoveryv1.LabelServiceName: name}}, AddressType: discoveryv1.AddressTypeIPv4,
				Ports:     []discoveryv1.EndpointPort{{Name: ptr.To("http"), Port: ptr.To[int32](8080)}},
				Endpoints: []discoveryv1.Endpoint{{Addresses: []string{fmt.Sprintf("10.1.%d.%d", i>>8, i&255)}}}})
		}
		if st, _, _ := c.updateLists(shared, true, svcs, sls); len(st.Services) != n {
			t.Fatalf("%d services programmed, want %d", len(st.Services), n)
		}
		// One endpoint change between the burst and its deletion.
		moved := sls[1].DeepCopy()
		moved.ResourceVersion, moved.Endpoints[0].Addresses[0] = "2", "10.2.0.1"
		sls[1] = moved
		if st, _, _ := c.updateLists(shared, false, svcs, sls); len(st.Services) != n {
			t.Fatalf("%d services programmed after a change, want %d", len(st.Services), n)
		}
		// One Service kept, so that the merge after the deletion is not
		// empty.
		var out []weak.Pointer[svcEntry]
		for _, e := range c.entries {
			if e.key.Name != "s00000" {
				out = append(out, weak.Make(e))
			}
		}
		if st, _, _ := c.updateLists(shared, false, svcs[:1], sls[:1]); len(st.Services) != 1 {
			t.Fatalf("%d services programmed after the deletion, want 1", len(st.Services))
		}
		return out
	}()
	runtime.GC()
	runtime.GC()
	held := 0
	for _, w := range entries {
		if w.Value() != nil {
			held++
		}
	}
	if held > 0 {
		t.Fatalf("%d of %d deleted services' entries are still held", held, len(entries))
	}
	runtime.KeepAlive(&c)
}

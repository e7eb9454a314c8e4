package nodesync

import (
	"runtime"
	"testing"
	"weak"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	lacev1 "github.com/lace-cni/lace/api/v1alpha1"
	"github.com/lace-cni/lace/internal/model"
)

// TestServiceCacheKeepsNoReplacedService: after an update that changes
// nothing the agent reads (the controller's binding annotation, dropped by
// the cache transform), the informer holds the new Service and nothing of
// the agent may still hold the old one: at 10,000 Services a second copy
// of each was about 12 MiB of the agent's heap.
func TestServiceCacheKeepsNoReplacedService(t *testing.T) {
	shared := model.ServiceInput{Node: "n1", Networks: []lacev1.Network{{ObjectMeta: metav1.ObjectMeta{Name: "default"},
		Status: lacev1.NetworkStatus{ID: 1}}}, BindingPolicies: []lacev1.NetworkBindingPolicy{{ObjectMeta: metav1.ObjectMeta{Name: "default"},
		Spec: lacev1.NetworkBindingPolicySpec{Network: "default", Priority: model.CatchAllPriority}}}}
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

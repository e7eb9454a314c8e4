package controller_test

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	lacev1 "github.com/lace-cni/lace/api/v1alpha1"
	"github.com/lace-cni/lace/internal/model"
	"github.com/lace-cni/lace/lab/controlplane/cptest"
)

func lbService(name string, class *string, policy corev1.IPFamilyPolicy) *corev1.Service {
	return &corev1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: name},
		Spec: corev1.ServiceSpec{Type: corev1.ServiceTypeLoadBalancer, LoadBalancerClass: class, IPFamilyPolicy: &policy,
			Ports: []corev1.ServicePort{{Port: 80}}}}
}

// waitIngress waits until Service name holds exactly want (in order) in
// status.loadBalancer.ingress, and returns it.
func waitIngress(t *testing.T, c client.Client, name string, want ...string) *corev1.Service {
	t.Helper()
	var s corev1.Service
	eventually(t, 30*time.Second, fmt.Sprintf("%s holding %v", name, want), func() error {
		if err := c.Get(context.Background(), types.NamespacedName{Namespace: "default", Name: name}, &s); err != nil {
			return err
		}
		var got []string
		for _, ing := range s.Status.LoadBalancer.Ingress {
			got = append(got, ing.IP)
		}
		if !slices.Equal(got, want) {
			return fmt.Errorf("holds %v", got)
		}
		return nil
	})
	return &s
}

// waitIngressCount waits until Service name holds n addresses, and
// returns them.
func waitIngressCount(t *testing.T, c client.Client, name string, n int) []string {
	t.Helper()
	var got []string
	eventually(t, 30*time.Second, fmt.Sprintf("%s holding %d addresses", name, n), func() error {
		var s corev1.Service
		if err := c.Get(context.Background(), types.NamespacedName{Namespace: "default", Name: name}, &s); err != nil {
			return err
		}
		got = got[:0]
		for _, ing := range s.Status.LoadBalancer.Ingress {
			got = append(got, ing.IP)
		}
		if len(got) != n {
			return fmt.Errorf("holds %v", got)
		}
		return nil
	})
	return got
}

// TestLoadBalancerVIPs: VIPs from LoadBalancerClass pools into
// status.loadBalancer.ingress; an exhausted pool is
// a Warning Event and an annotation on the Service; a deleted Service's or
// a Service's that stops being a LoadBalancer address goes back to the
// pool; a Service of another class is left alone; the class reports how
// many it handed out; a restarted controller moves nothing.
func TestLoadBalancerVIPs(t *testing.T) {
	env := cptest.Start(t)
	stop := startController(t, env, nil)
	c := env.Client
	ctx := context.Background()
	create(t, c, &lacev1.LoadBalancerClass{ObjectMeta: metav1.ObjectMeta{Name: "pool"},
		Spec: lacev1.LoadBalancerClassSpec{Default: true, Addresses: []lacev1.AddressRange{"192.0.2.0/30"}}})
	create(t, c, &lacev1.LoadBalancerClass{ObjectMeta: metav1.ObjectMeta{Name: "dual"},
		Spec: lacev1.LoadBalancerClassSpec{Addresses: []lacev1.AddressRange{"198.51.100.10-198.51.100.11", "2001:db8:1::/127"}}})

	// Where in the pool a new Service lands follows its UID (not the
	// lowest free address): lb-a and lb-b share the two addresses.
	got := map[string]string{}
	for _, n := range []string{"lb-a", "lb-b"} {
		create(t, c, lbService(n, nil, corev1.IPFamilyPolicySingleStack))
		got[n] = waitIngressCount(t, c, n, 1)[0]
	}
	if !slices.Contains([]string{"192.0.2.1", "192.0.2.2"}, got["lb-a"]) || !slices.Contains([]string{"192.0.2.1", "192.0.2.2"}, got["lb-b"]) ||
		got["lb-a"] == got["lb-b"] {
		t.Fatalf("lb-a and lb-b hold %v, want the pool's two addresses", got)
	}
	create(t, c, lbService("lb-c", nil, corev1.IPFamilyPolicySingleStack))
	other := lbService("lb-other", ptr.To("example.com/lb"), corev1.IPFamilyPolicySingleStack)
	create(t, c, other)
	d := lbService("lb-d", ptr.To("lace-cni.io/dual"), corev1.IPFamilyPolicyPreferDualStack)
	create(t, c, d)

	// lb-d: one VIP per family the cluster gave it, in its order.
	want := waitIngressCount(t, c, "lb-d", len(d.Spec.IPFamilies))
	for i, f := range d.Spec.IPFamilies {
		ok := map[corev1.IPFamily][]string{corev1.IPv4Protocol: {"198.51.100.10", "198.51.100.11"}, corev1.IPv6Protocol: {"2001:db8:1::", "2001:db8:1::1"}}[f]
		if !slices.Contains(ok, want[i]) {
			t.Fatalf("lb-d holds %v, want one of %v for %s", want, ok, f)
		}
	}

	// lb-c: the pool is exhausted.
	eventually(t, 30*time.Second, "lb-c reported PoolExhausted", func() error {
		var s corev1.Service
		if err := c.Get(ctx, types.NamespacedName{Namespace: "default", Name: "lb-c"}, &s); err != nil {
			return err
		}
		if p := s.Annotations[lacev1.AnnotationLoadBalancerProblem]; !strings.HasPrefix(p, model.LBReasonPoolExhausted) {
			return fmt.Errorf("problem annotation %q", p)
		}
		var evs corev1.EventList
		if err := c.List(ctx, &evs, client.InNamespace("default")); err != nil {
			return err
		}
		for _, e := range evs.Items {
			if e.InvolvedObject.Name == "lb-c" && e.Reason == model.LBReasonPoolExhausted && e.Type == corev1.EventTypeWarning {
				return nil
			}
		}
		return fmt.Errorf("no PoolExhausted event on lb-c")
	})
	eventually(t, 30*time.Second, "class pool reports 2 allocated and Ready", func() error {
		var lc lacev1.LoadBalancerClass
		if err := c.Get(ctx, types.NamespacedName{Name: "pool"}, &lc); err != nil {
			return err
		}
		if lc.Status.Allocated != 2 || !meta.IsStatusConditionTrue(lc.Status.Conditions, "Ready") {
			return fmt.Errorf("status %+v", lc.Status)
		}
		return nil
	})

	// Released on deletion: lb-c gets lb-a's address.
	if err := c.Delete(ctx, &corev1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "lb-a"}}); err != nil {
		t.Fatal(err)
	}
	s := waitIngress(t, c, "lb-c", got["lb-a"])
	eventually(t, 30*time.Second, "lb-c's problem cleared", func() error {
		if err := c.Get(ctx, types.NamespacedName{Namespace: "default", Name: "lb-c"}, s); err != nil {
			return err
		}
		if p := s.Annotations[lacev1.AnnotationLoadBalancerProblem]; p != "" {
			return fmt.Errorf("problem annotation %q", p)
		}
		return nil
	})

	// Released when it stops being a LoadBalancer.
	var b corev1.Service
	if err := c.Get(ctx, types.NamespacedName{Namespace: "default", Name: "lb-b"}, &b); err != nil {
		t.Fatal(err)
	}
	b.Spec.Type = corev1.ServiceTypeClusterIP
	b.Spec.AllocateLoadBalancerNodePorts = nil
	for i := range b.Spec.Ports {
		b.Spec.Ports[i].NodePort = 0
	}
	b.Spec.ExternalTrafficPolicy = ""
	if err := c.Update(ctx, &b); err != nil {
		t.Fatal(err)
	}
	waitIngress(t, c, "lb-b")

	// Another class's Service is never touched.
	if err := c.Get(ctx, types.NamespacedName{Namespace: "default", Name: "lb-other"}, other); err != nil {
		t.Fatal(err)
	}
	if len(other.Status.LoadBalancer.Ingress) != 0 || other.Annotations[lacev1.AnnotationLoadBalancerProblem] != "" {
		t.Errorf("a Service of another class was touched: %+v %v", other.Status.LoadBalancer, other.Annotations)
	}

	// A restarted controller reads the allocation back and moves nothing,
	// even with an address free below lb-d's and lb-c's.
	stop()
	startController(t, env, nil)
	create(t, c, lbService("lb-e", nil, corev1.IPFamilyPolicySingleStack))
	waitIngress(t, c, "lb-e", got["lb-b"])
	waitIngress(t, c, "lb-c", got["lb-a"])
	waitIngress(t, c, "lb-d", want...)
}

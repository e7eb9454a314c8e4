package controller_test

import (
	"context"
	"fmt"
	"net/netip"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	lacev1 "github.com/lace-cni/lace/api/v1alpha1"
	"github.com/lace-cni/lace/internal/controller"
	"github.com/lace-cni/lace/internal/model"
	"github.com/lace-cni/lace/lab/controlplane/cptest"
)

// TestExternalIPReports: an external IP outside the operator's allow-list
// is reported on its Service (annotation and one Warning Event); the
// report goes when the Service names only allowed addresses; an
// unrelated change emits no second Event.
func TestExternalIPReports(t *testing.T) {
	env := cptest.Start(t)
	startController(t, env, func(o *controller.Options) {
		o.AllowedExternalIPs = []netip.Prefix{netip.MustParsePrefix("192.0.2.0/24")}
	})
	c := env.Client
	ctx := context.Background()
	svc := &corev1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "hostile"},
		Spec: corev1.ServiceSpec{Ports: []corev1.ServicePort{{Port: 6443}}, ExternalIPs: []string{"8.8.8.8", "192.0.2.5"}}}
	create(t, c, svc)
	key := types.NamespacedName{Namespace: "default", Name: "hostile"}
	warnings := func() (int, error) {
		var evs corev1.EventList
		if err := c.List(ctx, &evs, client.InNamespace("default")); err != nil {
			return 0, err
		}
		n := 0
		for _, e := range evs.Items {
			if e.InvolvedObject.Name == "hostile" && e.Reason == model.ExternalIPReasonNotAllowed && e.Type == corev1.EventTypeWarning {
				n += int(max(e.Count, 1))
			}
		}
		return n, nil
	}
	eventually(t, 30*time.Second, "8.8.8.8 reported", func() error {
		var s corev1.Service
		if err := c.Get(ctx, key, &s); err != nil {
			return err
		}
		p := s.Annotations[lacev1.AnnotationExternalIPProblem]
		if !strings.HasPrefix(p, model.ExternalIPReasonNotAllowed) || !strings.Contains(p, "8.8.8.8") || strings.Contains(p, "192.0.2.5") {
			return fmt.Errorf("annotation %q", p)
		}
		if n, err := warnings(); err != nil || n != 1 {
			return fmt.Errorf("%d warnings, %v", n, err)
		}
		return nil
	})
	// An unrelated change: no second Event.
	var s corev1.Service
	if err := c.Get(ctx, key, &s); err != nil {
		t.Fatal(err)
	}
	s.Labels = map[string]string{"touched": "yes"}
	if err := c.Update(ctx, &s); err != nil {
		t.Fatal(err)
	}
	// Only allowed addresses: the report goes.
	if err := c.Get(ctx, key, &s); err != nil {
		t.Fatal(err)
	}
	s.Spec.ExternalIPs = []string{"192.0.2.5"}
	if err := c.Update(ctx, &s); err != nil {
		t.Fatal(err)
	}
	eventually(t, 30*time.Second, "report cleared", func() error {
		if err := c.Get(ctx, key, &s); err != nil {
			return err
		}
		if p := s.Annotations[lacev1.AnnotationExternalIPProblem]; p != "" {
			return fmt.Errorf("annotation %q", p)
		}
		return nil
	})
	// The passes after the unrelated change (before the one that cleared
	// the report) emitted nothing.
	if n, err := warnings(); err != nil || n != 1 {
		t.Errorf("%d %s warnings, %v; want exactly 1 (one per change of the verdict)", n, model.ExternalIPReasonNotAllowed, err)
	}
}

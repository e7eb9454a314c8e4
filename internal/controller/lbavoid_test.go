package controller_test

import (
	"context"
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	lacev1 "github.com/lace-cni/lace/api/v1alpha1"
	"github.com/lace-cni/lace/internal/controller"
	"github.com/lace-cni/lace/internal/model"
	"github.com/lace-cni/lace/lab/controlplane/cptest"
)

// TestLoadBalancerPoolAvoidsReserved: a pool overlapping a Node's
// addresses (its InternalIP and a cloud ExternalIP) and another Service's
// admitted external IP never hands those out; the class says so in its
// AddressesExcluded condition and a Warning Event.
func TestLoadBalancerPoolAvoidsReserved(t *testing.T) {
	env := cptest.Start(t)
	startController(t, env, func(o *controller.Options) {
		o.AllowedExternalIPs = []netip.Prefix{netip.MustParsePrefix("192.0.2.0/24")}
	})
	c := env.Client
	ctx := context.Background()
	node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n-avoid"}}
	create(t, c, node)
	node.Status.Addresses = []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: "192.0.2.1"}, {Type: corev1.NodeExternalIP, Address: "192.0.2.2"}}
	if err := c.Status().Update(ctx, node); err != nil {
		t.Fatal(err)
	}
	create(t, c, &corev1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "xip"},
		Spec: corev1.ServiceSpec{Ports: []corev1.ServicePort{{Port: 80}}, ExternalIPs: []string{"192.0.2.3"}}})
	create(t, c, &lacev1.LoadBalancerClass{ObjectMeta: metav1.ObjectMeta{Name: "avoid"},
		Spec: lacev1.LoadBalancerClassSpec{Default: true, Addresses: []lacev1.AddressRange{"192.0.2.0/29"}}})
	eventually(t, 30*time.Second, "class avoid reports what it excludes", func() error {
		var lc lacev1.LoadBalancerClass
		if err := c.Get(ctx, types.NamespacedName{Name: "avoid"}, &lc); err != nil {
			return err
		}
		cond := meta.FindStatusCondition(lc.Status.Conditions, model.LBConditionAddressesExcluded)
		if cond == nil || cond.Status != metav1.ConditionTrue || !strings.Contains(cond.Message, "192.0.2.1/32") ||
			!strings.Contains(cond.Message, "192.0.2.2/32") || !strings.Contains(cond.Message, "192.0.2.3 (external IP of default/xip)") {
			return fmt.Errorf("condition %+v", cond)
		}
		var evs corev1.EventList
		if err := c.List(ctx, &evs, client.InNamespace("default")); err != nil {
			return err
		}
		for _, e := range evs.Items {
			if e.InvolvedObject.Name == "avoid" && e.Reason == model.LBReasonReservedOverlap && e.Type == corev1.EventTypeWarning {
				return nil
			}
		}
		return fmt.Errorf("no %s Event on the class", model.LBReasonReservedOverlap)
	})
	var held []string
	for _, n := range []string{"lb-x", "lb-y", "lb-z"} {
		create(t, c, lbService(n, nil, corev1.IPFamilyPolicySingleStack))
		held = append(held, waitIngressCount(t, c, n, 1)[0])
	}
	slices.Sort(held)
	if !slices.Equal(held, []string{"192.0.2.4", "192.0.2.5", "192.0.2.6"}) {
		t.Errorf("the pool handed out %v, want .4-.6 (never the node's addresses nor the external IP)", held)
	}
}

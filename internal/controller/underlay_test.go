package controller_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	lacev1 "github.com/lace-cni/lace/api/v1alpha1"
	"github.com/lace-cni/lace/internal/controller"
	"github.com/lace-cni/lace/lab/controlplane/cptest"
)

// A node claiming another node's underlay address (its endpoint the newer)
// gets AddressesAccepted False naming it; the other keeps True.
func TestUnderlayAddressClaimReported(t *testing.T) {
	env := cptest.Start(t)
	c := env.Client
	ctx := context.Background()
	for _, n := range []string{"n2", "n1"} {
		createNode(t, c, n)
		create(t, c, &lacev1.UnderlayEndpoint{ObjectMeta: metav1.ObjectMeta{Name: n}, Spec: lacev1.UnderlayEndpointSpec{Node: n}})
		time.Sleep(1100 * time.Millisecond) // creationTimestamp has one-second resolution: n2's claim is the older
	}
	set := func(name string, addrs ...lacev1.IPAddress) {
		var u lacev1.UnderlayEndpoint
		if err := c.Get(ctx, client.ObjectKey{Name: name}, &u); err != nil {
			t.Fatal(err)
		}
		p := client.MergeFrom(u.DeepCopy())
		u.Spec.Addresses = addrs
		if err := c.Patch(ctx, &u, p); err != nil {
			t.Fatal(err)
		}
	}
	set("n2", "fc00::2")
	set("n1", "fc00::1", "fc00::2")
	startController(t, env, nil)
	cond := func(name string) (*metav1.Condition, error) {
		var u lacev1.UnderlayEndpoint
		if err := c.Get(ctx, client.ObjectKey{Name: name}, &u); err != nil {
			return nil, err
		}
		if cd := meta.FindStatusCondition(u.Status.Conditions, controller.UnderlayAddressesAccepted); cd != nil {
			return cd, nil
		}
		return nil, fmt.Errorf("%s: no condition %s", name, controller.UnderlayAddressesAccepted)
	}
	eventually(t, 30*time.Second, "n1's claim of fc00::2 refused", func() error {
		cd, err := cond("n1")
		if err != nil {
			return err
		}
		if cd.Status != metav1.ConditionFalse || cd.Reason != "ClaimedByOtherNode" || !strings.Contains(cd.Message, "fc00::2") {
			return fmt.Errorf("n1: %s %s %q", cd.Status, cd.Reason, cd.Message)
		}
		return nil
	})
	eventually(t, 30*time.Second, "n2's addresses accepted", func() error {
		cd, err := cond("n2")
		if err != nil {
			return err
		}
		if cd.Status != metav1.ConditionTrue {
			return fmt.Errorf("n2: %s %s %q", cd.Status, cd.Reason, cd.Message)
		}
		return nil
	})
	// The kubelet reports n1's addresses: fc00::1 only stays; the refusal
	// of fc00::2 now says so.
	var n corev1.Node
	if err := c.Get(ctx, client.ObjectKey{Name: "n1"}, &n); err != nil {
		t.Fatal(err)
	}
	n.Status.Addresses = []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: "fc00::1"}}
	if err := c.Status().Update(ctx, &n); err != nil {
		t.Fatal(err)
	}
	eventually(t, 30*time.Second, "n1's fc00::2 refused as not reported by its Node", func() error {
		cd, err := cond("n1")
		if err != nil {
			return err
		}
		if cd.Status != metav1.ConditionFalse || cd.Reason != "NotReportedByNode" {
			return fmt.Errorf("n1: %s %s %q", cd.Status, cd.Reason, cd.Message)
		}
		return nil
	})
}

package controller_test

import (
	"context"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	lacev1 "github.com/lace-cni/lace/api/v1alpha1"
	"github.com/lace-cni/lace/lab/controlplane/cptest"
)

func nodeNE(name, node, uid string) *lacev1.NetworkEndpoint {
	return &lacev1.NetworkEndpoint{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: name,
		Labels: map[string]string{"lace-cni.io/node": node, "lace-cni.io/pod-uid": uid}},
		Spec: lacev1.NetworkEndpointSpec{Network: "default", Node: node, Addresses: []lacev1.IPAddress{"10.1.2.5"}}}
}

// A NetworkEndpoint no pod on its node stands behind (a node squatting the
// name of another node's pod, or one naming no pod) is deleted; the real
// one stays.
func TestForeignNetworkEndpointsDeleted(t *testing.T) {
	env := cptest.Start(t)
	c := env.Client
	ctx := context.Background()
	startController(t, env, nil)

	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "web-0"},
		Spec: corev1.PodSpec{NodeName: "n2", Containers: []corev1.Container{{Name: "c", Image: "x"}}}}
	// No controller-manager here: the ServiceAccount admission needs the account.
	create(t, c, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "default"}})
	create(t, c, pod)
	create(t, c, nodeNE("web-0", "n1", string(pod.UID))) // n1 squats n2's pod
	create(t, c, nodeNE("ghost", "n1", "u"))             // no such pod
	gone := func(name string) func() error {
		return func() error {
			err := c.Get(ctx, client.ObjectKey{Namespace: "default", Name: name}, &lacev1.NetworkEndpoint{})
			if apierrors.IsNotFound(err) {
				return nil
			}
			if err == nil {
				return errString("NetworkEndpoint " + name + " still there")
			}
			return err
		}
	}
	eventually(t, 20*time.Second, "squatted NetworkEndpoint web-0 deleted", gone("web-0"))
	eventually(t, 20*time.Second, "NetworkEndpoint ghost deleted", gone("ghost"))

	// n2's own record of its pod is kept.
	own := nodeNE("web-0", "n2", string(pod.UID))
	create(t, c, own)
	deadline := time.Now().Add(3 * time.Second)
	for time.Now().Before(deadline) {
		if err := c.Get(ctx, client.ObjectKeyFromObject(own), &lacev1.NetworkEndpoint{}); err != nil {
			t.Fatalf("n2's own NetworkEndpoint of its pod: %v", err)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

type errString string

func (e errString) Error() string { return string(e) }

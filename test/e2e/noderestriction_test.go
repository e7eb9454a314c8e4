package e2e

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/utils/ptr"
	crclient "sigs.k8s.io/controller-runtime/pkg/client"

	lacev1 "github.com/lace-cni/lace/api/v1alpha1"
	"github.com/lace-cni/lace/lab"
	"github.com/lace-cni/lace/pkg/scheme"
)

// agentToken is the service account token the kubelet of node projected
// into its agent pod, read from the node's kubelet directory: what a
// process that took over the agent (or the node) holds.
func agentToken(t *testing.T, node string) string {
	t.Helper()
	pods, err := client.CoreV1().Pods(lab.ReleaseNamespace).List(context.Background(), metav1.ListOptions{
		LabelSelector: "app.kubernetes.io/name=lace-agent", FieldSelector: "spec.nodeName=" + node})
	if err != nil || len(pods.Items) != 1 {
		t.Fatalf("agent pod on %s: %v (%d pods)", node, err, len(pods.Items))
	}
	glob := filepath.Join(labConfig().NodeRoot(node), "var/lib/kubelet/pods", string(pods.Items[0].UID),
		"volumes/kubernetes.io~projected/*/token")
	files, _ := filepath.Glob(glob)
	if len(files) != 1 {
		t.Fatalf("token of the agent on %s: %v match %s", node, files, glob)
	}
	b, err := os.ReadFile(files[0])
	if err != nil {
		t.Fatal(err)
	}
	return strings.TrimSpace(string(b))
}

// TestAgentSpeaksOnlyForItself writes with agent n1's own token: its own
// UnderlayEndpoint, NetworkEndpoints and Lease pass, n2's are refused
// with the node restriction's 403, whatever the verb. Every write is a
// dry run, so a regression shows here without breaking the lab.
func TestAgentSpeaksOnlyForItself(t *testing.T) {
	needLab(t)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	admin := laceClient(t)
	n1 := agentClient(t, "n1")
	dry := crclient.DryRunAll

	// A pod on each node, so that each has a NetworkEndpoint.
	var neps [2]*lacev1.NetworkEndpoint
	for i, node := range []string{"n1", "n2"} {
		name := "speaks-" + node
		if _, err := client.CoreV1().Pods("default").Create(ctx, netexecPod(name, node), metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { deletePodAndWait(t, name) })
		waitPodReady(t, "default", name)
		ne := &lacev1.NetworkEndpoint{}
		eventually(t, 30*time.Second, "NetworkEndpoint of "+name, func() error {
			return admin.Get(ctx, crclient.ObjectKey{Namespace: "default", Name: name}, ne)
		})
		if ne.Spec.Node != node {
			t.Fatalf("NetworkEndpoint %s on %s, want %s", name, ne.Spec.Node, node)
		}
		neps[i] = ne
	}
	ueps := map[string]*lacev1.UnderlayEndpoint{}
	for _, node := range []string{"n1", "n2"} {
		u := &lacev1.UnderlayEndpoint{}
		if err := admin.Get(ctx, crclient.ObjectKey{Name: node}, u); err != nil {
			t.Fatal(err)
		}
		ueps[node] = u
	}
	// The heartbeat Lease exists while some LoadBalancerClass does: write
	// it as its agent would, creating or renewing.
	leaseWrite := func(c crclient.Client, node string) error {
		l := &coordinationv1.Lease{}
		err := admin.Get(ctx, crclient.ObjectKey{Namespace: lab.HeartbeatNamespace, Name: "lace-agent-" + node}, l)
		if apierrors.IsNotFound(err) {
			l = &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Namespace: lab.HeartbeatNamespace, Name: "lace-agent-" + node},
				Spec: coordinationv1.LeaseSpec{HolderIdentity: ptr.To(node), RenewTime: &metav1.MicroTime{Time: time.Now()}}}
			return c.Create(ctx, l, dry)
		}
		if err != nil {
			t.Fatal(err)
		}
		l.Spec.RenewTime = &metav1.MicroTime{Time: time.Now()}
		return c.Update(ctx, l, dry)
	}
	patchUEP := func(node string, f func(*lacev1.UnderlayEndpoint)) error {
		u := ueps[node].DeepCopy()
		f(u)
		return n1.Patch(ctx, u, crclient.MergeFrom(ueps[node]), dry)
	}
	patchStatus := func(node string) error {
		u := ueps[node].DeepCopy()
		u.Status.Datapath = &lacev1.DatapathStatus{Endpoints: 99}
		return n1.Status().Patch(ctx, u, crclient.MergeFrom(ueps[node]), dry)
	}
	updateNE := func(ne *lacev1.NetworkEndpoint, f func(*lacev1.NetworkEndpoint)) error {
		c := ne.DeepCopy()
		f(c)
		return n1.Update(ctx, c, dry)
	}
	addr := func(u *lacev1.UnderlayEndpoint) { u.Spec.Addresses = append(u.Spec.Addresses, "fd00:66::1") }
	touch := func(ne *lacev1.NetworkEndpoint) { ne.Spec.Addresses = []lacev1.IPAddress{"10.66.0.1"} }

	for what, err := range map[string]error{
		"n1 patches its UnderlayEndpoint":          patchUEP("n1", addr),
		"n1 patches its UnderlayEndpoint status":   patchStatus("n1"),
		"n1 updates a NetworkEndpoint of its node": updateNE(neps[0], touch),
		"n1 deletes a NetworkEndpoint of its node": n1.Delete(ctx, neps[0].DeepCopy(), dry),
		"n1 writes its Lease":                      leaseWrite(n1, "n1"),
	} {
		if err != nil {
			t.Errorf("%s: %v, want allowed", what, err)
		}
	}
	for what, err := range map[string]error{
		"n1 rewrites n2's addresses":       patchUEP("n2", addr),
		"n1 rewrites n2's locator":         patchUEP("n2", func(u *lacev1.UnderlayEndpoint) { u.Spec.Locator = ueps["n1"].Spec.Locator }),
		"n1 takes n2's locator for itself": patchUEP("n1", func(u *lacev1.UnderlayEndpoint) { u.Spec.Locator = ueps["n2"].Spec.Locator }),
		"n1 writes n2's status":            patchStatus("n2"),
		"n1 rewrites n2's NetworkEndpoint": updateNE(neps[1], touch),
		"n1 takes over n2's NetworkEndpoint": updateNE(neps[1], func(ne *lacev1.NetworkEndpoint) {
			ne.Spec.Node, ne.Labels["lace-cni.io/node"] = "n1", "n1"
		}),
		"n1 deletes n2's NetworkEndpoint": n1.Delete(ctx, neps[1].DeepCopy(), dry),
		"n1 creates a NetworkEndpoint for n2": n1.Create(ctx, &lacev1.NetworkEndpoint{
			ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "forged", Labels: map[string]string{"lace-cni.io/node": "n2"}},
			Spec:       lacev1.NetworkEndpointSpec{Network: neps[1].Spec.Network, Node: "n2", Addresses: neps[1].Spec.Addresses}}, dry),
		"n1 writes n2's Lease": leaseWrite(n1, "n2"),
	} {
		if err := nodeRestricted(err); err != nil {
			t.Errorf("%s: %v", what, err)
		}
	}
}

// nodeRestricted is nil when err is the node restriction's refusal.
func nodeRestricted(err error) error {
	switch {
	case err == nil:
		return errors.New("allowed, want 403 from the agent node restriction")
	case !apierrors.IsForbidden(err):
		return fmt.Errorf("%w: want 403 Forbidden", err)
	case !strings.Contains(err.Error(), "lace-agent-node-restriction"):
		return fmt.Errorf("%w: refused, but not by the agent node restriction", err)
	}
	return nil
}

// agentClient is a client with the token the kubelet gave node's agent:
// what a compromised node holds.
func agentClient(t *testing.T, node string) crclient.Client {
	t.Helper()
	cfg, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
	if err != nil {
		t.Fatal(err)
	}
	ac := rest.AnonymousClientConfig(cfg)
	ac.BearerToken = agentToken(t, node)
	c, err := crclient.New(ac, crclient.Options{Scheme: scheme.Scheme})
	if err != nil {
		t.Fatal(err)
	}
	return c
}

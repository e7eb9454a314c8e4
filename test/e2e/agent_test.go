package e2e

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/uuid"
	"k8s.io/utils/ptr"

	lacev1 "github.com/lace-cni/lace/api/v1alpha1"
	"github.com/lace-cni/lace/lab"
)

// residueMatchesPods waits until every node holds exactly what its pods
// need (no leftover veth, map entry or checkpointed address).
func residueMatchesPods(t *testing.T, what string) {
	t.Helper()
	ctx := context.Background()
	eventually(t, 45*time.Second, what, func() error {
		pods, err := client.CoreV1().Pods("").List(ctx, metav1.ListOptions{})
		if err != nil {
			return err
		}
		want := lab.PodsResidue(pods.Items)
		for node, g := range nodeResidue(t) {
			if g != want[node] {
				return fmt.Errorf("node %s holds %+v, its pods need %+v", node, g, want[node])
			}
		}
		return nil
	})
}

// TestAgentCleansUpAfterDowntime deletes a pod while its node's agent is
// stopped: CNI DEL cannot reach it, so lace-cni queues the DEL on the node
// (and succeeds, so deletion is not blocked); the agent, once back,
// replays it and removes the pod's interface, map entries and addresses.
func TestAgentCleansUpAfterDowntime(t *testing.T) {
	needLab(t)
	ctx := context.Background()
	p := netPod(t, "orphan", "default", "n2", true)
	if out, err := labCmd("stop", "agent/n2").CombinedOutput(); err != nil {
		t.Fatalf("stop agent: %v %s", err, out)
	}
	started := false
	defer func() {
		if !started {
			_ = labCmd("start", "agent/n2").Run()
		}
	}()
	if err := client.CoreV1().Pods("default").Delete(ctx, p.Name, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	eventually(t, 30*time.Second, "pod deleted without its agent", func() error {
		if _, err := client.CoreV1().Pods("default").Get(ctx, p.Name, metav1.GetOptions{}); err == nil {
			return fmt.Errorf("still there")
		}
		return nil
	})
	// The agent is down: the pod's veth is still on the node, and its DEL
	// waits in the queue.
	if r := nodeResidue(t)["n2"]; r.Checkpointed == 0 {
		t.Fatalf("nothing left on n2 while its agent was down (%+v); the test proves nothing", r)
	}
	queue := filepath.Join(labConfig().NodeRoot("n2"), "var/lib/lace/del-queue")
	queued, _ := os.ReadDir(queue)
	if len(queued) == 0 {
		t.Fatalf("no DEL queued in %s while the agent was down", queue)
	}
	if out, err := labCmd("start", "agent/n2").CombinedOutput(); err != nil {
		t.Fatalf("start agent: %v %s", err, out)
	}
	started = true
	residueMatchesPods(t, "restarted agent removed the deleted pod's endpoint")
	eventually(t, 30*time.Second, "the DEL queue drained and the agent says it replayed it", func() error {
		if left, _ := os.ReadDir(queue); len(left) > 0 {
			return fmt.Errorf("%d DELs still queued", len(left))
		}
		ap := agentPod(t, "n2")
		logs, err := client.CoreV1().Pods(ap.Namespace).GetLogs(ap.Name, &corev1.PodLogOptions{}).DoRaw(ctx)
		if err != nil {
			return err
		}
		if !strings.Contains(string(logs), "replayed a DEL queued while the agent was unreachable") {
			return fmt.Errorf("the agent's log does not mention the replay")
		}
		return nil
	})
}

// TestCNIGarbageCollection attaches a container behind the kubelet's back
// (a lost DEL looks the same) and runs CNI GC through lace-cni with the
// kubelet's real containers as the valid list: the stray attachment goes,
// the real ones stay.
func TestCNIGarbageCollection(t *testing.T) {
	needLab(t)
	ctx := context.Background()
	netPod(t, "gc-keep", "default", "n3", true)
	stray, err := client.CoreV1().Pods("default").Create(ctx, &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "gc-stray"},
		Spec: corev1.PodSpec{SchedulerName: "lace-e2e-unscheduled",
			Containers: []corev1.Container{{Name: "pause", Image: "registry.k8s.io/pause:3.10"}}},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer client.CoreV1().Pods("default").Delete(ctx, "gc-stray", metav1.DeleteOptions{GracePeriodSeconds: ptr.To[int64](0)})
	c := labConfig()
	netns := labName + "-p-" + string(uuid.NewUUID())
	nodePath, _, err := lab.CreateNodeNetNS(c, "n3", netns)
	if err != nil {
		t.Fatal(err)
	}
	defer lab.DeleteNodeNetNS(c, "n3", netns)
	// lace-cni runs as n3's containerd runs it, in the node's namespaces.
	cni, err := lab.NewNodeCNI(c, "n3", t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	addrs, err := cni.Add(ctx, lab.PodRuntimeConf("stray-"+string(stray.UID), nodePath, "default", "gc-stray", string(stray.UID)))
	if err != nil {
		t.Fatalf("ADD behind the kubelet's back: %v", err)
	}
	t.Logf("stray attachment got %v", addrs)

	// The runtime's sandboxes are the valid attachments, as containerd
	// lists them for CNI GC.
	valid, err := lab.SandboxIDs(ctx, c, "n3")
	if err != nil {
		t.Fatal(err)
	}
	before := nodeResidue(t)["n3"]
	if err := cni.GC(ctx, valid); err != nil {
		t.Fatalf("GC: %v", err)
	}
	after := nodeResidue(t)["n3"]
	if after.Checkpointed != before.Checkpointed-1 || after.Veths != before.Veths-1 {
		t.Errorf("GC left n3 at %+v (before %+v); want exactly the stray attachment removed", after, before)
	}
	residueMatchesPods(t, "n3 holds only its pods after GC")
}

// TestCNIErrorsAreReported checks the messages an operator sees when a pod
// cannot be attached: no binding policy, or no free address.
func TestCNIErrorsAreReported(t *testing.T) {
	needLab(t)
	ctx := context.Background()
	c := laceClient(t)

	// A block of /30 holds one pod per node.
	small := &lacev1.Network{ObjectMeta: metav1.ObjectMeta{Name: "tiny30"}, Spec: lacev1.NetworkSpec{Type: lacev1.NetworkTypeL3,
		IPv4Subnet: &lacev1.Subnet{Prefix: "10.98.0.0/24", HostLocalPrefixLength: ptr.To[int32](30)}}}
	pol := &lacev1.NetworkBindingPolicy{ObjectMeta: metav1.ObjectMeta{Name: "e2e-tiny30"}, Spec: lacev1.NetworkBindingPolicySpec{
		Network: "tiny30", Priority: 10, Selector: &metav1.LabelSelector{MatchLabels: map[string]string{"net": "tiny30"}}}}
	for _, o := range []crObject{small, pol} {
		if err := c.Create(ctx, o); err != nil {
			t.Fatal(err)
		}
		defer c.Delete(context.Background(), o)
	}
	netPod(t, "tiny-1", "tiny30", "n1", true)
	p := netexecPod("tiny-2", "n1")
	p.Labels["net"] = "tiny30"
	if _, err := client.CoreV1().Pods("default").Create(ctx, p, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	defer client.CoreV1().Pods("default").Delete(ctx, "tiny-2", metav1.DeleteOptions{GracePeriodSeconds: ptr.To[int64](0)})
	waitEvent(t, "tiny-2", "network tiny30 has no free address on node n1")

	// Without the catch-all policy a pod matches nothing.
	var catchAll lacev1.NetworkBindingPolicy
	if err := c.Get(ctx, crKey("default"), &catchAll); err != nil {
		t.Fatal(err)
	}
	if err := c.Delete(ctx, &catchAll); err != nil {
		t.Fatal(err)
	}
	defer func() {
		catchAll.ResourceVersion = ""
		if err := c.Create(context.Background(), &catchAll); err != nil {
			t.Errorf("restore the catch-all policy: %v", err)
		}
	}()
	// The agent binds from its cache, which sees the deletion a moment
	// later: a pod it attached in that moment is deleted and created again,
	// until one is refused.
	defer client.CoreV1().Pods("default").Delete(ctx, "unbound", metav1.DeleteOptions{GracePeriodSeconds: ptr.To[int64](0)})
	const unbound = "no NetworkBindingPolicy matches pod default/unbound"
	deadline := time.Now().Add(time.Minute)
	for attempt := 1; ; attempt++ {
		if _, err := client.CoreV1().Pods("default").Create(ctx, netexecPod("unbound", "n2"), metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		attached := ""
		eventually(t, 45*time.Second, "pod unbound refused or attached", func() error {
			if hasSandboxFailure(t, "unbound", unbound) {
				return nil
			}
			p, err := client.CoreV1().Pods("default").Get(ctx, "unbound", metav1.GetOptions{})
			if err != nil {
				return err
			}
			if len(p.Status.PodIPs) > 0 {
				attached = p.Status.PodIPs[0].IP
				return nil
			}
			return fmt.Errorf("pod %s, no sandbox failure says %q", p.Status.Phase, unbound)
		})
		if attached == "" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("a pod matching no policy is still attached (%s) a minute after the catch-all policy went", attached)
		}
		t.Logf("attempt %d: attached at %s before the agent saw the policy go; again", attempt, attached)
		deletePodAndWait(t, "unbound")
	}
	waitEvent(t, "unbound", unbound)
}

// hasSandboxFailure says whether the kubelet reported that pod's sandbox
// could not be created, with msg in the event.
func hasSandboxFailure(t *testing.T, pod, msg string) bool {
	t.Helper()
	evs, err := client.CoreV1().Events("default").List(context.Background(), metav1.ListOptions{FieldSelector: "involvedObject.name=" + pod})
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range evs.Items {
		if e.Type == corev1.EventTypeWarning && e.Reason == "FailedCreatePodSandBox" && e.Source.Component == "kubelet" &&
			strings.Contains(e.Message, msg) {
			return true
		}
	}
	return false
}

func deletePodAndWait(t *testing.T, name string) {
	t.Helper()
	ctx := context.Background()
	if err := client.CoreV1().Pods("default").Delete(ctx, name, metav1.DeleteOptions{GracePeriodSeconds: ptr.To[int64](0)}); err != nil {
		t.Fatal(err)
	}
	eventually(t, time.Minute, "pod "+name+" gone", func() error {
		if _, err := client.CoreV1().Pods("default").Get(ctx, name, metav1.GetOptions{}); err == nil {
			return fmt.Errorf("still there")
		}
		return nil
	})
}

// waitEvent waits until the kubelet reports that the pod's sandbox could
// not be created, with the agent's error (msg) in the event, as a real
// kubelet does; the pod stays Pending with its containers waiting.
func waitEvent(t *testing.T, pod, msg string) {
	t.Helper()
	ctx := context.Background()
	eventually(t, 45*time.Second, fmt.Sprintf("FailedCreatePodSandBox %q on %s", msg, pod), func() error {
		evs, err := client.CoreV1().Events("default").List(ctx, metav1.ListOptions{FieldSelector: "involvedObject.name=" + pod})
		if err != nil {
			return err
		}
		for _, e := range evs.Items {
			if e.Type == corev1.EventTypeWarning && e.Reason == "FailedCreatePodSandBox" && e.Source.Component == "kubelet" &&
				strings.Contains(e.Message, msg) {
				return nil
			}
		}
		return fmt.Errorf("%d events, no sandbox failure says %q", len(evs.Items), msg)
	})
	p, err := client.CoreV1().Pods("default").Get(ctx, pod, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if p.Status.Phase != corev1.PodPending || len(p.Status.PodIPs) != 0 {
		t.Errorf("pod %s is %s with addresses %v, want Pending without any", pod, p.Status.Phase, p.Status.PodIPs)
	}
}

package e2e

import (
	"context"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	lacev1 "github.com/lace-cni/lace/api/v1alpha1"
	"github.com/lace-cni/lace/lab"
)

// TestAgentRebuildsLostCheckpoint deletes a node's checkpoint and restarts
// its agent: the agent rebuilds it from its pinned maps, the host
// interfaces and the API, so the pods on that node keep talking (to each
// other and across nodes) and a new pod there gets an address nobody
// holds.
func TestAgentRebuildsLostCheckpoint(t *testing.T) {
	needLab(t)
	ctx := context.Background()
	a := netPod(t, "lost-a", "default", "n1", true)
	b := netPod(t, "lost-b", "default", "n1", true)
	c := netPod(t, "lost-c", "default", "n2", true)
	expectReach(t, a, b)
	expectReach(t, c, a)

	state := filepath.Join(labConfig().NodeRoot("n1"), "var/lib/lace/endpoints.json")
	if err := os.Remove(state); err != nil {
		t.Fatalf("delete n1's checkpoint: %v", err)
	}
	if out, err := labCmd("restart", "agent/n1").CombinedOutput(); err != nil {
		t.Fatalf("restart agent: %v %s", err, out)
	}
	residueMatchesPods(t, "n1's agent rebuilt its checkpoint from the kernel and the API")
	expectReach(t, a, b)
	expectReach(t, b, a)
	expectReach(t, c, a)
	expectReach(t, a, c)

	d := netPod(t, "lost-d", "default", "n1", true)
	taken := map[string]string{}
	for _, p := range []*corev1.Pod{a, b} {
		for _, ip := range p.Status.PodIPs {
			taken[ip.IP] = p.Name
		}
	}
	for _, ip := range d.Status.PodIPs {
		if owner, ok := taken[ip.IP]; ok {
			t.Fatalf("new pod lost-d got %s, which %s holds", ip.IP, owner)
		}
	}
	expectReach(t, d, a)
	expectReach(t, a, d)
	_ = ctx
}

// cniStatus runs CNI STATUS on node with its installed configuration, as a
// CNI 1.1 runtime asks before starting pods.
func cniStatus(t *testing.T, node string) error {
	t.Helper()
	cni, err := lab.NewNodeCNI(labConfig(), node, t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	return cni.Status(ctx)
}

// TestNodeWithoutIPv6UnderlaySaysSo removes the IPv6 address of one node's
// underlay interface: its UnderlayEndpoint's Ready condition turns False
// with reason NoIPv6Underlay, a Warning Event names the Node, and CNI
// STATUS fails with the reason. With the address back, all three recover.
// (containerd 1.6 does not call STATUS: its CRI reports the network ready
// once a CNI config is loaded; CNI 1.1 runtimes do.)
func TestNodeWithoutIPv6UnderlaySaysSo(t *testing.T) {
	needLab(t)
	ctx := context.Background()
	const node = "n3"
	c := laceClient(t)
	ip := func(args ...string) string {
		t.Helper()
		out, err := labCmd(append([]string{"exec", "node/" + node, "--", "ip"}, args...)...).CombinedOutput()
		if err != nil {
			t.Fatalf("ip %v on %s: %v %s", args, node, err, out)
		}
		return string(out)
	}
	if err := cniStatus(t, node); err != nil {
		t.Fatalf("STATUS of a working node: %v", err)
	}
	var addr netip.Prefix
	for _, f := range strings.Fields(ip("-6", "-o", "addr", "show", "dev", "eth0", "scope", "global")) {
		if p, err := netip.ParsePrefix(f); err == nil {
			addr = p
			break
		}
	}
	if !addr.IsValid() {
		t.Fatalf("%s's eth0 has no global IPv6 address", node)
	}
	routes := strings.Split(strings.TrimSpace(ip("-6", "route", "show")), "\n")
	since := time.Now().Add(-time.Second)
	ip("-6", "addr", "del", addr.String(), "dev", "eth0")
	restored := false
	restore := func() {
		ip("-6", "addr", "add", addr.String(), "dev", "eth0", "nodad")
		for _, r := range routes {
			if r != "" && !strings.Contains(r, "proto kernel") && !strings.Contains(r, "proto 26") {
				_, _ = labCmd(append([]string{"exec", "node/" + node, "--", "ip", "-6", "route", "replace"}, strings.Fields(r)...)...).CombinedOutput()
			}
		}
		restored = true
	}
	defer func() {
		if !restored {
			restore()
		}
	}()

	ready := func(status metav1.ConditionStatus, reason string) func() error {
		return func() error {
			var u lacev1.UnderlayEndpoint
			if err := c.Get(ctx, crKey(node), &u); err != nil {
				return err
			}
			cond := meta.FindStatusCondition(u.Status.Conditions, lacev1.UnderlayReady)
			if cond == nil || cond.Status != status || cond.Reason != reason {
				return fmt.Errorf("Ready condition %+v, want %s/%s", cond, status, reason)
			}
			return nil
		}
	}
	eventually(t, 45*time.Second, "Ready=False NoIPv6Underlay on "+node, ready(metav1.ConditionFalse, lacev1.ReasonNoIPv6Underlay))
	eventually(t, 30*time.Second, "Warning event on node "+node, func() error {
		evs, err := client.CoreV1().Events("default").List(ctx, metav1.ListOptions{
			FieldSelector: "involvedObject.kind=Node,involvedObject.name=" + node})
		if err != nil {
			return err
		}
		for _, e := range evs.Items {
			if e.Type == corev1.EventTypeWarning && e.Reason == lacev1.ReasonNoIPv6Underlay && e.LastTimestamp.After(since) {
				return nil
			}
		}
		return fmt.Errorf("%d events on the node, no NoIPv6Underlay warning", len(evs.Items))
	})
	err := cniStatus(t, node)
	if err == nil || !strings.Contains(err.Error(), lacev1.ReasonNoIPv6Underlay) {
		t.Errorf("CNI STATUS of a node without an IPv6 underlay: %v, want a failure naming %s", err, lacev1.ReasonNoIPv6Underlay)
	} else {
		t.Logf("CNI STATUS: %v", err)
	}

	restore()
	eventually(t, 60*time.Second, "Ready=True again on "+node, ready(metav1.ConditionTrue, lacev1.ReasonUnderlayReady))
	eventually(t, 30*time.Second, "CNI STATUS succeeds again", func() error { return cniStatus(t, node) })
	// Pods on the node talk across nodes again.
	p := netPod(t, "ipv6-back", "default", node, true)
	q := netPod(t, "ipv6-peer", "default", "n1", true)
	expectReach(t, p, q)
}

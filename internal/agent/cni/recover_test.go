package cni

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"

	lacev1 "github.com/lace-cni/lace/api/v1alpha1"
	"github.com/lace-cni/lace/internal/podnet"
	"github.com/lace-cni/lace/pkg/cniapi"
)

func delReq(container, podName string) cniapi.Request {
	r := addReq(container, podName)
	r.Command = "DEL"
	return r
}

// TestQueuedDelIsReplayed: a DEL lace-cni queued while the agent was
// unreachable removes the endpoint when the agent replays the queue, and
// leaves the queue empty.
func TestQueuedDelIsReplayed(t *testing.T) {
	a := newTestAgent(t, 29, pod("p1"), pod("p2"))
	ctx := context.Background()
	for _, c := range [][2]string{{"c1", "p1"}, {"c2", "p2"}} {
		if _, err := a.Handle(ctx, addReq(c[0], c[1])); err != nil {
			t.Fatal(err)
		}
	}
	if err := cniapi.QueueDel(a.opts.DelQueueDir, delReq("c1", "p1")); err != nil {
		t.Fatal(err)
	}
	// The pod still exists in the API: only the queued DEL can remove it.
	if err := a.CollectEndpoints(ctx); err != nil {
		t.Fatal(err)
	}
	if _, ok := a.cp.get("c1"); !ok {
		t.Fatal("endpoint gone before the replay: the test proves nothing")
	}
	if err := a.ReplayQueuedDels(ctx); err != nil {
		t.Fatal(err)
	}
	if _, ok := a.cp.get("c1"); ok || len(a.dp.eps) != 1 || len(a.dp.ports) != 1 || len(a.node.pods) != 1 {
		t.Errorf("after replay: c1 recorded %v, %d map entries, %d ports, %d interfaces", ok, len(a.dp.eps), len(a.dp.ports), len(a.node.pods))
	}
	if q, _ := cniapi.QueuedDels(a.opts.DelQueueDir); len(q) != 0 {
		t.Errorf("%d DELs still queued", len(q))
	}
}

// TestReusedIfIndexNeverInheritsStaleEntry: after a "reboot" (no veths,
// empty maps) a new interface gets the index a checkpointed pod had; the
// stale endpoint is dropped before the data plane is written from the
// checkpoint, so nothing of the dead pod points at the new interface.
func TestReusedIfIndexNeverInheritsStaleEntry(t *testing.T) {
	a := newTestAgent(t, 29, pod("p1"), pod("p2"))
	ctx := context.Background()
	if _, err := a.Handle(ctx, addReq("c1", "p1")); err != nil {
		t.Fatal(err)
	}
	old, _ := a.cp.get("c1")
	// Reboot: interfaces and pinned maps are gone; the checkpoint is on disk.
	a.node.links = map[string]podnet.Link{}
	a.node.pods = map[string]podnet.Spec{}
	a.dp = newFakeDP()
	a.Server.dp = a.dp
	// Something else now has c1's interface index.
	a.node.links["other0"] = podnet.Link{Name: "lacefeedfeed0", Index: old.HostIfIndex, MAC: []byte{2, 9, 9, 9, 9, 9}}
	if err := a.DropStaleEndpoints(ctx); err != nil {
		t.Fatal(err)
	}
	if err := a.SyncEntries(); err != nil {
		t.Fatal(err)
	}
	if _, ok := a.cp.get("c1"); ok {
		t.Error("the dead pod's endpoint survived the reboot")
	}
	if len(a.dp.eps) != 0 || len(a.dp.ports) != 0 {
		t.Errorf("the data plane holds a dead pod's entries: eps %v ports %v", a.dp.eps, a.dp.ports)
	}

	// Same name, another index (the interface was made again): not trusted.
	if _, err := a.Handle(ctx, addReq("c2", "p2")); err != nil {
		t.Fatal(err)
	}
	e, _ := a.cp.get("c2")
	l := a.node.links[e.HostIf]
	l.Index += 50
	a.node.links[e.HostIf] = l
	if err := a.DropStaleEndpoints(ctx); err != nil {
		t.Fatal(err)
	}
	if _, ok := a.cp.get("c2"); ok {
		t.Error("an endpoint whose interface has another index is still trusted")
	}
}

// TestLostCheckpointIsRebuilt: with the state file gone, the agent adopts
// the running pods from the pinned maps, the host interfaces and the API
// (a NetworkEndpoint for one, only the Pod's IPs for the other), keeps
// their data plane entries, and hands a new pod a free address.
func TestLostCheckpointIsRebuilt(t *testing.T) {
	p2 := pod("p2")
	a := newTestAgent(t, 29, pod("p1"), p2, pod("p3"))
	ctx := context.Background()
	for _, c := range [][2]string{{"c1", "p1"}, {"c2", "p2"}} {
		if _, err := a.Handle(ctx, addReq(c[0], c[1])); err != nil {
			t.Fatal(err)
		}
	}
	before := a.cp.all()
	e1, _ := a.cp.get("c1")
	e2, _ := a.cp.get("c2")
	// p1's record exists; p2 has none, but the kubelet reported its IP.
	if err := a.writeNetworkEndpoint(ctx, pod("p1"), e1); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	var ne lacev1.NetworkEndpoint
	if err := a.c.Get(ctx, types.NamespacedName{Namespace: "default", Name: "p2"}, &ne); err == nil {
		if err := a.c.Delete(ctx, &ne); err != nil {
			t.Fatal(err)
		}
	}
	p2.Status.PodIPs = []corev1.PodIP{{IP: e2.Addrs[0].String()}}
	if err := a.c.Status().Update(ctx, p2); err != nil {
		t.Fatal(err)
	}

	// The state file is lost.
	dir := filepath.Dir(a.cp.path)
	if err := os.Remove(a.cp.path); err != nil {
		t.Fatal(err)
	}
	cp, err := loadCheckpoint(dir)
	if err != nil || !cp.lost {
		t.Fatalf("load without a file: %v, lost %v", err, cp.lost)
	}
	a.cp = cp
	var nets lacev1.NetworkList
	if err := a.c.List(ctx, &nets); err != nil {
		t.Fatal(err)
	}
	if err := a.AdoptOnce(ctx, a.sync.State(), nets.Items); err != nil {
		t.Fatal(err)
	}
	if err := a.SyncEntries(); err != nil {
		t.Fatal(err)
	}
	after := a.cp.all()
	if len(after) != 2 {
		t.Fatalf("rebuilt %d endpoints, want 2: %+v", len(after), after)
	}
	for i, e := range after {
		b := before[i]
		if e.PodName != b.PodName || e.PodUID != b.PodUID || e.Network != b.Network || e.HostIfIndex != b.HostIfIndex ||
			e.PodMAC != b.PodMAC || fmt.Sprint(e.Addrs) != fmt.Sprint(b.Addrs) || fmt.Sprint(e.Gateways) != fmt.Sprint(b.Gateways) || !e.Ready {
			t.Errorf("rebuilt %+v, was %+v", e, b)
		}
	}
	if len(a.dp.eps) != 2 || len(a.dp.ports) != 2 {
		t.Errorf("the running pods lost their data plane entries: eps %v ports %v", a.dp.eps, a.dp.ports)
	}
	if err := a.CollectEndpoints(ctx); err != nil || len(a.cp.all()) != 2 {
		t.Errorf("collect after rebuild: %v, %d endpoints", err, len(a.cp.all()))
	}
	raw, err := a.Handle(ctx, addReq("c3", "p3"))
	if err != nil {
		t.Fatal(err)
	}
	if ip := resultIP(t, raw); ip != "10.244.0.4/32" {
		t.Errorf("new pod got %s, want 10.244.0.4/32 (.2 and .3 are in use)", ip)
	}
	// The runtime's DEL names the container: the rebuilt endpoint is found
	// by its interface.
	if _, err := a.Handle(ctx, delReq("c2", "p2")); err != nil {
		t.Fatal(err)
	}
	if _, ok := a.node.pods[e2.HostIf]; ok || len(a.cp.all()) != 2 {
		t.Errorf("DEL of a rebuilt endpoint: interface left %v, %d endpoints", ok, len(a.cp.all()))
	}
}

// TestMissingNetworkEndpointIsRecreated: a deleted NetworkEndpoint is
// written again from the checkpoint, and a present one is not rewritten.
func TestMissingNetworkEndpointIsRecreated(t *testing.T) {
	a := newTestAgent(t, 29, pod("p1"))
	ctx := context.Background()
	if _, err := a.Handle(ctx, addReq("c1", "p1")); err != nil {
		t.Fatal(err)
	}
	key := types.NamespacedName{Namespace: "default", Name: "p1"}
	var ne lacev1.NetworkEndpoint
	// The ADD writes its record off the runtime's path: wait for it, so
	// that it cannot land after the deletion below.
	deadline := time.Now().Add(5 * time.Second)
	for a.c.Get(ctx, key, &ne) != nil {
		if time.Now().After(deadline) {
			t.Fatal("the ADD wrote no NetworkEndpoint")
		}
		time.Sleep(5 * time.Millisecond)
	}
	if err := a.c.Delete(ctx, &ne); err != nil {
		t.Fatal(err)
	}
	if err := a.EnsureNetworkEndpoints(ctx); err != nil {
		t.Fatal(err)
	}
	if err := a.c.Get(ctx, key, &ne); err != nil {
		t.Fatalf("NetworkEndpoint not recreated: %v", err)
	}
	e, _ := a.cp.get("c1")
	if ne.Spec.Network != "default" || ne.Spec.Node != "n1" || len(ne.Spec.Addresses) != 1 || string(ne.Spec.Addresses[0]) != e.Addrs[0].String() ||
		string(ne.Spec.MAC) != e.PodMAC || ne.Labels[lacev1.LabelPodUID] != "uid-p1" || len(ne.OwnerReferences) != 1 {
		t.Errorf("recreated %+v", ne)
	}
	rv := ne.ResourceVersion
	if err := a.EnsureNetworkEndpoints(ctx); err != nil {
		t.Fatal(err)
	}
	if err := a.c.Get(ctx, key, &ne); err != nil || ne.ResourceVersion != rv {
		t.Errorf("an unchanged NetworkEndpoint was rewritten (%v)", err)
	}
}

// TestCheckpointIsWrittenAtomically: every save leaves one complete file
// and no temporary one; an unreadable file is moved aside, not fatal.
func TestCheckpointIsWrittenAtomically(t *testing.T) {
	dir := t.TempDir()
	cp, err := loadCheckpoint(dir)
	if err != nil {
		t.Fatal(err)
	}
	for i := range 5 {
		if err := cp.put(Endpoint{ContainerID: fmt.Sprint("c", i), Ready: true}); err != nil {
			t.Fatal(err)
		}
	}
	ents, _ := os.ReadDir(dir)
	if len(ents) != 1 || ents[0].Name() != checkpointFile {
		t.Errorf("state dir holds %v, want only %s", ents, checkpointFile)
	}
	again, err := loadCheckpoint(dir)
	if err != nil || len(again.all()) != 5 || again.lost {
		t.Fatalf("reload: %v, %d endpoints", err, len(again.all()))
	}
	if err := os.WriteFile(filepath.Join(dir, checkpointFile), []byte(`[{"containerID":`), 0o600); err != nil {
		t.Fatal(err)
	}
	torn, err := loadCheckpoint(dir)
	if err != nil || !torn.lost || len(torn.all()) != 0 {
		t.Fatalf("torn file: %v, lost %v", err, torn != nil && torn.lost)
	}
	if _, err := os.Stat(filepath.Join(dir, checkpointFile+".corrupt")); err != nil {
		t.Errorf("torn file not kept aside: %v", err)
	}
}

// TestPodMTUFollowsTheUnderlay: a pod's MTU is the underlay's at ADD less
// 40, unless --mtu says otherwise.
func TestPodMTUFollowsTheUnderlay(t *testing.T) {
	a := newTestAgent(t, 29, pod("p1"), pod("p2"), pod("p3"))
	ctx := context.Background()
	a.node.mtu = 9000
	if _, err := a.Handle(ctx, addReq("c1", "p1")); err != nil {
		t.Fatal(err)
	}
	e, _ := a.cp.get("c1")
	if got := a.node.pods[e.HostIf].MTU; got != 8960 {
		t.Errorf("underlay 9000: pod MTU %d, want 8960", got)
	}
	a.node.mtu = 1300
	if _, err := a.Handle(ctx, addReq("c2", "p2")); err == nil || !strings.Contains(err.Error(), "below IPv6's minimum") {
		t.Errorf("underlay 1300: %v", err)
	}
	a.opts.MTU = 1280
	if _, err := a.Handle(ctx, addReq("c3", "p3")); err != nil {
		t.Fatal(err)
	}
	e, _ = a.cp.get("c3")
	if got := a.node.pods[e.HostIf].MTU; got != 1280 {
		t.Errorf("--mtu 1280: pod MTU %d", got)
	}
}

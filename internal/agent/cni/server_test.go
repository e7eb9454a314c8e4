package cni

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/netip"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	lacev1 "github.com/lace-cni/lace/api/v1alpha1"
	"github.com/lace-cni/lace/internal/agent/applier"
	"github.com/lace-cni/lace/pkg/cniapi"
)

func addReq(container, podName string) cniapi.Request {
	return cniapi.Request{Command: "ADD", ContainerID: container, NetNS: "/run/netns/" + container, IfName: "eth0",
		Args:   map[string]string{"K8S_POD_NAMESPACE": "default", "K8S_POD_NAME": podName, "K8S_POD_UID": "uid-" + podName},
		Config: json.RawMessage(`{"cniVersion":"1.1.0","name":"lace","type":"lace"}`)}
}

func resultIP(t *testing.T, raw json.RawMessage) string {
	t.Helper()
	var r struct {
		IPs []struct {
			Address string `json:"address"`
		} `json:"ips"`
	}
	if err := json.Unmarshal(raw, &r); err != nil || len(r.IPs) == 0 {
		t.Fatalf("result %s: %v", raw, err)
	}
	return r.IPs[0].Address
}

func TestAddBindsAllocatesAndPrograms(t *testing.T) {
	a := newTestAgent(t, 29, pod("p1"))
	ctx := context.Background()
	raw, err := a.Handle(ctx, addReq("c1", "p1"))
	if err != nil {
		t.Fatal(err)
	}
	if ip := resultIP(t, raw); ip != "10.244.0.2/32" {
		t.Errorf("first pod got %s, want 10.244.0.2/32 (after the gateway)", ip)
	}
	e, ok := a.cp.get("c1")
	if !ok || !e.Ready || e.Network != "default" || e.NetID != 1 {
		t.Fatalf("checkpoint %+v %v", e, ok)
	}
	if _, ok := a.dp.eps[epKey(1, netip.MustParseAddr("10.244.0.2"))]; !ok || !a.dp.attached[e.HostIf] || len(a.dp.ports) != 1 {
		t.Errorf("data plane not programmed: eps %v attached %v ports %v", a.dp.eps, a.dp.attached, a.dp.ports)
	}
	if s := a.node.pods[e.HostIf]; s.MTU != 1460 || s.Gateways[0] != netip.MustParseAddr("10.244.0.1") {
		t.Errorf("pod interface %+v", s)
	}
	// A retried ADD returns the same result and allocates nothing new.
	raw2, err := a.Handle(ctx, addReq("c1", "p1"))
	if err != nil || resultIP(t, raw2) != "10.244.0.2/32" || len(a.cp.all()) != 1 {
		t.Errorf("retried ADD: %s %v, %d endpoints", raw2, err, len(a.cp.all()))
	}
}

func TestAddErrorsNameTheCause(t *testing.T) {
	ctx := context.Background()
	// A /30 block holds one pod: the second fails and leaves nothing.
	a := newTestAgent(t, 30, pod("p1"), pod("p2"))
	if _, err := a.Handle(ctx, addReq("c1", "p1")); err != nil {
		t.Fatal(err)
	}
	_, err := a.Handle(ctx, addReq("c2", "p2"))
	var ce *cniError
	if !errors.As(err, &ce) || ce.code != errNoAddress || !strings.Contains(err.Error(), "network default has no free address on node n1") {
		t.Errorf("full block: %v", err)
	}
	if len(a.cp.all()) != 1 || len(a.dp.eps) != 1 || len(a.node.pods) != 1 {
		t.Errorf("failed ADD left state: %d endpoints, %d map entries, %d interfaces", len(a.cp.all()), len(a.dp.eps), len(a.node.pods))
	}

	// Without a matching policy the pod is named in the error and an Event.
	b := newTestAgent(t, 29, pod("p3"))
	if err := b.c.Delete(ctx, &lacev1.NetworkBindingPolicy{ObjectMeta: metav1.ObjectMeta{Name: "default"}}); err != nil {
		t.Fatal(err)
	}
	_, err = b.Handle(ctx, addReq("c3", "p3"))
	if !errors.As(err, &ce) || ce.code != errNoBinding || !strings.Contains(err.Error(), "no NetworkBindingPolicy matches pod default/p3") {
		t.Errorf("unbound pod: %v", err)
	}
	select {
	case ev := <-b.rec.Events:
		if !strings.Contains(ev, "NoNetworkBinding") {
			t.Errorf("event %q", ev)
		}
	default:
		t.Error("no event for the unbound pod")
	}
}

func TestDelReleasesAndIsIdempotent(t *testing.T) {
	a := newTestAgent(t, 29, pod("p1"), pod("p2"))
	ctx := context.Background()
	if _, err := a.Handle(ctx, addReq("c1", "p1")); err != nil {
		t.Fatal(err)
	}
	del := addReq("c1", "p1")
	del.Command = "DEL"
	if _, err := a.Handle(ctx, del); err != nil {
		t.Fatal(err)
	}
	// The underlay program stays; nothing of the pod does.
	if pods, _ := a.dp.PinnedPodLinks(); len(a.cp.all()) != 0 || len(a.dp.eps) != 0 || len(a.dp.ports) != 0 || len(pods) != 0 || len(a.node.pods) != 0 {
		t.Errorf("DEL left state: cp %v eps %v ports %v attached %v pods %v", a.cp.all(), a.dp.eps, a.dp.ports, a.dp.attached, a.node.pods)
	}
	// Its flows are forgotten once its port's programs are detached, so
	// that no packet of it makes a new one after.
	if len(a.dp.forgotten) != 1 || a.dp.attachedAtForget != 0 {
		t.Errorf("flows forgotten of %v with %d interfaces still attached", a.dp.forgotten, a.dp.attachedAtForget)
	}
	if _, err := a.Handle(ctx, del); err != nil {
		t.Errorf("second DEL: %v", err)
	}
	// The released address is handed out again.
	raw, err := a.Handle(ctx, addReq("c2", "p2"))
	if err != nil || resultIP(t, raw) != "10.244.0.2/32" {
		t.Errorf("ADD after DEL: %s %v", raw, err)
	}
}

func TestGoneAndUnlistedEndpointsAreCollected(t *testing.T) {
	a := newTestAgent(t, 29, pod("p1"), pod("p2"), pod("p3"))
	ctx := context.Background()
	for _, c := range [][2]string{{"c1", "p1"}, {"c2", "p2"}, {"c3", "p3"}} {
		if _, err := a.Handle(ctx, addReq(c[0], c[1])); err != nil {
			t.Fatal(err)
		}
	}
	// p1 is deleted while the agent is not looking.
	if err := a.c.Delete(ctx, pod("p1")); err != nil {
		t.Fatal(err)
	}
	if err := a.CollectEndpoints(ctx); err != nil {
		t.Fatal(err)
	}
	if _, ok := a.cp.get("c1"); ok {
		t.Error("endpoint of the deleted pod survived")
	}
	// GC keeps only what the runtime lists.
	gc := cniapi.Request{Command: "GC", Config: json.RawMessage(`{"cni.dev/valid-attachments":[{"containerID":"c2","ifname":"eth0"}]}`)}
	if _, err := a.Handle(ctx, gc); err != nil {
		t.Fatal(err)
	}
	if all := a.cp.all(); len(all) != 1 || all[0].ContainerID != "c2" || len(a.dp.eps) != 1 || len(a.node.pods) != 1 {
		t.Errorf("after GC: %+v, %d map entries, %d interfaces", all, len(a.dp.eps), len(a.node.pods))
	}
}

// TestResultEveryCNIVersion renders an ADD result in every version lace-cni
// announces, as the runtime's config asks.
func TestResultEveryCNIVersion(t *testing.T) {
	a := &Server{}
	e := Endpoint{ContainerID: "c1", IfName: "eth0", NetNS: "/run/netns/x", HostIf: "lace0123456789a",
		HostMAC: "02:00:00:00:00:01", PodMAC: "02:00:00:00:00:02",
		Addrs:    []netip.Addr{netip.MustParseAddr("10.1.0.2"), netip.MustParseAddr("fd00::2")},
		Gateways: []netip.Addr{netip.MustParseAddr("10.1.0.1"), netip.MustParseAddr("fd00::1")}}
	for _, v := range []string{"0.4.0", "1.0.0", "1.1.0"} {
		raw, err := a.result(v, e)
		if err != nil {
			t.Fatalf("%s: %v", v, err)
		}
		var r struct {
			CNIVersion string `json:"cniVersion"`
			IPs        []struct {
				Address string `json:"address"`
				Gateway string `json:"gateway"`
			} `json:"ips"`
			Interfaces []struct {
				Name    string `json:"name"`
				Sandbox string `json:"sandbox"`
			} `json:"interfaces"`
		}
		if err := json.Unmarshal(raw, &r); err != nil {
			t.Fatalf("%s: %v", v, err)
		}
		if r.CNIVersion != v || len(r.IPs) != 2 || r.IPs[0].Address != "10.1.0.2/32" || r.IPs[1].Gateway != "fd00::1" ||
			len(r.Interfaces) != 2 || r.Interfaces[1].Sandbox != "/run/netns/x" {
			t.Errorf("%s: result %s", v, raw)
		}
	}
}

// TestConcurrentAddsShareSyncs: pods added at once are programmed by a few
// syncs of the one applier, not one write path each, and all of them are
// in the data plane when their ADDs return.
func TestConcurrentAddsShareSyncs(t *testing.T) {
	var objs []client.Object
	for i := range 8 {
		objs = append(objs, pod(fmt.Sprintf("p%d", i)))
	}
	a := newTestAgent(t, 26, objs...)
	var syncs atomic.Int32
	gate := make(chan struct{})
	ap := applier.New(func() error {
		<-gate
		syncs.Add(1)
		return a.SyncEntries()
	}, nil, 0)
	a.sync.applier = ap
	go func() { _ = ap.Run(t.Context()) }()
	var wg sync.WaitGroup
	for i := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if _, err := a.Handle(context.Background(), addReq(fmt.Sprintf("c%d", i), fmt.Sprintf("p%d", i))); err != nil {
				t.Error(err)
			}
		}()
	}
	// Let the first sync through once most ADDs are waiting on the applier.
	for deadline := time.Now().Add(3 * time.Second); time.Now().Before(deadline); time.Sleep(time.Millisecond) {
		if ap.Waiting() >= 6 {
			break
		}
	}
	close(gate)
	wg.Wait()
	if got := syncs.Load(); got > 4 {
		t.Errorf("%d syncs for 8 concurrent ADDs, want the waiting ones served together (at most 4)", got)
	}
	if pods, _ := a.dp.PinnedPodLinks(); len(a.dp.eps) != 8 || len(a.dp.ports) != 8 || len(pods) != 8 {
		t.Errorf("after the ADDs: %d endpoints, %d ports, %d programs; want 8 each", len(a.dp.eps), len(a.dp.ports), len(pods))
	}
}

// TestStatusNamesTheProblem: CNI STATUS answers 50 until the data plane
// is programmed, 51 with the health's reason when the node cannot carry
// pod traffic, and success otherwise.
func TestStatusNamesTheProblem(t *testing.T) {
	a := newTestAgent(t, 29)
	status := cniapi.Request{Command: "STATUS"}
	var ce *cniError
	if _, err := a.Handle(context.Background(), status); !errors.As(err, &ce) || ce.code != errUnavailable {
		t.Errorf("STATUS before the first apply: %v, want code %d", err, errUnavailable)
	}
	a.sync.applied = true
	if _, err := a.Handle(context.Background(), status); err != nil {
		t.Errorf("STATUS of a working node: %v", err)
	}
	a.health.problem, a.health.detail = lacev1.ReasonNoIPv6Underlay, "eth0 has no global IPv6 address"
	_, err := a.Handle(context.Background(), status)
	if !errors.As(err, &ce) || ce.code != errLimitedConnectivity || !strings.Contains(err.Error(), lacev1.ReasonNoIPv6Underlay) {
		t.Errorf("STATUS: %v, want code %d naming %s", err, errLimitedConnectivity, lacev1.ReasonNoIPv6Underlay)
	}
}

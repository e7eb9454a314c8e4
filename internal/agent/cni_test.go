package agent

import (
	"context"
	"encoding/json"
	"errors"
	"net/netip"
	"strings"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	lacev1 "github.com/lace-cni/lace/api/v1alpha1"
	"github.com/lace-cni/lace/internal/datapath"
	"github.com/lace-cni/lace/internal/model"
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
	raw, err := a.handle(ctx, addReq("c1", "p1"))
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
	raw2, err := a.handle(ctx, addReq("c1", "p1"))
	if err != nil || resultIP(t, raw2) != "10.244.0.2/32" || len(a.cp.all()) != 1 {
		t.Errorf("retried ADD: %s %v, %d endpoints", raw2, err, len(a.cp.all()))
	}
}

func TestAddErrorsNameTheCause(t *testing.T) {
	ctx := context.Background()
	// A /30 block holds one pod: the second fails and leaves nothing.
	a := newTestAgent(t, 30, pod("p1"), pod("p2"))
	if _, err := a.handle(ctx, addReq("c1", "p1")); err != nil {
		t.Fatal(err)
	}
	_, err := a.handle(ctx, addReq("c2", "p2"))
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
	_, err = b.handle(ctx, addReq("c3", "p3"))
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
	if _, err := a.handle(ctx, addReq("c1", "p1")); err != nil {
		t.Fatal(err)
	}
	del := addReq("c1", "p1")
	del.Command = "DEL"
	if _, err := a.handle(ctx, del); err != nil {
		t.Fatal(err)
	}
	// The underlay program stays; nothing of the pod does.
	if pods, _ := a.dp.PinnedPodLinks(); len(a.cp.all()) != 0 || len(a.dp.eps) != 0 || len(a.dp.ports) != 0 || len(pods) != 0 || len(a.node.pods) != 0 {
		t.Errorf("DEL left state: cp %v eps %v ports %v attached %v pods %v", a.cp.all(), a.dp.eps, a.dp.ports, a.dp.attached, a.node.pods)
	}
	if _, err := a.handle(ctx, del); err != nil {
		t.Errorf("second DEL: %v", err)
	}
	// The released address is handed out again.
	raw, err := a.handle(ctx, addReq("c2", "p2"))
	if err != nil || resultIP(t, raw) != "10.244.0.2/32" {
		t.Errorf("ADD after DEL: %s %v", raw, err)
	}
}

func TestGoneAndUnlistedEndpointsAreCollected(t *testing.T) {
	a := newTestAgent(t, 29, pod("p1"), pod("p2"), pod("p3"))
	ctx := context.Background()
	for _, c := range [][2]string{{"c1", "p1"}, {"c2", "p2"}, {"c3", "p3"}} {
		if _, err := a.handle(ctx, addReq(c[0], c[1])); err != nil {
			t.Fatal(err)
		}
	}
	// p1 is deleted while the agent is not looking.
	if err := a.c.Delete(ctx, pod("p1")); err != nil {
		t.Fatal(err)
	}
	if err := a.collectEndpoints(ctx); err != nil {
		t.Fatal(err)
	}
	if _, ok := a.cp.get("c1"); ok {
		t.Error("endpoint of the deleted pod survived")
	}
	// GC keeps only what the runtime lists.
	gc := cniapi.Request{Command: "GC", Config: json.RawMessage(`{"cni.dev/valid-attachments":[{"containerID":"c2","ifname":"eth0"}]}`)}
	if _, err := a.handle(ctx, gc); err != nil {
		t.Fatal(err)
	}
	if all := a.cp.all(); len(all) != 1 || all[0].ContainerID != "c2" || len(a.dp.eps) != 1 || len(a.node.pods) != 1 {
		t.Errorf("after GC: %+v, %d map entries, %d interfaces", all, len(a.dp.eps), len(a.node.pods))
	}
}

func TestApplyTouchesOnlyTheDifference(t *testing.T) {
	a := newTestAgent(t, 29)
	st := model.NodeState{
		Locator:  netip.MustParsePrefix("fd1a:ce::/64"),
		Networks: []datapath.Network{{ID: 1}, {ID: 2, Anonymous: true}},
		Nodes:    []netip.Addr{netip.MustParseAddr("fd00:30::11"), netip.MustParseAddr("fd00:30::12")},
		LocatorRoutes: []model.LocatorRoute{{Node: "n2", Locator: netip.MustParsePrefix("fd1a:ce:0:1::/64"),
			Via: netip.MustParseAddr("fd00:30::12")}},
	}
	st.Routes = a.state.Routes
	if err := a.apply(st); err != nil {
		t.Fatal(err)
	}
	if len(a.dp.nets) != 2 || len(a.dp.nodes) != 2 || len(a.dp.routes) != len(st.Routes) || len(a.node.routes) != 1 || !a.dp.attached["underlay"] {
		t.Fatalf("first apply: nets %v nodes %v routes %v locator routes %v", a.dp.nets, a.dp.nodes, a.dp.routes, a.node.routes)
	}
	writes, routeWrites := a.dp.writes, a.node.routeWrites
	if err := a.apply(st); err != nil {
		t.Fatal(err)
	}
	// The same state again touches nothing: no map entry, no config, no route.
	if got, gotRoutes := a.dp.writes-writes, a.node.routeWrites-routeWrites; got != 0 || gotRoutes != 0 {
		t.Errorf("second apply of the same state made %d map writes and %d route writes, want none", got, gotRoutes)
	}
	st.Networks = st.Networks[:1]
	st.LocatorRoutes = nil
	writes = a.dp.writes
	if err := a.apply(st); err != nil {
		t.Fatal(err)
	}
	if got := a.dp.writes - writes; got != 1 || len(a.dp.nets) != 1 || len(a.node.routes) != 0 {
		t.Errorf("removing a network made %d writes (want 1 delete); nets %v, locator routes %v", got, a.dp.nets, a.node.routes)
	}
}

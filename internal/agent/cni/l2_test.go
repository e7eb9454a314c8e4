package cni

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	lacev1 "github.com/lace-cni/lace/api/v1alpha1"
	"github.com/lace-cni/lace/internal/datapath"
)

// The l2 network of these tests: "storage", ID 7, both families; pods
// labelled net=storage are bound to it, the others to the default l3
// network.
const storageID = 7

var (
	storageGwMAC = net.HardwareAddr{0x0a, 0x5a, 0, 0, 0, storageID} // ipam.L2GatewayMAC(7)
	storageGw4   = netip.MustParseAddr("10.50.0.1")
	storageGw6   = netip.MustParseAddr("fd00:50::1")
)

func storageObjects() []client.Object {
	return []client.Object{
		&lacev1.Network{ObjectMeta: metav1.ObjectMeta{Name: "storage"},
			Spec: lacev1.NetworkSpec{Type: lacev1.NetworkTypeL2,
				IPv4Subnet: &lacev1.Subnet{Prefix: "10.50.0.0/24"}, IPv6Subnet: &lacev1.Subnet{Prefix: "fd00:50::/64"}},
			Status: lacev1.NetworkStatus{ID: storageID}},
		&lacev1.NetworkBindingPolicy{ObjectMeta: metav1.ObjectMeta{Name: "storage"},
			Spec: lacev1.NetworkBindingPolicySpec{Network: "storage", Priority: 10,
				Selector: &metav1.LabelSelector{MatchLabels: map[string]string{"net": "storage"}}}},
	}
}

func l2pod(name string) *corev1.Pod {
	p := pod(name)
	p.Labels = map[string]string{"net": "storage"}
	return p
}

// controllerAnswers plays lace-controller for pod name's NetworkEndpoint:
// once the agent has created it as the controller expects (labels, owner,
// spec without addresses), set(status) is written to its status. It
// returns a channel closed once written, or with the error the
// endpoint's shape was refused for.
func controllerAnswers(t *testing.T, c client.Client, name string, set func(*lacev1.NetworkEndpointStatus)) <-chan error {
	t.Helper()
	done := make(chan error, 1)
	go func() {
		defer close(done)
		ctx := context.Background()
		for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
			var ne lacev1.NetworkEndpoint
			if err := c.Get(ctx, client.ObjectKey{Namespace: "default", Name: name}, &ne); err != nil ||
				ne.Labels[lacev1.LabelPodUID] != "uid-"+name {
				continue // not yet, or a namesake's left over
			}
			if ne.Labels[lacev1.LabelNode] != "n1" || ne.Labels[lacev1.LabelNetwork] != "storage" ||
				ne.Spec.Network != "storage" || ne.Spec.Node != "n1" || len(ne.Spec.Addresses) != 0 || ne.Spec.Interface != "eth0" ||
				len(ne.OwnerReferences) != 1 || string(ne.OwnerReferences[0].UID) != "uid-"+name {
				done <- fmt.Errorf("NetworkEndpoint %s is not what lace-controller acts on: labels %v spec %+v owners %v", name, ne.Labels, ne.Spec, ne.OwnerReferences)
				return
			}
			set(&ne.Status)
			if err := c.Status().Update(ctx, &ne); err != nil {
				done <- err
			}
			return
		}
		done <- fmt.Errorf("no NetworkEndpoint %s created", name)
	}()
	return done
}

func allocated(addrs []string, mac string) func(*lacev1.NetworkEndpointStatus) {
	return func(st *lacev1.NetworkEndpointStatus) {
		for _, a := range addrs {
			st.Addresses = append(st.Addresses, lacev1.IPAddress(a))
		}
		st.MAC = lacev1.MACAddress(mac)
		meta.SetStatusCondition(&st.Conditions, metav1.Condition{Type: lacev1.ConditionAddressesAllocated, Status: metav1.ConditionTrue,
			Reason: "Allocated", Message: "assigned"})
	}
}

type cniResult struct {
	Interfaces []struct {
		Name    string `json:"name"`
		Mac     string `json:"mac"`
		Sandbox string `json:"sandbox"`
	} `json:"interfaces"`
	IPs []struct {
		Address string `json:"address"`
		Gateway string `json:"gateway"`
	} `json:"ips"`
}

// TestL2AddWaitsForTheController: ADD of a pod of an l2 network creates
// its NetworkEndpoint as lace-controller expects it, waits for the
// controller's assignment, and attaches the pod with it: on-link
// addresses, the assigned MAC, the gateway's MAC on the host side, MTU
// 1446, from_l2 on its port, its neighbours and FDB entries with the
// anycast gateway's. The NetworkEndpoint's spec then records the
// assignment, its status kept. An l3 pod beside it is attached as ever.
func TestL2AddWaitsForTheController(t *testing.T) {
	a := newTestAgent(t, 29, append(storageObjects(), l2pod("vm1"), pod("web"))...)
	ctx := context.Background()
	podMAC := "0a:58:0a:32:00:05"
	answered := controllerAnswers(t, a.c, "vm1", allocated([]string{"10.50.0.5", "fd00:50::5"}, podMAC))
	raw, err := a.Handle(ctx, addReq("c1", "vm1"))
	if err != nil {
		t.Fatal(err)
	}
	if err := <-answered; err != nil {
		t.Fatal(err)
	}
	var r cniResult
	if err := json.Unmarshal(raw, &r); err != nil {
		t.Fatal(err)
	}
	if len(r.IPs) != 2 || r.IPs[0].Address != "10.50.0.5/24" || r.IPs[0].Gateway != "10.50.0.1" ||
		r.IPs[1].Address != "fd00:50::5/64" || r.IPs[1].Gateway != "fd00:50::1" {
		t.Errorf("result IPs %+v, want the subnets' prefix lengths and the gateways", r.IPs)
	}
	if len(r.Interfaces) != 2 || r.Interfaces[0].Mac != storageGwMAC.String() || r.Interfaces[1].Mac != podMAC {
		t.Errorf("result interfaces %+v, want the gateway's and the assigned MAC", r.Interfaces)
	}
	e, ok := a.cp.get("c1")
	if !ok || !e.Ready || !e.L2 || e.NetID != storageID || e.PodMAC != podMAC || e.HostMAC != storageGwMAC.String() ||
		e.GatewayMAC != storageGwMAC.String() || !slices.Equal(e.PrefixBits, []int{24, 64}) {
		t.Fatalf("checkpoint %+v", e)
	}
	spec := a.node.pods[e.HostIf]
	if !spec.L2 || spec.MTU != 1446 || !slices.Equal(spec.PrefixBits, []int{24, 64}) || spec.PodMAC.String() != podMAC ||
		spec.HostMAC.String() != storageGwMAC.String() || !slices.Equal(spec.Gateways, []netip.Addr{storageGw4, storageGw6}) {
		t.Errorf("pod interface %+v", spec)
	}
	// The data plane: from_l2 on the port, the pod's endpoints (routed
	// traffic to it), its neighbours and FDB entry, and the gateway's.
	a.dp.mu.Lock()
	idx := uint32(e.HostIfIndex)
	if !a.dp.attached[e.HostIf] || !a.dp.l2[e.HostIf] || !a.dp.ports[idx].L2 || a.dp.ports[idx].NetID != storageID {
		t.Errorf("port %+v attached %v from_l2 %v", a.dp.ports[idx], a.dp.attached[e.HostIf], a.dp.l2[e.HostIf])
	}
	if ep := a.dp.eps[epKey(storageID, netip.MustParseAddr("fd00:50::5"))]; ep.IfIndex != idx || ep.PodMAC.String() != podMAC || ep.HostMAC.String() != storageGwMAC.String() {
		t.Errorf("endpoint %+v", ep)
	}
	pm, _ := net.ParseMAC(podMAC)
	wantNeigh := []datapath.L2Neighbor{
		{NetID: storageID, Addr: netip.MustParseAddr("10.50.0.5"), MAC: pm},
		{NetID: storageID, Addr: netip.MustParseAddr("fd00:50::5"), MAC: pm},
		{NetID: storageID, Addr: storageGw4, MAC: storageGwMAC, Router: true},
		{NetID: storageID, Addr: storageGw6, MAC: storageGwMAC, Router: true},
	}
	wantFDB := []datapath.FDBEntry{{NetID: storageID, MAC: pm, IfIndex: idx}, {NetID: storageID, MAC: storageGwMAC, Gateway: true}}
	if fmt.Sprint(a.dp.neigh) != fmt.Sprint(wantNeigh) || fmt.Sprint(a.dp.fdb) != fmt.Sprint(wantFDB) {
		t.Errorf("SyncL2\n neigh %v\n want  %v\n fdb %v\n want %v", a.dp.neigh, wantNeigh, a.dp.fdb, wantFDB)
	}
	a.dp.mu.Unlock()

	// The spec records the assignment; the status stays the controller's.
	eventually(t, "NetworkEndpoint spec written", func() error {
		var ne lacev1.NetworkEndpoint
		if err := a.c.Get(ctx, client.ObjectKey{Namespace: "default", Name: "vm1"}, &ne); err != nil {
			return err
		}
		if fmt.Sprint(ne.Spec.Addresses) != "[10.50.0.5 fd00:50::5]" || ne.Spec.MAC != lacev1.MACAddress(podMAC) ||
			len(ne.Status.Addresses) != 2 || !meta.IsStatusConditionTrue(ne.Status.Conditions, lacev1.ConditionAddressesAllocated) {
			return fmt.Errorf("spec %+v status %+v", ne.Spec, ne.Status)
		}
		return nil
	})

	// An l3 pod beside it: as ever.
	raw, err = a.Handle(ctx, addReq("c2", "web"))
	if err != nil {
		t.Fatal(err)
	}
	if ip := resultIP(t, raw); ip != "10.244.0.2/32" {
		t.Errorf("l3 pod got %s", ip)
	}
	e2, _ := a.cp.get("c2")
	a.dp.mu.Lock()
	defer a.dp.mu.Unlock()
	if s := a.node.pods[e2.HostIf]; s.L2 || s.MTU != 1460 || s.PrefixBits != nil || e2.L2 || a.dp.l2[e2.HostIf] || a.dp.ports[uint32(e2.HostIfIndex)].L2 {
		t.Errorf("l3 pod: spec %+v endpoint %+v from_l2 %v", s, e2, a.dp.l2[e2.HostIf])
	}
	if len(a.dp.neigh) != 4 || len(a.dp.fdb) != 2 {
		t.Errorf("the l3 pod changed the l2 tables: %v %v", a.dp.neigh, a.dp.fdb)
	}
}

// TestL2AddRefusedByTheController: a False AddressesAllocated fails ADD at
// once with lace-controller's message, naming the network, and a Warning
// Event on the pod; nothing is left on the node.
func TestL2AddRefusedByTheController(t *testing.T) {
	a := newTestAgent(t, 29, append(storageObjects(), l2pod("vm1"))...)
	msg := "network storage has no free IPv4 address (10.50.0.0/24: all 253 assignable addresses are held)"
	answered := controllerAnswers(t, a.c, "vm1", func(st *lacev1.NetworkEndpointStatus) {
		meta.SetStatusCondition(&st.Conditions, metav1.Condition{Type: lacev1.ConditionAddressesAllocated, Status: metav1.ConditionFalse,
			Reason: "SubnetExhausted", Message: msg})
	})
	start := time.Now()
	_, err := a.Handle(context.Background(), addReq("c1", "vm1"))
	if err := <-answered; err != nil {
		t.Fatal(err)
	}
	var ce *cniError
	if !errors.As(err, &ce) || ce.code != errNoAddress || !strings.Contains(err.Error(), "l2 network storage") || !strings.Contains(err.Error(), msg) {
		t.Fatalf("ADD: %v, want code %d naming the network and the controller's message", err, errNoAddress)
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Errorf("refusal took %v: ADD should fail as soon as the condition says so", d)
	}
	select {
	case ev := <-a.rec.Events:
		if !strings.Contains(ev, "Warning NoFreeAddress") || !strings.Contains(ev, "SubnetExhausted") {
			t.Errorf("event %q", ev)
		}
	default:
		t.Error("no Event on the pod")
	}
	if len(a.cp.all()) != 0 || len(a.node.pods) != 0 || len(a.dp.eps) != 0 {
		t.Errorf("refused ADD left state: %v %v %v", a.cp.all(), a.node.pods, a.dp.eps)
	}
}

// TestL2AddTimesOutThenAdopts: with no answer in time ADD asks the runtime
// to try again, leaving the NetworkEndpoint; the retry adopts it (the same
// object, so lace-controller's assignment holds) and uses the assignment
// made meanwhile. --mtu gives l2 ports 14 bytes less.
func TestL2AddTimesOutThenAdopts(t *testing.T) {
	old := l2AddressWait
	l2AddressWait = 300 * time.Millisecond
	t.Cleanup(func() { l2AddressWait = old })
	a := newTestAgent(t, 29, append(storageObjects(), l2pod("vm1"))...)
	a.opts.MTU = 1400
	ctx := context.Background()
	_, err := a.Handle(ctx, addReq("c1", "vm1"))
	var ce *cniError
	if !errors.As(err, &ce) || ce.code != errTryAgainLater || !strings.Contains(err.Error(), "storage") {
		t.Fatalf("ADD without an answer: %v, want code %d", err, errTryAgainLater)
	}
	var ne lacev1.NetworkEndpoint
	if err := a.c.Get(ctx, client.ObjectKey{Namespace: "default", Name: "vm1"}, &ne); err != nil {
		t.Fatalf("the NetworkEndpoint went with the timeout: %v", err)
	}
	uid := ne.UID
	allocated([]string{"10.50.0.9"}, "0a:58:0a:32:00:09")(&ne.Status)
	if err := a.c.Status().Update(ctx, &ne); err != nil {
		t.Fatal(err)
	}
	raw, err := a.Handle(ctx, addReq("c2", "vm1"))
	if err != nil {
		t.Fatal(err)
	}
	if ip := resultIP(t, raw); ip != "10.50.0.9/24" {
		t.Errorf("retry got %s", ip)
	}
	if err := a.c.Get(ctx, client.ObjectKey{Namespace: "default", Name: "vm1"}, &ne); err != nil || ne.UID != uid {
		t.Errorf("the NetworkEndpoint was replaced (%v): lace-controller would assign again", err)
	}
	e, _ := a.cp.get("c2")
	if s := a.node.pods[e.HostIf]; s.MTU != 1386 {
		t.Errorf("l2 port MTU %d with --mtu 1400, want 1386", s.MTU)
	}
}

// TestL2StaleEndpointReplacedAndDel: a namesake pod's leftover
// NetworkEndpoint is replaced (not adopted); DEL removes the port, the
// NetworkEndpoint (lace-controller then releases the addresses) and, with
// the network's last local port, the gateway's entries.
func TestL2StaleEndpointReplacedAndDel(t *testing.T) {
	stale := &lacev1.NetworkEndpoint{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "vm1",
		Labels: map[string]string{lacev1.LabelPodUID: "uid-old", lacev1.LabelNode: "n1", lacev1.LabelNetwork: "storage"}},
		Spec:   lacev1.NetworkEndpointSpec{Network: "storage", Node: "n1", Addresses: []lacev1.IPAddress{"10.50.0.3"}},
		Status: lacev1.NetworkEndpointStatus{Addresses: []lacev1.IPAddress{"10.50.0.3"}, MAC: "0a:58:0a:32:00:03"}}
	a := newTestAgent(t, 29, append(storageObjects(), l2pod("vm1"), stale)...)
	ctx := context.Background()
	answered := controllerAnswers(t, a.c, "vm1", allocated([]string{"10.50.0.4"}, "0a:58:0a:32:00:04"))
	raw, err := a.Handle(ctx, addReq("c1", "vm1"))
	if err != nil {
		t.Fatal(err)
	}
	if err := <-answered; err != nil {
		t.Fatal(err)
	}
	if ip := resultIP(t, raw); ip != "10.50.0.4/24" {
		t.Errorf("got %s, not the fresh assignment", ip)
	}
	del := addReq("c1", "vm1")
	del.Command = "DEL"
	if _, err := a.Handle(ctx, del); err != nil {
		t.Fatal(err)
	}
	var ne lacev1.NetworkEndpoint
	if err := a.c.Get(ctx, client.ObjectKey{Namespace: "default", Name: "vm1"}, &ne); err == nil {
		t.Errorf("NetworkEndpoint survived DEL: %+v", ne)
	}
	a.dp.mu.Lock()
	defer a.dp.mu.Unlock()
	if len(a.dp.neigh) != 0 || len(a.dp.fdb) != 0 || len(a.dp.ports) != 0 || len(a.cp.all()) != 0 {
		t.Errorf("DEL left neigh %v fdb %v ports %v", a.dp.neigh, a.dp.fdb, a.dp.ports)
	}
}

// TestOldCheckpointIsL3: a record written before l2 networks reads as an
// l3 endpoint.
func TestOldCheckpointIsL3(t *testing.T) {
	var e Endpoint
	old := `{"containerID":"c1","ifName":"eth0","netns":"/x","podNamespace":"default","podName":"p","podUID":"u","network":"default",
	"netID":1,"addrs":["10.244.0.2"],"gateways":["10.244.0.1"],"hostIf":"lace0","hostIfIndex":5,"hostMAC":"02:00:00:00:00:01","podMAC":"02:00:00:00:00:02","ready":true}`
	if err := json.Unmarshal([]byte(old), &e); err != nil || e.L2 || e.PrefixBits != nil || e.GatewayMAC != "" || !e.Ready {
		t.Errorf("old record: %+v %v", e, err)
	}
	if n, f := l2Entries([]Endpoint{e}); len(n) != 0 || len(f) != 0 {
		t.Errorf("an l3 endpoint has l2 entries: %v %v", n, f)
	}
}

func eventually(t *testing.T, what string, f func() error) {
	t.Helper()
	var err error
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		if err = f(); err == nil {
			return
		}
	}
	t.Fatalf("%s: %v", what, err)
}

package cni

import (
	"context"
	"errors"
	"net/netip"
	"path/filepath"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	lacev1 "github.com/lace-cni/lace/api/v1alpha1"
	"github.com/lace-cni/lace/internal/model"
)

func TestPickAddr(t *testing.T) {
	b := netip.MustParsePrefix("10.0.0.0/30")
	a, ok := pickAddr(b, nil)
	if !ok || a.String() != "10.0.0.2" {
		t.Fatalf("first = %s %v, want 10.0.0.2", a, ok)
	}
	if _, ok := pickAddr(b, map[netip.Addr]bool{a: true}); ok {
		t.Fatal("a /30 has one pod address; got a second")
	}
	v6 := netip.MustParsePrefix("fd00::/126")
	got := []string{}
	used := map[netip.Addr]bool{}
	for {
		a, ok := pickAddr(v6, used)
		if !ok {
			break
		}
		used[a] = true
		got = append(got, a.String())
	}
	if len(got) != 2 || got[0] != "fd00::2" || got[1] != "fd00::3" {
		t.Fatalf("v6 addresses %v", got)
	}
}

// TestOverlappingNetworksNeverShareAnAddressOnTheNode: two networks with
// the same subnet and the same block on n1 hand out addresses from one
// node-wide pool, so the node's route to each pod address (kubelet probes)
// names exactly one pod; a released address is free for either network,
// the node's own address is never given out, and the reservation survives
// an agent restart (the checkpoint).
func TestOverlappingNetworksNeverShareAnAddressOnTheNode(t *testing.T) {
	green := &lacev1.Network{ObjectMeta: metav1.ObjectMeta{Name: "green"},
		Spec: lacev1.NetworkSpec{Type: lacev1.NetworkTypeL3,
			IPv4Subnet: &lacev1.Subnet{Prefix: "10.244.0.0/16", HostLocalPrefixLength: ptr.To[int32](29)}},
		Status: lacev1.NetworkStatus{ID: 2}}
	greenAlloc := &lacev1.Allocation{ObjectMeta: metav1.ObjectMeta{Name: "green.n1"},
		Spec: lacev1.AllocationSpec{Network: "green", Node: "n1", Prefixes: []lacev1.CIDR{"10.244.0.0/29"}}}
	greenPol := &lacev1.NetworkBindingPolicy{ObjectMeta: metav1.ObjectMeta{Name: "green"},
		Spec: lacev1.NetworkBindingPolicySpec{Network: "green", Priority: 10,
			Selector: &metav1.LabelSelector{MatchLabels: map[string]string{"net": "green"}}}}
	greenPod := func(name string) *corev1.Pod {
		p := pod(name)
		p.Labels = map[string]string{"net": "green"}
		return p
	}
	a := newTestAgent(t, 29, green, greenAlloc, greenPol,
		pod("d1"), pod("d2"), pod("d3"), greenPod("g1"), greenPod("g2"), greenPod("g3"), greenPod("g4"))
	var def lacev1.Network
	if err := a.c.Get(context.Background(), client.ObjectKey{Name: "default"}, &def); err != nil {
		t.Fatal(err)
	}
	var defAlloc lacev1.Allocation
	if err := a.c.Get(context.Background(), client.ObjectKey{Name: "default.n1"}, &defAlloc); err != nil {
		t.Fatal(err)
	}
	a.sync.state = model.ComputeNode(model.NodeInput{Node: "n1", Networks: []lacev1.Network{def, *green},
		Allocations: []lacev1.Allocation{defAlloc, *greenAlloc}})
	// The node's own address happens to lie in the block.
	a.sync.own = []netip.Addr{netip.MustParseAddr("10.244.0.4")}

	ctx := context.Background()
	add := func(container, podName string) (string, error) {
		t.Helper()
		raw, err := a.Handle(ctx, addReq(container, podName))
		if err != nil {
			return "", err
		}
		return resultIP(t, raw), nil
	}
	// The /29 has five pod addresses (.2 to .6); .4 is the node's.
	for _, step := range []struct{ container, pod, network, want string }{
		{"c-d1", "d1", "default", "10.244.0.2/32"},
		{"c-g1", "g1", "green", "10.244.0.3/32"}, // not .2: d1 holds it on this node
		{"c-g2", "g2", "green", "10.244.0.5/32"}, // not .4: the node's own
		{"c-d2", "d2", "default", "10.244.0.6/32"},
	} {
		got, err := add(step.container, step.pod)
		if err != nil {
			t.Fatalf("ADD %s: %v", step.pod, err)
		}
		if got != step.want {
			t.Errorf("%s (network %s) got %s, want %s", step.pod, step.network, got, step.want)
		}
		if e, _ := a.cp.get(step.container); e.Network != step.network {
			t.Errorf("%s is in network %q, want %s", step.pod, e.Network, step.network)
		}
	}
	// Every address is taken on the node, in either network.
	var ce *cniError
	if _, err := add("c-g3", "g3"); !errors.As(err, &ce) || ce.code != errNoAddress {
		t.Errorf("ADD into a node whose block is used up by the other network: %v, want no free address", err)
	}

	// The agent restarts: its checkpoint still holds every reservation.
	cp, err := loadCheckpoint(filepath.Dir(a.cp.path))
	if err != nil {
		t.Fatal(err)
	}
	a.cp = cp
	// d1 goes; its address is free for the other network.
	del := addReq("c-d1", "d1")
	del.Command = "DEL"
	if _, err := a.Handle(ctx, del); err != nil {
		t.Fatal(err)
	}
	if got, err := add("c-g3", "g3"); err != nil || got != "10.244.0.2/32" {
		t.Errorf("green after default released .2: %s %v, want 10.244.0.2/32", got, err)
	}
	if _, err := add("c-g4", "g4"); !errors.As(err, &ce) || ce.code != errNoAddress {
		t.Errorf("ADD after the restart into a full node: %v, want no free address", err)
	}

	// No two endpoints on the node share an address, in the checkpoint or
	// in the data plane.
	seen := map[netip.Addr]string{}
	for _, e := range a.cp.all() {
		for _, ad := range e.Addrs {
			if other, dup := seen[ad]; dup {
				t.Errorf("address %s held by %s and %s/%s", ad, other, e.Network, e.PodName)
			}
			seen[ad] = e.Network + "/" + e.PodName
		}
	}
	byAddr := map[netip.Addr]uint32{}
	for _, ep := range a.dp.eps {
		if id, dup := byAddr[ep.Addr]; dup {
			t.Errorf("data plane holds %s in networks %d and %d", ep.Addr, id, ep.NetID)
		}
		byAddr[ep.Addr] = ep.NetID
	}
	if len(seen) != 4 || len(byAddr) != 4 {
		t.Errorf("%d checkpointed and %d programmed addresses, want 4", len(seen), len(byAddr))
	}
}

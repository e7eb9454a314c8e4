package nodesync

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"testing"

	"github.com/cilium/ebpf"
	"github.com/lace-cni/lace/internal/datapath"
	"github.com/lace-cni/lace/internal/model"
)

func TestApplyTouchesOnlyTheDifference(t *testing.T) {
	a := newTestSyncer(t, 29)
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
	// The locator route's next hop is kept resolved (managed neighbour).
	if len(a.node.hops) != 1 || a.node.hops[0] != netip.MustParseAddr("fd00:30::12") {
		t.Errorf("next hops kept resolved %v, want the locator route's fd00:30::12", a.node.hops)
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
	if len(a.node.hops) != 0 {
		t.Errorf("next hops kept resolved %v after the locator route went, want none", a.node.hops)
	}
	if got := a.dp.writes - writes; got != 1 || len(a.dp.nets) != 1 || len(a.node.routes) != 0 {
		t.Errorf("removing a network made %d writes (want 1 delete); nets %v, locator routes %v", got, a.dp.nets, a.node.routes)
	}
}

// TestSyncSurvivesNodeApplyFailure: the applier's sync answers for the
// pods' part only: a pod's ADD or DEL does not fail because another part
// of the node could not be applied (here the route to another node's
// locator); the failure stays the reconciler's to retry.
func TestSyncSurvivesNodeApplyFailure(t *testing.T) {
	a := newTestSyncer(t, 29)
	a.state.LocatorRoutes = []model.LocatorRoute{{Node: "n2", Locator: netip.MustParsePrefix("fd1a:ce:0:1::/64"),
		Via: netip.MustParseAddr("fd00:30::12")}}
	a.node.failRoutes = true
	if err := a.applier.Sync(context.Background()); err != nil {
		t.Fatalf("sync failed on an unrelated route: %v", err)
	}
	if a.pods.syncs == 0 {
		t.Error("the pods' entries were not synced")
	}
	a.mu.Lock()
	err := a.applyErr
	a.mu.Unlock()
	if err == nil {
		t.Error("the route failure was not kept for the reconciler")
	}
	// A next hop is kept resolved only for a route in place: one that
	// could not be installed (an address off the link) is not probed.
	if len(a.node.hops) != 0 {
		t.Errorf("next hops kept resolved %v, want none: their route was not installed", a.node.hops)
	}
}

// TestSyncPodsWritesPodsOnly: a CNI ADD's or DEL's sync writes the pods'
// entries and nothing else of the node: a route that would be written (and
// fail) by the full sync is not touched, and the reconciler's error is
// not overwritten.
func TestSyncPodsWritesPodsOnly(t *testing.T) {
	a := newTestSyncer(t, 29)
	a.state.LocatorRoutes = []model.LocatorRoute{{Node: "n2", Locator: netip.MustParsePrefix("fd1a:ce:0:1::/64"),
		Via: netip.MustParseAddr("fd00:30::12")}}
	a.node.failRoutes = true
	if err := a.SyncPods(context.Background()); err != nil {
		t.Fatalf("pods' sync: %v", err)
	}
	if a.pods.syncs != 1 {
		t.Errorf("the pods' entries were synced %d times, want 1", a.pods.syncs)
	}
	a.mu.Lock()
	err := a.applyErr
	a.mu.Unlock()
	if err != nil {
		t.Errorf("the pods' sync applied the node: %v", err)
	}
	if err := a.applier.Sync(context.Background()); err != nil {
		t.Fatalf("full sync failed on an unrelated route: %v", err)
	}
	a.mu.Lock()
	err = a.applyErr
	a.mu.Unlock()
	if err == nil || a.pods.syncs < 2 {
		t.Errorf("full sync: node error %v, pods synced %d times in all; want the route's error, and the pods' entries again", err, a.pods.syncs)
	}
}

// attachFailDP is a data plane on a kernel without tcx.
type attachFailDP struct{ *fakeDP }

func (attachFailDP) AttachUnderlay(string, string) error {
	return fmt.Errorf("attach tcx ingress eth0: %w", ebpf.ErrNotSupported)
}

// TestAttachFailureIsKept: a first apply that cannot attach the data plane
// fails, keeps why for the node's health and asks for a status report.
func TestAttachFailureIsKept(t *testing.T) {
	a := newTestSyncer(t, 29)
	kicks := 0
	a.Wire(a.pods, nil, func() { kicks++ })
	a.Syncer.dp = attachFailDP{a.dp}
	if err := a.apply(a.state); err == nil {
		t.Fatal("apply without tcx succeeded")
	}
	if err := a.AttachErr(); !errors.Is(err, ebpf.ErrNotSupported) || a.Applied() || a.Attached() {
		t.Errorf("attach error %v, applied %v", err, a.Applied())
	}
	if kicks != 1 {
		t.Errorf("%d status kicks, want 1", kicks)
	}
}

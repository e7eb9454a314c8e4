package agent

import (
	"context"
	"fmt"
	"net/netip"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/lace-cni/lace/internal/model"
)

// TestApplierCoalesces: requests that arrive while a sync runs are served
// together by the next one, and each caller sees a sync that started after
// it asked.
func TestApplierCoalesces(t *testing.T) {
	var runs atomic.Int32
	release := make(chan struct{})
	started := make(chan struct{}, 10)
	p := newApplier(func() error {
		runs.Add(1)
		started <- struct{}{}
		<-release
		return nil
	}, 0)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go p.Run(ctx)

	first := make(chan error, 1)
	go func() { first <- p.Sync(ctx) }()
	<-started // the first sync is running
	var wg sync.WaitGroup
	for range 20 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := p.Sync(ctx); err != nil {
				t.Error(err)
			}
		}()
	}
	// All twenty are queued behind the running sync before it ends.
	deadline := time.Now().Add(5 * time.Second)
	for {
		p.mu.Lock()
		n := len(p.pending)
		p.mu.Unlock()
		if n == 20 || time.Now().After(deadline) {
			break
		}
		time.Sleep(time.Millisecond)
	}
	close(release)
	if err := <-first; err != nil {
		t.Fatal(err)
	}
	wg.Wait()
	if got := runs.Load(); got != 2 {
		t.Errorf("%d syncs for 21 requests in two waves, want 2", got)
	}
}

// TestApplierStopsWaiters: a waiter is not left hanging when the applier
// stops.
func TestApplierStopsWaiters(t *testing.T) {
	p := newApplier(func() error { return nil }, time.Hour)
	ctx, cancel := context.WithCancel(context.Background())
	go p.Run(ctx)
	if err := p.Sync(context.Background()); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- p.Sync(context.Background()) }() // waits out minInterval
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(time.Millisecond) {
		p.mu.Lock()
		n := len(p.pending)
		p.mu.Unlock()
		if n == 1 {
			break
		}
	}
	cancel()
	select {
	case err := <-done:
		if err == nil {
			t.Error("a sync that never ran reported success")
		}
	case <-time.After(5 * time.Second):
		t.Fatal("waiter hangs after the applier stopped")
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
	ap := newApplier(func() error {
		<-gate
		syncs.Add(1)
		return a.syncDataplane()
	}, 0)
	a.applier = ap
	go func() { _ = ap.Run(t.Context()) }()
	var wg sync.WaitGroup
	for i := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if _, err := a.handle(context.Background(), addReq(fmt.Sprintf("c%d", i), fmt.Sprintf("p%d", i))); err != nil {
				t.Error(err)
			}
		}()
	}
	// Let the first sync through once most ADDs are waiting on the applier.
	for deadline := time.Now().Add(3 * time.Second); time.Now().Before(deadline); time.Sleep(time.Millisecond) {
		a.applier.mu.Lock()
		n := len(a.applier.pending)
		a.applier.mu.Unlock()
		if n >= 6 {
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

// TestAddSurvivesNodeApplyFailure: a pod's ADD does not fail because
// another part of the node could not be applied (here the route to another
// node's locator); the failure stays the reconciler's to retry.
func TestAddSurvivesNodeApplyFailure(t *testing.T) {
	a := newTestAgent(t, 29, pod("p1"))
	a.state.LocatorRoutes = []model.LocatorRoute{{Node: "n2", Locator: netip.MustParsePrefix("fd1a:ce:0:1::/64"),
		Via: netip.MustParseAddr("fd00:30::12")}}
	a.node.failRoutes = true
	if _, err := a.handle(context.Background(), addReq("c1", "p1")); err != nil {
		t.Fatalf("ADD failed on an unrelated route: %v", err)
	}
	if pods, _ := a.dp.PinnedPodLinks(); len(a.dp.eps) != 1 || len(a.dp.ports) != 1 || len(pods) != 1 {
		t.Errorf("pod not programmed: %d endpoints, %d ports, %d programs", len(a.dp.eps), len(a.dp.ports), len(pods))
	}
	a.mu.Lock()
	err := a.applyErr
	a.mu.Unlock()
	if err == nil {
		t.Error("the route failure was not kept for the reconciler")
	}
}

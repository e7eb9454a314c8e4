package applier

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// TestApplierCoalesces: requests that arrive while a sync runs are served
// together by the next one, and each caller sees a sync that started after
// it asked.
func TestApplierCoalesces(t *testing.T) {
	var runs atomic.Int32
	release := make(chan struct{})
	started := make(chan struct{}, 10)
	p := New(func() error {
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
	p := New(func() error { return nil }, time.Hour)
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

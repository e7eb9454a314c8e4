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
	}, nil, 0)
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
	p := New(func() error { return nil }, nil, time.Hour)
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

// TestApplierPartAlone: a batch of part requests runs the part sync only;
// a batch with one full request among them runs the full sync, which
// serves them all.
func TestApplierPartAlone(t *testing.T) {
	var full, part atomic.Int32
	release := make(chan struct{})
	started := make(chan struct{}, 10)
	p := New(func() error {
		full.Add(1)
		started <- struct{}{}
		<-release
		return nil
	}, func() error {
		part.Add(1)
		return nil
	}, 0)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go p.Run(ctx)

	for range 3 {
		if err := p.SyncPart(ctx); err != nil {
			t.Fatal(err)
		}
	}
	if f, pt := full.Load(), part.Load(); f != 0 || pt != 3 {
		t.Fatalf("three part requests one after the other: %d full, %d part syncs; want 0 and 3", f, pt)
	}
	// A full sync runs; a part and a full request queue behind it and are
	// served by one full sync.
	first := make(chan error, 1)
	go func() { first <- p.Sync(ctx) }()
	<-started
	errs := make(chan error, 2)
	go func() { errs <- p.SyncPart(ctx) }()
	go func() { errs <- p.Sync(ctx) }()
	deadline := time.Now().Add(5 * time.Second)
	for p.Waiting() < 2 && time.Now().Before(deadline) {
		time.Sleep(time.Millisecond)
	}
	close(release)
	for range 2 {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
	if err := <-first; err != nil {
		t.Fatal(err)
	}
	if f, pt := full.Load(), part.Load(); f != 2 || pt != 3 {
		t.Errorf("after a full sync and a mixed batch: %d full, %d part syncs; want 2 and 3", f, pt)
	}
}

package nodesync

import (
	"testing"
	"time"
)

// TestFlushPacerRepaysAWalk: a walk is due at once until one has run;
// after a walk that took d, none is due until (1+flushIdle)d after it
// started, a held-back walk arranges one sync for then however often it
// is asked, and the walk is due again when that sync comes.
func TestFlushPacerRepaysAWalk(t *testing.T) {
	var p flushPacer
	defer p.stop()
	later := make(chan time.Time, 4)
	ask := func() { later <- time.Now() }
	if !p.due(time.Now(), ask) {
		t.Fatal("the first walk was held back")
	}
	start := time.Now()
	const took = 200 * time.Millisecond
	p.ran(start, took)
	if p.due(time.Now(), ask) {
		t.Fatalf("a walk was due right after one that took %s", took)
	}
	first := p.arranged()
	if p.due(time.Now(), ask) || p.arranged() != first {
		t.Fatal("a second walk held back arranged a second sync")
	}
	select {
	case at := <-later:
		if want := start.Add(took * (1 + flushIdle)); at.Before(want) {
			t.Fatalf("the sync came at %s, before the walk was due (%s)", at.Sub(start), want.Sub(start))
		}
		if !p.due(at, ask) {
			t.Fatal("the walk is not due when its sync comes")
		}
	case <-time.After(10 * time.Second):
		t.Fatal("no sync was asked for the walk held back")
	}
	// A cheap walk holds nothing back.
	p.ran(time.Now(), flushPaceFrom-time.Millisecond)
	if !p.due(time.Now(), ask) {
		t.Fatal("a cheap walk held the next back")
	}
	// No walk holds the next back over flushHoldMost, however long it
	// took.
	start = time.Now()
	p.ran(start, time.Hour)
	if p.due(start.Add(time.Hour+flushHoldMost-time.Millisecond), ask) {
		t.Fatal("a walk was due before its hold-back ended")
	}
	if !p.due(start.Add(time.Hour+flushHoldMost), ask) {
		t.Fatalf("a walk of an hour held the next back over %s", flushHoldMost)
	}
}

// arranged is the sync arranged and not run yet, if any.
func (p *flushPacer) arranged() *time.Timer {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.timer
}

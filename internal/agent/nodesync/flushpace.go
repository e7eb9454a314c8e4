package nodesync

import (
	"context"
	"sync"
	"time"
)

// A flush of the flows to endpoints that left walks every conntrack map
// of the node (datapath.FlushServiceFlows): 0.9 ms with a thousand
// flows, half a second with a million (BenchmarkFlushServiceFlows). Run
// in every sync that saw an endpoint leave, it would make each endpoint
// change on a busy node cost half a second of CPU, and the churn of a
// big cluster would keep the agent walking. So a walk starts only once
// the last one's cost has been repaid flushIdle times over in time with
// no walk: the walks take at most 1/(1+flushIdle) of a CPU. The endpoints
// that leave meanwhile wait in the data plane's unflushed set, which
// forgets one that comes back, and the next walk takes them all.
//
// A walk under flushPaceFrom (a node with some ten thousand flows or
// fewer) holds nothing back: an extra sync would cost more than it saves.
// No walk is held back over flushHoldMost: a flow to an endpoint whose
// pod is gone must not outlive it long, since its address may be given
// to another tenant's pod (model's reusedBy), and a tenant filling the
// maps or starving the agent of CPU would otherwise stretch that window
// with the walk's time.
const (
	flushIdle     = 4
	flushPaceFrom = 10 * time.Millisecond
	flushHoldMost = time.Second
)

// flushPacer says when the next walk may start, and has one sync asked
// for then when a walk was held back.
type flushPacer struct {
	mu    sync.Mutex
	next  time.Time
	timer *time.Timer
}

// due tells whether a walk may start at now. When not, it arranges for
// later to run once the walk is due (one arrangement at a time).
func (p *flushPacer) due(now time.Time, later func()) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if !now.Before(p.next) {
		return true
	}
	if p.timer == nil {
		p.timer = time.AfterFunc(p.next.Sub(now), func() {
			p.mu.Lock()
			p.timer = nil
			p.mu.Unlock()
			later()
		})
	}
	return false
}

// ran records a walk that started at start and took took.
func (p *flushPacer) ran(start time.Time, took time.Duration) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if took < flushPaceFrom {
		p.next = time.Time{}
		return
	}
	p.next = start.Add(took + min(took*flushIdle, flushHoldMost))
}

// stop drops an arrangement not run yet.
func (p *flushPacer) stop() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.timer != nil {
		p.timer.Stop()
		p.timer = nil
	}
}

// flushLater asks the applier for a sync, which flushes what waits.
func (s *Syncer) flushLater() {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := s.applier.Sync(ctx); err != nil {
		s.log.Info("sync for the flows held back from a flush", "err", err)
	}
}

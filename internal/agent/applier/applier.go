package applier

import (
	"context"
	"sync"
	"time"
)

// Applier is the one writer of the node's data plane. CNI ADD and DEL and
// the reconciler only record what they want (the checkpoint, the node
// state) and ask it to sync; it runs one sync at a time, and every request
// that arrives while a sync runs is served by the next one, so a burst of
// pods costs a few syncs, not one each (kube-proxy's bounded-frequency
// runner, without its timer: the reconciler's resync is the periodic full
// sync). A caller learns the result of the first sync that started after
// it asked, so when Sync returns nil its change is in the kernel.
//
// A sync is full (every table: the reconciler's) or a part of it (the
// pods' entries: what a CNI ADD or DEL changed, SyncPart). A batch with a
// full request runs the full sync, which writes the part too; a batch of
// part requests alone runs only the part, so a pod's ADD does not wait
// for every other table of the node to be compared and its routes read
// back.
type Applier struct {
	full, part func() error
	// minInterval spaces syncs out under load (0: back to back).
	minInterval time.Duration

	mu      sync.Mutex
	pending []waiter
	kick    chan struct{}
}

type waiter struct {
	ch   chan error
	full bool
}

// New makes an applier of the full sync and its part (nil: the full one
// serves part requests too).
func New(full, part func() error, minInterval time.Duration) *Applier {
	if part == nil {
		part = full
	}
	return &Applier{full: full, part: part, minInterval: minInterval, kick: make(chan struct{}, 1)}
}

// Sync asks for a full sync and waits for it.
func (p *Applier) Sync(ctx context.Context) error { return p.wait(ctx, true) }

// SyncPart asks for the part sync (or a full one) and waits for it.
func (p *Applier) SyncPart(ctx context.Context) error { return p.wait(ctx, false) }

func (p *Applier) wait(ctx context.Context, full bool) error {
	ch := make(chan error, 1)
	p.mu.Lock()
	p.pending = append(p.pending, waiter{ch, full})
	p.mu.Unlock()
	select {
	case p.kick <- struct{}{}:
	default:
	}
	select {
	case err := <-ch:
		return err
	case <-ctx.Done():
		return ctx.Err()
	}
}

// Run serves Sync requests until ctx ends.
func (p *Applier) Run(ctx context.Context) error {
	var last time.Time
	for {
		select {
		case <-ctx.Done():
			p.fail(ctx.Err())
			return nil
		case <-p.kick:
		}
		if wait := p.minInterval - time.Since(last); wait > 0 {
			select {
			case <-ctx.Done():
				p.fail(ctx.Err())
				return nil
			case <-time.After(wait):
			}
		}
		p.mu.Lock()
		batch := p.pending
		p.pending = nil
		p.mu.Unlock()
		if len(batch) == 0 {
			continue
		}
		sync := p.part
		for _, w := range batch {
			if w.full {
				sync = p.full
				break
			}
		}
		err := sync()
		last = time.Now()
		for _, w := range batch {
			w.ch <- err
		}
	}
}

func (p *Applier) fail(err error) {
	p.mu.Lock()
	batch := p.pending
	p.pending = nil
	p.mu.Unlock()
	for _, w := range batch {
		w.ch <- err
	}
}

// Waiting is how many callers wait for a sync that has not started.
func (p *Applier) Waiting() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.pending)
}

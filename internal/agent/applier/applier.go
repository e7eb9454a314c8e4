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
type Applier struct {
	sync func() error
	// minInterval spaces syncs out under load (0: back to back).
	minInterval time.Duration

	mu      sync.Mutex
	pending []chan error
	kick    chan struct{}
}

func New(sync func() error, minInterval time.Duration) *Applier {
	return &Applier{sync: sync, minInterval: minInterval, kick: make(chan struct{}, 1)}
}

// Sync asks for a sync and waits for it.
func (p *Applier) Sync(ctx context.Context) error {
	ch := make(chan error, 1)
	p.mu.Lock()
	p.pending = append(p.pending, ch)
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
		err := p.sync()
		last = time.Now()
		for _, ch := range batch {
			ch <- err
		}
	}
}

func (p *Applier) fail(err error) {
	p.mu.Lock()
	batch := p.pending
	p.pending = nil
	p.mu.Unlock()
	for _, ch := range batch {
		ch <- err
	}
}

// Waiting is how many callers wait for a sync that has not started.
func (p *Applier) Waiting() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.pending)
}

package chaos

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/lace-cni/lace/lab"
)

// vipMove is a change of the node whose MAC the external host holds for
// the VIP, seen between two polls (since, at).
type vipMove struct {
	since, at time.Time
	from, to  string
	// back: the first move to a node since the VIP failed over from it.
	back bool
}

// vipWatch records the VIP's holder as the external host sees it, so a
// break of a stream through the VIP can be told apart: a failover, the
// VIP going back to a node it failed over from (the rendezvous hash picks
// that node again once it is eligible), or a move no fault explains.
type vipWatch struct {
	mu    sync.Mutex
	moves []vipMove
	// left are the nodes the VIP failed over from and has not gone back
	// to yet.
	left map[string]bool
}

// vipMoveWindow is how long before a break a move counts as its cause: a
// stream asks every second and waits a probe's time for the answer.
const vipMoveWindow = 5 * time.Second

func (v *vipWatch) run(ctx context.Context, w *workload) {
	t := time.NewTicker(250 * time.Millisecond)
	defer t.Stop()
	last := ""
	var polled time.Time
	// The nodes' MACs, read again only for a MAC not among them (a
	// rebooted node's underlay is made again).
	nodeOf := map[string]string{}
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		mac := lab.ExternalNeighbour(w.h.cfg, w.vip)
		if _, ok := nodeOf[mac]; !ok && mac != "" {
			clear(nodeOf)
			for _, node := range w.nodes {
				if m, err := lab.NodeMAC(w.h.cfg, node); err == nil {
					nodeOf[m] = node
				}
			}
		}
		holder := nodeOf[mac]
		now := time.Now()
		if holder == "" || holder == last {
			polled = now
			continue
		}
		if last != "" {
			v.record(vipMove{since: polled, at: now, from: last, to: holder})
		}
		last, polled = holder, now
	}
}

// record notes a move; a move back to a node the VIP failed over from is
// marked back, once.
func (v *vipWatch) record(m vipMove) {
	v.mu.Lock()
	defer v.mu.Unlock()
	if v.left[m.to] {
		m.back = true
		delete(v.left, m.to)
	}
	v.moves = append(v.moves, m)
}

// failedOver notes that the VIP failed over from node.
func (v *vipWatch) failedOver(node string) {
	v.mu.Lock()
	defer v.mu.Unlock()
	if v.left == nil {
		v.left = map[string]bool{}
	}
	v.left[node] = true
}

// cause is the VIP's moves that may have come before a break at at: each
// one whose interval began before at and ended within vipMoveWindow of
// it. back says they were all moves back to a node the VIP had failed
// over from: a flap, or a move nothing explains, among them is not.
func (v *vipWatch) cause(at time.Time) (moves []vipMove, back bool) {
	v.mu.Lock()
	defer v.mu.Unlock()
	back = true
	for _, m := range v.moves {
		if m.since.After(at) || at.Sub(m.at) > vipMoveWindow {
			continue
		}
		moves = append(moves, m)
		back = back && m.back
	}
	return moves, back && len(moves) > 0
}

func (m vipMove) String() string {
	return fmt.Sprintf("the VIP moved from %s to %s at %s", m.from, m.to, m.at.Format("15:04:05.0"))
}

func movesString(ms []vipMove) string {
	out := make([]string, len(ms))
	for i, m := range ms {
		out[i] = m.String()
	}
	return strings.Join(out, ", ")
}

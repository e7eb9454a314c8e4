package chaos

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/lace-cni/lace/lab"
)

// vipMove is a change of the node whose MAC the external host holds for
// the VIP.
type vipMove struct {
	at       time.Time
	from, to string
}

// vipWatch records the VIP's holder as the external host sees it, so a
// break of a stream through the VIP can be told apart: a failover, the
// VIP going back to a node it failed over from (the rendezvous hash picks
// that node again once it is eligible), or a move no fault explains.
type vipWatch struct {
	mu    sync.Mutex
	moves []vipMove
	// left are the nodes the VIP failed over from.
	left map[string]bool
}

// vipMoveWindow is how long before a break a move counts as its cause: a
// stream asks every second and waits a probe's time for the answer.
const vipMoveWindow = 5 * time.Second

func (v *vipWatch) run(ctx context.Context, w *workload) {
	t := time.NewTicker(250 * time.Millisecond)
	defer t.Stop()
	last := ""
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
		if holder == "" || holder == last {
			continue
		}
		v.mu.Lock()
		if last != "" {
			v.moves = append(v.moves, vipMove{at: time.Now(), from: last, to: holder})
		}
		v.mu.Unlock()
		last = holder
	}
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

// cause is the VIP's last move within vipMoveWindow before at, and
// whether it went back to a node the VIP had failed over from.
func (v *vipWatch) cause(at time.Time) (m vipMove, back, ok bool) {
	v.mu.Lock()
	defer v.mu.Unlock()
	for i := len(v.moves) - 1; i >= 0; i-- {
		m := v.moves[i]
		if m.at.After(at) {
			continue
		}
		if at.Sub(m.at) > vipMoveWindow {
			break
		}
		return m, v.left[m.to], true
	}
	return vipMove{}, false, false
}

func (m vipMove) String() string {
	return fmt.Sprintf("the VIP moved from %s to %s at %s", m.from, m.to, m.at.Format("15:04:05.0"))
}

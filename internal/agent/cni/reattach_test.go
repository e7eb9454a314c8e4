package cni

import (
	"context"
	"testing"
)

// TestRestartReattachesPods: a restarted agent attaches every pod's
// programs again at its first successful sync, whatever its own Load
// replaced: an earlier start may have replaced the maps and died before
// re-attaching, which only that agent's memory knew. Later syncs leave the
// programs alone.
func TestRestartReattachesPods(t *testing.T) {
	a := newTestAgent(t, 29, pod("p1"))
	if _, err := a.Handle(context.Background(), addReq("c1", "p1")); err != nil {
		t.Fatal(err)
	}
	eps := a.cp.all()
	if len(eps) != 1 {
		t.Fatalf("endpoints: %v", eps)
	}
	h := eps[0].HostIf
	before := a.dp.attaches[h]
	if before == 0 {
		t.Fatalf("pod %s never attached", h)
	}
	if err := a.SyncEntries(); err != nil {
		t.Fatal(err)
	}
	if n := a.dp.attaches[h]; n != before {
		t.Errorf("a later sync attached again: %d, then %d", before, n)
	}
	// The restart: a new agent on the same data plane and checkpoint,
	// its Load having replaced nothing.
	r := &Server{opts: a.opts, log: a.log, client: a.client, reader: a.reader, recorder: a.recorder, dp: a.dp, node: a.node, cp: a.cp,
		sync: a.sync, health: a.health}
	if err := r.SyncEntries(); err != nil {
		t.Fatal(err)
	}
	if n := a.dp.attaches[h]; n != before+1 {
		t.Errorf("restarted agent's first sync: %d attaches, want %d (pods left on replaced maps)", n, before+1)
	}
	if err := r.SyncEntries(); err != nil {
		t.Fatal(err)
	}
	if n := a.dp.attaches[h]; n != before+1 {
		t.Errorf("second sync attached again: %d", n)
	}
}

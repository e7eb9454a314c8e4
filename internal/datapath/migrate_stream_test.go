package datapath_test

import (
	"bufio"
	"context"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/lace-cni/lace/internal/datapath"
	"github.com/lace-cni/lace/internal/netutil"
)

// TestStreamSurvivesConntrackMigration: a TCP stream through a ClusterIP
// (translated both ways by conntrack) keeps working while every node's
// agent is replaced by a build whose lace_ct has the next layout version:
// the new agent migrates the flows into a new map and attaches the pods'
// programs again, and from then on the programs keep the flows in the new
// map (their deadlines move on there), not in the unpinned old one.
func TestStreamSurvivesConntrackMigration(t *testing.T) {
	w := newWorld(t, 2)
	n1, n2 := w.nodes[0], w.nodes[1]
	w.addNetwork(7, "10.70.0.0/16", "fd00:70::/48", false)
	a := w.addPod("a", n1, 7, 2)
	b := w.addPod("b", n2, 7, 2)
	web := tcpSvc("10.96.0.10", 80, 7, be(b.v4))
	w.serve(7, web)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	conn, err := netutil.DialContext(ctx, netutil.Path(a.ns), "tcp", netip.AddrPortFrom(web.VIP, 80).String())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	r := bufio.NewReader(conn)
	_ = conn.SetDeadline(time.Now().Add(20 * time.Second))
	if got, err := r.ReadString('\n'); err != nil || strings.TrimSpace(got) != "b" {
		t.Fatalf("greeting %q, %v", got, err)
	}
	echo := func(msg string) {
		t.Helper()
		// Each exchange has its own deadline: reloading both nodes'
		// programs between two takes tens of seconds on a loaded machine.
		_ = conn.SetDeadline(time.Now().Add(20 * time.Second))
		if _, err := conn.Write([]byte(msg + "\n")); err != nil {
			t.Fatalf("write %q: %v", msg, err)
		}
		if got, err := r.ReadString('\n'); err != nil || strings.TrimSpace(got) != msg {
			t.Fatalf("echo %q: got %q, %v", msg, got, err)
		}
	}
	echo("before")

	converted := 0
	restore := datapath.BumpLayoutForTest("lace_ct", func(k, v []byte) ([]byte, []byte, bool) {
		converted++
		return k, v, true
	})
	defer restore()
	for _, n := range w.nodes {
		must(t, n.dp.Close())
		dp, err := datapath.LoadWith(n.pinDir, datapath.LoadOptions{Migrate: true})
		must(t, err)
		n.dp = dp
		if got := dp.ReplacedMaps(); len(got) != 1 || got[0] != "lace_ct" {
			t.Errorf("node %s replaced %v, want lace_ct", n.name, got)
		}
		// What the agent's first sync does: the underlay link and the
		// pods' programs move to the new programs and maps.
		must(t, dp.AttachUnderlay(netutil.Path(n.ns), "eth0"))
	}
	must(t, n1.dp.AttachPod(netutil.Path(n1.ns), a.hostIf, false))
	must(t, n2.dp.AttachPod(netutil.Path(n2.ns), b.hostIf, false))
	if converted == 0 {
		t.Fatal("no flow was migrated")
	}
	deadline := func() uint64 {
		flows, err := n1.dp.Conntrack()
		must(t, err)
		var max uint64
		for _, f := range flows {
			if f.Service && f.NAT.Addr() == b.v4 {
				max = f.ExpiresMonotonicNanos
			}
		}
		return max
	}
	before := deadline()
	if before == 0 {
		t.Fatal("the client's flow to the VIP is not in the migrated map")
	}
	echo("after migration")
	if after := deadline(); after <= before {
		t.Errorf("the flow's deadline in the new map stayed at %d: the programs still use the old map", after)
	}
}

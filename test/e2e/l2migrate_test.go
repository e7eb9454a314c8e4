package e2e

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	crclient "sigs.k8s.io/controller-runtime/pkg/client"

	ipamclaimsv1 "github.com/lace-cni/lace/api/ipamclaims/v1alpha1"
	lacev1 "github.com/lace-cni/lace/api/v1alpha1"
	"github.com/lace-cni/lace/internal/model/ipam"
	"github.com/lace-cni/lace/lab/vmsim"
)

// migrationTarget is Lace's bound on a live migration's outage (the peers
// publish 0.5 s); make bench (--only migration) reports the figures.
const migrationTarget = 200 * time.Millisecond

// migID is the network ID of the migration test's network (diagnostics).
var migID uint32

// launcherPod is a virt-launcher stand-in of a VM naming claim: no
// readiness probe (its address is the VM's once bound).
func launcherPod(t *testing.T, name, network, node, claim string) *corev1.Pod {
	t.Helper()
	p := netexecPod(name, node)
	p.Labels["net"] = network
	p.Annotations = map[string]string{lacev1.AnnotationOVNPrimaryUDNIPAMClaim: claim}
	p.Spec.Containers[0].ReadinessProbe = nil
	if _, err := client.CoreV1().Pods("default").Create(context.Background(), p, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { deletePodNow(t, name) })
	return waitPodReady(t, "default", name)
}

// standbyOn waits until node's data plane holds mac of network id with
// the standby the FDBEntry names: here (a port) or at another node.
func standbyOn(t *testing.T, node string, id uint32, mac net.HardwareAddr, here bool) {
	t.Helper()
	dp := nodeDatapath(t, node)
	eventually(t, 30*time.Second, fmt.Sprintf("the standby of %s programmed on %s", mac, node), func() error {
		fs, err := dp.FDB()
		if err != nil {
			return err
		}
		for _, f := range fs {
			if f.NetID == id && f.MAC.String() == mac.String() {
				if (here && f.StandbyIfIndex != 0) || (!here && f.StandbySID.IsValid()) {
					return nil
				}
				return fmt.Errorf("entry %+v", f)
			}
		}
		return fmt.Errorf("no entry")
	})
}

// fdbAt waits until FDBEntry name is at node with standby ("": none) and,
// when seq >= 0, that sequence; it returns the entry.
func fdbAt(t *testing.T, c crclient.Client, name, node, standby string, seq int64) lacev1.FDBEntry {
	t.Helper()
	var f lacev1.FDBEntry
	eventually(t, 60*time.Second, fmt.Sprintf("FDBEntry %s at %s, standby %q", name, node, standby), func() error {
		if err := c.Get(context.Background(), crKey(name), &f); err != nil {
			return err
		}
		if f.Spec.Node != node || f.Spec.Standby != standby || (seq >= 0 && f.Spec.Sequence != seq) {
			return fmt.Errorf("spec %+v, want sequence %d", f.Spec, seq)
		}
		return nil
	})
	return f
}

// dumpMigration logs, when t failed, what each node's data plane holds of
// mac (its FDB entry, its moves) and the drops since before.
func dumpMigration(t *testing.T, id uint32, mac net.HardwareAddr, before map[string]map[string]uint64) {
	if !t.Failed() {
		return
	}
	for _, node := range []string{"n1", "n2", "n3"} {
		dp := nodeDatapath(t, node)
		fs, _ := dp.FDB()
		for _, f := range fs {
			if f.NetID == id && f.MAC.String() == mac.String() {
				t.Logf("%s: FDB %+v", node, f)
			}
		}
		moves, _ := dp.L2Moves()
		t.Logf("%s: moves %+v", node, moves)
		after := nodeDrops(t, node)
		for r, n := range after {
			if n != before[node][r] {
				t.Logf("%s: drop %s %d -> %d", node, r, before[node][r], n)
			}
		}
	}
}

// probeFlowing starts a probe between guest g and the peer (in peerNS, at
// peer) to the guest's address to on port, stopped when the test ends, and
// waits until its pings are answered and its stream reads.
func probeFlowing(t *testing.T, g *vmsim.Guest, peerNS string, peer, to netip.Addr, port int) *vmsim.Probe {
	t.Helper()
	var pr *vmsim.Probe
	eventually(t, 30*time.Second, fmt.Sprintf("the guest's stream to the peer (port %d)", port), func() (err error) {
		pr, err = vmsim.StartProbe(g, peerNS, peer, to, port)
		return err
	})
	t.Cleanup(pr.Stop)
	eventually(t, 20*time.Second, "the peer's pings answered by the guest", func() error {
		if r, s := pr.Arrived(time.Now().Add(-time.Second)); r < 50 || s == 0 {
			return fmt.Errorf("%d echo replies and %d reads in the last second", r, s)
		}
		return nil
	})
	return pr
}

// migrate moves g behind the pod at podNS and measures the outage the
// probe saw: the longest silence of the ping and of the stream from 100 ms
// before the switch-over until both flowed again for a second.
func migrate(t *testing.T, g *vmsim.Guest, pr *vmsim.Probe, podNS string, announce bool) (ping, stream time.Duration) {
	t.Helper()
	before := map[string]map[string]uint64{}
	for _, node := range []string{"n1", "n2", "n3"} {
		before[node] = nodeDrops(t, node)
	}
	t.Cleanup(func() { dumpMigration(t, migID, g.MAC, before) })
	t0 := time.Now()
	if err := g.Migrate(podNS, announce); err != nil {
		t.Fatal(err)
	}
	var back time.Time
	eventually(t, 30*time.Second, "the ping and the stream through the migrated guest", func() error {
		if back.IsZero() {
			if r, s := pr.Arrived(t0); r == 0 || s == 0 {
				return fmt.Errorf("%d echo replies and %d reads since the switch-over", r, s)
			}
			back = time.Now()
		}
		if r, _ := pr.Arrived(back); time.Since(back) < time.Second || r < 50 {
			return fmt.Errorf("flowing again for %v (%d replies)", time.Since(back), r)
		}
		return nil
	})
	if err := pr.Err(); err != nil {
		t.Fatalf("the stream broke across the migration: %v", err)
	}
	return pr.Outage(t0.Add(-100*time.Millisecond), time.Now())
}

// TestL2LiveMigration: a VM (a guest namespace behind its virt-launcher
// pod's bridge binding, as KubeVirt wires it) of an IPAMClaim streams TCP
// to a pod on a third node, which pings it every 10 ms. Its migration's
// target pod, on another node, gets the VM's addresses and MAC and becomes
// the MAC's standby on every node, carrying nothing. The guest's link moves
// to the target and the guest sends QEMU's RARP: the MAC moves on every node
// at once (the target activated, the others moved by its announcement),
// lace-controller then publishes the move (sequence + 1), and the outage
// stays under 0.2 s (the peers publish 0.5 s) with no reset. Back to the source with the
// announcement lost, the VM's first frame moves it, as fast. To a new
// target, KubeVirt's word alone (the target pod's migration-target-ready
// annotation) moves it, with no frame of the VM there. The source pod
// deleted, its standby goes.
func TestL2LiveMigration(t *testing.T) {
	needLab(t)
	c := laceClient(t)
	ctx := context.Background()
	l2Network(t, c, "mig", "10.71.0.0/24", "fd00:71::/64")
	var nw lacev1.Network
	if err := c.Get(ctx, crKey("mig"), &nw); err != nil {
		t.Fatal(err)
	}
	id := uint32(nw.Status.ID)
	migID = id
	claim := &ipamclaimsv1.IPAMClaim{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "vm-m.mig"},
		Spec: ipamclaimsv1.IPAMClaimSpec{Network: "mig", Interface: "eth0"}}
	if err := c.Create(ctx, claim); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Delete(context.Background(), claim) })
	peer := netPod(t, "mig-peer", "mig", "n3", true)
	src := launcherPod(t, "mig-src", "mig", "n1", claim.Name)
	vm4, vm6 := podAddrs(src)
	mac := podIface(t, src).mac
	srcNS := podNetNS(t, src)
	mtu, err := vmsim.Bind(srcNS)
	if err != nil {
		t.Fatal(err)
	}
	g, err := vmsim.Start(srcNS, mac, mtu, netip.PrefixFrom(vm4, 24), netip.PrefixFrom(vm6, 64))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(g.Close)
	peer4, _ := podAddrs(peer)
	pr := probeFlowing(t, g, podNetNS(t, peer), peer4, vm4, 9971)

	// The target: the VM's addresses and MAC, the standby everywhere.
	tgt := launcherPod(t, "mig-tgt", "mig", "n2", claim.Name)
	if t4, t6 := podAddrs(tgt); t4 != vm4 || t6 != vm6 || podIface(t, tgt).mac.String() != mac.String() {
		t.Fatalf("the target got %s %s %s, want the VM's %s %s %s", t4, t6, podIface(t, tgt).mac, vm4, vm6, mac)
	}
	tgtNS := podNetNS(t, tgt)
	if _, err := vmsim.Bind(tgtNS); err != nil {
		t.Fatal(err)
	}
	if err := g.Plug(tgtNS); err != nil {
		t.Fatal(err)
	}
	fdbName := ipam.FDBEntryName("mig", mac)
	seq := fdbAt(t, c, fdbName, "n1", "n2", -1).Spec.Sequence
	standbyOn(t, "n1", id, mac, false)
	standbyOn(t, "n2", id, mac, true)
	standbyOn(t, "n3", id, mac, false)
	if r, _ := pr.Arrived(time.Now().Add(-time.Second)); r < 50 {
		t.Fatalf("the standby disturbed the VM: %d echo replies in the last second", r)
	}

	activated, moved := nodeForwarded(t, "n2")["l2-activated"], nodeForwarded(t, "n3")["l2-moved"]
	ping, stream := migrate(t, g, pr, tgtNS, true)
	t.Logf("migration n1 -> n2 with QEMU's announcement: outage %v (ping), %v (stream)", ping, stream)
	if ping > migrationTarget || stream > migrationTarget {
		t.Errorf("outage %v (ping) and %v (stream), want under %v", ping, stream, migrationTarget)
	}
	if a := nodeForwarded(t, "n2")["l2-activated"]; a <= activated {
		t.Errorf("n2 never activated the VM's MAC (l2-activated %d -> %d)", activated, a)
	}
	if m := nodeForwarded(t, "n3")["l2-moved"]; m <= moved {
		t.Errorf("n3 never moved the VM's MAC on its own (l2-moved %d -> %d)", moved, m)
	}
	fdbAt(t, c, fdbName, "n2", "n1", seq+1) // lace-controller publishing the move
	standbyOn(t, "n1", id, mac, true)
	standbyOn(t, "n3", id, mac, false)

	// Back, with the announcement lost: the guest's stream moves it.
	ping, stream = migrate(t, g, pr, srcNS, false)
	t.Logf("migration n2 -> n1 with the announcement lost: outage %v (ping), %v (stream)", ping, stream)
	if ping > migrationTarget || stream > migrationTarget {
		t.Errorf("outage %v (ping) and %v (stream), want under %v", ping, stream, migrationTarget)
	}
	fdbAt(t, c, fdbName, "n1", "n2", seq+2) // and the move back

	// KubeVirt's word alone moves the MAC. The first target done with (a
	// pod is a migration's target once), a new one stands by; marked ready
	// while the guest is silent and not even there (the probe stopped),
	// the MAC moves to it (sequence + 1) with no frame activating it.
	deletePodNow(t, tgt.Name)
	fdbAt(t, c, fdbName, "n1", "", -1)
	pr.Stop()
	tgt = launcherPod(t, "mig-tgt2", "mig", "n2", claim.Name)
	tgtNS = podNetNS(t, tgt)
	if _, err := vmsim.Bind(tgtNS); err != nil {
		t.Fatal(err)
	}
	if err := g.Plug(tgtNS); err != nil {
		t.Fatal(err)
	}
	seq = fdbAt(t, c, fdbName, "n1", "n2", -1).Spec.Sequence
	standbyOn(t, "n2", id, mac, true)
	activated = nodeForwarded(t, "n2")["l2-activated"]
	patch := fmt.Sprintf(`{"metadata":{"annotations":{%q:%q}}}`, lacev1.AnnotationMigrationTargetReady, time.Now().UTC().Format(time.RFC3339))
	if _, err := client.CoreV1().Pods("default").Patch(ctx, tgt.Name, types.MergePatchType, []byte(patch), metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
	fdbAt(t, c, fdbName, "n2", "n1", seq+1)
	if a := nodeForwarded(t, "n2")["l2-activated"]; a != activated {
		t.Errorf("n2's data plane activated the MAC (l2-activated %d -> %d): the annotation was not what moved it", activated, a)
	}
	// The guest follows, silent still: it is reached there.
	if err := g.Migrate(tgtNS, false); err != nil {
		t.Fatal(err)
	}
	pr = probeFlowing(t, g, podNetNS(t, peer), peer4, vm4, 9972)

	// The other pod goes (KubeVirt deletes the source when done): its
	// standby with it, the VM untouched.
	deletePodNow(t, src.Name)
	fdbAt(t, c, fdbName, "n2", "", -1)
	if r, _ := pr.Arrived(time.Now().Add(-time.Second)); r < 50 || pr.Err() != nil {
		t.Errorf("after the other pod went: %d echo replies in the last second, stream error %v", r, pr.Err())
	}
}

package controller_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	ipamclaimsv1 "github.com/lace-cni/lace/api/ipamclaims/v1alpha1"
	lacev1 "github.com/lace-cni/lace/api/v1alpha1"
)

// fdbIs waits until FDBEntry name is at node with sequence seq and
// standby (node and endpoint; "" for none).
func fdbIs(t *testing.T, c client.Client, name, node string, seq int64, standby, standbyEndpoint string) {
	t.Helper()
	eventually(t, 20*time.Second, fmt.Sprintf("FDBEntry %s at %s (sequence %d), standby %q", name, node, seq, standby), func() error {
		var f lacev1.FDBEntry
		if err := c.Get(context.Background(), client.ObjectKey{Name: name}, &f); err != nil {
			return err
		}
		if f.Spec.Node != node || f.Spec.Sequence != seq || f.Spec.Standby != standby || f.Annotations[lacev1.AnnotationStandbyEndpoint] != standbyEndpoint {
			return fmt.Errorf("spec %+v, standby endpoint %q", f.Spec, f.Annotations[lacev1.AnnotationStandbyEndpoint])
		}
		return nil
	})
}

// activate writes what the target's node writes when the VM showed up at
// its port.
func activate(t *testing.T, c client.Client, name string, mac lacev1.MACAddress, seq int64) {
	t.Helper()
	ctx := context.Background()
	eventually(t, 10*time.Second, "record the activation", func() error {
		var ne lacev1.NetworkEndpoint
		if err := c.Get(ctx, client.ObjectKey{Namespace: "default", Name: name}, &ne); err != nil {
			return err
		}
		ne.Spec.Activated = &lacev1.L2Activation{MAC: mac, Sequence: seq}
		return c.Update(ctx, &ne)
	})
}

// TestL2LiveMigration: a second pod of a VM's IPAMClaim on another node (a
// live migration's target) gets the VM's addresses and MAC and makes its
// node the MAC's standby, without moving it; its node's report that the VM
// showed up there (at the FDBEntry's current sequence) moves the MAC there
// with sequence + 1, the source's node the standby while the source pod
// lasts, and the claim's owner the target. A stale report moves nothing; a
// target that goes before its VM showed up (a failed migration) takes the
// standby with it and leaves the source as it was.
func TestL2LiveMigration(t *testing.T) {
	env, c := startL2(t)
	startController(t, env, nil)
	createL2(t, c, l2Network("vms", "10.56.0.0/24", "fd00:56::/64"))
	ctx := context.Background()
	claim := &ipamclaimsv1.IPAMClaim{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "vm-m.vms"},
		Spec: ipamclaimsv1.IPAMClaimSpec{Network: "vms", Interface: "eth0"}}
	create(t, c, claim)
	ann := map[string]string{lacev1.AnnotationOVNPrimaryUDNIPAMClaim: "vm-m.vms"}
	annotatedL2Pod(t, c, "launcher-1", "n1", "vms", ann)
	src := assigned(t, c, []string{"launcher-1"}, 2)["launcher-1"]
	fdbName := "vms." + strings.ReplaceAll(string(src.MAC), ":", "")
	fdbIs(t, c, fdbName, "n1", 0, "", "")

	// A failed migration: the target goes before its VM showed up.
	annotatedL2Pod(t, c, "launcher-2", "n2", "vms", ann)
	if tgt := assigned(t, c, []string{"launcher-2"}, 2)["launcher-2"]; fmt.Sprint(tgt.Addresses) != fmt.Sprint(src.Addresses) || tgt.MAC != src.MAC {
		t.Fatalf("the target got %v / %s, want the VM's %v / %s", tgt.Addresses, tgt.MAC, src.Addresses, src.MAC)
	}
	fdbIs(t, c, fdbName, "n1", 0, "n2", "default/launcher-2")
	// A report of a sequence the MAC no longer has is stale.
	activate(t, c, "launcher-2", src.MAC, 7)
	deletePodAndEndpoint(t, c, "launcher-2")
	fdbIs(t, c, fdbName, "n1", 0, "", "")

	// A migration that completes.
	annotatedL2Pod(t, c, "launcher-3", "n3", "vms", ann)
	assigned(t, c, []string{"launcher-3"}, 2)
	fdbIs(t, c, fdbName, "n1", 0, "n3", "default/launcher-3")
	activate(t, c, "launcher-3", src.MAC, 0)
	fdbIs(t, c, fdbName, "n3", 1, "n1", "default/launcher-1")
	eventually(t, 20*time.Second, "the claim's owner is the target", func() error {
		var got ipamclaimsv1.IPAMClaim
		if err := c.Get(ctx, client.ObjectKeyFromObject(claim), &got); err != nil {
			return err
		}
		if got.Status.OwnerPod == nil || got.Status.OwnerPod.Name != "launcher-3" {
			return fmt.Errorf("owner %+v", got.Status.OwnerPod)
		}
		return nil
	})
	// KubeVirt deletes the source: its standby goes with it.
	deletePodAndEndpoint(t, c, "launcher-1")
	fdbIs(t, c, fdbName, "n3", 1, "", "")
	if nb, fd := countClaims(t, c, "vms"); nb != 2 || fd != 1 {
		t.Errorf("%d Neighbors and %d FDBEntries after the migration, want the claim's 2 and 1", nb, fd)
	}
}

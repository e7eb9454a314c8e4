package controller_test

import (
	"context"
	"fmt"
	"maps"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	ipamclaimsv1 "github.com/lace-cni/lace/api/ipamclaims/v1alpha1"
	lacev1 "github.com/lace-cni/lace/api/v1alpha1"
	"github.com/lace-cni/lace/lab/controlplane/cptest"
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

// launcher creates a virt-launcher stand-in: a pod of network vms on node
// naming claim vm-m.vms, owned (as controller) by a VMI of UID vmi ("" for
// none), and the endpoint its node writes.
func launcher(t *testing.T, c client.Client, name, node, vmi string, extra map[string]string) {
	t.Helper()
	ctx := context.Background()
	ann := map[string]string{lacev1.AnnotationOVNPrimaryUDNIPAMClaim: "vm-m.vms"}
	maps.Copy(ann, extra)
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: name, Annotations: ann},
		Spec: corev1.PodSpec{NodeName: node, Containers: []corev1.Container{{Name: "c", Image: "x"}}}}
	if vmi != "" {
		pod.OwnerReferences = []metav1.OwnerReference{{APIVersion: "kubevirt.io/v1", Kind: "VirtualMachineInstance", Name: "vm-m",
			UID: types.UID(vmi), Controller: ptr.To(true)}}
	}
	if err := c.Create(ctx, pod); err != nil {
		t.Fatalf("create pod %s: %v", name, err)
	}
	ne := &lacev1.NetworkEndpoint{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: name,
		Labels: map[string]string{lacev1.LabelNode: node, lacev1.LabelPodUID: string(pod.UID), lacev1.LabelNetwork: "vms"}},
		Spec: lacev1.NetworkEndpointSpec{Network: "vms", Node: node, Interface: "eth0"}}
	if err := c.Create(ctx, ne); err != nil {
		t.Fatalf("create NetworkEndpoint %s: %v", name, err)
	}
}

// startMigration starts the controller with network vms, claim vm-m.vms
// and its VM's first pod launcher-1 on n1 (VMI uid "vmi-1"), and returns
// the client, the controller's stop, its FDBEntry's name, the pod's
// assignment and the claim.
func startMigration(t *testing.T) (*cptest.Env, client.Client, func(), string, lacev1.NetworkEndpointStatus, *ipamclaimsv1.IPAMClaim) {
	t.Helper()
	env, c := startL2(t)
	stop := startController(t, env, nil)
	createL2(t, c, l2Network("vms", "10.56.0.0/24", "fd00:56::/64"))
	claim := &ipamclaimsv1.IPAMClaim{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "vm-m.vms"},
		Spec: ipamclaimsv1.IPAMClaimSpec{Network: "vms", Interface: "eth0"}}
	create(t, c, claim)
	launcher(t, c, "launcher-1", "n1", "vmi-1", nil)
	src := assigned(t, c, []string{"launcher-1"}, 2)["launcher-1"]
	fdbName := "vms." + strings.ReplaceAll(string(src.MAC), ":", "")
	fdbIs(t, c, fdbName, "n1", 0, "", "")
	return env, c, stop, fdbName, src, claim
}

func ownerIs(t *testing.T, c client.Client, claim *ipamclaimsv1.IPAMClaim, pod string) {
	t.Helper()
	eventually(t, 20*time.Second, "the claim's owner "+pod, func() error {
		var got ipamclaimsv1.IPAMClaim
		if err := c.Get(context.Background(), client.ObjectKeyFromObject(claim), &got); err != nil {
			return err
		}
		if got.Status.OwnerPod == nil || got.Status.OwnerPod.Name != pod {
			return fmt.Errorf("owner %+v", got.Status.OwnerPod)
		}
		return nil
	})
}

// TestL2LiveMigration: a second pod of a VM's IPAMClaim on another node (a
// live migration's target, of the same VMI) gets the VM's addresses and MAC
// and makes its node the MAC's standby (sequence + 1: a new standby is a new
// sequence), without moving it; its node's report that the VM showed up
// there (at the current sequence) moves the MAC there with sequence + 1,
// the source's node the standby while the source pod lasts, and the claim's
// owner the target. A stale report moves nothing; a target that goes before
// its VM showed up (a failed migration) takes the standby with it and
// leaves the source as it was.
func TestL2LiveMigration(t *testing.T) {
	_, c, _, fdbName, src, claim := startMigration(t)

	// A failed migration: the target goes before its VM showed up.
	launcher(t, c, "launcher-2", "n2", "vmi-1", nil)
	if tgt := assigned(t, c, []string{"launcher-2"}, 2)["launcher-2"]; fmt.Sprint(tgt.Addresses) != fmt.Sprint(src.Addresses) || tgt.MAC != src.MAC {
		t.Fatalf("the target got %v / %s, want the VM's %v / %s", tgt.Addresses, tgt.MAC, src.Addresses, src.MAC)
	}
	fdbIs(t, c, fdbName, "n1", 1, "n2", "default/launcher-2")
	// A report of a sequence the MAC no longer has is stale.
	activate(t, c, "launcher-2", src.MAC, 7)
	deletePodAndEndpoint(t, c, "launcher-2")
	fdbIs(t, c, fdbName, "n1", 2, "", "")

	// A migration that completes.
	launcher(t, c, "launcher-3", "n3", "vmi-1", nil)
	assigned(t, c, []string{"launcher-3"}, 2)
	fdbIs(t, c, fdbName, "n1", 3, "n3", "default/launcher-3")
	activate(t, c, "launcher-3", src.MAC, 3)
	fdbIs(t, c, fdbName, "n3", 4, "n1", "default/launcher-1")
	ownerIs(t, c, claim, "launcher-3")
	// KubeVirt deletes the source: its standby goes with it.
	deletePodAndEndpoint(t, c, "launcher-1")
	fdbIs(t, c, fdbName, "n3", 5, "", "")
	if nb, fd := countClaims(t, c, "vms"); nb != 2 || fd != 1 {
		t.Errorf("%d Neighbors and %d FDBEntries after the migration, want the claim's 2 and 1", nb, fd)
	}
}

// TestL2MigrationRefusesStrangers: while the VM's pod runs, a pod naming
// its claim gets nothing unless the same VMI owns it; a static pod (a
// node's mirror pod, which a compromised node may create in any namespace)
// never gets a claim's addresses. (A hostile review made a mirror pod the
// standby, then the owner.)
func TestL2MigrationRefusesStrangers(t *testing.T) {
	_, c, _, fdbName, _, _ := startMigration(t)
	launcher(t, c, "static-n9", "n9", "", map[string]string{corev1.MirrorPodAnnotationKey: "x"})
	refused(t, c, "static-n9", "InvalidAddressRequest", "static pod")
	launcher(t, c, "other-vmi", "n2", "vmi-2", nil)
	refused(t, c, "other-vmi", "AddressTaken", "another owner")
	launcher(t, c, "no-owner", "n2", "", nil)
	refused(t, c, "no-owner", "AddressTaken", "another owner")
	fdbIs(t, c, fdbName, "n1", 0, "", "")
}

// TestL2MigrationFollowsRemainingPod: the source gone before its target's
// activation was recorded (a report lost), the claim and its MAC follow the
// pod that remains; of two targets, the one left stands by again when the
// other goes; a restart between the claim's owner and the MAC's move
// finishes the move. (Each failed on the first version, in a hostile
// review.)
func TestL2MigrationFollowsRemainingPod(t *testing.T) {
	env, c, stop, fdbName, src, claim := startMigration(t)
	ctx := context.Background()
	launcher(t, c, "launcher-3", "n3", "vmi-1", nil)
	assigned(t, c, []string{"launcher-3"}, 2)
	fdbIs(t, c, fdbName, "n1", 1, "n3", "default/launcher-3")
	// One migration at a time: a second target waits while the first
	// stands by.
	launcher(t, c, "launcher-4", "n4", "vmi-1", nil)
	assigned(t, c, []string{"launcher-4"}, 2)
	fdbIs(t, c, fdbName, "n1", 1, "n3", "default/launcher-3")
	deletePodAndEndpoint(t, c, "launcher-3")
	standsBy(t, c, fdbName, "n1", "n4")
	launcher(t, c, "launcher-3", "n3", "vmi-1", nil)
	assigned(t, c, []string{"launcher-3"}, 2)
	deletePodAndEndpoint(t, c, "launcher-4")
	standsBy(t, c, fdbName, "n1", "n3")

	// The claim's owner recorded, then the controller gone before the
	// MAC moved: the next controller moves it.
	var f lacev1.FDBEntry
	if err := c.Get(ctx, client.ObjectKey{Name: fdbName}, &f); err != nil {
		t.Fatal(err)
	}
	stop()
	var cl ipamclaimsv1.IPAMClaim
	if err := c.Get(ctx, client.ObjectKeyFromObject(claim), &cl); err != nil {
		t.Fatal(err)
	}
	next := cl.DeepCopy()
	next.Status.OwnerPod = &ipamclaimsv1.OwnerPod{Name: "launcher-3"}
	if err := c.Status().Patch(ctx, next, client.MergeFrom(&cl)); err != nil {
		t.Fatal(err)
	}
	activate(t, c, "launcher-3", src.MAC, f.Spec.Sequence)
	startController(t, env, nil)
	fdbIs(t, c, fdbName, "n3", f.Spec.Sequence+1, "n1", "default/launcher-1")

	// Lost report: launcher-1 (standing by now) is the VM's next home, its
	// activation never recorded; launcher-3 goes: the claim follows
	// launcher-1.
	deletePodAndEndpoint(t, c, "launcher-3")
	standsBy(t, c, fdbName, "n1", "")
	ownerIs(t, c, claim, "launcher-1")
}

// standsBy waits until FDBEntry name is at node with standby ("": none),
// whatever its sequence.
func standsBy(t *testing.T, c client.Client, name, node, standby string) {
	t.Helper()
	eventually(t, 20*time.Second, fmt.Sprintf("FDBEntry %s at %s, standby %q", name, node, standby), func() error {
		var f lacev1.FDBEntry
		if err := c.Get(context.Background(), client.ObjectKey{Name: name}, &f); err != nil {
			return err
		}
		if f.Spec.Node != node || f.Spec.Standby != standby {
			return fmt.Errorf("spec %+v", f.Spec)
		}
		return nil
	})
}

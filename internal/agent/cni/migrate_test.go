package cni

import (
	"context"
	"fmt"
	"net"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	lacev1 "github.com/lace-cni/lace/api/v1alpha1"
	"github.com/lace-cni/lace/internal/datapath"
)

// TestL2ReadyTargetActivated: the MAC of a live migration's target stands
// by at its port; it moves there (ActivateStandby with the entry's
// sequence) and the activation is recorded in the endpoint's spec only
// once KubeVirt marks the target pod ready, and only once; a pod activated
// before (its VM left it again: the next migration's source) is not
// activated by its old annotation.
func TestL2ReadyTargetActivated(t *testing.T) {
	a := newTestAgent(t, 29, append(storageObjects(), l2pod("vm1"))...)
	ctx := context.Background()
	podMAC := "0a:58:0a:32:00:05"
	answered := controllerAnswers(t, a.c, "vm1", allocated([]string{"10.50.0.5", "fd00:50::5"}, podMAC))
	if _, err := a.Handle(ctx, addReq("c1", "vm1")); err != nil {
		t.Fatal(err)
	}
	if err := <-answered; err != nil {
		t.Fatal(err)
	}
	e, ok := a.cp.get("c1")
	if !ok || !e.Ready {
		t.Fatalf("endpoint %+v", e)
	}
	pm, _ := net.ParseMAC(podMAC)
	standby := datapath.L2Learned{IfIndex: uint32(e.HostIfIndex), NetID: storageID, MAC: pm, Activated: true, Seq: 4}
	a.dp.mu.Lock()
	a.dp.standby = map[string]datapath.L2Learned{podMAC: standby}
	a.dp.mu.Unlock()
	activated := func() []datapath.L2Learned {
		a.dp.mu.Lock()
		defer a.dp.mu.Unlock()
		return append([]datapath.L2Learned(nil), a.dp.activated...)
	}

	// Not ready yet: the VM's own frame is what moves it.
	a.activateReadyTargets(ctx)
	if got := activated(); len(got) != 0 {
		t.Fatalf("activated %v before the target was ready", got)
	}
	var p corev1.Pod
	if err := a.c.Get(ctx, client.ObjectKey{Namespace: "default", Name: "vm1"}, &p); err != nil {
		t.Fatal(err)
	}
	p.Annotations = map[string]string{lacev1.AnnotationMigrationTargetReady: "2026-11-27T10:00:00Z"}
	if err := a.c.Update(ctx, &p); err != nil {
		t.Fatal(err)
	}
	a.activateReadyTargets(ctx)
	a.activateReadyTargets(ctx)
	if got := activated(); len(got) != 1 || got[0].Seq != 4 || got[0].MAC.String() != podMAC {
		t.Fatalf("activated %v, want the MAC once at sequence 4", got)
	}
	eventually(t, "spec.activated written", func() error {
		var ne lacev1.NetworkEndpoint
		if err := a.c.Get(ctx, client.ObjectKey{Namespace: "default", Name: "vm1"}, &ne); err != nil {
			return err
		}
		if ne.Spec.Activated == nil || *ne.Spec.Activated != (lacev1.L2Activation{MAC: lacev1.MACAddress(podMAC), Sequence: 4}) {
			return fmt.Errorf("spec.activated %+v", ne.Spec.Activated)
		}
		return nil
	})

	// The VM migrates on: this pod, the source now, stands by again.
	a.dp.mu.Lock()
	a.dp.standby = map[string]datapath.L2Learned{podMAC: {IfIndex: uint32(e.HostIfIndex), NetID: storageID, MAC: pm, Activated: true, Seq: 6}}
	a.dp.mu.Unlock()
	a.activateReadyTargets(ctx)
	if got := activated(); len(got) != 1 {
		t.Fatalf("activated %v: the old target was activated again by its annotation", got)
	}
}

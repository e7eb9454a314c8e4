package cni

import (
	"context"
	"fmt"
	"net"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	ipamclaimsv1 "github.com/lace-cni/lace/api/ipamclaims/v1alpha1"
	lacev1 "github.com/lace-cni/lace/api/v1alpha1"
	"github.com/lace-cni/lace/internal/datapath"
)

// TestL2ReadyTargetActivated: the MAC of a live migration's target stands
// by at its port; it moves there (ActivateStandby with the entry's
// sequence) and the activation is recorded in the endpoint's spec only
// once KubeVirt marks the target pod ready later than the pod holding the
// VM's claim was. Not again once activated (the pod is the next
// migration's source then), and not for a pod never activated whose mark
// is older than the claim owner's (a target whose VM left before its own
// activation was recorded).
func TestL2ReadyTargetActivated(t *testing.T) {
	vm1 := l2pod("vm1")
	vm1.Annotations = map[string]string{lacev1.AnnotationIPAMClaim: "vm.storage"}
	src := l2pod("vm-src")
	src.Spec.NodeName = "n2"
	src.Annotations = map[string]string{lacev1.AnnotationMigrationTargetReady: "2026-11-27T09:00:00Z"}
	claim := &ipamclaimsv1.IPAMClaim{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "vm.storage"},
		Spec:   ipamclaimsv1.IPAMClaimSpec{Network: "storage", Interface: "eth0"},
		Status: ipamclaimsv1.IPAMClaimStatus{OwnerPod: &ipamclaimsv1.OwnerPod{Name: "vm-src"}}}
	a := newTestAgent(t, 29, append(storageObjects(), vm1, src, claim)...)
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
	standBy := func(seq uint32) {
		a.dp.mu.Lock()
		defer a.dp.mu.Unlock()
		a.dp.standby = map[string]datapath.L2Learned{podMAC: {IfIndex: uint32(e.HostIfIndex), NetID: storageID, MAC: pm, Activated: true, Seq: seq}}
	}
	activated := func() []datapath.L2Learned {
		a.dp.mu.Lock()
		defer a.dp.mu.Unlock()
		return append([]datapath.L2Learned(nil), a.dp.activated...)
	}
	markReady := func(name, at string) {
		t.Helper()
		var p corev1.Pod
		if err := a.c.Get(ctx, client.ObjectKey{Namespace: "default", Name: name}, &p); err != nil {
			t.Fatal(err)
		}
		p.Annotations[lacev1.AnnotationMigrationTargetReady] = at
		if err := a.c.Update(ctx, &p); err != nil {
			t.Fatal(err)
		}
	}
	endpoint := func() *lacev1.NetworkEndpoint {
		t.Helper()
		var ne lacev1.NetworkEndpoint
		if err := a.c.Get(ctx, client.ObjectKey{Namespace: "default", Name: "vm1"}, &ne); err != nil {
			t.Fatal(err)
		}
		return &ne
	}
	standBy(4)

	// Not ready yet: the VM's own frame is what moves it.
	a.activateReadyTargets(ctx)
	if got := activated(); len(got) != 0 {
		t.Fatalf("activated %v before the target was ready", got)
	}
	// Marked ready earlier than the claim's owner was: an older target.
	markReady("vm1", "2026-11-27T08:00:00Z")
	a.activateReadyTargets(ctx)
	if got := activated(); len(got) != 0 {
		t.Fatalf("activated %v though the claim's owner was marked ready later", got)
	}
	// Marked ready later (the next sequence is judged anew): moved, once.
	markReady("vm1", "2026-11-27T10:00:00Z")
	standBy(5)
	a.activateReadyTargets(ctx)
	a.activateReadyTargets(ctx)
	if got := activated(); len(got) != 1 || got[0].Seq != 5 || got[0].MAC.String() != podMAC {
		t.Fatalf("activated %v, want the MAC once at sequence 5", got)
	}
	eventually(t, "spec.activated written", func() error {
		if a := endpoint().Spec.Activated; a == nil || *a != (lacev1.L2Activation{MAC: lacev1.MACAddress(podMAC), Sequence: 5}) {
			return fmt.Errorf("spec.activated %+v", a)
		}
		return nil
	})

	// The VM migrates on: this pod, the source now, stands by again.
	standBy(6)
	a.activateReadyTargets(ctx)
	if got := activated(); len(got) != 1 {
		t.Fatalf("activated %v: the old target was activated again by its annotation", got)
	}
}

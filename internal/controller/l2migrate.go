package controller

import (
	"context"
	"fmt"
	"net"

	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/log"

	lacev1 "github.com/lace-cni/lace/api/v1alpha1"
)

// Live migration: a pod naming an IPAMClaim whose MAC lives with another
// live pod (the migration's source) gets the claim's addresses and MAC,
// and its node becomes the MAC's standby (FDBEntry spec.standby). Every
// node's data plane moves the MAC there the moment the VM shows up there;
// the target's node records that in its endpoint (spec.activated), and
// the FDBEntry then moves here with its sequence one higher and the
// source's node as the standby while the source pod lasts. A migration
// that fails leaves everything where it was: the standby goes with the
// target's endpoint.

// standbyIndex indexes FDBEntries by their standby endpoint
// (AnnotationStandbyEndpoint).
const standbyIndex = "lace.standby"

// activated tells whether ne's node reported the VM of MAC f at its port
// while f had its current sequence.
func activated(ne *lacev1.NetworkEndpoint, f *lacev1.FDBEntry) bool {
	a := ne.Spec.Activated
	if a == nil {
		return false
	}
	am, err1 := net.ParseMAC(string(a.MAC))
	fm, err2 := net.ParseMAC(string(f.Spec.MAC))
	return err1 == nil && err2 == nil && am.String() == fm.String() && uint32(a.Sequence) == uint32(f.Spec.Sequence)
}

// standBy names ne's node the standby of f.
func (r *L2AddressReconciler) standBy(ctx context.Context, f *lacev1.FDBEntry, ne *lacev1.NetworkEndpoint) error {
	key := ne.Namespace + "/" + ne.Name
	if f.Spec.Standby == ne.Spec.Node && f.Annotations[lacev1.AnnotationStandbyEndpoint] == key {
		return nil
	}
	next := f.DeepCopy()
	next.Spec.Standby = ne.Spec.Node
	if next.Annotations == nil {
		next.Annotations = map[string]string{}
	}
	next.Annotations[lacev1.AnnotationStandbyEndpoint] = key
	if err := r.Client.Patch(ctx, next, client.MergeFromWithOptions(f, client.MergeFromWithOptimisticLock{})); err != nil {
		return fmt.Errorf("name node %s the standby of MAC %s of network %s: %w", ne.Spec.Node, f.Spec.MAC, f.Spec.Network, err)
	}
	log.FromContext(ctx).Info("an l2 MAC has a standby (a live migration's target)", "mac", f.Spec.MAC, "network", f.Spec.Network,
		"node", f.Spec.Node, "standby", ne.Spec.Node, "networkEndpoint", key)
	return nil
}

// moveFDB moves f to ne's node with its sequence one higher. The node it
// leaves stays its standby while the pod there (the claim's owner until
// now, a migration's source) lives: a migration back, or the source's
// own frames until it is gone, are that pod's.
func (r *L2AddressReconciler) moveFDB(ctx context.Context, h *holder, f *lacev1.FDBEntry, ne *lacev1.NetworkEndpoint) error {
	next := f.DeepCopy()
	next.Spec.Node, next.Spec.Sequence, next.Spec.Publisher = ne.Spec.Node, f.Spec.Sequence+1, lacev1.PublisherController
	next.Spec.Standby = ""
	delete(next.Annotations, lacev1.AnnotationStandbyEndpoint)
	if c := h.claim; c != nil && c.Status.OwnerPod != nil && c.Status.OwnerPod.Name != ne.Name && r.podExists(ctx, c.Namespace, c.Status.OwnerPod.Name) {
		next.Spec.Standby = f.Spec.Node
		if next.Annotations == nil {
			next.Annotations = map[string]string{}
		}
		next.Annotations[lacev1.AnnotationStandbyEndpoint] = c.Namespace + "/" + c.Status.OwnerPod.Name
	}
	if err := r.Client.Patch(ctx, next, client.MergeFromWithOptions(f, client.MergeFromWithOptimisticLock{})); err != nil {
		return fmt.Errorf("move MAC %s of network %s to node %s: %w", f.Spec.MAC, f.Spec.Network, ne.Spec.Node, err)
	}
	log.FromContext(ctx).Info("moved an l2 MAC with its claim", "holder", h.key, "mac", f.Spec.MAC, "from", f.Spec.Node, "to", ne.Spec.Node,
		"sequence", next.Spec.Sequence, "standby", next.Spec.Standby)
	return nil
}

// dropStandby ends the standby of the endpoint key (gone) wherever it is
// one.
func dropStandby(ctx context.Context, c client.Client, key string) error {
	var fdbs lacev1.FDBEntryList
	if err := c.List(ctx, &fdbs, client.MatchingFields{standbyIndex: key}); err != nil {
		return fmt.Errorf("list FDBEntries with standby %s: %w", key, err)
	}
	for i := range fdbs.Items {
		f := &fdbs.Items[i]
		next := f.DeepCopy()
		next.Spec.Standby = ""
		delete(next.Annotations, lacev1.AnnotationStandbyEndpoint)
		if err := c.Patch(ctx, next, client.MergeFromWithOptions(f, client.MergeFromWithOptimisticLock{})); client.IgnoreNotFound(err) != nil {
			return fmt.Errorf("end the standby of MAC %s of network %s: %w", f.Spec.MAC, f.Spec.Network, err)
		}
		log.FromContext(ctx).Info("an l2 MAC's standby is gone", "mac", f.Spec.MAC, "network", f.Spec.Network, "networkEndpoint", key)
	}
	return nil
}

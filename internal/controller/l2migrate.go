package controller

import (
	"context"
	"fmt"
	"net"
	"strings"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/client-go/util/workqueue"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

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
// target's endpoint. Every change of the standby raises the sequence, so a
// node's move toward an earlier standby never holds for a later one; an
// endpoint gone wakes the other pods of its MAC (siblingsOf), so the claim
// follows a remaining pod and a remaining target stands by again.

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

// standBy names ne's node the standby of f, unless another live endpoint
// stands by already (one migration at a time: the first target stands by
// until it goes, then the next one does).
func (r *L2AddressReconciler) standBy(ctx context.Context, f *lacev1.FDBEntry, ne *lacev1.NetworkEndpoint) error {
	key := ne.Namespace + "/" + ne.Name
	cur := f.Annotations[lacev1.AnnotationStandbyEndpoint]
	if f.Spec.Standby == ne.Spec.Node && cur == key {
		return nil
	}
	// An annotation that is no endpoint's key (edited by hand) names no
	// endpoint: read as one, the client refuses the name and the target
	// would never stand by.
	if ns, name, ok := strings.Cut(cur, "/"); ok && cur != key && len(validation.IsDNS1123Label(ns)) == 0 &&
		len(validation.IsDNS1123Subdomain(name)) == 0 {
		var other lacev1.NetworkEndpoint
		err := r.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: name}, &other)
		if err == nil && other.DeletionTimestamp == nil {
			return nil
		}
		if !apierrors.IsNotFound(err) && err != nil {
			return fmt.Errorf("get the standby endpoint %s: %w", cur, err)
		}
	}
	next := f.DeepCopy()
	// A new standby is a new sequence: a move a node made toward an
	// earlier one (an aborted migration) never holds for it.
	next.Spec.Standby, next.Spec.Sequence = ne.Spec.Node, f.Spec.Sequence+1
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
// leaves stays its standby while the claim's pod there (a migration's
// source) lives: a migration back is that pod's.
func (r *L2AddressReconciler) moveFDB(ctx context.Context, h *holder, f *lacev1.FDBEntry, ne *lacev1.NetworkEndpoint) error {
	next := f.DeepCopy()
	next.Spec.Node, next.Spec.Sequence, next.Spec.Publisher = ne.Spec.Node, f.Spec.Sequence+1, lacev1.PublisherController
	next.Spec.Standby = ""
	delete(next.Annotations, lacev1.AnnotationStandbyEndpoint)
	if h.claim != nil {
		left, err := r.podOfMACOn(ctx, ne.Namespace, f)
		if err != nil {
			return err
		}
		if left != "" && left != ne.Name {
			next.Spec.Standby = f.Spec.Node
			if next.Annotations == nil {
				next.Annotations = map[string]string{}
			}
			next.Annotations[lacev1.AnnotationStandbyEndpoint] = ne.Namespace + "/" + left
		}
	}
	if err := r.Client.Patch(ctx, next, client.MergeFromWithOptions(f, client.MergeFromWithOptimisticLock{})); err != nil {
		return fmt.Errorf("move MAC %s of network %s to node %s: %w", f.Spec.MAC, f.Spec.Network, ne.Spec.Node, err)
	}
	log.FromContext(ctx).Info("moved an l2 MAC with its claim", "holder", h.key, "mac", f.Spec.MAC, "from", f.Spec.Node, "to", ne.Spec.Node,
		"sequence", next.Spec.Sequence, "standby", next.Spec.Standby)
	return nil
}

// podOfMACOn is the live endpoint of namespace ns given f's MAC on f's
// node ("": none), the pod the MAC leaves when it moves.
func (r *L2AddressReconciler) podOfMACOn(ctx context.Context, ns string, f *lacev1.FDBEntry) (string, error) {
	var list lacev1.NetworkEndpointList
	if err := r.Client.List(ctx, &list, client.InNamespace(ns), client.MatchingLabels{lacev1.LabelNode: f.Spec.Node}); err != nil {
		return "", fmt.Errorf("list NetworkEndpoints of %s on %s: %w", ns, f.Spec.Node, err)
	}
	fm, _ := net.ParseMAC(string(f.Spec.MAC))
	for _, o := range list.Items {
		m, err := net.ParseMAC(string(o.Status.MAC))
		if err == nil && o.DeletionTimestamp == nil && o.Spec.Node == f.Spec.Node && o.Spec.Network == f.Spec.Network && m.String() == fm.String() {
			return o.Name, nil
		}
	}
	return "", nil
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
		next.Spec.Standby, next.Spec.Sequence = "", f.Spec.Sequence+1
		delete(next.Annotations, lacev1.AnnotationStandbyEndpoint)
		if err := c.Patch(ctx, next, client.MergeFromWithOptions(f, client.MergeFromWithOptimisticLock{})); client.IgnoreNotFound(err) != nil {
			return fmt.Errorf("end the standby of MAC %s of network %s: %w", f.Spec.MAC, f.Spec.Network, err)
		}
		log.FromContext(ctx).Info("an l2 MAC's standby is gone", "mac", f.Spec.MAC, "network", f.Spec.Network, "networkEndpoint", key)
	}
	return nil
}

// siblingsOf maps a deleted NetworkEndpoint to the others of its
// namespace with its MAC: the other pods of its IPAMClaim (a migration's
// source or target), which may now own the claim or stand by.
func siblingsOf(c client.Client) handler.EventHandler {
	return handler.Funcs{DeleteFunc: func(ctx context.Context, e event.TypedDeleteEvent[client.Object], q workqueue.TypedRateLimitingInterface[reconcile.Request]) {
		ne, ok := e.Object.(*lacev1.NetworkEndpoint)
		if !ok || ne.Status.MAC == "" {
			return
		}
		var list lacev1.NetworkEndpointList
		if err := c.List(ctx, &list, client.InNamespace(ne.Namespace)); err != nil {
			log.FromContext(ctx).Error(err, "list the siblings of a deleted endpoint", "networkEndpoint", ne.Namespace+"/"+ne.Name)
			return
		}
		for _, o := range list.Items {
			if o.Name != ne.Name && o.Spec.Network == ne.Spec.Network && o.Status.MAC == ne.Status.MAC {
				q.Add(reconcile.Request{NamespacedName: types.NamespacedName{Namespace: o.Namespace, Name: o.Name}})
			}
		}
	}}
}

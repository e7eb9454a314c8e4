// Package predicates holds the watch filters of the agent and the
// controller: an event reaches a reconciler only when it changes something
// that reconciler reads. Most updates a cluster makes at rest (kubelet
// heartbeats in Node status, other components' status writes, managed
// fields) change nothing Lace reads; passing them on would cost a
// reconcile per object per heartbeat on every node.
package predicates

import (
	"maps"
	"slices"

	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
)

// SpecOrLifecycleChanged passes creations, deletions, and updates that
// change the spec (metadata.generation: status writes of objects with a
// status subresource leave it alone), the labels, or the deletion
// timestamp. It is for objects whose status the reconciler does not read.
func SpecOrLifecycleChanged() predicate.Predicate {
	return predicate.Funcs{UpdateFunc: func(e event.UpdateEvent) bool {
		return SpecOrLifecycleUpdate(e.ObjectOld, e.ObjectNew)
	}}
}

// SpecOrLifecycleUpdate reports whether an update from old to new changes
// the generation, the labels or the deletion timestamp.
func SpecOrLifecycleUpdate(old, new client.Object) bool {
	if old == nil || new == nil {
		return true
	}
	return old.GetGeneration() != new.GetGeneration() ||
		!maps.Equal(old.GetLabels(), new.GetLabels()) ||
		deleting(old) != deleting(new)
}

// Existence passes creations and deletions only: for watches that ask
// whether an object exists at all (a binding policy naming a network).
func Existence() predicate.Predicate {
	return predicate.Funcs{
		UpdateFunc: func(e event.UpdateEvent) bool {
			return e.ObjectOld == nil || e.ObjectNew == nil || deleting(e.ObjectOld) != deleting(e.ObjectNew)
		},
		GenericFunc: func(event.GenericEvent) bool { return false },
	}
}

// NodeChanged passes Node creations and deletions, and updates that
// change labels (the zone) or the deletion timestamp. The kubelet's status
// heartbeats (conditions, images, allocatable) never pass.
func NodeChanged() predicate.Predicate {
	return predicate.Funcs{UpdateFunc: func(e event.UpdateEvent) bool {
		return NodeUpdate(e.ObjectOld, e.ObjectNew)
	}}
}

// NodeUpdate reports whether a Node update matters to the agent.
func NodeUpdate(old, new client.Object) bool {
	if old == nil || new == nil {
		return true
	}
	on, ok1 := old.(*corev1.Node)
	nn, ok2 := new.(*corev1.Node)
	if ok1 && ok2 && !slices.Equal(on.Status.Addresses, nn.Status.Addresses) {
		return true // the addresses it reports bound its UnderlayEndpoint's (model.AcceptUnderlays)
	}
	return !maps.Equal(old.GetLabels(), new.GetLabels()) || deleting(old) != deleting(new)
}

// PodChanged passes Pod creations and deletions, and updates that change
// what the agent reads of a pod: its node, phase, addresses, labels or
// deletion timestamp. Condition and container status churn does not pass.
func PodChanged() predicate.Predicate {
	return predicate.Funcs{UpdateFunc: func(e event.UpdateEvent) bool {
		return PodUpdate(e.ObjectOld, e.ObjectNew)
	}}
}

// PodUpdate reports whether a Pod update matters to the agent.
func PodUpdate(old, new client.Object) bool {
	o, ok1 := old.(*corev1.Pod)
	n, ok2 := new.(*corev1.Pod)
	if !ok1 || !ok2 {
		return true
	}
	return o.Spec.NodeName != n.Spec.NodeName ||
		o.Status.Phase != n.Status.Phase ||
		!slices.Equal(o.Status.PodIPs, n.Status.PodIPs) ||
		!maps.Equal(o.Labels, n.Labels) ||
		deleting(o) != deleting(n)
}

func deleting(o client.Object) bool { return o.GetDeletionTimestamp() != nil }

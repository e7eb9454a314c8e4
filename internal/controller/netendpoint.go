package controller

import (
	"context"
	"fmt"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/client-go/tools/record"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	lacev1 "github.com/lace-cni/lace/api/v1alpha1"
)

// ReasonForeignNetworkEndpoint is the Warning on a NetworkEndpoint the
// controller deletes because no pod of that name runs on its node.
const ReasonForeignNetworkEndpoint = "ForeignNetworkEndpoint"

// NetworkEndpointReconciler deletes NetworkEndpoints that no pod on their
// node stands behind: the pod of that name is missing, or it is scheduled
// to another node (or to none). The admission policy lets an agent write
// NetworkEndpoints for its own node under any name; one written under the
// name of another node's pod (before or after that pod is created) would
// keep that node's agent from writing the real one. Consumers already
// ignore such an object (model.PodAddrIndex), and the owning agent keeps
// retrying (ensureNetworkEndpoints), so removing it restores the pod's
// record. Pods are read from the API, not watched: the trigger is the
// NetworkEndpoint itself, and an agent writes a pod's record only after
// the pod is on its node.
type NetworkEndpointReconciler struct {
	Client    client.Client
	APIReader client.Reader
	Recorder  record.EventRecorder
}

// SetupWithManager registers the reconciler (creations and spec changes).
func (r *NetworkEndpointReconciler) SetupWithManager(mgr ctrl.Manager) error {
	return ctrl.NewControllerManagedBy(mgr).
		Named("networkendpoint").
		For(&lacev1.NetworkEndpoint{}, builder.WithPredicates(predicate.Or(predicate.GenerationChangedPredicate{}, predicate.LabelChangedPredicate{}))).
		Complete(r)
}

// Reconcile implements reconcile.Reconciler.
func (r *NetworkEndpointReconciler) Reconcile(ctx context.Context, req reconcile.Request) (reconcile.Result, error) {
	var ne lacev1.NetworkEndpoint
	if err := r.Client.Get(ctx, req.NamespacedName, &ne); err != nil {
		return reconcile.Result{}, client.IgnoreNotFound(err)
	}
	if ne.DeletionTimestamp != nil {
		return reconcile.Result{}, nil
	}
	// The API, not a cache: a pod created a moment ago must be seen.
	var pod corev1.Pod
	err := r.APIReader.Get(ctx, req.NamespacedName, &pod)
	var why string
	switch {
	case apierrors.IsNotFound(err):
		why = "no pod of that name exists"
	case err != nil:
		return reconcile.Result{}, fmt.Errorf("get pod %s: %w", req.NamespacedName, err)
	case pod.Spec.NodeName != ne.Spec.Node:
		why = fmt.Sprintf("its pod is on node %q", pod.Spec.NodeName)
	default:
		return reconcile.Result{}, nil
	}
	r.Recorder.Eventf(&ne, corev1.EventTypeWarning, ReasonForeignNetworkEndpoint,
		"NetworkEndpoint of node %q deleted: %s", ne.Spec.Node, why)
	log.FromContext(ctx).Info("deleting foreign NetworkEndpoint", "networkEndpoint", req.NamespacedName, "node", ne.Spec.Node, "why", why)
	if err := r.Client.Delete(ctx, &ne, client.Preconditions{UID: &ne.UID, ResourceVersion: &ne.ResourceVersion}); err != nil &&
		!apierrors.IsNotFound(err) {
		// A conflict (the object changed since read) is retried with
		// backoff like any error.
		return reconcile.Result{}, fmt.Errorf("delete NetworkEndpoint %s: %w", req.NamespacedName, err)
	}
	return reconcile.Result{}, nil
}

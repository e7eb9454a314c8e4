package controller

import (
	"context"
	"fmt"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/record"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	lacev1 "github.com/lace-cni/lace/api/v1alpha1"
	"github.com/lace-cni/lace/internal/predicates"
)

// BindingPolicyReconciler reports on each NetworkBindingPolicy whether the
// network it names exists, so that a typo shows in `kubectl get nbp` and as
// an Event rather than only as failing pods.
type BindingPolicyReconciler struct {
	Client   client.Client
	Recorder record.EventRecorder
}

// SetupWithManager registers the reconciler.
func (r *BindingPolicyReconciler) SetupWithManager(mgr ctrl.Manager) error {
	return ctrl.NewControllerManagedBy(mgr).
		Named("bindingpolicy").
		// The policy's own status writes change nothing it reads.
		For(&lacev1.NetworkBindingPolicy{}, builder.WithPredicates(predicate.GenerationChangedPredicate{})).
		// Only whether a network exists matters here, not its status.
		Watches(&lacev1.Network{}, handler.EnqueueRequestsFromMapFunc(func(ctx context.Context, o client.Object) []reconcile.Request {
			var list lacev1.NetworkBindingPolicyList
			if err := r.Client.List(ctx, &list); err != nil {
				return nil
			}
			var out []reconcile.Request
			for _, p := range list.Items {
				if p.Spec.Network == o.GetName() {
					out = append(out, reconcile.Request{NamespacedName: types.NamespacedName{Name: p.Name}})
				}
			}
			return out
		}), builder.WithPredicates(predicates.Existence())).
		Complete(r)
}

// Reconcile implements reconcile.Reconciler.
func (r *BindingPolicyReconciler) Reconcile(ctx context.Context, req reconcile.Request) (reconcile.Result, error) {
	var p lacev1.NetworkBindingPolicy
	if err := r.Client.Get(ctx, req.NamespacedName, &p); err != nil {
		return reconcile.Result{}, client.IgnoreNotFound(err)
	}
	cond := metav1.Condition{Type: lacev1.ConditionReady, Status: metav1.ConditionTrue, Reason: ReasonNetworkFound,
		Message: "network " + p.Spec.Network + " exists", ObservedGeneration: p.Generation}
	var nw lacev1.Network
	if err := r.Client.Get(ctx, types.NamespacedName{Name: p.Spec.Network}, &nw); err != nil {
		if !apierrors.IsNotFound(err) {
			return reconcile.Result{}, fmt.Errorf("get network %s: %w", p.Spec.Network, err)
		}
		cond.Status, cond.Reason = metav1.ConditionFalse, ReasonNetworkNotFound
		cond.Message = fmt.Sprintf("network %s does not exist: resources this policy matches cannot be attached", p.Spec.Network)
	}
	status := p.Status.DeepCopy()
	meta.SetStatusCondition(&status.Conditions, cond)
	if equality.Semantic.DeepEqual(&p.Status, status) {
		return reconcile.Result{}, nil
	}
	if cond.Status == metav1.ConditionFalse {
		r.Recorder.Event(&p, corev1.EventTypeWarning, ReasonNetworkNotFound, cond.Message)
	}
	p.Status = *status
	if err := r.Client.Status().Update(ctx, &p); err != nil {
		return reconcile.Result{}, fmt.Errorf("update binding policy status: %w", err)
	}
	return reconcile.Result{}, nil
}

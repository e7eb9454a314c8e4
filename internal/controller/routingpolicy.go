package controller

import (
	"context"
	"fmt"
	"maps"
	"sort"
	"strings"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/record"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	lacev1 "github.com/lace-cni/lace/api/v1alpha1"
	"github.com/lace-cni/lace/internal/model"
)

// Reasons of a NetworkRoutingPolicy's Ready condition.
const (
	ReasonAccepted              = "Accepted"
	ReasonNoSourceNetworks      = "NoSourceNetworks"
	ReasonNoDestinationNetworks = "NoDestinationNetworks"
	ReasonInvalidSelector       = "InvalidSelector"
	ReasonPeeringConflict       = "PeeringConflict"
)

// maxRefusedInMessage bounds the refused pairs a condition message lists:
// a mesh over many overlapping networks would otherwise outgrow it.
const maxRefusedInMessage = 20

// RoutingPolicyReconciler reports on each NetworkRoutingPolicy which
// networks its selectors match and whether every pair it selects is in
// effect, so that a selector typo or a refused peering shows in
// `kubectl get nrp` and as an Event rather than only as dropped packets.
// It decides nothing: which peerings are refused is the model's answer
// (model.ViewOf), the same one the agents' tables and the oracle give.
type RoutingPolicyReconciler struct {
	Client   client.Client
	Recorder record.EventRecorder
}

// SetupWithManager registers the reconciler.
func (r *RoutingPolicyReconciler) SetupWithManager(mgr ctrl.Manager) error {
	all := handler.EnqueueRequestsFromMapFunc(r.allPolicies)
	return ctrl.NewControllerManagedBy(mgr).
		Named("routingpolicy").
		// The policy's own status writes change nothing it reads.
		For(&lacev1.NetworkRoutingPolicy{}, builder.WithPredicates(predicate.GenerationChangedPredicate{})).
		// Which peer wins an overlap depends on the other policies (the
		// earlier name keeps its place), so a policy appearing, going or
		// changing its selectors concerns every policy.
		Watches(&lacev1.NetworkRoutingPolicy{}, all, builder.WithPredicates(predicate.GenerationChangedPredicate{})).
		// A network matters when it appears, goes, changes its labels or
		// subnets, or enters the data plane (gets its ID); its other status
		// churn (blocks, conditions) does not.
		Watches(&lacev1.Network{}, all, builder.WithPredicates(networkTopologyChanged())).
		Complete(r)
}

// allPolicies enqueues every NetworkRoutingPolicy: a network or a policy
// can change any policy's matches and conflicts.
func (r *RoutingPolicyReconciler) allPolicies(ctx context.Context, _ client.Object) []reconcile.Request {
	var list lacev1.NetworkRoutingPolicyList
	if err := r.Client.List(ctx, &list); err != nil {
		return nil
	}
	out := make([]reconcile.Request, 0, len(list.Items))
	for _, p := range list.Items {
		out = append(out, reconcile.Request{NamespacedName: types.NamespacedName{Name: p.Name}})
	}
	return out
}

// networkTopologyChanged passes Network creations and deletions, and
// updates that change what model.Topology reads of a network: its labels,
// its spec (generation: type, subnets, external prefixes, anonymous) or
// whether it has an ID.
func networkTopologyChanged() predicate.Predicate {
	return predicate.Funcs{
		UpdateFunc: func(e event.UpdateEvent) bool {
			o, ok1 := e.ObjectOld.(*lacev1.Network)
			n, ok2 := e.ObjectNew.(*lacev1.Network)
			if !ok1 || !ok2 {
				return true
			}
			return o.Generation != n.Generation || o.Status.ID != n.Status.ID || !maps.Equal(o.Labels, n.Labels)
		},
		GenericFunc: func(event.GenericEvent) bool { return false },
	}
}

// Reconcile implements reconcile.Reconciler. It writes the status only when
// it changes, and emits a Warning Event only when the Ready condition turns
// False or names a different problem than before: an idle cluster makes no
// writes.
func (r *RoutingPolicyReconciler) Reconcile(ctx context.Context, req reconcile.Request) (reconcile.Result, error) {
	var p lacev1.NetworkRoutingPolicy
	if err := r.Client.Get(ctx, req.NamespacedName, &p); err != nil {
		return reconcile.Result{}, client.IgnoreNotFound(err)
	}
	var nets lacev1.NetworkList
	if err := r.Client.List(ctx, &nets); err != nil {
		return reconcile.Result{}, fmt.Errorf("list networks: %w", err)
	}
	var pols lacev1.NetworkRoutingPolicyList
	if err := r.Client.List(ctx, &pols); err != nil {
		return reconcile.Result{}, fmt.Errorf("list routing policies: %w", err)
	}
	status := routingPolicyStatus(&p, model.Topology{Networks: nets.Items, RoutingPolicies: pols.Items})
	prev := meta.FindStatusCondition(p.Status.Conditions, lacev1.ConditionReady)
	var was metav1.Condition
	if prev != nil {
		was = *prev
	}
	if equality.Semantic.DeepEqual(&p.Status, status) {
		return reconcile.Result{}, nil
	}
	p.Status = *status
	if err := r.Client.Status().Update(ctx, &p); err != nil {
		return reconcile.Result{}, fmt.Errorf("update routing policy status: %w", err)
	}
	// After the write, so that a retried conflicting update does not
	// repeat the Event.
	now := meta.FindStatusCondition(status.Conditions, lacev1.ConditionReady)
	if now.Status == metav1.ConditionFalse &&
		(was.Status != metav1.ConditionFalse || was.Reason != now.Reason || was.Message != now.Message) {
		r.Recorder.Event(&p, corev1.EventTypeWarning, now.Reason, now.Message)
	}
	return reconcile.Result{}, nil
}

// routingPolicyStatus computes the status of p in t (which holds p among
// its policies). Matching follows the model: only networks with an ID are
// in the data plane, a nil or invalid selector matches nothing.
func routingPolicyStatus(p *lacev1.NetworkRoutingPolicy, t model.Topology) *lacev1.NetworkRoutingPolicyStatus {
	status := p.Status.DeepCopy()
	status.ObservedGeneration = p.Generation
	cond := metav1.Condition{Type: lacev1.ConditionReady, ObservedGeneration: p.Generation}

	src, srcErr := selector(p.Spec.SrcSelector)
	dst, dstErr := selector(p.Spec.DestSelector)
	status.MatchedSources, status.MatchedDestinations = nil, nil
	for _, n := range t.Networks {
		if n.Status.ID <= 0 {
			continue
		}
		set := labels.Set(n.Labels)
		if srcErr == nil && src.Matches(set) {
			status.MatchedSources = append(status.MatchedSources, n.Name)
		}
		if dstErr == nil && dst.Matches(set) {
			status.MatchedDestinations = append(status.MatchedDestinations, n.Name)
		}
	}
	sort.Strings(status.MatchedSources)
	sort.Strings(status.MatchedDestinations)

	switch {
	case srcErr != nil || dstErr != nil:
		cond.Status, cond.Reason = metav1.ConditionFalse, ReasonInvalidSelector
		var msgs []string
		if srcErr != nil {
			msgs = append(msgs, "srcSelector: "+srcErr.Error())
		}
		if dstErr != nil {
			msgs = append(msgs, "destSelector: "+dstErr.Error())
		}
		cond.Message = strings.Join(msgs, "; ")
	case len(status.MatchedSources) == 0:
		cond.Status, cond.Reason = metav1.ConditionFalse, ReasonNoSourceNetworks
		cond.Message = "srcSelector matches no network with an ID: the policy opens nothing"
		if len(status.MatchedDestinations) == 0 {
			cond.Message += " (destSelector matches none either)"
		}
	case len(status.MatchedDestinations) == 0:
		cond.Status, cond.Reason = metav1.ConditionFalse, ReasonNoDestinationNetworks
		cond.Message = "destSelector matches no network with an ID: the policy opens nothing"
	default:
		var refused []string
		for _, s := range status.MatchedSources {
			for _, c := range model.ViewOf(t, s).Refused {
				if c.Policy == p.Name {
					refused = append(refused, c.String())
				}
			}
		}
		if len(refused) > maxRefusedInMessage {
			refused = append(refused[:maxRefusedInMessage], fmt.Sprintf("and %d more", len(refused)-maxRefusedInMessage))
		}
		if len(refused) > 0 {
			cond.Status, cond.Reason = metav1.ConditionFalse, ReasonPeeringConflict
			cond.Message = strings.Join(refused, "; ") + " (overlapping pod networks never share a view; the other pairs are in effect)"
		} else {
			cond.Status, cond.Reason = metav1.ConditionTrue, ReasonAccepted
			cond.Message = fmt.Sprintf("%d source and %d destination network(s), every pair in effect",
				len(status.MatchedSources), len(status.MatchedDestinations))
		}
	}
	meta.SetStatusCondition(&status.Conditions, cond)
	return status
}

// selector parses a policy selector; nil selects nothing (the field is
// required, so nil comes only from a client that skipped validation).
func selector(s *metav1.LabelSelector) (labels.Selector, error) {
	if s == nil {
		return labels.Nothing(), nil
	}
	sel, err := metav1.LabelSelectorAsSelector(s)
	if err != nil {
		return nil, fmt.Errorf("invalid selector: %w", err)
	}
	return sel, nil
}

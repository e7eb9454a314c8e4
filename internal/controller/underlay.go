package controller

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"strings"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
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
	"github.com/lace-cni/lace/internal/predicates"
)

// Condition on an UnderlayEndpoint saying whether every address the node
// wrote in it is believed (model.AcceptUnderlays). The controller writes
// it; the agent writes Ready.
const (
	UnderlayAddressesAccepted = "AddressesAccepted"
	ReasonAddressesAccepted   = "AddressesAccepted"
)

// acceptedUnderlays lists the UnderlayEndpoints with only the addresses
// the model believes, and the refused ones: what every agent computes.
func acceptedUnderlays(ctx context.Context, c client.Reader, allowed []netip.Prefix) ([]lacev1.UnderlayEndpoint, []model.RefusedUnderlayAddress, error) {
	var ueps lacev1.UnderlayEndpointList
	var nodes corev1.NodeList
	var nets lacev1.NetworkList
	var cidrs networkingv1.ServiceCIDRList
	var lbcs lacev1.LoadBalancerClassList
	for _, l := range []client.ObjectList{&ueps, &nodes, &nets, &cidrs, &lbcs} {
		if err := c.List(ctx, l); err != nil {
			return nil, nil, fmt.Errorf("list %T: %w", l, err)
		}
	}
	acc, refused := model.AcceptUnderlays(model.UnderlayInput{Underlays: ueps.Items, Nodes: nodes.Items, Networks: nets.Items,
		ServiceCIDRs: model.ServiceCIDRPrefixes(cidrs.Items), LoadBalancerPools: lbcs.Items, AllowedExternalIPs: allowed})
	return acc, refused, nil
}

// UnderlayAddressReconciler reports the addresses of UnderlayEndpoints
// that are not believed: condition AddressesAccepted False on the
// endpoint's status and a Warning Event, once per change.
type UnderlayAddressReconciler struct {
	Client   client.Client
	Recorder record.EventRecorder
	Allowed  []netip.Prefix
}

var underlayAddressKey = reconcile.Request{NamespacedName: types.NamespacedName{Name: "underlay-addresses"}}

// SetupWithManager registers the reconciler: one pass judges every
// endpoint, since a claim contends with the others.
func (r *UnderlayAddressReconciler) SetupWithManager(mgr ctrl.Manager) error {
	one := handler.EnqueueRequestsFromMapFunc(func(context.Context, client.Object) []reconcile.Request {
		return []reconcile.Request{underlayAddressKey}
	})
	// The agent's status patches may drop the condition (a merge patch
	// replaces the list): status changes come back here too.
	condChanged := predicate.Funcs{UpdateFunc: func(e event.UpdateEvent) bool {
		o, n := e.ObjectOld.(*lacev1.UnderlayEndpoint), e.ObjectNew.(*lacev1.UnderlayEndpoint)
		return o.Generation != n.Generation ||
			!equalCond(meta.FindStatusCondition(o.Status.Conditions, UnderlayAddressesAccepted), meta.FindStatusCondition(n.Status.Conditions, UnderlayAddressesAccepted))
	}}
	return ctrl.NewControllerManagedBy(mgr).
		Named("underlayaddress").
		Watches(&lacev1.UnderlayEndpoint{}, one, builder.WithPredicates(condChanged)).
		Watches(&corev1.Node{}, one, builder.WithPredicates(predicates.NodeChanged())).
		Watches(&lacev1.Network{}, one, builder.WithPredicates(predicate.GenerationChangedPredicate{})).
		Watches(&networkingv1.ServiceCIDR{}, one).
		Watches(&lacev1.LoadBalancerClass{}, one, builder.WithPredicates(predicate.GenerationChangedPredicate{})).
		Complete(r)
}

func equalCond(a, b *metav1.Condition) bool {
	if a == nil || b == nil {
		return a == b
	}
	return a.Status == b.Status && a.Reason == b.Reason && a.Message == b.Message
}

// Reconcile writes every endpoint's AddressesAccepted condition.
func (r *UnderlayAddressReconciler) Reconcile(ctx context.Context, _ reconcile.Request) (reconcile.Result, error) {
	var ueps lacev1.UnderlayEndpointList
	if err := r.Client.List(ctx, &ueps); err != nil {
		return reconcile.Result{}, fmt.Errorf("list underlay endpoints: %w", err)
	}
	_, refused, err := acceptedUnderlays(ctx, r.Client, r.Allowed)
	if err != nil {
		return reconcile.Result{}, err
	}
	byNode := map[string][]model.RefusedUnderlayAddress{}
	for _, x := range refused {
		byNode[x.Node] = append(byNode[x.Node], x)
	}
	var errs []error
	for i := range ueps.Items {
		u := &ueps.Items[i]
		want := metav1.Condition{Type: UnderlayAddressesAccepted, Status: metav1.ConditionTrue, Reason: ReasonAddressesAccepted,
			Message: "every address is believed", ObservedGeneration: u.Generation}
		if rs := byNode[u.Spec.Node]; len(rs) > 0 {
			msgs := make([]string, 0, len(rs))
			for _, x := range rs {
				msgs = append(msgs, x.Message)
			}
			want.Status, want.Reason = metav1.ConditionFalse, rs[0].Reason
			want.Message = "addresses refused (no node trusts or routes them): " + strings.Join(msgs, "; ")
		}
		cur := meta.FindStatusCondition(u.Status.Conditions, UnderlayAddressesAccepted)
		if equalCond(cur, &want) {
			continue
		}
		patch := client.MergeFrom(u.DeepCopy())
		meta.SetStatusCondition(&u.Status.Conditions, want)
		if err := r.Client.Status().Patch(ctx, u, patch); client.IgnoreNotFound(err) != nil {
			errs = append(errs, fmt.Errorf("patch underlay endpoint %s status: %w", u.Name, err))
			continue
		}
		if want.Status == metav1.ConditionFalse && (cur == nil || cur.Message != want.Message) {
			r.Recorder.Event(u, corev1.EventTypeWarning, want.Reason, want.Message)
		}
	}
	return reconcile.Result{}, errors.Join(errs...)
}

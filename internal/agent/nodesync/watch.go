package nodesync

import (
	"context"
	"fmt"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	networkingv1 "k8s.io/api/networking/v1"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/manager"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
	"sigs.k8s.io/controller-runtime/pkg/source"

	lacev1 "github.com/lace-cni/lace/api/v1alpha1"
	"github.com/lace-cni/lace/internal/predicates"
)

// SetupWithManager makes the node's controller: every watch enqueues the
// one node key, and Reconcile applies. hostPods is the cache of the
// cluster's hostNetwork pods.
func (s *Syncer) SetupWithManager(mgr manager.Manager, hostPods cache.Cache) error {
	toNode := handler.EnqueueRequestsFromMapFunc(func(context.Context, client.Object) []reconcile.Request {
		return []reconcile.Request{{}}
	})
	// Each watch passes only what the node's desired state reads: a
	// network's status (its ID) does matter; status writes of the other
	// kinds (other agents' UnderlayEndpoint status, binding policy
	// conditions), Node heartbeats and pod condition churn do not.
	specOnly := builder.WithPredicates(predicates.SpecOrLifecycleChanged())
	// What the services' computation learns of NetworkEndpoints comes from
	// their informer's events (nePending), registered before it starts.
	if s.cache != nil {
		inf, err := s.cache.GetInformer(context.Background(), &lacev1.NetworkEndpoint{})
		if err != nil {
			return fmt.Errorf("informer of NetworkEndpoints: %w", err)
		}
		if err := s.nePending.register(inf); err != nil {
			return err
		}
	}
	return ctrl.NewControllerManagedBy(mgr).
		Named("node-dataplane").
		Watches(&lacev1.Network{}, toNode, builder.WithPredicates(predicate.ResourceVersionChangedPredicate{})).
		Watches(&lacev1.Allocation{}, toNode, specOnly).
		// Where l2 networks' addresses live (lace-controller's).
		Watches(&lacev1.Neighbor{}, toNode, specOnly).
		Watches(&lacev1.FDBEntry{}, toNode, specOnly).
		Watches(&lacev1.UnderlayEndpoint{}, toNode, specOnly).
		Watches(&lacev1.NetworkRoutingPolicy{}, toNode, specOnly).
		Watches(&lacev1.NetworkBindingPolicy{}, toNode, specOnly).
		Watches(&lacev1.ServiceRoutingPolicy{}, toNode, specOnly).
		// Services and their endpoints, as kube-proxy watches them (a
		// Service's status holds its load balancer addresses).
		Watches(&corev1.Service{}, toNode, builder.WithPredicates(predicate.ResourceVersionChangedPredicate{})).
		Watches(&discoveryv1.EndpointSlice{}, toNode, builder.WithPredicates(predicate.ResourceVersionChangedPredicate{})).
		Watches(&networkingv1.ServiceCIDR{}, toNode, specOnly).
		// Pools are never a node's underlay address (model.AcceptUnderlays).
		Watches(&lacev1.LoadBalancerClass{}, toNode, specOnly).
		Watches(&corev1.Pod{}, toNode, builder.WithPredicates(predicates.PodChanged())).
		Watches(&corev1.Node{}, toNode, builder.WithPredicates(predicates.NodeChanged())).
		// hostNetwork pods: which node each is on, and when it leaves.
		WatchesRawSource(source.Kind[client.Object](hostPods, &corev1.Pod{}, toNode, predicate.Funcs{
			UpdateFunc: func(e event.UpdateEvent) bool {
				o, n := e.ObjectOld.(*corev1.Pod), e.ObjectNew.(*corev1.Pod)
				return o.Spec.NodeName != n.Spec.NodeName || (o.DeletionTimestamp == nil) != (n.DeletionTimestamp == nil)
			},
		})).
		// A NetworkEndpoint deleted or changed behind the agent's back is
		// written again (its own creations need no reconcile).
		Watches(&lacev1.NetworkEndpoint{}, toNode, builder.WithPredicates(predicate.Funcs{
			CreateFunc: func(event.CreateEvent) bool { return false },
			UpdateFunc: func(e event.UpdateEvent) bool {
				return e.ObjectOld.GetGeneration() != e.ObjectNew.GetGeneration()
			},
			DeleteFunc: func(event.DeleteEvent) bool { return true },
		})).
		// Namespace labels bind services (namespaceSelector) and scope
		// ServiceRoutingPolicies; for pods they matter at CNI ADD only.
		Watches(&corev1.Namespace{}, toNode, builder.WithPredicates(predicate.LabelChangedPredicate{})).
		WithOptions(controller.Options{MaxConcurrentReconciles: 1}).
		Complete(reconcile.Func(s.Reconcile))
}

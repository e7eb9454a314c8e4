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
	// Services, EndpointSlices and NetworkEndpoints reach the computation
	// through their informers' handlers (feeds), which kick the node key
	// through kicks once a change is recorded (one pending kick is
	// enough: a computation takes every change recorded before it).
	kicks := make(chan event.GenericEvent, 1)
	if err := s.feeds(func() {
		select {
		case kicks <- event.GenericEvent{Object: &corev1.Node{}}:
		default:
		}
	}); err != nil {
		return err
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
		// Services and their endpoints (a Service's status holds its load
		// balancer addresses), and NetworkEndpoints (the node's own,
		// deleted or changed behind its back, are written again): their
		// handlers kick once they recorded the change.
		WatchesRawSource(source.Channel(kicks, toNode)).
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
		// Namespace labels bind services (namespaceSelector) and scope
		// ServiceRoutingPolicies; for pods they matter at CNI ADD only.
		Watches(&corev1.Namespace{}, toNode, builder.WithPredicates(predicate.LabelChangedPredicate{})).
		WithOptions(controller.Options{MaxConcurrentReconciles: 1}).
		Complete(reconcile.Func(s.Reconcile))
}

// feeds registers the handlers of svcMirror and nePending with the
// manager's informers, before they start.
func (s *Syncer) feeds(kick func()) error {
	if s.cache == nil {
		return fmt.Errorf("the node's controller needs the manager's cache")
	}
	get := func(obj client.Object) (cache.Informer, error) {
		inf, err := s.cache.GetInformer(context.Background(), obj)
		if err != nil {
			return nil, fmt.Errorf("informer of %T: %w", obj, err)
		}
		return inf, nil
	}
	nes, err := get(&lacev1.NetworkEndpoint{})
	if err != nil {
		return err
	}
	svcs, err := get(&corev1.Service{})
	if err != nil {
		return err
	}
	sls, err := get(&discoveryv1.EndpointSlice{})
	if err != nil {
		return err
	}
	if err := s.nePending.register(nes, kick); err != nil {
		return err
	}
	return s.mirror.register(svcs, sls, kick)
}

package controller

import (
	"context"
	"fmt"
	"net/netip"
	"sort"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/record"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	lacev1 "github.com/lace-cni/lace/api/v1alpha1"
	"github.com/lace-cni/lace/internal/model/ipam"
	"github.com/lace-cni/lace/internal/predicates"
)

// locatorKey is the single work item of the locator reconciler: locators are
// decided for all nodes at once so that two nodes never race for one.
var locatorKey = reconcile.Request{NamespacedName: types.NamespacedName{Name: "locators"}}

// LocatorReconciler gives every node an SRv6 locator from Pool, recorded in
// the node's UnderlayEndpoint (named after the node).
type LocatorReconciler struct {
	Client    client.Client
	APIReader client.Reader
	Recorder  record.EventRecorder
	Pool      ipam.Pool
}

// SetupWithManager registers the reconciler with one worker.
func (r *LocatorReconciler) SetupWithManager(mgr ctrl.Manager) error {
	toKey := handler.EnqueueRequestsFromMapFunc(func(context.Context, client.Object) []reconcile.Request {
		return []reconcile.Request{locatorKey}
	})
	return ctrl.NewControllerManagedBy(mgr).
		Named("locator").
		Watches(&corev1.Node{}, toKey, builder.WithPredicates(nodeMembershipChanged())).
		// Locators live in the spec; agents' status writes do not pass.
		Watches(&lacev1.UnderlayEndpoint{}, toKey, builder.WithPredicates(predicates.SpecOrLifecycleChanged())).
		WithOptions(controller.Options{MaxConcurrentReconciles: 1}).
		Complete(r)
}

// Reconcile implements reconcile.Reconciler.
func (r *LocatorReconciler) Reconcile(ctx context.Context, _ reconcile.Request) (reconcile.Result, error) {
	logger := log.FromContext(ctx)
	nodeByName, err := nodesByName(ctx, r.Client)
	if err != nil {
		return reconcile.Result{}, err
	}
	var ueps lacev1.UnderlayEndpointList
	if err := r.APIReader.List(ctx, &ueps); err != nil {
		return reconcile.Result{}, fmt.Errorf("list underlay endpoints: %w", err)
	}

	// Oldest first, so that of two endpoints claiming one locator the older keeps it.
	sort.Slice(ueps.Items, func(i, j int) bool {
		a, b := &ueps.Items[i], &ueps.Items[j]
		return a.CreationTimestamp.Before(&b.CreationTimestamp) ||
			(a.CreationTimestamp.Equal(&b.CreationTimestamp) && a.Name < b.Name)
	})
	used := map[uint64]bool{}
	has := map[string]bool{}
	for i := range ueps.Items {
		u := &ueps.Items[i]
		if nodeByName[u.Name] == nil {
			gone, err := nodeGone(ctx, r.APIReader, u.Name)
			if err != nil {
				return reconcile.Result{}, err
			}
			if gone {
				logger.Info("removing underlay endpoint of removed node", "node", u.Name)
				if err := r.Client.Delete(ctx, u); client.IgnoreNotFound(err) != nil {
					return reconcile.Result{}, fmt.Errorf("delete underlay endpoint %s: %w", u.Name, err)
				}
				continue
			}
		}
		pfx, err := netip.ParsePrefix(string(u.Spec.Locator))
		if err != nil {
			continue
		}
		if idx, ok := r.Pool.Index(pfx); ok && !used[idx] {
			used[idx] = true
			has[u.Name] = true
		}
	}

	names := make([]string, 0, len(nodeByName))
	for n := range nodeByName {
		if !has[n] {
			names = append(names, n)
		}
	}
	sort.Strings(names)
	for _, n := range names {
		idx, ok := r.Pool.LowestFree(used)
		if !ok {
			r.Recorder.Eventf(nodeByName[n], corev1.EventTypeWarning, ReasonLocatorsExhausted,
				"no free SRv6 locator in %s for node %s", r.Pool, n)
			continue
		}
		loc := r.Pool.Block(idx)
		if err := r.applyLocator(ctx, nodeByName[n], loc); err != nil {
			return reconcile.Result{}, err
		}
		used[idx] = true
		logger.Info("assigned SRv6 locator", "node", n, "locator", loc)
	}
	return reconcile.Result{}, nil
}

// applyLocator writes spec.node and spec.locator with the controller's own
// field manager, leaving the agent's fields (addresses, zone) alone.
func (r *LocatorReconciler) applyLocator(ctx context.Context, node *corev1.Node, loc netip.Prefix) error {
	u := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": lacev1.GroupVersion.String(),
		"kind":       "UnderlayEndpoint",
		"metadata": map[string]any{
			"name": node.Name,
			"ownerReferences": []any{map[string]any{
				"apiVersion": "v1", "kind": "Node", "name": node.Name, "uid": string(node.UID),
			}},
		},
		"spec": map[string]any{"node": node.Name, "locator": loc.String()},
	}}
	if err := r.Client.Patch(ctx, u, client.Apply, client.FieldOwner(FieldManager), client.ForceOwnership); err != nil {
		return fmt.Errorf("apply locator of node %s: %w", node.Name, err)
	}
	return nil
}

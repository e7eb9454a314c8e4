package controller

import (
	"context"
	"fmt"
	"net/netip"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/predicate"

	lacev1 "github.com/lace-cni/lace/api/v1alpha1"
	"github.com/lace-cni/lace/internal/model"
	"github.com/lace-cni/lace/internal/predicates"
)

// listReserved is the cluster's reserved addresses, as every agent
// computes them (internal/agent/nodesync/sync.go): the underlay addresses the
// agents accept (acceptedUnderlays), pod subnets, service ranges, every
// Node's addresses and the API server's.
func listReserved(ctx context.Context, c client.Client, allowed []netip.Prefix) ([]netip.Prefix, error) {
	var nets lacev1.NetworkList
	var cidrs networkingv1.ServiceCIDRList
	var nodes corev1.NodeList
	var api discoveryv1.EndpointSliceList
	for _, l := range []client.ObjectList{&nets, &cidrs, &nodes} {
		if err := c.List(ctx, l); err != nil {
			return nil, fmt.Errorf("list %T: %w", l, err)
		}
	}
	ueps, _, err := acceptedUnderlays(ctx, c, allowed)
	if err != nil {
		return nil, err
	}
	if err := c.List(ctx, &api, client.InNamespace(metav1.NamespaceDefault),
		client.MatchingLabels{discoveryv1.LabelServiceName: "kubernetes"}); err != nil {
		return nil, fmt.Errorf("list the kubernetes Service's EndpointSlices: %w", err)
	}
	ptrs := make([]*discoveryv1.EndpointSlice, len(api.Items))
	for i := range api.Items {
		ptrs[i] = &api.Items[i]
	}
	return append(model.ReservedFor(ueps, nets.Items, model.ServiceCIDRPrefixes(cidrs.Items)),
		model.ReservedHosts(nodes.Items, ptrs)...), nil
}

// watchReserved adds the watches of what listReserved reads (Networks are
// watched by the callers for their own reasons).
func watchReserved(b *builder.Builder, h handler.EventHandler) *builder.Builder {
	apiSlice := predicate.NewPredicateFuncs(func(o client.Object) bool {
		return o.GetNamespace() == metav1.NamespaceDefault && o.GetLabels()[discoveryv1.LabelServiceName] == "kubernetes"
	})
	return b.
		Watches(&lacev1.UnderlayEndpoint{}, h, builder.WithPredicates(predicate.GenerationChangedPredicate{})).
		Watches(&networkingv1.ServiceCIDR{}, h).
		Watches(&corev1.Node{}, h, builder.WithPredicates(predicates.NodeChanged())).
		Watches(&discoveryv1.EndpointSlice{}, h, builder.WithPredicates(apiSlice, predicate.ResourceVersionChangedPredicate{}))
}

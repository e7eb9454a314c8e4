package controller

import (
	"context"
	"fmt"
	"net/netip"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/lace-cni/lace/internal/model"
)

// hostPodsCache is how the controller's cache holds Pods: the hostNetwork
// ones only (the host endpoint gate names them; a cluster's every pod
// would cost the controller their whole specs), trimmed to what the gate
// reads. Other Pods are read from the API (NetworkEndpointReconciler).
func hostPodsCache() cache.ByObject {
	return cache.ByObject{Field: fields.OneTermEqualSelector("spec.hostNetwork", "true"), Transform: model.TrimHostPod}
}

// hostEndpoints builds the host endpoint gate as the agents do
// (model.NewHostEndpoints from the accepted underlay addresses, the
// kubernetes Service's slices and the hostNetwork pods), so that what the
// controller reports refused is what no agent serves.
func hostEndpoints(ctx context.Context, c client.Reader, allowed []netip.Prefix) (model.HostEndpoints, error) {
	accepted, _, err := acceptedUnderlays(ctx, c, allowed)
	if err != nil {
		return model.HostEndpoints{}, err
	}
	var nodes corev1.NodeList
	var pods corev1.PodList
	var api discoveryv1.EndpointSliceList
	if err := c.List(ctx, &nodes); err != nil {
		return model.HostEndpoints{}, fmt.Errorf("list nodes: %w", err)
	}
	// The cache holds only hostNetwork pods (hostPodsCache); the gate
	// ignores any other.
	if err := c.List(ctx, &pods); err != nil {
		return model.HostEndpoints{}, fmt.Errorf("list hostNetwork pods: %w", err)
	}
	if err := c.List(ctx, &api, client.InNamespace(metav1.NamespaceDefault),
		client.MatchingLabels{discoveryv1.LabelServiceName: "kubernetes"}); err != nil {
		return model.HostEndpoints{}, fmt.Errorf("list the kubernetes Service's endpoint slices: %w", err)
	}
	slices := make([]*discoveryv1.EndpointSlice, len(api.Items))
	for i := range api.Items {
		slices[i] = &api.Items[i]
	}
	return model.NewHostEndpoints(nodes.Items, accepted, slices, pods.Items), nil
}

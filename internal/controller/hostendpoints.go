package controller

import (
	"context"
	"fmt"
	"net/netip"
	"sync"
	"sync/atomic"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	toolscache "k8s.io/client-go/tools/cache"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/event"

	lacev1 "github.com/lace-cni/lace/api/v1alpha1"
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

// hostEndpointsMemo keeps the gate between changes of what it is built
// from: every Service reconcile asks for it, and building it lists every
// Node (twice), UnderlayEndpoint, Network, ServiceCIDR, LoadBalancerClass
// and hostNetwork pod, out of the cache as copies (at 1,000 nodes, 2,000
// Node copies per Service). Informer events of those kinds bump gen; a
// gate built at an older gen is built again. An event that comes while
// one is built makes the next ask build it again, never keeps it stale.
type hostEndpointsMemo struct {
	gen atomic.Uint64
	// checked is the gen watchChanges last compared the gate at.
	checked atomic.Uint64
	mu      sync.Mutex
	at      uint64
	ok      bool
	val     model.HostEndpoints
}

// changed marks the gate out of date (nil: no memo, nothing to mark).
func (m *hostEndpointsMemo) changed() {
	if m != nil {
		m.gen.Add(1)
	}
}

// get returns the gate as of the latest event (shared: never modified);
// without a memo (a reconciler not set up by SetupWithManager), it builds
// it every time.
func (m *hostEndpointsMemo) get(ctx context.Context, c client.Reader, allowed []netip.Prefix) (model.HostEndpoints, error) {
	if m == nil {
		return hostEndpoints(ctx, c, allowed)
	}
	g := m.gen.Load()
	m.mu.Lock()
	if m.ok && m.at >= g { // one built as late or later
		defer m.mu.Unlock()
		return m.val, nil
	}
	m.mu.Unlock()
	v, err := hostEndpoints(ctx, c, allowed)
	if err != nil {
		return v, err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if !m.ok || g > m.at {
		m.val, m.at, m.ok = v, g, true
	}
	return v, nil
}

// watch bumps gen on every event of the kinds the gate is built from (of
// EndpointSlices, the kubernetes Service's only).
func (m *hostEndpointsMemo) watch(ctx context.Context, informers cache.Informers) error {
	bump := toolscache.ResourceEventHandlerFuncs{
		AddFunc:    func(any) { m.changed() },
		UpdateFunc: func(any, any) { m.changed() },
		DeleteFunc: func(any) { m.changed() },
	}
	apiSlice := func(o any) bool {
		if d, ok := o.(toolscache.DeletedFinalStateUnknown); ok {
			o = d.Obj
		}
		sl, ok := o.(*discoveryv1.EndpointSlice)
		return !ok || model.IsKubernetesService(sl.Namespace, sl.Labels[discoveryv1.LabelServiceName])
	}
	kinds := []client.Object{&corev1.Node{}, &lacev1.UnderlayEndpoint{}, &lacev1.Network{}, &networkingv1.ServiceCIDR{},
		&lacev1.LoadBalancerClass{}, &corev1.Pod{}, &discoveryv1.EndpointSlice{}}
	for _, k := range kinds {
		inf, err := informers.GetInformer(ctx, k)
		if err != nil {
			return fmt.Errorf("host endpoint gate: informer of %T: %w", k, err)
		}
		h := toolscache.ResourceEventHandler(bump)
		if _, ok := k.(*discoveryv1.EndpointSlice); ok {
			h = toolscache.FilteringResourceEventHandler{FilterFunc: apiSlice, Handler: bump}
		}
		if _, err := inf.AddEventHandler(h); err != nil {
			return fmt.Errorf("host endpoint gate: watch %T: %w", k, err)
		}
	}
	return nil
}

// gateCheckEvery spaces the checks of the gate for changes (watchChanges):
// a node whose addresses flap costs every Service a reconcile at most
// this often.
const gateCheckEvery = 2 * time.Second

// watchChanges, every interval, builds the gate again when an event marked
// it out of date and, when it differs from the one last checked, sends one
// event on out, from which every Service is reconciled: what a Node, an
// UnderlayEndpoint or the kubernetes Service's slices change in the gate
// (a node listing another's address) is reported on Services that did
// not change themselves. Errors are retried at the next check.
func (m *hostEndpointsMemo) watchChanges(ctx context.Context, c client.Reader, allowed []netip.Prefix, every time.Duration,
	out chan<- event.GenericEvent) error {
	t := time.NewTicker(every)
	defer t.Stop()
	var last model.HostEndpoints
	seen := false
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
		g := m.gen.Load()
		if seen && m.checked.Load() == g {
			continue
		}
		h, err := m.get(ctx, c, allowed)
		if err != nil {
			continue
		}
		if seen && !h.Equal(last) {
			select {
			case out <- event.GenericEvent{Object: &corev1.Service{}}:
			default: // one is pending: it reconciles every Service
			}
		}
		last, seen = h, true
		m.checked.Store(g)
	}
}

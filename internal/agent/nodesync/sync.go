package nodesync

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"net/netip"
	stdslices "slices"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	networkingv1 "k8s.io/api/networking/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	toolscache "k8s.io/client-go/tools/cache"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	lacev1 "github.com/lace-cni/lace/api/v1alpha1"
	"github.com/lace-cni/lace/internal/model"
	"github.com/lace-cni/lace/internal/tables"
)

// FieldManager is the agent's server-side-apply field manager.
const FieldManager = "lace-agent"

// Reconcile brings the node's data plane, kernel routes and published
// UnderlayEndpoint to the desired state. It is the one place that applies:
// watches only enqueue.
func (s *Syncer) Reconcile(ctx context.Context, _ reconcile.Request) (reconcile.Result, error) {
	st, in, triggers, err := s.desiredState(ctx)
	if errors.Is(err, errNotSynced) {
		// A moment after the caches: not an error worth a log line.
		return reconcile.Result{RequeueAfter: 50 * time.Millisecond}, nil
	}
	if err != nil {
		return reconcile.Result{}, err
	}
	if err := s.publishUnderlay(ctx, in); err != nil {
		return reconcile.Result{}, err
	}
	// The checkpoint is made true to the kernel before the data plane is
	// written from it: stale endpoints go, and (once per start) what the
	// kernel holds and the checkpoint lost is adopted. The stale ones are
	// looked for at most every staleCheckPeriod: it lists every link of
	// the node, a sync's largest garbage, for an interface gone behind
	// the CNI's back, which is rare.
	if now := time.Now(); now.Sub(time.Unix(0, s.staleChecked.Load())) >= staleCheckPeriod {
		if err := s.pods.DropStaleEndpoints(ctx); err != nil {
			return reconcile.Result{}, err
		}
		s.staleChecked.Store(now.UnixNano())
	}
	if err := s.pods.AdoptOnce(ctx, st, in.nets); err != nil {
		return reconcile.Result{}, fmt.Errorf("adopt pod attachments: %w", err)
	}
	s.mu.Lock()
	s.state, s.haveState = st, true
	s.mu.Unlock()
	if err := s.applier.Sync(ctx); err != nil {
		return reconcile.Result{}, err
	}
	for _, at := range triggers {
		programmingDuration.Observe(time.Since(at).Seconds())
	}
	s.mu.Lock()
	applyErr := s.applyErr
	s.mu.Unlock()
	if applyErr != nil {
		return reconcile.Result{}, applyErr
	}
	if err := s.syncHealthPorts(st.HealthChecks); err != nil {
		s.log.Error("health check ports", "err", err)
	}
	if err := s.pods.CollectEndpoints(ctx); err != nil {
		return reconcile.Result{}, err
	}
	if err := s.pods.EnsureNetworkEndpoints(ctx); err != nil {
		return reconcile.Result{}, err
	}
	return reconcile.Result{}, nil
}

// listed is what one reconcile read of the cache, besides services.
type listed struct {
	node    *corev1.Node // nil when it could not be read, and why
	nodeErr error
	nets    []lacev1.Network
	ueps    []lacev1.UnderlayEndpoint
	// addrs are the node's underlay addresses, or addrsErr why not.
	addrs    []netip.Addr
	addrsErr error
}

// desiredState computes the node's desired state from the cache. Only what
// changed since the last computation is computed again: each service whose
// Service or EndpointSlices changed (serviceCache), and the views only
// when their inputs did (networks, allocations, underlays, policies,
// namespaces, service ranges, the VIPs of bound services), since an
// endpoint change leaves every view as it was. Objects are read from the
// cache without copies: nothing here or in the model modifies them.
func (s *Syncer) desiredState(ctx context.Context) (model.NodeState, listed, []time.Time, error) {
	var nets lacev1.NetworkList
	var allocs lacev1.AllocationList
	var ueps lacev1.UnderlayEndpointList
	var nrps lacev1.NetworkRoutingPolicyList
	var srps lacev1.ServiceRoutingPolicyList
	var nbps lacev1.NetworkBindingPolicyList
	var nss corev1.NamespaceList
	var cidrs networkingv1.ServiceCIDRList
	var nodes corev1.NodeList
	var lbcs lacev1.LoadBalancerClassList
	var nbrs lacev1.NeighborList
	var fdbs lacev1.FDBEntryList
	for _, l := range []client.ObjectList{&nets, &allocs, &ueps, &nrps, &srps, &nbps, &nss, &cidrs, &nodes, &lbcs, &nbrs, &fdbs} {
		if err := s.client.List(ctx, l, client.UnsafeDisableDeepCopy); err != nil {
			return model.NodeState{}, listed{}, nil, fmt.Errorf("list %T: %w", l, err)
		}
	}
	// Services and EndpointSlices come from the informers' events
	// (svcMirror); a sync without them (a test's) lists them.
	if !s.mirror.live() {
		svcs, slices, err := s.ListServices(ctx)
		if err != nil {
			return model.NodeState{}, listed{}, nil, err
		}
		s.mirror.resync(svcs, slices)
	}
	if err := s.mirror.synced(); err != nil {
		return model.NodeState{}, listed{}, nil, err
	}
	// The API server's are the only ones the node's state reads beside
	// the services' computation.
	kubeSlices := s.mirror.kubernetesSlices()
	in := listed{nets: nets.Items, ueps: ueps.Items}
	in.addrs, in.addrsErr = s.node.UnderlayAddrs()
	var node corev1.Node
	if in.nodeErr = s.client.Get(ctx, types.NamespacedName{Name: s.opts.NodeName}, &node, client.UnsafeDisableDeepCopy); in.nodeErr == nil {
		in.node = &node
	}
	var hpods corev1.PodList
	if s.hostPods != nil {
		if err := s.hostPods.List(ctx, &hpods, client.UnsafeDisableDeepCopy); err != nil {
			return model.NodeState{}, listed{}, nil, fmt.Errorf("list hostNetwork pods: %w", err)
		}
	}

	s.computeMu.Lock()
	defer s.computeMu.Unlock()
	c := &s.compute
	if err := s.indexPods(ctx, &c.services); err != nil {
		return model.NodeState{}, listed{}, nil, err
	}
	// Every tracker is updated, whatever the others say.
	netsChanged := c.nets.update(len(nets.Items), func(i int) client.Object { return &nets.Items[i] })
	// The services read the networks' names and IDs alone (a network's
	// block usage, say, is no service's business).
	netIDsChanged := false
	if netsChanged {
		ids := map[string]uint32{}
		for i := range nets.Items {
			ids[nets.Items[i].Name] = uint32(max(nets.Items[i].Status.ID, 0))
		}
		netIDsChanged = !maps.Equal(ids, c.netIDs)
		c.netIDs = ids
	}
	nbpsChanged := c.nbps.updateSpec(len(nbps.Items), func(i int) client.Object { return &nbps.Items[i] })
	// A namespace's labels bind its own services only: those are
	// computed again, not every service.
	nsStale := c.syncNamespaces(nss.Items)
	nssChanged := len(nsStale) > 0
	c.services.staleNamespaces(nsStale)
	allocsChanged := c.allocs.update(len(allocs.Items), func(i int) client.Object { return &allocs.Items[i] })
	// The l2 trackers are updated on their own: || would skip the second.
	nbrsChanged := c.nbrs.update(len(nbrs.Items), func(i int) client.Object { return &nbrs.Items[i] })
	fdbsChanged := c.fdbs.update(len(fdbs.Items), func(i int) client.Object { return &fdbs.Items[i] })
	allocsChanged = allocsChanged || nbrsChanged || fdbsChanged
	// Their status (the nodes' health and data path counters) is written
	// every few seconds and read by nothing here.
	uepsChanged := c.ueps.updateSpec(len(ueps.Items), func(i int) client.Object { return &ueps.Items[i] })
	nrpsChanged := c.nrps.update(len(nrps.Items), func(i int) client.Object { return &nrps.Items[i] })
	srpsChanged := c.srps.update(len(srps.Items), func(i int) client.Object { return &srps.Items[i] })
	cidrsChanged := c.cidrs.updateSpec(len(cidrs.Items), func(i int) client.Object { return &cidrs.Items[i] })
	// The model assembles the node's state (model.ComputeDesired); the
	// stages here keep their results and compute again only what the
	// changed inputs reach.
	var vipsChanged bool
	d, err := model.ComputeDesired(model.DesiredInput{Node: s.opts.NodeName, Networks: nets.Items, Allocations: allocs.Items,
		RoutingPolicies: nrps.Items, ServiceRoutingPolicies: srps.Items, BindingPolicies: nbps.Items,
		Neighbors: nbrs.Items, FDBEntries: fdbs.Items,
		Namespaces: c.nsLabels, ServiceCIDRs: cidrs.Items, Nodes: nodes.Items, LoadBalancerClasses: lbcs.Items, Underlays: ueps.Items,
		EndpointSlices: kubeSlices, CheckHostEndpoints: s.hostPods != nil, HostNetworkPods: hpods.Items,
		Addrs: in.addrs, AllowedExternalIPs: s.opts.AllowedExternalIPs,
		Stages: model.DesiredStages{
			Services: func(d *model.NodeDesired, shared model.ServiceInput, _ []*corev1.Service, _ []*discoveryv1.EndpointSlice) (model.ServiceState, []model.ServiceVIPs) {
				// Only the underlay addresses the model accepts are
				// believed (a node writes its own UnderlayEndpoint and
				// could claim anything); they depend on the Nodes'
				// reported addresses and the reserved ranges too, so the
				// result is compared, not the objects' versions.
				if acc := acceptedAddrs(d.Underlays); !maps.EqualFunc(acc, c.accepted, stdslices.Equal[[]lacev1.IPAddress]) {
					c.accepted, uepsChanged = acc, true
				}
				zoneChanged := !c.computed || d.Zone != c.zone || !stdslices.Equal(d.NodeAddrs, c.nodeAddrs)
				c.zone, c.nodeAddrs = d.Zone, d.NodeAddrs
				reservedChanged := !stdslices.Equal(d.Reserved, c.reserved)
				c.reserved = d.Reserved
				hostEPsChanged := !d.HostEndpoints.Equal(c.hostEPs)
				c.hostEPs = d.HostEndpoints
				st, vips, changed := c.services.update(shared,
					hostEPsChanged || zoneChanged || reservedChanged || netIDsChanged || nbpsChanged || uepsChanged || cidrsChanged)
				vipsChanged = changed
				return st, vips
			},
			Views: func(_ *model.NodeDesired, ni model.NodeInput) model.NodeState {
				if !c.computed || vipsChanged || netsChanged || nssChanged || allocsChanged || uepsChanged || nrpsChanged || srpsChanged || cidrsChanged {
					c.node = model.ComputeNode(ni)
				}
				c.computed = true
				s.reportRefused(c)
				return c.node
			},
			HostPorts: func(d *model.NodeDesired) ([]tables.Service, error) {
				return s.hostPorts(ctx, in.node, in.addrs, d.NodeState.Services, d.HealthChecks, kubeSlices)
			},
		}})
	if err != nil {
		return model.NodeState{}, listed{}, nil, err
	}
	// The services looked up what they did: a NetworkEndpoint change
	// that came meanwhile and kicked nothing may be at one of them.
	s.nePending.recheck()
	triggers := c.services.triggers
	c.services.triggers = nil
	return d.NodeState, in, triggers, nil
}

// indexPods brings the services' pod address index up to date. Every pod
// of the cluster has a NetworkEndpoint: the informer's events say which
// changed, and only those are indexed again; without them (a sync made by
// a test) the NetworkEndpoints are listed and diffed.
func (s *Syncer) indexPods(ctx context.Context, c *serviceCache) error {
	changes, live, err := s.nePending.take()
	if err != nil {
		return err
	}
	if !live {
		var l lacev1.NetworkEndpointList
		all, err := listPtrs(ctx, s, &lacev1.NetworkEndpoint{}, &l, func() []*lacev1.NetworkEndpoint { return ptrs(l.Items) })
		if err != nil {
			return err
		}
		changes = c.podChanges(all)
	}
	c.indexPods(changes)
	return nil
}

// syncNamespaces brings nsLabels to nss, in place (the services' env
// reads the same map), and returns the namespaces whose labels came,
// changed or went.
func (c *computeCache) syncNamespaces(nss []corev1.Namespace) []string {
	if !c.nss.update(len(nss), func(i int) client.Object { return &nss[i] }) && c.nsLabels != nil {
		return nil
	}
	if c.nsLabels == nil {
		c.nsLabels = make(map[string]map[string]string, len(nss))
	}
	var out []string
	seen := make(map[string]bool, len(nss))
	for i := range nss {
		ns := &nss[i]
		seen[ns.Name] = true
		if old, ok := c.nsLabels[ns.Name]; !ok || !maps.Equal(old, ns.Labels) {
			c.nsLabels[ns.Name] = ns.Labels
			out = append(out, ns.Name)
		}
	}
	for name := range c.nsLabels {
		if !seen[name] {
			delete(c.nsLabels, name)
			out = append(out, name)
		}
	}
	return out
}

// computeCache is what desiredState keeps between computations.
type computeCache struct {
	computed bool
	// hostEPs gates endpoints at node addresses (model.HostEndpoints).
	hostEPs  model.HostEndpoints
	services serviceCache
	// node is the last ComputeNode result (its Services unset).
	node                                                         model.NodeState
	nsLabels                                                     map[string]map[string]string
	zone                                                         string
	nodeAddrs                                                    []netip.Addr
	reserved                                                     []netip.Prefix
	nets, nbps, nss, allocs, ueps, nrps, srps, cidrs, nbrs, fdbs versions
	// reported are the refusals the agent made Events of.
	reported map[model.ServiceKey]model.Refusal
	// accepted are the underlay addresses believed, by endpoint name.
	accepted map[string][]lacev1.IPAddress
	// netIDs are the networks' IDs by name (0: none yet), as the
	// services last read them.
	netIDs map[string]uint32
}

func acceptedAddrs(ueps []lacev1.UnderlayEndpoint) map[string][]lacev1.IPAddress {
	out := make(map[string][]lacev1.IPAddress, len(ueps))
	for _, u := range ueps {
		out[u.Name] = u.Spec.Addresses
	}
	return out
}

// ListServices lists the Services and EndpointSlices of the cache
// (listPtrs). They must not be modified.
func (s *Syncer) ListServices(ctx context.Context) ([]*corev1.Service, []*discoveryv1.EndpointSlice, error) {
	var svcList corev1.ServiceList
	var sliceList discoveryv1.EndpointSliceList
	svcs, err := listPtrs(ctx, s, &corev1.Service{}, &svcList, func() []*corev1.Service { return ptrs(svcList.Items) })
	if err != nil {
		return nil, nil, err
	}
	slices, err := listPtrs(ctx, s, &discoveryv1.EndpointSlice{}, &sliceList, func() []*discoveryv1.EndpointSlice { return ptrs(sliceList.Items) })
	if err != nil {
		return nil, nil, err
	}
	return svcs, slices, nil
}

// listPtrs lists the objects of obj's kind: the cached objects themselves,
// straight from the informer's store when the cache has one (no copy of
// tens of thousands of objects per reconcile), else through the client
// into list, whose items are read back with items. They must not be
// modified.
func listPtrs[T client.Object](ctx context.Context, s *Syncer, obj T, list client.ObjectList, items func() []T) ([]T, error) {
	if s.cache != nil {
		out, err := storeList[T](ctx, s.cache, obj)
		if !errors.Is(err, errNoStore) {
			return out, err
		}
	}
	if err := s.client.List(ctx, list, client.UnsafeDisableDeepCopy); err != nil {
		return nil, fmt.Errorf("list %T: %w", list, err)
	}
	return items(), nil
}

var errNoStore = errors.New("the cache has no informer store")

// storeList lists the objects of obj's kind held by the informer of c.
func storeList[T client.Object](ctx context.Context, c cache.Cache, obj client.Object) ([]T, error) {
	inf, err := c.GetInformer(ctx, obj)
	if err != nil {
		return nil, fmt.Errorf("informer of %T: %w", obj, err)
	}
	s, ok := inf.(interface{ GetStore() toolscache.Store })
	if !ok {
		return nil, errNoStore
	}
	items := s.GetStore().List()
	out := make([]T, 0, len(items))
	for _, o := range items {
		if t, ok := o.(T); ok {
			out = append(out, t)
		}
	}
	return out, nil
}

func ptrs[T any](items []T) []*T {
	out := make([]*T, len(items))
	for i := range items {
		out[i] = &items[i]
	}
	return out
}

// publishUnderlay writes the node's addresses and zone into its
// UnderlayEndpoint (the controller owns the locator). node is the Node as
// the cache has it, or nodeErr why it could not be read.
func (s *Syncer) publishUnderlay(ctx context.Context, in listed) error {
	ueps, node, nodeErr, addrs := in.ueps, in.node, in.nodeErr, in.addrs
	if in.addrsErr != nil {
		return fmt.Errorf("underlay addresses: %w", in.addrsErr)
	}
	s.mu.Lock()
	s.ownAddrs = addrs
	s.mu.Unlock()
	if nodeErr != nil {
		return fmt.Errorf("get node: %w", nodeErr)
	}
	zone := node.Labels[corev1.LabelTopologyZone]
	want := make([]any, 0, len(addrs))
	wantStr := make([]lacev1.IPAddress, 0, len(addrs))
	for _, ad := range addrs {
		want = append(want, ad.String())
		wantStr = append(wantStr, lacev1.IPAddress(ad.String()))
	}
	for _, u := range ueps {
		if u.Name == s.opts.NodeName && u.Spec.Zone == zone && equalAddrs(u.Spec.Addresses, wantStr) {
			return nil
		}
	}
	obj := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": lacev1.GroupVersion.String(), "kind": "UnderlayEndpoint",
		"metadata": map[string]any{"name": s.opts.NodeName, "ownerReferences": []any{map[string]any{
			"apiVersion": "v1", "kind": "Node", "name": node.Name, "uid": string(node.UID)}}},
		"spec": map[string]any{"node": s.opts.NodeName, "addresses": want, "zone": zone},
	}}
	if err := s.client.Patch(ctx, obj, client.Apply, client.FieldOwner(FieldManager), client.ForceOwnership); err != nil {
		return fmt.Errorf("publish underlay endpoint: %w", err)
	}
	s.log.Info("published underlay endpoint", "addresses", want, "zone", zone)
	return nil
}

func equalAddrs(a, b []lacev1.IPAddress) bool {
	if len(a) != len(b) {
		return false
	}
	set := map[lacev1.IPAddress]bool{}
	for _, x := range a {
		set[x] = true
	}
	for _, x := range b {
		if !set[x] {
			return false
		}
	}
	return true
}

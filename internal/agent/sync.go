package agent

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"maps"
	"net"
	"net/netip"
	stdslices "slices"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	networkingv1 "k8s.io/api/networking/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	toolscache "k8s.io/client-go/tools/cache"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	lacev1 "github.com/lace-cni/lace/api/v1alpha1"
	"github.com/lace-cni/lace/internal/datapath"
	"github.com/lace-cni/lace/internal/model"
)

// FieldManager is the agent's server-side-apply field manager.
const FieldManager = "lace-agent"

// reconcile brings the node's data plane, kernel routes and published
// UnderlayEndpoint to the desired state. It is the one place that applies:
// watches only enqueue.
func (a *Agent) reconcile(ctx context.Context, _ reconcile.Request) (reconcile.Result, error) {
	st, in, slices, err := a.desiredState(ctx)
	if err != nil {
		return reconcile.Result{}, err
	}
	if err := a.publishUnderlay(ctx, in); err != nil {
		return reconcile.Result{}, err
	}
	a.mu.Lock()
	triggers := a.slices.changedPtrs(slices)
	a.mu.Unlock()
	// The checkpoint is made true to the kernel before the data plane is
	// written from it: stale endpoints go, and (once per start) what the
	// kernel holds and the checkpoint lost is adopted.
	if err := a.dropStaleEndpoints(ctx); err != nil {
		return reconcile.Result{}, err
	}
	if err := a.adoptOnce(ctx, st, in.nets); err != nil {
		return reconcile.Result{}, fmt.Errorf("adopt pod attachments: %w", err)
	}
	a.mu.Lock()
	a.state, a.haveState = st, true
	a.mu.Unlock()
	if err := a.applier.Sync(ctx); err != nil {
		return reconcile.Result{}, err
	}
	for _, at := range triggers {
		programmingDuration.Observe(time.Since(at).Seconds())
	}
	a.mu.Lock()
	applyErr := a.applyErr
	a.mu.Unlock()
	if applyErr != nil {
		return reconcile.Result{}, applyErr
	}
	if err := a.health.sync(st.HealthChecks); err != nil {
		a.log.Error("health check ports", "err", err)
	}
	if err := a.collectEndpoints(ctx); err != nil {
		return reconcile.Result{}, err
	}
	if err := a.ensureNetworkEndpoints(ctx); err != nil {
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
func (a *Agent) desiredState(ctx context.Context) (model.NodeState, listed, []*discoveryv1.EndpointSlice, error) {
	var nets lacev1.NetworkList
	var allocs lacev1.AllocationList
	var ueps lacev1.UnderlayEndpointList
	var nrps lacev1.NetworkRoutingPolicyList
	var srps lacev1.ServiceRoutingPolicyList
	var nbps lacev1.NetworkBindingPolicyList
	var neps lacev1.NetworkEndpointList
	var nss corev1.NamespaceList
	var cidrs networkingv1.ServiceCIDRList
	var nodes corev1.NodeList
	var lbcs lacev1.LoadBalancerClassList
	for _, l := range []client.ObjectList{&nets, &allocs, &ueps, &nrps, &srps, &nbps, &neps, &nss, &cidrs, &nodes, &lbcs} {
		if err := a.client.List(ctx, l, client.UnsafeDisableDeepCopy); err != nil {
			return model.NodeState{}, listed{}, nil, fmt.Errorf("list %T: %w", l, err)
		}
	}
	svcs, slices, err := a.listServices(ctx)
	if err != nil {
		return model.NodeState{}, listed{}, nil, err
	}
	in := listed{nets: nets.Items, ueps: ueps.Items}
	in.addrs, in.addrsErr = a.node.UnderlayAddrs()
	// The NodePorts are served on the first address of each family.
	var nodeAddrs []netip.Addr
	for _, ad := range in.addrs {
		if !stdslices.ContainsFunc(nodeAddrs, func(b netip.Addr) bool { return b.Is4() == ad.Is4() }) {
			nodeAddrs = append(nodeAddrs, ad)
		}
	}
	var node corev1.Node
	zone := ""
	// The node's zone ("" when it has none, or the Node cannot be read).
	if in.nodeErr = a.client.Get(ctx, types.NamespacedName{Name: a.opts.NodeName}, &node, client.UnsafeDisableDeepCopy); in.nodeErr == nil {
		in.node, zone = &node, node.Labels[corev1.LabelTopologyZone]
	}

	a.computeMu.Lock()
	defer a.computeMu.Unlock()
	c := &a.compute
	// Every tracker is updated, whatever the others say.
	netsChanged := c.nets.update(len(nets.Items), func(i int) client.Object { return &nets.Items[i] })
	nbpsChanged := c.nbps.update(len(nbps.Items), func(i int) client.Object { return &nbps.Items[i] })
	nepsChanged := c.neps.update(len(neps.Items), func(i int) client.Object { return &neps.Items[i] })
	nssChanged := c.nss.update(len(nss.Items), func(i int) client.Object { return &nss.Items[i] })
	allocsChanged := c.allocs.update(len(allocs.Items), func(i int) client.Object { return &allocs.Items[i] })
	uepsChanged := c.ueps.update(len(ueps.Items), func(i int) client.Object { return &ueps.Items[i] })
	// Only the underlay addresses the model accepts are believed (a node
	// writes its own UnderlayEndpoint and could claim anything); they
	// depend on the Nodes' reported addresses and the reserved ranges
	// too, so the result is compared, not the objects' versions.
	accepted, _ := model.AcceptUnderlays(model.UnderlayInput{Underlays: ueps.Items, Nodes: nodes.Items, Networks: nets.Items,
		ServiceCIDRs: model.ServiceCIDRPrefixes(cidrs.Items), LoadBalancerPools: lbcs.Items, AllowedExternalIPs: a.opts.AllowedExternalIPs})
	if acc := acceptedAddrs(accepted); !maps.EqualFunc(acc, c.accepted, stdslices.Equal[[]lacev1.IPAddress]) {
		c.accepted, uepsChanged = acc, true
	}
	nrpsChanged := c.nrps.update(len(nrps.Items), func(i int) client.Object { return &nrps.Items[i] })
	srpsChanged := c.srps.update(len(srps.Items), func(i int) client.Object { return &srps.Items[i] })
	cidrsChanged := c.cidrs.update(len(cidrs.Items), func(i int) client.Object { return &cidrs.Items[i] })
	if nssChanged || c.nsLabels == nil {
		c.nsLabels = make(map[string]map[string]string, len(nss.Items))
		for _, ns := range nss.Items {
			c.nsLabels[ns.Name] = ns.Labels
		}
	}
	zoneChanged := !c.computed || zone != c.zone || !stdslices.Equal(nodeAddrs, c.nodeAddrs)
	c.zone, c.nodeAddrs = zone, nodeAddrs
	// Every Node's addresses are reserved too (model.ReservedHosts): the
	// controller reads the same (listReserved) to report what the agents
	// refuse.
	reserved := append(model.ReservedFor(accepted, nets.Items, model.ServiceCIDRPrefixes(cidrs.Items)),
		model.ReservedHosts(nodes.Items, slices)...)
	reservedChanged := !stdslices.Equal(reserved, c.reserved)
	c.reserved = reserved
	var hostEPs model.HostEndpoints
	if a.hostPods != nil {
		var hpods corev1.PodList
		if err := a.hostPods.List(ctx, &hpods, client.UnsafeDisableDeepCopy); err != nil {
			return model.NodeState{}, listed{}, nil, fmt.Errorf("list hostNetwork pods: %w", err)
		}
		hostEPs = model.NewHostEndpoints(nodes.Items, accepted, slices, hpods.Items)
	}
	hostEPsChanged := !hostEPs.Equal(c.hostEPs)
	c.hostEPs = hostEPs
	svcState, vips, vipsChanged := c.services.update(model.ServiceInput{Node: a.opts.NodeName, Zone: zone,
		Networks: nets.Items, BindingPolicies: nbps.Items, NetworkEndpoints: neps.Items, Namespaces: c.nsLabels,
		NodeAddrs: nodeAddrs, Reserved: reserved, AllowedExternalIPs: a.opts.AllowedExternalIPs, HostEndpoints: hostEPs},
		hostEPsChanged || zoneChanged || reservedChanged || netsChanged || nbpsChanged || nepsChanged || nssChanged || uepsChanged || cidrsChanged, svcs, slices)
	if !c.computed || vipsChanged || netsChanged || nssChanged || allocsChanged || uepsChanged || nrpsChanged || srpsChanged || cidrsChanged {
		c.node = model.ComputeNode(model.NodeInput{Node: a.opts.NodeName, Networks: nets.Items, Allocations: allocs.Items,
			Underlays: accepted, RoutingPolicies: nrps.Items, Services: vips, ServiceRoutingPolicies: srps.Items,
			Namespaces: c.nsLabels, ServiceCIDRs: model.ServiceCIDRPrefixes(cidrs.Items)})
	}
	c.computed = true
	a.reportRefused(c)
	st := c.node
	st.Services = model.GateNodePorts(svcState.Services, &st)
	st.HealthChecks = svcState.HealthChecks
	if st.Services, err = a.hostPorts(ctx, in.node, in.addrs, st.Services, st.HealthChecks, slices); err != nil {
		return model.NodeState{}, listed{}, nil, err
	}
	return st, in, slices, nil
}

// computeCache is what desiredState keeps between computations.
type computeCache struct {
	computed bool
	// hostEPs gates endpoints at node addresses (model.HostEndpoints).
	hostEPs  model.HostEndpoints
	services serviceCache
	// node is the last ComputeNode result (its Services unset).
	node                                                   model.NodeState
	nsLabels                                               map[string]map[string]string
	zone                                                   string
	nodeAddrs                                              []netip.Addr
	reserved                                               []netip.Prefix
	nets, nbps, neps, nss, allocs, ueps, nrps, srps, cidrs versions
	// reported are the refusals the agent made Events of.
	reported map[model.ServiceKey]model.Refusal
	// accepted are the underlay addresses believed, by endpoint name.
	accepted map[string][]lacev1.IPAddress
}

func acceptedAddrs(ueps []lacev1.UnderlayEndpoint) map[string][]lacev1.IPAddress {
	out := make(map[string][]lacev1.IPAddress, len(ueps))
	for _, u := range ueps {
		out[u.Name] = u.Spec.Addresses
	}
	return out
}

// listServices lists the Services and EndpointSlices of the cache: the
// cached objects themselves, straight from the informers' stores when the
// cache has them (no copy of tens of thousands of objects per reconcile),
// else from the client. They must not be modified.
func (a *Agent) listServices(ctx context.Context) ([]*corev1.Service, []*discoveryv1.EndpointSlice, error) {
	if a.mgr != nil {
		svcs, err1 := storeList[*corev1.Service](ctx, a.mgr.GetCache(), &corev1.Service{})
		slices, err2 := storeList[*discoveryv1.EndpointSlice](ctx, a.mgr.GetCache(), &discoveryv1.EndpointSlice{})
		if err := errors.Join(err1, err2); err == nil {
			return svcs, slices, nil
		} else if !errors.Is(err, errNoStore) {
			return nil, nil, err
		}
	}
	var svcs corev1.ServiceList
	var slices discoveryv1.EndpointSliceList
	for _, l := range []client.ObjectList{&svcs, &slices} {
		if err := a.client.List(ctx, l, client.UnsafeDisableDeepCopy); err != nil {
			return nil, nil, fmt.Errorf("list %T: %w", l, err)
		}
	}
	return ptrs(svcs.Items), ptrs(slices.Items), nil
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

// adoptOnce runs adoptKernelEndpoints at the agent's first reconcile.
func (a *Agent) adoptOnce(ctx context.Context, st model.NodeState, nets []lacev1.Network) error {
	a.addLock.Lock()
	defer a.addLock.Unlock()
	if a.adopted {
		return nil
	}
	if err := a.adoptKernelEndpoints(ctx, st, nets); err != nil {
		return err
	}
	a.adopted = true
	return nil
}

func (a *Agent) nodeState() model.NodeState {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.state
}

// publishUnderlay writes the node's addresses and zone into its
// UnderlayEndpoint (the controller owns the locator). node is the Node as
// the cache has it, or nodeErr why it could not be read.
func (a *Agent) publishUnderlay(ctx context.Context, in listed) error {
	ueps, node, nodeErr, addrs := in.ueps, in.node, in.nodeErr, in.addrs
	if in.addrsErr != nil {
		return fmt.Errorf("underlay addresses: %w", in.addrsErr)
	}
	a.mu.Lock()
	a.ownAddrs = addrs
	a.mu.Unlock()
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
		if u.Name == a.opts.NodeName && u.Spec.Zone == zone && equalAddrs(u.Spec.Addresses, wantStr) {
			return nil
		}
	}
	obj := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": lacev1.GroupVersion.String(), "kind": "UnderlayEndpoint",
		"metadata": map[string]any{"name": a.opts.NodeName, "ownerReferences": []any{map[string]any{
			"apiVersion": "v1", "kind": "Node", "name": node.Name, "uid": string(node.UID)}}},
		"spec": map[string]any{"node": a.opts.NodeName, "addresses": want, "zone": zone},
	}}
	if err := a.client.Patch(ctx, obj, client.Apply, client.FieldOwner(FieldManager), client.ForceOwnership); err != nil {
		return fmt.Errorf("publish underlay endpoint: %w", err)
	}
	a.log.Info("published underlay endpoint", "addresses", want, "zone", zone)
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

// apply makes the data plane equal to st, touching only the difference.
func (a *Agent) apply(st model.NodeState) error {
	start := time.Now()
	defer func() { syncDuration.Observe(time.Since(start).Seconds()) }()
	a.mu.Lock()
	own := append([]netip.Addr(nil), a.ownAddrs...)
	first := !a.applied
	a.mu.Unlock()
	if first {
		if err := a.node.EnableForwarding(); err != nil {
			return err
		}
		err := a.dp.AttachUnderlay(a.opts.NetNS, a.opts.UnderlayInterface)
		if err == nil && a.opts.HostCgroup != "" {
			if a.hostNetNS, err = a.node.NetNSCookie(); err == nil {
				err = a.dp.AttachHostSockets(a.opts.HostCgroup)
			}
		}
		a.mu.Lock()
		a.attachErr = err
		a.mu.Unlock()
		if err != nil {
			a.kickStatus()
			return err
		}
	}
	ethIndex, err := a.node.UnderlayIndex()
	if err != nil {
		return err
	}
	var v4, v6 netip.Addr
	for _, ad := range own {
		if ad.Is6() && !v6.IsValid() {
			v6 = ad
		}
		if ad.Is4() && !v4.IsValid() {
			v4 = ad
		}
	}
	// The node's own addresses go first: the underlay guard drops plain IP
	// to anything else, so it is armed only once they are all written.
	// Each table is synced against what was written to it (datapath's
	// reconciler), never read back from the kernel.
	if err := a.dp.SyncHostAddrs(own); err != nil {
		return fmt.Errorf("host addresses: %w", err)
	}
	wantCfg := datapath.Config{UnderlayIP: v6, UnderlayIPv4: v4, Locator: st.Locator, UnderlayIfIndex: uint32(ethIndex),
		GuardUnderlay: len(own) > 0, HostNetNS: a.hostNetNS,
		HostNet4: model.ClassifyAddr(st.Classifiers, v4), HostNet6: model.ClassifyAddr(st.Classifiers, v6)}
	if err := a.dp.SetConfig(wantCfg); err != nil { // written only when it changes
		return fmt.Errorf("set config: %w", err)
	}
	var errs []error
	errs = append(errs, a.dp.SyncNodes(st.Nodes), a.dp.SyncNodeLocators(st.NodeLocators), a.dp.SyncNetworks(st.Networks))
	// Services before the views that reach their VIPs, so a new VIP is
	// never looked up before it is served. Flows to endpoints that left a
	// service are forgotten (a UDP client is never black-holed).
	gone, err := a.dp.ApplyServices(st.Services)
	errs = append(errs, err)
	if err == nil {
		if n, err := a.dp.FlushServiceFlows(gone); err != nil {
			errs = append(errs, err)
		} else if n > 0 {
			a.log.Info("forgot flows to endpoints that left their service", "flows", n)
		}
	}
	errs = append(errs, a.dp.SyncRoutes(st.Routes), a.dp.SyncClassifiers(st.Classifiers), a.dp.SyncInsides(st.Inside))

	// Underlay routes to the other nodes' locators, and to their pod
	// blocks for the node's own sockets (plain IP from the node address,
	// judged by the owner node like any outside host's).
	owned, err := a.node.OwnedRoutes()
	errs = append(errs, err)
	want := map[netip.Prefix]bool{}
	for _, hr := range st.HostRoutes {
		want[hr.Prefix] = true
		if via, ok := owned[hr.Prefix]; !ok || via != hr.Via {
			errs = append(errs, a.node.ReplaceOwnedRoute(hr.Prefix, hr.Via))
		}
	}
	for _, lr := range st.LocatorRoutes {
		want[lr.Locator] = true
		if via, ok := owned[lr.Locator]; !ok || via != lr.Via {
			errs = append(errs, a.node.ReplaceOwnedRoute(lr.Locator, lr.Via))
		}
	}
	for p := range owned {
		if !want[p] {
			errs = append(errs, a.node.DeleteRoute(p))
		}
	}

	errs = append(errs, a.applyEndpoints())
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("apply data plane: %w", err)
	}
	a.mu.Lock()
	first = !a.applied
	a.applied = true
	a.mu.Unlock()
	if first {
		a.kickStatus()
	}
	return nil
}

// syncDataplane is the applier's sync: the whole node once its state is
// known, the pods' entries alone before.
//
// Its result is the pods' part: a pod's ADD or DEL must not fail because
// something else of the node could not be applied (a route to a node that
// is unreachable, say). The node part's error is kept for the reconciler,
// which retries and reports it.
func (a *Agent) syncDataplane() error {
	a.mu.Lock()
	st, have := a.state, a.haveState
	a.mu.Unlock()
	if !have {
		return a.applyEndpoints()
	}
	err := a.apply(st)
	a.mu.Lock()
	a.applyErr = err
	a.mu.Unlock()
	if err != nil {
		// apply may have stopped before the pods' entries: apply them on
		// their own, for the waiting ADDs and DELs.
		return a.applyEndpoints()
	}
	return nil
}

// applyEndpoints makes the pods' entries (endpoints, ports and their
// programs) follow the checkpoint: Ready endpoints are written and
// attached, Deleting ones and entries no endpoint claims removed. They
// survive restarts in the pinned maps; this also repairs them if the maps
// were lost. An ADD in progress (neither Ready nor Deleting) owns its
// entries: they are neither written nor removed here.
func (a *Agent) applyEndpoints() error {
	var errs []error
	var wantEps []datapath.Endpoint
	var wantPorts []datapath.Port
	busyEps := map[endpointKey]bool{}
	busyPorts := map[uint32]bool{}
	for _, e := range a.cp.all() {
		if e.Deleting {
			continue
		}
		if !e.Ready {
			for _, ad := range e.Addrs {
				busyEps[endpointKey{e.NetID, ad}] = true
			}
			busyPorts[uint32(e.HostIfIndex)] = true
			continue
		}
		pm, _ := net.ParseMAC(e.PodMAC)
		hm, _ := net.ParseMAC(e.HostMAC)
		p := datapath.Port{IfIndex: uint32(e.HostIfIndex), NetID: e.NetID, NetNSCookie: e.NetNSCookie}
		for _, ad := range e.Addrs {
			wantEps = append(wantEps, datapath.Endpoint{NetID: e.NetID, Addr: ad, IfIndex: uint32(e.HostIfIndex), PodMAC: pm, HostMAC: hm})
			if ad.Is4() {
				p.V4 = ad
			} else {
				p.V6 = ad
			}
		}
		wantPorts = append(wantPorts, p)
	}
	errs = append(errs,
		a.dp.SyncEndpoints(wantEps, func(n uint32, ad netip.Addr) bool { return busyEps[endpointKey{n, ad}] }),
		a.dp.SyncPorts(wantPorts, func(i uint32) bool { return busyPorts[i] }))
	// Programs: attached to every Ready endpoint's interface, detached from
	// the others (a DEL's, or a leftover no endpoint claims).
	pinned, err := a.dp.PinnedPodLinks()
	errs = append(errs, err)
	isPinned := map[string]bool{}
	for _, h := range pinned {
		isPinned[h] = true
	}
	claimed := map[string]bool{}
	a.mu.Lock()
	reattach := !a.podsReattached
	a.mu.Unlock()
	nErrs := len(errs)
	for _, e := range a.cp.all() {
		switch {
		case e.Ready:
			claimed[e.HostIf] = true
			if !isPinned[e.HostIf] || reattach {
				errs = append(errs, a.dp.AttachPod(a.opts.NetNS, e.HostIf))
			}
		case !e.Deleting:
			claimed[e.HostIf] = true // an ADD in progress
		}
	}
	if reattach && errors.Join(errs[nErrs:]...) == nil {
		a.mu.Lock()
		a.podsReattached = true
		a.mu.Unlock()
	}
	for _, h := range pinned {
		if !claimed[h] {
			errs = append(errs, a.dp.DetachPod(h))
		}
	}
	return errors.Join(errs...)
}

// syncSet upserts what is wanted and missing and deletes what is extra.
func syncSet[T comparable](cur, want []T, upsert, del func(T) error) error {
	return syncListEq(cur, want, func(t T) T { return t }, upsert, del)
}

// syncListEq is syncList for items compared with ==.
func syncListEq[T comparable, K comparable](cur, want []T, key func(T) K, upsert, del func(T) error) error {
	return syncList(cur, want, key, func(a, b T) bool { return a == b }, upsert, del)
}

// syncList upserts wanted items that are missing or differ (by eq), and
// deletes current items whose key is not wanted.
func syncList[T any, K comparable](cur, want []T, key func(T) K, eq func(a, b T) bool, upsert, del func(T) error) error {
	have := make(map[K]T, len(cur))
	for _, c := range cur {
		have[key(c)] = c
	}
	wanted := make(map[K]bool, len(want))
	var errs []error
	for _, w := range want {
		k := key(w)
		wanted[k] = true
		if c, ok := have[k]; ok && eq(c, w) {
			continue
		}
		errs = append(errs, upsert(w))
	}
	for k, c := range have {
		if !wanted[k] {
			errs = append(errs, del(c))
		}
	}
	return errors.Join(errs...)
}

// endpointKey names a pod address in its network.
type endpointKey struct {
	net  uint32
	addr netip.Addr
}

// sameEndpoint compares endpoints, whose MACs are slices.
func sameEndpoint(a, b datapath.Endpoint) bool {
	return a.NetID == b.NetID && a.Addr == b.Addr && a.IfIndex == b.IfIndex &&
		bytes.Equal(a.PodMAC, b.PodMAC) && bytes.Equal(a.HostMAC, b.HostMAC)
}

// collectEndpoints removes the endpoints of pods that no longer exist
// (deleted while the agent was down, or DEL never came), after confirming
// with the API server: a cold or lagging cache never removes a live pod.
func (a *Agent) collectEndpoints(ctx context.Context) error {
	for _, e := range a.cp.all() {
		if e.PodName == "" {
			// Adopted from the kernel, and no pod has its addresses.
			a.log.Info("removing endpoint no pod claims", "interface", e.HostIf, "addrs", e.Addrs)
			if err := a.teardown(ctx, e); err != nil {
				return err
			}
			continue
		}
		var pod corev1.Pod
		err := a.client.Get(ctx, types.NamespacedName{Namespace: e.PodNS, Name: e.PodName}, &pod)
		if err == nil && string(pod.UID) == e.PodUID {
			continue
		}
		err = a.reader.Get(ctx, types.NamespacedName{Namespace: e.PodNS, Name: e.PodName}, &pod)
		switch {
		case err == nil && string(pod.UID) == e.PodUID:
			continue
		case err != nil && !apierrors.IsNotFound(err):
			return fmt.Errorf("check pod %s/%s: %w", e.PodNS, e.PodName, err)
		}
		a.log.Info("removing endpoint of a pod that is gone", "pod", e.PodNS+"/"+e.PodName, "container", e.ContainerID)
		if err := a.teardown(ctx, e); err != nil {
			return err
		}
	}
	return nil
}

// teardown removes everything of one endpoint; what is gone already is fine.
func (a *Agent) teardown(ctx context.Context, e Endpoint) error {
	// Recorded as Deleting, the applier removes its entries and program
	// (a port whose index another endpoint holds now stays: that one
	// claims it); then the interface goes, and the record last.
	e.Ready, e.Deleting = false, true
	if err := a.cp.put(e); err != nil {
		return err
	}
	var errs []error
	errs = append(errs, a.applier.Sync(ctx), a.node.TeardownPod(e.HostIf, e.Addrs))
	ne := &lacev1.NetworkEndpoint{}
	ne.Namespace, ne.Name = e.PodNS, e.PodName
	// An endpoint adopted without a pod has no record to remove.
	if e.PodName != "" {
		if err := a.client.Get(ctx, client.ObjectKeyFromObject(ne), ne); err == nil && ne.Labels[lacev1.LabelPodUID] == e.PodUID {
			if err := a.client.Delete(ctx, ne); client.IgnoreNotFound(err) != nil {
				errs = append(errs, err)
			}
		}
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("tear down endpoint %s (container %q): %w", e.HostIf, e.ContainerID, err)
	}
	return a.cp.remove(e.HostIf)
}

package model

import (
	"cmp"
	"net/netip"
	"slices"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	networkingv1 "k8s.io/api/networking/v1"

	lacev1 "github.com/lace-cni/lace/api/v1alpha1"
	"github.com/lace-cni/lace/internal/tables"
)

// DesiredInput is everything one node's whole desired state is computed
// from: the cluster's objects, as the agent's cache and lacectl read
// them, and the little only the node itself knows. ComputeDesired is the
// one place that assembles them: the agent programs its answer, lacectl
// shows it, so the two cannot drift.
type DesiredInput struct {
	Node                   string
	Networks               []lacev1.Network
	Allocations            []lacev1.Allocation
	RoutingPolicies        []lacev1.NetworkRoutingPolicy
	ServiceRoutingPolicies []lacev1.ServiceRoutingPolicy
	BindingPolicies        []lacev1.NetworkBindingPolicy
	NetworkEndpoints       []lacev1.NetworkEndpoint
	Neighbors              []lacev1.Neighbor
	FDBEntries             []lacev1.FDBEntry
	// Namespaces maps namespace names to their labels.
	Namespaces   map[string]map[string]string
	ServiceCIDRs []networkingv1.ServiceCIDR
	Nodes        []corev1.Node
	// LoadBalancerClasses' pools are never a node's underlay address.
	LoadBalancerClasses []lacev1.LoadBalancerClass
	// Underlays are the UnderlayEndpoints as the nodes wrote them: only
	// what AcceptUnderlays accepts of them is believed (accepting them
	// twice changes nothing).
	Underlays []lacev1.UnderlayEndpoint
	// Services and EndpointSlices may be the informers' own objects: they
	// are only read.
	Services       []*corev1.Service
	EndpointSlices []*discoveryv1.EndpointSlice
	// CheckHostEndpoints gates endpoints at node addresses by the
	// hostNetwork pods (HostEndpoints); off, they are served as the
	// slices say (lacectl, which does not read every pod).
	CheckHostEndpoints bool
	HostNetworkPods    []corev1.Pod
	// Addrs are the node's underlay addresses as the node itself has
	// them (the agent reads the kernel); with AddrsFromUnderlay, those of
	// its accepted UnderlayEndpoint instead (what lacectl can see). The
	// NodePorts are served on the first of each family.
	Addrs             []netip.Addr
	AddrsFromUnderlay bool
	// AllowedExternalIPs is the operator's allow-list of external IPs.
	AllowedExternalIPs []netip.Prefix
	// Stages, when set, replace the default computation of a stage by
	// one that gives the same answer for the same input (the agent's
	// keep their results between calls).
	Stages DesiredStages
}

// DesiredStages are the costly stages of ComputeDesired. Each gets the
// desired state assembled so far (its derived inputs set) and the stage's
// own input; nil is the default.
type DesiredStages struct {
	// Services computes the node's services and the VIPs of the bound
	// ones, in Bound's order. The default computes every service and
	// admits them all (ComputeServices); the agent's keeps each service's
	// result between calls and admits them against the maps' budget.
	Services func(d *NodeDesired, shared ServiceInput, svcs []*corev1.Service, slices []*discoveryv1.EndpointSlice) (ServiceState, []ServiceVIPs)
	// Views computes the views (ComputeNode); the agent's only when its
	// inputs changed.
	Views func(d *NodeDesired, in NodeInput) NodeState
	// HostPorts returns the entries of the node's pods' hostPorts
	// (HostPortEntries) that d.Services gives way to; they depend on the
	// node's own records (which pods run here, its listening sockets).
	// The default adds none.
	HostPorts func(d *NodeDesired) ([]tables.Service, error)
}

// NodeDesired is a node's whole desired state: the NodeState the agent
// programs (its views, services with the NodePorts gated, health checks
// and hostPorts), and what it was derived from.
type NodeDesired struct {
	NodeState
	// Underlays are the accepted UnderlayEndpoints.
	Underlays []lacev1.UnderlayEndpoint
	// Zone is the node's zone ("" when it has none or no Node is known).
	Zone string
	// NodeAddrs are where the NodePorts are served: the first address
	// of each family.
	NodeAddrs []netip.Addr
	// ServiceCIDRs are the service ranges' prefixes.
	ServiceCIDRs []netip.Prefix
	// Reserved are the addresses no external IP may claim.
	Reserved      []netip.Prefix
	HostEndpoints HostEndpoints
	// Services is the services' stage's answer as it came (NodePorts
	// not gated, no hostPorts): bindings, excluded endpoints.
	Services ServiceState
	// VIPs are the bound services' ClusterIPs, for the views.
	VIPs []ServiceVIPs
}

// ComputeDesired computes node in.Node's whole desired state. The order
// is the data plane's: underlays accepted first (everything else believes
// only those), then the services, the views (which reach the bound
// services' VIPs), the NodePorts the views do not open closed
// (GateNodePorts), and last the hostPorts, which may not take a port a
// service serves.
func ComputeDesired(in DesiredInput) (NodeDesired, error) {
	var d NodeDesired
	d.ServiceCIDRs = ServiceCIDRPrefixes(in.ServiceCIDRs)
	d.Underlays, _ = AcceptUnderlays(UnderlayInput{Underlays: in.Underlays, Nodes: in.Nodes, Networks: in.Networks,
		ServiceCIDRs: d.ServiceCIDRs, LoadBalancerPools: in.LoadBalancerClasses, AllowedExternalIPs: in.AllowedExternalIPs})
	addrs := in.Addrs
	if in.AddrsFromUnderlay {
		addrs = UnderlayAddrs(d.Underlays, in.Node)
	}
	d.NodeAddrs = firstOfEachFamily(addrs)
	for i := range in.Nodes {
		if in.Nodes[i].Name == in.Node {
			d.Zone = in.Nodes[i].Labels[corev1.LabelTopologyZone]
		}
	}
	// Every Node's addresses are reserved too (ReservedHosts): the
	// controller reads the same to report what the agents refuse.
	d.Reserved = append(ReservedFor(d.Underlays, in.Networks, d.ServiceCIDRs), ReservedHosts(in.Nodes, in.EndpointSlices)...)
	// Sorted, whatever order the caches list the objects in: the agent
	// compares it with the last one to tell whether every service must
	// be computed again.
	slices.SortFunc(d.Reserved, func(a, b netip.Prefix) int {
		return cmp.Or(a.Addr().Compare(b.Addr()), cmp.Compare(a.Bits(), b.Bits()))
	})
	d.Reserved = slices.Compact(d.Reserved)
	if in.CheckHostEndpoints {
		d.HostEndpoints = NewHostEndpoints(in.Nodes, d.Underlays, in.EndpointSlices, in.HostNetworkPods)
	}

	shared := ServiceInput{Node: in.Node, Zone: d.Zone, Networks: in.Networks, BindingPolicies: in.BindingPolicies,
		NetworkEndpoints: in.NetworkEndpoints, Namespaces: in.Namespaces, NodeAddrs: d.NodeAddrs, Reserved: d.Reserved,
		AllowedExternalIPs: in.AllowedExternalIPs, HostEndpoints: d.HostEndpoints}
	services := in.Stages.Services
	if services == nil {
		services = computeServiceStage
	}
	d.Services, d.VIPs = services(&d, shared, in.Services, in.EndpointSlices)

	nodeIn := NodeInput{Node: in.Node, Networks: in.Networks, Allocations: in.Allocations, Underlays: d.Underlays,
		RoutingPolicies: in.RoutingPolicies, Services: d.VIPs, ServiceRoutingPolicies: in.ServiceRoutingPolicies,
		Namespaces: in.Namespaces, ServiceCIDRs: d.ServiceCIDRs, Neighbors: in.Neighbors, FDBEntries: in.FDBEntries}
	if in.Stages.Views != nil {
		d.NodeState = in.Stages.Views(&d, nodeIn)
	} else {
		d.NodeState = ComputeNode(nodeIn)
	}
	// What the gate and the hostPorts change, the merge's log does not
	// name: the data plane is told those keys too.
	d.NodeState.ServiceChanges = d.Services.Changes
	// The NodePorts are at the node addresses alone: the gate visits
	// those entries, with no pass over the list.
	d.NodeState.Services, d.NodeState.ServiceChanges.Gated = gateNodePorts(d.Services.Services, &d.NodeState,
		append([]netip.Addr{}, d.NodeAddrs...))
	d.HealthChecks = d.Services.HealthChecks
	if in.Stages.HostPorts != nil {
		entries, err := in.Stages.HostPorts(&d)
		if err != nil {
			return NodeDesired{}, err
		}
		d.NodeState.Services = AddHostPorts(d.NodeState.Services, entries)
		for i := range entries {
			d.NodeState.ServiceChanges.HostPorts = append(d.NodeState.ServiceChanges.HostPorts, entries[i].Key())
		}
	}
	return d, nil
}

// computeServiceStage is ComputeServices over the informers' pointers,
// with the bound services' VIPs.
func computeServiceStage(_ *NodeDesired, shared ServiceInput, svcs []*corev1.Service, all []*discoveryv1.EndpointSlice) (ServiceState, []ServiceVIPs) {
	env := NewServiceEnv(shared)
	bySvc := map[ServiceKey][]*discoveryv1.EndpointSlice{}
	for _, sl := range all {
		if k, ok := SliceService(sl); ok {
			bySvc[k] = append(bySvc[k], sl)
		}
	}
	for _, ss := range bySvc {
		slices.SortStableFunc(ss, bySliceName)
	}
	results := make([]ServiceResult, len(svcs))
	ptrs := make([]*ServiceResult, len(svcs))
	byKey := make(map[ServiceKey]*ServiceResult, len(svcs))
	for i, svc := range svcs {
		k := ServiceKeyOf(svc.Namespace, svc.Name)
		results[i] = env.Compute(svc, bySvc[k])
		ptrs[i] = &results[i]
		if _, dup := byKey[k]; !dup {
			byKey[k] = &results[i]
		}
	}
	st := MergeServices(ptrs)
	var vips []ServiceVIPs
	for _, b := range st.Bound {
		if b.Err == "" {
			vips = append(vips, ServiceVIPs{Namespace: b.Namespace, Name: b.Name, Network: b.Network,
				VIPs: byKey[ServiceKeyOf(b.Namespace, b.Name)].VIPs})
		}
	}
	return st, vips
}

// UnderlayAddrs are the addresses node's UnderlayEndpoints (accepted
// ones: AcceptUnderlays) publish, in their order.
func UnderlayAddrs(ueps []lacev1.UnderlayEndpoint, node string) []netip.Addr {
	var out []netip.Addr
	for _, u := range ueps {
		if u.Spec.Node != node && (u.Spec.Node != "" || u.Name != node) {
			continue
		}
		for _, s := range u.Spec.Addresses {
			if a, err := netip.ParseAddr(string(s)); err == nil {
				out = append(out, a.Unmap())
			}
		}
	}
	return out
}

// firstOfEachFamily keeps the first address of each family: a node's
// NodePorts are served there.
func firstOfEachFamily(addrs []netip.Addr) []netip.Addr {
	var out []netip.Addr
	for _, a := range addrs {
		if !slices.ContainsFunc(out, func(b netip.Addr) bool { return b.Is4() == a.Is4() }) {
			out = append(out, a)
		}
	}
	return out
}

package model

import (
	"errors"
	"fmt"
	"net/netip"
	"reflect"
	"slices"
	"testing"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	lacev1 "github.com/lace-cni/lace/api/v1alpha1"
	"github.com/lace-cni/lace/internal/tables"
)

// assembledBefore is a node's state as the agent's sync and lacectl
// assembled it from the pieces before ComputeDesired (internal/agent
// desiredState, lacectl's node tables): the reference ComputeDesired must
// equal.
func assembledBefore(in DesiredInput) NodeState {
	cidrs := ServiceCIDRPrefixes(in.ServiceCIDRs)
	accepted, _ := AcceptUnderlays(UnderlayInput{Underlays: in.Underlays, Nodes: in.Nodes, Networks: in.Networks,
		ServiceCIDRs: cidrs, LoadBalancerPools: in.LoadBalancerClasses, AllowedExternalIPs: in.AllowedExternalIPs})
	var nodeAddrs []netip.Addr
	if in.AddrsFromUnderlay { // lacectl's nodeAddrs
		for _, u := range accepted {
			if u.Spec.Node != in.Node {
				continue
			}
			for _, s := range u.Spec.Addresses {
				a, err := netip.ParseAddr(string(s))
				if err == nil && !slices.ContainsFunc(nodeAddrs, func(b netip.Addr) bool { return b.Is4() == a.Unmap().Is4() }) {
					nodeAddrs = append(nodeAddrs, a.Unmap())
				}
			}
		}
	} else { // the agent's, from the kernel's
		for _, ad := range in.Addrs {
			if !slices.ContainsFunc(nodeAddrs, func(b netip.Addr) bool { return b.Is4() == ad.Is4() }) {
				nodeAddrs = append(nodeAddrs, ad)
			}
		}
	}
	zone := ""
	for _, n := range in.Nodes {
		if n.Name == in.Node {
			zone = n.Labels[corev1.LabelTopologyZone]
		}
	}
	reserved := append(ReservedFor(accepted, in.Networks, cidrs), ReservedHosts(in.Nodes, in.EndpointSlices)...)
	var hostEPs HostEndpoints
	if in.CheckHostEndpoints {
		hostEPs = NewHostEndpoints(in.Nodes, accepted, in.EndpointSlices, in.HostNetworkPods)
	}
	svcs := make([]corev1.Service, len(in.Services))
	for i, s := range in.Services {
		svcs[i] = *s
	}
	eps := make([]discoveryv1.EndpointSlice, len(in.EndpointSlices))
	for i, s := range in.EndpointSlices {
		eps[i] = *s
	}
	svcState := ComputeServices(ServiceInput{Node: in.Node, Zone: zone, Networks: in.Networks, BindingPolicies: in.BindingPolicies,
		Services: svcs, EndpointSlices: eps, NetworkEndpoints: in.NetworkEndpoints, Namespaces: in.Namespaces, NodeAddrs: nodeAddrs,
		Reserved: reserved, AllowedExternalIPs: in.AllowedExternalIPs, HostEndpoints: hostEPs})
	st := ComputeNode(NodeInput{Node: in.Node, Networks: in.Networks, Allocations: in.Allocations, Underlays: accepted,
		RoutingPolicies: in.RoutingPolicies, Services: BoundServiceVIPs(svcs, svcState.Bound),
		ServiceRoutingPolicies: in.ServiceRoutingPolicies, Namespaces: in.Namespaces, ServiceCIDRs: cidrs})
	st.Services = GateNodePorts(svcState.Services, &st)
	st.HealthChecks = svcState.HealthChecks
	return st
}

func ptrsOf[T any](items []T) []*T {
	out := make([]*T, len(items))
	for i := range items {
		out[i] = &items[i]
	}
	return out
}

// desiredCluster is three nodes (n1, n2 in z1, n3 in z2) with underlay
// addresses, blocks of the services fixtures' networks and an external
// network the nodes' addresses classify into, a service range, and the
// given services.
func desiredCluster(si ServiceInput) DesiredInput {
	world := external("world", "172.18.0.0/16", "fd00:18::/64")
	world.Status.ID = 100
	nets := append(slices.Clone(si.Networks), world)
	for i := range nets {
		nets[i].Labels = map[string]string{netLabel: nets[i].Name}
		if nets[i].Name == "default" {
			nets[i].Spec.IPv4Subnet = &lacev1.Subnet{Prefix: "10.1.0.0/16"}
		}
	}
	in := DesiredInput{Node: "n1", Networks: nets, BindingPolicies: si.BindingPolicies, NetworkEndpoints: si.NetworkEndpoints,
		Namespaces: si.Namespaces, AllowedExternalIPs: si.AllowedExternalIPs,
		Services: ptrsOf(si.Services), EndpointSlices: ptrsOf(si.EndpointSlices),
		Allocations: []lacev1.Allocation{alloc("default", "n1", "10.1.1.0/24"), alloc("default", "n2", "10.1.2.0/24"),
			alloc("red", "n1", "10.2.1.0/24"), alloc("blue", "n3", "10.3.3.0/24")},
		ServiceCIDRs: []networkingv1.ServiceCIDR{{ObjectMeta: metav1.ObjectMeta{Name: "kubernetes"},
			Spec: networkingv1.ServiceCIDRSpec{CIDRs: []string{"10.96.0.0/16", "fd00:96::/112"}}}},
		RoutingPolicies: []lacev1.NetworkRoutingPolicy{byName("world", "default")},
		Addrs:           []netip.Addr{netip.MustParseAddr("172.18.0.2"), netip.MustParseAddr("fd00:18::2"), netip.MustParseAddr("172.18.0.99")},
	}
	for i, zone := range []string{"z1", "z1", "z2"} {
		name := fmt.Sprintf("n%d", i+1)
		n := nodeReporting(name, fmt.Sprintf("172.18.0.%d", i+2), fmt.Sprintf("fd00:18::%d", i+2))
		n.Labels = map[string]string{corev1.LabelTopologyZone: zone}
		in.Nodes = append(in.Nodes, n)
		in.Underlays = append(in.Underlays, trustUEP(name, fmt.Sprintf("fd1a:ce:0:%d::/64", i+1), i,
			fmt.Sprintf("172.18.0.%d", i+2), fmt.Sprintf("fd00:18::%d", i+2)))
	}
	// A hostNetwork pod on n2, whose slice names it at n2's address.
	in.HostNetworkPods = []corev1.Pod{{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "agent-n2", UID: "uid-h2"},
		Spec: corev1.PodSpec{NodeName: "n2", HostNetwork: true}}}
	return in
}

// desiredClusters are the clusters of the golden comparison: the services
// fixtures' cases and the frontends' (NodePorts open and closed,
// LoadBalancer, external IPs, one of them reserved), each in a cluster of
// three nodes.
func desiredClusters() map[string]DesiredInput {
	out := map[string]DesiredInput{}
	for _, c := range svcCases() {
		out["services/"+c.name] = desiredCluster(c.input())
	}
	lb := func(s *corev1.Service) {
		s.Spec.Type = corev1.ServiceTypeLoadBalancer
		s.Spec.Ports[0].NodePort = 30080
		s.Status.LoadBalancer.Ingress = []corev1.LoadBalancerIngress{{IP: "192.0.2.10"}}
	}
	nodePort := func(port int32) svcOpt {
		return func(s *corev1.Service) { s.Spec.Type, s.Spec.Ports[0].NodePort = corev1.ServiceTypeNodePort, port }
	}
	si := svInput()
	si.AllowedExternalIPs = []netip.Prefix{netip.MustParsePrefix("203.0.113.0/24")}
	si.Services = []corev1.Service{
		svService("web", "10.96.0.10", []corev1.ServicePort{svPort("http", corev1.ProtocolTCP, 80)}, lb),
		svService("loc", "10.96.0.20", []corev1.ServicePort{svPort("http", corev1.ProtocolTCP, 80)}, nodePort(30081),
			func(s *corev1.Service) { s.Spec.ExternalTrafficPolicy = corev1.ServiceExternalTrafficPolicyLocal }),
		// Bound to red, which world does not reach: its NodePort closed.
		svService("red", "10.96.0.30", []corev1.ServicePort{svPort("http", corev1.ProtocolTCP, 80)}, nodePort(30082), svLabel("net", "red")),
		svService("xip", "10.96.0.40", svHTTP, func(s *corev1.Service) { s.Spec.ExternalIPs = []string{"203.0.113.5", "172.18.0.3"} }),
	}
	for _, s := range si.Services {
		si.EndpointSlices = append(si.EndpointSlices, svSlice(s.Name, s.Name+"-1", svHTTPSlicePorts,
			svEp("10.1.1.5", "n1"), svEp("10.1.2.5", "n2"), svEp("172.18.0.3", "n2", targetPod("agent-n2", "uid-h2"))))
	}
	out["frontends"] = desiredCluster(si)
	return out
}

// TestComputeDesiredIsTheAssemblyBefore: for every cluster, as the agent
// (the node's own addresses, host endpoints checked) and as lacectl (the
// addresses of its UnderlayEndpoint, host endpoints as the slices say),
// ComputeDesired is what the pieces assembled before gave, and its stages
// get what the default ones do.
func TestComputeDesiredIsTheAssemblyBefore(t *testing.T) {
	nodePorts, closed := 0, 0
	for name, in := range desiredClusters() {
		for _, lacectl := range []bool{false, true} {
			in.AddrsFromUnderlay, in.CheckHostEndpoints = lacectl, !lacectl
			want := assembledBefore(in)
			d, err := ComputeDesired(in)
			if err != nil {
				t.Fatal(err)
			}
			checkExtra(t, name, d)
			got := d.NodeState
			got.ServiceChanges.Gated, got.ServiceChanges.HostPorts = nil, nil
			if !reflect.DeepEqual(got, want) {
				t.Errorf("%s (lacectl %v): ComputeDesired\n%+v\nassembled before\n%+v", name, lacectl, got, want)
			}
			for _, s := range d.NodeState.Services {
				if s.Frontend == tables.FrontendNodePort {
					nodePorts++
					if s.Closed {
						closed++
					}
				}
			}
			// Stages that record what they get and return the defaults'.
			var gotShared ServiceInput
			var gotViews NodeInput
			in.Stages = DesiredStages{
				Services: func(d *NodeDesired, shared ServiceInput, svcs []*corev1.Service, eps []*discoveryv1.EndpointSlice) (ServiceState, []ServiceVIPs) {
					gotShared = shared
					return computeServiceStage(d, shared, svcs, eps)
				},
				Views: func(_ *NodeDesired, ni NodeInput) NodeState { gotViews = ni; return ComputeNode(ni) },
			}
			staged, err := ComputeDesired(in)
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(staged, d) {
				t.Errorf("%s: with stages %+v, without %+v", name, staged, d)
			}
			if gotShared.Node != in.Node || !slices.Equal(gotShared.NodeAddrs, d.NodeAddrs) || gotShared.Zone != d.Zone ||
				!reflect.DeepEqual(gotViews.Services, d.VIPs) || len(gotViews.Underlays) != len(in.Underlays) {
				t.Errorf("%s: stages got %+v and %+v", name, gotShared, gotViews)
			}
			in.Stages = DesiredStages{}
			// The reserved addresses do not depend on the order the
			// caches list objects in: the agent compares them between
			// computations, and a difference computes every service.
			rev := in
			rev.Networks, rev.Underlays, rev.Nodes = slices.Clone(in.Networks), slices.Clone(in.Underlays), slices.Clone(in.Nodes)
			slices.Reverse(rev.Networks)
			slices.Reverse(rev.Underlays)
			slices.Reverse(rev.Nodes)
			if r, err := ComputeDesired(rev); err != nil || !slices.Equal(r.Reserved, d.Reserved) {
				t.Errorf("%s: reserved %v listed the other way, %v (%v)", name, r.Reserved, d.Reserved, err)
			}
		}
	}
	// The clusters exercise the gate both ways.
	if nodePorts == 0 || closed == 0 || closed == nodePorts {
		t.Errorf("%d NodePorts, %d closed: the clusters do not exercise the gate", nodePorts, closed)
	}
}

// checkExtra: the keys the data plane is told beside the merge's are
// exactly those at which the node's list differs from the merge's, each
// once (a key left out would leave its entry unwritten).
func checkExtra(t *testing.T, name string, d NodeDesired) {
	t.Helper()
	merged, final := d.Services.Services, d.NodeState.Services
	var want []tables.FrontendKey
	for i := range final {
		j, ok := tables.FindFrontend(merged, final[i].Key())
		if !ok || !reflect.DeepEqual(merged[j], final[i]) {
			want = append(want, final[i].Key())
		}
	}
	for i := range merged {
		if _, ok := tables.FindFrontend(final, merged[i].Key()); !ok {
			want = append(want, merged[i].Key())
		}
	}
	slices.SortFunc(want, tables.FrontendKey.Compare)
	ch := d.NodeState.ServiceChanges
	if !slices.IsSortedFunc(ch.Gated, tables.FrontendKey.Compare) {
		t.Errorf("%s: the gated keys %v are not sorted", name, ch.Gated)
	}
	got := slices.SortedFunc(slices.Values(append(slices.Clone(ch.Gated), ch.HostPorts...)), tables.FrontendKey.Compare)
	if !slices.Equal(got, want) {
		t.Errorf("%s: the data plane is told %v beside the merge's keys, the list differs at %v", name, got, want)
	}
}

// TestComputeDesiredHostPorts: the hostPorts stage gets the gated
// services and health checks, its entries join the state's services in
// key order and are named to the data plane, and its error is
// ComputeDesired's.
func TestComputeDesiredHostPorts(t *testing.T) {
	in := desiredClusters()["frontends"]
	d, _ := ComputeDesired(in)
	hp := tables.Service{VIP: netip.MustParseAddr("172.18.0.2"), Proto: 6, Port: 8443, Frontend: tables.FrontendHostPort}
	in.Stages.HostPorts = func(got *NodeDesired) ([]tables.Service, error) {
		if !reflect.DeepEqual(got.NodeState.Services, d.NodeState.Services) || !reflect.DeepEqual(got.HealthChecks, d.HealthChecks) {
			t.Errorf("hostPorts stage got %v, want the gated services %v", got.NodeState.Services, d.NodeState.Services)
		}
		return []tables.Service{hp}, nil
	}
	withHP, err := ComputeDesired(in)
	i, ok := tables.FindFrontend(withHP.NodeState.Services, hp.Key())
	if err != nil || len(withHP.NodeState.Services) != len(d.NodeState.Services)+1 || !ok || !reflect.DeepEqual(withHP.NodeState.Services[i], hp) ||
		!slices.IsSortedFunc(withHP.NodeState.Services, func(a, b tables.Service) int { return a.Key().Compare(b.Key()) }) {
		t.Errorf("with hostPorts: %v, %v", withHP.NodeState.Services, err)
	}
	checkExtra(t, "with hostPorts", withHP)
	boom := errors.New("boom")
	in.Stages.HostPorts = func(*NodeDesired) ([]tables.Service, error) { return nil, boom }
	if _, err := ComputeDesired(in); !errors.Is(err, boom) {
		t.Errorf("hostPorts error: %v", err)
	}
}

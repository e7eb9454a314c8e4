package nodesync

import (
	"net/netip"
	"reflect"
	"testing"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	lacev1 "github.com/lace-cni/lace/api/v1alpha1"
	"github.com/lace-cni/lace/internal/model"
)

// TestDesiredStateIsComputeDesired: the agent's desiredState, with its
// stages that keep results between calls, is model.ComputeDesired's
// answer for the same objects, on the first computation and after an
// endpoint change, which only the service's stage computes again, and a
// new Service and block, which the views' stage does.
func TestDesiredStateIsComputeDesired(t *testing.T) {
	uep := func(node, addr, loc string) *lacev1.UnderlayEndpoint {
		return &lacev1.UnderlayEndpoint{ObjectMeta: metav1.ObjectMeta{Name: node},
			Spec: lacev1.UnderlayEndpointSpec{Node: node, Addresses: []lacev1.IPAddress{lacev1.IPAddress(addr)}, Locator: lacev1.CIDR(loc)}}
	}
	svc := &corev1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "web"},
		Spec: corev1.ServiceSpec{Type: corev1.ServiceTypeNodePort, ClusterIP: "10.96.0.10", ClusterIPs: []string{"10.96.0.10"},
			Ports: []corev1.ServicePort{{Name: "http", Protocol: corev1.ProtocolTCP, Port: 80, NodePort: 30080}}}}
	ep := func(addr, node string) discoveryv1.Endpoint {
		return discoveryv1.Endpoint{Addresses: []string{addr}, NodeName: ptr.To(node),
			Conditions: discoveryv1.EndpointConditions{Ready: ptr.To(true), Serving: ptr.To(true), Terminating: ptr.To(false)}}
	}
	slice := &discoveryv1.EndpointSlice{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "web-1",
		Labels: map[string]string{discoveryv1.LabelServiceName: "web"}}, AddressType: discoveryv1.AddressTypeIPv4,
		Ports:     []discoveryv1.EndpointPort{{Name: ptr.To("http"), Port: ptr.To[int32](8080), Protocol: ptr.To(corev1.ProtocolTCP)}},
		Endpoints: []discoveryv1.Endpoint{ep("10.244.0.2", "n1")}}
	ta := newTestSyncer(t, 24, uep("n1", "fd00:30::11", "fd1a:ce:0:1::/64"), uep("n2", "fd00:30::12", "fd1a:ce:0:2::/64"), svc, slice,
		&lacev1.Allocation{ObjectMeta: metav1.ObjectMeta{Name: "default.n2"},
			Spec: lacev1.AllocationSpec{Network: "default", Node: "n2", Prefixes: []lacev1.CIDR{"10.244.1.0/24"}}})
	ctx := t.Context()

	check := func(when string, backends int) {
		t.Helper()
		got, _, _, err := ta.desiredState(ctx)
		if err != nil {
			t.Fatalf("%s: desiredState: %v", when, err)
		}
		in := model.DesiredInput{Node: "n1", Addrs: []netip.Addr{netip.MustParseAddr("fd00:30::11")}}
		var nets lacev1.NetworkList
		var allocs lacev1.AllocationList
		var ueps lacev1.UnderlayEndpointList
		var nbps lacev1.NetworkBindingPolicyList
		var nss corev1.NamespaceList
		var nodes corev1.NodeList
		var svcs corev1.ServiceList
		var slices discoveryv1.EndpointSliceList
		for _, l := range []client.ObjectList{&nets, &allocs, &ueps, &nbps, &nss, &nodes, &svcs, &slices} {
			if err := ta.c.List(ctx, l); err != nil {
				t.Fatal(err)
			}
		}
		in.Networks, in.Allocations, in.Underlays, in.BindingPolicies, in.Nodes = nets.Items, allocs.Items, ueps.Items, nbps.Items, nodes.Items
		in.Namespaces = map[string]map[string]string{}
		for _, ns := range nss.Items {
			in.Namespaces[ns.Name] = ns.Labels
		}
		in.Services, in.EndpointSlices = ptrs(svcs.Items), ptrs(slices.Items)
		want, err := model.ComputeDesired(in)
		if err != nil {
			t.Fatal(err)
		}
		// The changes number the agent's merges: ComputeDesired has none.
		got.ServiceChanges = model.ServiceChanges{}
		if !reflect.DeepEqual(got, want.NodeState) {
			t.Errorf("%s: the agent's desired state\n%+v\nComputeDesired's\n%+v", when, got, want.NodeState)
		}
		if len(got.Services) == 0 || len(got.Services[0].Backends) != backends || len(got.Routes) == 0 {
			t.Errorf("%s: want the ClusterIP with %d backends (the NodePort's address is IPv6) and views: %+v", when, backends, got)
		}
	}
	check("first", 1)

	slice.Endpoints = append(slice.Endpoints, ep("10.244.1.2", "n2"))
	if err := ta.c.Update(ctx, slice); err != nil {
		t.Fatal(err)
	}
	check("an endpoint added", 2)

	// A new Service's VIP and a new block: the views are computed again.
	svc2 := svc.DeepCopy()
	svc2.Name, svc2.ResourceVersion, svc2.Spec.ClusterIP, svc2.Spec.ClusterIPs = "api", "", "10.96.0.20", []string{"10.96.0.20"}
	if err := ta.c.Create(ctx, svc2); err != nil {
		t.Fatal(err)
	}
	if err := ta.c.Create(ctx, &lacev1.Allocation{ObjectMeta: metav1.ObjectMeta{Name: "default.n3"},
		Spec: lacev1.AllocationSpec{Network: "default", Node: "n3", Prefixes: []lacev1.CIDR{"10.244.3.0/24"}}}); err != nil {
		t.Fatal(err)
	}
	check("a service and a block added", 2)
}

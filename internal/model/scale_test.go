package model

import (
	"fmt"
	"net/netip"
	"testing"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	lacev1 "github.com/lace-cni/lace/api/v1alpha1"
)

// scaleInput is the services benchmark's cluster (bench/services.go) as
// the model sees it: the chart's default network and world, a catch-all
// binding policy, n selector-less services with one EndpointSlice of e
// ready endpoints each, and the NetworkEndpoints of a few pods.
func scaleInput(n, e int) (ServiceInput, NodeInput) {
	def := l3("default", nil, "10.244.0.0/16", "fd00:244::/48")
	def.Status.ID = 1
	world := external("world", "0.0.0.0/0", "::/0")
	world.Status.ID = 2
	nets := []lacev1.Network{def, world}
	si := ServiceInput{Node: "n1", Zone: "z1", Networks: nets,
		BindingPolicies: []lacev1.NetworkBindingPolicy{policy("default", "default", CatchAllPriority, "", nil, nil)},
		Namespaces:      map[string]map[string]string{"bench": {"kubernetes.io/metadata.name": "bench"}}}
	for i := range n {
		name := fmt.Sprintf("s%05d", i)
		vip := netip.AddrFrom4([4]byte{10, 96, byte(i >> 8), byte(i)}).String()
		si.Services = append(si.Services, corev1.Service{
			ObjectMeta: metav1.ObjectMeta{Namespace: "bench", Name: name, ResourceVersion: "1"},
			Spec: corev1.ServiceSpec{Type: corev1.ServiceTypeClusterIP, ClusterIP: vip, ClusterIPs: []string{vip},
				Ports: []corev1.ServicePort{{Name: "http", Protocol: corev1.ProtocolTCP, Port: 80}}}})
		sl := discoveryv1.EndpointSlice{ObjectMeta: metav1.ObjectMeta{Namespace: "bench", Name: name, ResourceVersion: "1",
			Labels: map[string]string{discoveryv1.LabelServiceName: name}},
			AddressType: discoveryv1.AddressTypeIPv4,
			Ports:       []discoveryv1.EndpointPort{{Name: ptr.To("http"), Port: ptr.To[int32](8080), Protocol: ptr.To(corev1.ProtocolTCP)}}}
		for j := range e {
			idx := i*e + j + 1
			a := netip.AddrFrom4([4]byte{10, 160 + byte(idx>>16), byte(idx >> 8), byte(idx)})
			sl.Endpoints = append(sl.Endpoints, discoveryv1.Endpoint{Addresses: []string{a.String()},
				Conditions: discoveryv1.EndpointConditions{Ready: ptr.To(true), Serving: ptr.To(true), Terminating: ptr.To(false)}})
		}
		si.EndpointSlices = append(si.EndpointSlices, sl)
	}
	for i := range 20 {
		si.NetworkEndpoints = append(si.NetworkEndpoints, svNE(fmt.Sprintf("p%d", i), "default", "n1", "",
			fmt.Sprintf("10.244.0.%d", i+2)))
	}
	ni := NodeInput{Node: "n1", Networks: nets, Namespaces: si.Namespaces,
		Allocations:  []lacev1.Allocation{alloc("default", "n1", "10.244.0.0/24"), alloc("default", "n2", "10.244.1.0/24")},
		ServiceCIDRs: []netip.Prefix{netip.MustParsePrefix("10.96.0.0/12")}}
	for j, node := range []string{"n1", "n2"} {
		ni.Underlays = append(ni.Underlays, lacev1.UnderlayEndpoint{Spec: lacev1.UnderlayEndpointSpec{Node: node,
			Addresses: []lacev1.IPAddress{lacev1.IPAddress(fmt.Sprintf("fd00:30::%x", j+11))},
			Locator:   lacev1.CIDR(fmt.Sprintf("fd1a:ce:0:%x::/64", j))}})
	}
	return si, ni
}

// BenchmarkComputeServicesScale: the whole node's services at the
// benchmark's largest size, 10,000 services of 10 endpoints.
func BenchmarkComputeServicesScale(b *testing.B) {
	si, _ := scaleInput(10000, 10)
	b.ReportAllocs()
	b.ResetTimer()
	for range b.N {
		if st := ComputeServices(si); len(st.Services) != 10000 {
			b.Fatalf("%d services", len(st.Services))
		}
	}
}

// BenchmarkComputeNodeServicesScale: the views with 10,000 service VIPs.
func BenchmarkComputeNodeServicesScale(b *testing.B) {
	si, ni := scaleInput(10000, 10)
	ni.Services = BoundServiceVIPs(si.Services, ComputeServices(si).Bound)
	b.ReportAllocs()
	b.ResetTimer()
	for range b.N {
		if st := ComputeNode(ni); len(st.Routes) < 10000 {
			b.Fatalf("%d routes", len(st.Routes))
		}
	}
}

package chaos

import (
	"context"
	"net/netip"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/utils/ptr"
)

// TestMapsDiff: the desired state computed from objects passes the maps
// that match it, and names each way maps can differ: a pod address
// missing or left behind, a Service port not served, a frontend no object
// asks for, a backend that is not ready, a backend no frontend counts.
func TestMapsDiff(t *testing.T) {
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "web-n1", Namespace: Namespace},
		Spec: corev1.PodSpec{NodeName: "n1", Containers: []corev1.Container{{Name: "c",
			Ports: []corev1.ContainerPort{{ContainerPort: 8443, HostPort: 9443, Protocol: corev1.ProtocolTCP}}}}},
		Status: corev1.PodStatus{PodIPs: []corev1.PodIP{{IP: "10.0.0.1"}, {IP: "fd00::1"}}}}
	svc := &corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: svcName, Namespace: Namespace}, Spec: corev1.ServiceSpec{
		Type: corev1.ServiceTypeNodePort, ClusterIPs: []string{"10.96.0.10"},
		Ports: []corev1.ServicePort{{Name: "http", Port: 80, NodePort: 30080, Protocol: corev1.ProtocolTCP}}}}
	slice := &discoveryv1.EndpointSlice{ObjectMeta: metav1.ObjectMeta{Name: svcName + "-x", Namespace: Namespace,
		Labels: map[string]string{discoveryv1.LabelServiceName: svcName}},
		Ports: []discoveryv1.EndpointPort{{Name: ptr.To("http"), Port: ptr.To[int32](8080)}},
		Endpoints: []discoveryv1.Endpoint{
			{Addresses: []string{"10.0.0.1"}, Conditions: discoveryv1.EndpointConditions{Ready: ptr.To(true)}},
			{Addresses: []string{"10.0.0.2"}, Conditions: discoveryv1.EndpointConditions{Ready: ptr.To(false)}},
		}}
	h := &harness{cs: fake.NewClientset(pod, svc, slice)}
	d, err := h.desiredMaps(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	vip := frontKey{netip.MustParseAddr("10.96.0.10"), 6, 80}
	good := func() nodeMaps {
		return nodeMaps{
			endpoints: map[netip.Addr]bool{netip.MustParseAddr("10.0.0.1"): true, netip.MustParseAddr("fd00::1"): true},
			fronts: map[frontKey][]string{
				vip: {"10.0.0.1:8080"},
				{netip.MustParseAddr("192.168.0.1"), 6, 30080}: {"10.0.0.1:8080"},
				{netip.MustParseAddr("192.168.0.1"), 6, 9443}:  {"10.0.0.1:8443"},
			},
		}
	}
	if diff := d.diff("n1", good()); diff != "" {
		t.Fatalf("matching maps: %s", diff)
	}
	for _, c := range []struct {
		name   string
		node   string
		mutate func(*nodeMaps)
		want   string
	}{
		{"pod address missing", "n1", func(m *nodeMaps) { delete(m.endpoints, netip.MustParseAddr("fd00::1")) }, "lacks pod addresses [fd00::1]"},
		{"address of no pod", "n1", func(m *nodeMaps) { m.endpoints[netip.MustParseAddr("10.0.0.9")] = true }, "addresses of no pod [10.0.0.9]"},
		{"another node's pod", "n2", func(*nodeMaps) {}, "addresses of no pod [10.0.0.1 fd00::1]"},
		{"Service port not served", "n1", func(m *nodeMaps) { delete(m.fronts, vip) }, "lacks Service ports [10.96.0.10/6:80 (" + Namespace + "/" + svcName + ")]"},
		{"leftover frontend", "n1", func(m *nodeMaps) { m.fronts[frontKey{netip.MustParseAddr("10.96.0.99"), 6, 80}] = nil }, "no object asks for [10.96.0.99/6:80]"},
		{"hostPort of no pod here", "n2", func(m *nodeMaps) { m.endpoints = map[netip.Addr]bool{} }, "no object asks for [192.168.0.1/6:9443]"},
		{"backend not ready", "n1", func(m *nodeMaps) { m.fronts[vip] = []string{"10.0.0.1:8080", "10.0.0.2:8080"} }, "balances over [10.0.0.1:8080 10.0.0.2:8080]"},
		{"orphan backends", "n1", func(m *nodeMaps) { m.orphans = 2 }, "lace_backends holds 2 entries"},
	} {
		m := good()
		c.mutate(&m)
		if diff := d.diff(c.node, m); !strings.Contains(diff, c.want) {
			t.Errorf("%s: diff %q, want it to say %q", c.name, diff, c.want)
		}
	}
}

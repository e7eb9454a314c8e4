package nodesync

import (
	"net/netip"
	"slices"
	"testing"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/lace-cni/lace/internal/model"
)

// TestReservedPorts: the kubelet's ports, the agent's own, health check
// node ports and the API server's where the kubernetes EndpointSlice puts
// it on this node (only on that address; another node's API server
// reserves nothing here).
func TestReservedPorts(t *testing.T) {
	a := &Syncer{opts: Options{MetricsAddr: ":9962", HealthAddr: "127.0.0.1:9963"}}
	me, other := netip.MustParseAddr("172.30.0.11"), "172.30.0.12"
	node := &corev1.Node{}
	node.Status.DaemonEndpoints.KubeletEndpoint.Port = 10350
	slice := &discoveryv1.EndpointSlice{
		ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "kubernetes", Labels: map[string]string{discoveryv1.LabelServiceName: "kubernetes"}},
		Endpoints:  []discoveryv1.Endpoint{{Addresses: []string{me.String()}}, {Addresses: []string{other}}},
		Ports:      []discoveryv1.EndpointPort{{Port: ptr.To[int32](6443)}},
	}
	got := a.reservedPorts(node, []netip.Addr{me}, []model.HealthCheck{{Port: 30999}}, []*discoveryv1.EndpointSlice{slice})
	want := []model.ReservedPort{
		{Proto: 6, Port: 10250, What: "kubelet"},
		{Proto: 6, Port: 10350, What: "kubelet"},
		{Proto: 6, Port: 9962, What: "lace-agent metrics"},
		{Proto: 6, Port: 9963, What: "lace-agent health"},
		{Proto: 6, Port: 30999, What: "health check node port"},
		{Proto: 6, Port: 6443, Addr: me, What: "API server"},
	}
	if !slices.Equal(got, want) {
		t.Errorf("reserved %v, want %v", got, want)
	}
}

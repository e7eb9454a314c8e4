package agent

import (
	"net/netip"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/lace-cni/lace/internal/agent/flows"
)

// TestServiceNames: every address a Service is reached at (both
// families' ClusterIPs, external IPs, load balancer addresses) on each
// port and protocol, and its node ports.
func TestServiceNames(t *testing.T) {
	s := &corev1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: "web", Name: "front"},
		Spec: corev1.ServiceSpec{ClusterIPs: []string{"10.96.0.7", "fd00:96::7"}, ExternalIPs: []string{"192.0.2.7"},
			Ports: []corev1.ServicePort{{Protocol: corev1.ProtocolTCP, Port: 80, NodePort: 30080}, {Protocol: corev1.ProtocolUDP, Port: 53}}},
		Status: corev1.ServiceStatus{LoadBalancer: corev1.LoadBalancerStatus{Ingress: []corev1.LoadBalancerIngress{{IP: "198.51.100.7"}, {Hostname: "lb.example"}}}},
	}
	at, nodePorts := map[flows.Frontend]string{}, map[flows.Frontend]string{}
	serviceNames([]corev1.Service{*s}, at, nodePorts)
	if len(at) != 8 || len(nodePorts) != 1 {
		t.Errorf("frontends %v, node ports %v: want 4 addresses x 2 ports and one node port", at, nodePorts)
	}
	for _, fe := range []flows.Frontend{
		{Proto: 6, Addr: netip.MustParseAddr("fd00:96::7"), Port: 80},
		{Proto: 17, Addr: netip.MustParseAddr("198.51.100.7"), Port: 53},
		{Proto: 6, Addr: netip.MustParseAddr("192.0.2.7"), Port: 80},
	} {
		if at[fe] != "web/front" {
			t.Errorf("%+v: %q", fe, at[fe])
		}
	}
	if nodePorts[flows.Frontend{Proto: 6, Port: 30080}] != "web/front" {
		t.Errorf("node ports %v", nodePorts)
	}
}

// TestServiceNamesContested: another tenant's Service claiming a
// ClusterIP as an external IP never renames the Service the ClusterIP
// is, whatever the order; two claims of one external IP name the older
// Service.
func TestServiceNamesContested(t *testing.T) {
	t0 := metav1.Now()
	t1 := metav1.NewTime(t0.Add(time.Minute))
	udp53 := []corev1.ServicePort{{Protocol: corev1.ProtocolUDP, Port: 53}}
	dns := corev1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: "kube-system", Name: "dns", CreationTimestamp: t1},
		Spec: corev1.ServiceSpec{ClusterIPs: []string{"10.96.0.10"}, Ports: udp53}}
	evil := corev1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: "zz", Name: "evil", CreationTimestamp: t0},
		Spec: corev1.ServiceSpec{ClusterIPs: []string{"10.96.9.9"}, ExternalIPs: []string{"10.96.0.10", "192.0.2.8"}, Ports: udp53}}
	late := corev1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: "aa", Name: "late", CreationTimestamp: t1},
		Spec: corev1.ServiceSpec{ClusterIPs: []string{"10.96.9.10"}, ExternalIPs: []string{"192.0.2.8"}, Ports: udp53}}
	for _, order := range [][]corev1.Service{{dns, evil, late}, {late, evil, dns}} {
		at, nodePorts := map[flows.Frontend]string{}, map[flows.Frontend]string{}
		serviceNames(order, at, nodePorts)
		if got := at[flows.Frontend{Proto: 17, Addr: netip.MustParseAddr("10.96.0.10"), Port: 53}]; got != "kube-system/dns" {
			t.Errorf("the ClusterIP named %q", got)
		}
		if got := at[flows.Frontend{Proto: 17, Addr: netip.MustParseAddr("192.0.2.8"), Port: 53}]; got != "zz/evil" {
			t.Errorf("the contested external IP named %q, want the older claim's", got)
		}
	}
}

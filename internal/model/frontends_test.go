package model

import (
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/utils/ptr"

	"github.com/lace-cni/lace/internal/tables"
)

func renderFrontends(st ServiceState) []string {
	var out []string
	for _, s := range st.Services {
		var b strings.Builder
		fmt.Fprintf(&b, "%s %s:%d/%d", s.Frontend, s.VIP, s.Port, s.Proto)
		if s.External() {
			fmt.Fprintf(&b, " via %s:%d", s.ClusterIP, s.ClusterPort)
		}
		for _, be := range s.Backends {
			fmt.Fprintf(&b, " %s", netip.AddrPortFrom(be.Addr, be.Port))
		}
		if s.Drop {
			b.WriteString(" drop")
		}
		if s.Local {
			b.WriteString(" local")
		}
		for _, r := range s.SourceRanges {
			fmt.Fprintf(&b, " from=%s", r)
		}
		out = append(out, b.String())
	}
	return out
}

// TestServiceFrontends: NodePorts on the node's address of each family,
// LoadBalancer ingress addresses (not ipMode Proxy), external IPs, each
// with the endpoints its externalTrafficPolicy makes eligible here;
// allocateLoadBalancerNodePorts false leaves the NodePort out; source
// ranges of the address's family; a ClusterIP wins an address another
// Service names as external.
func TestServiceFrontends(t *testing.T) {
	lb := func(s *corev1.Service) {
		s.Spec.Type = corev1.ServiceTypeLoadBalancer
		s.Spec.Ports[0].NodePort = 30080
		s.Status.LoadBalancer.Ingress = []corev1.LoadBalancerIngress{{IP: "192.0.2.10"},
			{IP: "192.0.2.11", IPMode: ptr.To(corev1.LoadBalancerIPModeProxy)}}
		s.Spec.LoadBalancerSourceRanges = []string{" 198.51.100.0/24", "2001:db8::/32", "198.51.100.7/24", "bogus"}
	}
	local := func(s *corev1.Service) { s.Spec.ExternalTrafficPolicy = corev1.ServiceExternalTrafficPolicyLocal }
	in := svInput()
	in.NodeAddrs = []netip.Addr{netip.MustParseAddr("172.18.0.2"), netip.MustParseAddr("fd00:18::2")}
	in.Services = []corev1.Service{
		svService("web", "10.96.0.10", []corev1.ServicePort{svPort("http", corev1.ProtocolTCP, 80)}, lb),
		svService("loc", "10.96.0.20", []corev1.ServicePort{{Name: "http", Protocol: corev1.ProtocolTCP, Port: 80, NodePort: 30081}},
			func(s *corev1.Service) { s.Spec.Type = corev1.ServiceTypeNodePort }, local),
		svService("nonp", "10.96.0.30", []corev1.ServicePort{svPort("http", corev1.ProtocolTCP, 80)}, lb,
			func(s *corev1.Service) { s.Spec.Ports[0].NodePort = 0; s.Status.LoadBalancer.Ingress = nil }),
		// External IPs: one its own, one another service's ClusterIP.
		svService("xip", "10.96.0.40", svHTTP, func(s *corev1.Service) { s.Spec.ExternalIPs = []string{"203.0.113.5", "10.96.0.10"} }),
		// A Service sorting first names another's load balancer address
		// and a node's address: it takes neither.
		svService("aaa-thief", "10.96.0.50", svHTTP, func(s *corev1.Service) {
			s.Spec.ExternalIPs = []string{"192.0.2.10", "172.18.0.9"}
		}),
	}
	in.Reserved = []netip.Prefix{netip.MustParsePrefix("172.18.0.9/32")}
	// The operator allows all of them; the reserved one stays refused.
	in.AllowedExternalIPs = []netip.Prefix{netip.MustParsePrefix("0.0.0.0/0")}
	in.EndpointSlices = nil
	for _, name := range []string{"web", "loc", "nonp", "xip", "aaa-thief"} {
		in.EndpointSlices = append(in.EndpointSlices, svSlice(name, name+"-1", svHTTPSlicePorts, svEp("10.1.1.5", "n1"), svEp("10.1.2.5", "n2")))
	}
	got := renderFrontends(ComputeServices(in))
	want := []string{
		"ClusterIP 10.96.0.10:80/6 10.1.1.5:8080 10.1.2.5:8080",
		"ClusterIP 10.96.0.20:80/6 10.1.1.5:8080 10.1.2.5:8080",
		"ClusterIP 10.96.0.30:80/6 10.1.1.5:8080 10.1.2.5:8080",
		"ClusterIP 10.96.0.40:80/6 10.1.1.5:8080 10.1.2.5:8080",
		"ClusterIP 10.96.0.50:80/6 10.1.1.5:8080 10.1.2.5:8080",
		"NodePort 172.18.0.2:30080/6 via 10.96.0.10:80 10.1.1.5:8080 10.1.2.5:8080",
		"NodePort 172.18.0.2:30081/6 via 10.96.0.20:80 10.1.1.5:8080 local",
		"LoadBalancer 192.0.2.10:80/6 via 10.96.0.10:80 10.1.1.5:8080 10.1.2.5:8080 from=198.51.100.0/24",
		"ExternalIP 203.0.113.5:80/6 via 10.96.0.40:80 10.1.1.5:8080 10.1.2.5:8080",
	}
	if !slices.Equal(got, want) {
		t.Errorf("frontends\n%s\nwant\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}

	// Local without an endpoint here drops.
	in.EndpointSlices = in.EndpointSlices[:0]
	in.EndpointSlices = append(in.EndpointSlices, svSlice("loc", "loc-1", svHTTPSlicePorts, svEp("10.1.2.5", "n2")))
	in.Services = in.Services[1:2]
	got = renderFrontends(ComputeServices(in))
	want = []string{"ClusterIP 10.96.0.20:80/6 10.1.2.5:8080", "NodePort 172.18.0.2:30081/6 via 10.96.0.20:80 drop local"}
	if !slices.Equal(got, want) {
		t.Errorf("Local without a local endpoint\n%s\nwant\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
}

// TestGateNodePorts: a NodePort is open on a node address when the
// address's external network reaches the service's ClusterIP.
func TestGateNodePorts(t *testing.T) {
	np := func(vip, cip string, net uint32) tables.Service {
		return tables.Service{VIP: netip.MustParseAddr(vip), Proto: 6, Port: 30080, NetID: net, Frontend: tables.FrontendNodePort,
			ClusterIP: netip.MustParseAddr(cip), ClusterPort: 80}
	}
	svcs := []tables.Service{
		{VIP: netip.MustParseAddr("10.96.0.10"), Proto: 6, Port: 80, NetID: 1},
		np("172.18.0.2", "10.96.0.10", 1), // world reaches default's web
		np("172.18.0.2", "10.96.0.20", 2), // not isolated's
		np("fd00:18::2", "fd00:96::10", 1),
	}
	st := &NodeState{
		Classifiers: []tables.Classifier{{NetID: 100, Prefix: netip.MustParsePrefix("0.0.0.0/0")}},
		Routes: []tables.Route{{NetID: 100, Prefix: netip.MustParsePrefix("10.96.0.10/32"), Kind: tables.RouteService, DstNet: 1},
			{NetID: 1, Prefix: netip.MustParsePrefix("10.96.0.20/32"), Kind: tables.RouteService, DstNet: 2}},
	}
	got := GateNodePorts(svcs, st)
	closed := []bool{}
	for _, s := range got {
		closed = append(closed, s.Closed)
	}
	// The IPv6 address classifies into no external network: closed.
	if want := []bool{false, false, true, true}; !slices.Equal(closed, want) {
		t.Errorf("closed %v, want %v", closed, want)
	}
	if svcs[2].Closed {
		t.Error("GateNodePorts modified its input")
	}
	if again := GateNodePorts(got, st); &again[0] != &got[0] {
		t.Error("a second gating with nothing to change copied the services")
	}
}

package lacectl

import (
	"bytes"
	"context"
	"maps"
	"math"
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"

	lacev1 "github.com/lace-cni/lace/api/v1alpha1"
	"github.com/lace-cni/lace/internal/agent"
	"github.com/lace-cni/lace/internal/model"
	"github.com/lace-cni/lace/pkg/scheme"
)

// The services of the traced cluster (traceCluster): nodes node-a and
// node-b in zone z1, node-c in z2; the default network's services bound by
// a catch-all Service policy, shop's tier=backend services to backend,
// vault's to the closed anonymous network secret; ServiceRoutingPolicies
// opening backend's services in namespace shop to default and to the
// nodes (world).

type svcOpt func(*corev1.Service)

// tsvc is a ClusterIP service; ips is comma-separated spec.clusterIPs.
func tsvc(ns, name, ips string, ports []corev1.ServicePort, opts ...svcOpt) corev1.Service {
	s := corev1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Spec: corev1.ServiceSpec{Type: corev1.ServiceTypeClusterIP, Ports: ports}}
	if ips != "" {
		s.Spec.ClusterIPs = strings.Split(ips, ",")
		s.Spec.ClusterIP = s.Spec.ClusterIPs[0]
	}
	for _, o := range opts {
		o(&s)
	}
	return s
}

func tport(name string, proto corev1.Protocol, port int32) corev1.ServicePort {
	return corev1.ServicePort{Name: name, Protocol: proto, Port: port}
}

func withLabel(k, v string) svcOpt {
	return func(s *corev1.Service) {
		if s.Labels == nil {
			s.Labels = map[string]string{}
		}
		s.Labels[k] = v
	}
}

func withAnnotation(k, v string) svcOpt {
	return func(s *corev1.Service) {
		if s.Annotations == nil {
			s.Annotations = map[string]string{}
		}
		s.Annotations[k] = v
	}
}

type epOpt func(*discoveryv1.Endpoint)

// tep is a ready endpoint on node (zone from the node: node-a and node-b
// are in z1, node-c in z2; "" for no node).
func tep(addr, node string, opts ...epOpt) discoveryv1.Endpoint {
	e := discoveryv1.Endpoint{Addresses: []string{addr}, Conditions: discoveryv1.EndpointConditions{
		Ready: ptr.To(true), Serving: ptr.To(true), Terminating: ptr.To(false)}}
	if node != "" {
		e.NodeName = ptr.To(node)
		e.Zone = ptr.To(map[string]string{"node-a": "z1", "node-b": "z1", "node-c": "z2"}[node])
	}
	for _, o := range opts {
		o(&e)
	}
	return e
}

func target(ns, pod string) epOpt {
	return func(e *discoveryv1.Endpoint) {
		e.TargetRef = &corev1.ObjectReference{Kind: "Pod", Namespace: ns, Name: pod}
	}
}

var terminating epOpt = func(e *discoveryv1.Endpoint) {
	e.Conditions = discoveryv1.EndpointConditions{Ready: ptr.To(false), Serving: ptr.To(true), Terminating: ptr.To(true)}
}

var notReady epOpt = func(e *discoveryv1.Endpoint) {
	e.Conditions = discoveryv1.EndpointConditions{Ready: ptr.To(false), Serving: ptr.To(false), Terminating: ptr.To(false)}
}

func forZone(z string) epOpt {
	return func(e *discoveryv1.Endpoint) {
		e.Hints = &discoveryv1.EndpointHints{ForZones: []discoveryv1.ForZone{{Name: z}}}
	}
}

// tslice is an EndpointSlice of service svc with one port.
func tslice(ns, svc, name string, v6 bool, portName string, port int32, eps ...discoveryv1.Endpoint) discoveryv1.EndpointSlice {
	at := discoveryv1.AddressTypeIPv4
	if v6 {
		at = discoveryv1.AddressTypeIPv6
	}
	return discoveryv1.EndpointSlice{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name,
		Labels: map[string]string{discoveryv1.LabelServiceName: svc}}, AddressType: at,
		Ports: []discoveryv1.EndpointPort{{Name: ptr.To(portName), Protocol: ptr.To(corev1.ProtocolTCP), Port: ptr.To(port)}}, Endpoints: eps}
}

func tsnbp(name, network string, priority int32, sel map[string]string) lacev1.NetworkBindingPolicy {
	p := tnbp(name, network, priority, sel)
	p.Spec.MatchKind = lacev1.MatchKindService
	return p
}

func tnode(name, zone string) corev1.Node {
	return corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{corev1.LabelTopologyZone: zone}}}
}

// addServices adds the services, their slices, the nodes and what binds
// and opens the services to the traced cluster.
func addServices(in *TraceInput) {
	http := []corev1.ServicePort{tport("http", corev1.ProtocolTCP, 80)}
	bound := withAnnotation(lacev1.AnnotationServiceNetwork, "default")
	in.BindingPolicies = append(in.BindingPolicies,
		tsnbp("services", "default", math.MaxInt32, nil),
		tsnbp("shop-services", "backend", 10, map[string]string{"tier": "backend"}),
		tsnbp("vault-services", "secret", 10, map[string]string{"vault": "yes"}),
		tsnbp("ghost-services", "ghost", 10, map[string]string{"net": "ghost"}))
	in.ServiceRoutingPolicies = append(in.ServiceRoutingPolicies, lacev1.ServiceRoutingPolicy{
		ObjectMeta: metav1.ObjectMeta{Name: "default-to-shop-services"}, Spec: lacev1.ServiceRoutingPolicySpec{
			SrcSelector:       &metav1.LabelSelector{MatchLabels: map[string]string{netLabel: "default"}},
			DestSelector:      lacev1.ServiceSelector{Name: "backend"},
			NamespaceSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"kubernetes.io/metadata.name": "shop"}}}},
		// The nodes' sockets reach the VIP, not its endpoints (on
		// other nodes).
		lacev1.ServiceRoutingPolicy{ObjectMeta: metav1.ObjectMeta{Name: "world-to-shop-services"}, Spec: lacev1.ServiceRoutingPolicySpec{
			SrcSelector:       &metav1.LabelSelector{MatchLabels: map[string]string{netLabel: "world"}},
			DestSelector:      lacev1.ServiceSelector{Name: "backend"},
			NamespaceSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"kubernetes.io/metadata.name": "shop"}}}})
	cache := tpod("default", "cache", "node-b", nil, "10.244.2.9")
	in.Pods = append(in.Pods, cache)
	in.NetworkEndpoints = append(in.NetworkEndpoints, tnep(cache, "default"))
	in.UnderlayEndpoints = append(in.UnderlayEndpoints, tuep("node-c", "fc00:0:c::/64", "192.168.10.3", "fd00:10::3"))
	in.Nodes = []corev1.Node{tnode("node-a", "z1"), tnode("node-b", "z1"), tnode("node-c", "z2")}
	in.Nodes[2].Labels["role"] = "edge"
	in.Services = []corev1.Service{
		tsvc("default", "kubernetes", "10.96.0.1", []corev1.ServicePort{tport("https", corev1.ProtocolTCP, 443)}, bound),
		tsvc("default", "web", "10.96.0.10,fd00:96::10", http, bound, func(s *corev1.Service) {
			s.Spec.SessionAffinity = corev1.ServiceAffinityClientIP
		}),
		tsvc("default", "local", "10.96.0.11", http, bound, func(s *corev1.Service) {
			s.Spec.InternalTrafficPolicy = ptr.To(corev1.ServiceInternalTrafficPolicyLocal)
		}),
		tsvc("default", "empty", "10.96.0.12", http, bound),
		tsvc("default", "closest", "10.96.0.13", http, bound, withAnnotation(lacev1.AnnotationTrafficDistribution, model.TrafficDistributionPreferClosest)),
		tsvc("default", "hinted", "10.96.0.14", http, bound),
		tsvc("default", "draining", "10.96.0.15", http, bound),
		tsvc("default", "self", "10.96.0.16", http, bound),
		tsvc("default", "cache", "10.96.0.18", []corev1.ServicePort{tport("redis", corev1.ProtocolTCP, 6379)}, bound),
		tsvc("shop", "api", "10.96.1.20", []corev1.ServicePort{tport("pg", corev1.ProtocolTCP, 5432)}, withLabel("tier", "backend"),
			withAnnotation(lacev1.AnnotationServiceNetwork, "backend")),
		// Bound to backend, but in namespace default, which the
		// ServiceRoutingPolicy does not open; not annotated yet.
		tsvc("default", "reports", "10.96.1.21", http, withLabel("tier", "backend")),
		tsvc("vault", "kms", "10.96.2.40", []corev1.ServicePort{tport("https", corev1.ProtocolTCP, 443)}, withLabel("vault", "yes")),
		tsvc("default", "broken", "10.96.0.20", http, withLabel("net", "ghost"),
			withAnnotation(lacev1.AnnotationBindingError, "network ghost does not exist")),
		tsvc("default", "stale", "10.96.0.21", http, withAnnotation(lacev1.AnnotationServiceNetwork, "red")),
		tsvc("default", "headless", "", http, func(s *corev1.Service) { s.Spec.ClusterIP = corev1.ClusterIPNone }),
		tsvc("default", "ext", "", nil, func(s *corev1.Service) {
			s.Spec.Type, s.Spec.ExternalName = corev1.ServiceTypeExternalName, "example.com"
		}),
		tsvc("default", "other", "10.96.0.30", http, withLabel(model.LabelServiceProxyName, "someone-else")),
	}
	in.EndpointSlices = []discoveryv1.EndpointSlice{
		tslice("default", "kubernetes", "kubernetes", false, "https", 6443, tep("192.168.10.100", "")),
		tslice("default", "web", "web-v4", false, "http", 8080,
			tep("10.244.1.6", "node-a", target("default", "neighbour")),
			tep("10.244.2.7", "node-b", target("default", "server")),
			tep("10.244.2.8", "node-b", terminating),
			tep("10.244.3.9", "node-c", notReady),
			// x is in network red: left out of a service of default.
			tep("10.50.1.3", "node-a", target("a", "x"))),
		tslice("default", "web", "web-v6", true, "http", 8080,
			tep("fd00:244:0:1::6", "node-a", target("default", "neighbour")),
			tep("fd00:244:0:2::7", "node-b", target("default", "server"))),
		tslice("default", "local", "local", false, "http", 8080, tep("10.244.2.7", "node-b", target("default", "server"))),
		tslice("default", "closest", "closest", false, "http", 8080,
			tep("10.244.1.6", "node-a", target("default", "neighbour")), tep("10.244.3.5", "node-c")),
		tslice("default", "hinted", "hinted", false, "http", 8080,
			tep("10.244.1.6", "node-a", target("default", "neighbour"), forZone("z1")), tep("10.244.3.5", "node-c", forZone("z2"))),
		tslice("default", "draining", "draining", false, "http", 8080,
			tep("10.244.2.7", "node-b", target("default", "server"), terminating)),
		tslice("default", "self", "self", false, "http", 8080, tep("10.244.1.5", "node-a", target("default", "client"))),
		tslice("default", "cache", "cache", false, "redis", 6379, tep("10.244.2.9", "node-b", target("default", "cache"))),
		tslice("shop", "api", "api", false, "pg", 5432, tep("10.20.2.4", "node-b", target("shop", "db"))),
		tslice("default", "reports", "reports", false, "http", 8080, tep("10.20.2.4", "node-b", target("shop", "db"))),
		tslice("vault", "kms", "kms", false, "https", 8443, tep("10.40.1.2", "node-a", target("vault", "s1"))),
	}
	addFrontends(in, http, bound)
}

// now is when the traced cluster is looked at: node-a's and node-b's
// agents renewed their Leases a second ago, node-c's ten seconds ago.
var now = time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)

func tlease(node string, ago time.Duration) coordinationv1.Lease {
	return coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Namespace: "kube-system", Name: agentLeasePrefix + node,
		Labels: map[string]string{lacev1.LabelAgentLease: "true"}},
		Spec: coordinationv1.LeaseSpec{HolderIdentity: ptr.To(node), LeaseDurationSeconds: ptr.To(int32(2)),
			RenewTime: &metav1.MicroTime{Time: now.Add(-ago)}}}
}

// addFrontends adds the services reached from outside: front
// (LoadBalancer, Cluster, dual-stack, an external IP, source ranges),
// edge (LoadBalancer, Local, on node-b only), backoffice (a NodePort of
// backend in namespace default: no policy opens it to world), shop/admin
// (a NodePort of backend that a ServiceRoutingPolicy opens to world), dark
// (a VIP of class edge, whose only node, node-c, is dead; no NodePort),
// foreign (another implementation's LoadBalancer, no endpoints); the
// classes lab (the default) and edge, and the agents' Leases.
func addFrontends(in *TraceInput, http []corev1.ServicePort, bound svcOpt) {
	lb := func(class string, ingress ...string) svcOpt {
		return func(s *corev1.Service) {
			s.Spec.Type = corev1.ServiceTypeLoadBalancer
			if class != "" {
				s.Spec.LoadBalancerClass = ptr.To(class)
			}
			for _, a := range ingress {
				s.Status.LoadBalancer.Ingress = append(s.Status.LoadBalancer.Ingress, corev1.LoadBalancerIngress{IP: a})
			}
		}
	}
	nodePort := func(p int32) svcOpt {
		return func(s *corev1.Service) {
			if s.Spec.Type == corev1.ServiceTypeClusterIP {
				s.Spec.Type = corev1.ServiceTypeNodePort
			}
			s.Spec.Ports = slices.Clone(s.Spec.Ports)
			s.Spec.Ports[0].NodePort = p
		}
	}
	in.Services = append(in.Services,
		tsvc("default", "front", "10.96.0.40,fd00:96::40", http, bound, lb("", "192.168.20.10", "fd00:20::10"), nodePort(30080),
			func(s *corev1.Service) {
				s.Spec.ExternalTrafficPolicy = corev1.ServiceExternalTrafficPolicyCluster
				s.Spec.ExternalIPs = []string{"198.51.100.7"}
				s.Spec.LoadBalancerSourceRanges = []string{"203.0.113.0/24", "2001:db8::/32"}
			}),
		tsvc("default", "edge", "10.96.0.41", http, bound, lb("", "192.168.20.11"), nodePort(30081), func(s *corev1.Service) {
			s.Spec.ExternalTrafficPolicy = corev1.ServiceExternalTrafficPolicyLocal
			s.Spec.HealthCheckNodePort = 32081
		}),
		tsvc("default", "backoffice", "10.96.1.22", http, withLabel("tier", "backend"), nodePort(30082)),
		tsvc("shop", "admin", "10.96.1.23", []corev1.ServicePort{tport("https", corev1.ProtocolTCP, 443)}, withLabel("tier", "backend"),
			withAnnotation(lacev1.AnnotationServiceNetwork, "backend"), nodePort(30443)),
		tsvc("default", "dark", "10.96.0.42", http, bound, lb(lacev1.LoadBalancerClassPrefix+"edge", "192.168.30.5"), func(s *corev1.Service) {
			s.Spec.AllocateLoadBalancerNodePorts = ptr.To(false)
		}),
		tsvc("default", "foreign", "10.96.0.43", http, bound, lb("example.com/lb", "203.0.113.200"), nodePort(30085)),
	)
	in.EndpointSlices = append(in.EndpointSlices,
		tslice("default", "front", "front-v4", false, "http", 8080,
			tep("10.244.1.6", "node-a", target("default", "neighbour")), tep("10.244.2.7", "node-b", target("default", "server"))),
		tslice("default", "front", "front-v6", true, "http", 8080,
			tep("fd00:244:0:1::6", "node-a", target("default", "neighbour")), tep("fd00:244:0:2::7", "node-b", target("default", "server"))),
		tslice("default", "edge", "edge", false, "http", 8080, tep("10.244.2.7", "node-b", target("default", "server"))),
		tslice("default", "backoffice", "backoffice", false, "http", 8080, tep("10.20.2.4", "node-b", target("shop", "db"))),
		tslice("shop", "admin", "admin", false, "https", 8443, tep("10.20.2.4", "node-b", target("shop", "db"))),
		tslice("default", "dark", "dark", false, "http", 8080, tep("10.244.1.6", "node-a", target("default", "neighbour"))),
	)
	in.Classes = []lacev1.LoadBalancerClass{
		{ObjectMeta: metav1.ObjectMeta{Name: "lab"}, Spec: lacev1.LoadBalancerClassSpec{Default: true,
			Addresses: []lacev1.AddressRange{"192.168.20.0/24", "fd00:20::/64"}}},
		{ObjectMeta: metav1.ObjectMeta{Name: "edge"}, Spec: lacev1.LoadBalancerClassSpec{Addresses: []lacev1.AddressRange{"192.168.30.0/24"},
			NodeSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"role": "edge"}}}},
	}
	in.Leases = []coordinationv1.Lease{tlease("node-a", time.Second), tlease("node-b", time.Second), tlease("node-c", 10*time.Second)}
	in.Now = now
}

func servicesInput() ServicesInput {
	in := traceCluster()
	return ServicesInput{Networks: in.Networks, BindingPolicies: in.BindingPolicies, Namespaces: in.Namespaces, Nodes: in.Nodes,
		Services: in.Services, EndpointSlices: in.EndpointSlices, NetworkEndpoints: in.NetworkEndpoints,
		UnderlayEndpoints: in.UnderlayEndpoints, RoutingPolicies: in.RoutingPolicies, ServiceRoutingPolicies: in.ServiceRoutingPolicies,
		Classes: in.Classes, Leases: in.Leases, Now: in.Now}
}

// TestServicesGolden: lacectl services for the whole cluster, with the
// services Lace leaves alone, and for one namespace on one node.
func TestServicesGolden(t *testing.T) {
	// node-b's address is in an external network of its own, which no
	// policy opens to anything.
	partner := func(in *ServicesInput) {
		in.Networks = append(in.Networks, *tnet("partner", 9, lacev1.NetworkTypeExternal, nil, "192.168.10.2/32"))
	}
	for _, tc := range []struct {
		name, ns, node string
		all            bool
		change         func(*ServicesInput)
		want           []string
	}{
		{name: "services", want: []string{
			"default/web  network default (lace-cni.io/network)  VIPs 10.96.0.10, fd00:96::10",
			"  tcp/80 (http) on 10.96.0.10",
			"    every node: 2 of 5 endpoints eligible, one picked uniformly at random per new flow; sessionAffinity ClientIP keeps a client's pick for 10800s",
			"      10.244.2.8:8080  node-b  -                  not eligible: terminating: ready endpoints exist",
			"      10.244.3.9:8080  node-c  -                  not eligible: not ready",
			"      10.50.1.3:8080   node-a  a/x                not eligible: in another network: its pod is in red, not the service's network default (excluded)",
			"default/broken  not served: bound to no network: network ghost does not exist",
			"default/reports  network backend (NetworkBindingPolicy shop-services; not annotated by the controller yet)",
			"note: the binding policies now give network default (NetworkBindingPolicy services), where the agents serve it; the annotation is behind",
			"    nodes node-a (zone z1), node-c (zone z2): no local endpoint (internalTrafficPolicy Local): dropped (no-local-endpoints)",
			"10.244.2.7:8080  node-b  default/server  not eligible: not local (internalTrafficPolicy Local)",
			"    node node-b (zone z1): 1 of 1 endpoints eligible, every new flow goes to it",
			"    every node: no endpoints: rejected, ICMP port unreachable (no-endpoints)",
			"10.244.1.6:8080  node-a  default/neighbour  eligible: ready, on this node (PreferClosest)",
			"10.244.3.5:8080  node-c  -                  not eligible: PreferClosest: not on this node, which has ready endpoints",
			"10.244.1.6:8080  node-a  default/neighbour  eligible: ready, in zone z1 (PreferClosest)",
			"10.244.3.5:8080  node-c  -                  not eligible: PreferClosest: not in zone z1, which has ready endpoints",
			"10.244.1.6:8080  node-a  default/neighbour  eligible: ready, hinted for zone z1",
			"10.244.3.5:8080  node-c  -                  not eligible: other zone (hints: for zone z2)",
			"10.244.2.7:8080  node-b  default/server  eligible: serving, terminating: no ready endpoint is left (fallback)",
			"      192.168.10.100:6443  -  -  eligible: ready",
			"    nodes node-a (zone z1), node-b (zone z1): 1 of 2 endpoints eligible, every new flow goes to it",
			// External frontends.
			"  from outside (type LoadBalancer): admitted when the client's external network reaches the ClusterIP; externalTrafficPolicy Cluster: to any eligible endpoint, one on another node sees the entry node's address",
			"  NodePort tcp/30080 (http) to 10.96.0.40:80\n    node-a 192.168.10.1, node-b 192.168.10.2, node-c 192.168.10.3: open: classified into world by 0.0.0.0/0, which reaches 10.96.0.40 by NetworkRoutingPolicy world-to-default (world -> default); 2 endpoints eligible",
			"  NodePort tcp/30080 (http) to [fd00:96::40]:80\n    node-a fd00:10::1, node-b fd00:10::2, node-c fd00:10::3: open: classified into world by ::/0",
			"  LoadBalancer 192.168.20.10: class lab, announced by node node-b (rendezvous among 2 eligible nodes: alive)\n    tcp/80 (http) to 10.96.0.40:80: on node node-b: 2 endpoints eligible",
			"  loadBalancerSourceRanges 203.0.113.0/24, 2001:db8::/32: other clients of its LoadBalancer VIPs and external IPs (not its NodePorts) are dropped (source-range)",
			"  external IP 198.51.100.7: announced by no Lace node; served by the node the network sends it to\n    tcp/80 (http) to 10.96.0.40:80: every node: 2 endpoints eligible",
			// Local: only node-b has an endpoint, answers the health
			// check and may announce.
			"  healthCheckNodePort 32081: node-a, node-c 503 (no ready local endpoint); node-b 200 (1 ready local endpoint)",
			"    node-a 192.168.10.1, node-c 192.168.10.3: open: classified into world by 0.0.0.0/0, which reaches 10.96.0.41 by NetworkRoutingPolicy world-to-default (world -> default); no local endpoint: dropped (no-local-endpoints)",
			"    node-b 192.168.10.2: open: classified into world by 0.0.0.0/0, which reaches 10.96.0.41 by NetworkRoutingPolicy world-to-default (world -> default); local endpoints 10.244.2.7:8080",
			"  LoadBalancer 192.168.20.11: class lab, announced by node node-b (rendezvous among 1 eligible node: alive and holding a ready endpoint (externalTrafficPolicy Local))",
			// A NodePort no policy opens, and one a ServiceRoutingPolicy
			// opens.
			"    node-a 192.168.10.1, node-b 192.168.10.2, node-c 192.168.10.3: closed, dropped (frontend-closed): classified into world by 0.0.0.0/0, which does not reach 10.96.1.22: no view: no NetworkRoutingPolicy world -> backend",
			"which reaches 10.96.1.23 by ServiceRoutingPolicy world-to-shop-services (world -> the services of backend: VIPs only, not the pods); 1 endpoint eligible",
			// Nobody to announce; another implementation's VIP.
			"  NodePort: none for tcp/80 (http) (allocateLoadBalancerNodePorts false)",
			"  LoadBalancer 192.168.30.5: class edge, announced by none eligible: no node is alive and selected by class edge\n    tcp/80 (http) to 10.96.0.42:80: no node answers for it",
			"  LoadBalancer 203.0.113.200: class example.com/lb, not Lace's: announced by no Lace node\n    tcp/80 (http) to 10.96.0.43:80: every node: no endpoints: dropped (no-endpoints)",
		}},
		{name: "services-all", all: true, want: []string{
			"default/ext  not served by Lace (ExternalName)",
			"default/headless  not served by Lace (headless: clusterIP None)",
			"default/other  not served by Lace (service.kubernetes.io/service-proxy-name=someone-else: another proxy's)",
		}},
		{name: "services-shop-node-b", ns: "shop", node: "node-b", want: []string{
			"shop/api  network backend (lace-cni.io/network)  VIPs 10.96.1.20",
			"  tcp/5432 (pg) on 10.96.1.20",
			"    node node-b (zone z1): 1 of 1 endpoints eligible, every new flow goes to it",
			"  NodePort tcp/30443 (https) to 10.96.1.23:443\n    node-b 192.168.10.2: open",
		}},
		{name: "services-default-node-b-partner", ns: "default", node: "node-b", change: partner, want: []string{
			"    node-b 192.168.10.2: closed, dropped (frontend-closed): classified into partner by 192.168.10.2/32, which does not reach 10.96.0.40: no view: no NetworkRoutingPolicy partner -> default; no ServiceRoutingPolicy from partner selects the services of default (service default/front)",
			// Its IPv6 address is still world's.
			"    node-b fd00:10::2: open: classified into world by ::/0, which reaches fd00:96::40",
			// The health check is the node's, whatever the NodePorts.
			"  healthCheckNodePort 32081: node-b 200 (1 ready local endpoint)",
			// The VIPs are announced whatever the node's NodePorts.
			"  LoadBalancer 192.168.20.10: class lab, announced by node node-b",
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			in := servicesInput()
			in.Namespace, in.Node, in.All = tc.ns, tc.node, tc.all
			if tc.change != nil {
				tc.change(&in)
			}
			var out bytes.Buffer
			if err := PrintServices(&out, in); err != nil {
				t.Fatal(err)
			}
			golden(t, tc.name+".txt", out.Bytes())
			for _, w := range tc.want {
				if !strings.Contains(out.String(), w) {
					t.Errorf("no %q in\n%s", w, out.String())
				}
			}
			if !tc.all && strings.Contains(out.String(), "not served by Lace") {
				t.Errorf("left-alone services listed without --all:\n%s", out.String())
			}
			if tc.node != "" && (strings.Contains(out.String(), "node node-a") || strings.Contains(out.String(), "node-a 192.168.10.1")) {
				t.Errorf("--node %s shows other nodes:\n%s", tc.node, out.String())
			}
			// The node's tables (GateNodePorts) and the oracle agree on
			// every NodePort.
			if strings.Contains(out.String(), "the oracle") {
				t.Errorf("the oracle and the node's tables disagree:\n%s", out.String())
			}
		})
	}
}

// TestServicesAnnouncerFailover: a VIP's announcer is the rendezvous pick
// among the nodes whose agent is alive at Now; when node-b's Lease
// lapses, its VIPs move to node-a, and Local's, with no endpoint on
// another node, to nobody.
func TestServicesAnnouncerFailover(t *testing.T) {
	in := servicesInput()
	in.Namespace = "default"
	var before bytes.Buffer
	if err := PrintServices(&before, in); err != nil {
		t.Fatal(err)
	}
	vip := netip.MustParseAddr("192.168.20.10")
	if want := model.RendezvousNode(vip, []string{"node-a", "node-b"}); want != "node-b" ||
		!strings.Contains(before.String(), "LoadBalancer 192.168.20.10: class lab, announced by node node-b (rendezvous among 2 eligible nodes: alive)") {
		t.Fatalf("with node-a and node-b alive, want node-b (%s):\n%s", want, before.String())
	}
	in.Now = now.Add(2 * time.Second) // node-b's renewal, a second old at now, is 3s old: its 2s Lease lapsed
	for i := range in.Leases {
		if in.Leases[i].Name == "lace-agent-node-a" {
			in.Leases[i].Spec.RenewTime = &metav1.MicroTime{Time: in.Now.Add(-time.Second)}
		}
	}
	var after bytes.Buffer
	if err := PrintServices(&after, in); err != nil {
		t.Fatal(err)
	}
	for _, w := range []string{
		"  LoadBalancer 192.168.20.10: class lab, announced by node node-a (rendezvous among 1 eligible node: alive)\n    tcp/80 (http) to 10.96.0.40:80: on node node-a: 2 endpoints eligible",
		"  LoadBalancer fd00:20::10: class lab, announced by node node-a",
		"  LoadBalancer 192.168.20.11: class lab, announced by none eligible: no node is alive and holding a ready endpoint (externalTrafficPolicy Local)\n    tcp/80 (http) to 10.96.0.41:80: no node answers for it",
	} {
		if !strings.Contains(after.String(), w) {
			t.Errorf("node-b dead: no %q in\n%s", w, after.String())
		}
	}
}

// TestAliveAgents: alive while renewTime + leaseDurationSeconds is
// ahead; Leases without the label, the name or a renewal are no agent's;
// the holder names the node.
func TestAliveAgents(t *testing.T) {
	l := func(name, holder string, renew *time.Time, d int32, label bool) coordinationv1.Lease {
		x := coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Name: name}, Spec: coordinationv1.LeaseSpec{LeaseDurationSeconds: ptr.To(d)}}
		if label {
			x.Labels = map[string]string{lacev1.LabelAgentLease: "true"}
		}
		if holder != "" {
			x.Spec.HolderIdentity = ptr.To(holder)
		}
		if renew != nil {
			x.Spec.RenewTime = &metav1.MicroTime{Time: *renew}
		}
		return x
	}
	recent, old := now.Add(-time.Second), now.Add(-2*time.Second)
	got := aliveAgents([]coordinationv1.Lease{
		l("lace-agent-n1", "", &recent, 2, true),         // alive
		l("lace-agent-n2", "", &old, 2, true),            // expires now: dead
		l("lace-agent-n3", "n3", nil, 2, true),           // never renewed
		l("lace-agent-n4", "", &recent, 2, false),        // not labelled
		l("other-n5", "n5", &recent, 2, true),            // not an agent's name
		l("lace-agent-n6", "node-six", &recent, 2, true), // the holder names the node
	}, now)
	want := map[string]bool{"n1": true, "node-six": true}
	if !maps.Equal(got, want) {
		t.Errorf("alive %v, want %v", got, want)
	}
}

// TestServicesAgreeWithComputeServices: on every node, the endpoints shown
// eligible are exactly the backends ComputeServices gives that node, and
// each one left out has a reason other than the catch-all.
func TestServicesAgreeWithComputeServices(t *testing.T) {
	in := servicesInput()
	var out bytes.Buffer
	if err := PrintServices(&out, in); err != nil {
		t.Fatal(err)
	}
	if strings.Contains(out.String(), "not chosen by ComputeServices") {
		t.Errorf("an endpoint left out without a reason:\n%s", out.String())
	}
	e := in.env()
	for _, n := range in.Nodes {
		ns := e.node(n.Name)
		for i := range in.Services {
			svc := &in.Services[i]
			for _, sp := range svc.Spec.Ports {
				for _, vip := range serviceVIPs(svc) {
					ts := ns.byKey[svcKey{vip, protoNum(sp.Protocol), uint16(sp.Port)}]
					if ts == nil {
						continue
					}
					eligible := 0
					for _, ch := range explain(svc, *ns, ts, candidates(svc, sp, vip, in.EndpointSlices)) {
						if ch.eligible {
							eligible++
						}
					}
					if eligible != len(ts.Backends) {
						t.Errorf("%s/%s %s on %s: %d shown eligible, ComputeServices has %d backends %v",
							svc.Namespace, svc.Name, vip, n.Name, eligible, len(ts.Backends), ts.Backends)
					}
				}
			}
		}
	}
}

// TestServicesErrors: an unknown node is an error, an empty namespace a
// line saying so.
func TestServicesErrors(t *testing.T) {
	in := servicesInput()
	in.Node = "node-z"
	if err := PrintServices(&bytes.Buffer{}, in); err == nil || err.Error() != "node node-z not found" {
		t.Errorf("unknown node: %v", err)
	}
	in = servicesInput()
	in.Namespace = "nowhere"
	var out bytes.Buffer
	if err := PrintServices(&out, in); err != nil || out.String() != "no services in namespace nowhere\n" {
		t.Errorf("empty namespace: %q, %v", out.String(), err)
	}
}

// TestServicesCommand: the command reads what PrintServices needs through
// the client.
func TestServicesCommand(t *testing.T) {
	in := servicesInput()
	var objs []client.Object
	for i := range in.Networks {
		objs = append(objs, &in.Networks[i])
	}
	for i := range in.BindingPolicies {
		objs = append(objs, &in.BindingPolicies[i])
	}
	for i := range in.Namespaces {
		objs = append(objs, &in.Namespaces[i])
	}
	for i := range in.Nodes {
		objs = append(objs, &in.Nodes[i])
	}
	for i := range in.Services {
		objs = append(objs, &in.Services[i])
	}
	for i := range in.EndpointSlices {
		objs = append(objs, &in.EndpointSlices[i])
	}
	for i := range in.NetworkEndpoints {
		objs = append(objs, &in.NetworkEndpoints[i])
	}
	for i := range in.UnderlayEndpoints {
		objs = append(objs, &in.UnderlayEndpoints[i])
	}
	for i := range in.RoutingPolicies {
		objs = append(objs, &in.RoutingPolicies[i])
	}
	for i := range in.ServiceRoutingPolicies {
		objs = append(objs, &in.ServiceRoutingPolicies[i])
	}
	for i := range in.Classes {
		objs = append(objs, &in.Classes[i])
	}
	for i := range in.Leases {
		objs = append(objs, &in.Leases[i])
	}
	// A Lease of something else, which is no agent's.
	objs = append(objs, &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Namespace: "kube-system", Name: "lace-agent-node-z"},
		Spec: coordinationv1.LeaseSpec{HolderIdentity: ptr.To("node-c"), LeaseDurationSeconds: ptr.To(int32(3600)),
			RenewTime: &metav1.MicroTime{Time: now}}})
	c := fake.NewClientBuilder().WithScheme(scheme.Scheme).WithObjects(objs...).Build()
	for _, q := range []ServicesInput{{Now: now}, {All: true, Now: now}, {Namespace: "shop", Node: "node-b", Now: now}} {
		var got, want bytes.Buffer
		if err := ServicesCommand(context.Background(), c, q, &got); err != nil {
			t.Fatal(err)
		}
		pure := servicesInput()
		pure.Namespace, pure.Node, pure.All = q.Namespace, q.Node, q.All
		if err := PrintServices(&want, pure); err != nil {
			t.Fatal(err)
		}
		if got.String() != want.String() {
			t.Errorf("%+v through the client:\n%s\nwant:\n%s", q, got.String(), want.String())
		}
	}
}

// TestAgentLeases: lacectl reads the Leases the agents write (their label
// is lacev1.LabelAgentLease, shared; the name prefix is lacectl's own).
func TestAgentLeases(t *testing.T) {
	if agentLeasePrefix+"node-a" != agent.AgentLeaseName("node-a") {
		t.Errorf("lacectl reads Leases named %q, the agents write %q", agentLeasePrefix+"node-a", agent.AgentLeaseName("node-a"))
	}
}

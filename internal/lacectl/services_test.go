package lacectl

import (
	"bytes"
	"context"
	"math"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"

	lacev1 "github.com/lace-cni/lace/api/v1alpha1"
	"github.com/lace-cni/lace/internal/controller"
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
	bound := withAnnotation(annotationServiceNetwork, "default")
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
	in.Services = []corev1.Service{
		tsvc("default", "kubernetes", "10.96.0.1", []corev1.ServicePort{tport("https", corev1.ProtocolTCP, 443)}, bound),
		tsvc("default", "web", "10.96.0.10,fd00:96::10", http, bound, func(s *corev1.Service) {
			s.Spec.SessionAffinity = corev1.ServiceAffinityClientIP
		}),
		tsvc("default", "local", "10.96.0.11", http, bound, func(s *corev1.Service) {
			s.Spec.InternalTrafficPolicy = ptr.To(corev1.ServiceInternalTrafficPolicyLocal)
		}),
		tsvc("default", "empty", "10.96.0.12", http, bound),
		tsvc("default", "closest", "10.96.0.13", http, bound, withAnnotation(model.AnnotationTrafficDistribution, model.TrafficDistributionPreferClosest)),
		tsvc("default", "hinted", "10.96.0.14", http, bound),
		tsvc("default", "draining", "10.96.0.15", http, bound),
		tsvc("default", "self", "10.96.0.16", http, bound),
		tsvc("default", "cache", "10.96.0.18", []corev1.ServicePort{tport("redis", corev1.ProtocolTCP, 6379)}, bound),
		tsvc("shop", "api", "10.96.1.20", []corev1.ServicePort{tport("pg", corev1.ProtocolTCP, 5432)}, withLabel("tier", "backend"),
			withAnnotation(annotationServiceNetwork, "backend")),
		// Bound to backend, but in namespace default, which the
		// ServiceRoutingPolicy does not open; not annotated yet.
		tsvc("default", "reports", "10.96.1.21", http, withLabel("tier", "backend")),
		tsvc("vault", "kms", "10.96.2.40", []corev1.ServicePort{tport("https", corev1.ProtocolTCP, 443)}, withLabel("vault", "yes")),
		tsvc("default", "broken", "10.96.0.20", http, withLabel("net", "ghost"),
			withAnnotation(annotationBindingError, "network ghost does not exist")),
		tsvc("default", "stale", "10.96.0.21", http, withAnnotation(annotationServiceNetwork, "red")),
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
}

func servicesInput() ServicesInput {
	in := traceCluster()
	return ServicesInput{Networks: in.Networks, BindingPolicies: in.BindingPolicies, Namespaces: in.Namespaces, Nodes: in.Nodes,
		Services: in.Services, EndpointSlices: in.EndpointSlices, NetworkEndpoints: in.NetworkEndpoints}
}

// TestServicesGolden: lacectl services for the whole cluster, with the
// services Lace leaves alone, and for one namespace on one node.
func TestServicesGolden(t *testing.T) {
	for _, tc := range []struct {
		name, ns, node string
		all            bool
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
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			in := servicesInput()
			in.Namespace, in.Node, in.All = tc.ns, tc.node, tc.all
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
			if tc.node != "" && strings.Contains(out.String(), "node node-a") {
				t.Errorf("--node %s shows other nodes:\n%s", tc.node, out.String())
			}
		})
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
	for _, n := range in.Nodes {
		ns := computeNode(n.Name, nodeZone(&n), in.Networks, in.BindingPolicies, in.Namespaces, in.Services, in.EndpointSlices, in.NetworkEndpoints)
		for i := range in.Services {
			svc := &in.Services[i]
			for _, sp := range svc.Spec.Ports {
				for _, vip := range serviceVIPs(svc) {
					ts := ns.byKey[svcKey{vip, protoNum(sp.Protocol), uint16(sp.Port)}]
					if ts == nil {
						continue
					}
					eligible := 0
					for _, ch := range explain(svc, ns, ts, candidates(svc, sp, vip, in.EndpointSlices)) {
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
	c := fake.NewClientBuilder().WithScheme(scheme.Scheme).WithObjects(objs...).Build()
	for _, q := range []ServicesInput{{}, {All: true}, {Namespace: "shop", Node: "node-b"}} {
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

// TestControllerAnnotations: lacectl reads the annotations the controller
// writes.
func TestControllerAnnotations(t *testing.T) {
	if annotationServiceNetwork != controller.AnnotationServiceNetwork || annotationBindingError != controller.AnnotationBindingError {
		t.Errorf("annotations %q %q, the controller writes %q %q", annotationServiceNetwork, annotationBindingError,
			controller.AnnotationServiceNetwork, controller.AnnotationBindingError)
	}
}

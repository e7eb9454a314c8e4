package model

import (
	"fmt"
	"math/rand"
	"net/netip"
	"reflect"
	"regexp"
	"slices"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"

	lacev1 "github.com/lace-cni/lace/api/v1alpha1"
	"github.com/lace-cni/lace/internal/tables"
)

// The service fixtures: this node is n1 in zone z1; n2 is in z1 too, n3 in
// z2. Pod addresses are 10.<network ID>.<node>.x: default (1) 10.1.0.0/16,
// red (2) 10.2.0.0/16, blue (3) 10.3.0.0/16. Every case is written in IPv4
// and run again with every address moved to IPv6 (svV6).

func svNet(name string, id int32) lacev1.Network {
	return lacev1.Network{ObjectMeta: metav1.ObjectMeta{Name: name}, Status: lacev1.NetworkStatus{ID: id}}
}

func svPolicies() []lacev1.NetworkBindingPolicy {
	return []lacev1.NetworkBindingPolicy{
		policy("default", "default", CatchAllPriority, "", nil, nil),
		policy("red-svcs", "red", 10, lacev1.MatchKindService, map[string]string{"net": "red"}, nil),
		policy("blue-svcs", "blue", 10, lacev1.MatchKindService, map[string]string{"net": "blue"}, nil),
		policy("new-svcs", "new", 10, lacev1.MatchKindService, map[string]string{"net": "new"}, nil),
		policy("ghost-svcs", "ghost", 10, lacev1.MatchKindService, map[string]string{"net": "ghost"}, nil),
		policy("team-svcs", "blue", 20, lacev1.MatchKindService, nil, map[string]string{"team": "a"}),
		// A pod policy matching everything first: services ignore it.
		policy("all-pods-red", "red", 1, lacev1.MatchKindPod, nil, nil),
	}
}

func svInput() ServiceInput {
	return ServiceInput{
		Node: "n1", Zone: "z1",
		Networks:        []lacev1.Network{svNet("default", 1), svNet("red", 2), svNet("blue", 3), svNet("new", 0)},
		BindingPolicies: svPolicies(),
		Namespaces:      map[string]map[string]string{"default": nil, "team": {"team": "a"}},
	}
}

type svcOpt func(*corev1.Service)

// svService is a ClusterIP service in namespace default; ips is
// comma-separated spec.clusterIPs.
func svService(name, ips string, ports []corev1.ServicePort, opts ...svcOpt) corev1.Service {
	s := corev1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: name},
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

func svPort(name string, proto corev1.Protocol, port int32) corev1.ServicePort {
	return corev1.ServicePort{Name: name, Protocol: proto, Port: port}
}

var svHTTP = []corev1.ServicePort{svPort("http", corev1.ProtocolTCP, 80)}

func svLabel(k, v string) svcOpt {
	return func(s *corev1.Service) {
		if s.Labels == nil {
			s.Labels = map[string]string{}
		}
		s.Labels[k] = v
	}
}

func svAnnotation(k, v string) svcOpt {
	return func(s *corev1.Service) {
		if s.Annotations == nil {
			s.Annotations = map[string]string{}
		}
		s.Annotations[k] = v
	}
}

func svNamespace(ns string) svcOpt { return func(s *corev1.Service) { s.Namespace = ns } }

var svITPLocal svcOpt = func(s *corev1.Service) {
	s.Spec.InternalTrafficPolicy = ptr.To(corev1.ServiceInternalTrafficPolicyLocal)
}

func svAffinity(timeout *int32) svcOpt {
	return func(s *corev1.Service) {
		s.Spec.SessionAffinity = corev1.ServiceAffinityClientIP
		if timeout != nil {
			s.Spec.SessionAffinityConfig = &corev1.SessionAffinityConfig{ClientIP: &corev1.ClientIPConfig{TimeoutSeconds: timeout}}
		}
	}
}

// svSlice is an IPv4 EndpointSlice of service svc in namespace default.
func svSlice(svc, name string, ports []discoveryv1.EndpointPort, eps ...discoveryv1.Endpoint) discoveryv1.EndpointSlice {
	return discoveryv1.EndpointSlice{
		ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: name,
			Labels: map[string]string{discoveryv1.LabelServiceName: svc}},
		AddressType: discoveryv1.AddressTypeIPv4, Ports: ports, Endpoints: eps}
}

func svSPort(name string, proto corev1.Protocol, port int32) discoveryv1.EndpointPort {
	return discoveryv1.EndpointPort{Name: ptr.To(name), Protocol: ptr.To(proto), Port: ptr.To(port)}
}

var svHTTPSlicePorts = []discoveryv1.EndpointPort{svSPort("http", corev1.ProtocolTCP, 8080)}

// svWeb is the slice of service web (port http -> 8080) with eps.
func svWeb(eps ...discoveryv1.Endpoint) discoveryv1.EndpointSlice {
	return svSlice("web", "web-abc", svHTTPSlicePorts, eps...)
}

type epOpt func(*discoveryv1.Endpoint)

// svEp is a ready endpoint on node in zone (the zone of n1 and n2 is z1,
// of n3 z2).
func svEp(addr, node string, opts ...epOpt) discoveryv1.Endpoint {
	e := discoveryv1.Endpoint{Addresses: []string{addr}, Conditions: discoveryv1.EndpointConditions{
		Ready: ptr.To(true), Serving: ptr.To(true), Terminating: ptr.To(false)}}
	if node != "" {
		e.NodeName = ptr.To(node)
		e.Zone = ptr.To(map[string]string{"n1": "z1", "n2": "z1", "n3": "z2"}[node])
	}
	for _, o := range opts {
		o(&e)
	}
	return e
}

var (
	notReady epOpt = func(e *discoveryv1.Endpoint) { e.Conditions.Ready, e.Conditions.Serving = ptr.To(false), ptr.To(false) }
	// terminating: serving while it shuts down (ready is false then).
	terminating epOpt = func(e *discoveryv1.Endpoint) {
		e.Conditions = discoveryv1.EndpointConditions{Ready: ptr.To(false), Serving: ptr.To(true), Terminating: ptr.To(true)}
	}
	terminatingNotServing epOpt = func(e *discoveryv1.Endpoint) {
		e.Conditions = discoveryv1.EndpointConditions{Ready: ptr.To(false), Serving: ptr.To(false), Terminating: ptr.To(true)}
	}
	conditionsUnset epOpt = func(e *discoveryv1.Endpoint) { e.Conditions = discoveryv1.EndpointConditions{} }
)

func forZones(zones ...string) epOpt {
	return func(e *discoveryv1.Endpoint) {
		if e.Hints == nil {
			e.Hints = &discoveryv1.EndpointHints{}
		}
		for _, z := range zones {
			e.Hints.ForZones = append(e.Hints.ForZones, discoveryv1.ForZone{Name: z})
		}
	}
}

func forNodes(nodes ...string) epOpt {
	return func(e *discoveryv1.Endpoint) {
		if e.Hints == nil {
			e.Hints = &discoveryv1.EndpointHints{}
		}
		for _, n := range nodes {
			e.Hints.ForNodes = append(e.Hints.ForNodes, discoveryv1.ForNode{Name: n})
		}
	}
}

func targetPod(name, uid string) epOpt {
	return func(e *discoveryv1.Endpoint) {
		e.TargetRef = &corev1.ObjectReference{Kind: "Pod", Namespace: "default", Name: name, UID: types.UID(uid)}
	}
}

// svNE is the NetworkEndpoint of pod default/pod, as the agent writes it.
func svNE(pod, network, node, uid string, addrs ...string) lacev1.NetworkEndpoint {
	ne := lacev1.NetworkEndpoint{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: pod,
		Labels: map[string]string{lacev1.LabelPodUID: uid, lacev1.LabelNetwork: network}},
		Spec: lacev1.NetworkEndpointSpec{Network: network, Node: node}}
	for _, a := range addrs {
		ne.Spec.Addresses = append(ne.Spec.Addresses, lacev1.IPAddress(a))
	}
	return ne
}

// svV6 moves an IPv4 address into fd00::/96 (order preserved); anything
// else is returned as is.
func svV6(s string) string {
	a, ok := parseSloppyIP(s)
	if !ok || !a.Is4() {
		return s
	}
	b := a.As4()
	return netip.AddrFrom16([16]byte{0: 0xfd, 12: b[0], 13: b[1], 14: b[2], 15: b[3]}).String()
}

// svToV6 is in with every IPv4 address moved to IPv6.
func svToV6(in ServiceInput) ServiceInput {
	out := in
	out.Services = nil
	for _, s := range in.Services {
		s = *s.DeepCopy()
		s.Spec.ClusterIP = svV6(s.Spec.ClusterIP)
		for i := range s.Spec.ClusterIPs {
			s.Spec.ClusterIPs[i] = svV6(s.Spec.ClusterIPs[i])
		}
		for i, f := range s.Spec.IPFamilies {
			if f == corev1.IPv4Protocol {
				s.Spec.IPFamilies[i] = corev1.IPv6Protocol
			}
		}
		out.Services = append(out.Services, s)
	}
	out.EndpointSlices = nil
	for _, sl := range in.EndpointSlices {
		sl = *sl.DeepCopy()
		if sl.AddressType == discoveryv1.AddressTypeIPv4 {
			sl.AddressType = discoveryv1.AddressTypeIPv6
		}
		for i := range sl.Endpoints {
			for j, a := range sl.Endpoints[i].Addresses {
				sl.Endpoints[i].Addresses[j] = svV6(a)
			}
		}
		out.EndpointSlices = append(out.EndpointSlices, sl)
	}
	out.NetworkEndpoints = nil
	for _, ne := range in.NetworkEndpoints {
		ne = *ne.DeepCopy()
		for i, a := range ne.Spec.Addresses {
			ne.Spec.Addresses[i] = lacev1.IPAddress(svV6(string(a)))
		}
		out.NetworkEndpoints = append(out.NetworkEndpoints, ne)
	}
	return out
}

var svIPv4Re = regexp.MustCompile(`\b(\d{1,3}(?:\.\d{1,3}){3})(:\d+)?\b`)

// svWantV6 moves the addresses of expected strings to IPv6.
func svWantV6(want []string) []string {
	var out []string
	for _, w := range want {
		out = append(out, svIPv4Re.ReplaceAllStringFunc(w, func(m string) string {
			g := svIPv4Re.FindStringSubmatch(m)
			if g[2] != "" {
				return "[" + svV6(g[1]) + "]" + g[2]
			}
			return svV6(g[1])
		}))
	}
	return out
}

func svRender(st ServiceState) (svcs, bound, excluded []string) {
	protos := map[uint8]string{6: "tcp", 17: "udp", 132: "sctp"}
	for _, s := range st.Services {
		var b strings.Builder
		fmt.Fprintf(&b, "%s %s/%d net%d", s.VIP, protos[s.Proto], s.Port, s.NetID)
		for _, be := range s.Backends {
			fmt.Fprintf(&b, " %s", netip.AddrPortFrom(be.Addr, be.Port))
		}
		if len(s.Backends) == 0 {
			b.WriteString(" none")
		}
		if s.Drop {
			b.WriteString(" drop")
		}
		if s.AffinitySeconds != 0 {
			fmt.Fprintf(&b, " affinity=%d", s.AffinitySeconds)
		}
		svcs = append(svcs, b.String())
	}
	for _, b := range st.Bound {
		if b.Err != "" {
			bound = append(bound, fmt.Sprintf("%s/%s error: %s", b.Namespace, b.Name, b.Err))
		} else {
			bound = append(bound, fmt.Sprintf("%s/%s %s(%d) by %s", b.Namespace, b.Name, b.Network, b.NetID, b.Policy))
		}
	}
	for _, e := range st.Excluded {
		if e.Refused != "" {
			excluded = append(excluded, fmt.Sprintf("%s/%s %s refused: %s", e.Namespace, e.Service, e.Addr, e.Refused))
			continue
		}
		excluded = append(excluded, fmt.Sprintf("%s/%s %s in %s, not %s", e.Namespace, e.Service, e.Addr, e.Network, e.ServiceNetwork))
	}
	return
}

type svcCase struct {
	name     string
	svcs     []corev1.Service
	slices   []discoveryv1.EndpointSlice
	neps     []lacev1.NetworkEndpoint
	mod      func(*ServiceInput)
	want     []string // rendered Services
	bound    []string // rendered Bound; nil: not checked
	excluded []string // rendered Excluded
}

func (c svcCase) input() ServiceInput {
	in := svInput()
	in.Services, in.EndpointSlices, in.NetworkEndpoints = c.svcs, c.slices, c.neps
	if c.mod != nil {
		c.mod(&in)
	}
	return in
}

func svcCases() []svcCase {
	web := func(opts ...svcOpt) []corev1.Service {
		return []corev1.Service{svService("web", "10.96.0.10", svHTTP, opts...)}
	}
	// Three ready endpoints, one per node, of the default network's pods.
	three := func(o1, o2, o3 []epOpt) []discoveryv1.EndpointSlice {
		return []discoveryv1.EndpointSlice{svWeb(svEp("10.1.1.5", "n1", o1...), svEp("10.1.2.5", "n2", o2...), svEp("10.1.3.5", "n3", o3...))}
	}
	all3 := []string{"10.96.0.10 tcp/80 net1 10.1.1.5:8080 10.1.2.5:8080 10.1.3.5:8080"}
	ops := func(o ...epOpt) []epOpt { return o }
	return []svcCase{
		// Services left alone: not served, not bound.
		{name: "skip ExternalName", svcs: web(func(s *corev1.Service) { s.Spec.Type = corev1.ServiceTypeExternalName }),
			slices: three(nil, nil, nil), bound: []string{}},
		{name: "skip headless None", svcs: []corev1.Service{svService("web", "None", svHTTP)},
			slices: three(nil, nil, nil), bound: []string{}},
		{name: "skip headless without ClusterIP", svcs: []corev1.Service{svService("web", "", svHTTP)},
			slices: three(nil, nil, nil), bound: []string{}},
		{name: "skip service-proxy-name label", svcs: web(svLabel(LabelServiceProxyName, "other-proxy")),
			slices: three(nil, nil, nil), bound: []string{}},
		{name: "skip service-proxy-name label with empty value", svcs: web(svLabel(LabelServiceProxyName, "")),
			slices: three(nil, nil, nil), bound: []string{}},
		{name: "skip headless label on a service with a ClusterIP", svcs: web(svLabel(corev1.IsHeadlessService, "")),
			slices: three(nil, nil, nil), bound: []string{}},
		{name: "skip unparseable ClusterIP", svcs: []corev1.Service{svService("web", "10.96.0.10,bogus", svHTTP)},
			slices: three(nil, nil, nil), bound: []string{}},
		{name: "clusterIP without clusterIPs (old object)",
			svcs:   web(func(s *corev1.Service) { s.Spec.ClusterIPs = nil }),
			slices: three(nil, nil, nil), want: all3},
		{name: "ClusterIP with leading zeros parsed as kube-proxy does",
			svcs:   []corev1.Service{svService("web", "10.96.0.010", svHTTP)},
			slices: three(nil, nil, nil), want: all3},
		{name: "slice with service-proxy-name label ignored", svcs: web(),
			slices: func() []discoveryv1.EndpointSlice {
				s := three(nil, nil, nil)
				s[0].Labels[LabelServiceProxyName] = "other-proxy"
				return s
			}(),
			want: []string{"10.96.0.10 tcp/80 net1 none"}},

		// Binding.
		{name: "bound by catch-all, pod policies ignored", svcs: web(), slices: three(nil, nil, nil),
			want: all3, bound: []string{"default/web default(1) by default"}},
		{name: "bound by service label", svcs: web(svLabel("net", "red")),
			slices: []discoveryv1.EndpointSlice{svWeb(svEp("10.2.1.5", "n1"))},
			neps:   []lacev1.NetworkEndpoint{svNE("web-1", "red", "n1", "u1", "10.2.1.5")},
			want:   []string{"10.96.0.10 tcp/80 net2 10.2.1.5:8080"}, bound: []string{"default/web red(2) by red-svcs"}},
		{name: "bound by namespace selector",
			svcs: []corev1.Service{svService("web", "10.96.0.10", svHTTP, svNamespace("team"))},
			slices: func() []discoveryv1.EndpointSlice {
				s := svWeb(svEp("10.3.1.5", "n1"))
				s.Namespace = "team"
				return []discoveryv1.EndpointSlice{s}
			}(),
			want: []string{"10.96.0.10 tcp/80 net3 10.3.1.5:8080"}, bound: []string{"team/web blue(3) by team-svcs"}},
		{name: "no policy matches", svcs: web(), slices: three(nil, nil, nil),
			mod:   func(in *ServiceInput) { in.BindingPolicies = in.BindingPolicies[1:] },
			bound: []string{"default/web error: no NetworkBindingPolicy matches service default/web"}},
		{name: "network without ID", svcs: web(svLabel("net", "new")), slices: three(nil, nil, nil),
			bound: []string{"default/web error: network new has no ID yet"}},
		{name: "network does not exist", svcs: web(svLabel("net", "ghost")), slices: three(nil, nil, nil),
			bound: []string{"default/web error: network ghost does not exist"}},

		// Ports: by name and protocol; the backend port is the slice's.
		{name: "two named ports",
			svcs: []corev1.Service{svService("web", "10.96.0.10",
				[]corev1.ServicePort{svPort("http", corev1.ProtocolTCP, 80), svPort("metrics", corev1.ProtocolTCP, 9090)})},
			slices: []discoveryv1.EndpointSlice{svSlice("web", "web-abc",
				[]discoveryv1.EndpointPort{svSPort("metrics", corev1.ProtocolTCP, 9100), svSPort("http", corev1.ProtocolTCP, 8080)},
				svEp("10.1.1.5", "n1"))},
			want: []string{"10.96.0.10 tcp/80 net1 10.1.1.5:8080", "10.96.0.10 tcp/9090 net1 10.1.1.5:9100"}},
		{name: "unnamed port matches the unnamed slice port",
			svcs: []corev1.Service{svService("web", "10.96.0.10", []corev1.ServicePort{svPort("", corev1.ProtocolTCP, 80)})},
			slices: []discoveryv1.EndpointSlice{
				svSlice("web", "web-a", []discoveryv1.EndpointPort{svSPort("", corev1.ProtocolTCP, 8080)}, svEp("10.1.1.5", "n1")),
				svSlice("web", "web-b", svHTTPSlicePorts, svEp("10.1.2.5", "n2"))},
			want: []string{"10.96.0.10 tcp/80 net1 10.1.1.5:8080"}},
		{name: "unnamed port does not match a named slice port",
			svcs:   []corev1.Service{svService("web", "10.96.0.10", []corev1.ServicePort{svPort("", corev1.ProtocolTCP, 80)})},
			slices: three(nil, nil, nil),
			want:   []string{"10.96.0.10 tcp/80 net1 none"}},
		{name: "same port on TCP and UDP",
			svcs: []corev1.Service{svService("dns", "10.96.0.53",
				[]corev1.ServicePort{svPort("dns", corev1.ProtocolUDP, 53), svPort("dns-tcp", corev1.ProtocolTCP, 53)})},
			slices: []discoveryv1.EndpointSlice{svSlice("dns", "dns-abc",
				[]discoveryv1.EndpointPort{svSPort("dns", corev1.ProtocolUDP, 5353), svSPort("dns-tcp", corev1.ProtocolTCP, 5354)},
				svEp("10.1.1.53", "n1"))},
			want: []string{"10.96.0.53 tcp/53 net1 10.1.1.53:5354", "10.96.0.53 udp/53 net1 10.1.1.53:5353"}},
		{name: "SCTP port",
			svcs: []corev1.Service{svService("web", "10.96.0.10", []corev1.ServicePort{svPort("assoc", corev1.ProtocolSCTP, 3868)})},
			slices: []discoveryv1.EndpointSlice{svSlice("web", "web-abc",
				[]discoveryv1.EndpointPort{svSPort("assoc", corev1.ProtocolSCTP, 3869)}, svEp("10.1.1.5", "n1"))},
			want: []string{"10.96.0.10 sctp/3868 net1 10.1.1.5:3869"}},
		{name: "protocol unset means TCP",
			svcs: []corev1.Service{svService("web", "10.96.0.10", []corev1.ServicePort{svPort("http", "", 80)})},
			slices: []discoveryv1.EndpointSlice{svSlice("web", "web-abc",
				[]discoveryv1.EndpointPort{{Name: ptr.To("http"), Port: ptr.To[int32](8080)}}, svEp("10.1.1.5", "n1"))},
			want: []string{"10.96.0.10 tcp/80 net1 10.1.1.5:8080"}},
		{name: "slice port of another protocol not matched", svcs: web(),
			slices: []discoveryv1.EndpointSlice{svSlice("web", "web-abc",
				[]discoveryv1.EndpointPort{svSPort("http", corev1.ProtocolUDP, 8080)}, svEp("10.1.1.5", "n1"))},
			want: []string{"10.96.0.10 tcp/80 net1 none"}},
		{name: "slice ports without name or port ignored",
			svcs: []corev1.Service{svService("web", "10.96.0.10", []corev1.ServicePort{svPort("", corev1.ProtocolTCP, 80)})},
			slices: []discoveryv1.EndpointSlice{svSlice("web", "web-abc",
				[]discoveryv1.EndpointPort{{Port: ptr.To[int32](8080)}, {Name: ptr.To("")}, svSPort("", corev1.ProtocolTCP, 0)},
				svEp("10.1.1.5", "n1"))},
			want: []string{"10.96.0.10 tcp/80 net1 none"}},
		{name: "endpoints deduplicated across slices", svcs: web(),
			slices: []discoveryv1.EndpointSlice{
				svSlice("web", "web-a", svHTTPSlicePorts, svEp("10.1.1.5", "n1"), svEp("10.1.2.5", "n2")),
				svSlice("web", "web-b", svHTTPSlicePorts, svEp("10.1.2.5", "n2"), svEp("10.1.3.5", "n3"))},
			want: all3},
		{name: "duplicate address: the copy on this node wins", svcs: web(),
			slices: []discoveryv1.EndpointSlice{
				svSlice("web", "web-a", svHTTPSlicePorts, svEp("10.1.1.5", "n2", notReady)),
				svSlice("web", "web-b", svHTTPSlicePorts, svEp("10.1.1.5", "n1"))},
			want: []string{"10.96.0.10 tcp/80 net1 10.1.1.5:8080"}},
		{name: "duplicate address: otherwise the first slice by name wins", svcs: web(),
			slices: []discoveryv1.EndpointSlice{
				svSlice("web", "web-b", svHTTPSlicePorts, svEp("10.1.2.5", "n2")),
				svSlice("web", "web-a", svHTTPSlicePorts, svEp("10.1.2.5", "n3", notReady))},
			want: []string{"10.96.0.10 tcp/80 net1 none"}},
		{name: "slice with headless label ignored", svcs: web(),
			slices: func() []discoveryv1.EndpointSlice {
				s := three(nil, nil, nil)
				s[0].Labels[corev1.IsHeadlessService] = ""
				return s
			}(),
			want: []string{"10.96.0.10 tcp/80 net1 none"}},
		{name: "slices of other services and namespaces ignored", svcs: web(),
			slices: func() []discoveryv1.EndpointSlice {
				other := svSlice("api", "api-abc", svHTTPSlicePorts, svEp("10.1.1.6", "n1"))
				team := svSlice("web", "web-team", svHTTPSlicePorts, svEp("10.1.1.7", "n1"))
				team.Namespace = "team"
				unlabelled := svSlice("web", "web-x", svHTTPSlicePorts, svEp("10.1.1.8", "n1"))
				unlabelled.Labels = nil
				return []discoveryv1.EndpointSlice{other, team, unlabelled, svWeb(svEp("10.1.1.5", "n1"))}
			}(),
			want: []string{"10.96.0.10 tcp/80 net1 10.1.1.5:8080"}},

		// Readiness and the terminating fallback.
		{name: "not ready left out", svcs: web(), slices: three(nil, ops(notReady), nil),
			want: []string{"10.96.0.10 tcp/80 net1 10.1.1.5:8080 10.1.3.5:8080"}},
		{name: "ready unset counts as ready", svcs: web(), slices: three(ops(conditionsUnset), ops(notReady), ops(notReady)),
			want: []string{"10.96.0.10 tcp/80 net1 10.1.1.5:8080"}},
		{name: "serving terminating used when none is ready", svcs: web(),
			slices: three(ops(notReady), ops(terminating), ops(terminating)),
			want:   []string{"10.96.0.10 tcp/80 net1 10.1.2.5:8080 10.1.3.5:8080"}},
		{name: "serving terminating not used while one is ready", svcs: web(),
			slices: three(ops(terminating), nil, ops(terminating)),
			want:   []string{"10.96.0.10 tcp/80 net1 10.1.2.5:8080"}},
		{name: "terminating not serving never used", svcs: web(),
			slices: three(ops(terminatingNotServing), ops(notReady), ops(terminatingNotServing)),
			want:   []string{"10.96.0.10 tcp/80 net1 none"}},
		{name: "no endpoints at all rejects", svcs: web(),
			want: []string{"10.96.0.10 tcp/80 net1 none"}},
		{name: "empty slice rejects", svcs: web(), slices: []discoveryv1.EndpointSlice{svWeb()},
			want: []string{"10.96.0.10 tcp/80 net1 none"}},

		// internalTrafficPolicy Local.
		{name: "ITP Local: local endpoints only", svcs: web(svITPLocal), slices: three(nil, nil, nil),
			want: []string{"10.96.0.10 tcp/80 net1 10.1.1.5:8080"}},
		{name: "ITP Local: none here drops", svcs: web(svITPLocal), slices: three(ops(notReady), nil, nil),
			want: []string{"10.96.0.10 tcp/80 net1 none drop"}},
		{name: "ITP Local: local serving terminating when no local ready", svcs: web(svITPLocal),
			slices: three(ops(terminating), nil, nil),
			want:   []string{"10.96.0.10 tcp/80 net1 10.1.1.5:8080"}},
		{name: "ITP Local: no usable endpoint anywhere rejects", svcs: web(svITPLocal),
			slices: three(ops(notReady), ops(notReady), ops(terminatingNotServing)),
			want:   []string{"10.96.0.10 tcp/80 net1 none"}},
		{name: "ITP Local: hints do not apply", svcs: web(svITPLocal),
			slices: three(ops(forZones("z2")), ops(forZones("z2")), ops(forZones("z2"))),
			want:   []string{"10.96.0.10 tcp/80 net1 10.1.1.5:8080"}},

		// Topology hints, as kube-proxy's CategorizeEndpoints.
		{name: "forZones: this zone's endpoints", svcs: web(),
			slices: three(ops(forZones("z1")), ops(forZones("z1")), ops(forZones("z2"))),
			want:   []string{"10.96.0.10 tcp/80 net1 10.1.1.5:8080 10.1.2.5:8080"}},
		{name: "forZones: endpoint hinted to several zones", svcs: web(),
			slices: three(ops(forZones("z2")), ops(forZones("z2")), ops(forZones("z2", "z1"))),
			want:   []string{"10.96.0.10 tcp/80 net1 10.1.3.5:8080"}},
		{name: "forZones: none for this zone falls back to all", svcs: web(),
			slices: three(ops(forZones("z2")), ops(forZones("z2")), ops(forZones("z2"))),
			want:   all3},
		{name: "forZones: a ready endpoint without hints disables them", svcs: web(),
			slices: three(ops(forZones("z1")), ops(forZones("z1")), nil),
			want:   all3},
		{name: "forZones: hints of not-ready endpoints do not matter", svcs: web(),
			slices: three(ops(forZones("z1")), ops(forZones("z2")), ops(notReady)),
			want:   []string{"10.96.0.10 tcp/80 net1 10.1.1.5:8080"}},
		{name: "forZones: node without zone uses all", svcs: web(),
			slices: three(ops(forZones("z1")), ops(forZones("z1")), ops(forZones("z2"))),
			mod:    func(in *ServiceInput) { in.Zone = "" },
			want:   all3},
		{name: "forNodes: this node's endpoints first", svcs: web(),
			slices: three(ops(forNodes("n1"), forZones("z1")), ops(forNodes("n2"), forZones("z1")), ops(forNodes("n3"), forZones("z2"))),
			want:   []string{"10.96.0.10 tcp/80 net1 10.1.1.5:8080"}},
		{name: "forNodes: none for this node falls to forZones", svcs: web(),
			slices: three(ops(notReady), ops(forNodes("n2"), forZones("z1")), ops(forNodes("n3"), forZones("z2"))),
			want:   []string{"10.96.0.10 tcp/80 net1 10.1.2.5:8080"}},
		{name: "forNodes: none for this node nor zone falls back to all", svcs: web(),
			slices: three(ops(notReady), ops(forNodes("n2")), ops(forNodes("n3"))),
			want:   []string{"10.96.0.10 tcp/80 net1 10.1.2.5:8080 10.1.3.5:8080"}},
		{name: "terminating fallback ignores hints", svcs: web(),
			slices: three(ops(notReady), ops(terminating, forZones("z1")), ops(terminating, forZones("z2"))),
			mod:    func(in *ServiceInput) { in.Zone = "z2" },
			want:   []string{"10.96.0.10 tcp/80 net1 10.1.2.5:8080 10.1.3.5:8080"}},
		{name: "topology-mode annotation without hints: all",
			svcs: web(svAnnotation(corev1.AnnotationTopologyMode, "Auto"),
				func(s *corev1.Service) {
					s.Spec.TrafficDistribution = ptr.To(corev1.ServiceTrafficDistributionPreferClose)
				}),
			slices: three(nil, nil, nil), want: all3},
		{name: "hints used even with topology-mode Disabled",
			svcs:   web(svAnnotation(corev1.AnnotationTopologyMode, "Disabled")),
			slices: three(ops(forZones("z1")), ops(forZones("z1")), ops(forZones("z2"))),
			want:   []string{"10.96.0.10 tcp/80 net1 10.1.1.5:8080 10.1.2.5:8080"}},

		// Lace's PreferClosest: node, zone, cluster tiers of ready endpoints.
		{name: "PreferClosest: node tier", svcs: web(svAnnotation(lacev1.AnnotationTrafficDistribution, TrafficDistributionPreferClosest)),
			slices: three(nil, nil, nil), want: []string{"10.96.0.10 tcp/80 net1 10.1.1.5:8080"}},
		{name: "PreferClosest: zone tier", svcs: web(svAnnotation(lacev1.AnnotationTrafficDistribution, TrafficDistributionPreferClosest)),
			slices: three(ops(notReady), nil, nil), want: []string{"10.96.0.10 tcp/80 net1 10.1.2.5:8080"}},
		{name: "PreferClosest: cluster tier", svcs: web(svAnnotation(lacev1.AnnotationTrafficDistribution, TrafficDistributionPreferClosest)),
			slices: three(ops(terminating), ops(notReady), nil), want: []string{"10.96.0.10 tcp/80 net1 10.1.3.5:8080"}},
		{name: "PreferClosest: terminating fallback when none is ready",
			svcs:   web(svAnnotation(lacev1.AnnotationTrafficDistribution, TrafficDistributionPreferClosest)),
			slices: three(ops(notReady), ops(terminating), ops(terminating)),
			want:   []string{"10.96.0.10 tcp/80 net1 10.1.2.5:8080 10.1.3.5:8080"}},
		{name: "PreferClosest ignores hints", svcs: web(svAnnotation(lacev1.AnnotationTrafficDistribution, TrafficDistributionPreferClosest)),
			slices: three(ops(forZones("z2")), ops(forZones("z2")), ops(forZones("z2"))),
			want:   []string{"10.96.0.10 tcp/80 net1 10.1.1.5:8080"}},
		{name: "PreferClosest: node without zone skips the zone tier",
			svcs: web(svAnnotation(lacev1.AnnotationTrafficDistribution, TrafficDistributionPreferClosest)),
			slices: []discoveryv1.EndpointSlice{svWeb(svEp("10.1.1.5", "n1", notReady), svEp("10.1.2.5", "n2"),
				svEp("10.1.3.5", "n3"), svEp("10.1.4.5", "n4"))}, // n4 has no zone either
			mod:  func(in *ServiceInput) { in.Zone = "" },
			want: []string{"10.96.0.10 tcp/80 net1 10.1.2.5:8080 10.1.3.5:8080 10.1.4.5:8080"}},
		{name: "other traffic-distribution annotation values ignored", svcs: web(svAnnotation(lacev1.AnnotationTrafficDistribution, "Closest")),
			slices: three(nil, nil, nil), want: all3},

		// Session affinity.
		{name: "ClientIP affinity default timeout", svcs: web(svAffinity(nil)),
			slices: []discoveryv1.EndpointSlice{svWeb(svEp("10.1.1.5", "n1"))},
			want:   []string{"10.96.0.10 tcp/80 net1 10.1.1.5:8080 affinity=10800"}},
		{name: "ClientIP affinity explicit timeout", svcs: web(svAffinity(ptr.To[int32](60))),
			slices: []discoveryv1.EndpointSlice{svWeb(svEp("10.1.1.5", "n1"))},
			want:   []string{"10.96.0.10 tcp/80 net1 10.1.1.5:8080 affinity=60"}},

		// Networks of endpoints.
		{name: "endpoint of another network's pod excluded", svcs: web(svLabel("net", "red")),
			slices:   []discoveryv1.EndpointSlice{svWeb(svEp("10.2.1.5", "n1"), svEp("10.3.2.5", "n2"))},
			neps:     []lacev1.NetworkEndpoint{svNE("web-1", "red", "n1", "u1", "10.2.1.5"), svNE("other", "blue", "n2", "u2", "10.3.2.5")},
			want:     []string{"10.96.0.10 tcp/80 net2 10.2.1.5:8080"},
			excluded: []string{"default/web 10.3.2.5 in blue, not red"}},
		{name: "all endpoints in another network rejects", svcs: web(svLabel("net", "red")),
			slices:   []discoveryv1.EndpointSlice{svWeb(svEp("10.3.2.5", "n2"))},
			neps:     []lacev1.NetworkEndpoint{svNE("other", "blue", "n2", "u2", "10.3.2.5")},
			want:     []string{"10.96.0.10 tcp/80 net2 none"},
			excluded: []string{"default/web 10.3.2.5 in blue, not red"}},
		{name: "excluded once per address for every port",
			svcs: []corev1.Service{svService("web", "10.96.0.10",
				[]corev1.ServicePort{svPort("http", corev1.ProtocolTCP, 80), svPort("metrics", corev1.ProtocolTCP, 9090)}, svLabel("net", "red"))},
			slices: []discoveryv1.EndpointSlice{svSlice("web", "web-abc",
				[]discoveryv1.EndpointPort{svSPort("http", corev1.ProtocolTCP, 8080), svSPort("metrics", corev1.ProtocolTCP, 9100)},
				svEp("10.3.2.5", "n2"))},
			neps:     []lacev1.NetworkEndpoint{svNE("other", "blue", "n2", "u2", "10.3.2.5")},
			want:     []string{"10.96.0.10 tcp/80 net2 none", "10.96.0.10 tcp/9090 net2 none"},
			excluded: []string{"default/web 10.3.2.5 in blue, not red"}},
		{name: "overlapping address held in both networks kept", svcs: web(svLabel("net", "red")),
			slices: []discoveryv1.EndpointSlice{svWeb(svEp("10.9.0.5", "n1"))},
			neps:   []lacev1.NetworkEndpoint{svNE("b", "blue", "n2", "ub", "10.9.0.5"), svNE("a", "red", "n1", "ua", "10.9.0.5")},
			want:   []string{"10.96.0.10 tcp/80 net2 10.9.0.5:8080"}},
		{name: "overlapping address held only by other networks excluded", svcs: web(svLabel("net", "red")),
			slices:   []discoveryv1.EndpointSlice{svWeb(svEp("10.9.0.5", "n1"))},
			neps:     []lacev1.NetworkEndpoint{svNE("b", "blue", "n1", "ub", "10.9.0.5"), svNE("a", "default", "n1", "ua", "10.9.0.5")},
			want:     []string{"10.96.0.10 tcp/80 net2 none"},
			excluded: []string{"default/web 10.9.0.5 in blue,default, not red"}},
		{name: "overlapping address, targetRef to the pod of the service's network kept", svcs: web(svLabel("net", "red")),
			slices: []discoveryv1.EndpointSlice{svWeb(svEp("10.9.0.5", "n1", targetPod("a", "ua")))},
			neps:   []lacev1.NetworkEndpoint{svNE("b", "blue", "n2", "ub", "10.9.0.5"), svNE("a", "red", "n1", "ua", "10.9.0.5")},
			want:   []string{"10.96.0.10 tcp/80 net2 10.9.0.5:8080"}},
		{name: "overlapping address, targetRef to the pod of another network excluded", svcs: web(svLabel("net", "red")),
			slices:   []discoveryv1.EndpointSlice{svWeb(svEp("10.9.0.5", "n2", targetPod("b", "ub")))},
			neps:     []lacev1.NetworkEndpoint{svNE("b", "blue", "n2", "ub", "10.9.0.5"), svNE("a", "red", "n1", "ua", "10.9.0.5")},
			want:     []string{"10.96.0.10 tcp/80 net2 none"},
			excluded: []string{"default/web 10.9.0.5 in blue, not red"}},
		// The recreated pod's NetworkEndpoint is not written yet: the
		// address decides, and no other pod holds it on the node.
		{name: "targetRef to a recreated pod falls back to the address", svcs: web(svLabel("net", "red")),
			slices: []discoveryv1.EndpointSlice{svWeb(svEp("10.9.0.5", "n1", targetPod("b", "ub-new")))},
			neps:   []lacev1.NetworkEndpoint{svNE("b", "blue", "n2", "ub-old", "10.9.0.5"), svNE("a", "red", "n1", "ua", "10.8.0.5")},
			want:   []string{"10.96.0.10 tcp/80 net2 10.9.0.5:8080"}},
		// Another pod holds the address on the endpoint's node: traffic
		// meant for b would reach it.
		{name: "targetRef's address held by another pod is left out", svcs: web(svLabel("net", "red")),
			slices:   []discoveryv1.EndpointSlice{svWeb(svEp("10.9.0.5", "n1", targetPod("b", "ub-new")))},
			neps:     []lacev1.NetworkEndpoint{svNE("b", "blue", "n2", "ub-old", "10.9.0.5"), svNE("a", "red", "n1", "ua", "10.9.0.5")},
			want:     []string{"10.96.0.10 tcp/80 net2 none"},
			excluded: []string{"default/web 10.9.0.5 refused: the address is pod default/a's now, not the endpoint's pod's"}},
		// The endpoint's pod came back at a new address and a pod of
		// another tenant was given the old one before the EndpointSlice
		// caught up (the chaos harness's reboot): the stale endpoint is
		// left out, the pod's new address served.
		{name: "stale endpoint whose address was given to another pod is left out", svcs: web(svLabel("net", "red")),
			slices:   []discoveryv1.EndpointSlice{svWeb(svEp("10.9.0.5", "n1", targetPod("web-1", "u1")), svEp("10.9.0.6", "n1", targetPod("web-1", "u1")))},
			neps:     []lacev1.NetworkEndpoint{svNE("web-1", "red", "n1", "u1", "10.9.0.6"), svNE("churn", "red", "n1", "uc", "10.9.0.5")},
			want:     []string{"10.96.0.10 tcp/80 net2 10.9.0.6:8080"},
			excluded: []string{"default/web 10.9.0.5 refused: the address is pod default/churn's now, not the endpoint's pod's"}},
		// The pod's own record still lists the address beside another
		// pod's: the named pod's record decides. A record left behind by
		// a gone pod (its DEL raced the record's write) must not take a
		// live pod, of any namespace, out of its Services.
		{name: "endpoint whose own record holds the address is served beside a leftover one", svcs: web(svLabel("net", "red")),
			slices: []discoveryv1.EndpointSlice{svWeb(svEp("10.9.0.5", "n1", targetPod("web-1", "u1")))},
			neps:   []lacev1.NetworkEndpoint{svNE("web-1", "red", "n1", "u1", "10.9.0.5"), svNE("gone", "red", "n1", "ug", "10.9.0.5")},
			want:   []string{"10.96.0.10 tcp/80 net2 10.9.0.5:8080"}},
		// Overlapping networks: another network's pod at the same address
		// on the node is not the service network's.
		{name: "another network's pod at the endpoint's address does not count", svcs: web(svLabel("net", "red")),
			slices: []discoveryv1.EndpointSlice{svWeb(svEp("10.9.0.5", "n1", targetPod("web-1", "u1")))},
			neps:   []lacev1.NetworkEndpoint{svNE("web-1", "red", "n1", "u1", "10.9.0.5"), svNE("other", "blue", "n1", "uo", "10.9.0.5")},
			want:   []string{"10.96.0.10 tcp/80 net2 10.9.0.5:8080"}},
		{name: "non-pod endpoint kept (the kubernetes service)",
			svcs: []corev1.Service{svService("kubernetes", "10.96.0.1", []corev1.ServicePort{svPort("https", corev1.ProtocolTCP, 443)})},
			slices: []discoveryv1.EndpointSlice{svSlice("kubernetes", "kubernetes",
				[]discoveryv1.EndpointPort{svSPort("https", corev1.ProtocolTCP, 6443)}, svEp("172.30.0.1", ""))},
			neps: []lacev1.NetworkEndpoint{svNE("web-1", "red", "n1", "u1", "10.2.1.5")},
			want: []string{"10.96.0.1 tcp/443 net1 172.30.0.1:6443"}},
	}
}

func TestComputeServices(t *testing.T) {
	for _, c := range svcCases() {
		for _, fam := range []string{"IPv4", "IPv6"} {
			t.Run(c.name+"/"+fam, func(t *testing.T) {
				in, want, excluded := c.input(), c.want, c.excluded
				if fam == "IPv6" {
					in, want, excluded = svToV6(in), svWantV6(want), svWantV6(excluded)
				}
				gotSvcs, gotBound, gotExcluded := svRender(ComputeServices(in))
				if !slices.Equal(gotSvcs, want) {
					t.Errorf("services:\n got %q\nwant %q", gotSvcs, want)
				}
				if c.bound != nil && !slices.Equal(gotBound, c.bound) {
					t.Errorf("bound:\n got %q\nwant %q", gotBound, c.bound)
				}
				if !slices.Equal(gotExcluded, excluded) {
					t.Errorf("excluded:\n got %q\nwant %q", gotExcluded, excluded)
				}
			})
		}
	}
}

// TestComputeServicesDualStack: a VIP per family, each with the endpoints of
// its family's slices; FQDN slices and addresses of the other family are
// ignored.
func TestComputeServicesDualStack(t *testing.T) {
	in := svInput()
	in.Services = []corev1.Service{svService("web", "10.96.0.10,fd00:96::10", svHTTP, func(s *corev1.Service) {
		s.Spec.IPFamilies = []corev1.IPFamily{corev1.IPv4Protocol, corev1.IPv6Protocol}
	})}
	v4 := svWeb(svEp("10.1.1.5", "n1"), svEp("fd00:1:1::9", "n1"))
	v6 := svSlice("web", "web-v6", svHTTPSlicePorts, svEp("fd00:1:1::5", "n1"), svEp("10.1.1.9", "n1"))
	v6.AddressType = discoveryv1.AddressTypeIPv6
	fqdn := svSlice("web", "web-fqdn", svHTTPSlicePorts, svEp("web.example.com", "n1"), svEp("10.1.1.7", "n1"), svEp("fd00:1:1::7", "n1"))
	fqdn.AddressType = discoveryv1.AddressTypeFQDN
	in.EndpointSlices = []discoveryv1.EndpointSlice{fqdn, v6, v4}
	got, bound, _ := svRender(ComputeServices(in))
	want := []string{"10.96.0.10 tcp/80 net1 10.1.1.5:8080", "fd00:96::10 tcp/80 net1 [fd00:1:1::5]:8080"}
	if !slices.Equal(got, want) {
		t.Errorf("services:\n got %q\nwant %q", got, want)
	}
	if want := []string{"default/web default(1) by default"}; !slices.Equal(bound, want) {
		t.Errorf("bound %q, want %q (one binding for both families)", bound, want)
	}
}

// TestComputeServicesDeterministic: the output depends on the objects, not
// on the order the caches list them in.
func TestComputeServicesDeterministic(t *testing.T) {
	in := svInput()
	// Each case, in each family, in its own namespace (bound by the
	// catch-all unless the service's labels say otherwise) with its own
	// VIPs, so that no two objects share a name or a VIP.
	for i, c := range svcCases() {
		ci := c.input()
		vip := func(s string) string {
			a, ok := parseSloppyIP(s)
			if !ok || !a.Is4() {
				return s
			}
			b := a.As4()
			return netip.AddrFrom4([4]byte{b[0], b[1], byte(i), b[3]}).String()
		}
		for j := range ci.Services {
			s := ci.Services[j].DeepCopy()
			s.Spec.ClusterIP = vip(s.Spec.ClusterIP)
			for k := range s.Spec.ClusterIPs {
				s.Spec.ClusterIPs[k] = vip(s.Spec.ClusterIPs[k])
			}
			ci.Services[j] = *s
		}
		for fam, fi := range map[string]ServiceInput{"v4": ci, "v6": svToV6(ci)} {
			ns := fmt.Sprintf("case%d-%s", i, fam)
			in.Namespaces[ns] = nil
			for _, s := range fi.Services {
				s = *s.DeepCopy()
				s.Namespace = ns
				in.Services = append(in.Services, s)
			}
			for _, sl := range fi.EndpointSlices {
				sl = *sl.DeepCopy()
				sl.Namespace = ns
				for j := range sl.Endpoints {
					if r := sl.Endpoints[j].TargetRef; r != nil {
						r.Namespace = ns
					}
				}
				in.EndpointSlices = append(in.EndpointSlices, sl)
			}
			for _, ne := range fi.NetworkEndpoints {
				ne = *ne.DeepCopy()
				ne.Namespace = ns
				in.NetworkEndpoints = append(in.NetworkEndpoints, ne)
			}
		}
	}

	want := ComputeServices(in)
	if len(want.Services) < 50 || len(want.Excluded) == 0 {
		t.Fatalf("fixture too small: %d services, %d excluded", len(want.Services), len(want.Excluded))
	}
	for i := 1; i < len(want.Services); i++ {
		a, b := want.Services[i-1], want.Services[i]
		if a.VIP.Compare(b.VIP) > 0 || a.VIP == b.VIP && (a.Proto > b.Proto || a.Proto == b.Proto && a.Port >= b.Port) {
			t.Fatalf("services not sorted: %v before %v", a, b)
		}
	}
	rng := rand.New(rand.NewSource(1))
	for round := 0; round < 20; round++ {
		sh := in
		sh.Services = svShuffled(rng, in.Services)
		sh.EndpointSlices = svShuffled(rng, in.EndpointSlices)
		sh.NetworkEndpoints = svShuffled(rng, in.NetworkEndpoints)
		sh.Networks = svShuffled(rng, in.Networks)
		sh.BindingPolicies = svShuffled(rng, in.BindingPolicies)
		if got := ComputeServices(sh); !reflect.DeepEqual(got, want) {
			gs, gb, ge := svRender(got)
			ws, wb, we := svRender(want)
			t.Fatalf("round %d: output depends on input order:\n got %q\n%q\n%q\nwant %q\n%q\n%q", round, gs, gb, ge, ws, wb, we)
		}
	}
}

func svShuffled[T any](rng *rand.Rand, s []T) []T {
	out := slices.Clone(s)
	rng.Shuffle(len(out), func(i, j int) { out[i], out[j] = out[j], out[i] })
	return out
}

// Backends come out sorted by address then port whatever the slices say.
func TestComputeServicesBackendOrder(t *testing.T) {
	in := svInput()
	in.Services = []corev1.Service{svService("web", "10.96.0.10", svHTTP)}
	in.EndpointSlices = []discoveryv1.EndpointSlice{
		svSlice("web", "web-b", []discoveryv1.EndpointPort{svSPort("http", corev1.ProtocolTCP, 8081)}, svEp("10.1.1.5", "n1")),
		svWeb(svEp("10.1.10.5", "n2"), svEp("10.1.2.5", "n2"), svEp("10.1.1.5", "n1")),
	}
	got := ComputeServices(in).Services
	want := []tables.Service{{VIP: netip.MustParseAddr("10.96.0.10"), Proto: 6, Port: 80, NetID: 1, Backends: []tables.Backend{
		{Addr: netip.MustParseAddr("10.1.1.5"), Port: 8080}, {Addr: netip.MustParseAddr("10.1.1.5"), Port: 8081},
		{Addr: netip.MustParseAddr("10.1.2.5"), Port: 8080}, {Addr: netip.MustParseAddr("10.1.10.5"), Port: 8080}}}}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("got %+v\nwant %+v", got, want)
	}
}

// TestComputeServicesLingering: the endpoints of a port's slices that are
// not its backends here (not ready, terminating while one is ready, other
// nodes' under externalTrafficPolicy Local) linger, so that the data plane
// keeps their connections; the backends never do.
func TestComputeServicesLingering(t *testing.T) {
	web := svWeb(svEp("10.1.1.5", "n1"), svEp("10.1.2.5", "n2", func(e *discoveryv1.Endpoint) {
		e.Conditions.Ready, e.Conditions.Serving = ptr.To(false), ptr.To(false)
	}), svEp("10.1.3.5", "n3", func(e *discoveryv1.Endpoint) {
		e.Conditions = discoveryv1.EndpointConditions{Ready: ptr.To(false), Serving: ptr.To(true), Terminating: ptr.To(true)}
	}))
	in := svInput()
	in.NodeAddrs = []netip.Addr{netip.MustParseAddr("172.30.0.11")}
	in.Services = []corev1.Service{svService("web", "10.96.0.10", svHTTP, func(s *corev1.Service) {
		s.Spec.Type = corev1.ServiceTypeNodePort
		s.Spec.ExternalTrafficPolicy = corev1.ServiceExternalTrafficPolicyLocal
		s.Spec.Ports[0].NodePort = 30080
	})}
	in.EndpointSlices = []discoveryv1.EndpointSlice{web}
	be := func(a string) tables.Backend { return tables.Backend{Addr: netip.MustParseAddr(a), Port: 8080} }
	st := ComputeServices(in)
	if len(st.Services) != 2 {
		t.Fatalf("%d service entries, want the ClusterIP and the NodePort", len(st.Services))
	}
	for _, s := range st.Services {
		want := []tables.Backend{be("10.1.2.5"), be("10.1.3.5")}
		if !slices.Equal(s.Backends, []tables.Backend{be("10.1.1.5")}) || !slices.Equal(s.Lingering, want) {
			t.Errorf("%s:%d: backends %v lingering %v, want [10.1.1.5:8080] and %v", s.VIP, s.Port, s.Backends, s.Lingering, want)
		}
	}
	// Every endpoint a backend: nothing lingers (and nothing is kept).
	in.EndpointSlices = []discoveryv1.EndpointSlice{svWeb(svEp("10.1.1.5", "n1"))}
	for _, s := range ComputeServices(in).Services {
		if s.Lingering != nil {
			t.Errorf("%s:%d: lingering %v with every endpoint a backend", s.VIP, s.Port, s.Lingering)
		}
	}
}

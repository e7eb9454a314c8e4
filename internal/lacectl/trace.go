package lacectl

// lacectl trace: what happens to a new flow from one endpoint to another,
// and to its replies. The verdict is the reachability oracle's
// (model.Reach, docs/topology.md); this file only resolves the
// endpoints from API objects and describes the path the verdict implies.
// Through a service VIP, the endpoints a flow may be translated to are
// model.ComputeDesired's answer for the source's node (docs/services.md).

import (
	"context"
	"fmt"
	"io"
	"net/netip"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	networkingv1 "k8s.io/api/networking/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"sigs.k8s.io/controller-runtime/pkg/client"

	lacev1 "github.com/lace-cni/lace/api/v1alpha1"
	"github.com/lace-cni/lace/internal/dpmetrics"
	"github.com/lace-cni/lace/internal/model"
	"github.com/lace-cni/lace/internal/netpol"
	"github.com/lace-cni/lace/internal/tables"
)

// TraceInput is what Trace reads: the API objects, already fetched, and the
// question.
type TraceInput struct {
	Networks               []lacev1.Network
	RoutingPolicies        []lacev1.NetworkRoutingPolicy
	ServiceRoutingPolicies []lacev1.ServiceRoutingPolicy
	BindingPolicies        []lacev1.NetworkBindingPolicy
	Namespaces             []corev1.Namespace
	Pods                   []corev1.Pod
	NetworkEndpoints       []lacev1.NetworkEndpoint
	UnderlayEndpoints      []lacev1.UnderlayEndpoint
	// Services, their EndpointSlices and the Nodes (for their zones) are
	// read when Dst is a service.
	Services       []corev1.Service
	EndpointSlices []discoveryv1.EndpointSlice
	Nodes          []corev1.Node
	// The LoadBalancer classes and the agents' Leases are read when Dst
	// is a LoadBalancer VIP: its announcer is decided among the agents
	// alive at Now.
	Classes []lacev1.LoadBalancerClass
	Leases  []coordinationv1.Lease
	Now     time.Time
	// The network policies, which decide within what the topology
	// allows (trace_policy.go): with them, Pods and NetworkEndpoints are
	// every pod's, and Nodes every node (nodes peers).
	NetworkPolicies []networkingv1.NetworkPolicy
	ClusterPolicies []netpol.ClusterPolicy

	// Src and Dst are NAMESPACE/NAME, NAME (in Namespace) or an IP address.
	// A name is a pod's; Dst may also name a Service (or give one of its
	// ClusterIPs). When a pod and a Service share the name, pod:NAME or
	// svc:NAME says which.
	Src, Dst string
	// Proto is tcp/PORT, udp/PORT, sctp/PORT or icmp; empty means tcp/80,
	// or the first port of a service.
	Proto string
	// Namespace is the namespace of pods named without one; empty means
	// "default".
	Namespace string
	// IPv6 picks the pods' IPv6 addresses when both endpoints are pods.
	IPv6 bool
	// Node is where a flow from outside to an external IP, or to a
	// LoadBalancer VIP no Lace node announces, enters the cluster (the
	// network decides); empty means the first node by name.
	Node string
}

// TraceEndpoint is one side of a traced flow, resolved.
type TraceEndpoint struct {
	model.Endpoint
	// Input is what the user wrote.
	Input string
	// Pod is NAMESPACE/NAME for a pod (or a host-network pod, which is
	// its node).
	Pod string
	// NetworkFrom says how a pod's network was found: its NetworkEndpoint
	// (what the data plane did) or the binding policy decision.
	NetworkFrom string
	// InSubnetOf names the pod networks whose subnets hold an address no
	// pod holds.
	InSubnetOf []string
	// Service is NAMESPACE/NAME for a service (then Addr is its VIP and
	// Network the network it is bound to).
	Service string
	// Frontend says how Addr reaches the service from outside: a NodePort
	// on a node address, a LoadBalancer VIP or an external IP
	// (FrontendClusterIP: Addr is a ClusterIP).
	Frontend tables.Frontend
}

// TraceResult is Trace's answer.
type TraceResult struct {
	Src, Dst TraceEndpoint
	Proto    string
	Port     uint16
	// Verdict is the oracle's answer for the new flow, Reply for its
	// replies, Reverse for a new flow from Dst to Src.
	Verdict, Reply, Reverse model.Verdict
	// Path describes what the data plane does with the flow when it is
	// allowed; Dropped where and under which counter when it is not.
	Path    string
	Dropped string
	// Service is set when Dst is a service.
	Service *TraceService
	// Policy is what the network policies decide on a flow the topology
	// allows between a pod and a pod or an outside address; nil when the
	// cluster has none.
	Policy *TracePolicy
}

// TraceService is what a flow to a service VIP meets on the source's node,
// where it is translated (docs/services.md): model.ComputeDesired for that node.
type TraceService struct {
	Namespace, Name string
	// Network is the network the service is bound to, in which its
	// endpoints are reached; NetworkFrom the binding policy that bound it.
	Network, NetworkFrom string
	// Port is the service port asked for (proto/port (name)); Served says
	// whether the service serves it on the VIP, Ports lists those it does.
	Port   string
	Served bool
	Ports  []string
	// Node is where the flow is translated: the source's node.
	Node string
	// Translated: an admitted flow is translated to an endpoint it can
	// reach (else it is rejected or dropped, and Path says where).
	Translated bool
	// Endpoints are the ones eligible on Node; a new flow picks one
	// uniformly at random. NotEligible counts the others.
	Endpoints   []TraceBackend
	NotEligible int
	// Drop: no endpoint is eligible on Node while some exist elsewhere
	// (internalTrafficPolicy Local): dropped, not rejected.
	Drop            bool
	AffinitySeconds uint32

	// Frontend is the external frontend a flow from outside is addressed
	// to (FrontendClusterIP for a flow to the VIP itself); then Node is
	// where it enters the cluster ("" for a VIP nobody announces) and
	// Entry says why, ClusterIP is what the frontend admits clients as,
	// and Local is externalTrafficPolicy Local. Admitted: the client's
	// view holds the ClusterIP.
	Frontend  tables.Frontend
	Entry     string
	ClusterIP netip.AddrPort
	Local     bool
	Admitted  bool
}

// TraceBackend is one endpoint a flow may be translated to.
type TraceBackend struct {
	Addr netip.AddrPort
	// Pod is NAMESPACE/NAME when known (the EndpointSlice's targetRef or
	// a NetworkEndpoint), Node where the endpoint is.
	Pod, Node string
	// Path says how the translated packet reaches it, or where it is
	// dropped (Dropped).
	Path    string
	Dropped bool
}

// Trace resolves the two endpoints of in and asks the oracle about the flow
// between them. Errors are about the question (an unknown pod, an address
// several pods hold, a malformed protocol), never about the verdict.
func Trace(in TraceInput) (TraceResult, error) {
	var r TraceResult
	var err error
	if r.Proto, r.Port, err = parseProto(in.Proto); err != nil {
		return r, err
	}
	ns := in.Namespace
	if ns == "" {
		ns = "default"
	}
	src, err := parseEndpoint(in, in.Src, ns, false)
	if err != nil {
		return r, err
	}
	dst, err := parseEndpoint(in, in.Dst, ns, true)
	if err != nil {
		return r, err
	}
	if dst.Kind == model.EndpointService {
		if in.Node != "" {
			return r, fmt.Errorf("--node %s: a flow to a ClusterIP is translated on the source's node", in.Node)
		}
		return traceService(in, r, src, dst)
	}
	// An external frontend: a VIP or external IP, or a NodePort on a
	// node's address.
	nodePort := dst.Kind == model.EndpointNode && in.Proto != "" &&
		len(frontendServices(in.Services, dst.Addr, true, r.Proto, r.Port)) > 0
	if dst.frontend || nodePort {
		if src.Kind != model.EndpointOutside {
			what := "a LoadBalancer VIP or external IP"
			if nodePort {
				what = "a NodePort on node " + dst.NodeName + "'s address"
			}
			return r, fmt.Errorf("%s %s is %s of service %s: lacectl trace follows flows to external frontends from outside addresses; a pod or a node is admitted to one as to the service's ClusterIP: trace %s svc:NAMESPACE/NAME",
				dst.Addr, r.ProtoString(), what, serviceNames(frontendServices(in.Services, dst.Addr, nodePort, r.Proto, r.Port)), in.Src)
		}
		return traceFrontend(in, r, src, dst)
	}
	if in.Node != "" {
		return r, fmt.Errorf("--node %s: only a flow from outside to an external frontend has a node to choose where it enters", in.Node)
	}
	if src.Kind != model.EndpointPod && dst.Kind != model.EndpointPod {
		hint := ""
		switch {
		case dst.Kind == model.EndpointNode && in.Proto == "":
			hint = "; give a NodePort as PROTO/PORT to trace it"
		case dst.Kind == model.EndpointNode:
			hint = fmt.Sprintf("; %s is no service's NodePort", r.ProtoString())
		}
		return r, fmt.Errorf("neither %s nor %s is a pod: lacectl trace answers for flows from or to pods (a node never carries traffic between outside addresses)%s", in.Src, in.Dst, hint)
	}

	// The address family: an address side decides; two pods use IPv4
	// unless --ipv6.
	v6 := in.IPv6
	switch {
	case src.addrGiven && dst.addrGiven:
		if src.Addr.Is4() != dst.Addr.Is4() {
			return r, fmt.Errorf("%s and %s are of different address families", src.Addr, dst.Addr)
		}
		v6 = src.Addr.Is6()
	case src.addrGiven:
		v6 = src.Addr.Is6()
	case dst.addrGiven:
		v6 = dst.Addr.Is6()
	}
	for _, e := range []*endpointRef{&src, &dst} {
		if e.addrGiven {
			continue
		}
		a, err := podAddr(e.pod, v6)
		if err != nil {
			return r, err
		}
		e.Addr = a
	}
	r.Src, r.Dst = src.TraceEndpoint, dst.TraceEndpoint

	t := model.Topology{Networks: in.Networks, RoutingPolicies: in.RoutingPolicies, ServiceRoutingPolicies: in.ServiceRoutingPolicies}
	r.Verdict = model.Reach(t, r.Src.Endpoint, r.Dst.Endpoint, r.Proto, r.Port)
	r.Reply = model.ReachReply(t, r.Src.Endpoint, r.Dst.Endpoint, r.Proto, r.Port)
	r.Reverse = model.Reach(t, r.Dst.Endpoint, r.Src.Endpoint, r.Proto, r.Port)
	if r.Verdict.Allowed {
		r.Policy = tracePolicy(in, r)
	}
	switch {
	case r.Policy.Denied():
		r.Dropped = r.Policy.dropped(r)
	case r.Verdict.Allowed:
		r.Path = path(in, r)
	default:
		r.Dropped = dropped(r)
	}
	return r, nil
}

// endpointRef is an endpoint being resolved: the pod or service behind
// it, and whether the user gave its address.
type endpointRef struct {
	TraceEndpoint
	pod       *corev1.Pod
	svc       *corev1.Service
	addrGiven bool
	// frontend: the address is a LoadBalancer VIP or an external IP of a
	// service.
	frontend bool
}

// endpointName splits NAMESPACE/NAME, NAME, pod:... and svc:... into a
// kind ("pod", "svc" or "" for either) and a key.
func endpointName(s, ns string) (kind string, k client.ObjectKey, ok bool) {
	for _, p := range []string{"pod:", "svc:"} {
		if rest, found := strings.CutPrefix(s, p); found {
			kind, s = p[:3], rest
		}
	}
	name := s
	if i := strings.IndexByte(s, '/'); i >= 0 {
		ns, name = s[:i], s[i+1:]
	}
	if ns == "" || name == "" || strings.Contains(name, "/") {
		return kind, k, false
	}
	return kind, client.ObjectKey{Namespace: ns, Name: name}, true
}

// parseEndpoint resolves one side; services are destinations only
// (svcOK).
func parseEndpoint(in TraceInput, s, ns string, svcOK bool) (endpointRef, error) {
	e := endpointRef{TraceEndpoint: TraceEndpoint{Input: s}}
	if a, err := netip.ParseAddr(s); err == nil {
		return resolveAddr(in, e, a.Unmap(), svcOK)
	}
	if s == "" {
		return e, fmt.Errorf("empty endpoint: give NAMESPACE/POD, POD or an IP address")
	}
	kind, k, ok := endpointName(s, ns)
	if !ok {
		return e, fmt.Errorf("endpoint %q: give NAMESPACE/NAME, NAME or an IP address", s)
	}
	var pod *corev1.Pod
	var svc *corev1.Service
	if kind != "svc" {
		for i := range in.Pods {
			if p := &in.Pods[i]; p.Namespace == k.Namespace && p.Name == k.Name {
				pod = p
			}
		}
	}
	if kind != "pod" {
		for i := range in.Services {
			if v := &in.Services[i]; v.Namespace == k.Namespace && v.Name == k.Name {
				svc = v
			}
		}
	}
	switch {
	case pod != nil && svc != nil && svcOK:
		return e, fmt.Errorf("%s names both a pod and a service: write pod:%s or svc:%s", k, k, k)
	case pod != nil:
		return resolvePod(in, e, pod)
	case svc != nil && !svcOK:
		return e, fmt.Errorf("%s is a service: a service is a destination only", k)
	case svc != nil:
		return resolveService(e, svc), nil
	case kind == "svc":
		return e, fmt.Errorf("service %s not found", k)
	case svcOK && kind == "":
		return e, fmt.Errorf("pod or service %s not found", k)
	}
	return e, fmt.Errorf("pod %s not found", k)
}

func resolveService(e endpointRef, svc *corev1.Service) endpointRef {
	e.svc = svc
	e.Kind = model.EndpointService
	e.Namespace, e.Name = svc.Namespace, svc.Name
	e.Service = svc.Namespace + "/" + svc.Name
	return e
}

// resolvePod makes a pod an endpoint: its node, and its network from its
// NetworkEndpoint, or else from the binding policies. A host-network pod
// is its node's host stack.
func resolvePod(in TraceInput, e endpointRef, p *corev1.Pod) (endpointRef, error) {
	e.pod = p
	e.Pod = p.Namespace + "/" + p.Name
	e.NodeName = p.Spec.NodeName
	if len(p.Status.PodIPs) == 0 && p.Status.PodIP == "" {
		return e, fmt.Errorf("pod %s has no IP address yet (phase %s)", e.Pod, p.Status.Phase)
	}
	if p.Spec.HostNetwork {
		e.Kind = model.EndpointNode
		return e, nil
	}
	e.Kind = model.EndpointPod
	network, from, err := podNetwork(in, p)
	if err != nil {
		return e, err
	}
	e.Network, e.NetworkFrom = network, from
	return e, nil
}

// podNetwork is the network a pod is in: its NetworkEndpoint says what the
// data plane did; before the agent wrote one, the binding policies say
// where the pod goes.
func podNetwork(in TraceInput, p *corev1.Pod) (network, from string, err error) {
	for _, ne := range in.NetworkEndpoints {
		if ne.Namespace != p.Namespace || ne.Name != p.Name || ne.Spec.Network == "" {
			continue
		}
		if uid, ok := ne.Labels[lacev1.LabelPodUID]; ok && uid != string(p.UID) {
			continue // left from an earlier pod of the same name
		}
		return ne.Spec.Network, "NetworkEndpoint", nil
	}
	var nsLabels map[string]string
	for _, n := range in.Namespaces {
		if n.Name == p.Namespace {
			nsLabels = n.Labels
		}
	}
	b, err := model.Bind(in.BindingPolicies, lacev1.MatchKindPod, p.Namespace, p.Name, p.Labels, nsLabels)
	if err != nil {
		return "", "", fmt.Errorf("pod %s/%s has no NetworkEndpoint, and %v", p.Namespace, p.Name, err)
	}
	return b.Network, "NetworkBindingPolicy " + b.Policy + ", no NetworkEndpoint yet", nil
}

// podAddr picks the pod's address of the family asked.
func podAddr(p *corev1.Pod, v6 bool) (netip.Addr, error) {
	var all []string
	for _, ip := range podIPs(p) {
		all = append(all, ip.String())
		if ip.Is6() == v6 {
			return ip, nil
		}
	}
	fam := "IPv4"
	if v6 {
		fam = "IPv6"
	}
	return netip.Addr{}, fmt.Errorf("pod %s/%s has no %s address (its addresses: %s)", p.Namespace, p.Name, fam, strings.Join(all, ", "))
}

func podIPs(p *corev1.Pod) []netip.Addr {
	var out []netip.Addr
	for _, s := range p.Status.PodIPs {
		if a, err := netip.ParseAddr(s.IP); err == nil {
			out = append(out, a.Unmap())
		}
	}
	if len(out) == 0 {
		if a, err := netip.ParseAddr(p.Status.PodIP); err == nil {
			out = append(out, a.Unmap())
		}
	}
	return out
}

// resolveAddr: a node's underlay address is that node; an address a pod
// holds is that pod (the user names it when several do); anything else is
// outside.
func resolveAddr(in TraceInput, e endpointRef, a netip.Addr, svcOK bool) (endpointRef, error) {
	e.Addr, e.addrGiven = a, true
	for _, u := range in.UnderlayEndpoints {
		for _, ua := range u.Spec.Addresses {
			if x, err := netip.ParseAddr(string(ua)); err == nil && x.Unmap() == a {
				e.Kind, e.NodeName = model.EndpointNode, uepNode(u)
				return e, nil
			}
		}
	}
	for i := range in.Services {
		svc := &in.Services[i]
		if !slices.Contains(serviceVIPs(svc), a) {
			continue
		}
		if !svcOK {
			return e, fmt.Errorf("%s is the VIP of service %s/%s: a service is a destination only", a, svc.Namespace, svc.Name)
		}
		return resolveService(e, svc), nil
	}
	// A LoadBalancer VIP or external IP is a service's, whatever else the
	// address is (the data plane looks frontends up first).
	if svcOK && slices.ContainsFunc(in.Services, func(svc corev1.Service) bool {
		lbs, eips := frontendAddrs(&svc)
		return slices.Contains(lbs, a) || slices.Contains(eips, a)
	}) {
		e.Kind, e.frontend = model.EndpointOutside, true
		return e, nil
	}
	type holder struct {
		pod *corev1.Pod
		net string
	}
	var holders []holder
	for i := range in.Pods {
		p := &in.Pods[i]
		// Host-network pods hold their node's addresses; finished pods
		// gave theirs back.
		if p.Spec.HostNetwork || p.Status.Phase == corev1.PodSucceeded || p.Status.Phase == corev1.PodFailed {
			continue
		}
		for _, ip := range podIPs(p) {
			if ip == a {
				network, _, err := podNetwork(in, p)
				if err != nil {
					network = "unknown"
				}
				holders = append(holders, holder{p, network})
				break
			}
		}
	}
	switch len(holders) {
	case 0:
		e.Kind = model.EndpointOutside
		for _, n := range in.Networks {
			for _, sn := range []*lacev1.Subnet{n.Spec.IPv4Subnet, n.Spec.IPv6Subnet} {
				if n.Spec.Type == lacev1.NetworkTypeExternal || sn == nil {
					continue
				}
				if p, err := netip.ParsePrefix(string(sn.Prefix)); err == nil && p.Contains(a) {
					e.InSubnetOf = append(e.InSubnetOf, n.Name)
				}
			}
		}
		sort.Strings(e.InSubnetOf)
		return e, nil
	case 1:
		r, err := resolvePod(in, e, holders[0].pod)
		r.Addr, r.addrGiven = a, true
		return r, err
	}
	sort.Slice(holders, func(i, j int) bool {
		return holders[i].pod.Namespace+"/"+holders[i].pod.Name < holders[j].pod.Namespace+"/"+holders[j].pod.Name
	})
	names := make([]string, len(holders))
	for i, h := range holders {
		names[i] = fmt.Sprintf("%s/%s (net %s)", h.pod.Namespace, h.pod.Name, h.net)
	}
	list := strings.Join(names[:len(names)-1], ", ") + " and " + names[len(names)-1]
	return e, fmt.Errorf("address %s is held by pods %s: name the pod", a, list)
}

func uepNode(u lacev1.UnderlayEndpoint) string {
	if u.Spec.Node != "" {
		return u.Spec.Node
	}
	return u.Name
}

// parseProto reads tcp/80, udp/53, sctp/9, icmp.
func parseProto(s string) (string, uint16, error) {
	if s == "" {
		return "tcp", 80, nil
	}
	p, port, hasPort := strings.Cut(strings.ToLower(s), "/")
	switch p {
	case "icmp", "icmpv6", "icmp6":
		if hasPort {
			return "", 0, fmt.Errorf("protocol %q: icmp has no port", s)
		}
		return p, 0, nil
	case "tcp", "udp", "sctp":
		if !hasPort {
			return "", 0, fmt.Errorf("protocol %q: give a port, as in %s/80", s, p)
		}
		n, err := strconv.ParseUint(port, 10, 16)
		if err != nil || n == 0 {
			return "", 0, fmt.Errorf("protocol %q: port must be 1-65535", s)
		}
		return p, uint16(n), nil
	}
	return "", 0, fmt.Errorf("protocol %q: give tcp/PORT, udp/PORT, sctp/PORT or icmp", s)
}

// Describing the path.

func netIDs(in TraceInput) map[string]int32 {
	ids := map[string]int32{}
	for _, n := range in.Networks {
		ids[n.Name] = n.Status.ID
	}
	return ids
}

func underlayOf(in TraceInput, node string) *lacev1.UnderlayEndpoint {
	for i := range in.UnderlayEndpoints {
		if uepNode(in.UnderlayEndpoints[i]) == node {
			return &in.UnderlayEndpoints[i]
		}
	}
	return nil
}

// sid is the SID a packet of srcNet for dstNet is encapsulated to on node,
// or why there is none.
func sid(in TraceInput, node, srcNet, dstNet string) string {
	u := underlayOf(in, node)
	if u == nil {
		return fmt.Sprintf("<none: node %s has no UnderlayEndpoint>", node)
	}
	loc, err := netip.ParsePrefix(string(u.Spec.Locator))
	if err != nil {
		return fmt.Sprintf("<none: node %s has no locator in its UnderlayEndpoint>", node)
	}
	ids := netIDs(in)
	return tables.SID(loc, tables.BehaviourL3Decap, uint32(ids[srcNet]), uint32(ids[dstNet])).String()
}

// nodeAddr is the node's underlay address of the family of like.
func nodeAddr(in TraceInput, node string, like netip.Addr) string {
	if u := underlayOf(in, node); u != nil {
		for _, a := range u.Spec.Addresses {
			if x, err := netip.ParseAddr(string(a)); err == nil && x.Unmap().Is4() == like.Is4() {
				return x.Unmap().String()
			}
		}
	}
	return "<none of this family in its UnderlayEndpoint>"
}

func encap(in TraceInput, to, srcNet, dstNet string) string {
	ids := netIDs(in)
	return fmt.Sprintf("SRv6 to SID %s (locator of node %s, source network %s id %d, destination network %s id %d)",
		sid(in, to, srcNet, dstNet), to, srcNet, ids[srcNet], dstNet, ids[dstNet])
}

// path says what the data plane does with an allowed flow.
func path(in TraceInput, r TraceResult) string {
	s, d, v := r.Src, r.Dst, r.Verdict
	switch {
	case s.Kind == model.EndpointPod && d.Kind == model.EndpointPod:
		if s.NodeName == d.NodeName {
			return fmt.Sprintf("delivered on node %s", s.NodeName)
		}
		return fmt.Sprintf("node %s encapsulates in %s, node %s decapsulates and delivers",
			s.NodeName, encap(in, d.NodeName, v.SrcNetwork, d.Network), d.NodeName)
	case s.Kind == model.EndpointPod && d.Kind == model.EndpointNode && d.NodeName == s.NodeName:
		return fmt.Sprintf("handed to node %s's host stack, source preserved (pod addresses are unique per node)", s.NodeName)
	case s.Kind == model.EndpointPod:
		return fmt.Sprintf("leaves node %s's underlay with source translated to %s's address %s (SNAT, reversed by conntrack)",
			s.NodeName, s.NodeName, nodeAddr(in, s.NodeName, s.Addr))
	case s.Kind == model.EndpointNode && d.Kind == model.EndpointPod && s.NodeName == d.NodeName:
		return "the node reaches its own pods (kubelet probes)"
	case s.Kind == model.EndpointNode && d.Kind == model.EndpointPod:
		return fmt.Sprintf("sent by node %s's host stack as plain IP, classified into %s by %s, encapsulated in %s, node %s decapsulates and delivers with its source preserved",
			s.NodeName, v.SrcNetwork, v.SrcPrefix, encap(in, d.NodeName, v.SrcNetwork, d.Network), d.NodeName)
	case d.Kind == model.EndpointPod:
		return fmt.Sprintf("enters the cluster at any node as plain IP, classified into %s by %s, delivered (encapsulated to node %s, SID %s, if it enters at another node) with its source preserved",
			v.SrcNetwork, v.SrcPrefix, d.NodeName, sid(in, d.NodeName, v.SrcNetwork, d.Network))
	}
	return "not carried by Lace"
}

// dropped says where a denied flow is dropped and under which counter.
func dropped(r TraceResult) string {
	where := "the node where it enters"
	if r.Src.Kind != model.EndpointOutside && r.Src.NodeName != "" {
		where = "node " + r.Src.NodeName
	}
	if r.Verdict.Reason == "" {
		return fmt.Sprintf("on %s (no drop counter: the data plane never sees this question)", where)
	}
	return fmt.Sprintf("on %s, counted as %s{%s=%q}", where, dpmetrics.Dropped, dpmetrics.LabelReason, r.Verdict.Reason)
}

// Printing.

func verdictWord(v model.Verdict) string {
	if v.Allowed {
		return "ALLOWED"
	}
	return "DENIED"
}

func (e TraceEndpoint) describe() string {
	switch {
	case e.Kind == model.EndpointService && e.Frontend != tables.FrontendClusterIP:
		return fmt.Sprintf("service %s %s", e.Service, frontendWords(e))
	case e.Kind == model.EndpointService:
		return fmt.Sprintf("service %s VIP %s", e.Service, e.Addr)
	case e.Kind == model.EndpointPod:
		return fmt.Sprintf("pod %s %s on node %s", e.Pod, e.Addr, e.NodeName)
	case e.Kind == model.EndpointNode && e.Pod != "":
		return fmt.Sprintf("host-network pod %s: node %s's host stack (%s)", e.Pod, e.NodeName, e.Addr)
	case e.Kind == model.EndpointNode:
		return fmt.Sprintf("node %s's host stack (%s)", e.NodeName, e.Addr)
	case len(e.InSubnetOf) > 0:
		return fmt.Sprintf("address %s, held by no pod (in the subnet of %s)", e.Addr, strings.Join(e.InSubnetOf, ", "))
	}
	return "outside address " + e.Addr.String()
}

func (e TraceEndpoint) short() string {
	switch {
	case e.Kind == model.EndpointService && e.Frontend != tables.FrontendClusterIP:
		return fmt.Sprintf("service %s %s", e.Service, frontendWords(e))
	case e.Kind == model.EndpointService:
		return fmt.Sprintf("service %s %s", e.Service, e.Addr)
	case e.Pod != "":
		return e.Pod
	case e.Kind == model.EndpointNode:
		return fmt.Sprintf("node %s (%s)", e.NodeName, e.Addr)
	}
	return e.Addr.String()
}

// frontendWords names an external frontend: NodePort 192.0.2.1 (node
// n1's address), LoadBalancer 192.0.2.10, external IP 192.0.2.20.
func frontendWords(e TraceEndpoint) string {
	switch e.Frontend {
	case tables.FrontendNodePort:
		return fmt.Sprintf("NodePort on %s (node %s's address)", e.Addr, e.NodeName)
	case tables.FrontendLoadBalancer:
		return "LoadBalancer " + e.Addr.String()
	}
	return "external IP " + e.Addr.String()
}

// ProtoString is the protocol as the user writes it: tcp/80, icmp.
func (r TraceResult) ProtoString() string {
	if r.Port == 0 {
		return r.Proto
	}
	return fmt.Sprintf("%s/%d", r.Proto, r.Port)
}

// Print writes the result for people; the same result always gives the
// same text.
func (r TraceResult) Print(out io.Writer) error {
	v := r.Verdict
	var b strings.Builder
	if r.Policy.Denied() {
		fmt.Fprintf(&b, "DENIED  %s; then network policy\n", v.Rule)
	} else {
		fmt.Fprintf(&b, "%s  %s\n", verdictWord(v), v.Rule)
	}
	fmt.Fprintf(&b, "flow:         %s %s -> %s\n", r.ProtoString(), r.Src.short(), r.Dst.short())

	// Source: the network it belongs to.
	src := "source:       " + r.Src.describe()
	switch {
	case r.Src.Kind == model.EndpointPod:
		src += fmt.Sprintf(", network %s (%s)", r.Src.Network, r.Src.NetworkFrom)
	case v.SrcNetwork != "":
		src += fmt.Sprintf(", classified into %s by %s", v.SrcNetwork, v.SrcPrefix)
	case v.Reason == model.DropUnclassified || r.Dst.Frontend != tables.FrontendClusterIP:
		src += ", in no network: no external network's prefix covers it"
	default:
		src += ", not classified: the node reaches its own pods whatever the policies"
	}
	b.WriteString(src + "\n")

	// Destination: its network and the view entry it resolved to.
	dst := "destination:  " + r.Dst.describe()
	if r.Dst.Frontend != tables.FrontendClusterIP {
		b.WriteString(frontendDestination(r) + "\n")
		fmt.Fprintf(&b, "entry:        %s\n", r.Service.Entry)
		dst = ""
	}
	switch {
	case dst == "":
	case r.Dst.Kind == model.EndpointPod:
		dst += fmt.Sprintf(", network %s (%s)", r.Dst.Network, r.Dst.NetworkFrom)
	case r.Dst.Kind == model.EndpointService:
		port := "port " + r.Service.Port
		if r.Port == 0 {
			port = r.Proto + " (no port)"
		}
		dst += fmt.Sprintf(" %s, network %s (%s)", port, r.Dst.Network, r.Dst.NetworkFrom)
	}
	switch {
	case dst == "":
	case v.DstPrefix.IsValid() && r.Dst.Kind == model.EndpointService && !v.Allowed:
		dst += fmt.Sprintf("; not in the view of %s", v.SrcNetwork)
	case v.DstPrefix.IsValid():
		dst += fmt.Sprintf("; view entry %s of network %s", v.DstPrefix, v.DstNetwork)
		if v.Policy != "" {
			dst += " (granted by NetworkRoutingPolicy " + v.Policy + ")"
		}
		if v.ServicePolicy != "" {
			dst += " (granted by ServiceRoutingPolicy " + v.ServicePolicy + ": the VIP only)"
		}
	case v.Allowed:
		dst += "; no view entry needed"
	case v.Reason == model.DropAnonymous:
		dst += "; its own network, closed: anonymous without a self policy"
	case v.SrcNetwork != "":
		dst += fmt.Sprintf("; not in the view of %s", v.SrcNetwork)
	}
	if dst != "" {
		b.WriteString(dst + "\n")
	}

	for _, l := range r.Policy.lines(r) {
		b.WriteString(l + "\n")
	}
	if v.Allowed && !r.Policy.Denied() {
		fmt.Fprintf(&b, "path:         %s\n", r.Path)
	} else {
		fmt.Fprintf(&b, "dropped:      %s\n", r.Dropped)
	}
	switch {
	case r.Reply.Allowed && r.Service != nil && !r.Service.Translated:
		b.WriteString("replies:      none: no endpoint is reached\n")
	case r.Reply.Allowed && r.Dst.Frontend != tables.FrontendClusterIP:
		fmt.Fprintf(&b, "replies:      return through conntrack, from the frontend %s: %s\n", netip.AddrPortFrom(r.Dst.Addr, r.Port), strings.TrimSuffix(r.Reply.Rule, " (conntrack)"))
	case r.Reply.Allowed && r.Dst.Kind == model.EndpointService && r.Src.Kind == model.EndpointNode:
		fmt.Fprintf(&b, "replies:      return through conntrack to the socket, which sees them from the VIP: %s\n", strings.TrimSuffix(r.Reply.Rule, " (conntrack)"))
	case r.Reply.Allowed && r.Dst.Kind == model.EndpointService:
		fmt.Fprintf(&b, "replies:      return through conntrack, from the VIP: %s\n", strings.TrimSuffix(r.Reply.Rule, " (conntrack)"))
	case r.Reply.Allowed:
		fmt.Fprintf(&b, "replies:      return through conntrack: %s\n", strings.TrimSuffix(r.Reply.Rule, " (conntrack)"))
	default:
		b.WriteString("replies:      none: no admitted flow to reply to\n")
	}
	if r.Dst.Kind == model.EndpointService {
		b.WriteString("reverse:      none: a service opens no flows (its endpoints open theirs from their own addresses)\n")
	} else {
		fmt.Fprintf(&b, "reverse:      a new flow %s -> %s is %s  %s\n", r.Dst.short(), r.Src.short(), verdictWord(r.Reverse), r.Reverse.Rule)
	}
	_, err := io.WriteString(out, b.String())
	return err
}

// The command.

// ReadTraceInput fills in the API objects Trace reads. Pods and their
// NetworkEndpoints are listed in every namespace only when an endpoint is
// an address (to find who holds it); named pods are read one by one.
// Services are listed in every namespace (a name or an address may be
// one's); when the destination is a service or an external frontend (a
// LoadBalancer VIP or external IP, or a NodePort of a node's address), so
// are the NetworkEndpoints (which network each endpoint's pod is in), the
// Nodes (their zones and labels) and the EndpointSlices of the services
// it may be; for a VIP, the LoadBalancerClasses and the agents' Leases
// (who announces it).
func ReadTraceInput(ctx context.Context, c client.Client, in *TraceInput) error {
	var nets lacev1.NetworkList
	var nrps lacev1.NetworkRoutingPolicyList
	var srps lacev1.ServiceRoutingPolicyList
	var nbps lacev1.NetworkBindingPolicyList
	var nss corev1.NamespaceList
	var ueps lacev1.UnderlayEndpointList
	var svcs corev1.ServiceList
	for _, l := range []client.ObjectList{&nets, &nrps, &srps, &nbps, &nss, &ueps, &svcs} {
		if err := c.List(ctx, l); err != nil {
			return fmt.Errorf("list %T: %w", l, err)
		}
	}
	in.Networks, in.RoutingPolicies, in.ServiceRoutingPolicies = nets.Items, nrps.Items, srps.Items
	in.BindingPolicies, in.Namespaces, in.UnderlayEndpoints, in.Services = nbps.Items, nss.Items, ueps.Items, svcs.Items
	// Only the underlay addresses the agents believe (model.AcceptUnderlays).
	var uepNodes corev1.NodeList
	var uepClasses lacev1.LoadBalancerClassList
	for _, l := range []client.ObjectList{&uepNodes, &uepClasses} {
		if err := c.List(ctx, l); err != nil {
			return fmt.Errorf("list %T: %w", l, err)
		}
	}
	in.UnderlayEndpoints, _ = model.AcceptUnderlays(model.UnderlayInput{Underlays: ueps.Items, Nodes: uepNodes.Items, Networks: nets.Items,
		LoadBalancerPools: uepClasses.Items, AllowedExternalIPs: allowedExternalIPs(svcs.Items)})

	ns := in.Namespace
	if ns == "" {
		ns = "default"
	}
	var names []client.ObjectKey
	// Policies select pods by labels anywhere: with any, every pod.
	all, err := readPolicies(ctx, c, in)
	if err != nil {
		return err
	}
	for _, s := range []string{in.Src, in.Dst} {
		if _, err := netip.ParseAddr(s); err == nil {
			all = true
			continue
		}
		kind, k, ok := endpointName(s, ns)
		if !ok || kind == "svc" {
			continue // Trace says what is wrong with it, or it is no pod
		}
		names = append(names, k)
	}
	// Is the destination a service, or one of its external frontends?
	// (Trace decides between a pod and a service of the same name, and
	// which of the services naming a frontend address it is.)
	var dsts []*corev1.Service
	lb := false
	if a, err := netip.ParseAddr(in.Dst); err == nil {
		a = a.Unmap()
		for i := range in.Services {
			if slices.Contains(serviceVIPs(&in.Services[i]), a) {
				dsts = []*corev1.Service{&in.Services[i]}
			}
		}
		if len(dsts) == 0 {
			dsts = frontendServices(in.Services, a, false, "", 0)
			lb = len(dsts) > 0
		}
		isNode := slices.ContainsFunc(in.UnderlayEndpoints, func(u lacev1.UnderlayEndpoint) bool {
			return slices.ContainsFunc(u.Spec.Addresses, func(x lacev1.IPAddress) bool {
				b, err := netip.ParseAddr(string(x))
				return err == nil && b.Unmap() == a
			})
		})
		if proto, port, err := parseProto(in.Proto); len(dsts) == 0 && isNode && in.Proto != "" && err == nil {
			dsts = frontendServices(in.Services, a, true, proto, port)
		}
	} else if kind, k, ok := endpointName(in.Dst, ns); ok && kind != "pod" {
		for i := range in.Services {
			if in.Services[i].Namespace == k.Namespace && in.Services[i].Name == k.Name {
				dsts = []*corev1.Service{&in.Services[i]}
			}
		}
	}
	allNEs := all || len(dsts) > 0
	if len(dsts) > 0 || all {
		var nodes corev1.NodeList
		if err := c.List(ctx, &nodes); err != nil {
			return fmt.Errorf("list nodes: %w", err)
		}
		in.Nodes = nodes.Items
		for _, svc := range dsts {
			var eps discoveryv1.EndpointSliceList
			if err := c.List(ctx, &eps, client.InNamespace(svc.Namespace), client.MatchingLabels{discoveryv1.LabelServiceName: svc.Name}); err != nil {
				return fmt.Errorf("list endpoint slices of %s/%s: %w", svc.Namespace, svc.Name, err)
			}
			in.EndpointSlices = append(in.EndpointSlices, eps.Items...)
		}
	}
	if lb {
		// Who announces a VIP.
		var classes lacev1.LoadBalancerClassList
		if err := c.List(ctx, &classes); err != nil {
			return fmt.Errorf("list %T: %w", &classes, err)
		}
		leases, err := readAgentLeases(ctx, c)
		if err != nil {
			return err
		}
		in.Classes, in.Leases = classes.Items, leases
	}
	if allNEs {
		var neps lacev1.NetworkEndpointList
		if err := c.List(ctx, &neps); err != nil {
			return fmt.Errorf("list %T: %w", &neps, err)
		}
		in.NetworkEndpoints = neps.Items
	}
	if all {
		var pods corev1.PodList
		if err := c.List(ctx, &pods); err != nil {
			return fmt.Errorf("list %T: %w", &pods, err)
		}
		in.Pods = pods.Items
		return nil
	}
	for _, k := range names {
		var p corev1.Pod
		if err := c.Get(ctx, k, &p); err != nil {
			if apierrors.IsNotFound(err) {
				continue // Trace: pod not found, or a service
			}
			return fmt.Errorf("get pod %s: %w", k, err)
		}
		in.Pods = append(in.Pods, p)
		if allNEs {
			continue
		}
		var ne lacev1.NetworkEndpoint
		if err := c.Get(ctx, k, &ne); err == nil {
			in.NetworkEndpoints = append(in.NetworkEndpoints, ne)
		} else if !apierrors.IsNotFound(err) {
			return fmt.Errorf("get NetworkEndpoint %s: %w", k, err)
		}
	}
	return nil
}

// TraceCommand reads the cluster, traces, and prints.
func TraceCommand(ctx context.Context, c client.Client, in TraceInput, out io.Writer) error {
	if _, _, err := parseProto(in.Proto); err != nil {
		return err // before asking the API server anything
	}
	if err := ReadTraceInput(ctx, c, &in); err != nil {
		return err
	}
	if in.Now.IsZero() {
		in.Now = time.Now()
	}
	r, err := Trace(in)
	if err != nil {
		return err
	}
	return r.Print(out)
}

package lacectl

// lacectl trace through a service VIP: the oracle's verdict for the VIP
// (model.Reach with an EndpointService), then what the source's node does
// with an admitted flow: DNAT to an endpoint model.ComputeServices finds
// eligible there, reached in the service's network.

import (
	"cmp"
	"fmt"
	"net/netip"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"

	lacev1 "github.com/lace-cni/lace/api/v1alpha1"
	"github.com/lace-cni/lace/internal/dpmetrics"
	"github.com/lace-cni/lace/internal/model"
	"github.com/lace-cni/lace/internal/tables"
)

// traceService answers for a flow from src to the service dst.
func traceService(in TraceInput, r TraceResult, src, dst endpointRef) (TraceResult, error) {
	svc := dst.svc
	name := svc.Namespace + "/" + svc.Name
	// The binding does not depend on the node; the eligible endpoints do.
	b, considered := serviceBindings(in.Networks, in.BindingPolicies, in.Namespaces, []corev1.Service{*svc}).binding(svc)
	if !considered {
		return r, fmt.Errorf("service %s is not served by Lace (%s)", name, leftAlone(svc))
	}
	if b.Err != "" {
		return r, fmt.Errorf("service %s is not served: bound to no network: %s", name, b.Err)
	}

	// The family: an address side decides, else --ipv6.
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
	if !dst.addrGiven {
		vips := serviceVIPs(svc)
		i := slices.IndexFunc(vips, func(a netip.Addr) bool { return a.Is6() == v6 })
		if i < 0 {
			return r, fmt.Errorf("service %s has no %s VIP (its VIPs: %s)", name, family(v6), joinAddrs(vips))
		}
		dst.Addr = vips[i]
	}
	if !src.addrGiven {
		a, err := podAddr(src.pod, v6)
		if err != nil {
			return r, err
		}
		src.Addr = a
	}
	dst.Network, dst.NetworkFrom = b.Network, "NetworkBindingPolicy "+b.Policy
	if ann := svc.Annotations[lacev1.AnnotationServiceNetwork]; ann != "" && ann != b.Network {
		dst.NetworkFrom += fmt.Sprintf("; its %s annotation still says %s", lacev1.AnnotationServiceNetwork, ann)
	}

	// The port: the one asked, else the service's first.
	if in.Proto == "" && len(svc.Spec.Ports) > 0 {
		r.Proto, r.Port = protoName(svc.Spec.Ports[0].Protocol), uint16(svc.Spec.Ports[0].Port)
	}
	r.Src, r.Dst = src.TraceEndpoint, dst.TraceEndpoint

	// The oracle knows every service bound to a network.
	all := serviceBindings(in.Networks, in.BindingPolicies, in.Namespaces, in.Services)
	t := model.Topology{Networks: in.Networks, RoutingPolicies: in.RoutingPolicies, ServiceRoutingPolicies: in.ServiceRoutingPolicies,
		Namespaces: nsLabels(in.Namespaces)}
	for i := range in.Services {
		s := &in.Services[i]
		if sb, ok := all.binding(s); ok && sb.Err == "" {
			t.Services = append(t.Services, model.BoundService{Namespace: s.Namespace, Name: s.Name, Network: sb.Network, VIPs: serviceVIPs(s)})
		}
	}
	r.Verdict = model.Reach(t, r.Src.Endpoint, r.Dst.Endpoint, r.Proto, r.Port)
	r.Reply = model.ReachReply(t, r.Src.Endpoint, r.Dst.Endpoint, r.Proto, r.Port)

	ts := &TraceService{Namespace: svc.Namespace, Name: svc.Name, Network: b.Network, NetworkFrom: b.Policy, Node: r.Src.NodeName}
	r.Service = ts
	var sp *corev1.ServicePort
	for i := range svc.Spec.Ports {
		p := &svc.Spec.Ports[i]
		ts.Ports = append(ts.Ports, fmt.Sprintf("%s/%d", protoName(p.Protocol), p.Port))
		if sp == nil && protoName(p.Protocol) == r.Proto && uint16(p.Port) == r.Port {
			sp = p
		}
	}
	ts.Port = r.ProtoString()
	if sp != nil && sp.Name != "" {
		ts.Port += " (" + sp.Name + ")"
	}
	if r.Verdict.Allowed {
		if sp != nil && r.Src.NodeName != "" {
			ns := in.env().node(r.Src.NodeName)
			if tab := ns.byKey[svcKey{r.Dst.Addr, protoNum(sp.Protocol), uint16(sp.Port)}]; tab != nil {
				ts.Served, ts.Drop, ts.AffinitySeconds = true, tab.Drop, tab.AffinitySeconds
				cands := candidates(svc, *sp, r.Dst.Addr, in.EndpointSlices)
				ts.NotEligible = max(0, len(cands)-len(tab.Backends))
				for _, be := range tab.Backends {
					ts.Endpoints = append(ts.Endpoints, backend(in, t, r, be, cands))
				}
			}
		}
		ts.Translated = ts.Served && (r.Proto == "tcp" || r.Proto == "udp") &&
			slices.ContainsFunc(ts.Endpoints, func(e TraceBackend) bool { return !e.Dropped })
		r.Path = servicePath(r)
	} else {
		r.Dropped = dropped(r)
		if r.Src.Kind == model.EndpointNode {
			r.Dropped += "; the connect fails with EPERM (a socket hook's only refusal)"
		}
		if r.Src.Kind == model.EndpointOutside && hasFrontends(svc) {
			r.Dropped += "; from outside it is reached at " + frontendList(svc) + " (trace those)"
		}
	}
	return r, nil
}

func family(v6 bool) string {
	if v6 {
		return "IPv6"
	}
	return "IPv4"
}

// backend says where an endpoint is and how the translated packet gets
// there: the data plane looks the endpoint up in the view of the service's
// network, and encapsulates with the source's network in the SID.
func backend(in TraceInput, t model.Topology, r TraceResult, be tables.Backend, cands []svcCandidate) TraceBackend {
	tb := TraceBackend{Addr: netip.AddrPortFrom(be.Addr, be.Port)}
	for _, c := range cands {
		if c.addr == tb.Addr {
			tb.Pod, tb.Node = c.pod, c.node
		}
	}
	svcNet, srcNode := r.Service.Network, r.Src.NodeName
	if r.Src.Kind == model.EndpointNode {
		return nodeBackend(in, t, r, tb, cands)
	}
	// A pod of the service's network holding the address says which pod
	// and node it is, whatever the slice says.
	for _, ne := range in.NetworkEndpoints {
		if ne.Spec.Network != svcNet || !slices.ContainsFunc(ne.Spec.Addresses, func(a lacev1.IPAddress) bool {
			x, err := netip.ParseAddr(string(a))
			return err == nil && x.Unmap() == be.Addr
		}) {
			continue
		}
		tb.Pod, tb.Node = ne.Namespace+"/"+ne.Name, ne.Spec.Node
	}
	var inSubnet []string
	for _, n := range in.Networks {
		for _, sn := range []*lacev1.Subnet{n.Spec.IPv4Subnet, n.Spec.IPv6Subnet} {
			if n.Spec.Type == lacev1.NetworkTypeExternal || sn == nil {
				continue
			}
			if p, err := netip.ParsePrefix(string(sn.Prefix)); err == nil && p.Contains(be.Addr) {
				inSubnet = append(inSubnet, n.Name)
			}
		}
	}
	switch {
	case slices.Contains(inSubnet, svcNet) && tb.Addr.Addr() == r.Src.Addr && tb.Pod == r.Src.Pod:
		tb.Path = fmt.Sprintf("the client itself: hairpin, delivered back to it from the VIP %s", netip.AddrPortFrom(r.Dst.Addr, r.Port))
	case slices.Contains(inSubnet, svcNet) && tb.Node == "":
		tb.Path = fmt.Sprintf("in the subnet of %s, on no known node: the view of %s sends it to the owner of its block", svcNet, svcNet)
	case slices.Contains(inSubnet, svcNet) && tb.Node == srcNode:
		tb.Path = "delivered on node " + srcNode
	case slices.Contains(inSubnet, svcNet):
		tb.Path = fmt.Sprintf("node %s encapsulates in %s, node %s decapsulates and delivers", srcNode, encap(in, tb.Node, r.Src.Network, svcNet), tb.Node)
	case len(inSubnet) > 0:
		tb.Dropped = true
		tb.Path = fmt.Sprintf("dropped, counted as %s{%s=%q}: in the subnet of %s, not of the service's network %s",
			dpmetrics.Dropped, dpmetrics.LabelReason, model.DropIsolated, strings.Join(inSubnet, ", "), svcNet)
	default:
		// Outside the cluster (the kubernetes Service's API server): the
		// view of the service's network decides, as for its own pods.
		v := model.Reach(t, model.Endpoint{Kind: model.EndpointPod, Network: svcNet, Addr: r.Src.Addr, NodeName: srcNode},
			model.Endpoint{Kind: model.EndpointOutside, Addr: be.Addr}, r.Proto, be.Port)
		for _, u := range in.UnderlayEndpoints {
			if slices.ContainsFunc(u.Spec.Addresses, func(a lacev1.IPAddress) bool {
				x, err := netip.ParseAddr(string(a))
				return err == nil && x.Unmap() == be.Addr
			}) {
				tb.Node = uepNode(u) // a node's own address (an API server on it)
			}
		}
		if v.Allowed {
			tb.Path = fmt.Sprintf("outside the cluster: leaves node %s's underlay with source translated to %s's address %s (SNAT to the node address, reversed by conntrack); %s reaches it by %s",
				srcNode, srcNode, nodeAddr(in, srcNode, be.Addr), svcNet, strings.TrimSuffix(v.Rule, "; leaves through the node's underlay with SNAT to the node address"))
		} else {
			tb.Dropped = true
			tb.Path = fmt.Sprintf("outside the cluster: dropped, counted as %s{%s=%q}: the view of %s does not reach it: %s",
				dpmetrics.Dropped, dpmetrics.LabelReason, v.Reason, svcNet, v.Rule)
		}
	}
	return tb
}

// nodeBackend: a node's socket is pointed at the endpoint before any
// packet exists (bpf/sock.c), so the packets leave the node's host stack
// for the endpoint itself, as plain IP from the node's address, and are
// judged like any outside host's (docs/external-networks.md, "Where outside
// traffic belongs").
func nodeBackend(in TraceInput, t model.Topology, r TraceResult, tb TraceBackend, cands []svcCandidate) TraceBackend {
	svcNet, srcNode := r.Service.Network, r.Src.NodeName
	for _, ne := range in.NetworkEndpoints {
		if ne.Spec.Network == svcNet && slices.ContainsFunc(ne.Spec.Addresses, func(a lacev1.IPAddress) bool {
			x, err := netip.ParseAddr(string(a))
			return err == nil && x.Unmap() == tb.Addr.Addr()
		}) {
			tb.Pod, tb.Node = ne.Namespace+"/"+ne.Name, ne.Spec.Node
		}
	}
	for _, u := range in.UnderlayEndpoints {
		if slices.ContainsFunc(u.Spec.Addresses, func(a lacev1.IPAddress) bool {
			x, err := netip.ParseAddr(string(a))
			return err == nil && x.Unmap() == tb.Addr.Addr()
		}) {
			tb.Node = uepNode(u)
			if tb.Node == srcNode {
				tb.Path = "the node itself: handled by its own host stack"
			} else {
				tb.Path = fmt.Sprintf("node %s's address: sent over the underlay by node %s's host stack, not through Lace", tb.Node, srcNode)
			}
			return tb
		}
	}
	inSvcNet := false
	for _, n := range in.Networks {
		for _, sn := range []*lacev1.Subnet{n.Spec.IPv4Subnet, n.Spec.IPv6Subnet} {
			if n.Name != svcNet || sn == nil {
				continue
			}
			if p, err := netip.ParsePrefix(string(sn.Prefix)); err == nil && p.Contains(tb.Addr.Addr()) {
				inSvcNet = true
			}
		}
	}
	if !inSvcNet {
		tb.Path = fmt.Sprintf("outside the cluster: sent by node %s's host stack from its own address, not through Lace", srcNode)
		return tb
	}
	v := model.Reach(t, r.Src.Endpoint, model.Endpoint{Kind: model.EndpointPod, Network: svcNet, Addr: tb.Addr.Addr(), NodeName: tb.Node}, r.Proto, tb.Addr.Port())
	switch {
	case v.Allowed && tb.Node == srcNode:
		tb.Path = "the node reaches its own pods"
	case v.Allowed:
		tb.Path = fmt.Sprintf("sent by node %s's host stack as plain IP, classified into %s by %s, encapsulated in %s, node %s decapsulates and delivers (%s)",
			srcNode, v.SrcNetwork, v.SrcPrefix, encap(in, tb.Node, v.SrcNetwork, svcNet), tb.Node, v.Rule)
	default:
		tb.Dropped = true
		where := "where it enters"
		if tb.Node != "" {
			where = "node " + tb.Node
		}
		tb.Path = fmt.Sprintf("sent by node %s's host stack as plain IP and dropped on %s, counted as %s{%s=%q}: judged like any outside host's: %s",
			srcNode, where, dpmetrics.Dropped, dpmetrics.LabelReason, v.Reason, v.Rule)
	}
	return tb
}

// servicePath says what the source's node does with an admitted flow to
// the VIP, one line after another.
func servicePath(r TraceResult) string {
	if r.Src.Kind == model.EndpointNode {
		return nodeServicePath(r)
	}
	ts := r.Service
	node := ts.Node
	switch {
	case r.Proto != "tcp" && r.Proto != "udp":
		// to_service (bpf/pod.c) translates TCP and UDP only.
		return fmt.Sprintf("dropped on node %s, %s: the data plane translates TCP and UDP to a VIP, not %s", node, counted("no-service-port"), r.Proto)
	case !ts.Served:
		return fmt.Sprintf("rejected on node %s: ICMP port unreachable, %s: service %s/%s has no port %s (its ports: %s)",
			node, counted("no-service-port"), ts.Namespace, ts.Name, r.ProtoString(), strings.Join(ts.Ports, ", "))
	case len(ts.Endpoints) == 0 && ts.Drop:
		return fmt.Sprintf("dropped on node %s, %s: internalTrafficPolicy Local, and no endpoint is eligible on node %s", node, counted("no-local-endpoints"), node)
	case len(ts.Endpoints) == 0:
		return fmt.Sprintf("rejected on node %s: ICMP port unreachable, %s: the service has no ready or serving endpoint", node, counted("no-endpoints"))
	}
	lines := []string{fmt.Sprintf("DNAT on node %s to one of %d endpoints eligible there, picked uniformly at random (1/%d each), reached in network %s:",
		node, len(ts.Endpoints), len(ts.Endpoints), ts.Network)}
	if len(ts.Endpoints) == 1 {
		lines[0] = fmt.Sprintf("DNAT on node %s to the one endpoint eligible there, reached in network %s:", node, ts.Network)
	}
	lines = append(lines, endpointLines(ts.Endpoints)...)
	if ts.Translated {
		lines = append(lines, fmt.Sprintf("replies are translated back from the VIP (they come from %s)", netip.AddrPortFrom(r.Dst.Addr, r.Port)))
	}
	if ts.AffinitySeconds > 0 {
		lines = append(lines, fmt.Sprintf("sessionAffinity ClientIP: a client keeps its endpoint for %ds", ts.AffinitySeconds))
	}
	if ts.NotEligible > 0 {
		lines = append(lines, fmt.Sprintf("%d more not eligible on node %s (lacectl services -n %s --node %s says why)", ts.NotEligible, node, ts.Namespace, node))
	}
	return strings.Join(lines, "\n              ")
}

// nodeServicePath: what a node's socket meets at connect (or sendmsg) to
// a VIP its view holds (bpf/sock.c).
func nodeServicePath(r TraceResult) string {
	ts := r.Service
	node := ts.Node
	switch {
	case r.Proto != "tcp" && r.Proto != "udp":
		return fmt.Sprintf("not translated: the node's sockets are translated for TCP and UDP only; the packet goes to the VIP through node %s's routes", node)
	case !ts.Served:
		return fmt.Sprintf("not translated: service %s/%s has no port %s (its ports: %s); the connection goes to the VIP through node %s's routes",
			ts.Namespace, ts.Name, r.ProtoString(), strings.Join(ts.Ports, ", "), node)
	case len(ts.Endpoints) == 0 && ts.Drop:
		return fmt.Sprintf("refused at connect on node %s (EPERM), %s: internalTrafficPolicy Local, and no endpoint is eligible on node %s", node, counted("no-local-endpoints"), node)
	case len(ts.Endpoints) == 0:
		return fmt.Sprintf("refused at connect on node %s (EPERM), %s: the service has no ready or serving endpoint", node, counted("no-endpoints"))
	}
	lines := []string{fmt.Sprintf("connect-time translation on node %s: the socket is pointed at one of %d endpoints eligible there, picked uniformly at random (1/%d each):",
		node, len(ts.Endpoints), len(ts.Endpoints))}
	if len(ts.Endpoints) == 1 {
		lines[0] = fmt.Sprintf("connect-time translation on node %s: the socket is pointed at the one endpoint eligible there:", node)
	}
	lines = append(lines, endpointLines(ts.Endpoints)...)
	if ts.Translated {
		lines = append(lines, fmt.Sprintf("the socket sees the VIP as its peer (%s; datagrams are translated back)", netip.AddrPortFrom(r.Dst.Addr, r.Port)))
	}
	if ts.AffinitySeconds > 0 {
		lines = append(lines, fmt.Sprintf("sessionAffinity ClientIP: the node keeps its endpoint for %ds", ts.AffinitySeconds))
	}
	if ts.NotEligible > 0 {
		lines = append(lines, fmt.Sprintf("%d more not eligible on node %s (lacectl services -n %s --node %s says why)", ts.NotEligible, node, ts.Namespace, node))
	}
	return strings.Join(lines, "\n              ")
}

// endpointLines are one line per eligible endpoint: its address, its pod
// and node, and the path to it.
func endpointLines(eps []TraceBackend) []string {
	var out []string
	for _, e := range eps {
		where := "pod " + e.Pod
		switch {
		case e.Pod == "" && e.Node == "":
			where = "no pod"
		case e.Pod == "":
			where = "on node " + e.Node
		case e.Node != "":
			where += " on node " + e.Node
		}
		out = append(out, fmt.Sprintf("  %s (%s): %s", e.Addr, where, e.Path))
	}
	return out
}

// External frontends: a flow from outside to a NodePort on a node
// address, a LoadBalancer VIP or an external IP (bpf/underlay.c, xlb_in).
// It enters at one node (the NodePort's, the VIP's announcer, or the one
// the network sends an external IP to), which serves it from its own
// tables: a closed NodePort drops it; else it is admitted when the
// client's external network reaches the service's ClusterIP and, for a
// VIP or external IP, the client lies in loadBalancerSourceRanges; then
// DNAT to an endpoint its externalTrafficPolicy makes eligible there.

func (in TraceInput) env() *svcEnv {
	return &svcEnv{networks: in.Networks, nbps: in.BindingPolicies, nss: in.Namespaces, nodes: in.Nodes, svcs: in.Services,
		eps: in.EndpointSlices, neps: in.NetworkEndpoints, ueps: in.UnderlayEndpoints, nrps: in.RoutingPolicies,
		srps: in.ServiceRoutingPolicies, classes: in.Classes, leases: in.Leases, now: in.Now}
}

// frontendAddrs are the addresses svc is reached at from outside besides
// its NodePorts: its LoadBalancer ingress VIPs (not those of ipMode
// Proxy, which the data plane leaves to the load balancer) and its
// external IPs.
func frontendAddrs(svc *corev1.Service) (lbs, eips []netip.Addr) {
	if svc.Spec.Type == corev1.ServiceTypeLoadBalancer {
		for _, ing := range svc.Status.LoadBalancer.Ingress {
			if a, err := netip.ParseAddr(ing.IP); err == nil && (ing.IPMode == nil || *ing.IPMode != corev1.LoadBalancerIPModeProxy) {
				lbs = append(lbs, a.Unmap())
			}
		}
	}
	for _, s := range svc.Spec.ExternalIPs {
		if a, err := netip.ParseAddr(s); err == nil {
			eips = append(eips, a.Unmap())
		}
	}
	return lbs, eips
}

// frontendServices are the services with a frontend at a (a VIP or an
// external IP), or, nodePort, with NodePort proto/port: those a flow there
// may be for (the entry node's tables say which one it is), in namespace
// and name order.
func frontendServices(svcs []corev1.Service, a netip.Addr, nodePort bool, proto string, port uint16) []*corev1.Service {
	var out []*corev1.Service
	for i := range svcs {
		svc := &svcs[i]
		if nodePort {
			if svc.Spec.Type != corev1.ServiceTypeNodePort && svc.Spec.Type != corev1.ServiceTypeLoadBalancer {
				continue
			}
			if slices.ContainsFunc(svc.Spec.Ports, func(sp corev1.ServicePort) bool {
				return sp.NodePort > 0 && uint16(sp.NodePort) == port && protoName(sp.Protocol) == proto
			}) {
				out = append(out, svc)
			}
			continue
		}
		lbs, eips := frontendAddrs(svc)
		if slices.Contains(lbs, a) || slices.Contains(eips, a) {
			out = append(out, svc)
		}
	}
	slices.SortFunc(out, func(a, b *corev1.Service) int {
		return cmp.Or(cmp.Compare(a.Namespace, b.Namespace), cmp.Compare(a.Name, b.Name))
	})
	return out
}

func serviceNames(svcs []*corev1.Service) string {
	names := make([]string, len(svcs))
	for i, s := range svcs {
		names[i] = s.Namespace + "/" + s.Name
	}
	return strings.Join(names, ", ")
}

func counted(reason string) string {
	return fmt.Sprintf("counted as %s{%s=%q}", dpmetrics.Dropped, dpmetrics.LabelReason, reason)
}

// Drop reasons of external frontends (bpf/include/lace.h).
const (
	dropFrontendClosed model.DropReason = "frontend-closed"
	dropSourceRange    model.DropReason = "source-range"
)

// traceFrontend answers for a flow from the outside address src to the
// external frontend dst (a node address with a NodePort, or a VIP or
// external IP).
func traceFrontend(in TraceInput, r TraceResult, src, dst endpointRef) (TraceResult, error) {
	if src.Addr.Is4() != dst.Addr.Is4() {
		return r, fmt.Errorf("%s and %s are of different address families", src.Addr, dst.Addr)
	}
	e := in.env()
	nodePort := dst.Kind == model.EndpointNode
	cands := frontendServices(in.Services, dst.Addr, nodePort, r.Proto, r.Port)
	if len(cands) == 0 {
		return r, fmt.Errorf("%s is no service's frontend", dst.Addr) // resolveAddr found one
	}
	if in.Proto == "" && len(cands[0].Spec.Ports) > 0 {
		// A VIP's or external IP's first port, as for a ClusterIP.
		r.Proto, r.Port = protoName(cands[0].Spec.Ports[0].Protocol), uint16(cands[0].Spec.Ports[0].Port)
	}
	ts := &TraceService{Frontend: tables.FrontendExternalIP}
	r.Service = ts
	var ann model.Announcement
	announced := false
	switch {
	case nodePort:
		ts.Frontend, ts.Node = tables.FrontendNodePort, dst.NodeName
		ts.Entry = fmt.Sprintf("node %s, whose address it is", dst.NodeName)
		if in.Node != "" && in.Node != dst.NodeName {
			return r, fmt.Errorf("--node %s: %s is node %s's address, where its NodePorts are served", in.Node, dst.Addr, dst.NodeName)
		}
	default:
		for _, svc := range cands {
			if lbs, _ := frontendAddrs(svc); slices.Contains(lbs, dst.Addr) {
				ts.Frontend = tables.FrontendLoadBalancer
			}
		}
		ann, announced = e.announcements()[dst.Addr]
		if announced {
			var how string
			for _, svc := range cands {
				if svc.Namespace == ann.Service.Namespace && svc.Name == ann.Service.Name {
					_, how = e.announcedBy(svc, dst.Addr)
				}
			}
			if in.Node != "" && in.Node != ann.Node {
				return r, fmt.Errorf("--node %s: %s is a LoadBalancer VIP of %s (--node picks where an external IP, or a VIP no Lace node announces, enters)",
					in.Node, dst.Addr, how)
			}
			ts.Node, ts.Entry = ann.Node, "node "+ann.Node+": "+how
			if ann.Node == "" {
				ts.Entry = "none: " + how
			}
			break
		}
		var names []string
		for _, n := range in.Nodes {
			names = append(names, n.Name)
		}
		if len(names) == 0 {
			for _, u := range in.UnderlayEndpoints {
				names = append(names, uepNode(u))
			}
		}
		slices.Sort(names)
		what := "an external IP"
		if ts.Frontend == tables.FrontendLoadBalancer {
			_, how := e.announcedBy(cands[0], dst.Addr)
			what = "a LoadBalancer VIP (" + how + ")"
		}
		switch {
		case in.Node != "" && !slices.Contains(names, in.Node):
			return r, fmt.Errorf("node %s not found", in.Node)
		case in.Node != "":
			ts.Node = in.Node
			ts.Entry = fmt.Sprintf("node %s (--node): %s is %s, which enters where the network sends it", in.Node, dst.Addr, what)
		case len(names) == 0:
			return r, fmt.Errorf("no nodes: %s enters the cluster nowhere", dst.Addr)
		default:
			ts.Node = names[0]
			ts.Entry = fmt.Sprintf("node %s, the first by name: %s is %s, which enters where the network sends it (--node picks another)",
				names[0], dst.Addr, what)
		}
	}

	// The entry node's tables say which service the frontend is, and
	// what it does.
	var tab *tables.Service
	var svc *corev1.Service
	if ts.Node != "" {
		tab = e.node(ts.Node).byKey[svcKey{dst.Addr, protoNum(corev1.Protocol(strings.ToUpper(r.Proto))), r.Port}]
		if tab == nil || !tab.External() || (r.Proto != "tcp" && r.Proto != "udp") {
			var ports []string
			for _, c := range cands {
				for _, sp := range c.Spec.Ports {
					p := sp.Port
					if nodePort {
						p = sp.NodePort
					}
					if p > 0 {
						ports = append(ports, fmt.Sprintf("%s/%d %s/%s", protoName(sp.Protocol), p, c.Namespace, c.Name))
					}
				}
			}
			what := "VIP"
			if nodePort {
				what = "NodePort"
			}
			return r, fmt.Errorf("%s %s is no frontend on node %s (the %ss at %s: %s; the data plane serves TCP and UDP)",
				r.ProtoString(), dst.Addr, ts.Node, what, dst.Addr, strings.Join(ports, ", "))
		}
		for _, c := range cands {
			if slices.Contains(serviceVIPs(c), tab.ClusterIP) {
				svc = c
			}
		}
		if svc == nil {
			return r, fmt.Errorf("the frontend %s %s on node %s is of ClusterIP %s, which no service has", r.ProtoString(), dst.Addr, ts.Node, tab.ClusterIP)
		}
	} else {
		// Announced by nobody: the service it would be.
		for _, c := range cands {
			if c.Namespace == ann.Service.Namespace && c.Name == ann.Service.Name {
				svc = c
			}
		}
		if svc == nil {
			return r, fmt.Errorf("%s is announced for service %s/%s, which does not hold it", dst.Addr, ann.Service.Namespace, ann.Service.Name)
		}
	}
	name := svc.Namespace + "/" + svc.Name
	ts.Namespace, ts.Name, ts.Local = svc.Namespace, svc.Name, svc.Spec.ExternalTrafficPolicy == corev1.ServiceExternalTrafficPolicyLocal
	b, ok := e.bindings().binding(svc)
	if !ok {
		return r, fmt.Errorf("service %s is not served by Lace (%s)", name, leftAlone(svc))
	}
	if b.Err != "" {
		return r, fmt.Errorf("service %s is not served: bound to no network: %s", name, b.Err)
	}
	ts.Network, ts.NetworkFrom = b.Network, b.Policy
	dst.Kind, dst.Namespace, dst.Name, dst.Service = model.EndpointService, svc.Namespace, svc.Name, name
	dst.Network, dst.NetworkFrom, dst.Frontend = b.Network, "NetworkBindingPolicy "+b.Policy, ts.Frontend
	var sp *corev1.ServicePort
	for i := range svc.Spec.Ports {
		p := &svc.Spec.Ports[i]
		port := p.Port
		if nodePort {
			port = p.NodePort
		}
		ts.Ports = append(ts.Ports, fmt.Sprintf("%s/%d", protoName(p.Protocol), port))
		if sp == nil && protoName(p.Protocol) == r.Proto && port > 0 && uint16(port) == r.Port {
			sp = p
		}
	}
	ts.Port = r.ProtoString()
	if sp != nil && sp.Name != "" {
		ts.Port += " (" + sp.Name + ")"
	}
	if tab != nil {
		ts.ClusterIP = netip.AddrPortFrom(tab.ClusterIP, tab.ClusterPort)
	} else if sp != nil {
		for _, v := range serviceVIPs(svc) {
			if v.Is4() == dst.Addr.Is4() {
				ts.ClusterIP = netip.AddrPortFrom(v, uint16(sp.Port))
			}
		}
	}
	r.Src, r.Dst = src.TraceEndpoint, dst.TraceEndpoint

	// The verdict, in the data plane's order.
	t := e.topology()
	adm := model.Verdict{Rule: "the service has no ClusterIP of this family"}
	if ts.ClusterIP.IsValid() {
		adm = frontendAdmission(t, src.Addr, svc, ts.ClusterIP.Addr())
	}
	ts.Admitted = adm.Allowed
	v := adm
	v.Allowed = false
	cip := ts.ClusterIP.Addr()
	drop := func(reason model.DropReason) {
		v.Reason = reason
		r.Dropped = fmt.Sprintf("on node %s, %s", ts.Node, counted(string(reason)))
	}
	switch {
	case ts.Node == "":
		arp := "ARP"
		if dst.Addr.Is6() {
			arp = "NDP"
		}
		v.Rule = fmt.Sprintf("not announced: no node answers %s for %s", arp, dst.Addr)
		v.Reason = ""
		r.Dropped = fmt.Sprintf("nowhere: the flow never enters the cluster (no node answers %s for %s; no drop counter)", arp, dst.Addr)
	case tab.Closed:
		na := frontendAdmission(t, dst.Addr, svc, cip)
		v.Rule = fmt.Sprintf("NodePort closed on node %s's address %s: it is %s, which does not reach ClusterIP %s of service %s",
			ts.Node, dst.Addr, classified(na), cip, name)
		if na.SrcNetwork != "" {
			v.Rule += ": " + na.Rule
		}
		drop(dropFrontendClosed)
	case !adm.Allowed && adm.SrcNetwork == "":
		drop(adm.Reason)
	case !adm.Allowed:
		v.Rule = fmt.Sprintf("%s does not reach ClusterIP %s of service %s: %s", adm.SrcNetwork, cip, name, adm.Rule)
		drop(adm.Reason)
	case len(tab.SourceRanges) > 0 && !slices.ContainsFunc(tab.SourceRanges, func(p netip.Prefix) bool { return p.Contains(src.Addr) }):
		rs := make([]string, len(tab.SourceRanges))
		for i, p := range tab.SourceRanges {
			rs[i] = p.String()
		}
		v.Rule = fmt.Sprintf("loadBalancerSourceRanges of service %s (%s) do not hold %s", name, strings.Join(rs, ", "), src.Addr)
		drop(dropSourceRange)
	default:
		v.Allowed, v.Reason = true, ""
		v.Rule = fmt.Sprintf("%s reaches ClusterIP %s of service %s: %s", adm.SrcNetwork, cip, name, adm.Rule)
		if len(tab.SourceRanges) > 0 {
			v.Rule += "; in its loadBalancerSourceRanges"
		}
	}
	r.Verdict = v
	r.Reply = model.Verdict{Rule: "no admitted flow to reply to: " + v.Rule}
	if v.Allowed {
		r.Reply = model.Verdict{Allowed: true, Rule: "reply of a flow admitted by " + v.Rule + " (conntrack)"}
		ts.Served, ts.Drop, ts.AffinitySeconds = true, tab.Drop, tab.AffinitySeconds
		var cands []svcCandidate
		if sp != nil {
			cands = candidates(svc, *sp, cip, in.EndpointSlices)
		}
		ts.NotEligible = max(0, len(cands)-len(tab.Backends))
		for _, be := range tab.Backends {
			ts.Endpoints = append(ts.Endpoints, frontendBackend(in, r, be, cands))
		}
		ts.Translated = slices.ContainsFunc(ts.Endpoints, func(e TraceBackend) bool { return !e.Dropped })
		r.Path = frontendPath(r)
	}
	return r, nil
}

// frontendBackend says how the entry node reaches an endpoint of a
// frontend's flow (xlb_in): a pod of the service's network on the entry
// node gets it with the client's address; under externalTrafficPolicy
// Cluster, one on another node gets it from the entry node's address, over
// SRv6 in the nodes' own context; anything else is dropped.
func frontendBackend(in TraceInput, r TraceResult, be tables.Backend, cands []svcCandidate) TraceBackend {
	ts := r.Service
	tb := TraceBackend{Addr: netip.AddrPortFrom(be.Addr, be.Port)}
	for _, c := range cands {
		if c.addr == tb.Addr {
			tb.Pod, tb.Node = c.pod, c.node
		}
	}
	// A pod of the service's network holding the address says which pod
	// and node it is, whatever the slice says.
	for _, ne := range in.NetworkEndpoints {
		if ne.Spec.Network == ts.Network && slices.ContainsFunc(ne.Spec.Addresses, func(a lacev1.IPAddress) bool {
			x, err := netip.ParseAddr(string(a))
			return err == nil && x.Unmap() == be.Addr
		}) {
			tb.Pod, tb.Node = ne.Namespace+"/"+ne.Name, ne.Spec.Node
		}
	}
	pod := false // in the service network's subnet: a pod there
	for _, n := range in.Networks {
		for _, sn := range []*lacev1.Subnet{n.Spec.IPv4Subnet, n.Spec.IPv6Subnet} {
			if n.Name != ts.Network || n.Spec.Type == lacev1.NetworkTypeExternal || sn == nil {
				continue
			}
			if p, err := netip.ParsePrefix(string(sn.Prefix)); err == nil && p.Contains(be.Addr) {
				pod = true
			}
		}
	}
	entry := ts.Node
	switch {
	case pod && tb.Node == entry:
		tb.Path = fmt.Sprintf("delivered on node %s with the client's address %s", entry, r.Src.Addr)
	case ts.Local:
		tb.Dropped = true
		tb.Path = fmt.Sprintf("dropped, %s: not a pod of %s on node %s, the only ones a Local frontend delivers to", counted("no-local-endpoints"), ts.Network, entry)
	case pod && tb.Node == "":
		tb.Path = fmt.Sprintf("in the subnet of %s, on no known node: node %s translates the source to its address %s and sends it to the owner of its block",
			ts.Network, entry, nodeAddr(in, entry, be.Addr))
	case pod:
		ids := netIDs(in)
		tb.Path = fmt.Sprintf("node %s translates the source to its address %s (SNAT, reversed for the answers) and encapsulates in SRv6 to SID %s (locator of node %s, the nodes' context id %d, destination network %s id %d), node %s decapsulates and delivers: the endpoint sees node %s's address, not the client's",
			entry, nodeAddr(in, entry, be.Addr), frontendSID(in, tb.Node, ts.Network), tb.Node, tables.NodeNetID, ts.Network, ids[ts.Network], tb.Node, entry)
	default:
		tb.Dropped = true
		tb.Path = fmt.Sprintf("dropped, %s: not in the subnet of %s; an external frontend reaches the pods of the service's network only", counted(string(model.DropIsolated)), ts.Network)
	}
	return tb
}

// frontendSID is the SID an external frontend's flow is encapsulated to:
// the endpoint node's, with the nodes' context as its source network.
func frontendSID(in TraceInput, node, dstNet string) string {
	u := underlayOf(in, node)
	if u == nil {
		return fmt.Sprintf("<none: node %s has no UnderlayEndpoint>", node)
	}
	loc, err := netip.ParsePrefix(string(u.Spec.Locator))
	if err != nil {
		return fmt.Sprintf("<none: node %s has no locator in its UnderlayEndpoint>", node)
	}
	return tables.SID(loc, tables.BehaviourL3Decap, tables.NodeNetID, uint32(netIDs(in)[dstNet])).String()
}

// frontendPath says what the entry node does with an admitted flow to a
// frontend, one line after another.
func frontendPath(r TraceResult) string {
	ts := r.Service
	node := ts.Node
	switch {
	case len(ts.Endpoints) == 0 && ts.Drop:
		return fmt.Sprintf("dropped on node %s, %s: externalTrafficPolicy Local, and node %s has no ready endpoint of the service", node, counted("no-local-endpoints"), node)
	case len(ts.Endpoints) == 0:
		return fmt.Sprintf("dropped on node %s, %s: the service has no ready or serving endpoint", node, counted("no-endpoints"))
	}
	policy := "externalTrafficPolicy Cluster"
	if ts.Local {
		policy = "externalTrafficPolicy Local: this node's own"
	}
	lines := []string{fmt.Sprintf("DNAT on node %s to one of %d endpoints eligible there (%s), picked uniformly at random (1/%d each), reached in network %s:",
		node, len(ts.Endpoints), policy, len(ts.Endpoints), ts.Network)}
	if len(ts.Endpoints) == 1 {
		lines[0] = fmt.Sprintf("DNAT on node %s to the one endpoint eligible there (%s), reached in network %s:", node, policy, ts.Network)
	}
	lines = append(lines, endpointLines(ts.Endpoints)...)
	if ts.Translated {
		lines = append(lines, fmt.Sprintf("answers leave node %s from the frontend (they come from %s)", node, netip.AddrPortFrom(r.Dst.Addr, r.Port)))
	}
	if ts.AffinitySeconds > 0 {
		lines = append(lines, fmt.Sprintf("sessionAffinity ClientIP: a client keeps its endpoint for %ds", ts.AffinitySeconds))
	}
	if ts.NotEligible > 0 {
		lines = append(lines, fmt.Sprintf("%d more not eligible on node %s for the frontend (%s; lacectl services -n %s --node %s)",
			ts.NotEligible, node, policy, ts.Namespace, node))
	}
	return strings.Join(lines, "\n              ")
}

// frontendDestination is the destination line of a flow to an external
// frontend: the service, the port and the ClusterIP it admits clients as,
// and whether the client's view holds that ClusterIP.
func frontendDestination(r TraceResult) string {
	ts, v := r.Service, r.Verdict
	s := fmt.Sprintf("destination:  %s port %s", r.Dst.describe(), ts.Port)
	if ts.ClusterIP.IsValid() {
		s += fmt.Sprintf(" to ClusterIP %s", ts.ClusterIP)
	}
	s += fmt.Sprintf(", network %s (%s)", r.Dst.Network, r.Dst.NetworkFrom)
	switch {
	case v.SrcNetwork == "" || !v.DstPrefix.IsValid():
	case !ts.Admitted:
		s += fmt.Sprintf("; the ClusterIP is not in the view of %s", v.SrcNetwork)
	default:
		s += fmt.Sprintf("; the ClusterIP is view entry %s of network %s in the view of %s", v.DstPrefix, v.DstNetwork, v.SrcNetwork)
		if v.Policy != "" {
			s += " (granted by NetworkRoutingPolicy " + v.Policy + ")"
		}
		if v.ServicePolicy != "" {
			s += " (granted by ServiceRoutingPolicy " + v.ServicePolicy + ": the VIP only)"
		}
	}
	return s
}

// frontendList names where svc is reached from outside: its NodePorts,
// LoadBalancer VIPs and external IPs.
func frontendList(svc *corev1.Service) string {
	var out []string
	if svc.Spec.Type == corev1.ServiceTypeNodePort || svc.Spec.Type == corev1.ServiceTypeLoadBalancer {
		for _, sp := range svc.Spec.Ports {
			if sp.NodePort > 0 {
				out = append(out, fmt.Sprintf("NodePort %s/%d of every node address", protoName(sp.Protocol), sp.NodePort))
			}
		}
	}
	lbs, eips := frontendAddrs(svc)
	for _, a := range lbs {
		out = append(out, "LoadBalancer "+a.String())
	}
	for _, a := range eips {
		out = append(out, "external IP "+a.String())
	}
	return andList(out)
}

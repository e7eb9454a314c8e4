package lacectl

// lacectl trace through a service VIP: the oracle's verdict for the VIP
// (model.Reach with an EndpointService), then what the source's node does
// with an admitted flow: DNAT to an endpoint model.ComputeServices finds
// eligible there, reached in the service's network.

import (
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
	b, considered := computeNode("", "", nil, in.Networks, in.BindingPolicies, in.Namespaces, []corev1.Service{*svc}, nil, nil).binding(svc)
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
	if ann := svc.Annotations[annotationServiceNetwork]; ann != "" && ann != b.Network {
		dst.NetworkFrom += fmt.Sprintf("; its %s annotation still says %s", annotationServiceNetwork, ann)
	}

	// The port: the one asked, else the service's first.
	if in.Proto == "" && len(svc.Spec.Ports) > 0 {
		r.Proto, r.Port = protoName(svc.Spec.Ports[0].Protocol), uint16(svc.Spec.Ports[0].Port)
	}
	r.Src, r.Dst = src.TraceEndpoint, dst.TraceEndpoint

	// The oracle knows every service bound to a network.
	all := computeNode("", "", nil, in.Networks, in.BindingPolicies, in.Namespaces, in.Services, nil, nil)
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
			zone := ""
			for i := range in.Nodes {
				if in.Nodes[i].Name == r.Src.NodeName {
					zone = nodeZone(&in.Nodes[i])
				}
			}
			ns := computeNode(r.Src.NodeName, zone, nil, in.Networks, in.BindingPolicies, in.Namespaces, in.Services, in.EndpointSlices, in.NetworkEndpoints)
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
// judged like any outside host's (section 5, the node itself).
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
	counted := func(reason string) string {
		return fmt.Sprintf("counted as %s{%s=%q}", dpmetrics.Dropped, dpmetrics.LabelReason, reason)
	}
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
	counted := func(reason string) string {
		return fmt.Sprintf("counted as %s{%s=%q}", dpmetrics.Dropped, dpmetrics.LabelReason, reason)
	}
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

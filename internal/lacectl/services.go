package lacectl

// lacectl services: what each node does with each service port Lace
// serves. Which endpoints a node sends a new flow to is
// model.ComputeServices' answer for that node (what its agent programs);
// this file lists every endpoint of the EndpointSlices beside that answer
// and says, for the ones left out, which of section 6's rules left them
// out.

import (
	"cmp"
	"context"
	"fmt"
	"io"
	"net/netip"
	"slices"
	"strings"
	"text/tabwriter"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	lacev1 "github.com/lace-cni/lace/api/v1alpha1"
	"github.com/lace-cni/lace/internal/model"
	"github.com/lace-cni/lace/internal/tables"
)

// Annotations the controller writes on the Services it binds
// (internal/controller: AnnotationServiceNetwork, AnnotationBindingError;
// not imported, lacectl stays apart from the controller).
const (
	annotationServiceNetwork = "lace-cni.io/network"
	annotationBindingError   = "lace-cni.io/binding-error"
)

// ServicesInput is what Services reads: the API objects, already fetched,
// and what to show.
type ServicesInput struct {
	Networks         []lacev1.Network
	BindingPolicies  []lacev1.NetworkBindingPolicy
	Namespaces       []corev1.Namespace
	Nodes            []corev1.Node
	Services         []corev1.Service
	EndpointSlices   []discoveryv1.EndpointSlice
	NetworkEndpoints []lacev1.NetworkEndpoint

	// Namespace shows the services of that namespace only ("" every one).
	Namespace string
	// Node shows that node's choices only ("" every node).
	Node string
	// All lists the services Lace leaves alone too, with why.
	All bool
}

// nodeServices is one node's service tables.
type nodeServices struct {
	node, zone string
	state      model.ServiceState
	byKey      map[svcKey]*tables.Service
}

type svcKey struct {
	vip   netip.Addr
	proto uint8
	port  uint16
}

func nodeZone(n *corev1.Node) string { return n.Labels[corev1.LabelTopologyZone] }

func nsLabels(nss []corev1.Namespace) map[string]map[string]string {
	out := map[string]map[string]string{}
	for _, n := range nss {
		out[n.Name] = n.Labels
	}
	return out
}

// computeNode runs ComputeServices for one node, as its agent does.
func computeNode(node, zone string, nets []lacev1.Network, nbps []lacev1.NetworkBindingPolicy, nss []corev1.Namespace,
	svcs []corev1.Service, eps []discoveryv1.EndpointSlice, neps []lacev1.NetworkEndpoint) nodeServices {
	st := model.ComputeServices(model.ServiceInput{Node: node, Zone: zone, Networks: nets, BindingPolicies: nbps,
		Services: svcs, EndpointSlices: eps, NetworkEndpoints: neps, Namespaces: nsLabels(nss)})
	ns := nodeServices{node: node, zone: zone, state: st, byKey: map[svcKey]*tables.Service{}}
	for i := range st.Services {
		s := &st.Services[i]
		ns.byKey[svcKey{s.VIP, s.Proto, s.Port}] = s
	}
	return ns
}

func (ns nodeServices) binding(svc *corev1.Service) (model.ServiceBinding, bool) {
	for _, b := range ns.state.Bound {
		if b.Namespace == svc.Namespace && b.Name == svc.Name {
			return b, true
		}
	}
	return model.ServiceBinding{}, false
}

// excluded is the network holding addr when ComputeServices left the
// endpoint out of svc for being another network's pod.
func (ns nodeServices) excluded(svc *corev1.Service, addr netip.Addr) (model.ExcludedEndpoint, bool) {
	for _, e := range ns.state.Excluded {
		if e.Namespace == svc.Namespace && e.Service == svc.Name && e.Addr == addr {
			return e, true
		}
	}
	return model.ExcludedEndpoint{}, false
}

// leftAlone says why Lace does not serve a service that ComputeServices
// did not consider (kube-proxy's ShouldSkipService and informer filter).
func leftAlone(svc *corev1.Service) string {
	switch {
	case svc.Spec.Type == corev1.ServiceTypeExternalName:
		return "ExternalName"
	case svc.Spec.ClusterIP == corev1.ClusterIPNone:
		return "headless: clusterIP None"
	case svc.Spec.ClusterIP == "":
		return "headless: no clusterIP"
	}
	if v, ok := svc.Labels[model.LabelServiceProxyName]; ok {
		return fmt.Sprintf("%s=%s: another proxy's", model.LabelServiceProxyName, v)
	}
	return fmt.Sprintf("clusterIPs %s do not parse", strings.Join(svc.Spec.ClusterIPs, ","))
}

// serviceVIPs are the service's ClusterIPs, as kube-proxy reads them
// (clusterIPs, or clusterIP on objects from before dual-stack).
func serviceVIPs(svc *corev1.Service) []netip.Addr {
	ips := svc.Spec.ClusterIPs
	if len(ips) == 0 && svc.Spec.ClusterIP != "" {
		ips = []string{svc.Spec.ClusterIP}
	}
	var out []netip.Addr
	for _, s := range ips {
		if a, err := netip.ParseAddr(s); err == nil {
			out = append(out, a.Unmap())
		}
	}
	return out
}

func protoNum(p corev1.Protocol) uint8 {
	switch p {
	case corev1.ProtocolUDP:
		return 17
	case corev1.ProtocolSCTP:
		return 132
	}
	return 6
}

func protoName(p corev1.Protocol) string {
	return strings.ToLower(string(cmp.Or(p, corev1.ProtocolTCP)))
}

// svcCandidate is one endpoint of a service port in the EndpointSlices,
// eligible or not.
type svcCandidate struct {
	addr                        netip.AddrPort
	node, zone, pod             string
	ready, serving, terminating bool
	forNodes, forZones          []string
}

// candidates lists the endpoints of service port sp on the VIP's family as
// kube-proxy's EndpointSliceCache reads them: slices of the service
// (kubernetes.io/service-name, not another proxy's nor headless), of the
// VIP's address type, the port of the same name and protocol, the first
// address of each endpoint, once per address and port.
func candidates(svc *corev1.Service, sp corev1.ServicePort, vip netip.Addr, all []discoveryv1.EndpointSlice) []svcCandidate {
	at := discoveryv1.AddressTypeIPv4
	if vip.Is6() {
		at = discoveryv1.AddressTypeIPv6
	}
	var out []svcCandidate
	seen := map[netip.AddrPort]bool{}
	for i := range all {
		sl := &all[i]
		if sl.Namespace != svc.Namespace || sl.Labels[discoveryv1.LabelServiceName] != svc.Name || sl.AddressType != at {
			continue
		}
		if _, ok := sl.Labels[model.LabelServiceProxyName]; ok {
			continue
		}
		if _, ok := sl.Labels[corev1.IsHeadlessService]; ok {
			continue
		}
		for _, p := range sl.Ports {
			if p.Name == nil || *p.Name != sp.Name || p.Port == nil || *p.Port <= 0 || *p.Port > 65535 {
				continue
			}
			proto := corev1.ProtocolTCP
			if p.Protocol != nil && *p.Protocol != "" {
				proto = *p.Protocol
			}
			if proto != cmp.Or(sp.Protocol, corev1.ProtocolTCP) {
				continue
			}
			for _, ep := range sl.Endpoints {
				if len(ep.Addresses) == 0 {
					continue
				}
				a, err := netip.ParseAddr(ep.Addresses[0])
				if err != nil || a.Unmap().Is6() != vip.Is6() {
					continue
				}
				c := svcCandidate{addr: netip.AddrPortFrom(a.Unmap(), uint16(*p.Port)),
					ready:       ep.Conditions.Ready == nil || *ep.Conditions.Ready,
					serving:     ep.Conditions.Serving == nil || *ep.Conditions.Serving,
					terminating: ep.Conditions.Terminating != nil && *ep.Conditions.Terminating}
				if seen[c.addr] {
					continue
				}
				seen[c.addr] = true
				if ep.NodeName != nil {
					c.node = *ep.NodeName
				}
				if ep.Zone != nil {
					c.zone = *ep.Zone
				}
				if r := ep.TargetRef; r != nil && (r.Kind == "" || r.Kind == "Pod") && r.Name != "" {
					c.pod = cmp.Or(r.Namespace, sl.Namespace) + "/" + r.Name
				}
				if h := ep.Hints; h != nil {
					for _, z := range h.ForZones {
						c.forZones = append(c.forZones, z.Name)
					}
					for _, n := range h.ForNodes {
						c.forNodes = append(c.forNodes, n.Name)
					}
				}
				out = append(out, c)
			}
		}
	}
	slices.SortFunc(out, func(a, b svcCandidate) int { return a.addr.Compare(b.addr) })
	return out
}

// choice is one endpoint as one node sees it.
type choice struct {
	svcCandidate
	eligible bool
	why      string
}

// explain sets each candidate beside the backends ComputeServices chose on
// node (ts; nil when the port is not served there) and says why. The
// decision is ComputeServices'; the reasons name the rule of section 6
// that tells an endpoint left out from the chosen ones.
func explain(svc *corev1.Service, ns nodeServices, ts *tables.Service, cands []svcCandidate) []choice {
	chosen := map[netip.AddrPort]bool{}
	if ts != nil {
		for _, b := range ts.Backends {
			chosen[netip.AddrPortFrom(b.Addr, b.Port)] = true
		}
	}
	local := func(c svcCandidate) bool { return ns.node != "" && c.node == ns.node }
	itpLocal := svc.Spec.InternalTrafficPolicy != nil && *svc.Spec.InternalTrafficPolicy == corev1.ServiceInternalTrafficPolicyLocal
	closest := svc.Annotations[model.AnnotationTrafficDistribution] == model.TrafficDistributionPreferClosest
	var kept []svcCandidate
	for _, c := range cands {
		if _, out := ns.excluded(svc, c.addr.Addr()); !out {
			kept = append(kept, c)
		}
	}
	anyReady := func(keep func(svcCandidate) bool) bool {
		return slices.ContainsFunc(kept, func(c svcCandidate) bool { return c.ready && keep(c) })
	}
	all := func(svcCandidate) bool { return true }
	// What the chosen ones have in common tells the tier or hint in use.
	allChosen := func(f func(svcCandidate) bool) bool {
		n := 0
		for _, c := range kept {
			if chosen[c.addr] {
				n++
				if !f(c) {
					return false
				}
			}
		}
		return n > 0
	}
	onNode := allChosen(local)
	inZone := allChosen(func(c svcCandidate) bool { return ns.zone != "" && c.zone == ns.zone })
	hintNode := allChosen(func(c svcCandidate) bool { return slices.Contains(c.forNodes, ns.node) })
	hintZone := allChosen(func(c svcCandidate) bool { return slices.Contains(c.forZones, ns.zone) })

	out := make([]choice, 0, len(cands))
	for _, c := range cands {
		ch := choice{svcCandidate: c, eligible: chosen[c.addr]}
		e, isExcluded := ns.excluded(svc, c.addr.Addr())
		switch {
		case ch.eligible && !c.ready:
			ch.why = "serving, terminating: no ready endpoint is left (fallback)"
		case ch.eligible && itpLocal:
			ch.why = "ready, on this node (internalTrafficPolicy Local)"
		case ch.eligible && closest && onNode:
			ch.why = "ready, on this node (PreferClosest)"
		case ch.eligible && closest && inZone && anyReady(func(c svcCandidate) bool { return !inZoneOf(ns, c) }):
			ch.why = fmt.Sprintf("ready, in zone %s (PreferClosest)", ns.zone)
		case ch.eligible && !closest && hintNode && anyReady(func(c svcCandidate) bool { return !slices.Contains(c.forNodes, ns.node) }):
			ch.why = "ready, hinted for this node"
		case ch.eligible && !closest && hintZone && anyReady(func(c svcCandidate) bool { return !slices.Contains(c.forZones, ns.zone) }):
			ch.why = fmt.Sprintf("ready, hinted for zone %s", ns.zone)
		case ch.eligible:
			ch.why = "ready"
		case isExcluded:
			ch.why = fmt.Sprintf("in another network: its pod is in %s, not the service's network %s (excluded)", e.Network, e.ServiceNetwork)
		case !c.ready && !(c.serving && c.terminating):
			ch.why = "not ready"
			if c.terminating {
				ch.why = "terminating, not serving"
			}
		case itpLocal && !local(c):
			ch.why = "not local (internalTrafficPolicy Local)"
		case !c.ready && itpLocal:
			ch.why = "terminating: this node has ready local endpoints"
		case !c.ready && anyReady(all):
			ch.why = "terminating: ready endpoints exist"
		case closest && onNode:
			ch.why = "PreferClosest: not on this node, which has ready endpoints"
		case closest && inZone:
			ch.why = fmt.Sprintf("PreferClosest: not in zone %s, which has ready endpoints", cmp.Or(ns.zone, `""`))
		case hintNode && !slices.Contains(c.forNodes, ns.node):
			ch.why = fmt.Sprintf("hints: for node %s", strings.Join(c.forNodes, ", "))
		case hintZone && !slices.Contains(c.forZones, ns.zone):
			ch.why = fmt.Sprintf("other zone (hints: for zone %s)", strings.Join(c.forZones, ", "))
		case ts == nil:
			ch.why = "the port is not served"
		default:
			ch.why = "not chosen by ComputeServices"
		}
		out = append(out, ch)
	}
	return out
}

func inZoneOf(ns nodeServices, c svcCandidate) bool { return ns.zone != "" && c.zone == ns.zone }

// summary says what a new flow to the port gets on the node.
func summary(ts *tables.Service, cands int) string {
	switch {
	case ts == nil:
		return "not served"
	case len(ts.Backends) == 0 && ts.Drop:
		return "no local endpoint (internalTrafficPolicy Local): dropped (no-local-endpoints)"
	case len(ts.Backends) == 0:
		return "no endpoints: rejected, ICMP port unreachable (no-endpoints)"
	}
	s := fmt.Sprintf("%d of %d endpoints eligible, one picked uniformly at random per new flow", len(ts.Backends), cands)
	if len(ts.Backends) == 1 {
		s = fmt.Sprintf("1 of %d endpoints eligible, every new flow goes to it", cands)
	}
	if ts.AffinitySeconds > 0 {
		s += fmt.Sprintf("; sessionAffinity ClientIP keeps a client's pick for %ds", ts.AffinitySeconds)
	}
	return s
}

// PrintServices writes, per service Lace serves (namespace/name order):
// its network and VIPs, and per port, VIP and node the endpoints with
// whether that node sends new flows to them and why.
func PrintServices(out io.Writer, in ServicesInput) error {
	nodes := append([]corev1.Node(nil), in.Nodes...)
	slices.SortFunc(nodes, func(a, b corev1.Node) int { return cmp.Compare(a.Name, b.Name) })
	if in.Node != "" {
		nodes = slices.DeleteFunc(nodes, func(n corev1.Node) bool { return n.Name != in.Node })
		if len(nodes) == 0 {
			return fmt.Errorf("node %s not found", in.Node)
		}
	}
	// Every service goes in, whatever the namespace shown: ComputeServices
	// reads them all, and its answer for one does not depend on the others.
	var perNode []nodeServices
	for i := range nodes {
		perNode = append(perNode, computeNode(nodes[i].Name, nodeZone(&nodes[i]), in.Networks, in.BindingPolicies, in.Namespaces,
			in.Services, in.EndpointSlices, in.NetworkEndpoints))
	}
	// The binding does not depend on the node.
	anyNode := computeNode("", "", in.Networks, in.BindingPolicies, in.Namespaces, in.Services, nil, nil)

	svcs := make([]*corev1.Service, 0, len(in.Services))
	for i := range in.Services {
		if in.Namespace == "" || in.Services[i].Namespace == in.Namespace {
			svcs = append(svcs, &in.Services[i])
		}
	}
	slices.SortFunc(svcs, func(a, b *corev1.Service) int {
		return cmp.Or(cmp.Compare(a.Namespace, b.Namespace), cmp.Compare(a.Name, b.Name))
	})

	tw := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
	shown := 0
	for _, svc := range svcs {
		name := svc.Namespace + "/" + svc.Name
		b, considered := anyNode.binding(svc)
		if !considered {
			if in.All {
				fmt.Fprintf(tw, "%s  not served by Lace (%s)\n", name, leftAlone(svc))
				shown++
			}
			continue
		}
		shown++
		ann, annErr := svc.Annotations[annotationServiceNetwork], svc.Annotations[annotationBindingError]
		if b.Err != "" {
			fmt.Fprintf(tw, "%s  not served: bound to no network: %s\n", name, b.Err)
			if annErr != "" && annErr != b.Err {
				fmt.Fprintf(tw, "  the controller wrote %s: %s\n", annotationBindingError, annErr)
			}
			continue
		}
		network, from := b.Network, fmt.Sprintf("NetworkBindingPolicy %s; not annotated by the controller yet", b.Policy)
		if ann != "" {
			network, from = ann, annotationServiceNetwork
		}
		fmt.Fprintf(tw, "%s  network %s (%s)  VIPs %s\n", name, network, from, joinAddrs(serviceVIPs(svc)))
		if ann != "" && ann != b.Network {
			fmt.Fprintf(tw, "  note: the binding policies now give network %s (NetworkBindingPolicy %s), where the agents serve it; the annotation is behind\n",
				b.Network, b.Policy)
		}
		if annErr != "" {
			fmt.Fprintf(tw, "  note: the controller wrote %s: %s (now bound: the annotation is behind)\n", annotationBindingError, annErr)
		}
		if len(perNode) == 0 {
			fmt.Fprintln(tw, "  no nodes")
			continue
		}
		for _, sp := range svc.Spec.Ports {
			for _, vip := range serviceVIPs(svc) {
				k := svcKey{vip, protoNum(sp.Protocol), uint16(sp.Port)}
				if _, ok := perNode[0].byKey[k]; !ok {
					continue // not served (the binding is the same on every node)
				}
				port := fmt.Sprintf("%s/%d", protoName(sp.Protocol), sp.Port)
				if sp.Name != "" {
					port += " (" + sp.Name + ")"
				}
				fmt.Fprintf(tw, "  %s on %s\n", port, vip)
				cands := candidates(svc, sp, vip, in.EndpointSlices)
				// Nodes that make the same choices for the same reasons
				// are shown once.
				var groups []nodeGroup
				for _, ns := range perNode {
					ts := ns.byKey[k]
					block := summary(ts, len(cands)) + "\n"
					for _, ch := range explain(svc, ns, ts, cands) {
						verdict := "eligible"
						if !ch.eligible {
							verdict = "not eligible"
						}
						block += fmt.Sprintf("      %s\t%s\t%s\t%s: %s\n", ch.addr, dash(ch.node), dash(ch.pod), verdict, ch.why)
					}
					name := ns.node
					if ns.zone != "" {
						name += " (zone " + ns.zone + ")"
					}
					if i := slices.IndexFunc(groups, func(g nodeGroup) bool { return g.block == block }); i >= 0 {
						groups[i].nodes = append(groups[i].nodes, name)
					} else {
						groups = append(groups, nodeGroup{nodes: []string{name}, block: block})
					}
				}
				for _, g := range groups {
					switch {
					case len(groups) == 1 && len(perNode) > 1:
						fmt.Fprintf(tw, "    every node: %s", g.block)
					case len(g.nodes) == 1:
						fmt.Fprintf(tw, "    node %s: %s", g.nodes[0], g.block)
					default:
						fmt.Fprintf(tw, "    nodes %s: %s", strings.Join(g.nodes, ", "), g.block)
					}
				}
			}
		}
	}
	if shown == 0 {
		where := "in any namespace"
		if in.Namespace != "" {
			where = "in namespace " + in.Namespace
		}
		fmt.Fprintf(tw, "no services %s\n", where)
	}
	return tw.Flush()
}

// nodeGroup is nodes whose choices for one service port and VIP read the
// same.
type nodeGroup struct {
	nodes []string
	block string
}

func joinAddrs(as []netip.Addr) string {
	s := make([]string, len(as))
	for i, a := range as {
		s[i] = a.String()
	}
	return strings.Join(s, ", ")
}

// ReadServicesInput lists what Services reads: the services and
// EndpointSlices of in.Namespace (every namespace when empty), and every
// network, binding policy, namespace, node and NetworkEndpoint (an
// endpoint's network is known by the pods of every namespace).
func ReadServicesInput(ctx context.Context, c client.Client, in *ServicesInput) error {
	var nets lacev1.NetworkList
	var nbps lacev1.NetworkBindingPolicyList
	var nss corev1.NamespaceList
	var nodes corev1.NodeList
	var neps lacev1.NetworkEndpointList
	for _, l := range []client.ObjectList{&nets, &nbps, &nss, &nodes, &neps} {
		if err := c.List(ctx, l); err != nil {
			return fmt.Errorf("list %T: %w", l, err)
		}
	}
	var svcs corev1.ServiceList
	var eps discoveryv1.EndpointSliceList
	for _, l := range []client.ObjectList{&svcs, &eps} {
		if err := c.List(ctx, l, client.InNamespace(in.Namespace)); err != nil {
			return fmt.Errorf("list %T: %w", l, err)
		}
	}
	in.Networks, in.BindingPolicies, in.Namespaces, in.Nodes, in.NetworkEndpoints = nets.Items, nbps.Items, nss.Items, nodes.Items, neps.Items
	in.Services, in.EndpointSlices = svcs.Items, eps.Items
	return nil
}

// ServicesCommand reads the cluster and prints its services.
func ServicesCommand(ctx context.Context, c client.Client, in ServicesInput, out io.Writer) error {
	if err := ReadServicesInput(ctx, c, &in); err != nil {
		return err
	}
	return PrintServices(out, in)
}

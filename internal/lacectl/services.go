package lacectl

// lacectl services: what each node does with each service port Lace
// serves. Which endpoints a node sends a new flow to is
// model.ComputeDesired's answer for that node (what its agent programs);
// this file lists every endpoint of the EndpointSlices beside that answer
// and says, for the ones left out, which rule of docs/services.md ("Which
// endpoints get new flows") left them out.

import (
	"cmp"
	"context"
	"fmt"
	"io"
	"net/netip"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	lacev1 "github.com/lace-cni/lace/api/v1alpha1"
	"github.com/lace-cni/lace/internal/model"
	"github.com/lace-cni/lace/internal/tables"
)

// agentLeasePrefix names the agents' heartbeat Leases (internal/agent
// AgentLeaseName; not imported, lacectl stays apart from the agent).
const agentLeasePrefix = "lace-agent-"

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
	// The external frontends also read the nodes' addresses (where
	// NodePorts are served), the policies (whether a node address's
	// external network reaches a service), the LoadBalancer classes and
	// the agents' Leases (who announces a VIP) at Now.
	UnderlayEndpoints      []lacev1.UnderlayEndpoint
	RoutingPolicies        []lacev1.NetworkRoutingPolicy
	ServiceRoutingPolicies []lacev1.ServiceRoutingPolicy
	Classes                []lacev1.LoadBalancerClass
	Leases                 []coordinationv1.Lease
	Now                    time.Time

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
	// addrs are where its NodePorts are served.
	addrs []netip.Addr
	state model.ServiceState
	byKey map[svcKey]*tables.Service
}

type svcKey struct {
	vip   netip.Addr
	proto uint8
	port  uint16
}

func nsLabels(nss []corev1.Namespace) map[string]map[string]string {
	out := map[string]map[string]string{}
	for _, n := range nss {
		out[n.Name] = n.Labels
	}
	return out
}

// serviceBindings is every service's binding, which does not depend on
// the node: ComputeServices for no node, with no endpoints.
func serviceBindings(nets []lacev1.Network, nbps []lacev1.NetworkBindingPolicy, nss []corev1.Namespace, svcs []corev1.Service) nodeServices {
	ns := nodeServices{state: model.ComputeServices(model.ServiceInput{Networks: nets, BindingPolicies: nbps, Services: svcs,
		Namespaces: nsLabels(nss), AllowedExternalIPs: allowedExternalIPs(svcs)})}
	ns.index()
	return ns
}

// allowedExternalIPs is the cluster's allow-list of external IPs as far as
// the Services show it (lacectl cannot read the agents' flags): every
// external IP the controller has not reported outside it.
func allowedExternalIPs(svcs []corev1.Service) []netip.Prefix {
	var out []netip.Prefix
	for i := range svcs {
		report := svcs[i].Annotations[lacev1.AnnotationExternalIPProblem]
		for _, s := range svcs[i].Spec.ExternalIPs {
			a, err := netip.ParseAddr(s)
			if err != nil || strings.Contains(report, s+" ("+model.ExternalIPReasonNotAllowed) {
				continue
			}
			out = append(out, netip.PrefixFrom(a.Unmap(), a.Unmap().BitLen()))
		}
	}
	return out
}

func (ns *nodeServices) index() {
	ns.byKey = make(map[svcKey]*tables.Service, len(ns.state.Services))
	for i := range ns.state.Services {
		s := &ns.state.Services[i]
		ns.byKey[svcKey{s.VIP, s.Proto, s.Port}] = s
	}
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

// protoNum is p's IP protocol number (the API admits no other protocol).
func protoNum(p corev1.Protocol) uint8 {
	n, _ := model.IPProto(p)
	return n
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
// decision is ComputeServices'; the reasons name the rule of
// docs/services.md that tells an endpoint left out from the chosen ones.
func explain(svc *corev1.Service, ns nodeServices, ts *tables.Service, cands []svcCandidate) []choice {
	chosen := map[netip.AddrPort]bool{}
	if ts != nil {
		for _, b := range ts.Backends {
			chosen[netip.AddrPortFrom(b.Addr, b.Port)] = true
		}
	}
	local := func(c svcCandidate) bool { return ns.node != "" && c.node == ns.node }
	itpLocal := svc.Spec.InternalTrafficPolicy != nil && *svc.Spec.InternalTrafficPolicy == corev1.ServiceInternalTrafficPolicyLocal
	closest := svc.Annotations[lacev1.AnnotationTrafficDistribution] == model.TrafficDistributionPreferClosest
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
		case isExcluded && e.Refused != "":
			ch.why = e.Refused + " (excluded)"
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
	e := in.env()
	var perNode []*nodeServices
	for i := range nodes {
		perNode = append(perNode, e.node(nodes[i].Name))
	}
	// The binding does not depend on the node.
	anyNode := e.bindings()

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
		ann, annErr := svc.Annotations[lacev1.AnnotationServiceNetwork], svc.Annotations[lacev1.AnnotationBindingError]
		if b.Err != "" {
			fmt.Fprintf(tw, "%s  not served: bound to no network: %s\n", name, b.Err)
			if annErr != "" && annErr != b.Err {
				fmt.Fprintf(tw, "  the controller wrote %s: %s\n", lacev1.AnnotationBindingError, annErr)
			}
			continue
		}
		network, from := b.Network, fmt.Sprintf("NetworkBindingPolicy %s; not annotated by the controller yet", b.Policy)
		if ann != "" {
			network, from = ann, lacev1.AnnotationServiceNetwork
		}
		fmt.Fprintf(tw, "%s  network %s (%s)  VIPs %s\n", name, network, from, joinAddrs(serviceVIPs(svc)))
		if ann != "" && ann != b.Network {
			fmt.Fprintf(tw, "  note: the binding policies now give network %s (NetworkBindingPolicy %s), where the agents serve it; the annotation is behind\n",
				b.Network, b.Policy)
		}
		if annErr != "" {
			fmt.Fprintf(tw, "  note: the controller wrote %s: %s (now bound: the annotation is behind)\n", lacev1.AnnotationBindingError, annErr)
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
					for _, ch := range explain(svc, *ns, ts, cands) {
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
		if hasFrontends(svc) {
			printFrontends(tw, e, svc, perNode)
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
// endpoint's network is known by the pods of every namespace); for the
// external frontends, every UnderlayEndpoint, routing policy and
// LoadBalancerClass, and the agents' heartbeat Leases (by their label, in
// whichever namespace the agents run).
func ReadServicesInput(ctx context.Context, c client.Client, in *ServicesInput) error {
	var nets lacev1.NetworkList
	var nbps lacev1.NetworkBindingPolicyList
	var nss corev1.NamespaceList
	var nodes corev1.NodeList
	var neps lacev1.NetworkEndpointList
	var ueps lacev1.UnderlayEndpointList
	var nrps lacev1.NetworkRoutingPolicyList
	var srps lacev1.ServiceRoutingPolicyList
	var classes lacev1.LoadBalancerClassList
	for _, l := range []client.ObjectList{&nets, &nbps, &nss, &nodes, &neps, &ueps, &nrps, &srps, &classes} {
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
	leases, err := readAgentLeases(ctx, c)
	if err != nil {
		return err
	}
	in.Networks, in.BindingPolicies, in.Namespaces, in.Nodes, in.NetworkEndpoints = nets.Items, nbps.Items, nss.Items, nodes.Items, neps.Items
	in.Services, in.EndpointSlices = svcs.Items, eps.Items
	in.UnderlayEndpoints, in.RoutingPolicies, in.ServiceRoutingPolicies = ueps.Items, nrps.Items, srps.Items
	in.Classes, in.Leases = classes.Items, leases
	return nil
}

// readAgentLeases lists the agents' heartbeat Leases.
func readAgentLeases(ctx context.Context, c client.Client) ([]coordinationv1.Lease, error) {
	var leases coordinationv1.LeaseList
	if err := c.List(ctx, &leases, client.MatchingLabels{lacev1.LabelAgentLease: "true"}); err != nil {
		return nil, fmt.Errorf("list the agents' leases: %w", err)
	}
	return leases.Items, nil
}

// ServicesCommand reads the cluster and prints its services; the agents
// alive are those alive at in.Now, or now.
func ServicesCommand(ctx context.Context, c client.Client, in ServicesInput, out io.Writer) error {
	if err := ReadServicesInput(ctx, c, &in); err != nil {
		return err
	}
	if in.Now.IsZero() {
		in.Now = time.Now()
	}
	return PrintServices(out, in)
}

// External frontends: NodePorts, LoadBalancer VIPs, external IPs.

// svcEnv is what the services and trace views compute frontends from: the
// API objects, and each node's service tables as its agent computes them
// (NodePorts gated), made on first use.
type svcEnv struct {
	networks []lacev1.Network
	nbps     []lacev1.NetworkBindingPolicy
	nss      []corev1.Namespace
	nodes    []corev1.Node
	svcs     []corev1.Service
	eps      []discoveryv1.EndpointSlice
	neps     []lacev1.NetworkEndpoint
	ueps     []lacev1.UnderlayEndpoint // as written: ComputeDesired accepts them
	nrps     []lacev1.NetworkRoutingPolicy
	srps     []lacev1.ServiceRoutingPolicy
	classes  []lacev1.LoadBalancerClass
	leases   []coordinationv1.Lease
	now      time.Time

	svcPtrs []*corev1.Service
	epPtrs  []*discoveryv1.EndpointSlice
	byNode  map[string]*nodeServices
	bound   *nodeServices
	topo    *model.Topology
	anns    map[netip.Addr]model.Announcement
}

func (in ServicesInput) env() *svcEnv {
	// Only the underlay addresses the agents believe are read
	// (model.ComputeDesired accepts them), not all a node wrote.
	return &svcEnv{networks: in.Networks, nbps: in.BindingPolicies, nss: in.Namespaces, nodes: in.Nodes, svcs: in.Services,
		eps: in.EndpointSlices, neps: in.NetworkEndpoints, ueps: in.UnderlayEndpoints, nrps: in.RoutingPolicies,
		srps: in.ServiceRoutingPolicies, classes: in.Classes, leases: in.Leases, now: in.Now}
}

// node is the service tables of node as its agent computes them
// (model.ComputeDesired, from the objects lacectl reads: the node's
// addresses from its UnderlayEndpoint; no hostNetwork pods, so endpoints
// at node addresses are shown as the slices say).
func (e *svcEnv) node(name string) *nodeServices {
	if ns, ok := e.byNode[name]; ok {
		return ns
	}
	if e.svcPtrs == nil {
		e.svcPtrs, e.epPtrs = ptrs(e.svcs), ptrs(e.eps)
	}
	d, err := model.ComputeDesired(model.DesiredInput{Node: name, Networks: e.networks, RoutingPolicies: e.nrps,
		ServiceRoutingPolicies: e.srps, BindingPolicies: e.nbps, NetworkEndpoints: e.neps, Namespaces: nsLabels(e.nss),
		Nodes: e.nodes, LoadBalancerClasses: e.classes, Underlays: e.ueps, Services: e.svcPtrs, EndpointSlices: e.epPtrs,
		AddrsFromUnderlay: true, AllowedExternalIPs: allowedExternalIPs(e.svcs)})
	if err != nil {
		panic(err) // no stage that fails is set
	}
	st := d.Services
	st.Services = d.NodeState.Services
	ns := nodeServices{node: name, zone: d.Zone, addrs: d.NodeAddrs, state: st}
	ns.index()
	if e.byNode == nil {
		e.byNode = map[string]*nodeServices{}
	}
	e.byNode[name] = &ns
	return &ns
}

// ptrs points at each item.
func ptrs[T any](items []T) []*T {
	out := make([]*T, len(items))
	for i := range items {
		out[i] = &items[i]
	}
	return out
}

// bindings is every service's binding (which does not depend on the
// node).
func (e *svcEnv) bindings() *nodeServices {
	if e.bound == nil {
		ns := serviceBindings(e.networks, e.nbps, e.nss, e.svcs)
		e.bound = &ns
	}
	return e.bound
}

// topology is what the oracle reads, with every service bound to a
// network.
func (e *svcEnv) topology() model.Topology {
	if e.topo == nil {
		t := model.Topology{Networks: e.networks, RoutingPolicies: e.nrps, ServiceRoutingPolicies: e.srps, Namespaces: nsLabels(e.nss)}
		for i := range e.svcs {
			s := &e.svcs[i]
			if sb, ok := e.bindings().binding(s); ok && sb.Err == "" {
				t.Services = append(t.Services, model.BoundService{Namespace: s.Namespace, Name: s.Name, Network: sb.Network, VIPs: serviceVIPs(s)})
			}
		}
		e.topo = &t
	}
	return *e.topo
}

// announcements are the announcers of the Lace LoadBalancer VIPs, as
// every agent decides them (model.Announcements), from the agents alive
// at e.now.
func (e *svcEnv) announcements() map[netip.Addr]model.Announcement {
	if e.anns == nil {
		in := model.AnnounceInput{Classes: e.classes, Alive: aliveAgents(e.leases, e.now)}
		for i := range e.svcs {
			in.Services = append(in.Services, &e.svcs[i])
		}
		for i := range e.eps {
			in.Slices = append(in.Slices, &e.eps[i])
		}
		for i := range e.nodes {
			in.Nodes = append(in.Nodes, &e.nodes[i])
		}
		e.anns = map[netip.Addr]model.Announcement{}
		for _, a := range model.Announcements(in) {
			e.anns[a.VIP] = a
		}
	}
	return e.anns
}

// aliveAgents are the nodes whose agent's heartbeat Lease (lace-agent-NODE,
// labelled lace-cni.io/agent-lease=true) was renewed within its duration
// at now. The agents time a renewal by their own clocks when they see it;
// lacectl, which sees it once, by the renewTime written.
func aliveAgents(leases []coordinationv1.Lease, now time.Time) map[string]bool {
	out := map[string]bool{}
	for _, l := range leases {
		node, ok := strings.CutPrefix(l.Name, agentLeasePrefix)
		if !ok || l.Labels[lacev1.LabelAgentLease] != "true" || l.Spec.RenewTime == nil || l.Spec.LeaseDurationSeconds == nil {
			continue
		}
		if h := l.Spec.HolderIdentity; h != nil && *h != "" {
			node = *h
		}
		if l.Spec.RenewTime.Add(time.Duration(*l.Spec.LeaseDurationSeconds) * time.Second).After(now) {
			out[node] = true
		}
	}
	return out
}

// lbClassOf is the LoadBalancerClass a Service names, as the model reads
// it: lace-cni.io/NAME is Lace's class NAME, no class the single default
// Lace class (none when there is not exactly one), anything else another
// implementation's.
func lbClassOf(svc *corev1.Service, classes []lacev1.LoadBalancerClass) (name string, lace bool) {
	if c := svc.Spec.LoadBalancerClass; c != nil {
		if n, ok := strings.CutPrefix(*c, lacev1.LoadBalancerClassPrefix); ok {
			return n, true
		}
		return *c, false
	}
	var defaults []string
	for _, c := range classes {
		if c.Spec.Default {
			defaults = append(defaults, c.Name)
		}
	}
	if len(defaults) == 1 {
		return defaults[0], true
	}
	return "", false
}

// announcedBy says which node answers ARP/NDP for a LoadBalancer VIP of
// svc, and why: the node ("" for none) and the words.
func (e *svcEnv) announcedBy(svc *corev1.Service, vip netip.Addr) (string, string) {
	a, ok := e.announcements()[vip]
	if ok && (a.Service.Namespace != svc.Namespace || a.Service.Name != svc.Name) {
		return "", fmt.Sprintf("class %s: announced for service %s/%s, which holds it too", a.Class, a.Service.Namespace, a.Service.Name)
	}
	if !ok {
		class, lace := lbClassOf(svc, e.classes)
		exists := slices.ContainsFunc(e.classes, func(c lacev1.LoadBalancerClass) bool { return c.Name == class })
		switch {
		case lace && exists:
			return "", fmt.Sprintf("class %s: not in its pool, announced by no Lace node", class)
		case lace:
			return "", fmt.Sprintf("class %s, which does not exist: announced by no Lace node", class)
		case class != "":
			return "", fmt.Sprintf("class %s, not Lace's: announced by no Lace node", class)
		}
		return "", "no LoadBalancerClass (Lace has no single default class): announced by no Lace node"
	}
	what := []string{"alive"}
	for _, c := range e.classes {
		if c.Name == a.Class && c.Spec.NodeSelector != nil {
			what = append(what, fmt.Sprintf("selected by class %s", a.Class))
		}
	}
	if svc.Spec.ExternalTrafficPolicy == corev1.ServiceExternalTrafficPolicyLocal {
		what = append(what, "holding a ready endpoint (externalTrafficPolicy Local)")
	}
	if a.Node == "" {
		return "", fmt.Sprintf("class %s, announced by none eligible: no node is %s", a.Class, andList(what))
	}
	n := "nodes"
	if a.Eligible == 1 {
		n = "node"
	}
	return a.Node, fmt.Sprintf("class %s, announced by node %s (rendezvous among %d eligible %s: %s)", a.Class, a.Node, a.Eligible, n, andList(what))
}

// andList joins words as a sentence does: a, b and c.
func andList(words []string) string {
	if len(words) < 2 {
		return strings.Join(words, "")
	}
	return strings.Join(words[:len(words)-1], ", ") + " and " + words[len(words)-1]
}

// frontendAdmission is whether a client at src is admitted to a frontend
// of svc: when its view reaches the service's ClusterIP (docs/services.md,
// "Reached from outside"), for
// an outside client the view of the external network its address
// classifies into. The oracle answers that as it does for a node's
// sockets, which it judges as any outside host classified by its address;
// an address no external network covers is asked as an outside source, so
// that the rule and the counter are the data plane's (unclassified-source).
func frontendAdmission(t model.Topology, src netip.Addr, svc *corev1.Service, clusterIP netip.Addr) model.Verdict {
	dst := model.Endpoint{Kind: model.EndpointService, Namespace: svc.Namespace, Name: svc.Name, Addr: clusterIP}
	if v := model.Reach(t, model.Endpoint{Kind: model.EndpointOutside, Addr: src}, dst, "", 0); v.Reason == model.DropUnclassified {
		return v
	}
	return model.Reach(t, model.Endpoint{Kind: model.EndpointNode, Addr: src}, dst, "", 0)
}

func classified(v model.Verdict) string {
	if v.SrcNetwork == "" {
		return "in no external network"
	}
	return fmt.Sprintf("classified into %s by %s", v.SrcNetwork, v.SrcPrefix)
}

// hasFrontends: the service is reached from outside too.
func hasFrontends(svc *corev1.Service) bool {
	return svc.Spec.Type == corev1.ServiceTypeNodePort || svc.Spec.Type == corev1.ServiceTypeLoadBalancer || len(svc.Spec.ExternalIPs) > 0
}

func portLabel(sp corev1.ServicePort, port int32) string {
	s := fmt.Sprintf("%s/%d", protoName(sp.Protocol), port)
	if sp.Name != "" {
		s += " (" + sp.Name + ")"
	}
	return s
}

// frontendSummary says what a new flow to a frontend gets on a node (ts:
// its entry there, nil when the node does not serve it).
func frontendSummary(ts *tables.Service) string {
	switch {
	case ts == nil:
		return "not served"
	case len(ts.Backends) == 0 && ts.Drop:
		return "no local endpoint: dropped (no-local-endpoints)"
	case len(ts.Backends) == 0:
		return "no endpoints: dropped (no-endpoints)"
	case ts.Local:
		as := make([]string, len(ts.Backends))
		for i, b := range ts.Backends {
			as[i] = netip.AddrPortFrom(b.Addr, b.Port).String()
		}
		return "local endpoints " + strings.Join(as, ", ")
	case len(ts.Backends) == 1:
		return "1 endpoint eligible"
	}
	return fmt.Sprintf("%d endpoints eligible", len(ts.Backends))
}

// perNodeSummary groups the nodes by what a flow to the frontend at key
// gets there.
func perNodeSummary(shown []*nodeServices, key svcKey, clusterIP netip.Addr) string {
	var groups []nodeGroup
	for _, ns := range shown {
		ts := ns.byKey[key]
		if ts != nil && ts.ClusterIP != clusterIP {
			ts = nil // another service's
		}
		block := frontendSummary(ts)
		if i := slices.IndexFunc(groups, func(g nodeGroup) bool { return g.block == block }); i >= 0 {
			groups[i].nodes = append(groups[i].nodes, ns.node)
		} else {
			groups = append(groups, nodeGroup{nodes: []string{ns.node}, block: block})
		}
	}
	var out []string
	for _, g := range groups {
		switch {
		case len(groups) == 1 && len(shown) > 1:
			out = append(out, "every node: "+g.block)
		case len(g.nodes) == 1:
			out = append(out, "node "+g.nodes[0]+": "+g.block)
		default:
			out = append(out, "nodes "+strings.Join(g.nodes, ", ")+": "+g.block)
		}
	}
	return strings.Join(out, "; ")
}

// printFrontends writes how svc is reached from outside: its
// externalTrafficPolicy, healthCheckNodePort and source ranges, its
// NodePorts on each shown node's address (open or closed, and why), its
// LoadBalancer VIPs with their announcers, and its external IPs.
func printFrontends(tw io.Writer, e *svcEnv, svc *corev1.Service, shown []*nodeServices) {
	local := svc.Spec.ExternalTrafficPolicy == corev1.ServiceExternalTrafficPolicyLocal
	lb := svc.Spec.Type == corev1.ServiceTypeLoadBalancer
	policy := "externalTrafficPolicy Cluster: to any eligible endpoint, one on another node sees the entry node's address"
	if local {
		policy = "externalTrafficPolicy Local: to the entry node's own endpoints only, which see the client's address"
	}
	fmt.Fprintf(tw, "  from outside (type %s): admitted when the client's external network reaches the ClusterIP; %s\n", svc.Spec.Type, policy)
	if lb {
		hc := svc.Spec.HealthCheckNodePort
		switch {
		case !local:
			fmt.Fprintln(tw, "  healthCheckNodePort: none (externalTrafficPolicy Cluster)")
		case hc <= 0:
			fmt.Fprintln(tw, "  healthCheckNodePort: none allocated")
		default:
			var groups []nodeGroup
			for _, ns := range shown {
				block := "does not answer it"
				for _, h := range ns.state.HealthChecks {
					switch {
					case h.Port != uint16(hc):
					case h.Namespace != svc.Namespace || h.Name != svc.Name:
						block = fmt.Sprintf("answers it for service %s/%s", h.Namespace, h.Name)
					case h.LocalEndpoints == 0:
						block = "503 (no ready local endpoint)"
					case h.LocalEndpoints == 1:
						block = "200 (1 ready local endpoint)"
					default:
						block = fmt.Sprintf("200 (%d ready local endpoints)", h.LocalEndpoints)
					}
				}
				if i := slices.IndexFunc(groups, func(g nodeGroup) bool { return g.block == block }); i >= 0 {
					groups[i].nodes = append(groups[i].nodes, ns.node)
				} else {
					groups = append(groups, nodeGroup{nodes: []string{ns.node}, block: block})
				}
			}
			var parts []string
			for _, g := range groups {
				parts = append(parts, fmt.Sprintf("%s %s", strings.Join(g.nodes, ", "), g.block))
			}
			fmt.Fprintf(tw, "  healthCheckNodePort %d: %s\n", hc, strings.Join(parts, "; "))
		}
	}
	if r := svc.Spec.LoadBalancerSourceRanges; len(r) > 0 && (lb || len(svc.Spec.ExternalIPs) > 0) {
		fmt.Fprintf(tw, "  loadBalancerSourceRanges %s: other clients of its LoadBalancer VIPs and external IPs (not its NodePorts) are dropped (source-range)\n",
			strings.Join(r, ", "))
	}
	vips := serviceVIPs(svc)
	ofFamily := func(a netip.Addr) (netip.Addr, bool) {
		i := slices.IndexFunc(vips, func(v netip.Addr) bool { return v.Is4() == a.Is4() })
		if i < 0 {
			return netip.Addr{}, false
		}
		return vips[i], true
	}

	// NodePorts, on each shown node's address of each ClusterIP's family.
	if svc.Spec.Type == corev1.ServiceTypeNodePort || lb {
		t := e.topology()
		for _, sp := range svc.Spec.Ports {
			if sp.NodePort <= 0 {
				fmt.Fprintf(tw, "  NodePort: none for %s (allocateLoadBalancerNodePorts false)\n", portLabel(sp, sp.Port))
				continue
			}
			for _, vip := range vips {
				fmt.Fprintf(tw, "  NodePort %s to %s\n", portLabel(sp, sp.NodePort), netip.AddrPortFrom(vip, uint16(sp.Port)))
				// Node addresses that read the same are shown once.
				var groups []nodeGroup
				add := func(name, block string) {
					if i := slices.IndexFunc(groups, func(g nodeGroup) bool { return g.block == block }); i >= 0 {
						groups[i].nodes = append(groups[i].nodes, name)
					} else {
						groups = append(groups, nodeGroup{nodes: []string{name}, block: block})
					}
				}
				for _, ns := range shown {
					var addrs []netip.Addr
					for _, a := range ns.addrs {
						if a.Is4() == vip.Is4() {
							addrs = append(addrs, a)
						}
					}
					if len(addrs) == 0 {
						add(ns.node, fmt.Sprintf("not served: no %s address in its UnderlayEndpoint", family(vip.Is6())))
					}
					for _, a := range addrs {
						ts := ns.byKey[svcKey{a, protoNum(sp.Protocol), uint16(sp.NodePort)}]
						add(ns.node+" "+a.String(), nodePortState(t, svc, vip, a, ts))
					}
				}
				for _, g := range groups {
					fmt.Fprintf(tw, "    %s: %s\n", strings.Join(g.nodes, ", "), g.block)
				}
			}
		}
	}

	// LoadBalancer VIPs, served where they are announced.
	if lb {
		for _, ing := range svc.Status.LoadBalancer.Ingress {
			a, err := netip.ParseAddr(ing.IP)
			if err != nil {
				continue
			}
			a = a.Unmap()
			if ing.IPMode != nil && *ing.IPMode == corev1.LoadBalancerIPModeProxy {
				fmt.Fprintf(tw, "  LoadBalancer %s: ipMode Proxy, not served by Lace (clients go through the load balancer)\n", a)
				continue
			}
			node, how := e.announcedBy(svc, a)
			fmt.Fprintf(tw, "  LoadBalancer %s: %s\n", a, how)
			vip, ok := ofFamily(a)
			if !ok {
				fmt.Fprintf(tw, "    not served: the service has no %s ClusterIP\n", family(a.Is6()))
				continue
			}
			for _, sp := range svc.Spec.Ports {
				k := svcKey{a, protoNum(sp.Protocol), uint16(sp.Port)}
				var what string
				switch _, lace := e.announcements()[a]; {
				case node != "":
					ts := e.node(node).byKey[k]
					if ts != nil && ts.ClusterIP != vip {
						ts = nil
					}
					what = fmt.Sprintf("on node %s: %s", node, frontendSummary(ts))
				case lace:
					what = "no node answers for it"
				default:
					what = perNodeSummary(shown, k, vip)
				}
				fmt.Fprintf(tw, "    %s to %s: %s\n", portLabel(sp, sp.Port), netip.AddrPortFrom(vip, uint16(sp.Port)), what)
			}
		}
	}

	// External IPs: routed to the nodes by the network, not announced.
	for _, s := range svc.Spec.ExternalIPs {
		a, err := netip.ParseAddr(s)
		if err != nil {
			continue
		}
		a = a.Unmap()
		fmt.Fprintf(tw, "  external IP %s: announced by no Lace node; served by the node the network sends it to\n", a)
		if report := svc.Annotations[lacev1.AnnotationExternalIPProblem]; strings.Contains(report, s+" (") {
			fmt.Fprintf(tw, "    not served: %s\n", report)
			continue
		}
		vip, ok := ofFamily(a)
		if !ok {
			fmt.Fprintf(tw, "    not served: the service has no %s ClusterIP\n", family(a.Is6()))
			continue
		}
		for _, sp := range svc.Spec.Ports {
			fmt.Fprintf(tw, "    %s to %s: %s\n", portLabel(sp, sp.Port), netip.AddrPortFrom(vip, uint16(sp.Port)),
				perNodeSummary(shown, svcKey{a, protoNum(sp.Protocol), uint16(sp.Port)}, vip))
		}
	}
}

// nodePortState says whether the NodePort at node address a (ts: the
// node's entry for it) is open, and why: the external network a
// classifies into and whether it reaches the service's ClusterIP vip. The
// node's tables decide (model.GateNodePorts); the oracle names the rule.
func nodePortState(t model.Topology, svc *corev1.Service, vip, a netip.Addr, ts *tables.Service) string {
	switch {
	case ts == nil:
		return "not served"
	case ts.ClusterIP != vip:
		return "not served: the address and port are another service's frontend"
	}
	v := frontendAdmission(t, a, svc, vip)
	if ts.Closed {
		s := fmt.Sprintf("closed, dropped (frontend-closed): %s", classified(v))
		if v.SrcNetwork != "" {
			s += fmt.Sprintf(", which does not reach %s: %s", vip, v.Rule)
		}
		if v.Allowed {
			s += " (the oracle admits it: " + v.Rule + ")"
		}
		return s
	}
	s := fmt.Sprintf("open: %s, which reaches %s by %s", classified(v), vip, v.Rule)
	if !v.Allowed {
		s = fmt.Sprintf("open: %s (the oracle refuses it: %s)", classified(v), v.Rule)
	}
	return s + "; " + frontendSummary(ts)
}

package model

// The reachability oracle. It is written from the rules of docs/topology.md
// and docs/external-networks.md, deliberately apart from ComputeNode and
// its views (node.go), which build the data plane's tables: the end-to-end
// tests compare real packets with Reach, and a bug shared by both would
// hide. Do not call node.go from here, nor the other way around.

import (
	"fmt"
	"net/netip"
	"slices"
	"sort"
	"strings"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"

	lacev1 "github.com/lace-cni/lace/api/v1alpha1"
)

// Topology is what Reach reads. Networks without a status.id are not in the
// data plane yet and are treated as absent.
type Topology struct {
	Networks               []lacev1.Network
	RoutingPolicies        []lacev1.NetworkRoutingPolicy
	ServiceRoutingPolicies []lacev1.ServiceRoutingPolicy
	// Services are the services Lace serves, each with the network it is
	// bound to (docs/services.md: the binding policies decide; ComputeServices'
	// Bound, or the controller's lace-cni.io/network annotation) and its
	// cluster IPs. A service bound to no network is not served: leave it
	// out, and Reach calls a question about it invalid.
	Services []BoundService
	// Namespaces are the labels of each namespace, which
	// ServiceRoutingPolicy namespaceSelectors match; a namespace missing
	// here has no labels.
	Namespaces map[string]map[string]string
}

// BoundService is a service as the oracle sees it: where it is bound and
// its VIPs. Its ports and endpoints are the service tables' business
// (ComputeServices), not the oracle's.
type BoundService struct {
	Namespace, Name string
	// Network is the network the service is bound to.
	Network string
	// VIPs are its cluster IPs (one per family).
	VIPs []netip.Addr
}

// EndpointKind says what one side of a reachability question is.
type EndpointKind string

// Endpoint kinds.
const (
	// EndpointPod is a pod: Network and Addr are its own, NodeName the node
	// it runs on.
	EndpointPod EndpointKind = "Pod"
	// EndpointOutside is an address outside the cluster; as a source it is
	// classified into an external network by longest prefix.
	EndpointOutside EndpointKind = "Outside"
	// EndpointNode is a node's host stack, by its underlay address Addr and
	// NodeName. It reaches the pods of its own node whatever the policies;
	// otherwise it is an outside address like any other.
	EndpointNode EndpointKind = "Node"
	// EndpointService is a service's VIP: Namespace and Name name the
	// service (or, Name empty, Addr alone finds it among the VIPs of
	// Topology.Services), Addr is the VIP asked for. Destinations only;
	// its network is the one Topology.Services binds it to, whatever
	// Network says.
	EndpointService EndpointKind = "Service"
)

// Endpoint is one side of a reachability question.
type Endpoint struct {
	Kind EndpointKind
	// Network is the pod's network (pods only; outside addresses and nodes
	// are classified).
	Network  string
	Addr     netip.Addr
	NodeName string
	// Namespace and Name name a service (services only).
	Namespace, Name string
}

func (e Endpoint) String() string {
	switch e.Kind {
	case EndpointPod:
		return fmt.Sprintf("pod %s in %s", e.Addr, e.Network)
	case EndpointNode:
		return fmt.Sprintf("node %s (%s)", e.NodeName, e.Addr)
	case EndpointService:
		if e.Name == "" {
			return fmt.Sprintf("service VIP %s", e.Addr)
		}
		return fmt.Sprintf("service %s/%s VIP %s", e.Namespace, e.Name, e.Addr)
	}
	return fmt.Sprintf("outside address %s", e.Addr)
}

// DropReason is the name of the data plane drop counter a denied packet is
// counted under (internal/datapath.DropReasons; not imported: the model
// stays free of the data plane).
type DropReason string

// Drop reasons the oracle predicts.
const (
	// DropIsolated: the destination is in no network of the source's view.
	DropIsolated DropReason = "isolated"
	// DropAnonymous: a pod of an anonymous network without a self policy
	// addressed its own network.
	DropAnonymous DropReason = "anonymous-network"
	// DropUnclassified: a plain-IP source (outside or a node's host stack)
	// that no external network's prefix covers.
	DropUnclassified DropReason = "unclassified-source"
	// DropToNode: a pod opening a flow to its own node's address, which
	// its view does not hold.
	DropToNode DropReason = "to-node-not-answer"
	// DropTransit: plain IP entering a node for an outside address: a
	// node is not a router.
	DropTransit DropReason = "not-for-this-node"
	// DropNoEndpoint: the address resolves to a network of the view where
	// no pod holds it.
	DropNoEndpoint DropReason = "no-endpoint"
)

// Verdict is the oracle's answer, with what decided it.
type Verdict struct {
	Allowed bool
	// Rule says which rule decided, for people: "own network default",
	// "NetworkRoutingPolicy frontend-to-backend (frontend -> backend)",
	// "no view: ...", "conflict: ...".
	Rule string
	// Reason is the drop counter a denied packet is counted under; empty
	// when allowed, and when the question itself is impossible (a pod in a
	// network that does not exist).
	Reason DropReason
	// SrcNetwork is the network the source belongs to (a pod's own, or the
	// external network an outside address or node was classified into).
	SrcNetwork string
	// SrcPrefix is the external prefix that classified the source (outside
	// and node sources only).
	SrcPrefix netip.Prefix
	// DstNetwork and DstPrefix are the view entry the destination resolved
	// to, when it resolved to one.
	DstNetwork string
	DstPrefix  netip.Prefix
	// Policy is the NetworkRoutingPolicy that granted the destination
	// network ("" for the own network and the node's local exception).
	Policy string
	// ServicePolicy is the ServiceRoutingPolicy that granted a service's
	// VIP (services only; then DstNetwork is the service's network and
	// DstPrefix the VIP's host prefix, the view entry the data plane
	// holds for it).
	ServicePolicy string
	// SNAT is set for a pod reaching an external network: the packet leaves
	// through its node's underlay with the node's address as source, and
	// conntrack reverses it for the replies.
	SNAT bool
	// DropAtBlockOwner is set when a denied packet is counted where the
	// address's block lives (no-endpoint: the source's view sends it to
	// the node owning the block of another network holding that address,
	// which has no such pod), not necessarily on the source's node.
	DropAtBlockOwner bool
}

// ViewEntry is one prefix of a network's view.
type ViewEntry struct {
	Network string
	Type    lacev1.NetworkType
	Prefix  netip.Prefix
	// Policy granted the entry; "" for the network's own subnets.
	Policy string
}

// Conflict is a peering refused because it would put two overlapping pod
// networks into one view (the condition PeeringConflict).
type Conflict struct {
	// Policy would have put Dst into Src's view.
	Policy   string
	Src, Dst string
	// Prefix of Dst overlaps WithPrefix of With, which the view holds.
	Prefix     netip.Prefix
	With       string
	WithPrefix netip.Prefix
}

func (c Conflict) String() string {
	return fmt.Sprintf("NetworkRoutingPolicy %s refused for %s -> %s: %s %s overlaps %s %s",
		c.Policy, c.Src, c.Dst, c.Dst, c.Prefix, c.With, c.WithPrefix)
}

// View is what one source network reaches: a longest-prefix table of the
// networks directly granted to it, nothing transitive.
type View struct {
	Network string
	Entries []ViewEntry
	// SelfPolicy is the policy selecting an anonymous network on both
	// sides, which opens it to itself.
	SelfPolicy string
	// Closed is set for an anonymous network without a self policy: its own
	// subnets are not in Entries.
	Closed  bool
	Refused []Conflict
}

func (v View) has(network string) (ViewEntry, bool) {
	for _, e := range v.Entries {
		if e.Network == network {
			return e, true
		}
	}
	return ViewEntry{}, false
}

func (v View) refused(network string) (Conflict, bool) {
	for _, c := range v.Refused {
		if c.Dst == network {
			return c, true
		}
	}
	return Conflict{}, false
}

type netInfo struct {
	name      string
	typ       lacev1.NetworkType
	anonymous bool
	labels    labels.Set
	// prefixes are the subnets of a pod network, the externalPrefixes of an
	// external one.
	prefixes []netip.Prefix
}

func (n *netInfo) pod() bool { return n.typ != lacev1.NetworkTypeExternal }

type grant struct {
	policy   string
	src, dst []string // network names, sorted
}

// srpGrant is one ServiceRoutingPolicy's selectors. dst nil with name set
// selects the network of that name; ns nil admits every namespace.
type srpGrant struct {
	policy  string
	src     labels.Selector
	name    string
	dst, ns labels.Selector
	// nsText is the namespaceSelector as written, for people.
	nsText string
}

// topo is a Topology read once: ready networks by name and every policy's
// selected pairs, policies in name order (the order that settles conflicts).
type topo struct {
	nets   map[string]*netInfo
	grants []grant
	// srps in name order (the first one granting a VIP is named).
	srps       []srpGrant
	services   []BoundService
	namespaces map[string]map[string]string
}

func readTopology(t Topology) topo {
	tp := topo{nets: map[string]*netInfo{}}
	for _, n := range t.Networks {
		if n.Status.ID <= 0 {
			continue
		}
		ni := &netInfo{name: n.Name, typ: n.Spec.Type, anonymous: IsAnonymous(&n), labels: labels.Set(n.Labels)}
		var cidrs []lacev1.CIDR
		if n.Spec.Type == lacev1.NetworkTypeExternal {
			cidrs = n.Spec.ExternalPrefixes
		} else {
			for _, s := range []*lacev1.Subnet{n.Spec.IPv4Subnet, n.Spec.IPv6Subnet} {
				if s != nil {
					cidrs = append(cidrs, s.Prefix)
				}
			}
		}
		for _, c := range cidrs {
			if p, err := netip.ParsePrefix(string(c)); err == nil {
				ni.prefixes = append(ni.prefixes, p.Masked())
			}
		}
		tp.nets[n.Name] = ni
	}
	names := make([]string, 0, len(tp.nets))
	for name := range tp.nets {
		names = append(names, name)
	}
	sort.Strings(names)
	pols := append([]lacev1.NetworkRoutingPolicy(nil), t.RoutingPolicies...)
	sort.Slice(pols, func(i, j int) bool { return pols[i].Name < pols[j].Name })
	for _, p := range pols {
		// A nil selector selects nothing (the field is required); an
		// invalid one makes the policy select nothing.
		src, err1 := metav1.LabelSelectorAsSelector(p.Spec.SrcSelector)
		dst, err2 := metav1.LabelSelectorAsSelector(p.Spec.DestSelector)
		if err1 != nil || err2 != nil {
			continue
		}
		g := grant{policy: p.Name}
		for _, name := range names {
			if src.Matches(tp.nets[name].labels) {
				g.src = append(g.src, name)
			}
			if dst.Matches(tp.nets[name].labels) {
				g.dst = append(g.dst, name)
			}
		}
		tp.grants = append(tp.grants, g)
	}
	tp.services, tp.namespaces = t.Services, t.Namespaces
	tp.srps = readServiceRoutingPolicies(t.ServiceRoutingPolicies)
	return tp
}

// readServiceRoutingPolicies reads the selectors of ServiceRoutingPolicies
// (policy_types.go): srcSelector is required, and a missing or invalid one
// selects nothing; destSelector selects by name or by labels (the API
// admits exactly one; both given, both must match), and with neither it
// selects nothing; an unset or empty namespaceSelector admits every
// namespace, an invalid one none.
func readServiceRoutingPolicies(list []lacev1.ServiceRoutingPolicy) []srpGrant {
	pols := append([]lacev1.ServiceRoutingPolicy(nil), list...)
	sort.Slice(pols, func(i, j int) bool { return pols[i].Name < pols[j].Name })
	var out []srpGrant
	for _, p := range pols {
		if p.Spec.SrcSelector == nil {
			continue
		}
		src, err := metav1.LabelSelectorAsSelector(p.Spec.SrcSelector)
		if err != nil {
			continue
		}
		g := srpGrant{policy: p.Name, src: src, name: p.Spec.DestSelector.Name}
		d := p.Spec.DestSelector
		if len(d.MatchLabels) > 0 || len(d.MatchExpressions) > 0 {
			if g.dst, err = metav1.LabelSelectorAsSelector(&metav1.LabelSelector{MatchLabels: d.MatchLabels, MatchExpressions: d.MatchExpressions}); err != nil {
				continue
			}
		} else if g.name == "" {
			continue
		}
		if p.Spec.NamespaceSelector != nil {
			if g.ns, err = metav1.LabelSelectorAsSelector(p.Spec.NamespaceSelector); err != nil {
				continue
			}
			g.nsText = metav1.FormatLabelSelector(p.Spec.NamespaceSelector)
		}
		out = append(out, g)
	}
	return out
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

// ViewOf returns the view of a network, and the peerings refused for it.
func ViewOf(t Topology, network string) View {
	return readTopology(t).view(network)
}

func (tp topo) view(network string) View {
	v := View{Network: network}
	own := tp.nets[network]
	if own == nil {
		return v
	}
	// An anonymous network reaches itself only through a policy selecting
	// it on both sides (docs/networks.md, "Anonymous networks").
	for _, g := range tp.grants {
		if contains(g.src, network) && contains(g.dst, network) {
			v.SelfPolicy = g.policy
			break
		}
	}
	v.Closed = own.anonymous && v.SelfPolicy == ""
	// The source's own network always wins an overlap, even while closed:
	// its pods hold addresses there, and opening it later with a self
	// policy must not flip which peers are refused.
	ownPolicy := ""
	if own.anonymous {
		ownPolicy = v.SelfPolicy
	}
	reserved := []ViewEntry{}
	for _, p := range own.prefixes {
		e := ViewEntry{Network: network, Type: own.typ, Prefix: p, Policy: ownPolicy}
		reserved = append(reserved, e)
		if !v.Closed {
			v.Entries = append(v.Entries, e)
		}
	}
	seen := map[string]bool{network: true}
	// Peers in policy name order, then network name order: the first one
	// in keeps its place when two overlap.
	for _, g := range tp.grants {
		if !contains(g.src, network) {
			continue
		}
		for _, d := range g.dst {
			if seen[d] {
				continue
			}
			dn := tp.nets[d]
			if c, bad := overlap(dn, reserved); bad {
				c.Policy, c.Src = g.policy, network
				v.Refused = append(v.Refused, c)
				seen[d] = true
				continue
			}
			seen[d] = true
			for _, p := range dn.prefixes {
				e := ViewEntry{Network: d, Type: dn.typ, Prefix: p, Policy: g.policy}
				v.Entries = append(v.Entries, e)
				reserved = append(reserved, e)
			}
		}
	}
	return v
}

// overlap reports the first pod subnet of d overlapping a pod subnet
// already held. External prefixes overlap anything freely.
func overlap(d *netInfo, held []ViewEntry) (Conflict, bool) {
	if !d.pod() {
		return Conflict{}, false
	}
	for _, p := range d.prefixes {
		for _, e := range held {
			if e.Type != lacev1.NetworkTypeExternal && e.Prefix.Overlaps(p) {
				return Conflict{Dst: d.name, Prefix: p, With: e.Network, WithPrefix: e.Prefix}, true
			}
		}
	}
	return Conflict{}, false
}

// classify returns the external network whose prefix is the longest to
// cover addr; equal prefixes in two external networks go to the earlier
// name.
func (tp topo) classify(addr netip.Addr) (string, netip.Prefix, bool) {
	var best string
	var bestP netip.Prefix
	for name, n := range tp.nets {
		if n.pod() {
			continue
		}
		for _, p := range n.prefixes {
			if !p.Contains(addr) {
				continue
			}
			if best == "" || p.Bits() > bestP.Bits() || (p.Bits() == bestP.Bits() && name < best) {
				best, bestP = name, p
			}
		}
	}
	return best, bestP, best != ""
}

// resolve finds the view entry addr goes to. Pod subnets are private
// address spaces and count only when in the view; an outside address
// belongs to the external network that classifies it (docs/external-
// networks.md: longest prefix across all external networks), so a broader external network in
// the view does not reach into a more specific one outside it. A pod subnet
// beats an external prefix of equal or shorter length. A pod subnet of a
// network outside the view is no outside address either: unless a pod
// subnet of the view (the own ones, even closed) holds the address, it is
// denied like the pod network it belongs to, however broad an external
// network of the view (nothing transits, not even via world; shadow names
// that network).
func (tp topo) resolve(v View, addr netip.Addr) (e ViewEntry, ok bool, shadow string) {
	var best ViewEntry
	found := false
	for _, e := range v.Entries {
		if e.Type == lacev1.NetworkTypeExternal || !e.Prefix.Contains(addr) {
			continue
		}
		if !found || e.Prefix.Bits() > best.Prefix.Bits() {
			best, found = e, true
		}
	}
	held := found
	if own := tp.nets[v.Network]; own != nil && own.pod() {
		for _, p := range own.prefixes {
			held = held || p.Contains(addr)
		}
	}
	var other string
	var otherP netip.Prefix
	if !held {
		for name, n := range tp.nets {
			if !n.pod() || name == v.Network {
				continue
			}
			if _, in := v.has(name); in {
				continue
			}
			for _, p := range n.prefixes {
				if p.Contains(addr) && (other == "" || p.Bits() > otherP.Bits()) {
					other, otherP = name, p
				}
			}
		}
	}
	ext, extP, classified := tp.classify(addr)
	if classified {
		if e, in := v.has(ext); in && (!found || extP.Bits() > best.Prefix.Bits()) && (other == "" || extP.Bits() > otherP.Bits()) {
			e.Prefix = extP
			return e, true, ""
		}
	}
	if found {
		return best, true, ""
	}
	return ViewEntry{}, false, other
}

func grantRule(e ViewEntry, src string) string {
	switch {
	case e.Policy == "":
		return "own network " + e.Network
	case e.Network == src:
		return fmt.Sprintf("NetworkRoutingPolicy %s opens anonymous network %s to itself", e.Policy, src)
	}
	return fmt.Sprintf("NetworkRoutingPolicy %s (%s -> %s)", e.Policy, src, e.Network)
}

// Reach answers whether a new flow from src to dst is admitted, and by
// which rule (docs/topology.md). NetworkRoutingPolicies are not
// port-scoped, so proto and port do not change a verdict today; they are
// part of the question for services (a VIP and port) and for lacectl trace.
// Replies of an admitted flow are answered by ReachReply.
//
// For a service (dst of kind EndpointService) the verdict says whether the
// source's view holds the VIP (docs/topology.md, third bullet of "What a
// network reaches"): a pod reaches the VIPs of the services bound to its own network
// (unless it is anonymous and closed), to every network a
// NetworkRoutingPolicy grants it (not refused by a conflict), and to the
// networks a ServiceRoutingPolicy from its network selects, scoped by
// namespace; the rule names which. Otherwise it is denied as isolated.
// A node (its processes and host-network pods: connect-time translation)
// is an outside host classified by its address, and reaches the VIPs its
// network's view holds: those a NetworkRoutingPolicy or a
// ServiceRoutingPolicy from that external network grants (world -> default
// opens the default network's services). Outside addresses do not reach
// VIPs yet (isolated): NodePort and LoadBalancer will be their way in.
// Whether the service serves that port,
// and whether it has endpoints eligible on the source's node, is not the
// oracle's business: ComputeServices decides it (a port without endpoints
// is rejected or dropped after the view admitted the flow).
func Reach(t Topology, src, dst Endpoint, proto string, port uint16) Verdict {
	tp := readTopology(t)
	var v Verdict
	if !src.Addr.IsValid() || !dst.Addr.IsValid() {
		v.Rule = "invalid question: an endpoint has no address"
		return v
	}
	src.Addr, dst.Addr = src.Addr.Unmap(), dst.Addr.Unmap()
	if src.Addr.Is4() != dst.Addr.Is4() {
		v.Rule = "invalid question: the endpoints are of different address families"
		return v
	}

	// The node reaches the pods on it whatever the policies; the one
	// exception to isolation, and only local (docs/topology.md, "What a
	// network reaches").
	if src.Kind == EndpointNode && dst.Kind == EndpointPod && src.NodeName != "" && src.NodeName == dst.NodeName {
		v.Allowed, v.Rule = true, "node reaches its own pods"
		v.DstNetwork = dst.Network
		return v
	}

	// Where the packet comes from (docs/external-networks.md): a pod's own
	// network, else the external network classifying the source address.
	switch src.Kind {
	case EndpointPod:
		n := tp.nets[src.Network]
		if n == nil || !n.pod() {
			v.Rule = fmt.Sprintf("invalid question: %s is not a pod network with an ID", src.Network)
			return v
		}
		v.SrcNetwork = src.Network
	case EndpointOutside, EndpointNode:
		name, p, ok := tp.classify(src.Addr)
		if !ok && src.Kind == EndpointNode && dst.Kind == EndpointService {
			// The node's sockets look the VIP up in the view of no
			// network: refused as isolated (bpf/sock.c).
			v.Rule = fmt.Sprintf("unclassified: no external network's prefix covers node address %s, so its sockets reach no VIP", src.Addr)
			v.Reason = DropIsolated
			return v
		}
		if !ok {
			v.Rule = fmt.Sprintf("unclassified: no external network's prefix covers source %s", src.Addr)
			v.Reason = DropUnclassified
			return v
		}
		v.SrcNetwork, v.SrcPrefix = name, p
	default:
		v.Rule = fmt.Sprintf("invalid question: source kind %q", src.Kind)
		return v
	}
	s := v.SrcNetwork
	view := tp.view(s)

	if dst.Kind == EndpointService {
		return tp.reachService(v, src, dst, view)
	}
	if dst.Kind == EndpointPod {
		n := tp.nets[dst.Network]
		if n == nil || !n.pod() {
			v.Rule = fmt.Sprintf("invalid question: %s is not a pod network with an ID", dst.Network)
			return v
		}
		// The data plane looks in the own network first and then finds
		// it closed: anonymous-network, not isolated.
		if dst.Network == s && view.Closed {
			v.Rule = fmt.Sprintf("anonymous network %s without self policy", s)
			v.Reason = DropAnonymous
			return v
		}
		// An address is a destination only through the source's view: a
		// pod of another network holding an address that the view gives
		// to a network it does hold (overlapping subnets) is out of reach,
		// and the packet goes where the view says, to no pod.
		if e, ok, _ := tp.resolve(view, dst.Addr); ok && e.Type != lacev1.NetworkTypeExternal && e.Network != dst.Network {
			v.Rule = fmt.Sprintf("no view: %s resolves to network %s (%s) in the view of %s, where no pod holds it; the pod of %s is out of reach", dst.Addr, e.Network, e.Prefix, s, dst.Network)
			v.DstNetwork, v.DstPrefix, v.Policy = e.Network, e.Prefix, e.Policy
			v.Reason, v.DropAtBlockOwner = DropNoEndpoint, true
			if c, refused := view.refused(dst.Network); refused {
				v.Rule += " (conflict: " + c.String() + ")"
			}
			return v
		}
		if view.Closed {
			for _, p := range tp.nets[s].prefixes {
				if p.Contains(dst.Addr) {
					v.Rule = fmt.Sprintf("anonymous network %s without self policy (%s is in its subnet %s)", s, dst.Addr, p)
					v.Reason = DropAnonymous
					return v
				}
			}
		}
		if c, ok := view.refused(dst.Network); ok {
			v.Rule, v.Reason = "conflict: "+c.String(), DropIsolated
			return v
		}
		if _, ok := view.has(dst.Network); !ok {
			v.Rule = fmt.Sprintf("no view: no NetworkRoutingPolicy %s -> %s (nothing transits)", s, dst.Network)
			v.Reason = DropIsolated
			return v
		}
	}

	ownNode := src.Kind == EndpointPod && dst.Kind == EndpointNode && dst.NodeName != "" && dst.NodeName == src.NodeName
	// Destinations resolve by longest prefix in the source's view.
	e, ok, shadow := tp.resolve(view, dst.Addr)
	// A closed anonymous network keeps its own subnets reserved: an
	// address there is its own, whatever kind the question names it as,
	// unless a more specific external prefix of the view covers it (as it
	// would were the network open).
	if src.Kind == EndpointPod && dst.Kind != EndpointPod && view.Closed {
		for _, p := range tp.nets[s].prefixes {
			if p.Contains(dst.Addr) && !(ok && e.Type == lacev1.NetworkTypeExternal && e.Prefix.Bits() > p.Bits()) {
				v.Rule = fmt.Sprintf("anonymous network %s without self policy (%s is in its subnet %s)", s, dst.Addr, p)
				v.Reason = DropAnonymous
				return v
			}
		}
	}
	if !ok {
		v.Reason = DropIsolated
		if ownNode {
			v.Reason = DropToNode
		}
		if shadow != "" {
			v.Rule = fmt.Sprintf("no view: %s is in a subnet of pod network %s, which %s does not reach (nothing transits)", dst.Addr, shadow, s)
		} else if ext, p, in := tp.classify(dst.Addr); in {
			v.Rule = fmt.Sprintf("no view: %s belongs to external network %s (%s), which %s does not reach", dst.Addr, ext, p, s)
		} else {
			v.Rule = fmt.Sprintf("no view: %s is in no network %s reaches", dst.Addr, s)
		}
		return v
	}
	v.DstNetwork, v.DstPrefix, v.Policy = e.Network, e.Prefix, e.Policy
	// A pod's own node is an outside host classified by its address like
	// any other, but it is local: the packet is handed to the node's stack
	// with the pod's address, which is unique on the node (docs/topology.md,
	// "What a network reaches"), and the data plane counts a refusal as
	// to-node-not-answer.
	if ownNode && e.Type != lacev1.NetworkTypeExternal {
		v.Rule = fmt.Sprintf("no view: the address of node %s resolves to pod network %s (%s) in the view of %s", dst.NodeName, e.Network, e.Prefix, s)
		v.Reason = DropToNode
		return v
	}
	if src.Kind != EndpointPod && dst.Kind != EndpointPod && e.Type == lacev1.NetworkTypeExternal {
		v.Rule = fmt.Sprintf("transit: %s is outside the cluster and a node is not a router", dst.Addr)
		v.Reason = DropTransit
		return v
	}
	switch {
	case dst.Kind == EndpointPod && e.Network != dst.Network:
		v.Rule = fmt.Sprintf("no view: %s resolves to %s (%s) in the view of %s, not to %s", dst.Addr, e.Network, e.Prefix, s, dst.Network)
		v.Reason = DropIsolated
		return v
	case dst.Kind != EndpointPod && e.Type != lacev1.NetworkTypeExternal:
		v.Rule = fmt.Sprintf("no view: %s resolves to pod network %s (%s) in the view of %s, which shadows the outside address", dst.Addr, e.Network, e.Prefix, s)
		v.Reason = DropIsolated
		return v
	}
	v.Allowed, v.Rule = true, grantRule(e, s)
	if ownNode {
		v.Rule += "; handed to the node's host stack with the pod's address (unique on the node)"
		return v
	}
	if src.Kind == EndpointPod && e.Type == lacev1.NetworkTypeExternal {
		v.SNAT = true
		v.Rule += "; leaves through the node's underlay with SNAT to the node address"
	}
	return v
}

// reachService answers for a service VIP, v holding the source's
// classification and view its view.
func (tp topo) reachService(v Verdict, src, dst Endpoint, view View) Verdict {
	svc, problem := tp.service(dst)
	if problem != "" {
		v.Rule = "invalid question: " + problem
		return v
	}
	n, s := svc.Network, v.SrcNetwork
	name := svc.Namespace + "/" + svc.Name
	v.DstNetwork, v.DstPrefix = n, netip.PrefixFrom(dst.Addr, dst.Addr.BitLen())
	if src.Kind == EndpointOutside {
		v.Rule = fmt.Sprintf("no view: a ClusterIP is reached from pods and nodes only; outside clients use the service's NodePorts, load balancer addresses or external IPs (service %s; the source is in external network %s)", name, s)
		v.Reason = DropIsolated
		return v
	}
	// The own network's services, unless closed (the same anonymous rule
	// as its subnets).
	if n == s && !view.Closed {
		v.Allowed = true
		v.Rule = "own network " + s
		if tp.nets[s].anonymous {
			v.Policy = view.SelfPolicy
			v.Rule = fmt.Sprintf("NetworkRoutingPolicy %s opens anonymous network %s to itself", view.SelfPolicy, s)
		}
		return v
	}
	// A peer's services, when the peering is not refused.
	var why []string
	if n == s {
		why = append(why, fmt.Sprintf("anonymous network %s without self policy: its own services are out of its view too", s))
	} else if pol, ok := tp.firstGrant(s, n); ok {
		if c, refused := view.refused(n); refused {
			why = append(why, "conflict: "+c.String())
		} else {
			v.Allowed, v.Policy = true, pol
			v.Rule = fmt.Sprintf("NetworkRoutingPolicy %s (%s -> %s)", pol, s, n)
			return v
		}
	} else {
		why = append(why, fmt.Sprintf("no view: no NetworkRoutingPolicy %s -> %s", s, n))
	}
	// The VIP alone, by a ServiceRoutingPolicy.
	srcLabels, dstLabels := tp.nets[s].labels, tp.nets[n].labels
	nsLabels := labels.Set(tp.namespaces[svc.Namespace])
	var nsMiss []string
	for _, g := range tp.srps {
		if !g.src.Matches(srcLabels) || (g.name != "" && g.name != n) || (g.dst != nil && !g.dst.Matches(dstLabels)) {
			continue
		}
		if g.ns != nil && !g.ns.Matches(nsLabels) {
			nsMiss = append(nsMiss, fmt.Sprintf("ServiceRoutingPolicy %s selects the services of %s only in namespaces matching %s, not %s", g.policy, n, g.nsText, svc.Namespace))
			continue
		}
		v.Allowed, v.ServicePolicy = true, g.policy
		v.Rule = fmt.Sprintf("ServiceRoutingPolicy %s (%s -> the services of %s: VIPs only, not the pods)", g.policy, s, n)
		return v
	}
	if len(nsMiss) > 0 {
		why = append(why, nsMiss...)
	} else {
		why = append(why, fmt.Sprintf("no ServiceRoutingPolicy from %s selects the services of %s", s, n))
	}
	v.Rule = strings.Join(why, "; ") + fmt.Sprintf(" (service %s)", name)
	v.Reason = DropIsolated
	return v
}

// service finds the service dst names, and checks its VIP; problem says
// why the question cannot be asked.
func (tp topo) service(dst Endpoint) (svc BoundService, problem string) {
	found := false
	for _, s := range tp.services {
		if dst.Name != "" && s.Namespace == dst.Namespace && s.Name == dst.Name {
			svc, found = s, true
			break
		}
		if dst.Name == "" && slices.ContainsFunc(s.VIPs, func(a netip.Addr) bool { return a.Unmap() == dst.Addr }) {
			svc, found = s, true
			break
		}
	}
	switch {
	case !found && dst.Name != "":
		return svc, fmt.Sprintf("service %s/%s is not in the topology (bound to no network: not served)", dst.Namespace, dst.Name)
	case !found:
		return svc, fmt.Sprintf("%s is the VIP of no service in the topology", dst.Addr)
	case !slices.ContainsFunc(svc.VIPs, func(a netip.Addr) bool { return a.Unmap() == dst.Addr }):
		return svc, fmt.Sprintf("%s is not a VIP of service %s/%s", dst.Addr, svc.Namespace, svc.Name)
	}
	if n := tp.nets[svc.Network]; n == nil || !n.pod() {
		return svc, fmt.Sprintf("service %s/%s is bound to %s, which is not a pod network with an ID (not served)", svc.Namespace, svc.Name, svc.Network)
	}
	return svc, ""
}

// firstGrant is the first NetworkRoutingPolicy (in name order) selecting
// src -> dst: the one that puts dst into src's view, or whose peering is
// refused.
func (tp topo) firstGrant(src, dst string) (string, bool) {
	for _, g := range tp.grants {
		if contains(g.src, src) && contains(g.dst, dst) {
			return g.policy, true
		}
	}
	return "", false
}

// ReachReply answers whether the replies of a flow src opened to dst come
// back: always when the flow was admitted (conntrack, docs/topology.md,
// "Direction"), whatever the policies from dst to src. When the flow was not
// admitted there is nothing to reply to, and the verdict carries the
// forward denial.
func ReachReply(t Topology, src, dst Endpoint, proto string, port uint16) Verdict {
	v := Reach(t, src, dst, proto, port)
	if v.Allowed {
		v.Rule = "reply of a flow admitted by " + v.Rule + " (conntrack)"
	} else {
		v.Rule = "no admitted flow to reply to: " + v.Rule
	}
	return v
}

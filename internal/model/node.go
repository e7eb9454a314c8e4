package model

import (
	"net/netip"
	"sort"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"

	lacev1 "github.com/lace-cni/lace/api/v1alpha1"
	"github.com/lace-cni/lace/internal/tables"
)

// NodeInput is everything a node's desired data plane depends on.
type NodeInput struct {
	Node            string
	Networks        []lacev1.Network
	Allocations     []lacev1.Allocation
	Underlays       []lacev1.UnderlayEndpoint
	RoutingPolicies []lacev1.NetworkRoutingPolicy
	// Services are the VIPs of the services bound to a network, and the
	// ServiceRoutingPolicies and namespace labels that open them to other
	// networks (docs/topology.md, third bullet of "What a network reaches").
	Services               []ServiceVIPs
	ServiceRoutingPolicies []lacev1.ServiceRoutingPolicy
	Namespaces             map[string]map[string]string
	// ServiceCIDRs are the cluster's service ranges (ServiceCIDR objects):
	// an address there that is no VIP a view reaches is denied, never an
	// outside address (kube-proxy drops traffic to unallocated ClusterIPs).
	ServiceCIDRs []netip.Prefix
	// Neighbors and FDBEntries place the addresses of l2 networks: an
	// address (Neighbor) lives where its MAC does (FDBEntry.spec.node),
	// and views route it there one by one. Both are lace-controller's
	// (the admission policy keeps nodes from writing them), so a node
	// cannot draw another node's traffic by claiming an address.
	Neighbors  []lacev1.Neighbor
	FDBEntries []lacev1.FDBEntry
}

// ServiceVIPs are the cluster IPs of a service bound to Network.
type ServiceVIPs struct {
	Namespace, Name string
	Network         string
	VIPs            []netip.Addr
}

// LocatorRoute sends a node's locator over the underlay to its address.
type LocatorRoute struct {
	Node    string
	Locator netip.Prefix
	Via     netip.Addr
}

// Block is one of this node's blocks of an l3 network.
type Block struct {
	Network string
	NetID   uint32
	Prefix  netip.Prefix
}

// NodeState is the desired data plane of one node. Slices are sorted so
// that two computations of the same input compare equal.
type NodeState struct {
	// Locator is this node's own SRv6 locator (invalid until assigned).
	Locator  netip.Prefix
	Networks []tables.Network
	// Routes are the views of every network with an ID, pod and external
	// networks alike: one longest-prefix table per source network.
	Routes []tables.Route
	// L2Neighbors and L2FDB are the l2 networks' neighbour tables and the
	// MACs living on other nodes (l2.go); the MACs of this node's own
	// ports are the CNI server's.
	L2Neighbors []tables.L2Neighbor
	L2FDB       []tables.FDBEntry
	// L2Flood are, per l2 network, the other nodes with ports in it.
	L2Flood []tables.L2FloodNode
	// L2Learning are the IDs of the l2 networks that learn
	// (spec.l2.learning); L2Learned the learned MACs living on this node,
	// each with the endpoint that holds it (the CNI server places them at
	// its port).
	L2Learning []uint32
	L2Learned  []L2Learned
	// Classifiers assign plain-IP sources to external networks.
	Classifiers []tables.Classifier
	// Inside are the prefixes no outside host has an address in (pod
	// subnets, service ranges, locators): plain IP from the fabric with
	// a source there is spoofed.
	Inside []tables.Inside
	// Nodes are the underlay addresses of every node (decap sources).
	Nodes []netip.Addr
	// NodeLocators bind each node's IPv6 underlay addresses to its
	// locator: a pod source is accepted only from its block's node.
	NodeLocators  []tables.NodeLocator
	LocatorRoutes []LocatorRoute
	// Blocks are this node's blocks, for pod IPAM.
	Blocks []Block
	// Services are the service ports this node serves (ComputeServices;
	// the agent fills them in), and HealthChecks the healthCheckNodePorts
	// it answers. ServiceChanges says which of Services may differ from
	// earlier states' (the merge's, when nothing after it changed any).
	Services       []tables.Service
	ServiceChanges ServiceChanges
	HealthChecks   []HealthCheck
	// HostRoutes send the node's own traffic for other nodes' pod blocks
	// over the underlay to their owners, as plain IP from the node address
	// (the owner judges it as from any outside host: docs/external-networks.md,
	// "Where outside traffic belongs"). One per prefix: overlapping networks' blocks go to the
	// lowest network ID.
	HostRoutes []HostRoute
}

// HostRoute is a route of the node's host stack: Prefix via Via on the
// underlay.
type HostRoute struct {
	Prefix netip.Prefix
	Via    netip.Addr
}

// NetworkIDs maps network names to their IDs (networks without an ID yet
// are absent).
func NetworkIDs(nets []lacev1.Network) map[string]uint32 {
	out := map[string]uint32{}
	for _, n := range nets {
		if n.Status.ID > 0 {
			out[n.Name] = uint32(n.Status.ID)
		}
	}
	return out
}

// ComputeNode derives the desired data plane of in.Node.
func ComputeNode(in NodeInput) NodeState {
	var st NodeState
	ids := NetworkIDs(in.Networks)
	byName := map[string]*lacev1.Network{}
	for i := range in.Networks {
		n := &in.Networks[i]
		byName[n.Name] = n
		if n.Status.ID > 0 {
			st.Networks = append(st.Networks, tables.Network{ID: uint32(n.Status.ID), Anonymous: IsAnonymous(n)})
		}
	}
	locators := map[string]netip.Prefix{}
	for _, u := range in.Underlays {
		loc, err := netip.ParsePrefix(string(u.Spec.Locator))
		if err != nil || !loc.Addr().Is6() {
			continue
		}
		locators[u.Spec.Node] = loc.Masked()
		var via netip.Addr
		for _, a := range u.Spec.Addresses {
			ip, err := netip.ParseAddr(string(a))
			if err != nil || !ip.Is6() {
				continue
			}
			st.Nodes = append(st.Nodes, ip)
			st.NodeLocators = append(st.NodeLocators, tables.NodeLocator{Addr: ip, Locator: loc.Masked()})
			if !via.IsValid() {
				via = ip
			}
		}
		if u.Spec.Node == in.Node {
			st.Locator = loc.Masked()
		} else if via.IsValid() {
			st.LocatorRoutes = append(st.LocatorRoutes, LocatorRoute{Node: u.Spec.Node, Locator: loc.Masked(), Via: via})
		}
	}
	for _, a := range in.Allocations {
		// A block being released is withdrawn first (two-phase release).
		if a.DeletionTimestamp != nil || a.Spec.Node != in.Node {
			continue
		}
		nw := byName[a.Spec.Network]
		id, ok := ids[a.Spec.Network]
		if nw == nil || !ok || nw.Spec.Type != lacev1.NetworkTypeL3 {
			continue
		}
		for _, s := range a.Spec.Prefixes {
			if p, err := netip.ParsePrefix(string(s)); err == nil {
				st.Blocks = append(st.Blocks, Block{Network: a.Spec.Network, NetID: id, Prefix: p})
			}
		}
	}
	st.Routes = append(st.Routes, nodeContextRoutes(in, locators)...)
	if len(st.Routes) > 0 {
		st.Networks = append(st.Networks, tables.Network{ID: tables.NodeNetID})
	}
	st.HostRoutes = hostRoutes(in, ids, byName)
	located := l2Located(in)
	vt := readViewTopology(in, locators, located)
	st.Classifiers = vt.classifiers()
	st.Inside = insidePrefixes(in, locators)
	st.L2Neighbors, st.L2FDB, st.L2Flood = l2Tables(in, located, ids, locators)
	st.L2Learning, st.L2Learned = l2Learning(in, ids)
	for _, v := range vt.nets {
		st.Routes = append(st.Routes, vt.view(v)...)
	}
	sortState(&st)
	return st
}

func sortState(st *NodeState) {
	sort.Slice(st.Networks, func(i, j int) bool { return st.Networks[i].ID < st.Networks[j].ID })
	// Prefix strings computed once: views hold many entries.
	type keyed struct {
		r tables.Route
		p string
	}
	rs := make([]keyed, len(st.Routes))
	for i, r := range st.Routes {
		rs[i] = keyed{r, r.Prefix.String()}
	}
	sort.Slice(rs, func(i, j int) bool {
		a, b := rs[i], rs[j]
		if a.r.NetID != b.r.NetID {
			return a.r.NetID < b.r.NetID
		}
		if a.p != b.p {
			return a.p < b.p
		}
		return a.r.Kind < b.r.Kind
	})
	for i := range rs {
		st.Routes[i] = rs[i].r
	}
	sort.Slice(st.Classifiers, func(i, j int) bool { return st.Classifiers[i].Prefix.String() < st.Classifiers[j].Prefix.String() })
	sort.Slice(st.Inside, func(i, j int) bool { return st.Inside[i].Prefix.String() < st.Inside[j].Prefix.String() })
	sort.Slice(st.Nodes, func(i, j int) bool { return st.Nodes[i].Less(st.Nodes[j]) })
	sort.Slice(st.NodeLocators, func(i, j int) bool { return st.NodeLocators[i].Addr.Less(st.NodeLocators[j].Addr) })
	sort.Slice(st.LocatorRoutes, func(i, j int) bool { return st.LocatorRoutes[i].Node < st.LocatorRoutes[j].Node })
	sort.Slice(st.Blocks, func(i, j int) bool {
		a, b := st.Blocks[i], st.Blocks[j]
		return a.Network < b.Network || (a.Network == b.Network && a.Prefix.Addr().Less(b.Prefix.Addr()))
	})
}

// The views below are computed apart from the oracle (reach.go) on purpose:
// the end-to-end tests compare packets with Reach, and view_test.go compares
// these tables with it, so a misreading of docs/topology.md shared by both
// would hide. Do not call reach.go from here.

// viewNet is a network with an ID, as the views see it.
type viewNet struct {
	name      string
	id        uint32
	external  bool
	l3        bool
	l2        bool
	anonymous bool
	labels    labels.Set
	// prefixes are a pod network's subnets or an external network's
	// externalPrefixes.
	prefixes []netip.Prefix
	// blocks are an l3 network's routable blocks, or an l2 network's
	// addresses (host prefixes): on this node, or on a node with a
	// locator.
	blocks []viewBlock
}

type viewBlock struct {
	prefix  netip.Prefix
	local   bool
	locator netip.Prefix // remote blocks only
}

// viewGrant is one NetworkRoutingPolicy's selection.
type viewGrant struct {
	src map[string]bool
	dst []*viewNet // network name order
}

type viewTopology struct {
	nets   []*viewNet // name order
	grants []viewGrant
	// extOwner is the external network each external prefix classifies
	// into: the earliest name among those holding exactly that prefix.
	extOwner map[netip.Prefix]*viewNet
	// extOf memoizes the longest external prefix containing a prefix
	// (classification does not depend on the view).
	extOf map[netip.Prefix]netip.Prefix

	byName       map[string]*viewNet
	services     []ServiceVIPs
	serviceCIDRs []netip.Prefix
	srps         []viewSRP
	namespaces   map[string]map[string]string
}

// viewSRP is one ServiceRoutingPolicy's selectors; nil dst and ns select
// everything, and name (when set) names the destination network.
type viewSRP struct {
	src     labels.Selector
	name    string
	dst, ns labels.Selector
}

func readViewTopology(in NodeInput, locators map[string]netip.Prefix, located []l2Place) *viewTopology {
	vt := &viewTopology{extOwner: map[netip.Prefix]*viewNet{}, extOf: map[netip.Prefix]netip.Prefix{}}
	byName := map[string]*viewNet{}
	for _, n := range in.Networks {
		if n.Status.ID <= 0 || byName[n.Name] != nil {
			continue
		}
		vn := &viewNet{name: n.Name, id: uint32(n.Status.ID), external: n.Spec.Type == lacev1.NetworkTypeExternal,
			l3: n.Spec.Type == lacev1.NetworkTypeL3, l2: n.Spec.Type == lacev1.NetworkTypeL2, anonymous: IsAnonymous(&n), labels: labels.Set(n.Labels)}
		var cidrs []lacev1.CIDR
		if vn.external {
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
				vn.prefixes = append(vn.prefixes, p.Masked())
			}
		}
		byName[n.Name] = vn
		vt.nets = append(vt.nets, vn)
	}
	vt.byName, vt.services, vt.namespaces, vt.serviceCIDRs = byName, in.Services, in.Namespaces, in.ServiceCIDRs
	for _, p := range in.ServiceRoutingPolicies {
		if p.Spec.SrcSelector == nil {
			continue
		}
		src, err := metav1.LabelSelectorAsSelector(p.Spec.SrcSelector)
		if err != nil {
			continue
		}
		g := viewSRP{src: src, name: p.Spec.DestSelector.Name}
		if len(p.Spec.DestSelector.MatchLabels) > 0 || len(p.Spec.DestSelector.MatchExpressions) > 0 {
			if g.dst, err = metav1.LabelSelectorAsSelector(&metav1.LabelSelector{MatchLabels: p.Spec.DestSelector.MatchLabels,
				MatchExpressions: p.Spec.DestSelector.MatchExpressions}); err != nil {
				continue
			}
		} else if g.name == "" {
			continue // selects no network
		}
		if p.Spec.NamespaceSelector != nil {
			if g.ns, err = metav1.LabelSelectorAsSelector(p.Spec.NamespaceSelector); err != nil {
				continue
			}
		}
		vt.srps = append(vt.srps, g)
	}
	sort.Slice(vt.nets, func(i, j int) bool { return vt.nets[i].name < vt.nets[j].name })
	for _, vn := range vt.nets {
		if !vn.external {
			continue
		}
		for _, p := range vn.prefixes {
			if vt.extOwner[p] == nil {
				vt.extOwner[p] = vn
			}
		}
	}

	// Allocations in a fixed order, so that a duplicated block (which the
	// controller never makes) resolves the same way on every computation.
	allocs := append([]lacev1.Allocation(nil), in.Allocations...)
	sort.SliceStable(allocs, func(i, j int) bool { return allocs[i].Spec.Node < allocs[j].Spec.Node })
	for _, a := range allocs {
		// A block being released is withdrawn first (two-phase release).
		if a.DeletionTimestamp != nil {
			continue
		}
		vn := byName[a.Spec.Network]
		if vn == nil || !vn.l3 {
			continue
		}
		loc, hasLoc := locators[a.Spec.Node]
		local := a.Spec.Node == in.Node
		if !local && !hasLoc {
			continue // the owner has no locator yet: nothing to route to
		}
		for _, s := range a.Spec.Prefixes {
			p, err := netip.ParsePrefix(string(s))
			if err != nil {
				continue
			}
			p = p.Masked()
			// A block outside the network's subnets would escape the
			// overlap check that keeps one view's pod networks apart.
			if !coveredBy(vn.prefixes, p) {
				continue
			}
			b := viewBlock{prefix: p, local: local}
			if !local {
				b.locator = loc
			}
			vn.blocks = append(vn.blocks, b)
		}
	}

	for _, h := range located {
		l2Host(h, in.Node, byName, locators)
	}

	pols := append([]lacev1.NetworkRoutingPolicy(nil), in.RoutingPolicies...)
	sort.Slice(pols, func(i, j int) bool { return pols[i].Name < pols[j].Name })
	for _, p := range pols {
		// The selectors are required: a missing one selects nothing, and
		// so does an invalid one.
		if p.Spec.SrcSelector == nil || p.Spec.DestSelector == nil {
			continue
		}
		src, err1 := metav1.LabelSelectorAsSelector(p.Spec.SrcSelector)
		dst, err2 := metav1.LabelSelectorAsSelector(p.Spec.DestSelector)
		if err1 != nil || err2 != nil {
			continue
		}
		g := viewGrant{src: map[string]bool{}}
		for _, vn := range vt.nets {
			if src.Matches(vn.labels) {
				g.src[vn.name] = true
			}
			if dst.Matches(vn.labels) {
				g.dst = append(g.dst, vn)
			}
		}
		vt.grants = append(vt.grants, g)
	}
	return vt
}

func coveredBy(outer []netip.Prefix, p netip.Prefix) bool {
	for _, o := range outer {
		if o.Bits() <= p.Bits() && o.Contains(p.Addr()) {
			return true
		}
	}
	return false
}

func (vt *viewTopology) classifiers() []tables.Classifier {
	out := make([]tables.Classifier, 0, len(vt.extOwner))
	for p, vn := range vt.extOwner {
		out = append(out, tables.Classifier{NetID: vn.id, Prefix: p})
	}
	return out
}

// longestAt finds the longest prefix of m containing p, no shorter than
// minBits.
func longestAt[T any](m map[netip.Prefix]T, p netip.Prefix, minBits int) (netip.Prefix, T, bool) {
	if len(m) <= p.Bits()-minBits {
		// Fewer entries than lengths to try (a view's subnets, mostly).
		var best netip.Prefix
		for q := range m {
			if q.Bits() >= minBits && q.Bits() <= p.Bits() && q.Contains(p.Addr()) && (!best.IsValid() || q.Bits() > best.Bits()) {
				best = q
			}
		}
		return best, m[best], best.IsValid()
	}
	if len(m) > 0 {
		for b := p.Bits(); b >= minBits; b-- {
			q, _ := p.Addr().Prefix(b)
			if v, ok := m[q]; ok {
				return q, v, true
			}
		}
	}
	var zero T
	return netip.Prefix{}, zero, false
}

// classifyPrefix returns the longest external prefix containing p: an outside
// address belongs to the external network owning it, whichever external
// networks the view holds.
func (vt *viewTopology) classifyPrefix(p netip.Prefix) (netip.Prefix, bool) {
	if e, ok := vt.extOf[p]; ok {
		return e, e.IsValid()
	}
	e, _, _ := longestAt(vt.extOwner, p, 0)
	vt.extOf[p] = e
	return e, e.IsValid()
}

// view computes the longest-prefix table of source network v.
//
// Every prefix that matters to the view (its pod networks' blocks and
// subnets, every external prefix of the cluster) gets the entry the rules
// give an address whose longest such prefix it is; that is exactly what a
// longest-prefix lookup then returns for every address. The rules are
// those of docs/topology.md: pod entries resolve to their network unless an
// external network of the view classifies the address with a strictly
// longer prefix than the pod subnet (blocks refine a subnet, they never
// change which network an address belongs to); an outside address whose
// external network is not in the view is denied unless a pod subnet of
// the view holds it.
func (vt *viewTopology) view(v *viewNet) []tables.Route {
	// An anonymous network reaches itself only through a policy selecting
	// it on both sides.
	open := !v.anonymous
	for _, g := range vt.grants {
		if open {
			break
		}
		if g.src[v.name] {
			for _, d := range g.dst {
				if d == v {
					open = true
					break
				}
			}
		}
	}
	closed := !open

	in := map[string]bool{v.name: true}
	subnets := map[netip.Prefix]*viewNet{}
	var pods []*viewNet
	// The own subnets are reserved even while closed: opening the network
	// later with a self policy must not change which peers are refused.
	if !v.external {
		pods = append(pods, v)
		for _, p := range v.prefixes {
			subnets[p] = v
		}
	}
	seen := map[string]bool{v.name: true}
	for _, g := range vt.grants {
		if !g.src[v.name] {
			continue
		}
		for _, d := range g.dst {
			if seen[d.name] {
				continue
			}
			seen[d.name] = true
			// Two overlapping pod networks never share a view: the one
			// already in keeps its place (the controller reports the
			// refused pair as a PeeringConflict).
			if !d.external && overlapsAny(d.prefixes, subnets) {
				continue
			}
			in[d.name] = true
			if !d.external {
				pods = append(pods, d)
				for _, p := range d.prefixes {
					subnets[p] = d
				}
			}
		}
	}

	// Pod subnets of networks outside the view are no outside addresses:
	// they are denied, never reached by leaving through an external
	// network (nothing transits, and SNAT must not hairpin into the
	// cluster), unless a pod subnet of the view holds the address.
	others := map[netip.Prefix]*viewNet{}
	for _, n := range vt.nets {
		if n.external || in[n.name] {
			continue
		}
		for _, p := range n.prefixes {
			if _, dup := others[p]; !dup {
				others[p] = n
			}
		}
	}

	isClosed := func(n *viewNet) bool { return closed && n == v }
	size := len(vt.extOwner) + len(others)
	for _, d := range pods {
		size += len(d.blocks) + len(d.prefixes)
	}
	blocks := make(map[netip.Prefix]tables.Route, size)
	keys := make([]netip.Prefix, 0, size)
	podKey := make(map[netip.Prefix]bool, size)
	for _, d := range pods {
		for _, b := range d.blocks {
			r := tables.Route{Kind: tables.RouteLocal, DstNet: d.id, Closed: isClosed(d)}
			if !b.local {
				r.Kind, r.SID = tables.RouteRemote, tables.SID(b.locator, tables.BehaviourL3Decap, v.id, d.id)
			}
			if _, dup := blocks[b.prefix]; !dup {
				blocks[b.prefix] = r
			}
			keys, podKey[b.prefix] = append(keys, b.prefix), true
		}
		for _, p := range d.prefixes {
			keys, podKey[p] = append(keys, p), true
		}
	}
	for p := range vt.extOwner {
		keys = append(keys, p)
	}
	for p := range others {
		keys = append(keys, p)
	}
	// Shorter prefixes first: an entry is placed knowing what its
	// enclosing entries already give.
	sort.Slice(keys, func(i, j int) bool {
		a, b := keys[i], keys[j]
		if a.Bits() != b.Bits() {
			return a.Bits() < b.Bits()
		}
		return a.Addr().Less(b.Addr())
	})

	placed := make(map[netip.Prefix]tables.Route, len(keys))
	out := make([]tables.Route, 0, len(keys))
	for _, k := range keys {
		if _, done := placed[k]; done {
			continue
		}
		r, ok := vt.entry(k, subnets, others, blocks, in, isClosed)
		if !ok {
			continue
		}
		// An entry of another kind than its prefix is (a pod entry on an
		// external prefix, an external one on a block) only restates what
		// the enclosing entry gives, unless something in between differs.
		podKind := r.Kind <= tables.RouteSubnet
		_, extKey := vt.extOwner[k]
		_, otherKey := others[k]
		natural := podKey[k] && podKind || extKey && !podKind || otherKey && r.Kind == tables.RouteDeny
		if !natural {
			if _, up, ok := longestAt(placed, k, 0); ok && sameEntry(up, r) {
				continue
			}
		}
		r.NetID, r.Prefix = v.id, k
		placed[k] = r
		out = append(out, r)
	}
	return append(out, vt.serviceRoutes(v, in, closed, placed)...)
}

// serviceRoutes are the VIP entries of view v: the services bound to a
// network of the view (its own unless closed, and every peer a policy
// grants it), and those a ServiceRoutingPolicy from v selects (by
// destination network name or labels, scoped by namespace). A
// ServiceRoutingPolicy grants the VIP only: the backends' addresses stay
// out of the view, and the data plane reaches them in the service's own
// network.
func (vt *viewTopology) serviceRoutes(v *viewNet, in map[string]bool, closed bool, placed map[netip.Prefix]tables.Route) []tables.Route {
	var out []tables.Route
	for _, svc := range vt.services {
		n := vt.byName[svc.Network]
		if n == nil || n.external {
			continue
		}
		ok := in[n.name] && !(n == v && closed)
		for _, g := range vt.srps {
			if ok {
				break
			}
			ok = g.src.Matches(v.labels) && (g.name == "" || g.name == n.name) && (g.dst == nil || g.dst.Matches(n.labels)) &&
				(g.ns == nil || g.ns.Matches(labels.Set(vt.namespaces[svc.Namespace])))
		}
		// A VIP the view does not reach falls to the service range's deny
		// entry below, never to an external network of the view.
		if !ok {
			continue
		}
		for _, vip := range svc.VIPs {
			p := netip.PrefixFrom(vip, vip.BitLen())
			if _, taken := placed[p]; taken {
				continue
			}
			r := tables.Route{NetID: v.id, Prefix: p, Kind: tables.RouteService, DstNet: n.id}
			placed[p] = r
			out = append(out, r)
		}
	}
	for _, c := range vt.serviceCIDRs {
		c = c.Masked()
		if _, taken := placed[c]; taken {
			continue
		}
		if _, up, covered := longestAt(placed, c, 0); covered && up.Kind == tables.RouteExternal {
			r := tables.Route{NetID: v.id, Prefix: c, Kind: tables.RouteDeny}
			placed[c] = r
			out = append(out, r)
		}
	}
	return out
}

// entry is what the view gives an address whose longest prefix of
// interest is k.
func (vt *viewTopology) entry(k netip.Prefix, subnets, others map[netip.Prefix]*viewNet, blocks map[netip.Prefix]tables.Route,
	in map[string]bool, isClosed func(*viewNet) bool) (tables.Route, bool) {
	sub, d, hasSub := longestAt(subnets, k, 0)
	osub, od, hasOther := longestAt(others, k, 0)
	ext, hasExt := vt.classifyPrefix(k)
	var owner *viewNet
	if hasExt {
		owner = vt.extOwner[ext]
	}
	// A pod subnet (of the view, or outside it and then denied) wins a
	// tie with an external prefix.
	if hasExt && in[owner.name] && (!hasSub || ext.Bits() > sub.Bits()) && (hasSub || !hasOther || ext.Bits() > osub.Bits()) {
		return tables.Route{Kind: tables.RouteExternal, DstNet: owner.id, Closed: isClosed(owner)}, true
	}
	if hasSub {
		if _, b, ok := longestAt(blocks, k, sub.Bits()); ok {
			return b, true
		}
		return tables.Route{Kind: tables.RouteSubnet, DstNet: d.id, Closed: isClosed(d)}, true
	}
	if hasOther && (!hasExt || osub.Bits() >= ext.Bits()) {
		return tables.Route{Kind: tables.RouteDeny, DstNet: od.id}, true
	}
	if hasExt {
		return tables.Route{Kind: tables.RouteDeny, DstNet: owner.id}, true
	}
	return tables.Route{}, false
}

func sameEntry(a, b tables.Route) bool {
	return a.Kind == b.Kind && a.DstNet == b.DstNet && a.SID == b.SID && a.Closed == b.Closed
}

func overlapsAny(ps []netip.Prefix, held map[netip.Prefix]*viewNet) bool {
	for _, p := range ps {
		for h := range held {
			if h.Overlaps(p) {
				return true
			}
		}
	}
	return false
}

// nodeContextRoutes are the view of the nodes' own context
// (tables.NodeNetID): every other node's addresses, reached over SRv6 at
// its locator. An endpoint answers there the flows an external frontend
// of another node sent it from that node's address.
func nodeContextRoutes(in NodeInput, locators map[string]netip.Prefix) []tables.Route {
	var out []tables.Route
	for _, u := range in.Underlays {
		loc, ok := locators[u.Spec.Node]
		if !ok || u.Spec.Node == in.Node {
			continue
		}
		sid := tables.SID(loc, tables.BehaviourL3Decap, tables.NodeNetID, tables.NodeNetID)
		for _, s := range u.Spec.Addresses {
			a, err := netip.ParseAddr(string(s))
			if err != nil {
				continue
			}
			out = append(out, tables.Route{NetID: tables.NodeNetID, Prefix: netip.PrefixFrom(a, a.BitLen()),
				Kind: tables.RouteRemote, DstNet: tables.NodeNetID, SID: sid})
		}
	}
	return out
}

// hostRoutes routes other nodes' l3 blocks via their underlay address of
// the block's family.
func hostRoutes(in NodeInput, ids map[string]uint32, byName map[string]*lacev1.Network) []HostRoute {
	addrs := map[string][]netip.Addr{}
	for _, u := range in.Underlays {
		for _, a := range u.Spec.Addresses {
			if ip, err := netip.ParseAddr(string(a)); err == nil {
				addrs[u.Spec.Node] = append(addrs[u.Spec.Node], ip)
			}
		}
	}
	best := map[netip.Prefix]uint32{}
	route := map[netip.Prefix]HostRoute{}
	for _, a := range in.Allocations {
		nw, id := byName[a.Spec.Network], ids[a.Spec.Network]
		if a.DeletionTimestamp != nil || a.Spec.Node == in.Node || nw == nil || id == 0 || nw.Spec.Type != lacev1.NetworkTypeL3 {
			continue
		}
		for _, s := range a.Spec.Prefixes {
			p, err := netip.ParsePrefix(string(s))
			if err != nil {
				continue
			}
			p = p.Masked()
			var via netip.Addr
			for _, ad := range addrs[a.Spec.Node] {
				if ad.Is4() == p.Addr().Is4() {
					via = ad
					break
				}
			}
			if !via.IsValid() {
				continue
			}
			if cur, ok := best[p]; ok && cur <= id {
				continue
			}
			best[p], route[p] = id, HostRoute{Prefix: p, Via: via}
		}
	}
	out := make([]HostRoute, 0, len(route))
	for _, r := range route {
		out = append(out, r)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Prefix.String() < out[j].Prefix.String() })
	return out
}

// insidePrefixes lists what lies inside the cluster: every pod network's
// subnets (all of them, not only routable blocks: a source anywhere in a
// subnet is a pod's or nobody's), the service ranges and every node's
// locator. One entry per prefix: a prefix that is two kinds keeps the
// lowest.
func insidePrefixes(in NodeInput, locators map[string]netip.Prefix) []tables.Inside {
	kinds := map[netip.Prefix]tables.InsideKind{}
	add := func(p netip.Prefix, k tables.InsideKind) {
		p = p.Masked()
		if cur, ok := kinds[p]; !ok || k < cur {
			kinds[p] = k
		}
	}
	for _, n := range in.Networks {
		if n.Spec.Type == lacev1.NetworkTypeExternal {
			continue
		}
		for _, s := range []*lacev1.Subnet{n.Spec.IPv4Subnet, n.Spec.IPv6Subnet} {
			if s == nil {
				continue
			}
			if p, err := netip.ParsePrefix(string(s.Prefix)); err == nil {
				add(p, tables.InsidePodSubnet)
			}
		}
	}
	for _, p := range in.ServiceCIDRs {
		add(p, tables.InsideServiceRange)
	}
	for _, loc := range locators {
		add(loc, tables.InsideLocator)
	}
	out := make([]tables.Inside, 0, len(kinds))
	for p, k := range kinds {
		out = append(out, tables.Inside{Prefix: p, Kind: k})
	}
	return out
}

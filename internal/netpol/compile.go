package netpol

import (
	"cmp"
	"net/netip"
	"slices"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/util/intstr"
)

// rule is one rule of a policy that selects at least one local pod, in a
// direction the policy applies to. Only such rules shape classes and
// verdicts: a policy of no local pod cannot decide a packet on this node.
type rule struct {
	// seq is the rule's position in compiler.rules. Rules are appended in
	// evaluation order: Admin ClusterPolicies (priority, name), then
	// NetworkPolicies (namespace/name), then Baseline ClusterPolicies;
	// within a policy ingress before egress, then by index. So within one
	// direction a lower seq is evaluated first (and, among NetworkPolicy
	// rules, is the one an allow is attributed to).
	seq    int
	policy uint32
	index  int
	dir    Dir
	tier   Tier   // tierNetworkPolicy for a NetworkPolicy's rule
	action Action // of a ClusterPolicy's rule: Accept, Deny or Pass

	// peerless: no from/to (or a Deny or Pass rule failing closed), so
	// the rule matches every peer (every class, 0 included) and never
	// takes part in a class's signature.
	peerless bool
	sels     []selPeer
	blocks   []ipBlock

	// allPorts: no ports, so every protocol and port (a prefix-72 entry).
	// Otherwise the rule allows exactly ports and named, which may both be
	// empty when every port entry was invalid: it then allows nothing.
	allPorts bool
	ports    []portRange
	named    []nameProto
}

// selPeer is a podSelector/namespaceSelector peer, or a ClusterPolicy's
// namespaces or pods peer.
type selPeer struct {
	// ownNS is the policy's namespace when the peer has no
	// namespaceSelector; nsSel is nil then.
	ownNS  string
	nsSel  labels.Selector
	podSel labels.Selector
}

// ipBlock is a parsed ipBlock: its cidr minus its excepts, all masked;
// also a ClusterPolicy's network, or one address of a node (a host
// prefix), neither with excepts.
type ipBlock struct {
	cidr   netip.Prefix
	except []netip.Prefix
}

// portRange is a numeric port entry, lo..hi inclusive.
type portRange struct {
	proto  uint8
	lo, hi uint16
}

// nameProto is a named port entry; it resolves against a pod's Ports.
type nameProto struct {
	name  string
	proto uint8
}

// local is a Local whose pod is known.
type local struct {
	ifindex  uint32
	pod      *Pod
	isolated Dir // by NetworkPolicy
	lookup   Dir // isolated, or a ClusterPolicy rule applies
	denyIn   uint32
	denyOut  uint32
	// rules lists, per direction (0 ingress, 1 egress), the seqs of the
	// rules that apply to the pod, in evaluation order.
	rules [2][]int
}

func dirIndex(d Dir) int {
	if d == Egress {
		return 1
	}
	return 0
}

// compiler is the working state of one Compile.
type compiler struct {
	in     Input
	pods   []*Pod           // unique by namespace/name, sorted by it
	cnps   []*ClusterPolicy // unique by name, in evaluation order
	nodes  []*Node          // unique by name
	locals []*local
	rules  []*rule
	refs   map[uint32]PolicyRef

	// Filled by classify (classes.go).
	classes   []*class // classes[0] is class 0, the empty signature
	classOf   map[string]int
	classIDs  map[uint32]int
	classesOf [][]int // rule seq -> indices of the classes whose signature holds it
	portsOf   map[*Pod]map[nameProto][]uint16

	t Tables
}

// Compile computes one node's policy tables. It never fails: parts of the
// input that the API server would reject fail closed (see the package doc
// and cluster.go), and ambiguous inputs are resolved as Input documents.
func Compile(in Input) Tables {
	c := newCompiler(in)
	c.selectSubjects()
	c.classify()
	c.emitVerdicts()
	return c.t
}

func newCompiler(in Input) *compiler {
	c := &compiler{
		in:      in,
		refs:    map[uint32]PolicyRef{},
		portsOf: map[*Pod]map[nameProto][]uint16{},
		t: Tables{
			Peers:     map[PeerKey]uint32{},
			CIDRs:     map[netip.Prefix]uint32{},
			Endpoints: map[uint32]Endpoint{},
			Verdicts:  map[VerdictKey]Verdict{},
			Policies:  map[uint32]PolicyRef{},
		},
	}
	c.pods = uniquePods(in.Pods)
	c.cnps = sortClusterPolicies(in.ClusterPolicies)
	c.nodes = uniqueNodes(in.Nodes)
	c.findLocals()
	return c
}

// uniquePods sorts pods by namespace/name and keeps, of several entries
// with one name, the first in the input (the sort is stable).
func uniquePods(pods []Pod) []*Pod {
	ps := make([]*Pod, 0, len(pods))
	for i := range pods {
		ps = append(ps, &pods[i])
	}
	slices.SortStableFunc(ps, func(a, b *Pod) int {
		return cmp.Or(cmp.Compare(a.Namespace, b.Namespace), cmp.Compare(a.Name, b.Name))
	})
	return slices.CompactFunc(ps, func(a, b *Pod) bool {
		return a.Namespace == b.Namespace && a.Name == b.Name
	})
}

type nsName struct{ ns, name string }

// findLocals keeps the Locals whose pod is known, the first of several
// claiming one ifindex (two pods cannot share a veth; the data plane's
// keys could not tell them apart).
func (c *compiler) findLocals() {
	byName := make(map[nsName]*Pod, len(c.pods))
	for _, p := range c.pods {
		byName[nsName{p.Namespace, p.Name}] = p
	}
	seen := map[uint32]bool{}
	for _, l := range c.in.Local {
		p := byName[nsName{l.Namespace, l.Name}]
		if p == nil || seen[l.Ifindex] {
			continue
		}
		seen[l.Ifindex] = true
		c.locals = append(c.locals, &local{ifindex: l.Ifindex, pod: p})
	}
}

// policyDirs is policyTypes with its default: Ingress always, Egress when
// the policy has egress rules. Unknown types are ignored.
func policyDirs(p *networkingv1.NetworkPolicy) Dir {
	if len(p.Spec.PolicyTypes) == 0 {
		if len(p.Spec.Egress) > 0 {
			return Ingress | Egress
		}
		return Ingress
	}
	var d Dir
	for _, t := range p.Spec.PolicyTypes {
		switch t {
		case networkingv1.PolicyTypeIngress:
			d |= Ingress
		case networkingv1.PolicyTypeEgress:
			d |= Egress
		}
	}
	return d
}

// selectSubjects collects the rules that apply to local pods, tier by
// tier so that their seqs are in evaluation order.
func (c *compiler) selectSubjects() {
	c.selectClusterSubjects(TierAdmin)
	c.selectNetworkPolicies()
	c.selectClusterSubjects(TierBaseline)
}

// selectNetworkPolicies walks the policies in namespace/name order,
// isolates the local pods each selects and collects the rules of those
// that select any.
func (c *compiler) selectNetworkPolicies() {
	pols := make([]*networkingv1.NetworkPolicy, 0, len(c.in.Policies))
	for _, p := range c.in.Policies {
		if p != nil {
			pols = append(pols, p)
		}
	}
	// Of several policies with one name (the API has one; a stale cache
	// may hand two) the first in the input counts, as for pods: two would
	// share one id and their verdicts could not be told apart.
	slices.SortStableFunc(pols, func(a, b *networkingv1.NetworkPolicy) int {
		return cmp.Or(cmp.Compare(a.Namespace, b.Namespace), cmp.Compare(a.Name, b.Name))
	})
	pols = slices.CompactFunc(pols, func(a, b *networkingv1.NetworkPolicy) bool {
		return a.Namespace == b.Namespace && a.Name == b.Name
	})
	var subjects []*local
	for _, p := range pols {
		dirs := policyDirs(p)
		if dirs == 0 {
			continue
		}
		sel := selectorOf(&p.Spec.PodSelector)
		subjects = subjects[:0]
		for _, l := range c.locals {
			if l.pod.Namespace == p.Namespace && sel.Matches(labels.Set(l.pod.Labels)) {
				subjects = append(subjects, l)
			}
		}
		if len(subjects) == 0 {
			continue
		}
		id := PolicyID(kindNetworkPolicy, p.Namespace, p.Name)
		c.refs[id] = PolicyRef{Kind: kindNetworkPolicy, Namespace: p.Namespace, Name: p.Name}
		for _, l := range subjects {
			l.isolated |= dirs
			l.lookup |= dirs
			if dirs&Ingress != 0 && l.denyIn == 0 {
				l.denyIn = id
			}
			if dirs&Egress != 0 && l.denyOut == 0 {
				l.denyOut = id
			}
		}
		if dirs&Ingress != 0 {
			for i, r := range p.Spec.Ingress {
				c.addRule(subjects, id, Ingress, i, p.Namespace, r.From, r.Ports)
			}
		}
		if dirs&Egress != 0 {
			for i, r := range p.Spec.Egress {
				c.addRule(subjects, id, Egress, i, p.Namespace, r.To, r.Ports)
			}
		}
	}
}

func (c *compiler) addRule(subjects []*local, policy uint32, dir Dir, index int, ns string,
	peers []networkingv1.NetworkPolicyPeer, ports []networkingv1.NetworkPolicyPort) {
	r := &rule{
		seq:      len(c.rules),
		policy:   policy,
		index:    index,
		dir:      dir,
		peerless: len(peers) == 0,
		allPorts: len(ports) == 0,
	}
	for i := range peers {
		parsePeer(r, ns, &peers[i])
	}
	for i := range ports {
		parsePort(r, &ports[i])
	}
	c.rules = append(c.rules, r)
	for _, l := range subjects {
		l.rules[dirIndex(dir)] = append(l.rules[dirIndex(dir)], r.seq)
	}
}

// parsePeer adds one from/to entry to r. An entry the API server would
// reject (ipBlock with a selector, no field at all, a bad CIDR) is dropped:
// it matches nothing, yet the rule keeps its peers (it is not peerless).
func parsePeer(r *rule, ns string, p *networkingv1.NetworkPolicyPeer) {
	if p.IPBlock != nil {
		if p.PodSelector != nil || p.NamespaceSelector != nil {
			return
		}
		if b, ok := parseIPBlock(p.IPBlock); ok {
			r.blocks = append(r.blocks, b)
		}
		return
	}
	switch {
	case p.PodSelector == nil && p.NamespaceSelector == nil:
		return
	case p.NamespaceSelector == nil:
		r.sels = append(r.sels, selPeer{ownNS: ns, podSel: selectorOf(p.PodSelector)})
	case p.PodSelector == nil:
		r.sels = append(r.sels, selPeer{nsSel: selectorOf(p.NamespaceSelector), podSel: labels.Everything()})
	default:
		r.sels = append(r.sels, selPeer{nsSel: selectorOf(p.NamespaceSelector), podSel: selectorOf(p.PodSelector)})
	}
}

// parseIPBlock parses and masks an ipBlock. A block with any unparsable
// prefix is invalid as a whole: dropping only a bad except would open
// what it meant to close.
func parseIPBlock(b *networkingv1.IPBlock) (ipBlock, bool) {
	cidr, err := netip.ParsePrefix(b.CIDR)
	if err != nil {
		return ipBlock{}, false
	}
	out := ipBlock{cidr: cidr.Masked()}
	for _, e := range b.Except {
		p, err := netip.ParsePrefix(e)
		if err != nil {
			return ipBlock{}, false
		}
		out.except = append(out.except, p.Masked())
	}
	return out, true
}

// protoNumber maps a policy or container port protocol ("" is TCP) to its
// IP protocol number; ok is false for anything else.
func protoNumber(p corev1.Protocol) (uint8, bool) {
	switch p {
	case "", corev1.ProtocolTCP:
		return protoTCP, true
	case corev1.ProtocolUDP:
		return protoUDP, true
	case corev1.ProtocolSCTP:
		return protoSCTP, true
	}
	return 0, false
}

// parsePort adds one ports entry to r; an invalid entry (unknown protocol,
// port out of 1..65535, endPort without a numeric port or below it) is
// dropped and so allows nothing.
func parsePort(r *rule, p *networkingv1.NetworkPolicyPort) {
	proto := protoTCP
	if p.Protocol != nil {
		n, ok := protoNumber(*p.Protocol) // "" reads as unspecified: TCP
		if !ok {
			return
		}
		proto = n
	}
	switch {
	case p.Port == nil:
		if p.EndPort != nil {
			return
		}
		r.ports = append(r.ports, portRange{proto: proto, lo: 0, hi: 65535})
	case p.Port.Type == intstr.Int:
		lo, hi := p.Port.IntVal, p.Port.IntVal
		if p.EndPort != nil {
			hi = *p.EndPort
		}
		if lo < 1 || hi > 65535 || hi < lo {
			return
		}
		r.ports = append(r.ports, portRange{proto: proto, lo: uint16(lo), hi: uint16(hi)})
	case p.Port.Type == intstr.String:
		if p.EndPort != nil || p.Port.StrVal == "" {
			return
		}
		r.named = append(r.named, nameProto{name: p.Port.StrVal, proto: proto})
	}
}

// podPorts is a pod's named ports: name/protocol -> port numbers (sorted,
// unique; usually one, but two containers may reuse a name and either
// port then answers to it).
func (c *compiler) podPorts(p *Pod) map[nameProto][]uint16 {
	if m, ok := c.portsOf[p]; ok {
		return m
	}
	m := map[nameProto][]uint16{}
	for _, cp := range p.Ports {
		proto, ok := protoNumber(cp.Protocol)
		if !ok || cp.Name == "" || cp.Port < 1 || cp.Port > 65535 {
			continue
		}
		k := nameProto{cp.Name, proto}
		if !slices.Contains(m[k], uint16(cp.Port)) {
			m[k] = append(m[k], uint16(cp.Port))
			slices.Sort(m[k])
		}
	}
	c.portsOf[p] = m
	return m
}

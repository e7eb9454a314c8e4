package netpol

import (
	"cmp"
	"net/netip"
	"slices"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
)

// The types below mirror ClusterNetworkPolicy (policy.networking.k8s.io
// v1beta1, sigs.k8s.io/network-policy-api v0.3.0) as far as the tables
// depend on it. They are our own, filled by the agent from unstructured
// objects: importing that module would force its Kubernetes libraries on
// the whole repository.

// Tier is a ClusterNetworkPolicy's tier. The tiers are evaluated Admin,
// then NetworkPolicy, then Baseline.
type Tier uint8

const (
	TierAdmin    Tier = 1
	TierBaseline Tier = 2

	// tierNetworkPolicy is the tier of a NetworkPolicy's rules; no
	// ClusterPolicy has it (one with an unknown tier is ignored).
	tierNetworkPolicy Tier = 0
)

// Action is what a ClusterRule does with the packets it matches.
type Action uint8

const (
	ActionAccept Action = 1 // final: pass (replies ride conntrack)
	ActionDeny   Action = 2 // final: drop
	ActionPass   Action = 3 // leave the rest of this tier to the next tier
)

// NamespacedPod selects the pods matching PodSelector in the namespaces
// matching NamespaceSelector; an empty selector matches everything.
type NamespacedPod struct {
	NamespaceSelector metav1.LabelSelector
	PodSelector       metav1.LabelSelector
}

// ClusterPeer is one entry of a rule's from/to: exactly one field is set.
// A peer with none or several set (an object of a CRD version we do not
// know), or with an invalid selector or prefix, is unrecognised and fails
// closed as the API defines: an Accept rule holding it matches nothing,
// a Deny or Pass rule holding it matches every peer (its Protocols still
// apply).
type ClusterPeer struct {
	Namespaces *metav1.LabelSelector // every pod (in any network) of the matching namespaces
	Pods       *NamespacedPod
	Networks   []netip.Prefix        // egress only; any address in them, pod addresses of any network included
	Nodes      *metav1.LabelSelector // egress only; the Addrs of the matching Nodes
}

// ClusterProtocol is one entry of a rule's protocols: a port or range of a
// protocol, or a named port.
type ClusterProtocol struct {
	Protocol  corev1.Protocol // TCP, UDP or SCTP; "" with NamedPort
	Port, End uint16          // Port alone: that port; End > Port: Port..End inclusive
	// NamedPort (destinationNamedPort) is a container port name of the
	// destination pod, of any protocol: the subject's own on ingress, the
	// peer's on egress (a non-pod peer has none).
	NamedPort string
}

// ClusterRule is one ingress or egress rule of a ClusterPolicy.
type ClusterRule struct {
	Name      string
	Action    Action // an unknown action is read as Deny (fail closed)
	Peers     []ClusterPeer
	Protocols []ClusterProtocol // empty: every protocol and port (ICMP included)
}

// ClusterSubject selects a ClusterPolicy's pods: exactly one field is set;
// none or both (or an invalid selector) select nothing.
type ClusterSubject struct {
	Namespaces *metav1.LabelSelector
	Pods       *NamespacedPod
}

// ClusterPolicy is a ClusterNetworkPolicy (cluster-scoped).
type ClusterPolicy struct {
	Name     string
	Tier     Tier
	Priority int32 // lower first; ties are broken by Name (the API leaves them to us)
	Subject  ClusterSubject
	Ingress  []ClusterRule
	Egress   []ClusterRule
}

// Node is what nodes peers need of a node.
type Node struct {
	Name   string
	Labels map[string]string
	Addrs  []netip.Addr // node.Status.Addresses' IPs
}

// Why these invalid parts fail the way they do (Decide implements the
// same choices on its own):
//   - a rule without peers, like one with an unrecognised peer (above):
//     the API requires one, so none means an object we cannot read;
//   - a protocol entry that is not exactly one of "a known protocol with
//     Port (and End > Port)" or "NamedPort alone" (port 0, End <= Port, a
//     protocol with a name, an unknown or missing protocol): nothing in an
//     Accept rule; in a Deny or Pass rule every port of its protocol, or
//     every packet when the protocol is unknown or missing;
//   - a network with host bits set is masked, as an ipBlock is; one that
//     is not valid (the zero Prefix: the agent could not parse it) makes
//     its peer unrecognised;
//   - a subject that is invalid selects nothing: no reading of it fails
//     closed for both Accept and Deny rules, and this is the one the
//     NetworkPolicy half of the package takes.

// clusterProto is the IP protocol of a ClusterProtocol; unlike a
// NetworkPolicy port, "" is no protocol, not TCP.
func clusterProto(p corev1.Protocol) (uint8, bool) {
	switch p {
	case corev1.ProtocolTCP:
		return protoTCP, true
	case corev1.ProtocolUDP:
		return protoUDP, true
	case corev1.ProtocolSCTP:
		return protoSCTP, true
	}
	return 0, false
}

// clusterAction reads an unknown action as Deny: whatever a newer API
// meant by it, dropping is the reading that opens nothing.
func clusterAction(a Action) Action {
	if a == ActionAccept || a == ActionPass {
		return a
	}
	return ActionDeny
}

// sortClusterPolicies keeps the first ClusterPolicy of each name (two
// would share one id) and of a known tier, in evaluation order: tier,
// priority, name.
func sortClusterPolicies(in []ClusterPolicy) []*ClusterPolicy {
	ps := make([]*ClusterPolicy, 0, len(in))
	for i := range in {
		ps = append(ps, &in[i])
	}
	slices.SortStableFunc(ps, func(a, b *ClusterPolicy) int { return cmp.Compare(a.Name, b.Name) })
	ps = slices.CompactFunc(ps, func(a, b *ClusterPolicy) bool { return a.Name == b.Name })
	ps = slices.DeleteFunc(ps, func(p *ClusterPolicy) bool { return p.Tier != TierAdmin && p.Tier != TierBaseline })
	slices.SortStableFunc(ps, func(a, b *ClusterPolicy) int {
		return cmp.Or(cmp.Compare(a.Tier, b.Tier), cmp.Compare(a.Priority, b.Priority))
	})
	return ps
}

// uniqueNodes keeps the first Node of each name.
func uniqueNodes(in []Node) []*Node {
	ns := make([]*Node, 0, len(in))
	for i := range in {
		ns = append(ns, &in[i])
	}
	slices.SortStableFunc(ns, func(a, b *Node) int { return cmp.Compare(a.Name, b.Name) })
	return slices.CompactFunc(ns, func(a, b *Node) bool { return a.Name == b.Name })
}

// selectClusterSubjects adds the rules of every ClusterPolicy of tier that
// selects a local pod, in evaluation order, so that seqs ascend in it.
func (c *compiler) selectClusterSubjects(tier Tier) {
	var subjects []*local
	for _, p := range c.cnps {
		if p.Tier != tier {
			continue
		}
		subjects = c.clusterSubjects(p, subjects[:0])
		if len(subjects) == 0 {
			continue
		}
		id := PolicyID(kindClusterNetworkPolicy, "", p.Name)
		c.refs[id] = PolicyRef{Kind: kindClusterNetworkPolicy, Name: p.Name}
		for i := range p.Ingress {
			c.addClusterRule(subjects, id, tier, Ingress, i, &p.Ingress[i])
		}
		for i := range p.Egress {
			c.addClusterRule(subjects, id, tier, Egress, i, &p.Egress[i])
		}
	}
}

// clusterSubjects appends to dst the local pods p selects.
func (c *compiler) clusterSubjects(p *ClusterPolicy, dst []*local) []*local {
	var nsSel, podSel labels.Selector
	switch s := p.Subject; {
	case s.Namespaces != nil && s.Pods == nil:
		nsSel, podSel = selectorOf(s.Namespaces), labels.Everything()
	case s.Pods != nil && s.Namespaces == nil:
		nsSel, podSel = selectorOf(&s.Pods.NamespaceSelector), selectorOf(&s.Pods.PodSelector)
	default:
		return dst
	}
	for _, l := range c.locals {
		if nsSel.Matches(labels.Set(c.in.Namespaces[l.pod.Namespace])) && podSel.Matches(labels.Set(l.pod.Labels)) {
			dst = append(dst, l)
		}
	}
	return dst
}

// addClusterRule parses one rule into a rule of the compiler, unless it
// can match no packet (an Accept failing closed, only peers that select
// nothing, only invalid protocols of an Accept): such a rule cannot decide
// anything, and leaving it out spares classes and lookups.
func (c *compiler) addClusterRule(subjects []*local, policy uint32, tier Tier, dir Dir, index int, cr *ClusterRule) {
	r := &rule{policy: policy, index: index, dir: dir, tier: tier, action: clusterAction(cr.Action)}
	failClosed := len(cr.Peers) == 0
	for i := range cr.Peers {
		if !c.parseClusterPeer(r, &cr.Peers[i]) {
			failClosed = true
		}
	}
	if failClosed {
		if r.action == ActionAccept {
			return
		}
		r.peerless, r.sels, r.blocks = true, nil, nil
	}
	if !r.peerless && len(r.sels) == 0 && len(r.blocks) == 0 {
		return
	}
	r.allPorts = len(cr.Protocols) == 0
	for i := range cr.Protocols {
		parseClusterProtocol(r, &cr.Protocols[i])
	}
	if !r.allPorts && len(r.ports) == 0 && len(r.named) == 0 {
		return
	}
	r.seq = len(c.rules)
	c.rules = append(c.rules, r)
	for _, l := range subjects {
		l.rules[dirIndex(dir)] = append(l.rules[dirIndex(dir)], r.seq)
		l.lookup |= dir
	}
}

// parseClusterPeer adds one peer to r; false means unrecognised.
func (c *compiler) parseClusterPeer(r *rule, p *ClusterPeer) bool {
	if clusterPeerFields(p) != 1 {
		return false
	}
	switch {
	case p.Namespaces != nil:
		s, err := metav1.LabelSelectorAsSelector(p.Namespaces)
		if err != nil {
			return false
		}
		r.sels = append(r.sels, selPeer{nsSel: s, podSel: labels.Everything()})
	case p.Pods != nil:
		ns, err := metav1.LabelSelectorAsSelector(&p.Pods.NamespaceSelector)
		if err != nil {
			return false
		}
		pod, err := metav1.LabelSelectorAsSelector(&p.Pods.PodSelector)
		if err != nil {
			return false
		}
		r.sels = append(r.sels, selPeer{nsSel: ns, podSel: pod})
	case r.dir == Ingress:
		// Networks and nodes are egress-only kinds the CRD's ingress peer
		// cannot hold: recognised, matching nothing.
	case len(p.Networks) > 0:
		for _, n := range p.Networks {
			if !n.IsValid() {
				return false
			}
		}
		for _, n := range p.Networks {
			r.blocks = append(r.blocks, ipBlock{cidr: n.Masked()})
		}
	default:
		s, err := metav1.LabelSelectorAsSelector(p.Nodes)
		if err != nil {
			return false
		}
		// A node's addresses are host prefixes, so they take part in the
		// CIDR regions like any network and also class the pods (if any)
		// holding one of them.
		for _, n := range c.nodes {
			if !s.Matches(labels.Set(n.Labels)) {
				continue
			}
			for _, a := range n.Addrs {
				if a.IsValid() {
					r.blocks = append(r.blocks, ipBlock{cidr: netip.PrefixFrom(a, a.BitLen())})
				}
			}
		}
	}
	return true
}

func clusterPeerFields(p *ClusterPeer) int {
	n := 0
	for _, set := range [...]bool{p.Namespaces != nil, p.Pods != nil, len(p.Networks) > 0, p.Nodes != nil} {
		if set {
			n++
		}
	}
	return n
}

// parseClusterProtocol adds one protocols entry to r (see above for the
// invalid ones). A named port becomes one name per port protocol: the
// container port's own protocol is the one it answers on.
func parseClusterProtocol(r *rule, p *ClusterProtocol) {
	proto, known := clusterProto(p.Protocol)
	switch {
	case p.NamedPort != "" && p.Protocol == "" && p.Port == 0 && p.End == 0:
		for _, pp := range portProtos {
			r.named = append(r.named, nameProto{name: p.NamedPort, proto: pp})
		}
	case p.NamedPort == "" && known && p.Port != 0 && (p.End == 0 || p.End > p.Port):
		r.ports = append(r.ports, portRange{proto: proto, lo: p.Port, hi: max(p.Port, p.End)})
	case r.action == ActionAccept:
	case known:
		r.ports = append(r.ports, portRange{proto: proto, lo: 0, hi: 65535})
	default:
		r.allPorts = true
	}
}

package netpol

import (
	"net/netip"
	"sort"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
)

// The ClusterNetworkPolicy half of Decide, written from the API's text
// (and the fail-closed choices documented in cluster.go) without Compile's
// code.

// decideTier is the first-match evaluation of one tier's ClusterPolicies:
// decided is false when no rule matches, or the first that does passes.
func decideTier(in Input, tier Tier, subject *Pod, dir Dir, peer PeerKey, peerPod *Pod, proto corev1.Protocol, port uint16) (allow bool, policy uint32, rule int, decided bool) {
	for _, p := range decideClusterOrder(in.ClusterPolicies, tier) {
		if !decideSubject(in, p.Subject, subject) {
			continue
		}
		rules := p.Ingress
		if dir == Egress {
			rules = p.Egress
		}
		for i := range rules {
			r := &rules[i]
			action := r.Action
			if action != ActionAccept && action != ActionPass {
				action = ActionDeny // unknown: fail closed
			}
			if !decideClusterRule(in, r, action, subject, dir, peer, peerPod, proto, port) {
				continue
			}
			id := PolicyID("ClusterNetworkPolicy", "", p.Name)
			switch action {
			case ActionAccept:
				return true, id, i, true
			case ActionDeny:
				return false, id, i, true
			}
			return false, 0, -1, false // Pass: the rest of the tier is skipped
		}
	}
	return false, 0, -1, false
}

// decideClusterOrder is the ClusterPolicies of tier by priority, then name;
// of several with one name (whatever their tiers) the first in the input.
func decideClusterOrder(all []ClusterPolicy, tier Tier) []*ClusterPolicy {
	var out []*ClusterPolicy
	seen := map[string]bool{}
	for i := range all {
		p := &all[i]
		if seen[p.Name] {
			continue
		}
		seen[p.Name] = true
		if p.Tier == tier {
			out = append(out, p)
		}
	}
	sort.SliceStable(out, func(i, j int) bool {
		if out[i].Priority != out[j].Priority {
			return out[i].Priority < out[j].Priority
		}
		return out[i].Name < out[j].Name
	})
	return out
}

// decideSubject: exactly one of namespaces or pods; anything else (or an
// invalid selector) selects nothing.
func decideSubject(in Input, s ClusterSubject, pod *Pod) bool {
	nsLabels := labels.Set(in.Namespaces[pod.Namespace])
	switch {
	case s.Namespaces != nil && s.Pods == nil:
		return selectorOf(s.Namespaces).Matches(nsLabels)
	case s.Pods != nil && s.Namespaces == nil:
		return selectorOf(&s.Pods.NamespaceSelector).Matches(nsLabels) &&
			selectorOf(&s.Pods.PodSelector).Matches(labels.Set(pod.Labels))
	}
	return false
}

// decideClusterRule: some peer matches and so does some protocol entry (or
// there are none). A rule without peers or with an unrecognised one fails
// closed: an Accept matches nothing, a Deny or Pass every peer.
func decideClusterRule(in Input, r *ClusterRule, action Action, subject *Pod, dir Dir, peer PeerKey, peerPod *Pod, proto corev1.Protocol, port uint16) bool {
	matched, unrecognised := false, len(r.Peers) == 0
	for i := range r.Peers {
		m, ok := decideClusterPeer(in, &r.Peers[i], dir, peer, peerPod)
		matched = matched || m
		unrecognised = unrecognised || !ok
	}
	if unrecognised {
		if action == ActionAccept {
			return false
		}
		matched = true
	}
	if !matched {
		return false
	}
	namedOn := subject // destinationNamedPort: the destination pod's
	if dir == Egress {
		namedOn = peerPod
	}
	return decideClusterProtocols(r.Protocols, action, proto, port, namedOn)
}

// decideClusterPeer returns whether pe matches the peer, and false for ok
// when pe is unrecognised: no field or several, an invalid selector or an
// invalid prefix.
func decideClusterPeer(in Input, pe *ClusterPeer, dir Dir, peer PeerKey, peerPod *Pod) (match, ok bool) {
	n := 0
	if pe.Namespaces != nil {
		n++
	}
	if pe.Pods != nil {
		n++
	}
	if len(pe.Networks) > 0 {
		n++
	}
	if pe.Nodes != nil {
		n++
	}
	if n != 1 {
		return false, false
	}
	switch {
	case pe.Namespaces != nil:
		s, err := metav1.LabelSelectorAsSelector(pe.Namespaces)
		if err != nil {
			return false, false
		}
		return peerPod != nil && s.Matches(labels.Set(in.Namespaces[peerPod.Namespace])), true
	case pe.Pods != nil:
		ns, err1 := metav1.LabelSelectorAsSelector(&pe.Pods.NamespaceSelector)
		pod, err2 := metav1.LabelSelectorAsSelector(&pe.Pods.PodSelector)
		if err1 != nil || err2 != nil {
			return false, false
		}
		return peerPod != nil && ns.Matches(labels.Set(in.Namespaces[peerPod.Namespace])) && pod.Matches(labels.Set(peerPod.Labels)), true
	case dir == Ingress:
		return false, true // networks and nodes: egress only
	case len(pe.Networks) > 0:
		for _, p := range pe.Networks {
			if !p.IsValid() {
				return false, false
			}
		}
		a := peer.Addr.WithZone("") // zones are not on the wire
		for _, p := range pe.Networks {
			if p.Masked().Contains(a) {
				return true, true
			}
		}
		return false, true
	}
	s, err := metav1.LabelSelectorAsSelector(pe.Nodes)
	if err != nil {
		return false, false
	}
	return decideNodeAddr(in.Nodes, s, peer.Addr), true
}

// decideNodeAddr: a matching node (the first Nodes entry of its name) has
// addr among its addresses.
func decideNodeAddr(nodes []Node, s labels.Selector, addr netip.Addr) bool {
	if !addr.IsValid() {
		return false
	}
	seen := map[string]bool{}
	for _, n := range nodes {
		if seen[n.Name] {
			continue
		}
		seen[n.Name] = true
		if !s.Matches(labels.Set(n.Labels)) {
			continue
		}
		for _, a := range n.Addrs {
			if a.IsValid() && a.WithZone("") == addr.WithZone("") {
				return true
			}
		}
	}
	return false
}

// decideClusterProtocols: no entries match every packet; otherwise some
// entry does. A valid entry is a protocol's port or range, or a named port
// resolved on namedOn (nil: a non-pod peer, which has none); an invalid one
// matches nothing in an Accept rule and, in a Deny or Pass rule, every port
// of its protocol, or everything if it has no known protocol.
func decideClusterProtocols(prs []ClusterProtocol, action Action, proto corev1.Protocol, port uint16, namedOn *Pod) bool {
	if len(prs) == 0 {
		return true
	}
	portful := proto == corev1.ProtocolTCP || proto == corev1.ProtocolUDP || proto == corev1.ProtocolSCTP
	for _, pr := range prs {
		known := pr.Protocol == corev1.ProtocolTCP || pr.Protocol == corev1.ProtocolUDP || pr.Protocol == corev1.ProtocolSCTP
		switch {
		case pr.NamedPort != "" && pr.Protocol == "" && pr.Port == 0 && pr.End == 0:
			if portful && namedOn != nil && decideNamed(namedOn, pr.NamedPort, proto, port) {
				return true
			}
		case pr.NamedPort == "" && known && pr.Port != 0 && (pr.End == 0 || pr.End > pr.Port):
			if proto == pr.Protocol && port >= pr.Port && port <= max(pr.Port, pr.End) {
				return true
			}
		case action == ActionAccept:
		case known:
			if proto == pr.Protocol {
				return true
			}
		default:
			return true
		}
	}
	return false
}

package netpol

import (
	"net/netip"
	"slices"
	"sort"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/util/intstr"
)

// Decide is the reference evaluation of one packet, straight from the
// NetworkPolicy and ClusterNetworkPolicy semantics and not from Tables: it
// is the check on Compile (tests, and later an oracle), so it deliberately
// shares none of Compile's matching code, only the label selector
// conversion.
//
// The packet is seen from pod namespace/name in direction dir; peer is the
// other end (source for ingress, destination for egress, after service
// translation); proto is TCP, UDP or SCTP, or "" (or anything else) for a
// protocol without ports such as ICMP, whose port is then ignored; port is
// the destination port.
//
// The tiers are evaluated in the API's order: the Admin
// ClusterPolicies' first matching rule (priority, name, rule order)
// decides, unless it is a Pass; then, if a NetworkPolicy isolates the pod
// in that direction, the NetworkPolicies decide (see decideNetworkPolicies);
// then the Baseline ClusterPolicies as the Admin ones, a Pass deciding
// nothing. It returns whether the packet is allowed and the policy and
// rule index of the deciding rule; or, denied by NetworkPolicy isolation,
// the first policy isolating the pod in that direction and rule -1; or,
// when nothing decides (or the pod is not in in.Pods), true, 0 and -1.
func Decide(in Input, namespace, name string, dir Dir, peer PeerKey, proto corev1.Protocol, port uint16) (allow bool, policy uint32, rule int) {
	var subject *Pod
	for i := range in.Pods {
		if in.Pods[i].Namespace == namespace && in.Pods[i].Name == name {
			subject = &in.Pods[i]
			break
		}
	}
	if subject == nil {
		return true, 0, -1
	}
	peerPod := decidePeerPod(in.Pods, peer)
	if allow, policy, rule, ok := decideTier(in, TierAdmin, subject, dir, peer, peerPod, proto, port); ok {
		return allow, policy, rule
	}
	if allow, policy, rule, ok := decideNetworkPolicies(in, subject, dir, peer, peerPod, proto, port); ok {
		return allow, policy, rule
	}
	if allow, policy, rule, ok := decideTier(in, TierBaseline, subject, dir, peer, peerPod, proto, port); ok {
		return allow, policy, rule
	}
	return true, 0, -1
}

// decideNetworkPolicies is the NetworkPolicy tier: decided when some
// policy isolates the subject in dir, and then allowed by the first
// allowing rule (policies in namespace/name order, then rule order), or
// denied on account of the first isolating policy (rule -1).
func decideNetworkPolicies(in Input, subject *Pod, dir Dir, peer PeerKey, peerPod *Pod, proto corev1.Protocol, port uint16) (allow bool, policy uint32, rule int, decided bool) {
	var pols []*networkingv1.NetworkPolicy
	seen := map[[2]string]bool{}
	for _, p := range in.Policies {
		// Of several policies with one name, the first in the input.
		if p != nil && !seen[[2]string{p.Namespace, p.Name}] {
			seen[[2]string{p.Namespace, p.Name}] = true
			pols = append(pols, p)
		}
	}
	sort.SliceStable(pols, func(i, j int) bool {
		if pols[i].Namespace != pols[j].Namespace {
			return pols[i].Namespace < pols[j].Namespace
		}
		return pols[i].Name < pols[j].Name
	})

	var denyBy uint32
	for _, p := range pols {
		if p.Namespace != subject.Namespace || !decideApplies(p, dir) {
			continue
		}
		if !selectorOf(&p.Spec.PodSelector).Matches(labels.Set(subject.Labels)) {
			continue
		}
		id := PolicyID("NetworkPolicy", p.Namespace, p.Name)
		if denyBy == 0 {
			denyBy = id
		}
		if dir == Ingress {
			for i, r := range p.Spec.Ingress {
				// Ingress named ports are the subject's own.
				if decidePeers(in, p.Namespace, r.From, peer, peerPod) && decidePorts(r.Ports, proto, port, subject) {
					return true, id, i, true
				}
			}
		} else {
			for i, r := range p.Spec.Egress {
				// Egress named ports are the destination pod's.
				if decidePeers(in, p.Namespace, r.To, peer, peerPod) && decidePorts(r.Ports, proto, port, peerPod) {
					return true, id, i, true
				}
			}
		}
	}
	if denyBy == 0 {
		return false, 0, -1, false
	}
	return false, denyBy, -1, true
}

// decideApplies: policyTypes, or when it is empty Ingress always and
// Egress if the policy has egress rules.
func decideApplies(p *networkingv1.NetworkPolicy, dir Dir) bool {
	if len(p.Spec.PolicyTypes) == 0 {
		return dir == Ingress || (dir == Egress && len(p.Spec.Egress) != 0)
	}
	for _, t := range p.Spec.PolicyTypes {
		if (t == networkingv1.PolicyTypeIngress && dir == Ingress) || (t == networkingv1.PolicyTypeEgress && dir == Egress) {
			return true
		}
	}
	return false
}

// decidePeerPod is the pod holding peer's address in peer's network: of
// several (a misconfiguration), the first in namespace/name order; of
// several Pods entries with one name, only the first counts.
func decidePeerPod(pods []Pod, peer PeerKey) *Pod {
	if !peer.Addr.IsValid() {
		return nil
	}
	var owner *Pod
	seen := map[[2]string]bool{}
	for i := range pods {
		p := &pods[i]
		k := [2]string{p.Namespace, p.Name}
		if seen[k] {
			continue
		}
		seen[k] = true
		if p.NetID != peer.NetID || !slices.Contains(p.Addrs, peer.Addr) {
			continue
		}
		if owner == nil || p.Namespace < owner.Namespace || (p.Namespace == owner.Namespace && p.Name < owner.Name) {
			owner = p
		}
	}
	return owner
}

// decidePeers: an empty list matches everyone; otherwise any entry does.
// Entries the API server would reject match nothing.
func decidePeers(in Input, policyNS string, peers []networkingv1.NetworkPolicyPeer, peer PeerKey, peerPod *Pod) bool {
	if len(peers) == 0 {
		return true
	}
	for _, pe := range peers {
		if pe.IPBlock != nil {
			if pe.PodSelector == nil && pe.NamespaceSelector == nil && decideInBlock(pe.IPBlock, peer.Addr) {
				return true
			}
			continue
		}
		if peerPod == nil || (pe.PodSelector == nil && pe.NamespaceSelector == nil) {
			continue
		}
		podLabels := labels.Set(peerPod.Labels)
		if pe.NamespaceSelector == nil {
			if peerPod.Namespace == policyNS && selectorOf(pe.PodSelector).Matches(podLabels) {
				return true
			}
			continue
		}
		if !selectorOf(pe.NamespaceSelector).Matches(labels.Set(in.Namespaces[peerPod.Namespace])) {
			continue
		}
		if pe.PodSelector == nil || selectorOf(pe.PodSelector).Matches(podLabels) {
			return true
		}
	}
	return false
}

// decideInBlock: addr is in cidr and in none of the excepts; a block with
// an unparsable prefix matches nothing. Zones are not on the wire.
func decideInBlock(b *networkingv1.IPBlock, addr netip.Addr) bool {
	addr = addr.WithZone("")
	cidr, err := netip.ParsePrefix(b.CIDR)
	if err != nil || !cidr.Contains(addr) {
		return false
	}
	for _, e := range b.Except {
		ex, err := netip.ParsePrefix(e)
		if err != nil || ex.Contains(addr) {
			return false
		}
	}
	return true
}

// decidePorts: an empty list matches every protocol and port; otherwise a
// port-less protocol matches nothing, and a port entry matches its
// protocol (default TCP) and its port: any, a number, number..endPort, or
// a name resolved on namedOn (nil: a non-pod peer, which has no names).
func decidePorts(ports []networkingv1.NetworkPolicyPort, proto corev1.Protocol, port uint16, namedOn *Pod) bool {
	if len(ports) == 0 {
		return true
	}
	if proto != corev1.ProtocolTCP && proto != corev1.ProtocolUDP && proto != corev1.ProtocolSCTP {
		return false
	}
	for _, pp := range ports {
		want := corev1.ProtocolTCP
		if pp.Protocol != nil && *pp.Protocol != "" {
			want = *pp.Protocol
		}
		if want != proto {
			continue
		}
		if pp.Port == nil {
			if pp.EndPort == nil {
				return true
			}
			continue
		}
		switch pp.Port.Type {
		case intstr.Int:
			lo, hi := pp.Port.IntVal, pp.Port.IntVal
			if pp.EndPort != nil {
				hi = *pp.EndPort
			}
			if lo >= 1 && hi <= 65535 && lo <= hi && int32(port) >= lo && int32(port) <= hi {
				return true
			}
		case intstr.String:
			if pp.EndPort == nil && pp.Port.StrVal != "" && namedOn != nil && decideNamed(namedOn, pp.Port.StrVal, proto, port) {
				return true
			}
		}
	}
	return false
}

// decideNamed: some container port of pod is name/proto at port.
func decideNamed(pod *Pod, name string, proto corev1.Protocol, port uint16) bool {
	for _, cp := range pod.Ports {
		p := cp.Protocol
		if p == "" {
			p = corev1.ProtocolTCP
		}
		if cp.Name == name && p == proto && cp.Port >= 1 && cp.Port <= 65535 && cp.Port == int32(port) {
			return true
		}
	}
	return false
}

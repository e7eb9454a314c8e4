// Package netpolapi reads the Kubernetes objects network policies depend
// on (NetworkPolicies, ClusterNetworkPolicies, pods with their
// NetworkEndpoints, namespaces, nodes) into internal/netpol's input: one
// reading for the agent, which enforces them, and lacectl, which explains
// them. It owns no state and makes no API calls.
package netpolapi

import (
	"fmt"
	"net/netip"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"

	"github.com/lace-cni/lace/internal/netpol"
)

// ClusterNetworkPolicyGVK is the stored version of sig-network's
// ClusterNetworkPolicy (sigs.k8s.io/network-policy-api v0.3.0, the API
// that took AdminNetworkPolicy's and BaselineAdminNetworkPolicy's place:
// their tiers are its Admin and Baseline). The agent reads it as
// unstructured objects: the upstream Go module would pull a newer
// Kubernetes client than the rest of Lace builds with.
var ClusterNetworkPolicyGVK = schema.GroupVersionKind{Group: "policy.networking.k8s.io", Version: "v1beta1", Kind: "ClusterNetworkPolicy"}

// The wire form of what Lace reads of a ClusterNetworkPolicy (the fields
// of the upstream v1beta1 schema, by their JSON names).
type cnpWire struct {
	Metadata metav1.ObjectMeta `json:"metadata"`
	Spec     struct {
		Tier     string `json:"tier"`
		Priority int32  `json:"priority"`
		Subject  struct {
			Namespaces *metav1.LabelSelector `json:"namespaces,omitempty"`
			Pods       *namespacedPodWire    `json:"pods,omitempty"`
		} `json:"subject"`
		Ingress []cnpRuleWire `json:"ingress,omitempty"`
		Egress  []cnpRuleWire `json:"egress,omitempty"`
	} `json:"spec"`
}

type namespacedPodWire struct {
	NamespaceSelector metav1.LabelSelector `json:"namespaceSelector"`
	PodSelector       metav1.LabelSelector `json:"podSelector"`
}

type cnpRuleWire struct {
	Name      string         `json:"name,omitempty"`
	Action    string         `json:"action"`
	From      []cnpPeerWire  `json:"from,omitempty"`
	To        []cnpPeerWire  `json:"to,omitempty"`
	Protocols []cnpProtoWire `json:"protocols,omitempty"`
}

type cnpPeerWire struct {
	Namespaces  *metav1.LabelSelector `json:"namespaces,omitempty"`
	Pods        *namespacedPodWire    `json:"pods,omitempty"`
	Nodes       *metav1.LabelSelector `json:"nodes,omitempty"`
	Networks    []string              `json:"networks,omitempty"`
	DomainNames []string              `json:"domainNames,omitempty"`
}

type cnpPortWire struct {
	DestinationPort *struct {
		Number int32 `json:"number,omitempty"`
		Range  *struct {
			Start int32 `json:"start"`
			End   int32 `json:"end"`
		} `json:"range,omitempty"`
	} `json:"destinationPort,omitempty"`
}

type cnpProtoWire struct {
	TCP                  *cnpPortWire `json:"tcp,omitempty"`
	UDP                  *cnpPortWire `json:"udp,omitempty"`
	SCTP                 *cnpPortWire `json:"sctp,omitempty"`
	DestinationNamedPort string       `json:"destinationNamedPort,omitempty"`
}

// ClusterPolicyOf reads an unstructured ClusterNetworkPolicy. What it
// cannot read as the API defines it is carried so that the compiler fails
// closed on it (a peer of no kind it knows, a protocol without a port):
// an Accept then admits nothing by it, a Deny or a Pass takes everything.
func ClusterPolicyOf(u *unstructured.Unstructured) (netpol.ClusterPolicy, error) {
	var w cnpWire
	if err := runtime.DefaultUnstructuredConverter.FromUnstructured(u.Object, &w); err != nil {
		return netpol.ClusterPolicy{}, fmt.Errorf("read ClusterNetworkPolicy %s: %w", u.GetName(), err)
	}
	out := netpol.ClusterPolicy{Name: u.GetName(), Priority: w.Spec.Priority}
	switch w.Spec.Tier {
	case "Admin":
		out.Tier = netpol.TierAdmin
	case "Baseline":
		out.Tier = netpol.TierBaseline
	default:
		return out, fmt.Errorf("ClusterNetworkPolicy %s: unknown tier %q", u.GetName(), w.Spec.Tier)
	}
	out.Subject.Namespaces = w.Spec.Subject.Namespaces
	out.Subject.Pods = namespacedPod(w.Spec.Subject.Pods)
	for _, r := range w.Spec.Ingress {
		out.Ingress = append(out.Ingress, clusterRule(r, r.From))
	}
	for _, r := range w.Spec.Egress {
		out.Egress = append(out.Egress, clusterRule(r, r.To))
	}
	return out, nil
}

func namespacedPod(p *namespacedPodWire) *netpol.NamespacedPod {
	if p == nil {
		return nil
	}
	return &netpol.NamespacedPod{NamespaceSelector: p.NamespaceSelector, PodSelector: p.PodSelector}
}

func clusterRule(r cnpRuleWire, peers []cnpPeerWire) netpol.ClusterRule {
	out := netpol.ClusterRule{Name: r.Name}
	switch r.Action {
	case "Accept":
		out.Action = netpol.ActionAccept
	case "Deny":
		out.Action = netpol.ActionDeny
	case "Pass":
		out.Action = netpol.ActionPass
	default:
		// An action the API does not have: nothing is admitted by it,
		// and nothing is let through past the policies that follow.
		out.Action = netpol.ActionDeny
	}
	for _, p := range peers {
		cp := netpol.ClusterPeer{Namespaces: p.Namespaces, Pods: namespacedPod(p.Pods), Nodes: p.Nodes}
		bad := false
		for _, s := range p.Networks {
			pfx, err := netip.ParsePrefix(s)
			if err != nil {
				bad = true
				continue
			}
			cp.Networks = append(cp.Networks, pfx.Masked())
		}
		// A peer of a kind Lace does not enforce (domainNames) or a
		// network it cannot read is unrecognised: no field set.
		if bad || (len(p.DomainNames) > 0 && cp.Namespaces == nil && cp.Pods == nil && cp.Nodes == nil && len(cp.Networks) == 0) {
			cp = netpol.ClusterPeer{}
		}
		out.Peers = append(out.Peers, cp)
	}
	for _, p := range r.Protocols {
		out.Protocols = append(out.Protocols, clusterProtocols(p)...)
	}
	return out
}

func clusterProtocols(p cnpProtoWire) []netpol.ClusterProtocol {
	if p.DestinationNamedPort != "" {
		return []netpol.ClusterProtocol{{NamedPort: p.DestinationNamedPort}}
	}
	// An entry of no protocol Lace reads stays, invalid: an Accept opens
	// nothing by it (an empty list would open every port).
	if p.TCP == nil && p.UDP == nil && p.SCTP == nil {
		return []netpol.ClusterProtocol{{}}
	}
	var out []netpol.ClusterProtocol
	for _, e := range []struct {
		proto corev1.Protocol
		w     *cnpPortWire
	}{{corev1.ProtocolTCP, p.TCP}, {corev1.ProtocolUDP, p.UDP}, {corev1.ProtocolSCTP, p.SCTP}} {
		if e.w == nil {
			continue
		}
		cp := netpol.ClusterProtocol{Protocol: e.proto}
		if d := e.w.DestinationPort; d != nil {
			switch {
			case d.Range != nil:
				cp.Port, cp.End = portOf(d.Range.Start), portOf(d.Range.End)
			default:
				cp.Port = portOf(d.Number)
			}
		}
		out = append(out, cp)
	}
	return out
}

// portOf is a port number, 0 (invalid: the compiler fails closed on it)
// when out of range.
func portOf(n int32) uint16 {
	if n < 1 || n > 65535 {
		return 0
	}
	return uint16(n)
}

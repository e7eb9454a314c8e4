package policy

import (
	"fmt"
	"sort"

	networkingv1 "k8s.io/api/networking/v1"

	"github.com/lace-cni/lace/internal/netpol"
)

// What one namespace's NetworkPolicies may cost a node. A tenant writes
// them; the node's tables and its compile time are shared by every
// tenant. A namespace over a limit has its policies enforced as their
// deny-all selves (the pods they select, the directions they isolate, no
// rule: fail closed, for that namespace only), with an Event saying so.
// ClusterNetworkPolicies are the cluster administrator's: not limited.
const (
	// maxNamespaceRules are the ingress and egress rules of a namespace's
	// policies.
	maxNamespaceRules = 5000
	// maxNamespacePrefixes are the ipBlock CIDRs and excepts (each may
	// split every class of the node).
	maxNamespacePrefixes = 2000
	// maxNamespaceVerdicts are the verdict entries the namespace's pods on
	// the node may take (lace_pol holds 524288).
	maxNamespaceVerdicts = 65536
)

// ReasonPolicyNotEnforced is the Warning on a NetworkPolicy whose namespace
// is over its limits.
const ReasonPolicyNotEnforced = "PolicyOverLimit"

// limitInput replaces the policies of each namespace over the rule or
// prefix limit by their deny-all selves, and says which and why.
func limitInput(in *netpol.Input) map[string]string {
	rules, prefixes := map[string]int{}, map[string]int{}
	for _, p := range in.Policies {
		rules[p.Namespace] += len(p.Spec.Ingress) + len(p.Spec.Egress)
		for _, r := range p.Spec.Ingress {
			prefixes[p.Namespace] += blockPrefixes(r.From)
		}
		for _, r := range p.Spec.Egress {
			prefixes[p.Namespace] += blockPrefixes(r.To)
		}
	}
	over := map[string]string{}
	for ns, n := range rules {
		if n > maxNamespaceRules {
			over[ns] = fmt.Sprintf("its NetworkPolicies have %d rules, over the %d a namespace may have", n, maxNamespaceRules)
		}
	}
	for ns, n := range prefixes {
		if n > maxNamespacePrefixes {
			over[ns] = fmt.Sprintf("its NetworkPolicies have %d ipBlock prefixes, over the %d a namespace may have", n, maxNamespacePrefixes)
		}
	}
	if len(over) > 0 {
		denyAll(in, over)
	}
	return over
}

func blockPrefixes(peers []networkingv1.NetworkPolicyPeer) int {
	n := 0
	for _, p := range peers {
		if p.IPBlock != nil {
			n += 1 + len(p.IPBlock.Except)
		}
	}
	return n
}

// denyAll replaces the policies of the namespaces in over by their
// deny-all selves: the same pods and directions, no rule.
func denyAll(in *netpol.Input, over map[string]string) {
	for i, p := range in.Policies {
		if _, ok := over[p.Namespace]; !ok {
			continue
		}
		q := p.DeepCopy()
		types := q.Spec.PolicyTypes
		if len(types) == 0 {
			types = []networkingv1.PolicyType{networkingv1.PolicyTypeIngress}
			if len(q.Spec.Egress) > 0 {
				types = append(types, networkingv1.PolicyTypeEgress)
			}
		}
		q.Spec.PolicyTypes, q.Spec.Ingress, q.Spec.Egress = types, nil, nil
		in.Policies[i] = q
	}
}

// overVerdicts are the namespaces whose pods on this node take more
// verdicts than a namespace may, and, while the node's total does not fit
// capacity, the largest of the rest.
func overVerdicts(t netpol.Tables, locals []netpol.Local, capacity int) map[string]string {
	nsOf := map[uint32]string{}
	for _, l := range locals {
		nsOf[l.Ifindex] = l.Namespace
	}
	count := map[string]int{}
	for k := range t.Verdicts {
		count[nsOf[k.Ifindex]]++
	}
	over := map[string]string{}
	total := len(t.Verdicts)
	var order []string
	for ns, n := range count {
		if n > maxNamespaceVerdicts {
			over[ns] = fmt.Sprintf("its pods on this node take %d policy verdicts, over the %d a namespace may take", n, maxNamespaceVerdicts)
			total -= n
		} else {
			order = append(order, ns)
		}
	}
	sort.Slice(order, func(i, j int) bool {
		return count[order[i]] > count[order[j]] || count[order[i]] == count[order[j]] && order[i] < order[j]
	})
	for _, ns := range order {
		if total <= capacity {
			break
		}
		over[ns] = fmt.Sprintf("the node's policy verdicts (%d) exceed its table (%d): the largest namespaces' first", total, capacity)
		total -= count[ns]
	}
	return over
}

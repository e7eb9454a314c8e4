package lacectl

// lacectl trace and network policies: a flow the topology allows between
// pods, or between a pod and an outside address, is then decided by the
// policies of the pod that sends it (egress) and of the pod it goes to
// (ingress). The decision is netpol.Decide's, the reading of the API
// written apart from the compiler whose tables the data plane looks up
// (docs/network-policy.md); this file only asks it and says who decided.

import (
	"context"
	"fmt"
	"strings"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/lace-cni/lace/internal/dpmetrics"
	"github.com/lace-cni/lace/internal/model"
	"github.com/lace-cni/lace/internal/netpol"
	"github.com/lace-cni/lace/internal/netpolapi"
)

// PolicyDecision is one side's policies on a traced flow.
type PolicyDecision struct {
	// Applies: some policy has a say on this side (else it is open).
	Applies bool
	Allowed bool
	// Kind/Namespace/Name and Rule name the deciding policy and rule
	// (Rule -1: the pod is isolated by that NetworkPolicy and no rule
	// allows the flow; Name empty: nothing decided, the flow is allowed).
	Kind, Namespace, Name string
	Rule                  int
}

// TracePolicy is what the policies decide on a traced flow.
type TracePolicy struct {
	Egress, Ingress PolicyDecision
}

// Denied says whether either side refuses the flow.
func (p *TracePolicy) Denied() bool {
	return p != nil && ((p.Egress.Applies && !p.Egress.Allowed) || (p.Ingress.Applies && !p.Ingress.Allowed))
}

// policyInput is the netpol input of the whole cluster (every pod is a
// subject: Decide looks at the pods it is asked about).
func policyInput(in TraceInput) netpol.Input {
	out := netpol.Input{ClusterPolicies: in.ClusterPolicies, Nodes: netpolapi.NodesOf(in.Nodes),
		Pods: netpolapi.PodsOf(netpolapi.PeersOf(in.Pods), in.NetworkEndpoints, in.Networks), Namespaces: map[string]map[string]string{}}
	for i := range in.NetworkPolicies {
		out.Policies = append(out.Policies, &in.NetworkPolicies[i])
	}
	for _, ns := range in.Namespaces {
		out.Namespaces[ns.Name] = ns.Labels
	}
	return out
}

// tracePolicy asks the policies about r's flow (its topology verdict
// allowed it), when either side is a pod.
func tracePolicy(in TraceInput, r TraceResult) *TracePolicy {
	if len(in.NetworkPolicies) == 0 && len(in.ClusterPolicies) == 0 {
		return nil
	}
	pin := policyInput(in)
	refs := netpol.Refs(pin)
	proto := corev1.Protocol(strings.ToUpper(r.Proto))
	if r.Proto == "icmp" {
		proto = ""
	}
	ids := map[string]uint32{}
	for _, n := range in.Networks {
		ids[n.Name] = uint32(n.Status.ID)
	}
	peerOf := func(e TraceEndpoint, network string) netpol.PeerKey {
		return netpol.PeerKey{NetID: ids[network], Addr: e.Addr}
	}
	decide := func(e TraceEndpoint, dir netpol.Dir, peer netpol.PeerKey) PolicyDecision {
		ns, name, _ := strings.Cut(e.Pod, "/")
		allow, id, rule := netpol.Decide(pin, ns, name, dir, peer, proto, r.Port)
		d := PolicyDecision{Applies: id != 0, Allowed: allow, Rule: rule}
		if ref, ok := refs[id]; ok {
			d.Kind, d.Namespace, d.Name = ref.Kind, ref.Namespace, ref.Name
		}
		return d
	}
	var p TracePolicy
	// The peer of each side is the other side in its own network (an
	// outside address in the external network it was classified into).
	if r.Src.Kind == model.EndpointPod {
		p.Egress = decide(r.Src, netpol.Egress, peerOf(r.Dst, peerNetwork(r.Dst, r.Verdict.DstNetwork)))
	}
	if r.Dst.Kind == model.EndpointPod {
		p.Ingress = decide(r.Dst, netpol.Ingress, peerOf(r.Src, peerNetwork(r.Src, r.Verdict.SrcNetwork)))
	}
	return &p
}

func peerNetwork(e TraceEndpoint, classified string) string {
	if e.Kind == model.EndpointPod {
		return e.Network
	}
	return classified
}

// String says who decided, for people.
func (d PolicyDecision) String() string {
	who := netpol.PolicyRef{Kind: d.Kind, Namespace: d.Namespace, Name: d.Name}.String()
	switch {
	case !d.Applies || d.Name == "":
		return "no policy decides: allowed"
	case d.Allowed:
		return fmt.Sprintf("allowed by %s rule %d", who, d.Rule)
	case d.Rule < 0:
		return fmt.Sprintf("denied: isolated by %s, no rule allows it", who)
	}
	return fmt.Sprintf("denied by %s rule %d", who, d.Rule)
}

// policyLines are Print's lines about the policies.
func (p *TracePolicy) lines(r TraceResult) []string {
	if p == nil {
		return nil
	}
	var out []string
	if r.Src.Kind == model.EndpointPod {
		out = append(out, "egress:       "+p.Egress.String())
	}
	if r.Dst.Kind == model.EndpointPod {
		out = append(out, "ingress:      "+p.Ingress.String())
	}
	return out
}

// policyDropped says where a flow the policies refuse is dropped.
func (p *TracePolicy) dropped(r TraceResult) string {
	d, node := p.Egress, r.Src.NodeName
	if !(d.Applies && !d.Allowed) {
		d, node = p.Ingress, r.Dst.NodeName
	}
	return fmt.Sprintf("on node %s, counted as %s{%s=%q} and %s{kind=%q,namespace=%q,name=%q}", node,
		dpmetrics.Dropped, dpmetrics.LabelReason, "policy", dpmetrics.PolicyDrops, d.Kind, d.Namespace, d.Name)
}

// readPolicies reads the cluster's network policies into in, and says
// whether it has any.
func readPolicies(ctx context.Context, c client.Client, in *TraceInput) (bool, error) {
	var nps networkingv1.NetworkPolicyList
	if err := c.List(ctx, &nps); err != nil {
		return false, fmt.Errorf("list network policies: %w", err)
	}
	in.NetworkPolicies = nps.Items
	ul := &unstructured.UnstructuredList{}
	ul.SetGroupVersionKind(netpolapi.ClusterNetworkPolicyListGVK)
	if err := c.List(ctx, ul); err != nil && !meta.IsNoMatchError(err) {
		return false, fmt.Errorf("list cluster network policies: %w", err)
	}
	for i := range ul.Items {
		cp, err := netpolapi.ClusterPolicyOf(&ul.Items[i])
		if err != nil {
			return false, err
		}
		in.ClusterPolicies = append(in.ClusterPolicies, cp)
	}
	return len(in.NetworkPolicies)+len(in.ClusterPolicies) > 0, nil
}

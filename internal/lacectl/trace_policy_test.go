package lacectl

import (
	"strings"
	"testing"

	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"

	"github.com/lace-cni/lace/internal/netpol"
)

// TestTracePolicy: within what the topology allows, lacectl trace names
// the NetworkPolicy or ClusterNetworkPolicy rule that decides each side,
// and where a refused flow is dropped and counted.
func TestTracePolicy(t *testing.T) {
	in := traceCluster()
	in.Src, in.Dst = "default/client", "default/server"
	// Open: no policy decides.
	if r, err := Trace(in); err != nil || r.Policy != nil || !r.Verdict.Allowed {
		t.Fatalf("no policies: %+v %v", r.Policy, err)
	}
	in.NetworkPolicies = []networkingv1.NetworkPolicy{{
		ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "server-in"},
		Spec: networkingv1.NetworkPolicySpec{
			PodSelector: metav1.LabelSelector{MatchLabels: map[string]string{"app": "server"}},
			Ingress: []networkingv1.NetworkPolicyIngressRule{{
				From:  []networkingv1.NetworkPolicyPeer{{PodSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"app": "client"}}}},
				Ports: []networkingv1.NetworkPolicyPort{{Port: ptr.To(intstr.FromInt32(80))}},
			}},
		},
	}}
	for i := range in.Pods {
		if p := &in.Pods[i]; p.Namespace == "default" && (p.Name == "client" || p.Name == "server") {
			p.Labels = map[string]string{"app": p.Name}
		}
	}
	cases := []struct {
		name, src, proto string
		want             []string
	}{
		{"allowed by the rule", "default/client", "tcp/80", []string{"ALLOWED", "ingress:      allowed by NetworkPolicy default/server-in rule 0", "egress:       no policy decides: allowed"}},
		{"another port", "default/client", "tcp/81", []string{"DENIED", "ingress:      denied: isolated by NetworkPolicy default/server-in, no rule allows it",
			`dropped:      on node node-b, counted as lace_datapath_dropped_packets_total{reason="policy"} and lace_policy_drops_total{kind="NetworkPolicy",namespace="default",name="server-in"}`}},
		{"another pod", "default/neighbour", "tcp/80", []string{"DENIED", "isolated by NetworkPolicy default/server-in"}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			in := in
			in.Src, in.Proto = c.src, c.proto
			out := string(runTrace(t, in))
			for _, w := range c.want {
				if !strings.Contains(out, w) {
					t.Errorf("trace lacks %q:\n%s", w, out)
				}
			}
		})
	}

	// An Admin Deny of the client's egress decides before the server's
	// NetworkPolicy could admit it.
	in.ClusterPolicies = []netpol.ClusterPolicy{{Name: "no-egress", Tier: netpol.TierAdmin, Priority: 1,
		Subject: netpol.ClusterSubject{Pods: &netpol.NamespacedPod{PodSelector: metav1.LabelSelector{MatchLabels: map[string]string{"app": "client"}}}},
		Egress:  []netpol.ClusterRule{{Action: netpol.ActionDeny, Peers: []netpol.ClusterPeer{{Namespaces: &metav1.LabelSelector{}}}}}}}
	in.Proto = "tcp/80"
	out := string(runTrace(t, in))
	for _, w := range []string{"DENIED", "egress:       denied by ClusterNetworkPolicy no-egress rule 0",
		`on node node-a, counted as lace_datapath_dropped_packets_total{reason="policy"} and lace_policy_drops_total{kind="ClusterNetworkPolicy",namespace="",name="no-egress"}`} {
		if !strings.Contains(out, w) {
			t.Errorf("trace lacks %q:\n%s", w, out)
		}
	}
}

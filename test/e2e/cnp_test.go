package e2e

import (
	"context"
	"fmt"
	"net/netip"
	"strings"
	"testing"
	"time"

	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/yaml"

	"github.com/lace-cni/lace/internal/dpmetrics"
	"github.com/lace-cni/lace/internal/netpolapi"
)

// applyCNP creates a ClusterNetworkPolicy from YAML (its spec).
func applyCNP(t *testing.T, name, spec string) {
	t.Helper()
	var s map[string]any
	if err := yaml.Unmarshal([]byte(spec), &s); err != nil {
		t.Fatal(err)
	}
	u := &unstructured.Unstructured{Object: map[string]any{"spec": s}}
	u.SetGroupVersionKind(netpolapi.ClusterNetworkPolicyGVK)
	u.SetName(name)
	c := laceClient(t)
	if err := c.Create(context.Background(), u); err != nil {
		t.Fatalf("create ClusterNetworkPolicy %s: %v", name, err)
	}
	t.Cleanup(func() { deleteCNP(t, name) })
}

func deleteCNP(t *testing.T, name string) {
	u := &unstructured.Unstructured{}
	u.SetGroupVersionKind(netpolapi.ClusterNetworkPolicyGVK)
	u.SetName(name)
	_ = laceClient(t).Delete(context.Background(), u)
}

// clusterDropMetric reads the agent's drop count of ClusterNetworkPolicy
// name on node.
func clusterDropMetric(t *testing.T, node, name string) float64 {
	t.Helper()
	body, err := getFromNode(context.Background(), node, "http://127.0.0.1:9962/metrics")
	if err != nil {
		t.Fatalf("scrape %s: %v", node, err)
	}
	var n float64
	want := fmt.Sprintf(`%s{kind="ClusterNetworkPolicy",name=%q,namespace=""} `, dpmetrics.PolicyDrops, name)
	for _, line := range strings.Split(string(body), "\n") {
		if v, ok := strings.CutPrefix(line, want); ok {
			_, _ = fmt.Sscanf(v, "%g", &n)
		}
	}
	return n
}

// refusedBy waits until from's TCP connects to dst:8080 time out, and
// checks that the policy drop counter of node and ClusterNetworkPolicy
// cnp's metric moved.
func refusedBy(t *testing.T, from string, dial func() error, node, cnp string) {
	t.Helper()
	eventually(t, 20*time.Second, from+" refused by "+cnp, func() error {
		before, metric := nodeDrops(t, node)["policy"], clusterDropMetric(t, node, cnp)
		if err := dial(); err != nil {
			return err
		}
		if after := nodeDrops(t, node)["policy"]; after <= before {
			return fmt.Errorf("no answer, but the policy drop counter on %s did not move", node)
		}
		if m := clusterDropMetric(t, node, cnp); m <= metric {
			return fmt.Errorf("%s{name=%q} on %s did not move (%v)", dpmetrics.PolicyDrops, cnp, node, m)
		}
		return nil
	})
}

// TestClusterNetworkPolicy: sig-network's ClusterNetworkPolicy tiers
// around NetworkPolicy, as the API orders them: an Admin Deny overrides a
// NetworkPolicy's allow; an Admin Pass of higher precedence hands the
// flow back to the NetworkPolicy; a Baseline Deny holds only where no
// NetworkPolicy decides; an Admin egress Deny to networks 0.0.0.0/0 and
// ::/0 stops pod-to-pod traffic too. Each refusal times out and is
// counted on the ClusterNetworkPolicy that decided it.
func TestClusterNetworkPolicy(t *testing.T) {
	needLab(t)
	srv := policyPod(t, "cnp-srv", "n1", map[string]string{"cnp": "srv"})
	far := policyPod(t, "cnp-far", "n2", map[string]string{"cnp": "client", "role": "allowed"})
	near := policyPod(t, "cnp-near", "n1", map[string]string{"cnp": "client"})
	v4, v6 := podAddrs(srv)
	tcpRefused := func(from string, dst netip.Addr) func() error {
		p := far
		if from == near.Name {
			p = near
		}
		return func() error { return noAnswer(context.Background(), p, "tcp", dst) }
	}

	// A NetworkPolicy admits role=allowed to the server's http.
	applyPolicy(t, &networkingv1.NetworkPolicy{
		ObjectMeta: metav1.ObjectMeta{Name: "cnp-np"},
		Spec: networkingv1.NetworkPolicySpec{
			PodSelector: metav1.LabelSelector{MatchLabels: map[string]string{"cnp": "srv"}},
			Ingress: []networkingv1.NetworkPolicyIngressRule{{
				From:  []networkingv1.NetworkPolicyPeer{{PodSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"role": "allowed"}}}},
				Ports: []networkingv1.NetworkPolicyPort{{Port: ptr.To(intstr.FromString("http"))}},
			}},
		},
	})
	for _, dst := range []netip.Addr{v4, v6} {
		answers(t, far, "http", dst, srv.Name)
	}

	// The Admin tier denies it anyway.
	applyCNP(t, "cnp-admin-deny", `
tier: Admin
priority: 20
subject: {pods: {namespaceSelector: {}, podSelector: {matchLabels: {cnp: srv}}}}
ingress:
- name: no-clients
  action: Deny
  from: [{pods: {namespaceSelector: {}, podSelector: {matchLabels: {cnp: client}}}}]
  protocols: [{tcp: {destinationPort: {number: 8080}}}]
`)
	for _, dst := range []netip.Addr{v4, v6} {
		refusedBy(t, far.Name, tcpRefused(far.Name, dst), "n1", "cnp-admin-deny")
	}
	// A Pass of higher precedence hands role=allowed back to the
	// NetworkPolicy, which admits it; cnp-near stays denied by the Admin
	// tier.
	applyCNP(t, "cnp-admin-pass", `
tier: Admin
priority: 10
subject: {pods: {namespaceSelector: {}, podSelector: {matchLabels: {cnp: srv}}}}
ingress:
- action: Pass
  from: [{pods: {namespaceSelector: {}, podSelector: {matchLabels: {role: allowed}}}}]
`)
	for _, dst := range []netip.Addr{v4, v6} {
		answers(t, far, "http", dst, srv.Name)
		refusedBy(t, near.Name, tcpRefused(near.Name, dst), "n1", "cnp-admin-deny")
	}
	deleteCNP(t, "cnp-admin-deny")
	deleteCNP(t, "cnp-admin-pass")

	// Baseline: deny every client, but the NetworkPolicy decides for the
	// pods it isolates (the server): role=allowed is still admitted.
	// Without it, the Baseline decides.
	applyCNP(t, "cnp-baseline", `
tier: Baseline
priority: 10
subject: {namespaces: {}}
ingress:
- action: Deny
  from: [{namespaces: {}}]
  protocols: [{tcp: {destinationPort: {range: {start: 8000, end: 8100}}}}]
`)
	answers(t, far, "http", v4, srv.Name)
	nv4, _ := podAddrs(near)
	refusedBy(t, far.Name, tcpRefused(far.Name, nv4), "n1", "cnp-baseline")
	answers(t, near, "udp", addrOfFamily(far, false), far.Name) // UDP: not in the rule
	deleteCNP(t, "cnp-baseline")

	// An Admin egress Deny to every address stops pod-to-pod traffic:
	// networks match pods too.
	applyCNP(t, "cnp-admin-egress", `
tier: Admin
priority: 30
subject: {pods: {namespaceSelector: {}, podSelector: {matchLabels: {role: allowed}}}}
egress:
- action: Deny
  to: [{networks: ["0.0.0.0/0", "::/0"]}]
`)
	for _, dst := range []netip.Addr{v4, v6} {
		refusedBy(t, far.Name, tcpRefused(far.Name, dst), "n2", "cnp-admin-egress")
	}
	deleteCNP(t, "cnp-admin-egress")
	for _, dst := range []netip.Addr{v4, v6} {
		answers(t, far, "http", dst, srv.Name)
	}
}

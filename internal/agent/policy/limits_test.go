package policy

import (
	"fmt"
	"strings"
	"testing"

	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/lace-cni/lace/internal/netpol"
)

// TestLimitInput: a namespace whose policies hold too many ipBlock
// prefixes is enforced as deny-all (same pods, same directions, no rule);
// another namespace's policies stay as written.
func TestLimitInput(t *testing.T) {
	var peers []networkingv1.NetworkPolicyPeer
	for i := range maxNamespacePrefixes + 1 {
		peers = append(peers, networkingv1.NetworkPolicyPeer{IPBlock: &networkingv1.IPBlock{CIDR: fmt.Sprintf("10.%d.%d.0/24", i/256, i%256)}})
	}
	big := &networkingv1.NetworkPolicy{ObjectMeta: metav1.ObjectMeta{Namespace: "evil", Name: "big"},
		Spec: networkingv1.NetworkPolicySpec{Ingress: []networkingv1.NetworkPolicyIngressRule{{From: peers}},
			Egress: []networkingv1.NetworkPolicyEgressRule{{}}}}
	fine := &networkingv1.NetworkPolicy{ObjectMeta: metav1.ObjectMeta{Namespace: "good", Name: "fine"},
		Spec: networkingv1.NetworkPolicySpec{Ingress: []networkingv1.NetworkPolicyIngressRule{{From: peers[:10]}}}}
	in := netpol.Input{Policies: []*networkingv1.NetworkPolicy{big, fine}}
	over := limitInput(&in)
	if len(over) != 1 || !strings.Contains(over["evil"], "ipBlock prefixes") {
		t.Fatalf("over %v, want evil for its prefixes", over)
	}
	got := in.Policies[0].Spec
	if len(got.Ingress) != 0 || len(got.Egress) != 0 || len(got.PolicyTypes) != 2 {
		t.Errorf("evil/big enforced as %+v, want both directions isolated with no rule", got)
	}
	if len(big.Spec.Ingress) != 1 {
		t.Error("the cached policy itself was changed")
	}
	if in.Policies[1] != fine || len(fine.Spec.Ingress) != 1 {
		t.Error("good/fine was changed")
	}
}

// TestOverVerdicts: a namespace over its verdicts, then the largest while
// the node's total does not fit.
func TestOverVerdicts(t *testing.T) {
	locals := []netpol.Local{{Namespace: "a", Ifindex: 1}, {Namespace: "b", Ifindex: 2}, {Namespace: "c", Ifindex: 3}}
	tb := netpol.Tables{Verdicts: map[netpol.VerdictKey]netpol.Verdict{}}
	add := func(ifindex uint32, n int) {
		for i := range n {
			tb.Verdicts[netpol.VerdictKey{Ifindex: ifindex, Class: uint32(i), PrefixLen: 72}] = netpol.Verdict{Allow: true}
		}
	}
	add(1, maxNamespaceVerdicts+1)
	add(2, 300)
	add(3, 200)
	over := overVerdicts(tb, locals, maxNamespaceVerdicts+1000)
	if _, ok := over["a"]; !ok || len(over) != 1 {
		t.Errorf("over %v, want a alone", over)
	}
	over = overVerdicts(tb, locals, 250)
	if len(over) != 2 || over["b"] == "" || over["c"] != "" {
		t.Errorf("over %v, want a and then b (the largest) for a table of 250", over)
	}
}

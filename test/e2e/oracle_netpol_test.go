package e2e

// The oracle extended with NetworkPolicies. Each seed also draws up to
// three NetworkPolicies over the pool's pods, and a probe the topology
// allows stays allowed only if netpol.Decide (the reading of the API kept
// apart from the data plane's compiler, the one lacectl trace asks)
// admits it at the source pod's egress and at the destination pod's
// ingress. One it refuses must time out and move the policy drop counter
// on the node that decides: the source's for egress, the destination's
// for ingress. Before probing, every node's policy maps must give, for
// every probe, the answer Decide gives (read back with ReadPolicies):
// convergence is a condition, never a pause.
//
// The l2 network's pods are subjects like any other: what they switch to
// each other (on one node and across nodes) is decided as what is routed.

import (
	"context"
	"fmt"
	"math/rand/v2"
	"net/netip"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"
	crclient "sigs.k8s.io/controller-runtime/pkg/client"

	lacev1 "github.com/lace-cni/lace/api/v1alpha1"
	"github.com/lace-cni/lace/internal/model"
	"github.com/lace-cni/lace/internal/netpol"
)

const (
	// oraclePoolLabel marks the pool's pods (value: the run's prefix):
	// every drawn selector requires it, so no policy touches another pod.
	oraclePoolLabel = "oracle.lace-cni.io/pool"
	// oracleRoleLabel is the pool pod's role, which selectors draw on.
	oracleRoleLabel = "oracle.lace-cni.io/role"
)

var oracleRoles = []string{"a", "b", "c"}

// netpolLabels are the labels of the i-th pool pod of network net.
func (p *oraclePool) netpolLabels(i int, net string) map[string]string {
	return map[string]string{oraclePoolLabel: p.prefix, oracleRoleLabel: oracleRoles[i%len(oracleRoles)], "net": net}
}

// drawNetpols draws seed's NetworkPolicies: deterministic for a seed,
// from a stream of its own (the routing topology of a seed is as it was
// before policies were drawn). About one seed in five has none.
func (p *oraclePool) drawNetpols(seed uint64) []networkingv1.NetworkPolicy {
	rng := rand.New(rand.NewPCG(seed, 0x1ace9011))
	n := rng.IntN(4)
	if n == 0 && rng.IntN(4) != 0 {
		n = 1
	}
	pods := func(role string) *metav1.LabelSelector {
		s := &metav1.LabelSelector{MatchLabels: map[string]string{oraclePoolLabel: p.prefix}}
		if role != "" {
			s.MatchLabels[oracleRoleLabel] = role
		}
		return s
	}
	role := func() string { return oracleRoles[rng.IntN(len(oracleRoles))] }
	peer := func() networkingv1.NetworkPolicyPeer {
		switch rng.IntN(6) {
		case 0, 1:
			return networkingv1.NetworkPolicyPeer{PodSelector: pods(role())}
		case 2: // every pool pod of another role, by a set-based selector
			s := pods("")
			s.MatchExpressions = []metav1.LabelSelectorRequirement{{Key: oracleRoleLabel, Operator: metav1.LabelSelectorOpNotIn, Values: []string{role()}}}
			return networkingv1.NetworkPolicyPeer{PodSelector: s}
		case 3: // the external host on the fabric (world)
			a := p.extFabric[rng.IntN(2)]
			return networkingv1.NetworkPolicyPeer{IPBlock: &networkingv1.IPBlock{CIDR: netip.PrefixFrom(a, a.BitLen()).String()}}
		case 4: // a pool network's subnet but one pod of it
			i := rng.IntN(len(oracleNets))
			v6 := rng.IntN(2) == 1
			cidr := oracleNets[i].v4
			if v6 {
				cidr = oracleNets[i].v6
			}
			b := &networkingv1.IPBlock{CIDR: cidr}
			for _, q := range p.pods {
				if q.network == p.nets[i] {
					a := q.addr(v6)
					b.Except = []string{netip.PrefixFrom(a, a.BitLen()).String()}
					break
				}
			}
			return networkingv1.NetworkPolicyPeer{IPBlock: b}
		default: // everything of a family
			if rng.IntN(2) == 0 {
				return networkingv1.NetworkPolicyPeer{IPBlock: &networkingv1.IPBlock{CIDR: "0.0.0.0/0"}}
			}
			return networkingv1.NetworkPolicyPeer{IPBlock: &networkingv1.IPBlock{CIDR: "::/0"}}
		}
	}
	tcp, udp := ptr.To(corev1.ProtocolTCP), ptr.To(corev1.ProtocolUDP)
	ports := func() []networkingv1.NetworkPolicyPort {
		switch rng.IntN(6) {
		case 0:
			return []networkingv1.NetworkPolicyPort{{Protocol: tcp, Port: ptr.To(intstr.FromInt32(8080))}}
		case 1:
			return []networkingv1.NetworkPolicyPort{{Protocol: udp, Port: ptr.To(intstr.FromInt32(8081))}}
		case 2: // the named port (TCP 8080 on every pool pod)
			return []networkingv1.NetworkPolicyPort{{Port: ptr.To(intstr.FromString("http"))}}
		case 3: // a range holding both, for UDP only
			return []networkingv1.NetworkPolicyPort{{Protocol: udp, Port: ptr.To(intstr.FromInt32(8000)), EndPort: ptr.To[int32](8090)}}
		default:
			return nil // every protocol, ICMP included
		}
	}
	var out []networkingv1.NetworkPolicy
	for i := range n {
		sel := pods(role())
		if rng.IntN(3) == 0 {
			delete(sel.MatchLabels, oracleRoleLabel) // every pool pod
		}
		spec := networkingv1.NetworkPolicySpec{PodSelector: *sel}
		switch rng.IntN(3) {
		case 0:
			spec.PolicyTypes = []networkingv1.PolicyType{networkingv1.PolicyTypeIngress}
		case 1:
			spec.PolicyTypes = []networkingv1.PolicyType{networkingv1.PolicyTypeEgress}
		default:
			spec.PolicyTypes = []networkingv1.PolicyType{networkingv1.PolicyTypeIngress, networkingv1.PolicyTypeEgress}
		}
		for _, pt := range spec.PolicyTypes {
			for range rng.IntN(3) { // 0: the direction is shut
				var peers []networkingv1.NetworkPolicyPeer
				for range rng.IntN(3) { // 0: every peer
					peers = append(peers, peer())
				}
				ps := ports()
				if pt == networkingv1.PolicyTypeIngress {
					spec.Ingress = append(spec.Ingress, networkingv1.NetworkPolicyIngressRule{From: peers, Ports: ps})
				} else {
					spec.Egress = append(spec.Egress, networkingv1.NetworkPolicyEgressRule{To: peers, Ports: ps})
				}
			}
		}
		out = append(out, networkingv1.NetworkPolicy{
			ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("%s-%d-np%d", p.prefix, seed, i), Namespace: "default",
				Labels: map[string]string{oracleRunLabel: p.prefix}},
			Spec: spec,
		})
	}
	return out
}

// netpolString is a NetworkPolicy for the seed's log line.
func netpolString(np *networkingv1.NetworkPolicy) string {
	var b strings.Builder
	fmt.Fprintf(&b, "[%s: %s %v", np.Name, selectorString(&np.Spec.PodSelector), np.Spec.PolicyTypes)
	peers := func(ps []networkingv1.NetworkPolicyPeer) string {
		var s []string
		for _, p := range ps {
			switch {
			case p.PodSelector != nil:
				s = append(s, "pods("+selectorString(p.PodSelector)+")")
			case p.IPBlock != nil:
				s = append(s, fmt.Sprintf("ip(%s except %v)", p.IPBlock.CIDR, p.IPBlock.Except))
			}
		}
		if len(s) == 0 {
			return "any"
		}
		return strings.Join(s, "|")
	}
	port := func(ps []networkingv1.NetworkPolicyPort) string {
		var s []string
		for _, p := range ps {
			pr := "TCP"
			if p.Protocol != nil {
				pr = string(*p.Protocol)
			}
			v := pr + "/" + p.Port.String()
			if p.EndPort != nil {
				v += fmt.Sprintf("-%d", *p.EndPort)
			}
			s = append(s, v)
		}
		if len(s) == 0 {
			return "all"
		}
		return strings.Join(s, ",")
	}
	for _, r := range np.Spec.Ingress {
		fmt.Fprintf(&b, " in{%s %s}", peers(r.From), port(r.Ports))
	}
	for _, r := range np.Spec.Egress {
		fmt.Fprintf(&b, " out{%s %s}", peers(r.To), port(r.Ports))
	}
	b.WriteString("]")
	return b.String()
}

// applyNetpols replaces the previous seed's NetworkPolicies with pols.
func (p *oraclePool) applyNetpols(t *testing.T, pols []networkingv1.NetworkPolicy) {
	t.Helper()
	p.deleteNetpols(t)
	for i := range pols {
		np := pols[i].DeepCopy()
		if _, err := client.NetworkingV1().NetworkPolicies("default").Create(context.Background(), np, metav1.CreateOptions{}); err != nil {
			t.Fatalf("create network policy %s: %v", np.Name, err)
		}
	}
}

// deleteNetpols removes every NetworkPolicy of this run.
func (p *oraclePool) deleteNetpols(t *testing.T) {
	err := client.NetworkingV1().NetworkPolicies("default").DeleteCollection(context.Background(), metav1.DeleteOptions{},
		metav1.ListOptions{LabelSelector: oracleRunLabel + "=" + p.prefix})
	if err != nil {
		t.Errorf("delete the network policies of run %s: %v", p.prefix, err)
	}
}

// policyOracle is what the policy side of the oracle reads: Decide's
// input (the seed's policies and the pool's pods), the networks' IDs, and
// which node owns each block (where a packet to no pod goes).
type policyOracle struct {
	in     netpol.Input
	ids    map[string]uint32
	allocs []lacev1.Allocation
}

func (p *oraclePool) policyOracle(t *testing.T, pols []networkingv1.NetworkPolicy) policyOracle {
	t.Helper()
	ctx := context.Background()
	var nets lacev1.NetworkList
	var allocs lacev1.AllocationList
	for _, l := range []crclient.ObjectList{&nets, &allocs} {
		if err := p.c.List(ctx, l); err != nil {
			t.Fatal(err)
		}
	}
	ids := map[string]uint32{}
	for _, nw := range nets.Items {
		ids[nw.Name] = uint32(nw.Status.ID)
	}
	ns, err := client.CoreV1().Namespaces().Get(ctx, "default", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	in := netpol.Input{Namespaces: map[string]map[string]string{"default": ns.Labels}}
	for i := range pols {
		in.Policies = append(in.Policies, &pols[i])
	}
	for _, q := range p.pods {
		in.Pods = append(in.Pods, netpol.Pod{Namespace: "default", Name: q.name, Labels: q.labels, NetID: ids[q.network],
			Addrs: []netip.Addr{q.v4, q.v6}, Ports: []netpol.Port{{Name: "http", Protocol: corev1.ProtocolTCP, Port: 8080}}})
	}
	return policyOracle{in: in, ids: ids, allocs: allocs.Items}
}

// blockOwner is the node owning the block of network that holds a, or "".
func (po policyOracle) blockOwner(network string, a netip.Addr) string {
	for _, al := range po.allocs {
		if al.Spec.Network != network {
			continue
		}
		for _, c := range al.Spec.Prefixes {
			if pf, err := netip.ParsePrefix(string(c)); err == nil && pf.Contains(a) {
				return al.Spec.Node
			}
		}
	}
	return ""
}

// policyQuestion is one decision a probe needs of a pod's policies.
type policyQuestion struct {
	pod  *oPod
	dir  netpol.Dir
	peer netpol.PeerKey
}

// questions are the decisions probe pr needs, in the data plane's order:
// the source pod's egress, then the destination pod's ingress. A probe
// the topology sends to no pod of a block (no-endpoint at the block's
// owner) meets the source's egress first.
func (pr *oProbe) questions(po policyOracle) []policyQuestion {
	var qs []policyQuestion
	if pr.srcPod != nil {
		peer := netpol.PeerKey{Addr: pr.dst}
		switch {
		case pr.dstPod != nil && pr.verdict.Allowed:
			peer.NetID = po.ids[pr.dstPod.network]
		case pr.verdict.DropAtBlockOwner:
			peer.NetID = po.ids[pr.verdict.DstNetwork]
		}
		qs = append(qs, policyQuestion{pr.srcPod, netpol.Egress, peer})
	}
	if pr.dstPod != nil && pr.verdict.Allowed {
		peer := netpol.PeerKey{Addr: pr.srcEP.Addr}
		if pr.srcPod != nil {
			peer.NetID = po.ids[pr.srcPod.network]
		}
		qs = append(qs, policyQuestion{pr.dstPod, netpol.Ingress, peer})
	}
	return qs
}

// decided says whether the policies have a say on probe pr: the topology
// allows it, or sends it to no pod of a block some node owns (its own
// included: the source's egress is decided before the packet is
// delivered, or not, to a pod of the block).
func (pr *oProbe) decided(po policyOracle) bool {
	if pr.verdict.Allowed {
		return true
	}
	return pr.srcPod != nil && pr.verdict.DropAtBlockOwner && pr.verdict.Reason == model.DropNoEndpoint &&
		po.blockOwner(pr.verdict.DstNetwork, pr.dst) != ""
}

func (pr *oProbe) policyProto() (corev1.Protocol, uint8) {
	switch pr.proto {
	case "tcp":
		return corev1.ProtocolTCP, 6
	case "udp":
		return corev1.ProtocolUDP, 17
	}
	if pr.dst.Is6() {
		return "", 58
	}
	return "", 1
}

// decidePolicies turns the probes a policy refuses into denials under
// "policy", counted where they are decided.
func decidePolicies(po policyOracle, probes []*oProbe) {
	refs := netpol.Refs(po.in)
	for _, pr := range probes {
		if !pr.decided(po) {
			continue
		}
		proto, _ := pr.policyProto()
		for _, q := range pr.questions(po) {
			allow, policy, rule := netpol.Decide(po.in, "default", q.pod.name, q.dir, q.peer, proto, pr.port)
			if allow {
				continue
			}
			dir := "ingress"
			if q.dir == netpol.Egress {
				dir = "egress"
			}
			pr.verdict = model.Verdict{Allowed: false, Reason: "policy",
				Rule: fmt.Sprintf("%s of pod %s refused by %s (rule %d); the topology: %s", dir, q.pod.name, refs[policy], rule, pr.verdict.Rule)}
			pr.want = ""
			pr.dropNode = q.pod.node
			break
		}
	}
}

// awaitPolicyTables waits until every node's policy maps answer each
// probe's questions as Decide does.
func (p *oraclePool) awaitPolicyTables(t *testing.T, seed uint64, po policyOracle, probes []*oProbe) {
	t.Helper()
	eventually(t, time.Minute, fmt.Sprintf("seed %d: every node's policy maps answer as netpol.Decide", seed), func() error {
		tables := map[string]netpol.Tables{}
		ports := map[string]map[netpol.PeerKey]uint32{} // node -> (network, address) -> port
		for _, node := range p.nodes {
			dp, err := p.datapath(node)
			if err != nil {
				return err
			}
			tb, err := dp.ReadPolicies()
			if err != nil {
				p.forget(node)
				return fmt.Errorf("policy maps of %s: %w", node, err)
			}
			pts, err := dp.Ports()
			if err != nil {
				p.forget(node)
				return fmt.Errorf("ports of %s: %w", node, err)
			}
			tables[node] = tb
			ports[node] = map[netpol.PeerKey]uint32{}
			for _, pt := range pts {
				ports[node][netpol.PeerKey{NetID: pt.NetID, Addr: pt.V4}] = pt.IfIndex
			}
		}
		for _, pr := range probes {
			proto, num := pr.policyProto()
			for _, q := range pr.questions(po) {
				want, _, _ := netpol.Decide(po.in, "default", q.pod.name, q.dir, q.peer, proto, pr.port)
				ifindex, ok := ports[q.pod.node][netpol.PeerKey{NetID: po.ids[q.pod.network], Addr: q.pod.v4}]
				if !ok {
					return fmt.Errorf("pod %s has no port on %s", q.pod.name, q.pod.node)
				}
				if got, _, _ := tables[q.pod.node].Lookup(ifindex, q.dir, q.peer, num, pr.port); got != want {
					return fmt.Errorf("%s: node %s's maps say allow=%v for pod %s (dir %d, peer %v), Decide says %v",
						pr, q.pod.node, got, q.pod.name, q.dir, q.peer, want)
				}
			}
		}
		return nil
	})
}

package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"net/netip"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	crclient "sigs.k8s.io/controller-runtime/pkg/client"

	lacev1 "github.com/lace-cni/lace/api/v1alpha1"
	"github.com/lace-cni/lace/internal/model"
)

// TestOracleAgreesWithPackets checks the reachability oracle (model.Reach)
// against real packets. Each seed draws a topology over a pool of networks
// made once (l3 networks with identical and nested subnets, an anonymous
// one, an l2 network with two pods on one node and one on another, an
// external network served by the lab's external host, and the
// chart's default and world): labels on the pool networks and one to six
// NetworkRoutingPolicies (one way, both directions, label meshes, group to
// group, the anonymous network's self policy, to and from the external
// networks). Once every node's data plane holds exactly the routes the
// model computes, it sends TCP, UDP and ICMP, IPv4 and IPv6, between every
// ordered pair of pods and between every pod and the external host (both
// ways, from its fabric address, which is world, and from its served
// address, which is the pool's external network), and compares each with
// the oracle: an allowed flow must be answered by the very pod asked
// (overlapping networks hold the same addresses), a denied one must go
// unanswered until its deadline (a refusal or an ICMP error is no denial)
// and move the drop counter the oracle names, on the source pod's node
// (on any node for the external host, whose packets enter at any).
//
// Seeds 1 to 10 run by default; make soak SEED=... N=... runs others. A
// disagreement names the seed, the pair, the protocol and family, what
// was measured and what the oracle said and why.
func TestOracleAgreesWithPackets(t *testing.T) {
	needLab(t)
	first, n := oracleSeeds(t)
	start := time.Now()
	pool := newOraclePool(t)
	setup := time.Since(start)
	t.Logf("oracle pool %s: %d pods in %d networks ready in %s; seeds %d to %d", pool.prefix, len(pool.pods),
		len(pool.nets)+1, setup.Round(100*time.Millisecond), first, first+uint64(n)-1)
	var failed []uint64
	for seed := first; seed < first+uint64(n); seed++ {
		if !t.Run(fmt.Sprintf("seed=%d", seed), func(t *testing.T) { pool.runSeed(t, seed) }) {
			failed = append(failed, seed)
		}
		if pool.stuck {
			t.Errorf("seed %d: the data plane did not converge to the model's routes; the remaining seeds are skipped", seed)
			break
		}
	}
	t.Logf("%d topologies in %s (pool %s)", n, time.Since(start).Round(100*time.Millisecond), setup.Round(100*time.Millisecond))
	if len(failed) > 0 {
		t.Errorf("seeds %v failed: rerun one with make soak SEED=<seed> N=1", failed)
	}
}

// oracleTopology is what one seed draws over the pool.
type oracleTopology struct {
	seed uint64
	// groups is the group label of each pool network ("" for none).
	groups   map[string]string
	policies []lacev1.NetworkRoutingPolicy
	// netpols are the NetworkPolicies over the pool's pods
	// (oracle_netpol_test.go).
	netpols []networkingv1.NetworkPolicy
}

func (o oracleTopology) String() string {
	var b strings.Builder
	var names []string
	for n := range o.groups {
		names = append(names, n)
	}
	sort.Strings(names)
	b.WriteString("groups")
	for _, n := range names {
		g := o.groups[n]
		if g == "" {
			g = "-"
		}
		fmt.Fprintf(&b, " %s=%s", n, g)
	}
	b.WriteString("; policies")
	for _, p := range o.policies {
		fmt.Fprintf(&b, " [%s: %s -> %s]", p.Name, selectorString(p.Spec.SrcSelector), selectorString(p.Spec.DestSelector))
	}
	b.WriteString("; network policies")
	for i := range o.netpols {
		b.WriteString(" " + netpolString(&o.netpols[i]))
	}
	return b.String()
}

func selectorString(s *metav1.LabelSelector) string {
	sel, err := metav1.LabelSelectorAsSelector(s)
	if err != nil {
		return fmt.Sprintf("invalid(%v)", err)
	}
	return sel.String()
}

// topology draws seed's topology: deterministic for a seed, whatever the
// run's prefix.
func (p *oraclePool) topology(seed uint64) oracleTopology {
	rng := rand.New(rand.NewPCG(seed, 0x1ace0c1e))
	o := oracleTopology{seed: seed, groups: map[string]string{}}
	labelled := append(append([]string(nil), p.nets...), p.ext)
	for _, n := range labelled {
		o.groups[n] = []string{"", "red", "blue"}[rng.IntN(3)]
	}
	all := append(append([]string(nil), labelled...), "default", "world")
	pick := func(from []string) string { return from[rng.IntN(len(from))] }
	group := func() string { return []string{"red", "blue"}[rng.IntN(2)] }
	byName := func(n string) *metav1.LabelSelector {
		return &metav1.LabelSelector{MatchLabels: map[string]string{oracleNetLabel: n}}
	}
	byGroup := func(g string) *metav1.LabelSelector {
		return &metav1.LabelSelector{MatchLabels: map[string]string{oracleGroupLabel: g}}
	}
	add := func(src, dst *metav1.LabelSelector) {
		// The name decides which peer wins an overlap: a random number
		// first, so that creation order and name order differ.
		name := fmt.Sprintf("%s-%d-%02d%c", p.prefix, seed, rng.IntN(100), 'a'+len(o.policies))
		o.policies = append(o.policies, lacev1.NetworkRoutingPolicy{
			ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{oracleRunLabel: p.prefix}},
			Spec:       lacev1.NetworkRoutingPolicySpec{SrcSelector: src, DestSelector: dst},
		})
	}
	o.netpols = p.drawNetpols(seed)
	want := 1 + rng.IntN(6)
	for len(o.policies) < want {
		kind := rng.IntN(8)
		if kind == 7 {
			kind = 5 // the external networks, twice as often
		}
		if kind == 1 && want-len(o.policies) < 2 {
			kind = 0 // no room for a pair
		}
		switch kind {
		case 0: // one way, by name
			add(byName(pick(all)), byName(pick(all)))
		case 1: // both directions, as two policies
			a, b := pick(p.nets), pick(all)
			add(byName(a), byName(b))
			add(byName(b), byName(a))
		case 2: // a label mesh: one policy, the same label on both sides
			g := group()
			add(byGroup(g), byGroup(g))
		case 3: // group to group
			add(byGroup(group()), byGroup(group()))
		case 4: // the anonymous network opened to itself
			add(byName(p.anon), byName(p.anon))
		case 5: // to and from the external networks
			switch rng.IntN(4) {
			case 0:
				add(byName(p.ext), byName(pick(p.nets)))
			case 1:
				add(byName(pick(p.nets)), byName(p.ext))
			case 2:
				add(byName(pick(p.nets)), byName("world"))
			default:
				add(byName("world"), byName(pick(p.nets)))
			}
		default: // set-based selectors
			if rng.IntN(2) == 0 {
				add(&metav1.LabelSelector{MatchExpressions: []metav1.LabelSelectorRequirement{
					{Key: oracleGroupLabel, Operator: metav1.LabelSelectorOpIn, Values: []string{"red", "blue"}}}},
					byName(pick(all)))
			} else {
				add(byName(pick(all)), &metav1.LabelSelector{MatchExpressions: []metav1.LabelSelectorRequirement{
					{Key: oracleGroupLabel, Operator: metav1.LabelSelectorOpExists},
					{Key: oracleGroupLabel, Operator: metav1.LabelSelectorOpNotIn, Values: []string{group()}}}})
			}
		}
	}
	return o
}

// apply replaces the previous seed's policies and labels with o's.
func (p *oraclePool) apply(t *testing.T, o oracleTopology) {
	t.Helper()
	ctx := context.Background()
	p.deletePolicies(t)
	for name, g := range o.groups {
		labels := map[string]any{oracleNetLabel: name, oracleGroupLabel: nil}
		if g != "" {
			labels[oracleGroupLabel] = g
		}
		patch, _ := json.Marshal(map[string]any{"metadata": map[string]any{"labels": labels}})
		nw := &lacev1.Network{ObjectMeta: metav1.ObjectMeta{Name: name}}
		if err := p.c.Patch(ctx, nw, crclient.RawPatch(types.MergePatchType, patch)); err != nil {
			t.Fatalf("label network %s: %v", name, err)
		}
	}
	for i := range o.policies {
		pol := o.policies[i].DeepCopy()
		if err := p.c.Create(ctx, pol); err != nil {
			t.Fatalf("create routing policy %s: %v", pol.Name, err)
		}
	}
	p.applyNetpols(t, o.netpols)
}

// converge waits until the API holds exactly o, every routing policy's
// status describes its generation, and every node's data plane holds
// exactly the routes the model computes from what the API holds; it
// returns that state as the oracle's topology.
func (p *oraclePool) converge(t *testing.T, o oracleTopology) model.Topology {
	t.Helper()
	ctx := context.Background()
	want := map[string]bool{}
	for _, pol := range o.policies {
		want[pol.Name] = true
	}
	var topo model.Topology
	eventually(t, time.Minute, fmt.Sprintf("seed %d: every node's data plane routes equal to the model's", o.seed), func() error {
		var nets lacev1.NetworkList
		var allocs lacev1.AllocationList
		var ueps lacev1.UnderlayEndpointList
		var nrps lacev1.NetworkRoutingPolicyList
		var srps lacev1.ServiceRoutingPolicyList
		// What the agents also read: services put VIP entries (and the
		// service ranges deny entries) into the views.
		var nbps lacev1.NetworkBindingPolicyList
		var neps lacev1.NetworkEndpointList
		var nbrs lacev1.NeighborList
		var fdbs lacev1.FDBEntryList
		var svcs corev1.ServiceList
		var slices discoveryv1.EndpointSliceList
		var nss corev1.NamespaceList
		var cidrs networkingv1.ServiceCIDRList
		for _, l := range []crclient.ObjectList{&nets, &allocs, &ueps, &nrps, &srps, &nbps, &neps, &nbrs, &fdbs, &svcs, &slices, &nss, &cidrs} {
			if err := p.c.List(ctx, l); err != nil {
				return err
			}
		}
		nsLabels := map[string]map[string]string{}
		for _, ns := range nss.Items {
			nsLabels[ns.Name] = ns.Labels
		}
		bound := model.ComputeServices(model.ServiceInput{Networks: nets.Items, BindingPolicies: nbps.Items, Services: svcs.Items,
			EndpointSlices: slices.Items, NetworkEndpoints: neps.Items, Namespaces: nsLabels}).Bound
		mine := 0
		for _, pol := range nrps.Items {
			if pol.Labels[oracleRunLabel] == p.prefix {
				if !want[pol.Name] {
					return fmt.Errorf("routing policy %s of an earlier seed is still there", pol.Name)
				}
				mine++
			}
			if pol.Status.ObservedGeneration != pol.Generation {
				return fmt.Errorf("routing policy %s: status of generation %d, spec of %d", pol.Name, pol.Status.ObservedGeneration, pol.Generation)
			}
		}
		if mine != len(want) {
			return fmt.Errorf("%d of the seed's %d routing policies listed", mine, len(want))
		}
		for _, nw := range nets.Items {
			if g, ok := o.groups[nw.Name]; ok && nw.Labels[oracleGroupLabel] != g {
				return fmt.Errorf("network %s labelled %v, want group %q", nw.Name, nw.Labels, g)
			}
		}
		for _, node := range p.nodes {
			st := model.ComputeNode(model.NodeInput{Node: node, Networks: nets.Items, Allocations: allocs.Items,
				Underlays: ueps.Items, RoutingPolicies: nrps.Items, Services: model.BoundServiceVIPs(svcs.Items, bound),
				ServiceRoutingPolicies: srps.Items, Namespaces: nsLabels, ServiceCIDRs: model.ServiceCIDRPrefixes(cidrs.Items),
				Neighbors: nbrs.Items, FDBEntries: fdbs.Items})
			dp, err := p.datapath(node)
			if err != nil {
				return err
			}
			got, err := dp.Routes()
			if err != nil {
				p.forget(node)
				return fmt.Errorf("routes of %s: %w", node, err)
			}
			if d := setDiff(got, st.Routes); d != "" {
				return fmt.Errorf("node %s: %s", node, d)
			}
		}
		topo = model.Topology{Networks: nets.Items, RoutingPolicies: nrps.Items, ServiceRoutingPolicies: srps.Items}
		return nil
	})
	return topo
}

// setDiff compares two lists of table entries as sets and says what is
// missing from got and what got has in excess ("" when equal).
func setDiff[T any](got, want []T) string {
	count := map[string]int{}
	for _, w := range want {
		count[fmt.Sprintf("%+v", w)]++
	}
	for _, g := range got {
		count[fmt.Sprintf("%+v", g)]--
	}
	var missing, extra []string
	for k, n := range count {
		switch {
		case n > 0:
			missing = append(missing, k)
		case n < 0:
			extra = append(extra, k)
		}
	}
	if len(missing) == 0 && len(extra) == 0 {
		return ""
	}
	sort.Strings(missing)
	sort.Strings(extra)
	cut := func(l []string) string {
		if len(l) > 4 {
			return strings.Join(l[:4], ", ") + fmt.Sprintf(" and %d more", len(l)-4)
		}
		return strings.Join(l, ", ")
	}
	return fmt.Sprintf("%d routes of %d missing [%s], %d in excess [%s]", len(missing), len(want), cut(missing), len(extra), cut(extra))
}

// oProbe is one question put to the oracle and to the packets.
type oProbe struct {
	src     oSource
	srcEP   model.Endpoint
	srcDesc string
	srcNet  string // the source's network, for the summary
	// srcPod and dstPod are the pool pods on either side (nil: the
	// external host), whose policies have a say.
	srcPod, dstPod *oPod
	dst            netip.Addr
	dstDesc        string
	dstNet         string
	proto          string
	port           uint16
	// The oracle's answer: verdict, and when allowed who must answer
	// ("" for ICMP, whose echo reply names no pod).
	verdict model.Verdict
	want    string
	// dropNode is the node whose counter must move when denied ("" for
	// any node).
	dropNode string
	got      outcome
}

func (pr *oProbe) family() string {
	if pr.dst.Is6() {
		return "IPv6"
	}
	return "IPv4"
}

func (pr *oProbe) String() string {
	port := ""
	if pr.port != 0 {
		port = fmt.Sprintf(" port %d", pr.port)
	}
	return fmt.Sprintf("%s %s %s -> %s%s", pr.proto, pr.family(), pr.srcDesc, pr.dstDesc, port)
}

// agrees says whether the measurement matches the oracle, and if not why.
func (pr *oProbe) agrees() (bool, string) {
	if !pr.verdict.Allowed {
		return pr.got.timeout, ""
	}
	if !pr.got.answered {
		return false, ""
	}
	if pr.want != "" && pr.got.from != pr.want {
		return false, fmt.Sprintf(" (the oracle expects %q to answer)", pr.want)
	}
	return true, ""
}

var oracleProtos = []struct {
	name string
	port uint16
}{{"tcp", 8080}, {"udp", 8081}, {"icmp", 0}}

// plan lists the probes of one topology with the oracle's answers.
func (p *oraclePool) plan(t *testing.T, topo model.Topology) []*oProbe {
	t.Helper()
	type src struct {
		s     oSource
		ep    func(v6 bool) model.Endpoint
		desc  func(v6 bool) string
		net   string
		node  string // "" for the external host
		self  *oPod
		toExt bool
	}
	var srcs []src
	for _, pod := range p.pods {
		srcs = append(srcs, src{s: oSource{ns: pod.ns}, ep: pod.endpoint,
			desc: func(v6 bool) string {
				return fmt.Sprintf("pod %s (%s on %s, %s)", pod.name, pod.network, pod.node, pod.addr(v6))
			}, net: pod.network, node: pod.node, self: pod, toExt: true})
	}
	for _, side := range []struct {
		addrs [2]netip.Addr
		what  string
	}{{p.extFabric, "world"}, {p.extSited, p.ext}} {
		addr := func(v6 bool) netip.Addr {
			if v6 {
				return side.addrs[1]
			}
			return side.addrs[0]
		}
		srcs = append(srcs, src{
			s:  oSource{ns: p.extNS}, // the source address per family below
			ep: func(v6 bool) model.Endpoint { return model.Endpoint{Kind: model.EndpointOutside, Addr: addr(v6)} },
			desc: func(v6 bool) string {
				return fmt.Sprintf("external host (%s, from %s)", side.what, addr(v6))
			}, net: "outside(" + side.what + ")"})
	}

	var out []*oProbe
	for _, s := range srcs {
		for _, v6 := range []bool{false, true} {
			source := s.s
			if s.self == nil { // the external host: an explicit source
				source.local = s.ep(v6).Addr
			}
			srcEP := s.ep(v6)
			// Pod destinations, by address: two pods of overlapping
			// networks may share one, and then the oracle says which of
			// them (if any) the source reaches there.
			byAddr := map[netip.Addr][]*oPod{}
			var addrs []netip.Addr
			for _, q := range p.pods {
				a := q.addr(v6)
				if s.self != nil && (q == s.self || a == s.self.addr(v6)) {
					continue
				}
				if len(byAddr[a]) == 0 {
					addrs = append(addrs, a)
				}
				byAddr[a] = append(byAddr[a], q)
			}
			for _, a := range addrs {
				for _, proto := range oracleProtos {
					pr := &oProbe{src: source, srcEP: srcEP, srcDesc: s.desc(v6), srcNet: s.net, dst: a,
						proto: proto.name, port: proto.port, dropNode: s.node}
					intended := byAddr[a][0]
					var allowed []*oPod
					for _, q := range byAddr[a] {
						if v := model.Reach(topo, srcEP, q.endpoint(v6), proto.name, proto.port); v.Allowed {
							allowed = append(allowed, q)
							pr.verdict = v
						}
					}
					switch len(allowed) {
					case 0:
						pr.verdict = model.Reach(topo, srcEP, intended.endpoint(v6), proto.name, proto.port)
					case 1:
						intended = allowed[0]
						if proto.name != "icmp" {
							pr.want = intended.name
						}
					default:
						t.Errorf("oracle: %s reaches %d pods at %s (%s and %s): no view may hold two overlapping networks",
							s.desc(v6), len(allowed), a, allowed[0].name, allowed[1].name)
						continue
					}
					if pr.verdict.DropAtBlockOwner {
						// Counted where the address's block lives.
						pr.dropNode = ""
					}
					pr.srcPod, pr.dstPod = s.self, intended
					pr.dstDesc = fmt.Sprintf("pod %s (%s on %s, %s)", intended.name, intended.network, intended.node, a)
					pr.dstNet = intended.network
					out = append(out, pr)
				}
			}
			if !s.toExt {
				continue
			}
			for _, side := range []struct {
				addrs [2]netip.Addr
				what  string
			}{{p.extFabric, "world"}, {p.extSited, p.ext}} {
				a := side.addrs[0]
				if v6 {
					a = side.addrs[1]
				}
				for _, proto := range oracleProtos {
					pr := &oProbe{src: source, srcEP: srcEP, srcDesc: s.desc(v6), srcNet: s.net, dst: a,
						dstDesc: fmt.Sprintf("external host (%s, %s)", side.what, a), dstNet: "outside(" + side.what + ")",
						proto: proto.name, port: proto.port, dropNode: s.node, srcPod: s.self}
					pr.verdict = model.Reach(topo, srcEP, model.Endpoint{Kind: model.EndpointOutside, Addr: a}, proto.name, proto.port)
					if pr.verdict.Allowed && proto.name != "icmp" {
						pr.want = oracleExternalName
					}
					out = append(out, pr)
				}
			}
		}
	}
	return out
}

// oraclePacketsPerProbe is how many packets a denied probe sends: TCP its
// SYN and the retransmission after the initial RTO (1 s) within the
// deadline (1.5 s), UDP and ICMP their resend (after 750 ms).
const oraclePacketsPerProbe = 2

// oracleParallel bounds the probes in flight (each TCP one holds an OS
// thread in its namespace while it connects).
const oracleParallel = 192

func runProbes(probes []*oProbe, tm probeTiming) {
	sem := make(chan struct{}, oracleParallel)
	var wg sync.WaitGroup
	for _, pr := range probes {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			pr.got = probeOnce(pr.src, pr.proto, pr.dst, tm)
		}()
	}
	wg.Wait()
}

// runSeed applies seed's topology, waits for the data plane, probes and
// compares.
func (p *oraclePool) runSeed(t *testing.T, seed uint64) {
	start := time.Now()
	o := p.topology(seed)
	t.Logf("seed %d: %s", seed, o)
	p.apply(t, o)
	p.stuck = true // until converge returns
	topo := p.converge(t, o)
	p.stuck = false
	probes := p.plan(t, topo)
	// awaited before the verdicts change: the tables are asked the
	// questions of the topology's verdicts.
	po := p.policyOracle(t, o.netpols)
	p.awaitPolicyTables(t, seed, po, probes)
	decidePolicies(po, probes)
	converged := time.Since(start)
	before := p.drops(t)
	probeStart := time.Now()
	runProbes(probes, oracleTiming)
	probing := time.Since(probeStart)
	after := p.drops(t)

	// Verdicts.
	const maxListed = 25
	type class struct{ src, dst, proto, oracle, measured string }
	classes := map[class]int{}
	disagree, allowed := 0, 0
	denied := map[[2]string][]*oProbe{} // (node or "", reason) -> probes
	for _, pr := range probes {
		if pr.verdict.Allowed {
			allowed++
		} else {
			k := [2]string{pr.dropNode, string(pr.verdict.Reason)}
			denied[k] = append(denied[k], pr)
		}
		ok, why := pr.agrees()
		if ok {
			continue
		}
		disagree++
		expect := "allows"
		if !pr.verdict.Allowed {
			expect = fmt.Sprintf("denies (drop counter %q)", pr.verdict.Reason)
		}
		if disagree <= maxListed {
			t.Errorf("seed %d: %s: measured %s; the oracle %s: %s%s", seed, pr, pr.got, expect, pr.verdict.Rule, why)
		}
		oracle := "allow"
		if !pr.verdict.Allowed {
			oracle = "deny"
		}
		classes[class{pr.srcNet, pr.dstNet, pr.proto, oracle, pr.got.kind()}]++
	}
	if disagree > maxListed {
		t.Errorf("seed %d: %d more disagreements not listed", seed, disagree-maxListed)
	}
	if len(classes) > 0 {
		var lines []string
		for c, n := range classes {
			lines = append(lines, fmt.Sprintf("  %s -> %s %s: oracle %s, measured %s: %d", c.src, c.dst, c.proto, c.oracle, c.measured, n))
		}
		sort.Strings(lines)
		t.Errorf("seed %d: %d of %d probes disagree with the oracle, by source and destination network:\n%s", seed, disagree, len(probes), strings.Join(lines, "\n"))
	}

	// Drop counters: every packet of a denied probe is counted under the
	// reason the oracle names: in all, and on the source pod's node for
	// probes from pods (the external host's packets enter at any node).
	// Each denied probe sends oraclePacketsPerProbe packets, so a probe
	// counted under another reason shows as a shortfall even though other
	// probes moved the same counter.
	moved := func(node, reason string) uint64 {
		var n uint64
		for _, nd := range p.nodes {
			if node == "" || node == nd {
				n += after[nd][reason] - before[nd][reason]
			}
		}
		return n
	}
	need := map[string]uint64{}      // reason -> packets, in all
	needOn := map[[2]string]uint64{} // (node, reason) -> packets
	var keys [][2]string
	for k := range denied {
		keys = append(keys, k)
	}
	sort.Slice(keys, func(i, j int) bool { return keys[i][1]+"/"+keys[i][0] < keys[j][1]+"/"+keys[j][0] })
	for _, k := range keys {
		node, reason := k[0], k[1]
		prs := denied[k]
		if reason == "" {
			t.Errorf("seed %d: the oracle denies %d probes without naming a drop counter, e.g. %s: %s", seed, len(prs), prs[0], prs[0].verdict.Rule)
			continue
		}
		if _, ok := after[p.nodes[0]][reason]; !ok {
			t.Errorf("seed %d: the oracle names drop counter %q, which the data plane does not have (%d probes, e.g. %s)", seed, reason, len(prs), prs[0])
			continue
		}
		n := uint64(len(prs)) * oraclePacketsPerProbe
		need[reason] += n
		if node != "" {
			needOn[k] += n
		}
	}
	counterErrors := 0
	var reasons, short []string
	for r := range need {
		reasons = append(reasons, r)
	}
	sort.Strings(reasons)
	for _, reason := range reasons {
		if got := moved("", reason); got < need[reason] {
			counterErrors++
			short = append(short, reason)
			t.Errorf("seed %d: drop counter %q moved by %d on all nodes, want at least the %d packets of the probes the oracle denies under it: %d packets were dropped under another reason",
				seed, reason, got, need[reason], need[reason]-got)
		}
	}
	for _, k := range keys {
		if n := needOn[k]; n > 0 {
			if got := moved(k[0], k[1]); got < n {
				counterErrors++
				t.Errorf("seed %d: drop counter %q on %s moved by %d, want at least the %d packets of the denied probes from pods on %s",
					seed, k[1], k[0], got, n, k[0])
			}
		}
	}
	if counterErrors > 0 {
		all := map[string]bool{}
		for r := range need {
			all[r] = true
		}
		for _, nd := range p.nodes {
			for r, v := range after[nd] {
				if v > before[nd][r] {
					all[r] = true
				}
			}
		}
		var lines []string
		for r := range all {
			var per []string
			for _, nd := range p.nodes {
				per = append(per, fmt.Sprintf("%s +%d", nd, after[nd][r]-before[nd][r]))
			}
			lines = append(lines, fmt.Sprintf("  %-22s oracle %5d packets, counted %5d (%s)", r, need[r], moved("", r), strings.Join(per, ", ")))
		}
		sort.Strings(lines)
		t.Errorf("seed %d: drop counters during the probes, per reason (denied probes send %d packets each):\n%s",
			seed, oraclePacketsPerProbe, strings.Join(lines, "\n"))
	}
	if len(short) > 0 && !p.diagnosed {
		p.diagnosed = true
		diag := time.Now()
		for _, reason := range short {
			var prs []*oProbe
			for _, pr := range probes {
				if !pr.verdict.Allowed && string(pr.verdict.Reason) == reason {
					prs = append(prs, pr)
				}
			}
			p.diagnoseCounter(t, seed, reason, prs)
		}
		t.Logf("seed %d: counters diagnosed in %s (once per run)", seed, time.Since(diag).Round(10*time.Millisecond))
	}
	byPolicy := 0
	for k, prs := range denied {
		if k[1] == "policy" {
			byPolicy += len(prs)
		}
	}
	t.Logf("seed %d: %d routing and %d network policies; %d probes (%d allowed, %d denied by the oracle, %d of them by a network policy), %d verdicts and %d drop counters disagree; converged in %s, probed in %s, %s in all",
		seed, len(o.policies), len(o.netpols), len(probes), allowed, len(probes)-allowed, byPolicy, disagree, counterErrors,
		converged.Round(10*time.Millisecond), probing.Round(10*time.Millisecond), time.Since(start).Round(10*time.Millisecond))
}

// diagnoseCounter finds which of the denied probes are not counted under
// reason: it sends them again by class (source network -> destination
// network, family), a group of classes at a time, one packet per probe, and halves
// the groups that come short (the counts are exact), down to single
// classes, which it reports with the counters they moved instead.
func (p *oraclePool) diagnoseCounter(t *testing.T, seed uint64, reason string, probes []*oProbe) {
	t.Helper()
	classes := map[string][]*oProbe{}
	for _, pr := range probes {
		k := fmt.Sprintf("%s -> %s (%s)", pr.srcNet, pr.dstNet, pr.family())
		classes[k] = append(classes[k], pr)
	}
	var keys []string
	for k := range classes {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	var find func(keys []string)
	find = func(keys []string) {
		var prs []*oProbe
		for _, k := range keys {
			prs = append(prs, classes[k]...)
		}
		before := p.drops(t)
		// Copies: the seed's probes keep what was measured.
		cp := make([]*oProbe, len(prs))
		for i, pr := range prs {
			c := *pr
			cp[i] = &c
		}
		runProbes(cp, quickTiming)
		after := p.drops(t)
		var got uint64
		others := map[string]uint64{}
		var where []string
		for _, nd := range p.nodes {
			got += after[nd][reason] - before[nd][reason]
			for r, v := range after[nd] {
				if d := v - before[nd][r]; d > 0 && r != reason {
					others[r] += d
					where = append(where, fmt.Sprintf("%s %s +%d", nd, r, d))
				}
			}
		}
		need := uint64(len(prs)) // one packet each
		if got >= need {
			return
		}
		if len(keys) > 1 {
			find(keys[:len(keys)/2])
			find(keys[len(keys)/2:])
			return
		}
		sort.Strings(where)
		t.Errorf("seed %d: diagnosis: the %d probes %s, which the oracle denies under %q (e.g. %s: %s), sent %d packets, %d of them counted under %q; the other counters that moved: %s",
			seed, len(prs), keys[0], reason, prs[0], prs[0].verdict.Rule, need, got, reason, strings.Join(where, ", "))
	}
	find(keys)
}

package netpol

import (
	"fmt"
	"hash/fnv"
	"math/rand/v2"
	"net/netip"
	"reflect"
	"slices"
	"testing"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"
)

// TestNamedPortEgressClassSplit: two pods alike to every selector but
// resolving "http" differently get different classes, and each is reached
// on its own port only; a pod without "http" stays class 0.
func TestNamedPortEgressClassSplit(t *testing.T) {
	in := Input{
		Policies: pols(pol("a", "out", sel("app", "client"), types(networkingv1.PolicyTypeEgress),
			egress(allowOut(peers(podPeer(selp("app", "web"))), namedPort(tcp, "http"))))),
		Pods: []Pod{
			{Namespace: "a", Name: "client", Labels: map[string]string{"app": "client"}, NetID: 1, Addrs: addrs("10.0.0.9")},
			{Namespace: "a", Name: "w80", Labels: map[string]string{"app": "web"}, NetID: 1, Addrs: addrs("10.0.0.1"), Ports: []Port{{Name: "http", Port: 80}}},
			{Namespace: "a", Name: "w8080", Labels: map[string]string{"app": "web"}, NetID: 1, Addrs: addrs("10.0.0.2"), Ports: []Port{{Name: "http", Port: 8080}}},
			{Namespace: "a", Name: "w80b", Labels: map[string]string{"app": "web"}, NetID: 1, Addrs: addrs("10.0.0.3"), Ports: []Port{{Name: "http", Protocol: tcp, Port: 80}}},
			{Namespace: "a", Name: "wnone", Labels: map[string]string{"app": "web"}, NetID: 1, Addrs: addrs("10.0.0.4"), Ports: []Port{{Name: "http", Protocol: udp, Port: 80}}},
		},
		Local: []Local{{Namespace: "a", Name: "client", Ifindex: 5}},
	}
	tab := Compile(in)
	checkInvariants(t, tab)
	c80, c8080, c80b := tab.Peers[pk(1, "10.0.0.1")], tab.Peers[pk(1, "10.0.0.2")], tab.Peers[pk(1, "10.0.0.3")]
	if c80 == 0 || c8080 == 0 || c80 == c8080 {
		t.Errorf("classes http=80 %#x, http=8080 %#x: want two different non-zero classes", c80, c8080)
	}
	if c80b != c80 {
		t.Errorf("two pods with http=80 have classes %#x and %#x, want one", c80, c80b)
	}
	// wnone matches the selector but its "http" is UDP: it resolves to
	// nothing, which the class must not distinguish from matching nothing.
	cl := tab.Peers[pk(1, "10.0.0.4")]
	for _, tc := range []struct {
		peer  PeerKey
		port  uint16
		allow bool
	}{
		{pk(1, "10.0.0.1"), 80, true}, {pk(1, "10.0.0.1"), 8080, false},
		{pk(1, "10.0.0.2"), 8080, true}, {pk(1, "10.0.0.2"), 80, false},
		{pk(1, "10.0.0.4"), 80, false},
	} {
		if allow, _, _ := tab.Lookup(5, Egress, tc.peer, 6, tc.port); allow != tc.allow {
			t.Errorf("egress to %v:%d = %v, want %v", tc.peer, tc.port, allow, tc.allow)
		}
		if d := agree(in, tab, in.Local[0], Egress, tc.peer, tcp, tc.port); d != "" {
			t.Error(d)
		}
	}
	if n := countClasses(tab); n != 3 { // 80, 8080, and wnone's selector-only class
		t.Errorf("%d classes (wnone %#x), want 3", n, cl)
	}
}

func countClasses(tab Tables) int {
	set := map[uint32]bool{}
	for _, c := range tab.Peers {
		set[c] = true
	}
	for _, c := range tab.CIDRs {
		if c != 0 {
			set[c] = true
		}
	}
	return len(set)
}

// TestOverlappingNetworks: one address in two networks is two peers; a
// policy picking the pod of one never lets the other in.
func TestOverlappingNetworks(t *testing.T) {
	in := Input{
		Policies: pols(pol("a", "p", sel("app", "srv"), ingress(allowIn(peers(podPeer(selp("app", "friend"))))))),
		Pods: []Pod{
			{Namespace: "a", Name: "srv", Labels: map[string]string{"app": "srv"}, NetID: 1, Addrs: addrs("10.1.0.1")},
			{Namespace: "a", Name: "friend", Labels: map[string]string{"app": "friend"}, NetID: 1, Addrs: addrs("10.1.0.2", "fd01::2")},
			{Namespace: "a", Name: "twin", Labels: map[string]string{"app": "stranger"}, NetID: 2, Addrs: addrs("10.1.0.2", "fd01::2")},
		},
		Local: []Local{{Namespace: "a", Name: "srv", Ifindex: 7}},
	}
	tab := Compile(in)
	checkInvariants(t, tab)
	for _, a := range []string{"10.1.0.2", "fd01::2"} {
		if tab.Peers[pk(1, a)] == 0 {
			t.Errorf("friend's %s has no class", a)
		}
		if c, ok := tab.Peers[pk(2, a)]; ok {
			t.Errorf("twin's %s has class %#x", a, c)
		}
		if allow, _, _ := tab.Lookup(7, Ingress, pk(1, a), 6, 80); !allow {
			t.Errorf("friend %s denied", a)
		}
		if allow, _, _ := tab.Lookup(7, Ingress, pk(2, a), 6, 80); allow {
			t.Errorf("twin %s allowed", a)
		}
	}
}

// TestExceptCarving: an except is its own prefix of class 0 (or of the
// other blocks still holding it), so the LPM carves it out of the cidr.
func TestExceptCarving(t *testing.T) {
	in := Input{
		Policies: pols(pol("a", "p", metav1.LabelSelector{}, ingress(
			allowIn(peers(block("10.0.0.0/8", "10.1.0.0/16", "10.2.3.0/24"))),
			allowIn(peers(block("10.2.0.0/16")), port(udp, 53)),
			allowIn(peers(block("2001:db8::/32", "2001:db8:1::/48")))))),
		Pods:  []Pod{{Namespace: "a", Name: "s", NetID: 1, Addrs: addrs("192.168.0.1")}},
		Local: []Local{{Namespace: "a", Name: "s", Ifindex: 1}},
	}
	tab := Compile(in)
	checkInvariants(t, tab)
	want := map[string]bool{"10.0.0.0/8": true, "10.1.0.0/16": false, "10.2.3.0/24": true, "10.2.0.0/16": true, "2001:db8::/32": true, "2001:db8:1::/48": false}
	if len(tab.CIDRs) != len(want) {
		t.Errorf("CIDRs %v, want the prefixes of %v", tab.CIDRs, want)
	}
	for s, nonZero := range want {
		c, ok := tab.CIDRs[netip.MustParsePrefix(s)]
		if !ok || (c != 0) != nonZero {
			t.Errorf("CIDRs[%s] = %#x, %v; want non-zero %v", s, c, ok, nonZero)
		}
	}
	for _, tc := range []struct {
		a     string
		proto uint8
		allow bool
	}{
		{"10.9.9.9", 6, true}, {"10.1.2.3", 6, false}, {"10.2.3.4", 6, false}, {"10.2.3.4", 17, true},
		{"10.2.4.4", 6, true}, {"11.0.0.0", 6, false}, {"2001:db8:2::1", 6, true}, {"2001:db8:1::1", 6, false},
	} {
		port := uint16(53)
		if allow, _, _ := tab.Lookup(1, Ingress, pk(3, tc.a), tc.proto, port); allow != tc.allow {
			t.Errorf("%s proto %d = %v, want %v", tc.a, tc.proto, allow, tc.allow)
		}
	}
}

// TestEndPortDecomposition: a range becomes its exact set of aligned
// blocks, and Lookup allows exactly the range.
func TestEndPortDecomposition(t *testing.T) {
	for _, r := range [][2]int32{{1000, 2000}, {1, 65535}, {80, 80}, {65535, 65535}, {1024, 2047}, {1023, 1024}} {
		t.Run(fmt.Sprint(r), func(t *testing.T) {
			in := Input{
				Policies: pols(pol("a", "p", metav1.LabelSelector{}, ingress(allowIn(nil, portRangeOf(tcp, r[0], r[1]))))),
				Pods:     []Pod{{Namespace: "a", Name: "s", NetID: 1, Addrs: addrs("10.0.0.1")}},
				Local:    []Local{{Namespace: "a", Name: "s", Ifindex: 1}},
			}
			tab := Compile(in)
			checkInvariants(t, tab)
			for p := range 65536 {
				allow, _, _ := tab.Lookup(1, Ingress, pk(1, "10.0.0.2"), 6, uint16(p))
				if want := int32(p) >= r[0] && int32(p) <= r[1]; allow != want {
					t.Fatalf("port %d: %v, want %v", p, allow, want)
				}
			}
			if r == [2]int32{1000, 2000} {
				var got []string
				for k := range tab.Verdicts {
					got = append(got, fmt.Sprintf("%d/%d", k.Port, k.PrefixLen))
				}
				slices.Sort(got)
				want := []string{"1000/93", "1008/92", "1024/87", "1536/88", "1792/89", "1920/90", "1984/92", "2000/96"}
				if !slices.Equal(got, want) {
					t.Errorf("entries %v, want %v", got, want)
				}
			}
		})
	}
}

// TestFewestEntries: the verdict entries of one endpoint and one class,
// for rule sets whose encoding is known.
func TestFewestEntries(t *testing.T) {
	for _, tc := range []struct {
		name  string
		rules []networkingv1.NetworkPolicyIngressRule
		want  []string // proto/port/prefix rule-index
	}{
		{"everything", []networkingv1.NetworkPolicyIngressRule{allowIn(nil)}, []string{"0/0/72 r0"}},
		{"all TCP", []networkingv1.NetworkPolicyIngressRule{allowIn(nil, allPortsOf(tcp))}, []string{"6/0/80 r0"}},
		{"one port", []networkingv1.NetworkPolicyIngressRule{allowIn(nil, port(udp, 53))}, []string{"17/53/96 r0"}},
		{"adjacent ports of one rule merge", []networkingv1.NetworkPolicyIngressRule{allowIn(nil, port(tcp, 80), port(tcp, 81))}, []string{"6/80/95 r0"}},
		{"adjacent ports of two rules do not", []networkingv1.NetworkPolicyIngressRule{allowIn(nil, port(tcp, 80)), allowIn(nil, port(tcp, 81))},
			[]string{"6/80/96 r0", "6/81/96 r1"}},
		{"the earlier rule keeps the overlap", []networkingv1.NetworkPolicyIngressRule{allowIn(nil, port(tcp, 81)), allowIn(nil, portRangeOf(tcp, 80, 83))},
			[]string{"6/80/96 r1", "6/81/96 r0", "6/82/95 r1"}},
		{"a later rule adds nothing to all ports", []networkingv1.NetworkPolicyIngressRule{allowIn(nil, allPortsOf(sctp)), allowIn(nil, port(sctp, 9))},
			[]string{"132/0/80 r0"}},
		{"a catch-all after a port rule is refined by it", []networkingv1.NetworkPolicyIngressRule{allowIn(nil, port(tcp, 80)), allowIn(nil)},
			[]string{"0/0/72 r1", "6/80/96 r0"}},
		{"a catch-all first needs nothing else", []networkingv1.NetworkPolicyIngressRule{allowIn(nil), allowIn(nil, port(tcp, 80))},
			[]string{"0/0/72 r0"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			in := Input{
				Policies: pols(pol("a", "p", metav1.LabelSelector{}, ingress(tc.rules...))),
				Pods:     []Pod{{Namespace: "a", Name: "s", NetID: 1, Addrs: addrs("10.0.0.1")}},
				Local:    []Local{{Namespace: "a", Name: "s", Ifindex: 1}},
			}
			tab := Compile(in)
			checkInvariants(t, tab)
			var got []string
			for k, v := range tab.Verdicts {
				got = append(got, fmt.Sprintf("%d/%d/%d r%d", k.Proto, k.Port, k.PrefixLen, v.Rule))
			}
			slices.Sort(got)
			slices.Sort(tc.want)
			if !slices.Equal(got, tc.want) {
				t.Errorf("entries %v, want %v", got, tc.want)
			}
		})
	}
}

// TestDeterminism: the same input gives equal tables, and so does the
// same input in another order (of policies, cluster policies, pods,
// nodes and locals), since the agent diffs one compilation against the
// next.
func TestDeterminism(t *testing.T) {
	for seed := range 50 {
		g := gen{rand.New(rand.NewPCG(uint64(seed), 1))}
		in := g.input()
		a, b := Compile(in), Compile(in)
		if !reflect.DeepEqual(a, b) {
			t.Fatalf("seed %d: two compilations differ", seed)
		}
		shuffled := in
		shuffled.Policies = slices.Clone(in.Policies)
		shuffled.Pods = slices.Clone(in.Pods)
		shuffled.Local = slices.Clone(in.Local)
		shuffled.ClusterPolicies = slices.Clone(in.ClusterPolicies)
		shuffled.Nodes = slices.Clone(in.Nodes)
		if hasDuplicates(in) {
			continue // then the input's order decides, by design
		}
		g.r.Shuffle(len(shuffled.Policies), func(i, j int) {
			shuffled.Policies[i], shuffled.Policies[j] = shuffled.Policies[j], shuffled.Policies[i]
		})
		g.r.Shuffle(len(shuffled.Pods), func(i, j int) { shuffled.Pods[i], shuffled.Pods[j] = shuffled.Pods[j], shuffled.Pods[i] })
		g.r.Shuffle(len(shuffled.Local), func(i, j int) { shuffled.Local[i], shuffled.Local[j] = shuffled.Local[j], shuffled.Local[i] })
		g.r.Shuffle(len(shuffled.ClusterPolicies), func(i, j int) {
			shuffled.ClusterPolicies[i], shuffled.ClusterPolicies[j] = shuffled.ClusterPolicies[j], shuffled.ClusterPolicies[i]
		})
		g.r.Shuffle(len(shuffled.Nodes), func(i, j int) { shuffled.Nodes[i], shuffled.Nodes[j] = shuffled.Nodes[j], shuffled.Nodes[i] })
		if c := Compile(shuffled); !reflect.DeepEqual(a, c) {
			t.Fatalf("seed %d: the input's order changed the tables", seed)
		}
	}
}

func hasDuplicates(in Input) bool {
	seen := map[string]bool{}
	for _, p := range in.Policies {
		k := "pol " + p.Namespace + "/" + p.Name
		if seen[k] {
			return true
		}
		seen[k] = true
	}
	for _, p := range in.Pods {
		k := "pod " + p.Namespace + "/" + p.Name
		if seen[k] {
			return true
		}
		seen[k] = true
	}
	for _, p := range in.ClusterPolicies {
		if seen["cnp "+p.Name] {
			return true
		}
		seen["cnp "+p.Name] = true
	}
	for _, n := range in.Nodes {
		if seen["node "+n.Name] {
			return true
		}
		seen["node "+n.Name] = true
	}
	return false
}

// TestPolicyID: FNV-1a of kind/namespace/name, stable, never 0.
func TestPolicyID(t *testing.T) {
	h := fnv.New32a()
	h.Write([]byte("NetworkPolicy/a/b"))
	if got := PolicyID("NetworkPolicy", "a", "b"); got != h.Sum32() {
		t.Errorf("PolicyID = %#x, want FNV-1a %#x", got, h.Sum32())
	}
	for i := range 200000 {
		if PolicyID(kindNetworkPolicy, "ns", fmt.Sprint(i)) == 0 {
			t.Fatalf("PolicyID of %d is 0", i)
		}
	}
	// "\x00" rehashing: find nothing to rehash is fine; the loop must
	// terminate and never return 0 even from a zero starting hash.
	if fnvString(0^fnvOffset32, "\x00") == 0 {
		t.Errorf("the rehash of 0 is 0")
	}
}

// TestClassCollisions: with a hash that collides all the time, distinct
// signatures still get distinct ids, none 0, and the tables still agree
// with Decide.
func TestClassCollisions(t *testing.T) {
	saved := hashClass
	defer func() { hashClass = saved }()
	// Only 64 ids (the random inputs have fewer classes): most
	// signatures collide with another at least once.
	calls := 0
	hashClass = func(data []byte) uint32 { calls++; return saved(data) % 64 }
	created := 0
	for seed := range 60 {
		checkAgreement(t, uint64(seed), 300)
		g := gen{rand.New(rand.NewPCG(uint64(seed), 0x6e6574706f6c))}
		c := newCompiler(g.input())
		c.selectSubjects()
		c.classify()
		ids := map[uint32]bool{}
		for i, cl := range c.classes {
			if (cl.id == 0) != (i == 0) || ids[cl.id] {
				t.Fatalf("seed %d: class %d has id %#x (taken: %v)", seed, i, cl.id, ids[cl.id])
			}
			ids[cl.id] = true
		}
		created += 2 * (len(c.classes) - 1) // checkAgreement compiled the same input
	}
	if calls <= created {
		t.Errorf("%d hashes for %d classes: no collision was resolved", calls, created)
	}
}

// TestClassesShared: replicas share a class, a pod no rule is about has
// none, and an ipBlock region holding a pod shares the pod's class when
// the pod matches nothing more.
func TestClassesShared(t *testing.T) {
	in := Input{
		Policies: pols(pol("a", "p", sel("app", "srv"), ingress(
			allowIn(peers(podPeer(selp("app", "web")), block("10.0.0.0/24"))),
			allowIn(peers(podPeer(selp("app", "db"))), port(tcp, 5432))))),
		Pods: []Pod{
			{Namespace: "a", Name: "srv", Labels: map[string]string{"app": "srv"}, NetID: 1, Addrs: addrs("10.9.0.1")},
			{Namespace: "a", Name: "web1", Labels: map[string]string{"app": "web"}, NetID: 1, Addrs: addrs("10.1.0.1")},
			{Namespace: "a", Name: "web2", Labels: map[string]string{"app": "web"}, NetID: 2, Addrs: addrs("10.1.0.2")},
			{Namespace: "a", Name: "web3", Labels: map[string]string{"app": "web"}, NetID: 1, Addrs: addrs("10.0.0.3")},
			{Namespace: "a", Name: "inblock", Labels: map[string]string{"app": "other"}, NetID: 1, Addrs: addrs("10.0.0.4")},
			{Namespace: "a", Name: "db", Labels: map[string]string{"app": "db"}, NetID: 1, Addrs: addrs("10.1.0.9")},
			{Namespace: "b", Name: "web", Labels: map[string]string{"app": "web"}, NetID: 1, Addrs: addrs("10.1.0.3")},
		},
		Local: []Local{{Namespace: "a", Name: "srv", Ifindex: 1}},
	}
	tab := Compile(in)
	checkInvariants(t, tab)
	web := tab.Peers[pk(1, "10.1.0.1")]
	for _, k := range []PeerKey{pk(2, "10.1.0.2"), pk(1, "10.0.0.3"), pk(1, "10.0.0.4")} {
		if tab.Peers[k] != web {
			t.Errorf("%v has class %#x, want web's %#x", k, tab.Peers[k], web)
		}
	}
	if tab.CIDRs[netip.MustParsePrefix("10.0.0.0/24")] != web {
		t.Errorf("the block's class is not web's")
	}
	for _, k := range []PeerKey{pk(1, "10.9.0.1"), pk(1, "10.1.0.3")} {
		if c, ok := tab.Peers[k]; ok {
			t.Errorf("%v has class %#x, want none", k, c)
		}
	}
	if n := countClasses(tab); n != 2 {
		t.Errorf("%d classes, want 2 (web-or-block, db)", n)
	}
}

// TestForeignPoliciesIgnored: policies selecting no local pod leave no
// trace, even with ipBlocks and selectors matching every pod.
func TestForeignPoliciesIgnored(t *testing.T) {
	in := world(
		pol("a", "elsewhere", sel("app", "nowhere"), ingress(allowIn(peers(nsPeer(&metav1.LabelSelector{}), block("0.0.0.0/0")))),
			egress(allowOut(nil, namedPort(tcp, "http")))),
		pol("b", "types", metav1.LabelSelector{}, types("Sideways"), ingress(allowIn(peers(block("10.0.0.0/8"))))),
	)
	tab := Compile(in)
	if len(tab.Peers)+len(tab.CIDRs)+len(tab.Endpoints)+len(tab.Verdicts)+len(tab.Policies) != 0 {
		t.Errorf("tables not empty: %+v", tab)
	}
}

// TestAmbiguousInputs: duplicate pod names, two pods on one address of one
// network, two Locals on one ifindex, two policies with one name: Compile
// and Decide settle them the same way.
func TestAmbiguousInputs(t *testing.T) {
	in := Input{
		Policies: pols(
			pol("a", "p", sel("app", "srv"), ingress(allowIn(peers(podPeer(selp("app", "ok")))))),
			pol("a", "p", sel("app", "srv"), ingress(allowIn(nil))), // ignored: the first "a/p" counts
		),
		Pods: []Pod{
			{Namespace: "a", Name: "srv", Labels: map[string]string{"app": "srv"}, NetID: 1, Addrs: addrs("10.0.0.1")},
			{Namespace: "a", Name: "srv", Labels: map[string]string{"app": "x"}, NetID: 1, Addrs: addrs("10.0.0.9")},
			{Namespace: "a", Name: "z", Labels: map[string]string{"app": "ok"}, NetID: 1, Addrs: addrs("10.0.0.2")},
			{Namespace: "a", Name: "b", Labels: map[string]string{"app": "no"}, NetID: 1, Addrs: addrs("10.0.0.2")}, // owns 10.0.0.2: a/b < a/z
			{Namespace: "a", Name: "y", Labels: map[string]string{"app": "ok"}, NetID: 1, Addrs: addrs("10.0.0.3")},
		},
		Local: []Local{{Namespace: "a", Name: "srv", Ifindex: 1}, {Namespace: "a", Name: "y", Ifindex: 1}},
	}
	tab := Compile(in)
	checkInvariants(t, tab)
	for _, tc := range []struct {
		peer  PeerKey
		allow bool
	}{{pk(1, "10.0.0.2"), false}, {pk(1, "10.0.0.3"), true}, {pk(1, "10.0.0.9"), false}} {
		if d := agree(in, tab, in.Local[0], Ingress, tc.peer, tcp, 80); d != "" {
			t.Error(d)
		}
		if allow, _, _ := Decide(in, "a", "srv", Ingress, tc.peer, tcp, 80); allow != tc.allow {
			t.Errorf("Decide %v = %v, want %v", tc.peer, allow, tc.allow)
		}
	}
}

// TestCompileNeverPanics: inputs the API server would reject, and odd
// values, compile without a panic and open nothing.
func TestCompileNeverPanics(t *testing.T) {
	weird := []networkingv1.NetworkPolicyPort{
		{Port: &intstr.IntOrString{Type: 7}},
		{Port: ptr.To(intstr.FromString(""))},
		{Protocol: ptr.To(corev1.Protocol("")), Port: ptr.To(intstr.FromInt32(-5)), EndPort: ptr.To(int32(-1))},
		{Port: ptr.To(intstr.FromInt32(65535)), EndPort: ptr.To(int32(1 << 30))},
	}
	in := world(
		nil,
		pol("a", "weird", metav1.LabelSelector{MatchLabels: map[string]string{"bad key!": "v"}}, ingress()),
		pol("a", "ports", metav1.LabelSelector{}, ingress(allowIn(peers(block("10.0.0.0/33"), block(""), block("::/0", "10.0.0.0/8")), weird...))),
		pol("", "", metav1.LabelSelector{}, egress(allowOut(peers(networkingv1.NetworkPolicyPeer{}), weird...))),
	)
	in.Pods = append(in.Pods, Pod{Namespace: "a", Name: "odd", NetID: 1, Addrs: []netip.Addr{{}, addr("fe80::1%eth0")},
		Ports: []Port{{Name: "http", Port: 0}, {Name: "http", Protocol: "ICMP", Port: 1}, {Name: "http", Port: 1 << 20}}})
	in.Local = append(in.Local, Local{Namespace: "a", Name: "odd", Ifindex: 50})
	tab := Compile(in)
	checkInvariants(t, tab)
	for _, l := range in.Local {
		for _, peer := range []PeerKey{aWeb, pk(1, "fe80::1%eth0"), pk(1, "fe80::1"), {}, pk(1, "::1")} {
			for _, proto := range []corev1.Protocol{tcp, udp, icmp} {
				for _, p := range []uint16{0, 1, 80, 65535} {
					if d := agree(in, tab, l, Ingress, peer, proto, p); d != "" {
						t.Error(d)
					}
				}
			}
		}
	}
	if allow, _, _ := tab.Lookup(10, Ingress, aWeb, 6, 65535); allow {
		t.Errorf("an invalid port entry opened a port")
	}
}

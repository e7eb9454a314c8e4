package e2e

import (
	"context"
	"encoding/binary"
	"fmt"
	"net"
	"net/netip"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	crclient "sigs.k8s.io/controller-runtime/pkg/client"

	ipamclaimsv1 "github.com/lace-cni/lace/api/ipamclaims/v1alpha1"
	lacev1 "github.com/lace-cni/lace/api/v1alpha1"
	"github.com/lace-cni/lace/internal/model/ipam"
	"github.com/lace-cni/lace/internal/netutil"
	"github.com/lace-cni/lace/internal/tables"
	"github.com/lace-cni/lace/lab"
)

// l2Network creates an l2 network and a binding policy for pods labelled
// net=<name>, removed when the test ends.
func l2Network(t *testing.T, c crclient.Client, name, v4, v6 string) {
	t.Helper()
	ctx := context.Background()
	nw := &lacev1.Network{ObjectMeta: metav1.ObjectMeta{Name: name}, Spec: lacev1.NetworkSpec{
		Type:       lacev1.NetworkTypeL2,
		IPv4Subnet: &lacev1.Subnet{Prefix: lacev1.CIDR(v4)},
		IPv6Subnet: &lacev1.Subnet{Prefix: lacev1.CIDR(v6)},
	}}
	pol := &lacev1.NetworkBindingPolicy{ObjectMeta: metav1.ObjectMeta{Name: "e2e-" + name}, Spec: lacev1.NetworkBindingPolicySpec{
		Network: name, Priority: 10, MatchKind: lacev1.MatchKindPod,
		Selector: &metav1.LabelSelector{MatchLabels: map[string]string{"net": name}},
	}}
	for _, o := range []crclient.Object{nw, pol} {
		if err := c.Create(ctx, o); err != nil {
			t.Fatal(err)
		}
	}
	t.Cleanup(func() {
		_ = c.Delete(context.Background(), pol)
		_ = c.Delete(context.Background(), nw)
	})
	eventually(t, time.Minute, "an ID for "+name, func() error {
		if err := c.Get(ctx, crKey(name), nw); err != nil {
			return err
		}
		if nw.Status.ID <= 0 {
			return fmt.Errorf("no ID yet")
		}
		return nil
	})
}

// l2Iface is what a pod's eth0 holds, read inside its namespace.
type l2Iface struct {
	mac   net.HardwareAddr
	addrs []netip.Prefix
}

func podIface(t *testing.T, p *corev1.Pod) l2Iface {
	t.Helper()
	ns, err := lab.PodNetNS(context.Background(), labConfig(), p.Namespace, p.Name)
	if err != nil {
		t.Fatal(err)
	}
	var out l2Iface
	err = netutil.Do(ns, func() error {
		ifc, err := net.InterfaceByName("eth0")
		if err != nil {
			return err
		}
		out.mac = ifc.HardwareAddr
		as, err := ifc.Addrs()
		if err != nil {
			return err
		}
		for _, a := range as {
			if p, err := netip.ParsePrefix(a.String()); err == nil && !p.Addr().IsLinkLocalUnicast() {
				out.addrs = append(out.addrs, p)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatalf("read eth0 of %s: %v", p.Name, err)
	}
	return out
}

// TestL2OneNode: pods of an l2 network on one node share its subnet: each
// holds an address of the subnet with the subnet's length and the MAC the
// controller gave it (the NetworkEndpoint's status, a Neighbor per address
// and an FDBEntry for the MAC). They reach each other over TCP, UDP and
// ICMP in both families, switched by MAC, every ARP request and neighbour
// solicitation answered by the node; the node reaches them (the kubelet's
// probes) through the anycast gateway, and an l3 network a routing
// policy opens to them reaches them and is reached back through it.
func TestL2OneNode(t *testing.T) {
	needLab(t)
	c := laceClient(t)
	v4Net, v6Net := netip.MustParsePrefix("10.61.0.0/24"), netip.MustParsePrefix("fd00:61::/64")
	l2Network(t, c, "vms", v4Net.String(), v6Net.String())
	network(t, c, "apps", "10.62.0.0/16", "fd00:62::/48", false)
	labelNetwork(t, c, "vms", map[string]string{"e2e-l2": "vms"})
	labelNetwork(t, c, "apps", map[string]string{"e2e-l2": "apps"})
	routingPolicy(t, c, "e2e-apps-vms", map[string]string{"e2e-l2": "apps"}, map[string]string{"e2e-l2": "vms"})
	routingPolicy(t, c, "e2e-vms-apps", map[string]string{"e2e-l2": "vms"}, map[string]string{"e2e-l2": "apps"})

	before := nodeForwarded(t, "n1")
	a := netPod(t, "vms-a", "vms", "n1", true)
	b := netPod(t, "vms-b", "vms", "n1", true)
	app := netPod(t, "apps-a", "apps", "n1", true)

	var nw lacev1.Network
	if err := c.Get(context.Background(), crKey("vms"), &nw); err != nil {
		t.Fatal(err)
	}
	gw4, gw6 := ipam.L2Gateway(v4Net), ipam.L2Gateway(v6Net)
	for _, p := range []*corev1.Pod{a, b} {
		var ne lacev1.NetworkEndpoint
		if err := c.Get(context.Background(), crclient.ObjectKey{Namespace: p.Namespace, Name: p.Name}, &ne); err != nil {
			t.Fatal(err)
		}
		if !meta.IsStatusConditionTrue(ne.Status.Conditions, lacev1.ConditionAddressesAllocated) {
			t.Errorf("%s: NetworkEndpoint condition %s not true: %+v", p.Name, lacev1.ConditionAddressesAllocated, ne.Status.Conditions)
		}
		ifc := podIface(t, p)
		if ifc.mac.String() != string(ne.Status.MAC) {
			t.Errorf("%s: eth0 has MAC %s, the controller gave %s", p.Name, ifc.mac, ne.Status.MAC)
		}
		v4, v6 := podAddrs(p)
		want := []netip.Prefix{netip.PrefixFrom(v4, v4Net.Bits()), netip.PrefixFrom(v6, v6Net.Bits())}
		if !v4Net.Contains(v4) || !v6Net.Contains(v6) || v4 == gw4 || v6 == gw6 {
			t.Errorf("%s: addresses %s %s, want addresses of %s and %s other than the gateway", p.Name, v4, v6, v4Net, v6Net)
		}
		if fmt.Sprint(ifc.addrs) != fmt.Sprint(want) {
			t.Errorf("%s: eth0 holds %v, want %v (on-link: the subnet's length)", p.Name, ifc.addrs, want)
		}
		for _, ad := range []netip.Addr{v4, v6} {
			var n lacev1.Neighbor
			if err := c.Get(context.Background(), crKey(ipam.NeighborName("vms", ad)), &n); err != nil || string(n.Spec.MAC) != ifc.mac.String() {
				t.Errorf("%s: Neighbor of %s: %v %+v", p.Name, ad, err, n.Spec)
			}
		}
		var f lacev1.FDBEntry
		if err := c.Get(context.Background(), crKey(ipam.FDBEntryName("vms", ifc.mac)), &f); err != nil || f.Spec.Node != "n1" {
			t.Errorf("%s: FDBEntry of %s: %v %+v", p.Name, ifc.mac, err, f.Spec)
		}
	}

	expectReach(t, a, b)
	expectReach(t, b, a)
	for _, p := range []*corev1.Pod{a, b} {
		expectNodeReaches(t, p)
	}
	expectReach(t, app, a) // routed: apps -> gateway -> vms
	expectReach(t, a, app) // routed: vms -> gateway -> apps

	after := nodeForwarded(t, "n1")
	for _, what := range []string{"switched", "l2-answered"} {
		if after[what] <= before[what] {
			t.Errorf("n1 forwarding counter %s did not move (%d -> %d)", what, before[what], after[what])
		}
	}
}

// TestL2ThreeNodes: pods of one l2 network on three nodes share its
// subnet and reach each other over TCP, UDP and ICMP in both families; on
// the fabric their frames travel only in SRv6 to the network's SID in the
// destination node's locator, and no ARP request or neighbour
// solicitation for an address of the network ever crosses it (the nodes
// answer them).
func TestL2ThreeNodes(t *testing.T) {
	needLab(t)
	c := laceClient(t)
	v4Net, v6Net := netip.MustParsePrefix("10.63.0.0/24"), netip.MustParsePrefix("fd00:63::/64")
	l2Network(t, c, "span", v4Net.String(), v6Net.String())
	var pods []*corev1.Pod
	for i, node := range []string{"n1", "n2", "n3"} {
		pods = append(pods, netPod(t, fmt.Sprintf("span-%d", i+1), "span", node, true))
	}
	var ueps lacev1.UnderlayEndpointList
	if err := c.List(context.Background(), &ueps); err != nil {
		t.Fatal(err)
	}
	var locators []netip.Prefix
	for _, u := range ueps.Items {
		locators = append(locators, netip.MustParsePrefix(string(u.Spec.Locator)))
	}
	fabric := netutil.Path(lab.Config{Name: labName}.NetNS("fabric"))
	frames, err := netutil.Capture(fabric, "n1", func() {
		for _, from := range pods {
			for _, to := range pods {
				if from != to {
					expectReach(t, from, to)
				}
			}
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	inNet := func(a netip.Addr) bool { return v4Net.Contains(a) || v6Net.Contains(a) }
	carried := 0
	for _, fr := range frames {
		if len(fr) < 42 {
			continue
		}
		switch binary.BigEndian.Uint16(fr[12:14]) {
		case 0x0806:
			if tpa := netip.AddrFrom4([4]byte(fr[38:42])); inNet(tpa) {
				t.Errorf("ARP for %s on the fabric", tpa)
			}
		case 0x0800:
			if s, d := netip.AddrFrom4([4]byte(fr[26:30])), netip.AddrFrom4([4]byte(fr[30:34])); inNet(s) || inNet(d) {
				t.Errorf("an l2 pod's IPv4 packet in the clear on the fabric: %s -> %s", s, d)
			}
		case 0x86dd:
			if len(fr) < 54+40 {
				continue
			}
			s, d := netip.AddrFrom16([16]byte(fr[22:38])), netip.AddrFrom16([16]byte(fr[38:54]))
			if inNet(s) || inNet(d) {
				t.Errorf("an l2 pod's packet in the clear on the fabric: %s -> %s", s, d)
			}
			if fr[20] == 58 && (fr[54] == 135 || fr[54] == 136) && len(fr) >= 78 {
				if tg := netip.AddrFrom16([16]byte(fr[62:78])); inNet(tg) {
					t.Errorf("neighbour discovery for %s on the fabric", tg)
				}
			}
			if fr[20] != 4 && fr[20] != 41 {
				continue
			}
			inner := fr[54:]
			var is, id netip.Addr
			if fr[20] == 4 {
				is, id = netip.AddrFrom4([4]byte(inner[12:16])), netip.AddrFrom4([4]byte(inner[16:20]))
			} else {
				is, id = netip.AddrFrom16([16]byte(inner[8:24])), netip.AddrFrom16([16]byte(inner[24:40]))
				if inner[6] == 58 && len(inner) > 40 && (inner[40] == 135 || inner[40] == 136) {
					t.Errorf("neighbour discovery %s -> %s carried in SRv6", is, id)
				}
			}
			if !inNet(is) || !inNet(id) {
				continue
			}
			carried++
			if d.As16()[8] != tables.BehaviourL2IP {
				t.Errorf("an l2 frame %s -> %s carried to SID %s, not the network's l2 SID", is, id, d)
			}
			home := false
			for _, l := range locators {
				home = home || l.Contains(d)
			}
			if !home {
				t.Errorf("an l2 frame to SID %s, outside every node's locator", d)
			}
		}
	}
	if carried == 0 {
		t.Fatalf("no l2 frame carried in SRv6 among %d frames", len(frames))
	}
	t.Logf("%d frames on n1's fabric port, %d l2 frames in SRv6, no ARP/ND for the network's addresses", len(frames), carried)
}

// l2PodWith starts a netexec pod of network net on node with annotations.
func l2PodWith(t *testing.T, name, net, node string, annotations map[string]string) *corev1.Pod {
	t.Helper()
	p := netexecPod(name, node)
	p.Labels["net"] = net
	p.Annotations = annotations
	if _, err := client.CoreV1().Pods("default").Create(context.Background(), p, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { deletePodNow(t, name) })
	return waitPodReady(t, "default", name)
}

func deletePodNow(t *testing.T, name string) {
	t.Helper()
	_ = client.CoreV1().Pods("default").Delete(context.Background(), name, metav1.DeleteOptions{GracePeriodSeconds: ptr.To[int64](0)})
}

// TestL2ClaimFollowsVM: a virtual machine's addresses and MAC outlive its
// pod. The pod names an IPAMClaim; deleted, and followed by the VM's next
// pod on another node, that pod gets the same addresses and MAC, the MAC's
// FDBEntry moves there with its sequence one higher, and a pod on a third
// node reaches the VM at the same addresses again.
func TestL2ClaimFollowsVM(t *testing.T) {
	needLab(t)
	c := laceClient(t)
	l2Network(t, c, "keep", "10.64.0.0/24", "fd00:64::/64")
	claim := &ipamclaimsv1.IPAMClaim{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "vm-a.keep"},
		Spec: ipamclaimsv1.IPAMClaimSpec{Network: "keep", Interface: "eth0"}}
	if err := c.Create(context.Background(), claim); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Delete(context.Background(), claim) })
	ann := map[string]string{lacev1.AnnotationIPAMClaim: claim.Name}
	peer := netPod(t, "keep-peer", "keep", "n3", true)
	first := l2PodWith(t, "keep-vm-1", "keep", "n1", ann)
	v4, v6 := podAddrs(first)
	mac := podIface(t, first).mac
	expectReach(t, peer, first)

	deletePodNow(t, first.Name)
	eventually(t, time.Minute, "pod keep-vm-1 gone", func() error {
		if _, err := client.CoreV1().Pods("default").Get(context.Background(), first.Name, metav1.GetOptions{}); err == nil {
			return fmt.Errorf("still there")
		}
		return nil
	})
	// While the VM has no pod, its addresses are nobody else's.
	other := netPod(t, "keep-other", "keep", "n1", true)
	if o4, o6 := podAddrs(other); o4 == v4 || o6 == v6 {
		t.Errorf("a pod without the claim got the VM's address %s %s", o4, o6)
	}

	second := l2PodWith(t, "keep-vm-2", "keep", "n2", ann)
	if s4, s6 := podAddrs(second); s4 != v4 || s6 != v6 {
		t.Fatalf("the VM's next pod got %s %s, want %s %s", s4, s6, v4, v6)
	}
	if got := podIface(t, second).mac; got.String() != mac.String() {
		t.Errorf("the VM's next pod has MAC %s, want %s", got, mac)
	}
	var f lacev1.FDBEntry
	if err := c.Get(context.Background(), crKey(ipam.FDBEntryName("keep", mac)), &f); err != nil || f.Spec.Node != "n2" || f.Spec.Sequence < 1 {
		t.Errorf("FDBEntry of %s: %v %+v, want node n2 with a higher sequence", mac, err, f.Spec)
	}
	expectReach(t, peer, second)
	expectReach(t, second, peer)
}

// TestL2OverlapIsolated: two l2 networks with the same subnet stay apart.
// Their pods on one node get different addresses, so across the two
// networks the same address names different pods on different nodes:
// each network's pods reach their own pod at it, never the other
// network's (answered by name), and an address only the other network
// holds gets no answer (ARP unanswered on the source node).
func TestL2OverlapIsolated(t *testing.T) {
	needLab(t)
	c := laceClient(t)
	l2Network(t, c, "ova", "10.65.0.0/24", "fd00:65::/64")
	l2Network(t, c, "ovb", "10.65.0.0/24", "fd00:65::/64")
	a1 := netPod(t, "ova-1", "ova", "n1", true)
	b1 := netPod(t, "ovb-1", "ovb", "n1", true)
	a2 := netPod(t, "ova-2", "ova", "n2", true)
	b2 := netPod(t, "ovb-2", "ovb", "n2", true)
	b3 := netPod(t, "ovb-3", "ovb", "n1", true)
	for _, pair := range [][2]*corev1.Pod{{a1, b1}, {a2, b2}, {b3, a1}} {
		p4, p6 := podAddrs(pair[0])
		q4, q6 := podAddrs(pair[1])
		if p4 == q4 || p6 == q6 {
			t.Errorf("%s and %s share an address on %s", pair[0].Name, pair[1].Name, pair[0].Spec.NodeName)
		}
	}
	shared := func(p, q *corev1.Pod) bool { p4, _ := podAddrs(p); q4, _ := podAddrs(q); return p4 == q4 }
	if !shared(a1, b2) && !shared(a2, b1) {
		t.Logf("no address is held in both networks (%s %s %s %s): the check below proves less", a1.Status.PodIP, a2.Status.PodIP, b1.Status.PodIP, b2.Status.PodIP)
	}
	expectReach(t, a1, a2)
	expectReach(t, a2, a1)
	expectReach(t, b1, b2)
	expectReach(t, b2, b1)
	expectReach(t, b1, b3)
	for _, q := range []*corev1.Pod{b3} {
		q4, q6 := podAddrs(q)
		held := false
		for _, p := range []*corev1.Pod{a1, a2} {
			p4, _ := podAddrs(p)
			held = held || p4 == q4
		}
		if held {
			continue
		}
		expectNoReach(t, a1, q4, "n1", "l2-unknown-neighbour")
		expectNoReach(t, a1, q6, "n1", "l2-unknown-neighbour")
	}
}

// nodeL2Entries counts node's l2 table entries of network id: neighbours
// and FDB entries.
func nodeL2Entries(t *testing.T, node string, id uint32) (neigh, fdb int) {
	t.Helper()
	dp := openNodeDatapath(t, node)
	defer dp.Close()
	ns, err := dp.L2Neighbors()
	if err != nil {
		t.Fatal(err)
	}
	fs, err := dp.FDB()
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range ns {
		if n.NetID == id {
			neigh++
		}
	}
	for _, f := range fs {
		if f.NetID == id {
			fdb++
		}
	}
	return neigh, fdb
}

// TestL2ChurnLeavesNothing: 200 pods of an l2 network created at once on
// three nodes get 400 distinct addresses and 200 distinct MACs; once they
// are deleted no Neighbor, FDBEntry, address, veth, port, endpoint or l2
// table entry of theirs is left, while the addresses of a VM's IPAMClaim,
// whose pod was deleted too, are kept.
func TestL2ChurnLeavesNothing(t *testing.T) {
	needLab(t)
	c := laceClient(t)
	ctx := context.Background()
	l2Network(t, c, "churn2", "10.66.0.0/22", "fd00:66::/64")
	var nw lacev1.Network
	if err := c.Get(ctx, crKey("churn2"), &nw); err != nil {
		t.Fatal(err)
	}
	id := uint32(nw.Status.ID)
	claim := &ipamclaimsv1.IPAMClaim{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "vm-kept.churn2"},
		Spec: ipamclaimsv1.IPAMClaimSpec{Network: "churn2", Interface: "eth0"}}
	if err := c.Create(ctx, claim); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Delete(context.Background(), claim) })
	vm := l2PodWith(t, "churn2-vm", "churn2", "n1", map[string]string{lacev1.AnnotationIPAMClaim: claim.Name})
	vm4, vm6 := podAddrs(vm)

	const n = 200
	start := time.Now()
	churnPods(t, "churn2", map[string]string{"net": "churn2"}, n, 6*time.Minute, map[string]string{vm4.String(): vm.Name, vm6.String(): vm.Name})
	t.Logf("200 l2 pods running in %s", time.Since(start).Round(time.Second))
	var fdbs lacev1.FDBEntryList
	if err := c.List(ctx, &fdbs, crclient.MatchingLabels{lacev1.LabelNetwork: "churn2"}); err != nil {
		t.Fatal(err)
	}
	if len(fdbs.Items) != n+1 {
		t.Errorf("%d FDBEntries (distinct MACs) for %d pods, want %d", len(fdbs.Items), n+1, n+1)
	}

	if err := client.CoreV1().Pods("default").DeleteCollection(ctx, metav1.DeleteOptions{}, metav1.ListOptions{LabelSelector: "app=churn2"}); err != nil {
		t.Fatal(err)
	}
	deletePodNow(t, vm.Name)
	eventually(t, 4*time.Minute, "only the claim's Neighbors and FDBEntry left", func() error {
		pods, err := client.CoreV1().Pods("default").List(ctx, metav1.ListOptions{LabelSelector: "net=churn2"})
		if err != nil {
			return err
		}
		if len(pods.Items) > 0 {
			return fmt.Errorf("%d pods left", len(pods.Items))
		}
		var neps lacev1.NetworkEndpointList
		if err := c.List(ctx, &neps, crclient.InNamespace("default")); err != nil {
			return err
		}
		for _, ne := range neps.Items {
			if ne.Spec.Network == "churn2" {
				return fmt.Errorf("NetworkEndpoint %s left", ne.Name)
			}
		}
		var nbrs lacev1.NeighborList
		if err := c.List(ctx, &nbrs, crclient.MatchingLabels{lacev1.LabelNetwork: "churn2"}); err != nil {
			return err
		}
		var fdbs lacev1.FDBEntryList
		if err := c.List(ctx, &fdbs, crclient.MatchingLabels{lacev1.LabelNetwork: "churn2"}); err != nil {
			return err
		}
		if len(nbrs.Items) != 2 || len(fdbs.Items) != 1 {
			return fmt.Errorf("%d Neighbors and %d FDBEntries left, want the claim's 2 and 1", len(nbrs.Items), len(fdbs.Items))
		}
		for _, nb := range nbrs.Items {
			if a := netip.MustParseAddr(string(nb.Spec.Address)); a != vm4 && a != vm6 {
				return fmt.Errorf("Neighbor of %s left", a)
			}
		}
		return nil
	})
	t.Logf("200 l2 pods created and deleted in %s", time.Since(start).Round(time.Second))
	residueMatchesPods(t, "node state matching the remaining pods")
	// The nodes keep the claim's addresses in the network's tables (its
	// Neighbors: the VM's next pod is reached at once) and nothing else.
	eventually(t, 30*time.Second, "l2 tables holding only the claim's entries", func() error {
		for _, node := range []string{"n1", "n2", "n3"} {
			if ne, fd := nodeL2Entries(t, node, id); ne > 2 || fd > 1 {
				return fmt.Errorf("node %s holds %d neighbours and %d FDB entries of churn2", node, ne, fd)
			}
		}
		return nil
	})
}

// TestL2ThroughTheGateway: the anycast gateway routes an l2 network's pods
// as an l3 network's: a ClusterIP Service bound to the l2 network serves
// its pods on three nodes to an l2 pod on one of them (the endpoints answer
// the client on-link, switched, and the answers still come from the VIP:
// across nodes and on the client's own node), and with a routing policy
// to the world an l2 pod reaches the lab's external host (SNAT to its
// node's address).
func TestL2ThroughTheGateway(t *testing.T) {
	needLab(t)
	c := laceClient(t)
	l2Network(t, c, "gwl2", "10.67.0.0/24", "fd00:67::/64")
	labelNetwork(t, c, "gwl2", map[string]string{"e2e-l2": "gwl2"})
	nbp := &lacev1.NetworkBindingPolicy{ObjectMeta: metav1.ObjectMeta{Name: "e2e-svc-gwl2"}, Spec: lacev1.NetworkBindingPolicySpec{
		Network: "gwl2", Priority: 10, MatchKind: lacev1.MatchKindService,
		Selector: &metav1.LabelSelector{MatchLabels: map[string]string{"svc-net": "gwl2"}}}}
	if err := c.Create(context.Background(), nbp); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Delete(context.Background(), nbp) })
	appPod(t, "gwl2-b1", "gwl2", "svc-gwl2", "n1")
	appPod(t, "gwl2-b2", "gwl2", "svc-gwl2", "n2")
	appPod(t, "gwl2-b3", "gwl2", "svc-gwl2", "n3")
	client3 := netPod(t, "gwl2-client", "gwl2", "n3", true)
	svc := dualStackService(t, "svc-gwl2", "svc-gwl2", map[string]string{"svc-net": "gwl2"})
	waitEndpoints(t, svc, 3)
	expectServed(t, client3, svc, "gwl2-b1", "gwl2-b2", "gwl2-b3")

	routingPolicy(t, c, "e2e-gwl2-world", map[string]string{"e2e-l2": "gwl2"}, map[string]string{"lace-cni.io/network": "world"})
	extV4, _ := lab.ExternalUnderlay()
	dst := netip.AddrPortFrom(extV4, 9391)
	shortTCPServer(t, externalNS(), dst)
	ns := podNetNS(t, client3)
	eventually(t, 30*time.Second, "the l2 pod reaches the external host", func() error {
		return netutil.Do(ns, func() error { return shortTCP(dst) })
	})
}

// TestL2Flood: an IPv4 broadcast and an IPv6 multicast sent by a pod of
// an l2 network reach its other pods on the same node and on another node
// (the frame carried whole in SRv6 to that node's DT2M SID), and nothing
// of them reaches a node without ports in the network.
func TestL2Flood(t *testing.T) {
	needLab(t)
	c := laceClient(t)
	v4Net := netip.MustParsePrefix("10.68.0.0/24")
	l2Network(t, c, "flood", v4Net.String(), "fd00:68::/64")
	sender := netPod(t, "flood-s", "flood", "n1", true)
	local := netPod(t, "flood-l", "flood", "n1", true)
	remote := netPod(t, "flood-r", "flood", "n2", true)
	group := netip.MustParseAddr("ff15::1:68")
	type got struct{ pod, what string }
	recv := make(chan got, 64)
	for _, p := range []*corev1.Pod{local, remote} {
		ns := podNetNS(t, p)
		var c4, c6 net.PacketConn
		err := netutil.Do(ns, func() error {
			var err error
			if c4, err = net.ListenPacket("udp4", "0.0.0.0:9968"); err != nil {
				return err
			}
			ifc, err := net.InterfaceByName("eth0")
			if err != nil {
				return err
			}
			c6, err = net.ListenMulticastUDP("udp6", ifc, &net.UDPAddr{IP: group.AsSlice(), Port: 9968})
			return err
		})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c4.Close(); c6.Close() })
		for what, pc := range map[string]net.PacketConn{"broadcast": c4, "multicast": c6} {
			go func() {
				buf := make([]byte, 64)
				for {
					n, _, err := pc.ReadFrom(buf)
					if err != nil {
						return
					}
					if string(buf[:n]) == "flood" {
						recv <- got{p.Name, what}
					}
				}
			}()
		}
	}
	s4, s6 := podAddrs(sender)
	bcast := netip.AddrFrom4([4]byte{10, 68, 0, 255})
	send := func() error {
		return netutil.Do(podNetNS(t, sender), func() error {
			c4, err := net.ListenPacket("udp4", net.JoinHostPort(s4.String(), "0"))
			if err != nil {
				return err
			}
			defer c4.Close()
			raw, err := c4.(*net.UDPConn).SyscallConn()
			if err != nil {
				return err
			}
			_ = raw.Control(func(fd uintptr) { _ = syscall.SetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_BROADCAST, 1) })
			if _, err := c4.WriteTo([]byte("flood"), &net.UDPAddr{IP: bcast.AsSlice(), Port: 9968}); err != nil {
				return err
			}
			c6, err := net.ListenPacket("udp6", net.JoinHostPort(s6.String(), "0"))
			if err != nil {
				return err
			}
			defer c6.Close()
			_, err = c6.WriteTo([]byte("flood"), &net.UDPAddr{IP: group.AsSlice(), Port: 9968, Zone: "eth0"})
			return err
		})
	}
	fabric := netutil.Path(lab.Config{Name: labName}.NetNS("fabric"))
	seen := map[got]bool{}
	frames, err := netutil.Capture(fabric, "n3", func() {
		eventually(t, 20*time.Second, "every pod of the network gets the broadcast and the multicast", func() error {
			if err := send(); err != nil {
				return err
			}
			deadline := time.After(time.Second)
			for len(seen) < 4 {
				select {
				case g := <-recv:
					seen[g] = true
				case <-deadline:
					return fmt.Errorf("received %v", seen)
				}
			}
			return nil
		})
	})
	if err != nil {
		t.Fatal(err)
	}
	for _, fr := range frames {
		if len(fr) >= 54 && binary.BigEndian.Uint16(fr[12:14]) == 0x86dd && fr[20] == 143 {
			t.Errorf("a flooded frame reached n3, which has no port in the network: % x", fr[:54])
		}
	}
}

package e2e

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"maps"
	"net"
	"net/netip"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/utils/ptr"
	crclient "sigs.k8s.io/controller-runtime/pkg/client"

	lacev1 "github.com/lace-cni/lace/api/v1alpha1"
	"github.com/lace-cni/lace/internal/datapath"
	"github.com/lace-cni/lace/internal/netutil"
	"github.com/lace-cni/lace/lab"
	"github.com/lace-cni/lace/pkg/scheme"
)

func laceClient(t *testing.T) crclient.Client {
	t.Helper()
	cfg, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
	if err != nil {
		t.Fatal(err)
	}
	c, err := crclient.New(cfg, crclient.Options{Scheme: scheme.Scheme})
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// network creates an l3 network and a binding policy for pods labelled
// net=<name>, removed when the test ends.
func network(t *testing.T, c crclient.Client, name, v4, v6 string, anonymous bool) {
	t.Helper()
	ctx := context.Background()
	nw := &lacev1.Network{ObjectMeta: metav1.ObjectMeta{Name: name}, Spec: lacev1.NetworkSpec{
		Type: lacev1.NetworkTypeL3, Anonymous: anonymous,
		IPv4Subnet: &lacev1.Subnet{Prefix: lacev1.CIDR(v4), HostLocalPrefixLength: ptr.To[int32](24)},
		IPv6Subnet: &lacev1.Subnet{Prefix: lacev1.CIDR(v6), HostLocalPrefixLength: ptr.To[int32](64)},
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
	eventually(t, time.Minute, "allocations of "+name, func() error {
		var allocs lacev1.AllocationList
		if err := c.List(ctx, &allocs, crclient.MatchingLabels{"lace-cni.io/network": name}); err != nil {
			return err
		}
		if len(allocs.Items) < 3 {
			return fmt.Errorf("%d allocations", len(allocs.Items))
		}
		return nil
	})
}

// netPod starts an agnhost netexec pod bound to network net on node.
func netPod(t *testing.T, name, net, node string, probe bool) *corev1.Pod {
	t.Helper()
	p := netexecPod(name, node)
	p.Labels["net"] = net
	if !probe {
		p.Spec.Containers[0].ReadinessProbe = nil
	}
	if _, err := client.CoreV1().Pods("default").Create(context.Background(), p, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = client.CoreV1().Pods("default").Delete(context.Background(), name, metav1.DeleteOptions{GracePeriodSeconds: ptr.To[int64](0)})
	})
	return waitPodReady(t, "default", name)
}

func podAddrs(p *corev1.Pod) (v4, v6 netip.Addr) {
	for _, ip := range p.Status.PodIPs {
		a := netip.MustParseAddr(ip.IP)
		if a.Is4() {
			v4 = a
		} else {
			v6 = a
		}
	}
	return v4, v6
}

// dial sends one request from inside pod from's network namespace (the
// test enters it) to netexec at dst and returns the hostname that answered:
// HTTP on 8080 or a UDP datagram on 8081.
func dial(ctx context.Context, from *corev1.Pod, proto string, dst netip.Addr) ([]string, error) {
	ns, err := lab.PodNetNS(ctx, labConfig(), from.Namespace, from.Name)
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	if proto == "udp" {
		conn, err := netutil.DialContext(ctx, ns, "udp", net.JoinHostPort(dst.String(), "8081"))
		if err != nil {
			return nil, err
		}
		defer conn.Close()
		_ = conn.SetDeadline(time.Now().Add(1500 * time.Millisecond))
		if _, err := conn.Write([]byte("hostname")); err != nil {
			return nil, err
		}
		buf := make([]byte, 256)
		n, err := conn.Read(buf)
		if err != nil {
			return nil, nil // no answer: unreachable
		}
		return []string{strings.TrimSpace(string(buf[:n]))}, nil
	}
	conn, err := netutil.DialContext(ctx, ns, "tcp", net.JoinHostPort(dst.String(), "8080"))
	if err != nil {
		return nil, nil // no connection: unreachable
	}
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(2 * time.Second))
	fmt.Fprintf(conn, "GET /hostname HTTP/1.0\r\nHost: e2e\r\n\r\n")
	b, err := io.ReadAll(conn)
	if err != nil {
		return nil, err
	}
	_, body, _ := strings.Cut(string(b), "\r\n\r\n")
	return []string{strings.TrimSpace(body)}, nil
}

func expectReach(t *testing.T, from, to *corev1.Pod) {
	t.Helper()
	v4, v6 := podAddrs(to)
	for _, dst := range []netip.Addr{v4, v6} {
		for _, proto := range []string{"http", "udp"} {
			eventually(t, 20*time.Second, fmt.Sprintf("%s %s -> %s (%s)", proto, from.Name, to.Name, dst), func() error {
				got, err := dial(context.Background(), from, proto, dst)
				if err != nil {
					return err
				}
				if len(got) != 1 || got[0] != to.Name {
					return fmt.Errorf("answered by %v", got)
				}
				return nil
			})
		}
		out, err := kubectl(context.Background(), "exec", from.Name, "--", "ping", "-c", "2", "-i", "0.2", "-W", "2", dst.String())
		if err != nil {
			t.Errorf("ICMP %s -> %s (%s): %v\n%s", from.Name, to.Name, dst, err, out)
		}
	}
}

// expectNoReach checks that pod from cannot reach dst: a TCP connect to
// 8080 and a UDP datagram to 8081 both go unanswered until their deadline
// (a refusal, an ICMP error or a failure to send proves nothing about
// isolation), and the data plane of node dropNode counts them under
// reason.
func expectNoReach(t *testing.T, from *corev1.Pod, dst netip.Addr, dropNode, reason string) {
	t.Helper()
	before := nodeDrops(t, dropNode)
	if _, ok := before[reason]; !ok {
		t.Fatalf("node %s has no drop counter %q (it has %v)", dropNode, reason, before)
	}
	var wg sync.WaitGroup
	for _, proto := range []string{"tcp", "udp"} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := noAnswer(context.Background(), from, proto, dst); err != nil {
				t.Errorf("%s %s -> %s: %v; want no answer (a timeout)", proto, from.Name, dst, err)
			}
		}()
	}
	wg.Wait()
	after := nodeDrops(t, dropNode)
	if after[reason] <= before[reason] {
		t.Errorf("%s -> %s: drop counter %q on %s did not move (%d -> %d); drops before %v, after %v",
			from.Name, dst, reason, dropNode, before[reason], after[reason], before, after)
	}
}

// noAnswer sends one request from inside pod from's network namespace to
// netexec at dst (a TCP connect to 8080, or a UDP datagram to 8081) and
// returns nil only when nothing at all comes back before the deadline.
func noAnswer(ctx context.Context, from *corev1.Pod, proto string, dst netip.Addr) error {
	ns, err := lab.PodNetNS(ctx, labConfig(), from.Namespace, from.Name)
	if err != nil {
		return fmt.Errorf("find the pod's network namespace: %w", err)
	}
	port := uint16(8080)
	if proto == "udp" {
		port = 8081
	}
	return silent(ctx, ns, proto, netip.AddrPortFrom(dst, port))
}

// silent sends one request from the namespace at ns to dst (a TCP connect,
// or a UDP datagram) and returns nil only when nothing at all comes back
// before the deadline: a refusal or an ICMP error is an answer.
func silent(ctx context.Context, ns, proto string, dst netip.AddrPort) error {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	conn, err := netutil.DialContext(ctx, ns, proto, dst.String())
	if proto == "tcp" {
		if err == nil {
			conn.Close()
			return fmt.Errorf("connected")
		}
		if isTimeout(err) {
			return nil
		}
		return fmt.Errorf("failed without a timeout: %w", err)
	}
	if err != nil {
		return fmt.Errorf("open a UDP socket: %w", err)
	}
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(1500 * time.Millisecond))
	if _, err := conn.Write([]byte("hostname")); err != nil {
		return fmt.Errorf("send: %w", err)
	}
	buf := make([]byte, 256)
	n, err := conn.Read(buf)
	switch {
	case err == nil:
		return fmt.Errorf("answered by %q", strings.TrimSpace(string(buf[:n])))
	case isTimeout(err):
		return nil
	}
	return fmt.Errorf("failed without a timeout: %w", err)
}

func isTimeout(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}

// nodeDrops reads node's drop counters from the data plane maps the agent
// pinned on the node's bpffs.
func nodeDrops(t *testing.T, node string) map[string]uint64 {
	t.Helper()
	return nodeCounters(t, node, "drop", (*datapath.Datapath).Drops)
}

// nodeForwarded returns node's forwarding counters.
func nodeForwarded(t *testing.T, node string) map[string]uint64 {
	t.Helper()
	return nodeCounters(t, node, "forwarding", (*datapath.Datapath).Forwarded)
}

// nodeCounters reads one set of node's data plane counters.
func nodeCounters(t *testing.T, node, what string, read func(*datapath.Datapath) (map[string]uint64, error)) map[string]uint64 {
	t.Helper()
	dp := openNodeDatapath(t, node)
	defer dp.Close()
	c, err := read(dp)
	if err != nil {
		t.Fatalf("%s counters of %s: %v", what, node, err)
	}
	return c
}

// expectNodeReaches checks that the pod's node, dialling each of the pod's
// addresses as the kubelet's probes do, is answered by that pod and no
// other.
func expectNodeReaches(t *testing.T, p *corev1.Pod) {
	t.Helper()
	v4, v6 := podAddrs(p)
	node := netutil.Path(labConfig().NetNS(p.Spec.NodeName))
	for _, dst := range []netip.Addr{v4, v6} {
		eventually(t, 20*time.Second, fmt.Sprintf("node %s -> %s (%s)", p.Spec.NodeName, p.Name, dst), func() error {
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
			defer cancel()
			conn, err := netutil.DialContext(ctx, node, "tcp", net.JoinHostPort(dst.String(), "8080"))
			if err != nil {
				return err
			}
			defer conn.Close()
			_ = conn.SetDeadline(time.Now().Add(2 * time.Second))
			fmt.Fprintf(conn, "GET /hostname HTTP/1.0\r\nHost: e2e\r\n\r\n")
			b, err := io.ReadAll(conn)
			if err != nil {
				return err
			}
			if _, body, _ := strings.Cut(string(b), "\r\n\r\n"); strings.TrimSpace(body) != p.Name {
				return fmt.Errorf("answered by %q", strings.TrimSpace(body))
			}
			return nil
		})
	}
}

// blockOn returns the IPv4 and IPv6 blocks network holds on node.
func blockOn(t *testing.T, c crclient.Client, network, node string) []netip.Prefix {
	t.Helper()
	var a lacev1.Allocation
	if err := c.Get(context.Background(), crKey(network+"."+node), &a); err != nil {
		t.Fatal(err)
	}
	var out []netip.Prefix
	for _, p := range a.Spec.Prefixes {
		out = append(out, netip.MustParsePrefix(string(p)))
	}
	return out
}

// TestL3Networks: pods of one network reach each other on one node and
// across nodes (TCP, UDP, ICMP; IPv4 and IPv6); other networks, networks
// with the same subnet and anonymous networks are isolated. Two networks
// with the same subnets hold the same blocks on a node, yet their pods
// there get different addresses: every pod passes its readiness probe and
// the node reaches each pod, and only it, at its addresses.
func TestL3Networks(t *testing.T) {
	needLab(t)
	c := laceClient(t)
	network(t, c, "blue", "10.50.0.0/16", "fd00:50::/48", false)
	network(t, c, "green", "10.50.0.0/16", "fd00:50::/48", false) // same subnets as blue
	network(t, c, "anon", "10.70.0.0/16", "fd00:70::/48", true)
	for _, node := range []string{"n1", "n2"} {
		if b, g := blockOn(t, c, "blue", node), blockOn(t, c, "green", node); fmt.Sprint(b) != fmt.Sprint(g) {
			t.Fatalf("blue holds %v and green %v on %s: the overlap check proves nothing", b, g, node)
		}
	}

	var wg sync.WaitGroup
	pods := map[string]*corev1.Pod{}
	var mu sync.Mutex
	for _, spec := range []struct{ name, net, node string }{
		// blue-a and green-a are the first pods of their networks on n1,
		// blue-c and green-c on n2, created at once.
		{"blue-a", "blue", "n1"}, {"green-a", "green", "n1"},
		{"blue-c", "blue", "n2"}, {"green-c", "green", "n2"},
		{"anon-a", "anon", "n1"}, {"anon-c", "anon", "n2"},
	} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			p := netPod(t, spec.name, spec.net, spec.node, true)
			mu.Lock()
			pods[spec.name] = p
			mu.Unlock()
		}()
	}
	wg.Wait()
	if t.Failed() {
		return
	}
	pods["blue-b"] = netPod(t, "blue-b", "blue", "n1", true)

	// No two pods on one node share an address, whatever their network.
	for _, node := range []string{"n1", "n2"} {
		seen := map[netip.Addr]string{}
		for _, p := range pods {
			if p.Spec.NodeName != node {
				continue
			}
			v4, v6 := podAddrs(p)
			for _, ad := range []netip.Addr{v4, v6} {
				if other, dup := seen[ad]; dup {
					t.Errorf("%s and %s share %s on %s", other, p.Name, ad, node)
				}
				seen[ad] = p.Name
			}
		}
	}
	// The node reaches every pod at its addresses, as its probes do.
	for _, p := range pods {
		expectNodeReaches(t, p)
	}

	expectReach(t, pods["blue-a"], pods["blue-b"]) // same node
	expectReach(t, pods["blue-a"], pods["blue-c"]) // across nodes
	expectReach(t, pods["blue-c"], pods["blue-a"])

	// green has blue's subnets: its pods reach green pods, never blue ones.
	expectReach(t, pods["green-a"], pods["green-c"])
	expectReach(t, pods["green-c"], pods["green-a"])
	// The other network's pod addresses are nobody in one's own network: on
	// the same node the source node finds no such pod; across nodes the
	// destination node does.
	for _, tc := range []struct{ from, to, dropNode string }{
		{"blue-a", "green-a", "n1"}, {"green-a", "blue-a", "n1"},
		{"blue-a", "green-c", "n2"}, {"green-a", "blue-c", "n2"},
	} {
		v4, v6 := podAddrs(pods[tc.to])
		expectNoReach(t, pods[tc.from], v4, tc.dropNode, "no-endpoint")
		expectNoReach(t, pods[tc.from], v6, tc.dropNode, "no-endpoint")
	}

	// Isolation between networks and inside an anonymous network.
	a4, a6 := podAddrs(pods["anon-c"])
	expectNoReach(t, pods["blue-a"], a4, "n1", "isolated")
	expectNoReach(t, pods["blue-a"], a6, "n1", "isolated")
	expectNoReach(t, pods["anon-a"], a4, "n1", "anonymous-network")
	expectNoReach(t, pods["anon-a"], a6, "n1", "anonymous-network")
}

// TestUnderlayCarriesSRv6 captures node n1's underlay port while pods talk
// across nodes: pod addresses never appear on the fabric, only IPv6
// packets from node to node addressed to SIDs in the destination locator.
func TestUnderlayCarriesSRv6(t *testing.T) {
	needLab(t)
	c := laceClient(t)
	network(t, c, "wire", "10.80.0.0/16", "fd00:80::/48", false)
	a := netPod(t, "wire-a", "wire", "n1", true)
	b := netPod(t, "wire-b", "wire", "n2", true)
	var ueps lacev1.UnderlayEndpointList
	if err := c.List(context.Background(), &ueps); err != nil {
		t.Fatal(err)
	}
	locator := map[netip.Addr]netip.Prefix{}
	for _, u := range ueps.Items {
		loc := netip.MustParsePrefix(string(u.Spec.Locator))
		for _, ad := range u.Spec.Addresses {
			locator[netip.MustParseAddr(string(ad))] = loc
		}
	}
	fabric := netutil.Path(lab.Config{Name: labName}.NetNS("fabric"))
	frames, err := netutil.Capture(fabric, "n1", func() { expectReach(t, a, b) })
	if err != nil {
		t.Fatal(err)
	}
	pod4, pod6 := netip.MustParsePrefix("10.80.0.0/16"), netip.MustParsePrefix("fd00:80::/48")
	srv6 := 0
	for _, fr := range frames {
		if len(fr) < 34 {
			continue
		}
		switch binary.BigEndian.Uint16(fr[12:14]) {
		case 0x0800:
			s, d := netip.AddrFrom4([4]byte(fr[26:30])), netip.AddrFrom4([4]byte(fr[30:34]))
			if pod4.Contains(s) || pod4.Contains(d) {
				t.Errorf("pod IPv4 packet on the underlay: %s -> %s", s, d)
			}
		case 0x86dd:
			if len(fr) < 54 {
				continue
			}
			s, d := netip.AddrFrom16([16]byte(fr[22:38])), netip.AddrFrom16([16]byte(fr[38:54]))
			if pod6.Contains(s) || pod6.Contains(d) {
				t.Errorf("pod IPv6 packet on the underlay: %s -> %s", s, d)
			}
			if fr[20] != 4 && fr[20] != 41 {
				continue
			}
			srv6++
			loc, ok := locator[s]
			if !ok {
				t.Errorf("SRv6 packet from %s, which is no node", s)
				continue
			}
			if loc.Contains(d) {
				t.Errorf("SRv6 packet %s -> %s addressed to the sender's own locator", s, d)
			}
			found := false
			for _, l := range locator {
				found = found || l.Contains(d)
			}
			if !found {
				t.Errorf("SRv6 packet to %s, outside every node's locator", d)
			}
		}
	}
	if srv6 == 0 {
		t.Fatalf("no SRv6 packet among %d frames", len(frames))
	}
	t.Logf("%d frames, %d SRv6, no pod address in the clear", len(frames), srv6)
}

// TestStreamSurvivesAgentRestart holds one TCP connection from a pod on n1
// to a pod on n2 and keeps using it while both agents restart.
func TestStreamSurvivesAgentRestart(t *testing.T) {
	needLab(t)
	c := laceClient(t)
	network(t, c, "steady", "10.90.0.0/16", "fd00:90::/48", false)
	a := netPod(t, "steady-a", "steady", "n1", true)
	b := netPod(t, "steady-b", "steady", "n2", true)
	b4, _ := podAddrs(b)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	// The test enters pod a's namespace to hold the connection itself.
	conn, err := netutil.DialContext(ctx, podNetNS(t, a), "tcp",
		net.JoinHostPort(b4.String(), "8080"))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ask := echoer(t, conn)
	ask("before")
	pods := map[string]*corev1.Pod{"n1": a, "n2": b}
	restartAgentsAsking(t, ask, func(node string) error { return nodeHolds(t, node, pods[node]) }, "n1", "n2")
	ask("after")
	// And the restarted agents still attach new pods.
	netPod(t, "steady-c", "steady", "n1", true)
}

// restartAgentsAsking restarts the agent of each node in turn, asking on a
// held connection after each restart, then waits for every new agent to
// be Ready (its readiness is the data plane applied) and for ready(node).
func restartAgentsAsking(t *testing.T, ask func(string), ready func(node string) error, nodes ...string) {
	t.Helper()
	old := map[string]types.UID{}
	for _, node := range nodes {
		old[node] = agentPod(t, node).UID
		if out, err := labCmd("restart", "agent/"+node).CombinedOutput(); err != nil {
			t.Fatalf("restart agent/%s: %v %s", node, err, out)
		}
		ask("during-agent-" + node)
	}
	for _, node := range nodes {
		eventually(t, time.Minute, "new agent on "+node+" ready", func() error {
			if ap := agentPod(t, node); ap.UID == old[node] || !podIsReady(ap) {
				return fmt.Errorf("agent pod %s (%s) ready=%v", ap.Name, ap.UID, podIsReady(ap))
			}
			return ready(node)
		})
	}
}

// TestHundredPodsLeaveNothing creates and deletes 100 pods and checks that
// no address, NetworkEndpoint, veth or map entry remains.
func TestHundredPodsLeaveNothing(t *testing.T) {
	needLab(t)
	c := laceClient(t)
	ctx := context.Background()
	const n = 100
	start := time.Now()
	churnPods(t, "churn", nil, n, 4*time.Minute, nil)
	t.Logf("100 pods running in %s", time.Since(start).Round(time.Second))
	var neps lacev1.NetworkEndpointList
	if err := c.List(ctx, &neps, crclient.InNamespace("default")); err != nil {
		t.Fatal(err)
	}
	churnNEs := 0
	for _, ne := range neps.Items {
		if strings.HasPrefix(ne.Name, "churn-") {
			churnNEs++
		}
	}
	if churnNEs != n {
		t.Errorf("%d NetworkEndpoints for the churn pods, want %d", churnNEs, n)
	}
	if err := client.CoreV1().Pods("default").DeleteCollection(ctx, metav1.DeleteOptions{}, metav1.ListOptions{LabelSelector: "app=churn"}); err != nil {
		t.Fatal(err)
	}
	eventually(t, 3*time.Minute, "churn pods and their NetworkEndpoints gone", func() error {
		pods, err := client.CoreV1().Pods("default").List(ctx, metav1.ListOptions{LabelSelector: "app=churn"})
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
			if strings.HasPrefix(ne.Name, "churn-") {
				return fmt.Errorf("NetworkEndpoint %s left", ne.Name)
			}
		}
		return nil
	})
	t.Logf("100 pods created and deleted in %s", time.Since(start).Round(time.Second))
	residueMatchesPods(t, "node state matching the remaining pods")
}

// churnPods creates n pause pods named app-NNN (label app=app, plus
// labels), deleted at the end of the test, and waits until all run with
// two addresses, no address given twice nor one of taken's (address ->
// holder).
func churnPods(t *testing.T, app string, labels map[string]string, n int, within time.Duration, taken map[string]string) {
	t.Helper()
	ctx := context.Background()
	sel := metav1.ListOptions{LabelSelector: "app=" + app}
	for i := range n {
		l := map[string]string{"app": app}
		maps.Copy(l, labels)
		p := &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("%s-%03d", app, i), Labels: l},
			Spec: corev1.PodSpec{TerminationGracePeriodSeconds: ptr.To[int64](1),
				Containers: []corev1.Container{{Name: "pause", Image: "registry.k8s.io/pause:3.10"}}},
		}
		if _, err := client.CoreV1().Pods("default").Create(ctx, p, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	t.Cleanup(func() {
		_ = client.CoreV1().Pods("default").DeleteCollection(context.Background(), metav1.DeleteOptions{}, sel)
	})
	eventually(t, within, fmt.Sprintf("%d %s pods running with addresses", n, app), func() error {
		pods, err := client.CoreV1().Pods("default").List(ctx, sel)
		if err != nil {
			return err
		}
		ready := 0
		seen := maps.Clone(taken)
		if seen == nil {
			seen = map[string]string{}
		}
		for _, p := range pods.Items {
			if p.Status.Phase == corev1.PodRunning && len(p.Status.PodIPs) == 2 {
				ready++
				for _, ip := range p.Status.PodIPs {
					if other, dup := seen[ip.IP]; dup {
						return fmt.Errorf("address %s given to %s and %s", ip.IP, other, p.Name)
					}
					seen[ip.IP] = p.Name
				}
			}
		}
		if ready != n {
			return fmt.Errorf("%d of %d running", ready, n)
		}
		return nil
	})
}

// residue is what a node holds per pod: veths, map entries, checkpointed
// addresses.
type residue = lab.Residue

func nodeResidue(t *testing.T) map[string]residue {
	t.Helper()
	out := map[string]residue{}
	for _, node := range []string{"n1", "n2", "n3"} {
		r, err := lab.NodeResidue(labConfig(), node)
		if err != nil {
			t.Fatal(err)
		}
		out[node] = r
	}
	return out
}

// agentPod returns the agent pod on node that is not being deleted (an
// empty pod when there is none).
func agentPod(t *testing.T, node string) *corev1.Pod {
	t.Helper()
	pods, err := client.CoreV1().Pods(lab.ReleaseNamespace).List(context.Background(), metav1.ListOptions{
		LabelSelector: "app.kubernetes.io/name=lace-agent", FieldSelector: "spec.nodeName=" + node})
	if err != nil {
		t.Fatal(err)
	}
	for i := range pods.Items {
		if pods.Items[i].DeletionTimestamp == nil {
			return &pods.Items[i]
		}
	}
	return &corev1.Pod{}
}

func podIsReady(p *corev1.Pod) bool {
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

// nodeHolds says whether node's data plane maps hold every address of pod
// p (nil), or what is missing.
func nodeHolds(t *testing.T, node string, p *corev1.Pod) error {
	t.Helper()
	dp, err := datapath.Load(filepath.Join(labConfig().NodeRoot(node), "sys/fs/bpf/lace"))
	if err != nil {
		return fmt.Errorf("open the data plane of %s: %w", node, err)
	}
	defer dp.Close()
	eps, err := dp.Endpoints()
	if err != nil {
		return err
	}
	have := map[netip.Addr]bool{}
	for _, e := range eps {
		have[e.Addr] = true
	}
	v4, v6 := podAddrs(p)
	for _, ad := range []netip.Addr{v4, v6} {
		if !have[ad] {
			return fmt.Errorf("no endpoint %s of %s on %s", ad, p.Name, node)
		}
	}
	return nil
}

type crObject = crclient.Object

func crKey(name string) crclient.ObjectKey { return crclient.ObjectKey{Name: name} }

package main

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"sort"
	"strconv"
	"text/tabwriter"
	"time"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	lacev1 "github.com/lace-cni/lace/api/v1alpha1"
	"github.com/lace-cni/lace/internal/netutil"
	"github.com/lace-cni/lace/lab"
	"github.com/lace-cni/lace/pkg/scheme"
)

// The NetworkPolicy benchmark (docs/network-policy.md): a cluster of 1,000
// policies over 1,000 pods (peers: pods of a node without a kubelet, with
// their NetworkEndpoints), and four real pods across two nodes. Measured
// in one run: request/response between two pods both isolated by policies
// (egress of the client, ingress of the server) beside the same between
// two pods no policy selects, on the same nodes, in interleaved rounds;
// the time from a policy's write to the first connection it admits; the
// agent's resident memory before and after the policies.

const (
	npPolicies = 1000
	npPods     = 1000
	npGhost    = "bench-ghost" // the peers' node: no kubelet runs it
	npNS       = "default"
)

func benchNetpol(ctx context.Context, name string, dur time.Duration) error {
	c := lab.DefaultConfig()
	c.Name = name
	cfg, err := clientcmd.BuildConfigFromFlags("", c.Kubeconfig())
	if err != nil {
		return err
	}
	// Thousands of objects: the client's default 5 writes a second would
	// take minutes.
	cfg.QPS, cfg.Burst = 1000, 2000
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return err
	}
	cl, err := client.New(cfg, client.Options{Scheme: scheme.Scheme})
	if err != nil {
		return err
	}
	defer npCleanup(cs, cl)

	// The measured pods: a (n1) and b (n2) policied, d (n1) and e (n2)
	// not.
	real := []struct{ name, node, role string }{
		{"np-a", laceNode, "client"}, {"np-b", peerNode, "server"}, {"np-d", laceNode, "open"}, {"np-e", peerNode, "open"},
	}
	for _, p := range real {
		pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: p.name, Labels: map[string]string{"bench-np": p.role}},
			Spec: corev1.PodSpec{NodeName: p.node, TerminationGracePeriodSeconds: ptr.To[int64](1),
				Containers: []corev1.Container{{Name: "pause", Image: "registry.k8s.io/pause:3.10"}}}}
		if _, err := cs.CoreV1().Pods(npNS).Create(ctx, pod, metav1.CreateOptions{}); err != nil {
			return err
		}
	}
	nsOf, ipOf := map[string]string{}, map[string]netip.Addr{}
	for deadline := time.Now().Add(time.Minute); len(nsOf) < len(real) && time.Now().Before(deadline); time.Sleep(200 * time.Millisecond) {
		for _, r := range real {
			p, err := cs.CoreV1().Pods(npNS).Get(ctx, r.name, metav1.GetOptions{})
			if err == nil && p.Status.Phase == corev1.PodRunning && p.Status.PodIP != "" {
				ns, err := lab.PodNetNS(ctx, c, npNS, r.name)
				if err != nil {
					return err
				}
				nsOf[r.name], ipOf[r.name] = ns, netip.MustParseAddr(p.Status.PodIP)
			}
		}
	}
	if len(nsOf) < len(real) {
		return errors.New("netpol: bench pods did not start")
	}
	procs := benchProcs(c, nil)
	before := rssOf(procs)

	// The cluster's policies and their peers.
	start := time.Now()
	if err := npPeers(ctx, cs, cl); err != nil {
		return err
	}
	for i := range npPolicies {
		if _, err := cs.NetworkingV1().NetworkPolicies(npNS).Create(ctx, npFiller(i), metav1.CreateOptions{}); err != nil {
			return fmt.Errorf("create policy %d: %w", i, err)
		}
	}
	// The measured ones: b admits a on 5201; a sends to b on 5201 only.
	for _, np := range []*networkingv1.NetworkPolicy{
		npAllow("np-bench-in", "server", "client", 5201, networkingv1.PolicyTypeIngress),
		npAllow("np-bench-out", "client", "server", 5201, networkingv1.PolicyTypeEgress),
	} {
		if _, err := cs.NetworkingV1().NetworkPolicies(npNS).Create(ctx, np, metav1.CreateOptions{}); err != nil {
			return err
		}
	}
	// Enforced: a no longer reaches b on another port, and still on
	// 5201.
	for deadline := time.Now().Add(3 * time.Minute); ; {
		err := npRefused(ctx, nsOf["np-b"], nsOf["np-a"], net.JoinHostPort(ipOf["np-b"].String(), "5202"))
		if err == nil {
			break
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("netpol: the policies were not enforced: %w", err)
		}
		time.Sleep(100 * time.Millisecond)
	}
	setup := time.Since(start)
	bDial := net.JoinHostPort(ipOf["np-b"].String(), "5201")
	if _, err := npFirstConnect(ctx, nsOf["np-b"], nsOf["np-a"], bDial, 10*time.Second); err != nil {
		return fmt.Errorf("netpol: the allowed port: %w", err)
	}
	after := rssOf(procs)

	// Per packet: interleaved rounds.
	paths := []struct {
		name     string
		src, dst string
		addr     netip.Addr
	}{
		{"both isolated", nsOf["np-a"], nsOf["np-b"], ipOf["np-b"]},
		{"no policy", nsOf["np-d"], nsOf["np-e"], ipOf["np-e"]},
	}
	samples := make([][]result, len(paths))
	for round := range rounds {
		for k := range paths {
			i := (k + round) % len(paths)
			p50, p99, perS, err := requestResponse(ctx, paths[i].src, paths[i].dst, paths[i].addr, dur)
			if err != nil {
				return fmt.Errorf("%s: %w", paths[i].name, err)
			}
			samples[i] = append(samples[i], result{p50: p50, p99: p99, transactionsS: perS})
		}
	}
	pol, open := median(samples[0]), median(samples[1])

	// A change: a new policy admits a on another port each time.
	var changes []time.Duration
	for i := range 5 {
		port := 5300 + i
		np := npAllow("np-bench-change-"+strconv.Itoa(i), "server", "client", port, networkingv1.PolicyTypeIngress)
		// a's egress must allow it too: its own policy gains the port.
		out := npAllow("np-bench-change-out-"+strconv.Itoa(i), "client", "server", port, networkingv1.PolicyTypeEgress)
		if _, err := cs.NetworkingV1().NetworkPolicies(npNS).Create(ctx, out, metav1.CreateOptions{}); err != nil {
			return err
		}
		time.Sleep(time.Second) // the egress half settles: only the ingress policy is timed
		dial := net.JoinHostPort(ipOf["np-b"].String(), strconv.Itoa(port))
		t0 := time.Now()
		if _, err := cs.NetworkingV1().NetworkPolicies(npNS).Create(ctx, np, metav1.CreateOptions{}); err != nil {
			return err
		}
		d, err := npFirstConnect(ctx, nsOf["np-b"], nsOf["np-a"], dial, 30*time.Second)
		if err != nil {
			return fmt.Errorf("netpol: change %d: %w", i, err)
		}
		changes = append(changes, d.Sub(t0))
	}
	sort.Slice(changes, func(i, j int) bool { return changes[i] < changes[j] })

	fmt.Printf("NetworkPolicy (%d policies over %d pods in one namespace, %d real pods on 2 nodes; request/response = 1-byte ping-pong on one connection across nodes, %s, median of %d interleaved rounds)\n",
		npPolicies+2, npPods+len(real), len(real), dur, rounds)
	tab := tabwriter.NewWriter(os.Stdout, 0, 4, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tab, "path\tpolicied p50\tunpolicied p50\tratio\tpolicied p99\tunpolicied p99\tratio\ttransactions/s ratio\t")
	fmt.Fprintf(tab, "pod to pod across nodes, client egress + server ingress isolated\t%s\t%s\t%.3f\t%s\t%s\t%.3f\t%.3f\t\n",
		us(pol.p50), us(open.p50), float64(pol.p50)/float64(open.p50), us(pol.p99), us(open.p99), float64(pol.p99)/float64(open.p99),
		pol.transactionsS/open.transactionsS)
	tab.Flush()
	fmt.Println("target: p50 ratio <= 1.05 (the unpolicied path measured in the same run)")
	fmt.Printf("policy written -> first connection it admits: median %s, max %s (5 changes, probes every 5 ms)\n",
		ms(changes[len(changes)/2]), ms(changes[len(changes)-1]))
	fmt.Printf("%d policies and %d pods created -> enforced: %s (API writes included)\n", npPolicies+2, npPods, ms(setup))
	for _, k := range []string{"agent " + laceNode, "agent " + peerNode} {
		fmt.Printf("%s RSS: %.1f MiB before the policies, %.1f MiB after\n", k, float64(before[k])/(1<<20), float64(after[k])/(1<<20))
	}
	fmt.Println()
	return nil
}

// npPeers creates the peers: pods of a node no kubelet runs (they stay
// Pending; the Node object keeps the pod garbage collector off them) and
// their NetworkEndpoints in the default network.
func npPeers(ctx context.Context, cs kubernetes.Interface, cl client.Client) error {
	if _, err := cs.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: npGhost}}, metav1.CreateOptions{}); err != nil {
		return fmt.Errorf("create node %s: %w", npGhost, err)
	}
	for i := range npPods {
		name := fmt.Sprintf("np-peer-%d", i)
		pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{"bench-app": fmt.Sprintf("a%d", i%100)}},
			Spec: corev1.PodSpec{NodeName: npGhost, Containers: []corev1.Container{{Name: "c", Image: "registry.k8s.io/pause:3.10",
				Ports: []corev1.ContainerPort{{Name: "http", ContainerPort: 8080}}}}}}
		created, err := cs.CoreV1().Pods(npNS).Create(ctx, pod, metav1.CreateOptions{})
		if err != nil {
			return fmt.Errorf("create peer %s: %w", name, err)
		}
		ne := &lacev1.NetworkEndpoint{ObjectMeta: metav1.ObjectMeta{Namespace: npNS, Name: name,
			Labels: map[string]string{lacev1.LabelPodUID: string(created.UID)}},
			Spec: lacev1.NetworkEndpointSpec{Network: "default", Node: npGhost,
				Addresses: []lacev1.IPAddress{lacev1.IPAddress(fmt.Sprintf("10.250.%d.%d", i/250, i%250+1))}}}
		if err := cl.Create(ctx, ne); err != nil {
			return fmt.Errorf("create NetworkEndpoint %s: %w", name, err)
		}
	}
	return nil
}

// npFiller is one of the cluster's policies: app a<i%100> admits its
// neighbour app's http, or a CIDR on a port range.
func npFiller(i int) *networkingv1.NetworkPolicy {
	peer := networkingv1.NetworkPolicyPeer{PodSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"bench-app": fmt.Sprintf("a%d", (i+1)%100)}}}
	port := networkingv1.NetworkPolicyPort{Port: ptr.To(intstr.FromString("http"))}
	if i%3 == 0 {
		peer = networkingv1.NetworkPolicyPeer{IPBlock: &networkingv1.IPBlock{CIDR: fmt.Sprintf("10.%d.0.0/16", 100+i%50),
			Except: []string{fmt.Sprintf("10.%d.7.0/24", 100+i%50)}}}
		port = networkingv1.NetworkPolicyPort{Port: ptr.To(intstr.FromInt32(int32(1000 + i))), EndPort: ptr.To(int32(1100 + i))}
	}
	return &networkingv1.NetworkPolicy{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("np-fill-%d", i)},
		Spec: networkingv1.NetworkPolicySpec{
			PodSelector: metav1.LabelSelector{MatchLabels: map[string]string{"bench-app": fmt.Sprintf("a%d", i%100)}},
			Ingress:     []networkingv1.NetworkPolicyIngressRule{{From: []networkingv1.NetworkPolicyPeer{peer}, Ports: []networkingv1.NetworkPolicyPort{port}}},
		}}
}

// npAllow lets pods bench-np=from reach bench-np=to on TCP port, as the
// subject's policy of type dir (the subject is to for ingress, from for
// egress).
func npAllow(name, to, from string, port int, dir networkingv1.PolicyType) *networkingv1.NetworkPolicy {
	p := networkingv1.NetworkPolicyPort{Protocol: ptr.To(corev1.ProtocolTCP), Port: ptr.To(intstr.FromInt32(int32(port)))}
	np := &networkingv1.NetworkPolicy{ObjectMeta: metav1.ObjectMeta{Name: name}, Spec: networkingv1.NetworkPolicySpec{PolicyTypes: []networkingv1.PolicyType{dir}}}
	if dir == networkingv1.PolicyTypeIngress {
		np.Spec.PodSelector = metav1.LabelSelector{MatchLabels: map[string]string{"bench-np": to}}
		np.Spec.Ingress = []networkingv1.NetworkPolicyIngressRule{{From: []networkingv1.NetworkPolicyPeer{
			{PodSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"bench-np": from}}}}, Ports: []networkingv1.NetworkPolicyPort{p}}}
	} else {
		np.Spec.PodSelector = metav1.LabelSelector{MatchLabels: map[string]string{"bench-np": from}}
		np.Spec.Egress = []networkingv1.NetworkPolicyEgressRule{{To: []networkingv1.NetworkPolicyPeer{
			{PodSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"bench-np": to}}}}, Ports: []networkingv1.NetworkPolicyPort{p}}}
	}
	return np
}

// npFirstConnect listens on dial's port in srvNS and opens a connection
// from cliNS every 5 ms (each waits for its own SYN's fate) until one is
// accepted; it returns when that one was sent.
func npFirstConnect(ctx context.Context, srvNS, cliNS, dial string, limit time.Duration) (time.Time, error) {
	_, port, _ := net.SplitHostPort(dial)
	ln, err := netutil.Listen(srvNS, "tcp", net.JoinHostPort("", port))
	if err != nil {
		return time.Time{}, err
	}
	defer ln.Close()
	ctx, cancel := context.WithTimeout(ctx, limit)
	defer cancel()
	won := make(chan time.Time, 1)
	tick := time.NewTicker(5 * time.Millisecond)
	defer tick.Stop()
	for {
		select {
		case t := <-won:
			return t, nil
		case <-ctx.Done():
			return time.Time{}, fmt.Errorf("no connection to %s within %s", dial, limit)
		case <-tick.C:
			sent := time.Now()
			go func() {
				dctx, dcancel := context.WithTimeout(ctx, 3*time.Second)
				defer dcancel()
				conn, err := netutil.DialContext(dctx, cliNS, "tcp", dial)
				if err == nil {
					conn.Close()
					select {
					case won <- sent:
					default:
					}
				}
			}()
		}
	}
}

// npRefused checks that a connection to dial times out.
func npRefused(ctx context.Context, srvNS, cliNS, dial string) error {
	_, port, _ := net.SplitHostPort(dial)
	ln, err := netutil.Listen(srvNS, "tcp", net.JoinHostPort("", port))
	if err != nil {
		return err
	}
	defer ln.Close()
	dctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	conn, err := netutil.DialContext(dctx, cliNS, "tcp", dial)
	if err == nil {
		conn.Close()
		return fmt.Errorf("%s connected", dial)
	}
	return nil
}

// npCleanup deletes what the benchmark created.
func npCleanup(cs kubernetes.Interface, cl client.Client) {
	ctx := context.Background()
	_ = cs.NetworkingV1().NetworkPolicies(npNS).DeleteCollection(ctx, metav1.DeleteOptions{}, metav1.ListOptions{})
	for _, n := range []string{"np-a", "np-b", "np-d", "np-e"} {
		_ = cs.CoreV1().Pods(npNS).Delete(ctx, n, metav1.DeleteOptions{GracePeriodSeconds: ptr.To[int64](0)})
	}
	for i := range npPods {
		name := fmt.Sprintf("np-peer-%d", i)
		_ = cs.CoreV1().Pods(npNS).Delete(ctx, name, metav1.DeleteOptions{GracePeriodSeconds: ptr.To[int64](0)})
		_ = cl.Delete(ctx, &lacev1.NetworkEndpoint{ObjectMeta: metav1.ObjectMeta{Namespace: npNS, Name: name}})
	}
	_ = cs.CoreV1().Nodes().Delete(ctx, npGhost, metav1.DeleteOptions{})
}

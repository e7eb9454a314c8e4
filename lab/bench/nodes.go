package main

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/utils/ptr"
	crclient "sigs.k8s.io/controller-runtime/pkg/client"

	lacev1 "github.com/lace-cni/lace/api/v1alpha1"
	"github.com/lace-cni/lace/internal/controller"
	"github.com/lace-cni/lace/internal/netutil"
	"github.com/lace-cni/lace/lab"
	"github.com/lace-cni/lace/pkg/scheme"
)

// The nodes benchmark registers simulated nodes: Node objects without a
// kubelet, whose "agent" (this benchmark) publishes their underlay
// addresses, and pods bound to them with their NetworkEndpoints. Lace's
// controller gives them locators and blocks, and the real nodes' agents
// route to them and index their endpoints, as for real nodes: what a big
// cluster costs the control plane and every agent, without the kubelets.

// simLabel marks the benchmark's simulated nodes (and their pods'
// namespace), for the cleanup.
const simLabel = "bench.lace-cni.io/simulated"

// simNS holds the simulated nodes' pods.
const simNS = "lace-bench-sim"

// NodesHelmSet is the chart values a lab for the nodes benchmark needs:
// a default network with room for 4,096 nodes' blocks (the chart's /16
// of /24 blocks stops at 256), each as large as the chart's.
const nodesHelmSet = "defaults.network.ipv4.prefix=10.240.0.0/12,defaults.network.ipv6.prefix=fd00:244::/52"

type nodeOptions struct {
	nodes, pods int
}

// simNode is simulated node i's name and underlay address.
func simNode(i int) (string, netip.Addr) {
	a := lab.UnderlayV6.Addr().As16()
	a[13], a[14], a[15] = 1, byte(i>>8), byte(i)
	return fmt.Sprintf("sim-%04d", i), netip.AddrFrom16(a)
}

// nodeBench holds the clients and the real nodes.
type nodeBench struct {
	cs   kubernetes.Interface
	cl   crclient.WithWatch
	c    lab.Config
	real []string // the lab's nodes
}

func benchNodes(ctx context.Context, name string, o nodeOptions) (err error) {
	cs, c, err := fastClient(name)
	if err != nil {
		return err
	}
	restCfg, err := clientcmd.BuildConfigFromFlags("", c.Kubeconfig())
	if err != nil {
		return err
	}
	restCfg.QPS, restCfg.Burst = 5000, 10000
	cl, err := crclient.NewWithWatch(restCfg, crclient.Options{Scheme: scheme.Scheme})
	if err != nil {
		return err
	}
	b := &nodeBench{cs: cs, cl: cl, c: c}
	nodes, err := cs.CoreV1().Nodes().List(ctx, metav1.ListOptions{LabelSelector: "!" + simLabel})
	if err != nil {
		return err
	}
	for _, n := range nodes.Items {
		b.real = append(b.real, n.Name)
	}
	slices.Sort(b.real)
	// Whatever happens, the simulated nodes go: a lab left with a
	// thousand nodes that never answer is no lab.
	defer func() {
		cctx, cancel := context.WithTimeout(context.Background(), 20*time.Minute)
		defer cancel()
		start := time.Now()
		if cerr := b.cleanup(cctx); cerr != nil {
			fmt.Printf("  cleanup: %v\n", cerr)
			err = errors.Join(err, fmt.Errorf("the simulated nodes were not all removed: %w", cerr))
			return
		}
		fmt.Printf("  %d simulated nodes and their pods deleted; every block and locator released %s later\n",
			o.nodes, time.Since(start).Round(time.Second))
	}()
	return b.run(ctx, o)
}

func (b *nodeBench) run(ctx context.Context, o nodeOptions) error {
	fmt.Printf("Many nodes: %d simulated nodes x %d pods beside the lab's %d (%s)\n", o.nodes, o.pods, len(b.real), strings.Join(b.real, ", "))
	procs := benchProcs(b.c, nil)
	rss0, cpu0 := rssOf(procs), cpuOf(procs)

	// 1. The nodes, and the controller's locators and blocks for them.
	start := time.Now()
	if err := parallel(ctx, o.nodes, func(i int) error { return b.createNode(ctx, i) }); err != nil {
		return err
	}
	created := time.Since(start)
	if err := b.waitAllocated(ctx, 0, o.nodes, 10*time.Minute); err != nil {
		return err
	}
	allocated := time.Since(start)
	fmt.Printf("  %d Nodes created in %s; every one with a locator and a block of the default network %s after the first\n",
		o.nodes, created.Round(time.Millisecond), allocated.Round(time.Millisecond))

	// 2. Their agents publish their addresses; every real node routes to
	// every locator.
	start = time.Now()
	if err := parallel(ctx, o.nodes, func(i int) error { return b.publish(ctx, i) }); err != nil {
		return err
	}
	if err := b.waitRoutes(ctx, 0, o.nodes, 10*time.Minute); err != nil {
		return err
	}
	fmt.Printf("  routes to all %d locators on every real node %s after the first address was published\n",
		o.nodes, time.Since(start).Round(time.Millisecond))
	cpu1, rss1 := cpuOf(procs), rssOf(procs)

	// 3. One node more, five times: its allocation, then its routes.
	var allocs, routes []time.Duration
	for k := range 5 {
		i := o.nodes + k
		t0 := time.Now()
		if err := b.createNode(ctx, i); err != nil {
			return err
		}
		if err := b.waitAllocated(ctx, i, i+1, 2*time.Minute); err != nil {
			return err
		}
		allocs = append(allocs, time.Since(t0))
		t1 := time.Now()
		if err := b.publish(ctx, i); err != nil {
			return err
		}
		if err := b.waitRoutes(ctx, i, i+1, 2*time.Minute); err != nil {
			return err
		}
		routes = append(routes, time.Since(t1))
	}
	slices.Sort(allocs)
	slices.Sort(routes)
	fmt.Printf("  a new node beside %d: locator and block in %s (median of 5; max %s), then its routes on every real node %s (max %s) after its address\n",
		o.nodes, ms(allocs[2]), ms(allocs[4]), ms(routes[2]), ms(routes[4]))

	// 4. Pods on them with their NetworkEndpoints: no service of a real
	// node may be computed again for them.
	comp0 := b.computations(ctx)
	start = time.Now()
	if err := b.ensureNamespace(ctx); err != nil {
		return err
	}
	var made atomic.Int64
	if err := parallel(ctx, o.nodes, func(i int) error {
		n, err := b.createPods(ctx, i, o.pods)
		made.Add(int64(n))
		return err
	}); err != nil {
		return err
	}
	fmt.Printf("  %d pods and their NetworkEndpoints on the simulated nodes written in %s\n", made.Load(), time.Since(start).Round(time.Millisecond))
	rss2 := rssOf(procs)
	// The agents' and the controller's work on them, to the end: settled
	// when no process used more than 1% of a CPU over two seconds.
	settle(ctx, procs, 2*time.Minute)
	cpu3, rss3 := cpuOf(procs), rssOf(procs)
	comp1 := b.computations(ctx)

	// 5. At rest: writes to Lace's objects, and the CPU it costs.
	writes, err := b.writesAtRest(ctx, time.Minute)
	if err != nil {
		return err
	}
	cpu4, rss4 := cpuOf(procs), rssOf(procs)

	keys := slices.Sorted(func(yield func(string) bool) {
		for k := range procs {
			if !yield(k) {
				return
			}
		}
	})
	fmt.Println()
	fmt.Printf("| process | RSS before | RSS at %d nodes | RSS with %d pods | CPU: nodes and routes | CPU: pods (to settled) | CPU per minute at rest |\n", o.nodes, o.nodes*o.pods)
	fmt.Println("| --- | --- | --- | --- | --- | --- | --- |")
	for _, k := range keys {
		fmt.Printf("| %s | %s | %s | %s | %s | %s | %s |\n", k, mib(rss0[k]), mib(rss1[k]), mib(max(rss2[k], rss3[k], rss4[k])),
			ms(cpu1[k]-cpu0[k]), ms(cpu3[k]-cpu1[k]), ms(cpu4[k]-cpu3[k]))
	}
	fmt.Println()
	for _, n := range b.real {
		c0, c1 := comp0[n], comp1[n]
		fmt.Printf("  %s: %d service computations while %d pods were created on other nodes\n", n, int(c1-c0), made.Load())
	}
	fmt.Printf("  writes to Lace's objects (UnderlayEndpoints, Allocations, NetworkEndpoints, Networks) in a minute at rest: %d\n", writes)
	return nil
}

// parallel runs f(0..n-1) on 32 workers and returns the first error.
func parallel(ctx context.Context, n int, f func(int) error) error {
	var (
		wg   sync.WaitGroup
		next atomic.Int64
		mu   sync.Mutex
		errs []error
	)
	for range 32 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for ctx.Err() == nil {
				i := int(next.Add(1) - 1)
				if i >= n {
					return
				}
				if err := f(i); err != nil {
					mu.Lock()
					errs = append(errs, err)
					mu.Unlock()
					return
				}
			}
		}()
	}
	wg.Wait()
	return errors.Join(append(errs, ctx.Err())...)
}

// createNode registers simulated node i: unschedulable and tainted (no
// real pod lands there), with its underlay address, as a kubelet reports
// it.
func (b *nodeBench) createNode(ctx context.Context, i int) error {
	name, addr := simNode(i)
	n := &corev1.Node{
		ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{simLabel: "true"}},
		Spec: corev1.NodeSpec{Unschedulable: true,
			Taints: []corev1.Taint{{Key: simLabel, Value: "true", Effect: corev1.TaintEffectNoSchedule}}},
		Status: corev1.NodeStatus{Addresses: []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: addr.String()}}},
	}
	got, err := b.cs.CoreV1().Nodes().Create(ctx, n, metav1.CreateOptions{})
	if err != nil {
		return fmt.Errorf("create node %s: %w", name, err)
	}
	if len(got.Status.Addresses) == 0 {
		got.Status.Addresses = n.Status.Addresses
		if _, err := b.cs.CoreV1().Nodes().UpdateStatus(ctx, got, metav1.UpdateOptions{}); err != nil {
			return fmt.Errorf("address of node %s: %w", name, err)
		}
	}
	return nil
}

// publish writes simulated node i's UnderlayEndpoint addresses as its
// agent would (its field manager, server-side apply).
func (b *nodeBench) publish(ctx context.Context, i int) error {
	name, addr := simNode(i)
	n, err := b.cs.CoreV1().Nodes().Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		return err
	}
	obj := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": lacev1.GroupVersion.String(), "kind": "UnderlayEndpoint",
		"metadata": map[string]any{"name": name, "ownerReferences": []any{map[string]any{
			"apiVersion": "v1", "kind": "Node", "name": name, "uid": string(n.UID)}}},
		"spec": map[string]any{"node": name, "addresses": []any{addr.String()}},
	}}
	if err := b.cl.Patch(ctx, obj, crclient.Apply, crclient.FieldOwner("lace-agent"), crclient.ForceOwnership); err != nil {
		return fmt.Errorf("publish the underlay endpoint of %s: %w", name, err)
	}
	return nil
}

// waitAllocated waits until simulated nodes from..to-1 all have a locator
// and a block of the default network.
func (b *nodeBench) waitAllocated(ctx context.Context, from, to int, timeout time.Duration) error {
	want := map[string]bool{}
	for i := from; i < to; i++ {
		n, _ := simNode(i)
		want[n] = true
	}
	return waitFor(ctx, timeout, fmt.Sprintf("simulated nodes %d..%d allocated", from, to-1), func() error {
		var ueps lacev1.UnderlayEndpointList
		var allocs lacev1.AllocationList
		if err := errors.Join(b.cl.List(ctx, &ueps), b.cl.List(ctx, &allocs)); err != nil {
			return err
		}
		located, blocked := 0, 0
		for _, u := range ueps.Items {
			if want[u.Name] && u.Spec.Locator != "" {
				located++
			}
		}
		for _, a := range allocs.Items {
			if want[a.Spec.Node] && len(a.Spec.Prefixes) > 0 {
				blocked++
			}
		}
		if located < len(want) || blocked < len(want) {
			return fmt.Errorf("%d of %d have a locator, %d a block", located, len(want), blocked)
		}
		return nil
	})
}

// waitRoutes waits until every real node routes to the locators of
// simulated nodes from..to-1 through their addresses.
func (b *nodeBench) waitRoutes(ctx context.Context, from, to int, timeout time.Duration) error {
	var ueps lacev1.UnderlayEndpointList
	if err := b.cl.List(ctx, &ueps); err != nil {
		return err
	}
	want := map[netip.Prefix]netip.Addr{}
	for i := from; i < to; i++ {
		name, addr := simNode(i)
		for _, u := range ueps.Items {
			if u.Name == name {
				want[netip.MustParsePrefix(string(u.Spec.Locator))] = addr
			}
		}
	}
	if len(want) != to-from {
		return fmt.Errorf("%d of %d simulated nodes have a locator", len(want), to-from)
	}
	return waitFor(ctx, timeout, fmt.Sprintf("routes to %d locators on every real node", len(want)), func() error {
		var short []string
		for _, n := range b.real {
			if got := routesTo(netutil.Path(b.c.NetNS(n)), want); got < len(want) {
				short = append(short, fmt.Sprintf("%s has %d", n, got))
			}
		}
		if len(short) > 0 {
			return errors.New(strings.Join(short, ", "))
		}
		return nil
	})
}

// routesTo counts the routes Lace owns in the namespace at ns to a
// locator of want through its node's address.
func routesTo(ns string, want map[netip.Prefix]netip.Addr) int {
	owned, err := netutil.OwnedRoutes(ns)
	if err != nil {
		return 0
	}
	n := 0
	for p, gw := range want {
		if owned[p] == gw {
			n++
		}
	}
	return n
}

func (b *nodeBench) ensureNamespace(ctx context.Context) error {
	_, err := b.cs.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: simNS,
		Labels: map[string]string{simLabel: "true"}}}, metav1.CreateOptions{})
	if err != nil && !apierrors.IsAlreadyExists(err) {
		return err
	}
	// Pods are admitted only once the namespace's default service account
	// exists.
	return waitFor(ctx, time.Minute, "the default service account of "+simNS, func() error {
		_, err := b.cs.CoreV1().ServiceAccounts(simNS).Get(ctx, "default", metav1.GetOptions{})
		return err
	})
}

// createPods creates count pods bound to simulated node i, and their
// NetworkEndpoints at addresses of the node's block, as its agent would
// write them. It returns how many it made.
func (b *nodeBench) createPods(ctx context.Context, i, count int) (int, error) {
	node, _ := simNode(i)
	var alloc lacev1.Allocation
	if err := b.cl.Get(ctx, crclient.ObjectKey{Name: controller.AllocationName("default", node)}, &alloc); err != nil {
		return 0, fmt.Errorf("block of %s: %w", node, err)
	}
	var block netip.Prefix
	for _, p := range alloc.Spec.Prefixes {
		if pp, err := netip.ParsePrefix(string(p)); err == nil && pp.Addr().Is4() {
			block = pp
		}
	}
	if !block.IsValid() {
		return 0, fmt.Errorf("%s has no IPv4 block", node)
	}
	addr := block.Addr().Next()
	for j := range count {
		addr = addr.Next()
		if !block.Contains(addr) {
			return j, fmt.Errorf("%s's block %s holds fewer than %d pods", node, block, count)
		}
		name := fmt.Sprintf("%s-%02d", node, j)
		pod, err := b.cs.CoreV1().Pods(simNS).Create(ctx, &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{simLabel: "true"}},
			Spec: corev1.PodSpec{NodeName: node, Containers: []corev1.Container{{Name: "c", Image: "registry.k8s.io/pause:3.10"}},
				Tolerations:                   []corev1.Toleration{{Operator: corev1.TolerationOpExists}},
				TerminationGracePeriodSeconds: ptr.To[int64](0)},
		}, metav1.CreateOptions{})
		if err != nil {
			return j, fmt.Errorf("create pod %s: %w", name, err)
		}
		ne := &lacev1.NetworkEndpoint{
			ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: simNS,
				Labels: map[string]string{lacev1.LabelPodUID: string(pod.UID), lacev1.LabelNetwork: "default", lacev1.LabelNode: node},
				OwnerReferences: []metav1.OwnerReference{{APIVersion: "v1", Kind: "Pod", Name: name, UID: pod.UID,
					Controller: ptr.To(true)}}},
			Spec: lacev1.NetworkEndpointSpec{Network: "default", Node: node, Addresses: []lacev1.IPAddress{lacev1.IPAddress(addr.String())},
				Interface: "eth0"},
		}
		if err := b.cl.Create(ctx, ne); err != nil {
			return j, fmt.Errorf("create network endpoint %s: %w", name, err)
		}
	}
	return count, nil
}

// computations reads each real node's agent's count of services computed.
func (b *nodeBench) computations(ctx context.Context) map[string]float64 {
	out := map[string]float64{}
	for _, n := range b.real {
		v, err := promValue(ctx, netutil.Path(b.c.NetNS(n)), "127.0.0.1:9962", "lace_agent_service_computations_total")
		if err == nil {
			out[n] = v
		}
	}
	return out
}

// settle waits until no process of procs used more than 1% of a CPU over
// two seconds, or timeout.
func settle(ctx context.Context, procs map[string]int, timeout time.Duration) {
	deadline := time.Now().Add(timeout)
	prev := cpuOf(procs)
	for ctx.Err() == nil && time.Now().Before(deadline) {
		time.Sleep(2 * time.Second)
		now := cpuOf(procs)
		busy := false
		for _, d := range cpuDelta(prev, now) {
			busy = busy || d > 20*time.Millisecond
		}
		prev = now
		if !busy {
			return
		}
	}
}

// writesAtRest counts the changes to Lace's objects the API server sees
// over d.
func (b *nodeBench) writesAtRest(ctx context.Context, d time.Duration) (int, error) {
	wctx, cancel := context.WithTimeout(ctx, d)
	defer cancel()
	lists := []crclient.ObjectList{&lacev1.UnderlayEndpointList{}, &lacev1.AllocationList{}, &lacev1.NetworkEndpointList{}, &lacev1.NetworkList{}}
	var n atomic.Int64
	var wg sync.WaitGroup
	errs := make([]error, len(lists))
	for i, l := range lists {
		// From the collection's version now: no replay of what exists.
		if err := b.cl.List(ctx, l, crclient.Limit(1)); err != nil {
			return 0, err
		}
		rv := l.(metav1.ListInterface).GetResourceVersion()
		w, err := b.cl.Watch(wctx, l, &crclient.ListOptions{Raw: &metav1.ListOptions{ResourceVersion: rv}})
		if err != nil {
			return 0, fmt.Errorf("watch %T: %w", l, err)
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer w.Stop()
			for {
				select {
				case <-wctx.Done():
					return
				case ev, ok := <-w.ResultChan():
					if !ok {
						if wctx.Err() == nil {
							errs[i] = fmt.Errorf("watch %T ended early", l)
						}
						return
					}
					if ev.Type != watch.Bookmark {
						n.Add(1)
					}
				}
			}
		}()
	}
	wg.Wait()
	return int(n.Load()), errors.Join(errs...)
}

// cleanup deletes the simulated nodes' pods (their NetworkEndpoints go
// with them), then the nodes (their UnderlayEndpoints and blocks with
// them), and waits until the blocks are released.
func (b *nodeBench) cleanup(ctx context.Context) error {
	sel := metav1.ListOptions{LabelSelector: simLabel}
	zero := metav1.DeleteOptions{GracePeriodSeconds: ptr.To[int64](0)}
	var errs []error
	// No kubelet confirms a pod's end: deleted at once. A collection of
	// tens of thousands can outlast the API server's request timeout:
	// tried again (what went stays gone), and the namespace's deletion
	// takes what is left in any case.
	var derr error
	for range 5 {
		if derr = b.cs.CoreV1().Pods(simNS).DeleteCollection(ctx, zero, sel); derr == nil {
			break
		}
	}
	errs = append(errs, derr)
	if err := b.cs.CoreV1().Namespaces().Delete(ctx, simNS, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
		errs = append(errs, err)
	}
	errs = append(errs, b.cs.CoreV1().Nodes().DeleteCollection(ctx, metav1.DeleteOptions{}, sel))
	errs = append(errs, waitFor(ctx, 15*time.Minute, "the simulated nodes' blocks, locators and pods gone", func() error {
		var allocs lacev1.AllocationList
		var ueps lacev1.UnderlayEndpointList
		if err := errors.Join(b.cl.List(ctx, &allocs), b.cl.List(ctx, &ueps)); err != nil {
			return err
		}
		left := 0
		for _, a := range allocs.Items {
			if strings.HasPrefix(a.Spec.Node, "sim-") {
				left++
			}
		}
		for _, u := range ueps.Items {
			if strings.HasPrefix(u.Name, "sim-") {
				left++
			}
		}
		if left > 0 {
			return fmt.Errorf("%d blocks and locators left", left)
		}
		if _, err := b.cs.CoreV1().Namespaces().Get(ctx, simNS, metav1.GetOptions{}); !apierrors.IsNotFound(err) {
			return fmt.Errorf("namespace %s still there (%v)", simNS, err)
		}
		return nil
	}))
	return errors.Join(errs...)
}

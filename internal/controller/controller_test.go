package controller_test

import (
	"context"
	"fmt"
	"net/netip"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/go-logr/logr"
	ctrl "sigs.k8s.io/controller-runtime"

	lacev1 "github.com/lace-cni/lace/api/v1alpha1"
	"github.com/lace-cni/lace/internal/controller"
	"github.com/lace-cni/lace/internal/testutil"
	"github.com/lace-cni/lace/lab/controlplane/cptest"
	"github.com/lace-cni/lace/pkg/logging"
)

func TestMain(m *testing.M) {
	level := os.Getenv("LACE_TEST_LOG")
	if level == "" {
		ctrl.SetLogger(logr.Discard())
	} else if err := logging.Setup(level); err != nil {
		panic(err)
	}
	os.Exit(m.Run())
}

// startController runs a controller manager against env until the returned
// stop function is called (or the test ends).
func startController(t *testing.T, env *cptest.Env, mutate func(*controller.Options)) (stop func()) {
	t.Helper()
	o := controller.DefaultOptions()
	o.MetricsAddr, o.HealthAddr = "0", "0"
	o.LeaderElection = false
	o.ReleaseGrace = 3 * time.Second
	o.SkipNameValidation = true
	if mutate != nil {
		mutate(&o)
	}
	mgr, err := controller.NewManager(env.Config, o)
	if err != nil {
		t.Fatalf("new manager: %v", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- mgr.Start(ctx) }()
	var once sync.Once
	stop = func() {
		once.Do(func() {
			cancel()
			if err := <-done; err != nil {
				t.Errorf("manager: %v", err)
			}
		})
	}
	t.Cleanup(stop)
	return stop
}

func eventually(t *testing.T, timeout time.Duration, what string, f func() error) {
	t.Helper()
	testutil.Eventually(t, timeout, 100*time.Millisecond, what, f)
}

func createNode(t *testing.T, c client.Client, name string) {
	t.Helper()
	n := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{"topology.kubernetes.io/zone": "z1"}}}
	if err := c.Create(context.Background(), n); err != nil {
		t.Fatalf("create node %s: %v", name, err)
	}
}

func l3Network(name, v4, v6 string, v4len, v6len int32) *lacev1.Network {
	nw := &lacev1.Network{ObjectMeta: metav1.ObjectMeta{Name: name}, Spec: lacev1.NetworkSpec{Type: lacev1.NetworkTypeL3}}
	if v4 != "" {
		nw.Spec.IPv4Subnet = &lacev1.Subnet{Prefix: lacev1.CIDR(v4), HostLocalPrefixLength: ptr.To(v4len)}
	}
	if v6 != "" {
		nw.Spec.IPv6Subnet = &lacev1.Subnet{Prefix: lacev1.CIDR(v6), HostLocalPrefixLength: ptr.To(v6len)}
	}
	return nw
}

func create(t *testing.T, c client.Client, o client.Object) {
	t.Helper()
	if err := c.Create(context.Background(), o); err != nil {
		t.Fatalf("create %T %s: %v", o, o.GetName(), err)
	}
}

// liveAllocations lists the allocations of network that are not being released.
func liveAllocations(t *testing.T, c client.Client, network string) map[string]lacev1.Allocation {
	t.Helper()
	var list lacev1.AllocationList
	if err := c.List(context.Background(), &list); err != nil {
		t.Fatalf("list allocations: %v", err)
	}
	out := map[string]lacev1.Allocation{}
	for _, a := range list.Items {
		if a.Spec.Network == network && a.DeletionTimestamp == nil {
			if prev, dup := out[a.Spec.Node]; dup {
				t.Fatalf("node %s has two allocations of %s: %s and %s", a.Spec.Node, network, prev.Name, a.Name)
			}
			out[a.Spec.Node] = a
		}
	}
	return out
}

func waitAllocated(t *testing.T, c client.Client, network string, nodes int) map[string]lacev1.Allocation {
	t.Helper()
	var got map[string]lacev1.Allocation
	eventually(t, 60*time.Second, fmt.Sprintf("%d allocations of %s", nodes, network), func() error {
		got = liveAllocations(t, c, network)
		if len(got) != nodes {
			return fmt.Errorf("have %d", len(got))
		}
		return nil
	})
	return got
}

// assertDisjoint fails when two allocations share a block or a block lies
// outside its subnet.
func assertDisjoint(t *testing.T, subnets map[string][]netip.Prefix, allocs ...map[string]lacev1.Allocation) {
	t.Helper()
	seen := map[string]string{}
	for _, m := range allocs {
		for _, a := range m {
			for _, s := range a.Spec.Prefixes {
				p := netip.MustParsePrefix(string(s))
				inside := false
				for _, sub := range subnets[a.Spec.Network] {
					inside = inside || (sub.Contains(p.Addr()) && p.Bits() >= sub.Bits())
				}
				if !inside {
					t.Errorf("block %s of %s is outside the subnets of %s", p, a.Name, a.Spec.Network)
				}
				key := a.Spec.Network + "/" + p.String()
				if other, dup := seen[key]; dup {
					t.Errorf("block %s given twice: %s and %s", key, other, a.Name)
				}
				seen[key] = a.Name
			}
		}
	}
}

func TestThreeNodesTwoNetworks(t *testing.T) {
	env := cptest.Start(t)
	startController(t, env, nil)
	c := env.Client
	for _, n := range []string{"n1", "n2", "n3"} {
		createNode(t, c, n)
	}
	create(t, c, l3Network("red", "10.10.0.0/16", "", 24, 0))
	create(t, c, l3Network("blue", "10.20.0.0/16", "", 26, 0))
	red := waitAllocated(t, c, "red", 3)
	blue := waitAllocated(t, c, "blue", 3)
	assertDisjoint(t, map[string][]netip.Prefix{
		"red":  {netip.MustParsePrefix("10.10.0.0/16")},
		"blue": {netip.MustParsePrefix("10.20.0.0/16")},
	}, red, blue)
	for _, a := range blue {
		if p := netip.MustParsePrefix(string(a.Spec.Prefixes[0])); p.Bits() != 26 {
			t.Errorf("blue block %s is not a /26", p)
		}
		if len(a.OwnerReferences) == 0 || a.OwnerReferences[0].Kind != "Node" || a.OwnerReferences[0].Name != a.Spec.Node {
			t.Errorf("allocation %s is not owned by its node: %+v", a.Name, a.OwnerReferences)
		}
	}

	// Network IDs: assigned, distinct, reported Ready.
	ids := map[int32]string{}
	for _, name := range []string{"red", "blue"} {
		var nw lacev1.Network
		eventually(t, 30*time.Second, "network "+name+" ready", func() error {
			if err := c.Get(context.Background(), types.NamespacedName{Name: name}, &nw); err != nil {
				return err
			}
			if !meta.IsStatusConditionTrue(nw.Status.Conditions, lacev1.ConditionReady) || nw.Status.ID == 0 {
				return fmt.Errorf("status %+v", nw.Status)
			}
			return nil
		})
		if other, dup := ids[nw.Status.ID]; dup {
			t.Errorf("networks %s and %s share ID %d", other, name, nw.Status.ID)
		}
		ids[nw.Status.ID] = name
		if len(nw.Status.Blocks) != 1 || nw.Status.Blocks[0].Allocated != 3 {
			t.Errorf("%s block usage %+v, want 3 allocated", name, nw.Status.Blocks)
		}
	}

	// SRv6 locators: one distinct /64 per node inside the pool.
	pool := controller.DefaultOptions().LocatorPool
	locs := map[string]string{}
	eventually(t, 30*time.Second, "three locators", func() error {
		var ueps lacev1.UnderlayEndpointList
		if err := c.List(context.Background(), &ueps); err != nil {
			return err
		}
		clear(locs)
		for _, u := range ueps.Items {
			if u.Spec.Locator != "" {
				locs[u.Name] = string(u.Spec.Locator)
			}
		}
		if len(locs) != 3 {
			return fmt.Errorf("locators %v", locs)
		}
		return nil
	})
	seen := map[string]bool{}
	for node, l := range locs {
		p := netip.MustParsePrefix(l)
		if !pool.Contains(p.Addr()) || p.Bits() != 64 || seen[l] {
			t.Errorf("locator %s of %s: want a distinct /64 inside %s", l, node, pool)
		}
		seen[l] = true
	}
}

func TestDualStackBlocks(t *testing.T) {
	env := cptest.Start(t)
	startController(t, env, nil)
	c := env.Client
	for _, n := range []string{"n1", "n2", "n3"} {
		createNode(t, c, n)
	}
	create(t, c, l3Network("ds", "10.30.0.0/16", "fd00:30::/48", 24, 64))
	got := waitAllocated(t, c, "ds", 3)
	assertDisjoint(t, map[string][]netip.Prefix{
		"ds": {netip.MustParsePrefix("10.30.0.0/16"), netip.MustParsePrefix("fd00:30::/48")},
	}, got)
	for node, a := range got {
		if len(a.Spec.Prefixes) != 2 {
			t.Fatalf("node %s: prefixes %v, want one per family", node, a.Spec.Prefixes)
		}
		v4, v6 := netip.MustParsePrefix(string(a.Spec.Prefixes[0])), netip.MustParsePrefix(string(a.Spec.Prefixes[1]))
		if !v4.Addr().Is4() || v4.Bits() != 24 || !v6.Addr().Is6() || v6.Bits() != 64 {
			t.Errorf("node %s: prefixes %s %s, want a /24 then a /64", node, v4, v6)
		}
	}
}

// snapshot is everything the controller decided, by object UID so that a
// deleted-and-recreated object counts as a change.
func snapshot(t *testing.T, c client.Client) map[string]string {
	t.Helper()
	ctx := context.Background()
	out := map[string]string{}
	var allocs lacev1.AllocationList
	var nets lacev1.NetworkList
	var ueps lacev1.UnderlayEndpointList
	if err := c.List(ctx, &allocs); err != nil {
		t.Fatal(err)
	}
	if err := c.List(ctx, &nets); err != nil {
		t.Fatal(err)
	}
	if err := c.List(ctx, &ueps); err != nil {
		t.Fatal(err)
	}
	for _, a := range allocs.Items {
		out["alloc/"+a.Name] = fmt.Sprintf("%s %v %v", a.UID, a.Spec.Prefixes, a.DeletionTimestamp != nil)
	}
	for _, n := range nets.Items {
		out["net/"+n.Name] = fmt.Sprintf("%s id=%d", n.UID, n.Status.ID)
	}
	for _, u := range ueps.Items {
		out["uep/"+u.Name] = fmt.Sprintf("%s %s", u.UID, u.Spec.Locator)
	}
	return out
}

// settled waits until the running controller has reconciled the current
// state: every Network's status describes its generation and says that
// nodes node(s) hold a block, and every node has a locator. The controller
// writes a status only when it changes, so these are conditions it must
// have observed, not timestamps.
func settled(t *testing.T, c client.Client, nodes int, networks ...string) {
	t.Helper()
	ctx := context.Background()
	want := fmt.Sprintf("%d node(s) hold a block", nodes)
	for _, name := range networks {
		eventually(t, 30*time.Second, fmt.Sprintf("network %s reconciled with %d nodes", name, nodes), func() error {
			var nw lacev1.Network
			if err := c.Get(ctx, client.ObjectKey{Name: name}, &nw); err != nil {
				return err
			}
			cond := meta.FindStatusCondition(nw.Status.Conditions, controller.ConditionBlocksAllocated)
			if nw.Status.ObservedGeneration != nw.Generation || cond == nil || cond.Status != metav1.ConditionTrue ||
				cond.ObservedGeneration != nw.Generation || cond.Message != want {
				return fmt.Errorf("generation %d, status %+v", nw.Generation, nw.Status)
			}
			for _, b := range nw.Status.Blocks {
				if b.Allocated != int32(nodes) {
					return fmt.Errorf("%s blocks allocated %d", b.Family, b.Allocated)
				}
			}
			return nil
		})
	}
	eventually(t, 30*time.Second, fmt.Sprintf("%d locators", nodes), func() error {
		var ueps lacev1.UnderlayEndpointList
		if err := c.List(ctx, &ueps); err != nil {
			return err
		}
		n := 0
		for _, u := range ueps.Items {
			if u.Spec.Locator != "" {
				n++
			}
		}
		if n != nodes {
			return fmt.Errorf("%d of %d endpoints have a locator", n, len(ueps.Items))
		}
		return nil
	})
}

// TestControllerRestartChangesNothing: a new controller (a restart, or a
// new leader) finds everything already decided and changes none of it. A
// node joins while no controller runs, so that the new one's first
// reconcile of every network and of the locators has something to do: once
// the new node holds its blocks and locator, the new controller has
// reconciled the whole state, and nothing else may have changed.
func TestControllerRestartChangesNothing(t *testing.T) {
	env := cptest.Start(t)
	stop := startController(t, env, nil)
	c := env.Client
	for _, n := range []string{"n1", "n2", "n3"} {
		createNode(t, c, n)
	}
	create(t, c, l3Network("a", "10.1.0.0/16", "fd00:1::/48", 24, 64))
	create(t, c, l3Network("b", "10.2.0.0/16", "", 24, 0))
	waitAllocated(t, c, "a", 3)
	waitAllocated(t, c, "b", 3)
	settled(t, c, 3, "a", "b")
	before := snapshot(t, c)
	stop()

	createNode(t, c, "n4")
	startController(t, env, nil)
	settled(t, c, 4, "a", "b")
	after := snapshot(t, c)
	for k, v := range before {
		if after[k] != v {
			t.Errorf("%s changed across restart: %q -> %q", k, v, after[k])
		}
	}
	for k, v := range after {
		if _, ok := before[k]; !ok && !strings.HasSuffix(k, "n4") {
			t.Errorf("%s appeared after restart: %q", k, v)
		}
	}
	for _, k := range []string{"alloc/a.n4", "alloc/b.n4", "uep/n4"} {
		if _, ok := after[k]; !ok {
			t.Errorf("%s missing after restart: the new controller did not reconcile the joined node", k)
		}
	}
}

func TestDeletedNodeBlocksAreReleasedThenReused(t *testing.T) {
	env := cptest.Start(t)
	const grace = 4 * time.Second
	startController(t, env, func(o *controller.Options) { o.ReleaseGrace = grace })
	c := env.Client
	ctx := context.Background()
	for _, n := range []string{"n1", "n2", "n3"} {
		createNode(t, c, n)
	}
	create(t, c, l3Network("net", "10.5.0.0/24", "", 26, 0))
	got := waitAllocated(t, c, "net", 3)
	freed := got["n2"].Spec.Prefixes[0]

	if err := c.Delete(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n2"}}); err != nil {
		t.Fatal(err)
	}
	// Phase one: withdrawn (terminating) but still reserved.
	eventually(t, 10*time.Second, "n2's allocation withdrawn", func() error {
		var a lacev1.Allocation
		if err := c.Get(ctx, types.NamespacedName{Name: got["n2"].Name}, &a); err != nil {
			return err
		}
		if a.DeletionTimestamp == nil {
			return fmt.Errorf("not yet terminating")
		}
		return nil
	})
	createNode(t, c, "n4")
	now := waitAllocated(t, c, "net", 3)
	if now["n4"].Spec.Prefixes[0] == freed {
		t.Fatalf("block %s reused while still being released", freed)
	}
	// Phase two: after the grace period the block is free again.
	eventually(t, grace+15*time.Second, "n2's allocation gone", func() error {
		var a lacev1.Allocation
		err := c.Get(ctx, types.NamespacedName{Name: got["n2"].Name}, &a)
		if apierrors.IsNotFound(err) {
			return nil
		}
		return fmt.Errorf("still there (%v)", err)
	})
	createNode(t, c, "n5")
	now = waitAllocated(t, c, "net", 4)
	if now["n5"].Spec.Prefixes[0] != freed {
		t.Fatalf("n5 got %s, want the released block %s", now["n5"].Spec.Prefixes[0], freed)
	}
	// The removed node's underlay endpoint goes too.
	eventually(t, 10*time.Second, "n2's underlay endpoint removed", func() error {
		var u lacev1.UnderlayEndpoint
		if err := c.Get(ctx, types.NamespacedName{Name: "n2"}, &u); !apierrors.IsNotFound(err) {
			return fmt.Errorf("still there (%v)", err)
		}
		return nil
	})
}

func TestExhaustedSubnetIsReported(t *testing.T) {
	env := cptest.Start(t)
	startController(t, env, nil)
	c := env.Client
	ctx := context.Background()
	for i := 1; i <= 5; i++ {
		createNode(t, c, fmt.Sprintf("n%d", i))
	}
	create(t, c, l3Network("small", "10.9.0.0/24", "", 26, 0))
	got := waitAllocated(t, c, "small", 4)
	if _, ok := got["n5"]; ok {
		t.Fatalf("n5 got a block; nodes are taken in name order so n5 is the one left out")
	}
	var nw lacev1.Network
	eventually(t, 30*time.Second, "SubnetExhausted condition", func() error {
		if err := c.Get(ctx, types.NamespacedName{Name: "small"}, &nw); err != nil {
			return err
		}
		cond := meta.FindStatusCondition(nw.Status.Conditions, controller.ConditionBlocksAllocated)
		if cond == nil || cond.Status != metav1.ConditionFalse || cond.Reason != controller.ReasonSubnetExhausted {
			return fmt.Errorf("condition %+v", cond)
		}
		if !strings.Contains(cond.Message, "n5") {
			return fmt.Errorf("message %q does not name n5", cond.Message)
		}
		return nil
	})
	if meta.IsStatusConditionTrue(nw.Status.Conditions, lacev1.ConditionReady) {
		t.Errorf("an exhausted network reports Ready")
	}
	if u := nw.Status.Blocks; len(u) != 1 || u[0].Allocated != 4 || u[0].Capacity != 4 {
		t.Errorf("block usage %+v, want 4 of 4", u)
	}
	eventually(t, 30*time.Second, "SubnetExhausted events naming n5", func() error {
		var evs corev1.EventList
		if err := c.List(ctx, &evs); err != nil {
			return err
		}
		onNet, onNode := false, false
		for _, e := range evs.Items {
			if e.Reason != controller.ReasonSubnetExhausted || e.Type != corev1.EventTypeWarning || !strings.Contains(e.Message, "n5") {
				continue
			}
			onNet = onNet || (e.InvolvedObject.Kind == "Network" && e.InvolvedObject.Name == "small")
			onNode = onNode || (e.InvolvedObject.Kind == "Node" && e.InvolvedObject.Name == "n5")
		}
		if !onNet || !onNode {
			return fmt.Errorf("event on network: %v, on node: %v", onNet, onNode)
		}
		return nil
	})

	// Freeing a block lets the starved node in.
	if err := c.Delete(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n1"}}); err != nil {
		t.Fatal(err)
	}
	eventually(t, 30*time.Second, "n5 allocated after n1 left", func() error {
		if _, ok := liveAllocations(t, c, "small")["n5"]; !ok {
			return fmt.Errorf("n5 still without a block")
		}
		return nil
	})
}

// TestFiftyNodesAtOnce creates 50 nodes concurrently while two controllers
// compete for leadership; no block may be given twice.
func TestFiftyNodesAtOnce(t *testing.T) {
	env := cptest.Start(t)
	leader := func(o *controller.Options) { o.LeaderElection = true }
	startController(t, env, leader)
	startController(t, env, leader)
	c := env.Client
	create(t, c, l3Network("wide", "10.64.0.0/16", "fd00:64::/56", 24, 64))
	create(t, c, l3Network("narrow", "10.65.0.0/16", "", 26, 0))
	var wg sync.WaitGroup
	errs := make(chan error, 50)
	for i := 0; i < 50; i++ {
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			n := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("node-%02d", i)}}
			errs <- c.Create(context.Background(), n)
		}(i)
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	wide := waitAllocated(t, c, "wide", 50)
	narrow := waitAllocated(t, c, "narrow", 50)
	assertDisjoint(t, map[string][]netip.Prefix{
		"wide":   {netip.MustParsePrefix("10.64.0.0/16"), netip.MustParsePrefix("fd00:64::/56")},
		"narrow": {netip.MustParsePrefix("10.65.0.0/16")},
	}, wide, narrow)
	// Nothing more than one allocation per node and network exists at all.
	var all lacev1.AllocationList
	if err := c.List(context.Background(), &all); err != nil {
		t.Fatal(err)
	}
	if len(all.Items) != 100 {
		t.Errorf("%d allocations exist, want exactly 100", len(all.Items))
	}
}

func TestBindingPolicyReportsMissingNetwork(t *testing.T) {
	env := cptest.Start(t)
	startController(t, env, nil)
	c := env.Client
	ctx := context.Background()
	create(t, c, &lacev1.NetworkBindingPolicy{ObjectMeta: metav1.ObjectMeta{Name: "typo"},
		Spec: lacev1.NetworkBindingPolicySpec{Network: "bakcend", Priority: 10}})
	check := func(want metav1.ConditionStatus, reason string) {
		eventually(t, 30*time.Second, "binding policy condition "+reason, func() error {
			var p lacev1.NetworkBindingPolicy
			if err := c.Get(ctx, types.NamespacedName{Name: "typo"}, &p); err != nil {
				return err
			}
			cond := meta.FindStatusCondition(p.Status.Conditions, lacev1.ConditionReady)
			if cond == nil || cond.Status != want || cond.Reason != reason {
				return fmt.Errorf("condition %+v", cond)
			}
			return nil
		})
	}
	check(metav1.ConditionFalse, controller.ReasonNetworkNotFound)
	create(t, c, l3Network("bakcend", "10.7.0.0/16", "", 24, 0))
	check(metav1.ConditionTrue, controller.ReasonNetworkFound)
}

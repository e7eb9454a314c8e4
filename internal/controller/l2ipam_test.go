package controller_test

import (
	"context"
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	ipamclaimsv1 "github.com/lace-cni/lace/api/ipamclaims/v1alpha1"
	lacev1 "github.com/lace-cni/lace/api/v1alpha1"
	"github.com/lace-cni/lace/internal/model/ipam"
	"github.com/lace-cni/lace/lab/controlplane/cptest"
)

func l2Network(name, v4, v6 string) *lacev1.Network {
	nw := &lacev1.Network{ObjectMeta: metav1.ObjectMeta{Name: name}, Spec: lacev1.NetworkSpec{Type: lacev1.NetworkTypeL2}}
	if v4 != "" {
		nw.Spec.IPv4Subnet = &lacev1.Subnet{Prefix: lacev1.CIDR(v4)}
	}
	if v6 != "" {
		nw.Spec.IPv6Subnet = &lacev1.Subnet{Prefix: lacev1.CIDR(v6)}
	}
	return nw
}

// createL2 creates l2 network nw and a policy binding every pod to it,
// as an operator would (the controller checks a pod's binding before
// giving its endpoint addresses).
func createL2(t *testing.T, c client.Client, nw *lacev1.Network) {
	t.Helper()
	create(t, c, nw)
	create(t, c, &lacev1.NetworkBindingPolicy{ObjectMeta: metav1.ObjectMeta{Name: "all-to-" + nw.Name},
		Spec: lacev1.NetworkBindingPolicySpec{Network: nw.Name, MatchKind: lacev1.MatchKindPod, Priority: 100}})
}

// l2Pod creates pod name on node and its NetworkEndpoint in network, as
// the agent will at CNI ADD (no addresses: the controller assigns them).
func l2Pod(t *testing.T, c client.Client, name, node, network string) *lacev1.NetworkEndpoint {
	t.Helper()
	return annotatedL2Pod(t, c, name, node, network, nil)
}

func startL2(t *testing.T) (*cptest.Env, client.Client) {
	t.Helper()
	env := cptest.Start(t)
	create(t, env.Client, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "default"}})
	return env, env.Client
}

// assigned waits until every NetworkEndpoint named has its addresses (want
// per endpoint) and MAC in status, and returns them by name.
func assigned(t *testing.T, c client.Client, names []string, want int) map[string]lacev1.NetworkEndpointStatus {
	t.Helper()
	out := map[string]lacev1.NetworkEndpointStatus{}
	eventually(t, 90*time.Second, fmt.Sprintf("%d endpoints assigned", len(names)), func() error {
		var list lacev1.NetworkEndpointList
		if err := c.List(context.Background(), &list, client.InNamespace("default")); err != nil {
			return err
		}
		byName := map[string]lacev1.NetworkEndpoint{}
		for _, ne := range list.Items {
			byName[ne.Name] = ne
		}
		missing := 0
		for _, n := range names {
			ne, ok := byName[n]
			if !ok || len(ne.Status.Addresses) != want || ne.Status.MAC == "" ||
				!meta.IsStatusConditionTrue(ne.Status.Conditions, lacev1.ConditionAddressesAllocated) {
				missing++
				continue
			}
			out[n] = ne.Status
		}
		if missing > 0 {
			return fmt.Errorf("%d of %d endpoints without their addresses", missing, len(names))
		}
		return nil
	})
	return out
}

// checkUnique fails for any address or MAC given twice, and for an
// address an l2 network never gives (network, gateway, broadcast).
func checkUnique(t *testing.T, got map[string]lacev1.NetworkEndpointStatus, prefixes ...netip.Prefix) {
	t.Helper()
	seen := map[string]string{}
	for name, st := range got {
		for _, a := range st.Addresses {
			addr := netip.MustParseAddr(string(a))
			ok := false
			for _, p := range prefixes {
				ok = ok || ipam.L2Assignable(p, addr)
			}
			if !ok {
				t.Errorf("%s was given %s: not assignable in %v", name, a, prefixes)
			}
			if prev, dup := seen[string(a)]; dup {
				t.Errorf("DUPLICATE: %s given to %s and %s", a, prev, name)
			}
			seen[string(a)] = name
		}
		if prev, dup := seen[string(st.MAC)]; dup {
			t.Errorf("DUPLICATE: MAC %s given to %s and %s", st.MAC, prev, name)
		}
		seen[string(st.MAC)] = name
	}
}

func countClaims(t *testing.T, c client.Client, network string) (int, int) {
	t.Helper()
	var nbrs lacev1.NeighborList
	var fdbs lacev1.FDBEntryList
	if err := c.List(context.Background(), &nbrs, client.MatchingLabels{lacev1.LabelNetwork: network}); err != nil {
		t.Fatal(err)
	}
	if err := c.List(context.Background(), &fdbs, client.MatchingLabels{lacev1.LabelNetwork: network}); err != nil {
		t.Fatal(err)
	}
	return len(nbrs.Items), len(fdbs.Items)
}

// TestL2IPAM200Concurrent: 200 endpoints of a dual-stack l2 network,
// created at once on three nodes, each get an IPv4 and an IPv6 address and
// a MAC, none twice, none the network's, gateway's or broadcast address;
// each address is a Neighbor and each MAC an FDBEntry at the endpoint's
// node, published by the controller; deleting the endpoints leaves none.
func TestL2IPAM200Concurrent(t *testing.T) {
	env, c := startL2(t)
	startController(t, env, nil)
	createL2(t, c, l2Network("storage", "10.50.0.0/24", "fd00:50::/64"))
	const n = 200
	names := make([]string, n)
	var wg sync.WaitGroup
	sem := make(chan struct{}, 16)
	for i := range n {
		names[i] = fmt.Sprintf("vm-%03d", i)
		wg.Add(1)
		go func() {
			defer wg.Done()
			sem <- struct{}{}
			defer func() { <-sem }()
			l2Pod(t, c, names[i], fmt.Sprintf("n%d", i%3+1), "storage")
		}()
	}
	wg.Wait()
	got := assigned(t, c, names, 2)
	checkUnique(t, got, netip.MustParsePrefix("10.50.0.0/24"), netip.MustParsePrefix("fd00:50::/64"))
	for name, st := range got {
		v4 := netip.MustParseAddr(string(st.Addresses[0]))
		if want := ipam.L2MAC(v4, 0).String(); string(st.MAC) != want {
			t.Errorf("%s: MAC %s, want %s (0a:58 and its IPv4 address)", name, st.MAC, want)
		}
	}
	ctx := context.Background()
	var fdb lacev1.FDBEntry
	mac := got["vm-004"].MAC
	if err := c.Get(ctx, client.ObjectKey{Name: "storage." + strings.ReplaceAll(string(mac), ":", "")}, &fdb); err != nil {
		t.Fatalf("the FDBEntry of vm-004's MAC: %v", err)
	}
	if fdb.Spec.Node != "n2" || fdb.Spec.Publisher != lacev1.PublisherController || fdb.Spec.Learned {
		t.Errorf("FDBEntry of vm-004: %+v, want node n2 published by the controller", fdb.Spec)
	}
	if nb, fd := countClaims(t, c, "storage"); nb != 2*n || fd != n {
		t.Errorf("%d Neighbors and %d FDBEntries, want %d and %d", nb, fd, 2*n, n)
	}

	for _, name := range names {
		if err := c.Delete(ctx, &lacev1.NetworkEndpoint{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: name}}); err != nil {
			t.Fatal(err)
		}
	}
	eventually(t, 60*time.Second, "every claim released", func() error {
		if nb, fd := countClaims(t, c, "storage"); nb+fd != 0 {
			return fmt.Errorf("%d Neighbors and %d FDBEntries left", nb, fd)
		}
		return nil
	})
}

// TestL2IPAMExhaustion: a /29 has five assignable addresses; the sixth
// endpoint gets none, says so in condition AddressesAllocated (reason
// SubnetExhausted, naming the network and prefix) with a Warning Event,
// and gets the address freed when another endpoint goes.
func TestL2IPAMExhaustion(t *testing.T) {
	env, c := startL2(t)
	startController(t, env, nil)
	createL2(t, c, l2Network("small", "10.51.0.0/29", ""))
	var names []string
	for i := range 5 {
		names = append(names, fmt.Sprintf("vm-%d", i))
		l2Pod(t, c, names[i], "n1", "small")
	}
	got := assigned(t, c, names, 1)
	checkUnique(t, got, netip.MustParsePrefix("10.51.0.0/29"))
	l2Pod(t, c, "vm-late", "n1", "small")
	ctx := context.Background()
	eventually(t, 30*time.Second, "vm-late refused for exhaustion", func() error {
		var ne lacev1.NetworkEndpoint
		if err := c.Get(ctx, client.ObjectKey{Namespace: "default", Name: "vm-late"}, &ne); err != nil {
			return err
		}
		cond := meta.FindStatusCondition(ne.Status.Conditions, lacev1.ConditionAddressesAllocated)
		if cond == nil || cond.Status != metav1.ConditionFalse || cond.Reason != "SubnetExhausted" ||
			!strings.Contains(cond.Message, "network small") || !strings.Contains(cond.Message, "10.51.0.0/29") {
			return fmt.Errorf("condition %+v", cond)
		}
		if len(ne.Status.Addresses) != 0 {
			return fmt.Errorf("an exhausted endpoint holds %v", ne.Status.Addresses)
		}
		return nil
	})
	eventually(t, 30*time.Second, "a SubnetExhausted Warning on vm-late", func() error {
		var evs corev1.EventList
		if err := c.List(ctx, &evs, client.InNamespace("default")); err != nil {
			return err
		}
		for _, e := range evs.Items {
			if e.InvolvedObject.Name == "vm-late" && e.Reason == "SubnetExhausted" && e.Type == corev1.EventTypeWarning {
				return nil
			}
		}
		return fmt.Errorf("no Event among %d", len(evs.Items))
	})
	freed := got["vm-2"].Addresses[0]
	if err := c.Delete(ctx, &lacev1.NetworkEndpoint{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "vm-2"}}); err != nil {
		t.Fatal(err)
	}
	late := assigned(t, c, []string{"vm-late"}, 1)
	if a := late["vm-late"].Addresses[0]; a != freed {
		t.Errorf("vm-late got %s, want the freed %s", a, freed)
	}
}

// TestL2IPAMControllerRestart: what one controller assigned, the next
// keeps, and it never gives those addresses again; an endpoint deleted
// while no controller ran has its claims swept when one starts, and a new
// endpoint of the same name (another pod) gets claims of its own.
func TestL2IPAMControllerRestart(t *testing.T) {
	env, c := startL2(t)
	stop := startController(t, env, nil)
	createL2(t, c, l2Network("vms", "10.52.0.0/24", "fd00:52::/120"))
	first := []string{"a", "b", "c"}
	for _, n := range first {
		l2Pod(t, c, n, "n1", "vms")
	}
	before := assigned(t, c, first, 2)
	stop()
	ctx := context.Background()
	// Gone while no controller runs.
	var gone lacev1.NetworkEndpoint
	if err := c.Get(ctx, client.ObjectKey{Namespace: "default", Name: "b"}, &gone); err != nil {
		t.Fatal(err)
	}
	if err := c.Delete(ctx, &gone); err != nil {
		t.Fatal(err)
	}
	startController(t, env, nil)
	eventually(t, 30*time.Second, "b's claims swept", func() error {
		var nbrs lacev1.NeighborList
		if err := c.List(ctx, &nbrs, client.MatchingLabels{lacev1.LabelEndpointUID: string(gone.UID)}); err != nil {
			return err
		}
		if len(nbrs.Items) != 0 {
			return fmt.Errorf("%d Neighbors of the deleted endpoint left", len(nbrs.Items))
		}
		return nil
	})
	more := []string{"d", "e", "f"}
	for _, n := range more {
		l2Pod(t, c, n, "n2", "vms")
	}
	after := assigned(t, c, append(append([]string(nil), first[0], first[2]), more...), 2)
	for _, n := range []string{"a", "c"} {
		if fmt.Sprint(after[n].Addresses, after[n].MAC) != fmt.Sprint(before[n].Addresses, before[n].MAC) {
			t.Errorf("%s changed across the restart: %v -> %v", n, before[n], after[n])
		}
	}
	checkUnique(t, after, netip.MustParsePrefix("10.52.0.0/24"), netip.MustParsePrefix("fd00:52::/120"))
	if nb, fd := countClaims(t, c, "vms"); nb != 10 || fd != 5 {
		t.Errorf("%d Neighbors and %d FDBEntries, want 10 and 5", nb, fd)
	}
}

// annotatedL2Pod is l2Pod with the pod's annotations (safe from several
// goroutines: a failure is reported, not fatal).
func annotatedL2Pod(t *testing.T, c client.Client, name, node, network string, ann map[string]string) *lacev1.NetworkEndpoint {
	t.Helper()
	ctx := context.Background()
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: name, Annotations: ann},
		Spec: corev1.PodSpec{NodeName: node, Containers: []corev1.Container{{Name: "c", Image: "x"}}}}
	if err := c.Create(ctx, pod); err != nil {
		t.Errorf("create pod %s: %v", name, err)
		return nil
	}
	ne := &lacev1.NetworkEndpoint{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: name,
		Labels: map[string]string{lacev1.LabelNode: node, lacev1.LabelPodUID: string(pod.UID), lacev1.LabelNetwork: network}},
		Spec: lacev1.NetworkEndpointSpec{Network: network, Node: node, Interface: "eth0"}}
	if err := c.Create(ctx, ne); err != nil {
		t.Errorf("create NetworkEndpoint %s: %v", name, err)
		return nil
	}
	return ne
}

// refused waits until endpoint name is refused with reason, its message
// containing each of words.
func refused(t *testing.T, c client.Client, name, reason string, words ...string) {
	t.Helper()
	eventually(t, 30*time.Second, name+" refused with "+reason, func() error {
		var ne lacev1.NetworkEndpoint
		if err := c.Get(context.Background(), client.ObjectKey{Namespace: "default", Name: name}, &ne); err != nil {
			return err
		}
		cond := meta.FindStatusCondition(ne.Status.Conditions, lacev1.ConditionAddressesAllocated)
		if cond == nil || cond.Status != metav1.ConditionFalse || cond.Reason != reason {
			return fmt.Errorf("condition %+v", cond)
		}
		for _, w := range words {
			if !strings.Contains(cond.Message, w) {
				return fmt.Errorf("message %q lacks %q", cond.Message, w)
			}
		}
		if len(ne.Status.Addresses) != 0 {
			return fmt.Errorf("a refused endpoint holds %v", ne.Status.Addresses)
		}
		return nil
	})
}

func deletePodAndEndpoint(t *testing.T, c client.Client, name string) {
	t.Helper()
	ctx := context.Background()
	for _, o := range []client.Object{
		&lacev1.NetworkEndpoint{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: name}},
		&corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: name}},
	} {
		if err := c.Delete(ctx, o, client.GracePeriodSeconds(0)); err != nil {
			t.Fatalf("delete %T %s: %v", o, name, err)
		}
	}
	eventually(t, 30*time.Second, "pod "+name+" gone", func() error {
		err := c.Get(ctx, client.ObjectKey{Namespace: "default", Name: name}, &corev1.Pod{})
		if err == nil {
			return fmt.Errorf("still there")
		}
		return client.IgnoreNotFound(err)
	})
}

// TestL2ClaimOutlivesPod: a pod naming an IPAMClaim (KubeVirt's, one per
// VM interface) gets addresses kept for the claim, recorded in its status
// with the pod as owner; they outlive the pod (nobody else gets them), the
// VM's next pod on another node gets the same addresses and MAC, whose
// FDBEntry moves there with its sequence one higher; deleting the claim
// releases them. A claim of another network is refused.
func TestL2ClaimOutlivesPod(t *testing.T) {
	env, c := startL2(t)
	startController(t, env, nil)
	createL2(t, c, l2Network("vms", "10.53.0.0/24", "fd00:53::/64"))
	ctx := context.Background()
	claim := &ipamclaimsv1.IPAMClaim{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "vm-a.vms"},
		Spec: ipamclaimsv1.IPAMClaimSpec{Network: "vms", Interface: "eth0"}}
	create(t, c, claim)
	annotatedL2Pod(t, c, "virt-launcher-a-1", "n1", "vms", map[string]string{lacev1.AnnotationOVNPrimaryUDNIPAMClaim: "vm-a.vms"})
	first := assigned(t, c, []string{"virt-launcher-a-1"}, 2)["virt-launcher-a-1"]
	eventually(t, 20*time.Second, "the claim records its addresses and owner", func() error {
		var got ipamclaimsv1.IPAMClaim
		if err := c.Get(ctx, client.ObjectKeyFromObject(claim), &got); err != nil {
			return err
		}
		want := []string{string(first.Addresses[0]) + "/24", string(first.Addresses[1]) + "/64"}
		if fmt.Sprint(got.Status.IPs) != fmt.Sprint(want) || got.Status.OwnerPod == nil || got.Status.OwnerPod.Name != "virt-launcher-a-1" {
			return fmt.Errorf("claim status %+v, want IPs %v owned by virt-launcher-a-1", got.Status, want)
		}
		return nil
	})
	fdbName := "vms." + strings.ReplaceAll(string(first.MAC), ":", "")

	deletePodAndEndpoint(t, c, "virt-launcher-a-1")
	// Another pod meanwhile: not the claim's addresses.
	l2Pod(t, c, "other", "n1", "vms")
	other := assigned(t, c, []string{"other"}, 2)["other"]
	for _, a := range other.Addresses {
		if slices.Contains(first.Addresses, a) {
			t.Errorf("another pod got %s, which the claim keeps", a)
		}
	}
	annotatedL2Pod(t, c, "virt-launcher-a-2", "n2", "vms", map[string]string{lacev1.AnnotationIPAMClaim: "vm-a.vms"})
	second := assigned(t, c, []string{"virt-launcher-a-2"}, 2)["virt-launcher-a-2"]
	if fmt.Sprint(second.Addresses) != fmt.Sprint(first.Addresses) || second.MAC != first.MAC {
		t.Errorf("the VM's next pod got %v / %s, want its claim's %v / %s", second.Addresses, second.MAC, first.Addresses, first.MAC)
	}
	eventually(t, 20*time.Second, "the MAC moved to n2", func() error {
		var f lacev1.FDBEntry
		if err := c.Get(ctx, client.ObjectKey{Name: fdbName}, &f); err != nil {
			return err
		}
		if f.Spec.Node != "n2" || f.Spec.Sequence != 1 {
			return fmt.Errorf("FDBEntry %+v, want node n2 sequence 1", f.Spec)
		}
		return nil
	})

	// The claim goes while the VM's pod still uses its addresses: they
	// are handed to that pod's endpoint (freeing them would give them to
	// a second pod), and go with it.
	var a2 lacev1.NetworkEndpoint
	if err := c.Get(ctx, client.ObjectKey{Namespace: "default", Name: "virt-launcher-a-2"}, &a2); err != nil {
		t.Fatal(err)
	}
	if err := c.Delete(ctx, claim); err != nil {
		t.Fatal(err)
	}
	eventually(t, 30*time.Second, "the claim's Neighbors and FDBEntry handed to the pod using them", func() error {
		var nbrs lacev1.NeighborList
		if err := c.List(ctx, &nbrs, client.MatchingLabels{lacev1.LabelEndpointUID: string(a2.UID)}); err != nil {
			return err
		}
		var f lacev1.FDBEntry
		if err := c.Get(ctx, client.ObjectKey{Name: fdbName}, &f); err != nil {
			return err
		}
		if len(nbrs.Items) != 2 || f.Labels[lacev1.LabelEndpointUID] != string(a2.UID) || f.Labels[lacev1.LabelIPAMClaimUID] != "" {
			return fmt.Errorf("%d Neighbors of the endpoint, FDBEntry labels %v", len(nbrs.Items), f.Labels)
		}
		return nil
	})
	if kept := assigned(t, c, []string{"virt-launcher-a-2"}, 2)["virt-launcher-a-2"]; fmt.Sprint(kept.Addresses) != fmt.Sprint(first.Addresses) {
		t.Errorf("the running pod's addresses became %v after its claim went", kept.Addresses)
	}
	deletePodAndEndpoint(t, c, "virt-launcher-a-2")
	eventually(t, 30*time.Second, "released with the pod", func() error {
		if nb, fd := countClaims(t, c, "vms"); nb != 2 || fd != 1 { // "other"'s
			return fmt.Errorf("%d Neighbors and %d FDBEntries, want only other's 2 and 1", nb, fd)
		}
		return nil
	})

	wrong := &ipamclaimsv1.IPAMClaim{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "vm-b.other"},
		Spec: ipamclaimsv1.IPAMClaimSpec{Network: "elsewhere", Interface: "eth0"}}
	create(t, c, wrong)
	annotatedL2Pod(t, c, "virt-launcher-b-1", "n1", "vms", map[string]string{lacev1.AnnotationIPAMClaim: "vm-b.other"})
	refused(t, c, "virt-launcher-b-1", "IPAMClaimNetworkMismatch", "elsewhere")
	annotatedL2Pod(t, c, "virt-launcher-c-1", "n1", "vms", map[string]string{lacev1.AnnotationIPAMClaim: "missing"})
	refused(t, c, "virt-launcher-c-1", "IPAMClaimNotFound", "missing")
}

// TestL2FixedAddressRequest: a pod may ask for fixed addresses and a MAC;
// one already held is refused with AddressTaken naming the holder (and a
// Warning Event), one the network never gives (its gateway) with
// InvalidAddressRequest.
func TestL2FixedAddressRequest(t *testing.T) {
	env, c := startL2(t)
	startController(t, env, nil)
	createL2(t, c, l2Network("fixed", "10.54.0.0/24", "fd00:54::/64"))
	annotatedL2Pod(t, c, "a", "n1", "fixed", map[string]string{
		lacev1.AnnotationIPAddresses: "10.54.0.9, fd00:54::9", lacev1.AnnotationMACAddress: "02:00:00:00:00:42"})
	got := assigned(t, c, []string{"a"}, 2)["a"]
	if fmt.Sprint(got.Addresses) != "[10.54.0.9 fd00:54::9]" || got.MAC != "02:00:00:00:00:42" {
		t.Errorf("a got %v / %s, want what it asked for", got.Addresses, got.MAC)
	}
	annotatedL2Pod(t, c, "b", "n2", "fixed", map[string]string{lacev1.AnnotationIPAddresses: "10.54.0.9"})
	refused(t, c, "b", "AddressTaken", "10.54.0.9", "endpoint default/a")
	annotatedL2Pod(t, c, "c", "n2", "fixed", map[string]string{lacev1.AnnotationIPAddresses: "10.54.0.1"})
	refused(t, c, "c", "InvalidAddressRequest", "10.54.0.1")
	annotatedL2Pod(t, c, "d", "n2", "fixed", map[string]string{lacev1.AnnotationMACAddress: "02:00:00:00:00:42"})
	refused(t, c, "d", "AddressTaken", "MAC 02:00:00:00:00:42", "endpoint default/a")
	// Once a goes, b gets the address it asked for.
	deletePodAndEndpoint(t, c, "a")
	if b := assigned(t, c, []string{"b"}, 2)["b"]; b.Addresses[0] != "10.54.0.9" {
		t.Errorf("b got %v after a went, want 10.54.0.9", b.Addresses)
	}
}

// TestL2EndpointOfUnboundPodRefused: a node's agent writes the endpoints
// of its pods, and one that names an l2 network the pod is not bound to
// (a compromised or confused agent putting a pod in another tenant's
// network) gets nothing: NotBoundToNetwork, naming the policy that binds
// the pod elsewhere.
func TestL2EndpointOfUnboundPodRefused(t *testing.T) {
	env, c := startL2(t)
	startController(t, env, nil)
	createL2(t, c, l2Network("private", "10.55.0.0/24", ""))
	create(t, c, &lacev1.NetworkBindingPolicy{ObjectMeta: metav1.ObjectMeta{Name: "web-elsewhere"},
		Spec: lacev1.NetworkBindingPolicySpec{Network: "web", MatchKind: lacev1.MatchKindPod, Priority: 10,
			Selector: &metav1.LabelSelector{MatchLabels: map[string]string{"app": "web"}}}})
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "web-0", Labels: map[string]string{"app": "web"}},
		Spec: corev1.PodSpec{NodeName: "n1", Containers: []corev1.Container{{Name: "c", Image: "x"}}}}
	create(t, c, pod)
	create(t, c, &lacev1.NetworkEndpoint{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "web-0",
		Labels: map[string]string{lacev1.LabelNode: "n1", lacev1.LabelPodUID: string(pod.UID)}},
		Spec: lacev1.NetworkEndpointSpec{Network: "private", Node: "n1", Interface: "eth0"}})
	refused(t, c, "web-0", "NotBoundToNetwork", "web-elsewhere", "private")
	if nb, fd := countClaims(t, c, "private"); nb+fd != 0 {
		t.Errorf("the unbound pod's endpoint holds %d Neighbors and %d FDBEntries", nb, fd)
	}
}

// TestL2IPAMUniqueOnNode: two l2 networks with the same subnet give their
// pods on one node different addresses (the node reaches each pod by its
// address alone), and the same address on different nodes.
func TestL2IPAMUniqueOnNode(t *testing.T) {
	env, c := startL2(t)
	startController(t, env, nil)
	for _, n := range []string{"left", "right"} {
		create(t, c, l2Network(n, "10.52.0.0/24", "fd00:52::/64"))
		create(t, c, &lacev1.NetworkBindingPolicy{ObjectMeta: metav1.ObjectMeta{Name: "net-" + n},
			Spec: lacev1.NetworkBindingPolicySpec{Network: n, MatchKind: lacev1.MatchKindPod, Priority: 100,
				Selector: &metav1.LabelSelector{MatchLabels: map[string]string{"net": n}}}})
	}
	pod := func(name, node, network string) {
		create(t, c, &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: name, Labels: map[string]string{"net": network}},
			Spec: corev1.PodSpec{NodeName: node, Containers: []corev1.Container{{Name: "c", Image: "x"}}}})
		var p corev1.Pod
		if err := c.Get(context.Background(), client.ObjectKey{Namespace: "default", Name: name}, &p); err != nil {
			t.Fatal(err)
		}
		create(t, c, &lacev1.NetworkEndpoint{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: name,
			Labels: map[string]string{lacev1.LabelNode: node, lacev1.LabelPodUID: string(p.UID), lacev1.LabelNetwork: network}},
			Spec: lacev1.NetworkEndpointSpec{Network: network, Node: node, Interface: "eth0"}})
	}
	pod("left-1", "n1", "left")
	first := assigned(t, c, []string{"left-1"}, 2)
	pod("right-1", "n1", "right")
	pod("right-2", "n2", "right")
	got := assigned(t, c, []string{"right-1", "right-2"}, 2)
	for i, a := range got["right-1"].Addresses {
		if a == first["left-1"].Addresses[i] {
			t.Errorf("right-1 got %s, which left-1 of the other network holds on the same node", a)
		}
	}
	if fmt.Sprint(got["right-2"].Addresses) != fmt.Sprint(first["left-1"].Addresses) {
		t.Errorf("right-2 on another node got %v, want the lowest addresses %v", got["right-2"].Addresses, first["left-1"].Addresses)
	}
}

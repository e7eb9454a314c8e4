package controller_test

import (
	"context"
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	ipamclaimsv1 "github.com/lace-cni/lace/api/ipamclaims/v1alpha1"
	lacev1 "github.com/lace-cni/lace/api/v1alpha1"
	"github.com/lace-cni/lace/internal/model/ipam"
)

func reviewGetNE(t *testing.T, c client.Client, name string) lacev1.NetworkEndpoint {
	t.Helper()
	var ne lacev1.NetworkEndpoint
	if err := c.Get(context.Background(), client.ObjectKey{Namespace: "default", Name: name}, &ne); err != nil {
		t.Fatal(err)
	}
	return ne
}

func reviewAnnotate(t *testing.T, c client.Client, pod string, ann map[string]string) {
	t.Helper()
	var p corev1.Pod
	if err := c.Get(context.Background(), client.ObjectKey{Namespace: "default", Name: pod}, &p); err != nil {
		t.Fatal(err)
	}
	before := p.DeepCopy()
	for k, v := range ann {
		p.Annotations[k] = v
	}
	if err := c.Patch(context.Background(), &p, client.MergeFrom(before)); err != nil {
		t.Fatal(err)
	}
}

// A claim deleted and re-created under the same name (KubeVirt VM
// re-created, or a tenant) while its pod still runs: the IPAMClaim
// reconciler sees only the new UID and releases the in-use objects with
// no hand-over; another pod then gets the running pod's address.
func TestL2ReviewClaimRecreatedWhilePodRuns(t *testing.T) {
	env, c := startL2(t)
	stop := startController(t, env, nil)
	createL2(t, c, l2Network("rc", "10.61.0.0/24", ""))
	ctx := context.Background()
	claim := &ipamclaimsv1.IPAMClaim{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "vm"},
		Spec: ipamclaimsv1.IPAMClaimSpec{Network: "rc", Interface: "eth0"}}
	create(t, c, claim)
	annotatedL2Pod(t, c, "vm-pod", "n1", "rc", map[string]string{lacev1.AnnotationIPAMClaim: "vm"})
	first := assigned(t, c, []string{"vm-pod"}, 1)["vm-pod"]
	stop()
	if err := c.Delete(ctx, claim); err != nil {
		t.Fatal(err)
	}
	create(t, c, &ipamclaimsv1.IPAMClaim{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "vm"},
		Spec: ipamclaimsv1.IPAMClaimSpec{Network: "rc", Interface: "eth0"}})
	startController(t, env, nil)
	time.Sleep(3 * time.Second)
	l2Pod(t, c, "victim", "n2", "rc")
	got := assigned(t, c, []string{"vm-pod", "victim"}, 1)
	if slices.Contains(got["victim"].Addresses, first.Addresses[0]) {
		t.Errorf("DUPLICATE: victim got %s, which running vm-pod was given (and uses)", first.Addresses[0])
	}
	if fmt.Sprint(got["vm-pod"].Addresses) != fmt.Sprint(first.Addresses) {
		t.Errorf("running vm-pod's status changed %v -> %v", first.Addresses, got["vm-pod"].Addresses)
	}
}

// handOver patches the objects, then release() lists them from the cache,
// which may still show the claim annotation: the Delete (UID precondition
// only) removes what was just handed over.
func TestL2ReviewHandOverStaleCache(t *testing.T) {
	env, c := startL2(t)
	startController(t, env, nil)
	createL2(t, c, l2Network("ho", "10.62.0.0/24", "fd00:62::/64"))
	ctx := context.Background()
	const n = 20
	var names []string
	for i := 0; i < n; i++ {
		cn := fmt.Sprintf("vm%d", i)
		create(t, c, &ipamclaimsv1.IPAMClaim{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: cn},
			Spec: ipamclaimsv1.IPAMClaimSpec{Network: "ho", Interface: "eth0"}})
		annotatedL2Pod(t, c, "p"+cn, "n1", "ho", map[string]string{lacev1.AnnotationIPAMClaim: cn})
		names = append(names, "p"+cn)
	}
	before := assigned(t, c, names, 2)
	for i := 0; i < n; i++ {
		if err := c.Delete(ctx, &ipamclaimsv1.IPAMClaim{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: fmt.Sprintf("vm%d", i)}}); err != nil {
			t.Fatal(err)
		}
	}
	time.Sleep(10 * time.Second)
	if nb, fd := countClaims(t, c, "ho"); nb != 2*n || fd != n {
		t.Errorf("after the claims went, %d Neighbors and %d FDBEntries left, want %d and %d", nb, fd, 2*n, n)
	}
	for _, nm := range names {
		if st := reviewGetNE(t, c, nm).Status; fmt.Sprint(st.Addresses, st.MAC) != fmt.Sprint(before[nm].Addresses, before[nm].MAC) {
			t.Errorf("running %s: status %v %s -> %v %s", nm, before[nm].Addresses, before[nm].MAC, st.Addresses, st.MAC)
		}
	}
}

// A running pod's status was wiped by a later refusal (its claim
// annotation then named a missing claim); the claim's deletion then found
// no endpoint "using" the addresses and freed them: the next pod got the
// address the first pod still uses. Now an endpoint that has addresses
// keeps them whatever its pod's annotations become.
func TestL2ReviewStatusWipedThenFreed(t *testing.T) {
	env, c := startL2(t)
	stop := startController(t, env, nil)
	createL2(t, c, l2Network("sw", "10.63.0.0/24", ""))
	ctx := context.Background()
	claim := &ipamclaimsv1.IPAMClaim{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "vm"},
		Spec: ipamclaimsv1.IPAMClaimSpec{Network: "sw", Interface: "eth0"}}
	create(t, c, claim)
	annotatedL2Pod(t, c, "vm-pod", "n1", "sw", map[string]string{lacev1.AnnotationIPAMClaim: "vm"})
	first := assigned(t, c, []string{"vm-pod"}, 1)["vm-pod"]
	reviewAnnotate(t, c, "vm-pod", map[string]string{lacev1.AnnotationIPAMClaim: "nope"})
	stop()
	startController(t, env, nil) // any resync/restart re-reconciles
	stays(t, c, "vm-pod", first)
	if err := c.Delete(ctx, claim); err != nil {
		t.Fatal(err)
	}
	time.Sleep(3 * time.Second)
	l2Pod(t, c, "victim", "n2", "sw")
	v := assigned(t, c, []string{"victim"}, 1)["victim"]
	if slices.Contains(v.Addresses, first.Addresses[0]) {
		t.Errorf("DUPLICATE: victim got %s, which running vm-pod was given", first.Addresses[0])
	}
}

// Changing a running pod's MAC annotation: every re-reconcile claimed a
// new FDBEntry for the endpoint and kept the old one (unbounded objects);
// the Neighbor and the status disagreed on the MAC. Now the running pod
// keeps the MAC it has.
func TestL2ReviewMACAnnotationLeak(t *testing.T) {
	env, c := startL2(t)
	stop := startController(t, env, nil)
	createL2(t, c, l2Network("ml", "10.64.0.0/24", ""))
	annotatedL2Pod(t, c, "a", "n1", "ml", map[string]string{lacev1.AnnotationMACAddress: "02:00:00:00:01:00"})
	first := assigned(t, c, []string{"a"}, 1)["a"]
	for i := 1; i <= 3; i++ {
		reviewAnnotate(t, c, "a", map[string]string{lacev1.AnnotationMACAddress: fmt.Sprintf("02:00:00:00:01:%02x", i)})
		stop()
		stop = startController(t, env, nil)
		stays(t, c, "a", first)
	}
	if _, fd := countClaims(t, c, "ml"); fd != 1 {
		t.Errorf("one endpoint holds %d FDBEntries", fd)
	}
	var nbrs lacev1.NeighborList
	if err := c.List(context.Background(), &nbrs, client.MatchingLabels{lacev1.LabelNetwork: "ml"}); err != nil {
		t.Fatal(err)
	}
	if st := reviewGetNE(t, c, "a").Status.MAC; len(nbrs.Items) == 1 && nbrs.Items[0].Spec.MAC != st {
		t.Errorf("Neighbor says MAC %s, status %s", nbrs.Items[0].Spec.MAC, st)
	}
}

// 64 pods asking for the 64 salted MACs of the next free address blocked
// every later allocation in the network (freeMAC errored; no condition).
// Now MACs of the range the IPAM derives are refused to a pod's request
// (and an address whose MACs are all held is skipped).
func TestL2ReviewMACSquatBlocksNetwork(t *testing.T) {
	env, c := startL2(t)
	startController(t, env, nil)
	createL2(t, c, l2Network("sq", "10.65.0.0/24", ""))
	target := netip.MustParseAddr("10.65.0.66") // .2-.65 go to the squatters
	for s := uint32(0); s < 64; s++ {
		n := fmt.Sprintf("sq%d", s)
		annotatedL2Pod(t, c, n, "n1", "sq", map[string]string{lacev1.AnnotationMACAddress: ipam.L2MAC(target, s).String()})
	}
	refused(t, c, "sq63", "InvalidAddressRequest", "0a:58")
	l2Pod(t, c, "victim", "n2", "sq")
	start := time.Now()
	for time.Since(start) < 20*time.Second {
		ne := reviewGetNE(t, c, "victim")
		if len(ne.Status.Addresses) == 1 {
			return
		}
		time.Sleep(200 * time.Millisecond)
	}
	ne := reviewGetNE(t, c, "victim")
	t.Errorf("victim never assigned (status %+v): the whole network is blocked", ne.Status)
}

// A compromised agent (node n3) writes a NetworkEndpoint under the name
// of a VM pod scheduled to n2 before n2's agent does: the l2 reconciler
// does not check the pod's node and moves the claim's MAC to n3.
func TestL2ReviewForeignNEPMovesClaimMAC(t *testing.T) {
	env, c := startL2(t)
	startController(t, env, nil)
	createL2(t, c, l2Network("fm", "10.66.0.0/24", ""))
	ctx := context.Background()
	create(t, c, &ipamclaimsv1.IPAMClaim{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "vm"},
		Spec: ipamclaimsv1.IPAMClaimSpec{Network: "fm", Interface: "eth0"}})
	annotatedL2Pod(t, c, "vm-1", "n1", "fm", map[string]string{lacev1.AnnotationIPAMClaim: "vm"})
	first := assigned(t, c, []string{"vm-1"}, 1)["vm-1"]
	deletePodAndEndpoint(t, c, "vm-1")
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "vm-2", Annotations: map[string]string{lacev1.AnnotationIPAMClaim: "vm"}},
		Spec: corev1.PodSpec{NodeName: "n2", Containers: []corev1.Container{{Name: "c", Image: "x"}}}}
	create(t, c, pod)
	// The attacker's record: right name, its own node, no pod-uid label.
	create(t, c, &lacev1.NetworkEndpoint{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "vm-2",
		Labels: map[string]string{lacev1.LabelNode: "n3"}},
		Spec: lacev1.NetworkEndpointSpec{Network: "fm", Node: "n3", Interface: "eth0"}})
	fdb := "fm." + strings.ReplaceAll(string(first.MAC), ":", "")
	start := time.Now()
	for time.Since(start) < 8*time.Second {
		var f lacev1.FDBEntry
		if err := c.Get(ctx, client.ObjectKey{Name: fdb}, &f); err == nil && f.Spec.Node == "n3" {
			time.Sleep(3 * time.Second)
			_ = c.Get(ctx, client.ObjectKey{Name: fdb}, &f)
			err := c.Get(ctx, client.ObjectKey{Namespace: "default", Name: "vm-2"}, &lacev1.NetworkEndpoint{})
			t.Fatalf("the VM's MAC moved to the attacker's node n3; 3s later FDBEntry on %q seq %d (forged endpoint get: %v)", f.Spec.Node, f.Spec.Sequence, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// stays checks, over a few seconds after a controller restart (a
// reconcile of every endpoint), that endpoint name keeps the addresses
// and MAC it had and stays allocated: something that must not happen,
// watched for a bounded time.
func stays(t *testing.T, c client.Client, name string, had lacev1.NetworkEndpointStatus) {
	t.Helper()
	deadline := time.Now().Add(4 * time.Second)
	for time.Now().Before(deadline) {
		st := reviewGetNE(t, c, name).Status
		if fmt.Sprint(st.Addresses, st.MAC) != fmt.Sprint(had.Addresses, had.MAC) ||
			!meta.IsStatusConditionTrue(st.Conditions, lacev1.ConditionAddressesAllocated) {
			t.Fatalf("%s's status became %v / %s (%+v), it had %v / %s", name, st.Addresses, st.MAC, st.Conditions, had.Addresses, had.MAC)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

package controller_test

import (
	"context"
	"fmt"
	"net"
	"net/netip"
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

// setLearned writes an endpoint's learned bindings, as its agent does.
func setLearned(t *testing.T, c client.Client, name string, learned ...lacev1.LearnedBinding) {
	t.Helper()
	eventually(t, 10*time.Second, "learned bindings of "+name+" written", func() error {
		var ne lacev1.NetworkEndpoint
		if err := c.Get(context.Background(), client.ObjectKey{Namespace: "default", Name: name}, &ne); err != nil {
			return err
		}
		ne.Spec.Learned = learned
		return c.Update(context.Background(), &ne)
	})
}

// fdbAt waits until the FDBEntry of mac in network is held by endpoint
// at node with sequence seq, learned, published by node.
func fdbAt(t *testing.T, c client.Client, network string, mac net.HardwareAddr, endpoint, node string, seq int64) lacev1.FDBEntry {
	t.Helper()
	var f lacev1.FDBEntry
	eventually(t, 30*time.Second, fmt.Sprintf("MAC %s at %s (%s) sequence %d", mac, endpoint, node, seq), func() error {
		if err := c.Get(context.Background(), client.ObjectKey{Name: ipam.FDBEntryName(network, mac)}, &f); err != nil {
			return err
		}
		if f.Annotations[lacev1.AnnotationEndpoint] != "default/"+endpoint || f.Spec.Node != node || f.Spec.Sequence != seq ||
			!f.Spec.Learned || f.Spec.Publisher != node {
			return fmt.Errorf("held by %s at %s, sequence %d, learned %v, publisher %s", f.Annotations[lacev1.AnnotationEndpoint], f.Spec.Node, f.Spec.Sequence, f.Spec.Learned, f.Spec.Publisher)
		}
		return nil
	})
	return f
}

// neighborOf waits until address a of network resolves to mac, learned,
// held by endpoint.
func neighborOf(t *testing.T, c client.Client, network string, a netip.Addr, mac net.HardwareAddr, endpoint string) {
	t.Helper()
	eventually(t, 30*time.Second, fmt.Sprintf("%s -> %s held by %s", a, mac, endpoint), func() error {
		var n lacev1.Neighbor
		if err := c.Get(context.Background(), client.ObjectKey{Name: ipam.NeighborName(network, a)}, &n); err != nil {
			return err
		}
		if string(n.Spec.MAC) != mac.String() || !n.Spec.Learned || n.Annotations[lacev1.AnnotationEndpoint] != "default/"+endpoint {
			return fmt.Errorf("%s held by %s, learned %v", n.Spec.MAC, n.Annotations[lacev1.AnnotationEndpoint], n.Spec.Learned)
		}
		return nil
	})
}

func warned(t *testing.T, c client.Client, object, reason string, words ...string) {
	t.Helper()
	eventually(t, 30*time.Second, fmt.Sprintf("Warning %s on %s", reason, object), func() error {
		var evs corev1.EventList
		if err := c.List(context.Background(), &evs); err != nil {
			return err
		}
	next:
		for _, e := range evs.Items {
			if e.InvolvedObject.Name != object || e.Reason != reason || e.Type != corev1.EventTypeWarning {
				continue
			}
			for _, w := range words {
				if !strings.Contains(e.Message, w) {
					continue next
				}
			}
			return nil
		}
		return fmt.Errorf("no such Event")
	})
}

// TestL2Learning: what an endpoint of a learning network learned is
// published as a learned FDBEntry and Neighbor held for it (its assigned
// addresses unchanged); an assigned address or MAC is never taken; a
// learned MAC moves to another endpoint only with a higher sequence, its
// address with it; the fifth move within 180 s freezes it there (Frozen,
// Warning MACFlapping) and a later claim is refused; learning off
// withdraws what is not frozen; the endpoint's deletion releases the rest.
func TestL2Learning(t *testing.T) {
	env, c := startL2(t)
	startController(t, env, nil)
	ctx := context.Background()
	nw := l2Network("learn", "10.56.0.0/24", "")
	nw.Spec.L2 = &lacev1.L2Options{Learning: true}
	createL2(t, c, nw)
	l2Pod(t, c, "a", "n1", "learn")
	l2Pod(t, c, "b", "n2", "learn")
	l2Pod(t, c, "c", "n3", "learn")
	got := assigned(t, c, []string{"a", "b", "c"}, 1)

	guest := net.HardwareAddr{0x52, 0x54, 0, 1, 2, 3}
	static := netip.MustParseAddr("10.56.0.200")
	setLearned(t, c, "a", lacev1.LearnedBinding{MAC: lacev1.MACAddress(guest.String()), Address: lacev1.IPAddress(static.String())})
	fdbAt(t, c, "learn", guest, "a", "n1", 0)
	neighborOf(t, c, "learn", static, guest, "a")
	if a := assigned(t, c, []string{"a"}, 1)["a"]; fmt.Sprint(a.Addresses) != fmt.Sprint(got["a"].Addresses) || a.MAC != got["a"].MAC {
		t.Errorf("a's assignment changed to %v/%s with a learned binding, was %v/%s", a.Addresses, a.MAC, got["a"].Addresses, got["a"].MAC)
	}

	// b claims c's assigned address and m's assigned MAC: refused,
	// nothing moves; a MAC of the range the IPAM derives (c's) is not
	// even tried.
	annotatedL2Pod(t, c, "m", "n3", "learn", map[string]string{lacev1.AnnotationMACAddress: "02:00:00:00:00:42"})
	assigned(t, c, []string{"m"}, 1)
	cAddr := string(got["c"].Addresses[0])
	setLearned(t, c, "b", lacev1.LearnedBinding{MAC: lacev1.MACAddress("52:54:00:00:00:0b"), Address: lacev1.IPAddress(cAddr)},
		lacev1.LearnedBinding{MAC: "02:00:00:00:00:42", Sequence: 9}, lacev1.LearnedBinding{MAC: got["c"].MAC, Sequence: 9})
	warned(t, c, "b", "LearnedAddressTaken", "address "+cAddr, "endpoint default/c")
	warned(t, c, "b", "LearnedAddressTaken", "MAC 02:00:00:00:00:42", "endpoint default/m")
	var cn lacev1.Neighbor
	if err := c.Get(ctx, client.ObjectKey{Name: ipam.NeighborName("learn", netip.MustParseAddr(cAddr))}, &cn); err != nil || cn.Spec.Learned ||
		string(cn.Spec.MAC) != string(got["c"].MAC) {
		t.Errorf("c's address after b claimed it: %+v (%v)", cn.Spec, err)
	}
	if f := fdbAt(t, c, "learn", net.HardwareAddr{0x52, 0x54, 0, 0, 0, 0x0b}, "b", "n2", 0); f.Name == "" {
		t.Error("b's own MAC not learned")
	}
	var cf lacev1.FDBEntry
	if err := c.Get(ctx, client.ObjectKey{Name: ipam.FDBEntryName("learn", mustMAC(string(got["c"].MAC)))}, &cf); err != nil || cf.Spec.Node != "n3" || cf.Spec.Learned {
		t.Errorf("c's MAC after b claimed it: %+v (%v)", cf.Spec, err)
	}

	// The guest moves to b: not with a sequence no higher than a's.
	claim := func(who string, seq int64) {
		setLearned(t, c, who, lacev1.LearnedBinding{MAC: lacev1.MACAddress(guest.String()), Address: lacev1.IPAddress(static.String()), Sequence: seq})
	}
	claim("b", 0)
	// A marker learned after the stale claim was judged.
	setLearned(t, c, "b", lacev1.LearnedBinding{MAC: lacev1.MACAddress(guest.String()), Address: lacev1.IPAddress(static.String())},
		lacev1.LearnedBinding{MAC: "52:54:00:00:00:0c"})
	fdbAt(t, c, "learn", mustMAC("52:54:00:00:00:0c"), "b", "n2", 0)
	fdbAt(t, c, "learn", guest, "a", "n1", 0)
	claim("b", 1)
	fdbAt(t, c, "learn", guest, "b", "n2", 1)
	neighborOf(t, c, "learn", static, guest, "b")
	// a's older claim (sequence 0, still in its spec) does not take it back.
	setLearned(t, c, "a", lacev1.LearnedBinding{MAC: lacev1.MACAddress(guest.String()), Address: lacev1.IPAddress(static.String())},
		lacev1.LearnedBinding{MAC: "52:54:00:00:00:0a"})
	fdbAt(t, c, "learn", mustMAC("52:54:00:00:00:0a"), "a", "n1", 0)
	fdbAt(t, c, "learn", guest, "b", "n2", 1)

	// Flapping: moves 2..5 within seconds; the fifth freezes it at b.
	claim("a", 2)
	fdbAt(t, c, "learn", guest, "a", "n1", 2)
	claim("b", 3)
	fdbAt(t, c, "learn", guest, "b", "n2", 3)
	claim("a", 4)
	fdbAt(t, c, "learn", guest, "a", "n1", 4)
	claim("b", 5)
	f := fdbAt(t, c, "learn", guest, "b", "n2", 5)
	warned(t, c, f.Name, "MACFlapping", guest.String(), "frozen")
	warned(t, c, "b", "MACFlapping", guest.String())
	eventually(t, 30*time.Second, "condition Frozen on the guest's FDBEntry", func() error {
		if err := c.Get(ctx, client.ObjectKey{Name: f.Name}, &f); err != nil {
			return err
		}
		if !meta.IsStatusConditionTrue(f.Status.Conditions, lacev1.ConditionFrozen) || f.Annotations[lacev1.AnnotationFrozenUntil] == "" {
			return fmt.Errorf("conditions %v, annotations %v", f.Status.Conditions, f.Annotations)
		}
		return nil
	})
	claim("a", 6)
	setLearned(t, c, "a", lacev1.LearnedBinding{MAC: lacev1.MACAddress(guest.String()), Address: lacev1.IPAddress(static.String()), Sequence: 6},
		lacev1.LearnedBinding{MAC: "52:54:00:00:00:0d"})
	fdbAt(t, c, "learn", mustMAC("52:54:00:00:00:0d"), "a", "n1", 0)
	fdbAt(t, c, "learn", guest, "b", "n2", 5)

	// Learning off: a's bindings withdrawn; b's frozen MAC stays held.
	eventually(t, 10*time.Second, "learning turned off", func() error {
		var cur lacev1.Network
		if err := c.Get(ctx, client.ObjectKey{Name: "learn"}, &cur); err != nil {
			return err
		}
		cur.Spec.L2 = nil
		return c.Update(ctx, &cur)
	})
	eventually(t, 30*time.Second, "learned bindings withdrawn", func() error {
		var nbrs lacev1.NeighborList
		var fdbs lacev1.FDBEntryList
		if err := c.List(ctx, &nbrs); err != nil {
			return err
		}
		if err := c.List(ctx, &fdbs); err != nil {
			return err
		}
		var left []string
		for _, n := range nbrs.Items {
			if n.Spec.Learned {
				left = append(left, n.Name)
			}
		}
		for _, f := range fdbs.Items {
			if f.Spec.Learned && f.Spec.MAC != lacev1.MACAddress(guest.String()) {
				left = append(left, f.Name)
			}
		}
		if len(left) > 0 {
			return fmt.Errorf("still there: %v", left)
		}
		return nil
	})
	// Learning on again; b's deletion releases the frozen MAC with
	// everything else of b, and a, which still claims it, takes it at
	// once (nothing else would wake it).
	eventually(t, 10*time.Second, "learning turned on", func() error {
		var cur lacev1.Network
		if err := c.Get(ctx, client.ObjectKey{Name: "learn"}, &cur); err != nil {
			return err
		}
		cur.Spec.L2 = &lacev1.L2Options{Learning: true}
		return c.Update(ctx, &cur)
	})
	fdbAt(t, c, "learn", mustMAC("52:54:00:00:00:0d"), "a", "n1", 0)
	deletePodAndEndpoint(t, c, "b")
	fdbAt(t, c, "learn", guest, "a", "n1", 6)
	neighborOf(t, c, "learn", static, guest, "a")

	// An assignment takes an address a port only learned.
	learned201 := netip.MustParseAddr("10.56.0.201")
	setLearned(t, c, "c", lacev1.LearnedBinding{MAC: "52:54:00:00:00:0e", Address: lacev1.IPAddress(learned201.String())})
	neighborOf(t, c, "learn", learned201, mustMAC("52:54:00:00:00:0e"), "c")
	annotatedL2Pod(t, c, "fixed", "n2", "learn", map[string]string{lacev1.AnnotationIPAddresses: learned201.String()})
	if got := assigned(t, c, []string{"fixed"}, 1)["fixed"]; string(got.Addresses[0]) != learned201.String() {
		t.Errorf("fixed got %v, want the learned %s", got.Addresses, learned201)
	}
	warned(t, c, "c", "LearnedAddressTaken", "address "+learned201.String(), "endpoint default/fixed")

	// A VM whose MAC its IPAMClaim holds learns an address on that MAC:
	// the Neighbor carries the claim's UID too, so the model places it
	// with the claim's FDBEntry.
	vmClaim := &ipamclaimsv1.IPAMClaim{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "vm.learn"},
		Spec: ipamclaimsv1.IPAMClaimSpec{Network: "learn", Interface: "eth0"}}
	create(t, c, vmClaim)
	annotatedL2Pod(t, c, "vm", "n3", "learn", map[string]string{lacev1.AnnotationIPAMClaim: "vm.learn"})
	vm := assigned(t, c, []string{"vm"}, 1)["vm"]
	secondary := netip.MustParseAddr("10.56.0.202")
	setLearned(t, c, "vm", lacev1.LearnedBinding{MAC: vm.MAC, Address: lacev1.IPAddress(secondary.String())})
	neighborOf(t, c, "learn", secondary, mustMAC(string(vm.MAC)), "vm")
	if err := c.Get(ctx, client.ObjectKey{Name: vmClaim.Name, Namespace: "default"}, vmClaim); err != nil {
		t.Fatal(err)
	}
	var sn lacev1.Neighbor
	if err := c.Get(ctx, client.ObjectKey{Name: ipam.NeighborName("learn", secondary)}, &sn); err != nil || sn.Labels[lacev1.LabelIPAMClaimUID] != string(vmClaim.UID) {
		t.Errorf("the VM's learned address is not joined with its claim's MAC: labels %v (%v)", sn.Labels, err)
	}

	// A node's endpoint of a pod not bound to a learning network learns
	// nothing there (a compromised agent naming another tenant's network).
	other := l2Network("other", "10.57.0.0/24", "")
	other.Spec.L2 = &lacev1.L2Options{Learning: true}
	create(t, c, other)
	l2Pod(t, c, "x", "n1", "other")
	refused(t, c, "x", "NotBoundToNetwork")
	setLearned(t, c, "x", lacev1.LearnedBinding{MAC: "52:54:00:00:00:0f"})
	setLearned(t, c, "a", lacev1.LearnedBinding{MAC: lacev1.MACAddress(guest.String()), Address: lacev1.IPAddress(static.String()), Sequence: 6},
		lacev1.LearnedBinding{MAC: "52:54:00:00:00:10"})
	fdbAt(t, c, "learn", mustMAC("52:54:00:00:00:10"), "a", "n1", 0)
	var fx lacev1.FDBEntry
	if err := c.Get(ctx, client.ObjectKey{Name: ipam.FDBEntryName("other", mustMAC("52:54:00:00:00:0f"))}, &fx); err == nil {
		t.Errorf("an endpoint of a pod not bound to network other learned %s there", fx.Spec.MAC)
	}
}

func mustMAC(s string) net.HardwareAddr {
	m, err := net.ParseMAC(s)
	if err != nil {
		panic(err)
	}
	return m
}

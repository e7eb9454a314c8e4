package e2e

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"os"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
	crclient "sigs.k8s.io/controller-runtime/pkg/client"

	lacev1 "github.com/lace-cni/lace/api/v1alpha1"
	"github.com/lace-cni/lace/internal/model/ipam"
	"github.com/lace-cni/lace/internal/netutil"
)

// staticGuest puts a guest with its own MAC and a static address behind
// pod's eth0, as a VM behind its pod: a macvlan of eth0 in a namespace of
// its own, holding addrs. The returned path is the guest's namespace.
func staticGuest(t *testing.T, podNS string, mac net.HardwareAddr, addrs ...netip.Prefix) string {
	t.Helper()
	guest, f := anonNetNS(t)
	err := netutil.Do(podNS, func() error {
		eth0, err := netlink.LinkByName("eth0")
		if err != nil {
			return err
		}
		g := &netlink.Macvlan{LinkAttrs: netlink.LinkAttrs{Name: "g0", ParentIndex: eth0.Attrs().Index, HardwareAddr: mac}, Mode: netlink.MACVLAN_MODE_BRIDGE}
		if err := netlink.LinkAdd(g); err != nil {
			return fmt.Errorf("add the guest's macvlan: %w", err)
		}
		return netlink.LinkSetNsFd(g, int(f.Fd()))
	})
	if err != nil {
		t.Fatal(err)
	}
	err = netutil.Do(guest, func() error {
		g, err := netlink.LinkByName("g0")
		if err != nil {
			return err
		}
		for _, a := range addrs {
			if err := netlink.AddrAdd(g, &netlink.Addr{IPNet: &net.IPNet{IP: a.Addr().AsSlice(), Mask: net.CIDRMask(a.Bits(), a.Addr().BitLen())}, Flags: unix.IFA_F_NODAD}); err != nil {
				return err
			}
		}
		return netlink.LinkSetUp(g)
	})
	if err != nil {
		t.Fatal(err)
	}
	return guest
}

// guestServes answers TCP on port 9969 of each of addrs in guest's
// namespace with "guest", until the test ends.
func guestServes(t *testing.T, guest string, addrs ...netip.Addr) {
	t.Helper()
	for _, a := range addrs {
		var l net.Listener
		err := netutil.Do(guest, func() (err error) {
			l, err = net.Listen("tcp", net.JoinHostPort(a.String(), "9969"))
			return err
		})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { l.Close() })
		go func() {
			for {
				conn, err := l.Accept()
				if err != nil {
					return
				}
				fmt.Fprint(conn, "guest")
				conn.Close()
			}
		}()
	}
}

// anonNetNS makes a network namespace of no name (the root namespace's
// mounts stay as they were), held open until the test ends; it returns a
// path that enters it and the open file.
func anonNetNS(t *testing.T) (string, *os.File) {
	t.Helper()
	path, f, err := netutil.NewAnonNS()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() })
	return path, f
}

// setLearning turns learning of l2 network name on or off.
func setLearning(t *testing.T, c crclient.Client, name string, on bool) {
	t.Helper()
	eventually(t, 20*time.Second, fmt.Sprintf("learning of %s set to %v", name, on), func() error {
		var nw lacev1.Network
		if err := c.Get(context.Background(), crKey(name), &nw); err != nil {
			return err
		}
		nw.Spec.L2 = &lacev1.L2Options{Learning: on}
		return c.Update(context.Background(), &nw)
	})
}

// TestL2LearnsStaticGuest: a guest behind a pod of an l2 network, with its
// own MAC and a static address the controller never assigned, sends. While
// the network does not learn, its frames are dropped as l2-spoofed-mac on
// its node, nothing is published and a pod on another node cannot reach
// it (a timeout and the drop counter moving). Once the network learns,
// its first frames are dropped as l2-learning, its MAC and addresses are
// published as learned FDBEntry and Neighbors (publisher: its node), and
// the pod on the other node reaches it over TCP in both families, switched
// through SRv6 to the guest's node. A second, silent guest is found by
// the peer's flooded ARP and neighbour solicitation (l2-unknown-flooded
// on both nodes), learned from its answer, and reached. The guests' pod
// deleted, nothing learned is left.
func TestL2LearnsStaticGuest(t *testing.T) {
	needLab(t)
	c := laceClient(t)
	ctx := context.Background()
	v4Net, v6Net := netip.MustParsePrefix("10.69.0.0/24"), netip.MustParsePrefix("fd00:69::/64")
	l2Network(t, c, "learn", v4Net.String(), v6Net.String())
	host := netPod(t, "learn-host", "learn", "n1", true)
	peer := netPod(t, "learn-peer", "learn", "n2", true)
	mac := net.HardwareAddr{0x52, 0x54, 0x00, 0x69, 0x00, 0xc8}
	g4, g6 := netip.MustParseAddr("10.69.0.200"), netip.MustParseAddr("fd00:69::c8")
	guest := staticGuest(t, podNetNS(t, host), mac, netip.PrefixFrom(g4, 24), netip.PrefixFrom(g6, 64))
	guestServes(t, guest, g4, g6)
	// The guest speaks: what a guest does on boot (its sends resolve the
	// peer, and carry its address).
	peer4, peer6 := podAddrs(peer)
	speak := func() {
		_ = netutil.Do(guest, func() error {
			for _, d := range []netip.Addr{peer4, peer6} {
				if conn, err := net.DialTimeout("udp", net.JoinHostPort(d.String(), "8081"), time.Second); err == nil {
					_, _ = conn.Write([]byte("hostname"))
					conn.Close()
				}
			}
			return nil
		})
	}
	reach := func(dst netip.Addr) error {
		dctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		defer cancel()
		conn, err := netutil.DialContext(dctx, podNetNS(t, peer), "tcp", net.JoinHostPort(dst.String(), "9969"))
		if err != nil {
			return err
		}
		defer conn.Close()
		_ = conn.SetDeadline(time.Now().Add(2 * time.Second))
		buf := make([]byte, 16)
		n, _ := conn.Read(buf)
		if string(buf[:n]) != "guest" {
			return fmt.Errorf("answered %q", buf[:n])
		}
		return nil
	}
	learnedObjects := func() (nbrs []lacev1.Neighbor, fdbs []lacev1.FDBEntry) {
		var nl lacev1.NeighborList
		var fl lacev1.FDBEntryList
		if err := c.List(ctx, &nl, crclient.MatchingLabels{lacev1.LabelNetwork: "learn"}); err != nil {
			t.Fatal(err)
		}
		if err := c.List(ctx, &fl, crclient.MatchingLabels{lacev1.LabelNetwork: "learn"}); err != nil {
			t.Fatal(err)
		}
		for _, n := range nl.Items {
			if n.Spec.Learned {
				nbrs = append(nbrs, n)
			}
		}
		for _, f := range fl.Items {
			if f.Spec.Learned {
				fdbs = append(fdbs, f)
			}
		}
		return nbrs, fdbs
	}

	// Not learning: spoofed, unreachable, nothing published.
	before := nodeDrops(t, "n1")
	speak()
	if err := reach(g4); err == nil {
		t.Fatal("the guest is reached before its network learns")
	}
	eventually(t, 10*time.Second, "the guest's frames dropped as l2-spoofed-mac on n1", func() error {
		if after := nodeDrops(t, "n1"); after["l2-spoofed-mac"] <= before["l2-spoofed-mac"] {
			return fmt.Errorf("l2-spoofed-mac %d -> %d", before["l2-spoofed-mac"], after["l2-spoofed-mac"])
		}
		return nil
	})
	if nbrs, fdbs := learnedObjects(); len(nbrs)+len(fdbs) > 0 {
		t.Fatalf("published while the network does not learn: %d Neighbors, %d FDBEntries", len(nbrs), len(fdbs))
	}

	// Learning: reported, published, reached.
	before = nodeDrops(t, "n1")
	setLearning(t, c, "learn", true)
	eventually(t, 60*time.Second, "the guest's MAC and addresses published as learned", func() error {
		speak()
		nbrs, fdbs := learnedObjects()
		want := map[string]bool{ipam.NeighborName("learn", g4): false, ipam.NeighborName("learn", g6): false}
		for _, n := range nbrs {
			if _, ok := want[n.Name]; ok && string(n.Spec.MAC) == mac.String() && n.Spec.Publisher == "n1" {
				want[n.Name] = true
			}
		}
		for n, ok := range want {
			if !ok {
				return fmt.Errorf("Neighbor %s not published (learned: %d Neighbors)", n, len(nbrs))
			}
		}
		if len(fdbs) != 1 || string(fdbs[0].Spec.MAC) != mac.String() || fdbs[0].Spec.Node != "n1" || fdbs[0].Spec.Publisher != "n1" {
			return fmt.Errorf("learned FDBEntries %+v", fdbs)
		}
		return nil
	})
	if after := nodeDrops(t, "n1"); after["l2-learning"] <= before["l2-learning"] {
		t.Errorf("l2-learning drops on n1 %d -> %d: the guest's first frames were not held for learning", before["l2-learning"], after["l2-learning"])
	}
	for _, a := range []netip.Addr{g4, g6} {
		eventually(t, 30*time.Second, fmt.Sprintf("TCP from n2 to the guest at %s", a), func() error { return reach(a) })
	}

	// A silent guest (it never sends first) is found as on a switch: the
	// peer's ARP request and neighbour solicitation for it, which its
	// network cannot answer, are flooded to the learning ports of every
	// node with ports in the network; the guest's answer is learned, and
	// the peer's next question answered.
	silentMAC := net.HardwareAddr{0x52, 0x54, 0x00, 0x69, 0x00, 0xc9}
	s4, s6 := netip.MustParseAddr("10.69.0.201"), netip.MustParseAddr("fd00:69::c9")
	silent := staticGuest(t, podNetNS(t, host), silentMAC, netip.PrefixFrom(s4, 24), netip.PrefixFrom(s6, 64))
	guestServes(t, silent, s4, s6)
	sent, taken := nodeForwarded(t, "n2")["l2-unknown-flooded"], nodeForwarded(t, "n1")["l2-unknown-flooded"]
	for _, a := range []netip.Addr{s4, s6} {
		eventually(t, 30*time.Second, fmt.Sprintf("TCP from n2 to the silent guest at %s", a), func() error { return reach(a) })
	}
	if got := nodeForwarded(t, "n2")["l2-unknown-flooded"]; got < sent+2 {
		t.Errorf("n2 flooded %d questions for the silent guest, want one per family at least", got-sent)
	}
	if got := nodeForwarded(t, "n1")["l2-unknown-flooded"]; got < taken+2 {
		t.Errorf("n1 took %d flooded questions for the silent guest, want one per family at least", got-taken)
	}

	// The guest's pod goes: what was learned for it goes with it.
	deletePodNow(t, host.Name)
	eventually(t, 60*time.Second, "the learned bindings released with the pod", func() error {
		if nbrs, fdbs := learnedObjects(); len(nbrs)+len(fdbs) > 0 {
			return fmt.Errorf("%d Neighbors, %d FDBEntries left", len(nbrs), len(fdbs))
		}
		return nil
	})
}

// TestL2FlappingMACFrozen: two guests with the same MAC (a duplicate, or a
// loop) behind pods on two nodes of a learning network both speak: the
// MAC moves between the nodes with rising sequences until its fifth move,
// then it is frozen where it is (condition Frozen on its FDBEntry, Warning
// MACFlapping Events on it and on the endpoint) and stops moving.
func TestL2FlappingMACFrozen(t *testing.T) {
	needLab(t)
	c := laceClient(t)
	ctx := context.Background()
	l2Network(t, c, "flap", "10.70.0.0/24", "fd00:70::/64")
	setLearning(t, c, "flap", true)
	one := netPod(t, "flap-1", "flap", "n1", true)
	two := netPod(t, "flap-2", "flap", "n2", true)
	peer := netPod(t, "flap-peer", "flap", "n3", true)
	mac := net.HardwareAddr{0x52, 0x54, 0x00, 0x70, 0x00, 0x01}
	guests := []string{
		staticGuest(t, podNetNS(t, one), mac, netip.MustParsePrefix("10.70.0.210/24")),
		staticGuest(t, podNetNS(t, two), mac, netip.MustParsePrefix("10.70.0.211/24")),
	}
	peer4, _ := podAddrs(peer)
	speak := func() {
		for _, g := range guests {
			_ = netutil.Do(g, func() error {
				conn, err := net.DialTimeout("udp", net.JoinHostPort(peer4.String(), "8081"), time.Second)
				if err == nil {
					_, _ = conn.Write([]byte("hostname"))
					conn.Close()
				}
				return nil
			})
		}
	}
	name := ipam.FDBEntryName("flap", mac)
	var f lacev1.FDBEntry
	eventually(t, 2*time.Minute, "the duplicate MAC frozen", func() error {
		speak()
		if err := c.Get(ctx, crKey(name), &f); err != nil {
			return err
		}
		if !meta.IsStatusConditionTrue(f.Status.Conditions, lacev1.ConditionFrozen) {
			return fmt.Errorf("at %s, sequence %d, not frozen", f.Spec.Node, f.Spec.Sequence)
		}
		return nil
	})
	if f.Spec.Sequence < 5 || !f.Spec.Learned {
		t.Errorf("frozen at sequence %d (learned %v): want the fifth move's", f.Spec.Sequence, f.Spec.Learned)
	}
	eventually(t, 30*time.Second, "Warning MACFlapping on the FDBEntry", func() error {
		evs, err := client.CoreV1().Events("").List(ctx, metav1.ListOptions{FieldSelector: "involvedObject.name=" + name})
		if err != nil {
			return err
		}
		for _, e := range evs.Items {
			if e.Reason == "MACFlapping" && e.Type == corev1.EventTypeWarning && strings.Contains(e.Message, mac.String()) {
				return nil
			}
		}
		return fmt.Errorf("no MACFlapping Event among %d", len(evs.Items))
	})
	// Frozen: both guests keep speaking and the MAC stays where it is.
	// The other node's reports reach lace-controller (the rounds below
	// wait for one), which refuses them.
	frozenAt, seq := f.Spec.Node, f.Spec.Sequence
	other := map[string]string{"n1": "flap-2", "n2": "flap-1"}[frozenAt]
	eventually(t, 30*time.Second, "the other endpoint claiming the frozen MAC again", func() error {
		speak()
		var ne lacev1.NetworkEndpoint
		if err := c.Get(ctx, crclient.ObjectKey{Namespace: "default", Name: other}, &ne); err != nil {
			return err
		}
		for _, b := range ne.Spec.Learned {
			if string(b.MAC) == mac.String() && b.Sequence > seq {
				return nil
			}
		}
		return fmt.Errorf("no claim above sequence %d in %v", seq, ne.Spec.Learned)
	})
	eventually(t, 30*time.Second, "the claim refused: Warning MACFrozen on "+other, func() error {
		evs, err := client.CoreV1().Events("default").List(ctx, metav1.ListOptions{FieldSelector: "involvedObject.name=" + other})
		if err != nil {
			return err
		}
		for _, e := range evs.Items {
			if e.Reason == "MACFrozen" && strings.Contains(e.Message, mac.String()) {
				return nil
			}
		}
		return fmt.Errorf("no MACFrozen Event among %d", len(evs.Items))
	})
	if err := c.Get(ctx, crKey(name), &f); err != nil {
		t.Fatal(err)
	}
	if f.Spec.Node != frozenAt || f.Spec.Sequence != seq {
		t.Errorf("the frozen MAC moved to %s (sequence %d), was at %s (%d)", f.Spec.Node, f.Spec.Sequence, frozenAt, seq)
	}
}

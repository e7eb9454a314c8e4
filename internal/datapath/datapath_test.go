package datapath_test

import (
	"bufio"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"golang.org/x/sys/unix"
	"io"
	"net"
	"net/netip"
	"os/exec"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/cilium/ebpf/btf"

	"github.com/lace-cni/lace/internal/datapath"
	"github.com/lace-cni/lace/internal/netutil"
)

// The DECAP flags are defined in bpf/include/lace.h because Debian's UAPI
// headers lack them; they must equal the running kernel's.
func TestAdjustRoomFlagsMatchKernel(t *testing.T) {
	spec, err := btf.LoadKernelSpec()
	if err != nil {
		t.Skipf("no kernel BTF: %v", err)
	}
	want := map[string]uint64{"BPF_F_ADJ_ROOM_DECAP_L3_IPV4": 1 << 7, "BPF_F_ADJ_ROOM_DECAP_L3_IPV6": 1 << 8}
	seen := 0
	for typ, err := range spec.All() {
		if err != nil {
			t.Fatal(err)
		}
		if en, ok := typ.(*btf.Enum); ok {
			for _, v := range en.Values {
				if w, ok := want[v.Name]; ok {
					seen++
					if v.Value != w {
						t.Errorf("%s = %d in the kernel, %d in lace.h", v.Name, v.Value, w)
					}
				}
			}
		}
	}
	if seen != 2 {
		t.Fatalf("found %d of the 2 DECAP flags in the kernel BTF", seen)
	}
}

func TestSIDLayout(t *testing.T) {
	got := datapath.SID(netip.MustParsePrefix("fd1a:ce:0:2::/64"), datapath.BehaviourL3Decap, 0x0405, 0x10203)
	if got.String() != "fd1a:ce:0:2:100:405:1:203" {
		t.Fatalf("SID = %s", got)
	}
}

// TestL3Forwarding drives TCP, UDP and ICMP over IPv4 and IPv6 between pods
// on one node and across nodes, and checks isolation, overlapping subnets,
// anonymous networks and what the underlay carries.
func TestL3Forwarding(t *testing.T) {
	w := newWorld(t, 2)
	n1, n2 := w.nodes[0], w.nodes[1]
	w.addNetwork(1, "10.40.0.0/16", "fd00:40::/48", false)
	w.addNetwork(2, "10.40.0.0/16", "fd00:40::/48", false) // overlaps network 1
	w.addNetwork(3, "10.60.0.0/16", "fd00:60::/48", true)  // anonymous
	a := w.addPod("a", n1, 1, 2)
	b := w.addPod("b", n1, 1, 3)
	c := w.addPod("c", n2, 1, 2)
	d := w.addPod("d", n1, 2, 2) // same addresses as a, other network
	e := w.addPod("e", n2, 2, 2) // same addresses as c, other network
	f := w.addPod("f", n1, 3, 2)
	g := w.addPod("g", n2, 3, 2)

	type pair struct {
		from *pod
		to   *pod
		want string
	}
	for _, tc := range []pair{
		{a, b, "b"}, {b, a, "a"}, // same node
		{a, c, "c"}, {c, a, "a"}, // across nodes
		{d, e, "e"}, {e, d, "d"}, // the overlapping network reaches its own pods
	} {
		for _, dst := range []netip.Addr{tc.to.v4, tc.to.v6} {
			got, err := tc.from.dialTCP(dst)
			if err != nil || got != tc.want {
				t.Errorf("TCP %s -> %s (%s): got %q, %v; want %q", tc.from.name, tc.to.name, dst, got, err, tc.want)
			}
			got, err = tc.from.dialUDP(dst)
			if err != nil || got != tc.want {
				t.Errorf("UDP %s -> %s (%s): got %q, %v; want %q", tc.from.name, tc.to.name, dst, got, err, tc.want)
			}
			if err := tc.from.ping(dst); err != nil {
				t.Errorf("ICMP %s -> %s: %v", tc.from.name, tc.to.name, err)
			}
		}
	}

	// Isolation: other networks and anonymous networks are unreachable:
	// the connection times out and the source node counts the drop.
	for _, tc := range []struct {
		from, to *pod
		reason   string
	}{{a, f, "isolated"}, {a, g, "isolated"}, {f, a, "isolated"}, {f, g, "anonymous-network"}, {g, f, "anonymous-network"}} {
		for _, dst := range []netip.Addr{tc.to.v4, tc.to.v6} {
			expectDropped(t, tc.from.node, tc.reason, fmt.Sprintf("TCP %s -> %s (%s)", tc.from.name, tc.to.name, dst), func() error {
				got, err := tc.from.dialTCP(dst)
				if err == nil {
					return fmt.Errorf("connected (answered %q)", got)
				}
				return err
			})
		}
	}

	// Anti-spoofing: a pod sending from an address that is not its own is
	// dropped, even toward a pod of its own network.
	forged := netip.MustParseAddr("10.40.1.99")
	must(t, netutil.EnsureAddr(netutil.Path(a.ns), "eth0", netip.PrefixFrom(forged, 32)))
	expectDropped(t, n1, "spoofed-source", "TCP from a forged source", func() error {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		dialer := net.Dialer{LocalAddr: &net.TCPAddr{IP: forged.AsSlice()}}
		return netutil.Do(netutil.Path(a.ns), func() error {
			conn, err := dialer.DialContext(ctx, "tcp", netip.AddrPortFrom(c.v4, 7).String())
			if err == nil {
				conn.Close()
				return errors.New("connected")
			}
			return err
		})
	})

	// A self policy opens an anonymous network to itself.
	w.open(3)
	if got, err := f.dialTCP(g.v4); err != nil || got != "g" {
		t.Errorf("anonymous network with a self policy: got %q, %v", got, err)
	}
}

// TestUnderlayCarriesOnlySRv6 captures the underlay while pods on two nodes
// talk: every frame between the nodes' pods is IPv6 to a SID inside the
// destination node's locator.
func TestUnderlayCarriesOnlySRv6(t *testing.T) {
	w := newWorld(t, 2)
	n1, n2 := w.nodes[0], w.nodes[1]
	w.addNetwork(7, "10.70.0.0/16", "fd00:70::/48", false)
	a := w.addPod("a", n1, 7, 2)
	c := w.addPod("c", n2, 7, 2)
	frames := w.capture(n1.name, func() {
		for _, dst := range []netip.Addr{c.v4, c.v6} {
			if got, err := a.dialTCP(dst); err != nil || got != "c" {
				t.Errorf("TCP a -> c: %q %v", got, err)
			}
			if err := a.ping(dst); err != nil {
				t.Error(err)
			}
		}
	})
	podV4, podV6 := netip.MustParsePrefix("10.70.0.0/16"), netip.MustParsePrefix("fd00:70::/48")
	srv6 := 0
	for _, fr := range frames {
		if len(fr) < 14 {
			continue
		}
		et := binary.BigEndian.Uint16(fr[12:14])
		switch et {
		case 0x0800:
			// The nodes' own IPv4 chatter (IGMP) is fine; pod addresses
			// must never appear unencapsulated.
			if len(fr) >= 34 {
				src := netip.AddrFrom4([4]byte(fr[26:30]))
				dst := netip.AddrFrom4([4]byte(fr[30:34]))
				if podV4.Contains(src) || podV4.Contains(dst) {
					t.Errorf("pod IPv4 packet on the underlay: %s -> %s", src, dst)
				}
			}
		case 0x86dd:
			if len(fr) < 54 {
				continue
			}
			dst := netip.AddrFrom16([16]byte(fr[38:54]))
			src := netip.AddrFrom16([16]byte(fr[22:38]))
			if podV6.Contains(src) || podV6.Contains(dst) {
				t.Errorf("pod IPv6 packet on the underlay without encapsulation: %s -> %s", src, dst)
			}
			next := fr[20]
			if next != 4 && next != 41 {
				continue // neighbour discovery between the nodes
			}
			srv6++
			var want netip.Prefix
			switch src {
			case n1.v6:
				want = n2.locator
			case n2.v6:
				want = n1.locator
			default:
				t.Errorf("SRv6 packet from %s, not a node", src)
				continue
			}
			if !want.Contains(dst) || dst != datapath.SID(want, datapath.BehaviourL3Decap, 7, 7) {
				t.Errorf("SRv6 packet %s -> %s: want the SID of network 7 in %s", src, dst, want)
			}
		}
	}
	if srv6 == 0 {
		t.Fatalf("no SRv6 packets captured among %d frames", len(frames))
	}
	t.Logf("%d SRv6 packets captured, no IPv4", srv6)
}

// TestBulkTransferAcrossNodes pushes 8 MiB through one TCP stream across
// nodes (GSO-sized segments through encap and decap) and checks it arrives
// whole.
func TestBulkTransferAcrossNodes(t *testing.T) {
	w := newWorld(t, 2)
	w.addNetwork(8, "10.80.0.0/16", "fd00:80::/48", false)
	a := w.addPod("a", w.nodes[0], 8, 2)
	c := w.addPod("c", w.nodes[1], 8, 2)
	for _, dst := range []netip.Addr{c.v4, c.v6} {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		conn, err := netutil.DialContext(ctx, netutil.Path(a.ns), "tcp", netip.AddrPortFrom(dst, 7).String())
		if err != nil {
			cancel()
			t.Fatal(err)
		}
		_ = conn.SetDeadline(time.Now().Add(20 * time.Second))
		r := bufio.NewReader(conn)
		if _, err := r.ReadString('\n'); err != nil {
			t.Fatal(err)
		}
		const size = 8 << 20
		payload := make([]byte, size)
		for i := range payload {
			payload[i] = byte(i * 7)
		}
		go func() { _, _ = conn.Write(payload) }()
		got := make([]byte, size)
		if _, err := io.ReadFull(r, got); err != nil {
			dumpCounters(t, w)
			t.Fatalf("echo of 8 MiB to %s: %v", dst, err)
		}
		if string(got) != string(payload) {
			t.Fatalf("echo to %s corrupted", dst)
		}
		conn.Close()
		cancel()
	}
}

// TestStreamSurvivesAgentRestart keeps a TCP stream running while the
// process that loaded the data plane lets go of it and a new one loads it
// again from the pins: forwarding never depends on the agent.
func TestStreamSurvivesAgentRestart(t *testing.T) {
	w := newWorld(t, 2)
	w.addNetwork(9, "10.90.0.0/16", "fd00:90::/48", false)
	a := w.addPod("a", w.nodes[0], 9, 2)
	c := w.addPod("c", w.nodes[1], 9, 2)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	conn, err := netutil.DialContext(ctx, netutil.Path(a.ns), "tcp", netip.AddrPortFrom(c.v4, 7).String())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	r := bufio.NewReader(conn)
	_ = conn.SetDeadline(time.Now().Add(20 * time.Second))
	if _, err := r.ReadString('\n'); err != nil {
		t.Fatal(err)
	}
	echo := func(msg string) {
		t.Helper()
		// Each echo within 20 s: the reloads between them take what the
		// verifier takes, which is no part of the stream's survival.
		_ = conn.SetDeadline(time.Now().Add(20 * time.Second))
		if _, err := conn.Write([]byte(msg + "\n")); err != nil {
			t.Fatalf("write %q: %v", msg, err)
		}
		got, err := r.ReadString('\n')
		if err != nil || strings.TrimSpace(got) != msg {
			t.Fatalf("echo %q: got %q, %v", msg, got, err)
		}
	}
	echo("before")
	// The agent goes away: its handles close, the pins stay.
	for _, n := range w.nodes {
		must(t, n.dp.Close())
		n.dp = nil
	}
	echo("without agent")
	// A new agent loads the programs again and finds its maps and links.
	for _, n := range w.nodes {
		n.load()
		eps, err := n.dp.Endpoints()
		must(t, err)
		if len(eps) != 2 {
			t.Errorf("node %s: %d endpoints after reload, want 2", n.name, len(eps))
		}
	}
	echo("after restart")
}

func dumpCounters(t *testing.T, w *world) {
	for _, n := range w.nodes {
		d, _ := n.dp.Drops()
		f, _ := n.dp.Forwarded()
		nz := map[string]uint64{}
		for k, v := range d {
			if v > 0 {
				nz[k] = v
			}
		}
		t.Logf("node %s drops %v forwarded %v", n.name, nz, f)
	}
}

// TestNodeReachesItsOwnPods checks the one exception to isolation: the node
// itself (kubelet probes) reaches pods on that node and gets answers, while
// a pod cannot open connections to the node.
func TestNodeReachesItsOwnPods(t *testing.T) {
	w := newWorld(t, 1)
	n1 := w.nodes[0]
	w.addNetwork(5, "10.50.0.0/16", "fd00:50::/48", false)
	a := w.addPod("a", n1, 5, 2)
	for _, dst := range []netip.Addr{a.v4, a.v6} {
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
		c, err := netutil.DialContext(ctx, netutil.Path(n1.ns), "tcp", netip.AddrPortFrom(dst, 7).String())
		cancel()
		if err != nil {
			t.Fatalf("node -> pod %s: %v", dst, err)
		}
		_ = c.SetDeadline(time.Now().Add(2 * time.Second))
		line, err := bufio.NewReader(c).ReadString('\n')
		c.Close()
		if err != nil || strings.TrimSpace(line) != "a" {
			t.Errorf("node -> pod %s answered %q, %v", dst, line, err)
		}
	}
	// A listener on the node is not reachable from the pod.
	var lnErr error
	must(t, netutil.Do(netutil.Path(n1.ns), func() error {
		ln, err := net.Listen("tcp", "0.0.0.0:9999")
		if err == nil {
			t.Cleanup(func() { ln.Close() })
		}
		lnErr = err
		return err
	}))
	_ = lnErr
	expectDropped(t, n1, "to-node-not-answer", "TCP pod -> its node", func() error {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		c, err := netutil.DialContext(ctx, netutil.Path(a.ns), "tcp", netip.AddrPortFrom(n1.v4, 9999).String())
		if err == nil {
			c.Close()
			return errors.New("connected")
		}
		return err
	})
}

// expectDropped runs try, which must fail by timing out (nothing answered:
// a refusal or an ICMP error would mean the packet got somewhere), and
// checks that node n counted the drop under reason meanwhile.
func expectDropped(t *testing.T, n *node, reason, what string, try func() error) {
	t.Helper()
	before, err := n.dp.Drops()
	must(t, err)
	if _, ok := before[reason]; !ok {
		t.Fatalf("node %s has no drop counter %q (it has %v)", n.name, reason, before)
	}
	err = try()
	var ne net.Error
	if !errors.As(err, &ne) || !ne.Timeout() {
		t.Errorf("%s: %v; want a timeout (dropped)", what, err)
	}
	after, err := n.dp.Drops()
	must(t, err)
	if after[reason] <= before[reason] {
		t.Errorf("%s: drop counter %q on %s did not move (%d -> %d)", what, reason, n.name, before[reason], after[reason])
	}
}

// TestUDPSegmentationOffloadAcrossNodes: a pod sending UDP with GSO
// (UDP_SEGMENT: one 12000-byte send cut into ten 1200-byte datagrams)
// across nodes gets every datagram delivered whole, in both families: the
// encapsulated GSO packet is segmented with its outer header intact.
func TestUDPSegmentationOffloadAcrossNodes(t *testing.T) {
	w := newWorld(t, 2)
	w.addNetwork(9, "10.81.0.0/16", "fd00:81::/48", false)
	a := w.addPod("a", w.nodes[0], 9, 2)
	c := w.addPod("c", w.nodes[1], 9, 2)
	for _, pair := range [][2]netip.Addr{{a.v4, c.v4}, {a.v6, c.v6}} {
		var rx net.PacketConn
		must(t, netutil.Do(netutil.Path(c.ns), func() error {
			var err error
			rx, err = net.ListenPacket("udp", netip.AddrPortFrom(pair[1], 9999).String())
			return err
		}))
		var tx *net.UDPConn
		must(t, netutil.Do(netutil.Path(a.ns), func() error {
			c, err := net.DialUDP("udp", nil, net.UDPAddrFromAddrPort(netip.AddrPortFrom(pair[1], 9999)))
			tx = c
			return err
		}))
		raw, err := tx.SyscallConn()
		must(t, err)
		var serr error
		must(t, raw.Control(func(fd uintptr) { serr = unix.SetsockoptInt(int(fd), unix.IPPROTO_UDP, unix.UDP_SEGMENT, 1200) }))
		must(t, serr)
		const segs, seg = 10, 1200
		got := 0
		for try := 0; try < 3 && got < segs; try++ {
			got = 0
			if _, err := tx.Write(make([]byte, segs*seg)); err != nil {
				t.Fatalf("GSO send %s -> %s: %v", pair[0], pair[1], err)
			}
			buf := make([]byte, 65536)
			for got < segs {
				_ = rx.SetReadDeadline(time.Now().Add(time.Second))
				n, _, err := rx.ReadFrom(buf)
				if err != nil {
					break
				}
				if n != seg {
					t.Fatalf("datagram of %d bytes, want %d", n, seg)
				}
				got++
			}
		}
		if got < segs {
			dumpCounters(t, w)
			t.Errorf("%s -> %s: %d of %d GSO datagrams arrived", pair[0], pair[1], got, segs)
		}
		tx.Close()
		rx.Close()
	}
}

// TestPodAttachment: a pod's programs are tc filters on both directions
// of its host interface, listed as attached; detached, they are gone from
// an interface that stays, and from the list.
func TestPodAttachment(t *testing.T) {
	w := newWorld(t, 1)
	n1 := w.nodes[0]
	w.addNetwork(7, "10.70.0.0/16", "fd00:70::/48", false)
	p := w.addPod("a", n1, 7, 2)
	b := w.addPod("b", n1, 7, 3)
	w.open(7)
	filters := func(dir string) string {
		out, err := exec.Command("ip", "netns", "exec", n1.ns, "tc", "filter", "show", "dev", p.hostIf, dir).CombinedOutput()
		if err != nil {
			t.Fatalf("tc filter show %s: %v\n%s", dir, err, out)
		}
		return string(out)
	}
	listed := func() bool {
		l, err := n1.dp.PinnedPodLinks()
		must(t, err)
		return slices.Contains(l, p.hostIf)
	}
	if !strings.Contains(filters("ingress"), "lace-from-pod") || !strings.Contains(filters("egress"), "lace-to-pod") || !listed() {
		t.Fatalf("after AttachPod: ingress %q, egress %q, listed %v", filters("ingress"), filters("egress"), listed())
	}
	// Attaching again (a new agent) replaces the programs in place.
	must(t, n1.dp.AttachPod(netutil.Path(n1.ns), p.hostIf, false))
	if got := strings.Count(filters("ingress"), "lace-from-pod"); got != 1 {
		t.Errorf("after a second AttachPod: %d from_pod filters, want 1", got)
	}
	if got, err := b.dialTCP(p.v4); err != nil || got != "a" {
		t.Errorf("b -> a after re-attach: %q %v", got, err)
	}
	must(t, n1.dp.DetachPod(p.hostIf))
	if f := filters("ingress") + filters("egress"); strings.Contains(f, "lace-") || listed() {
		t.Errorf("after DetachPod: filters %q, listed %v", f, listed())
	}
}

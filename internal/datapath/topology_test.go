package datapath_test

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"net/netip"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/lace-cni/lace/internal/datapath"
	"github.com/lace-cni/lace/internal/netutil"
)

// TestPolicyIsDirectionalAndRepliesReturn: with a view 7 -> 8 only, pods of
// network 7 open TCP, UDP and ICMP flows to a pod of 8 on the same node and
// across nodes, and the replies come back through conntrack; the pod of 8
// opening anything toward 7 is dropped and counted as isolated. Network 9
// overlaps 7 (same subnets) and is also granted 8: the replies to each go
// back in the right network's context.
func TestPolicyIsDirectionalAndRepliesReturn(t *testing.T) {
	w := newWorld(t, 2)
	n1, n2 := w.nodes[0], w.nodes[1]
	w.addNetwork(7, "10.70.0.0/16", "fd00:70::/48", false)
	w.addNetwork(8, "10.80.0.0/16", "fd00:80::/48", false)
	w.addNetwork(9, "10.70.0.0/16", "fd00:70::/48", false)
	a := w.addPod("a", n1, 7, 2)
	c := w.addPod("c", n2, 8, 2)
	x := w.addPod("x", n2, 9, 5) // same node as c
	y := w.addPod("y", n1, 9, 5) // overlaps a's subnet, another address
	w.grant(7, 8)
	w.grant(9, 8)

	for _, from := range []*pod{a, x, y} {
		for _, dst := range []netip.Addr{c.v4, c.v6} {
			if got, err := from.dialTCP(dst); err != nil || got != "c" {
				t.Errorf("TCP %s -> c (%s): %q %v", from.name, dst, got, err)
			}
			if got, err := from.dialUDP(dst); err != nil || got != "c" {
				t.Errorf("UDP %s -> c (%s): %q %v", from.name, dst, got, err)
			}
			if err := from.ping(dst); err != nil {
				t.Errorf("ICMP %s -> c: %v", from.name, err)
			}
		}
	}
	// Both ends tracked a's flow: n1 as opened by a toward network 8, n2
	// as opened by network 7 toward c.
	expectFlow(t, n1, func(f datapath.Flow) bool {
		return f.NetID == 7 && f.Local.Addr() == a.v4 && f.Remote.Addr() == c.v4 && f.OpenedLocally && f.PeerNet == 8 && f.SeenReply
	}, "a's flow to c on n1")
	expectFlow(t, n2, func(f datapath.Flow) bool {
		return f.NetID == 8 && f.Local.Addr() == c.v4 && f.Remote.Addr() == a.v4 && !f.OpenedLocally && f.PeerNet == 7
	}, "a's flow to c on n2")
	expectFlow(t, n2, func(f datapath.Flow) bool {
		return f.NetID == 8 && f.Local.Addr() == c.v4 && f.Remote.Addr() == y.v4 && !f.OpenedLocally && f.PeerNet == 9
	}, "y's flow to c on n2, in network 9's context")

	// The reverse direction opens nothing, on one node or across.
	for _, tc := range []struct {
		to  *pod
		dst netip.Addr
	}{{a, a.v4}, {a, a.v6}, {x, x.v4}, {y, y.v6}} {
		expectDropped(t, n2, "isolated", fmt.Sprintf("TCP c -> %s (%s)", tc.to.name, tc.dst), func() error {
			got, err := c.dialTCP(tc.dst)
			if err == nil {
				return fmt.Errorf("connected (answered %q)", got)
			}
			return err
		})
	}
}

// TestTCPStateTimeouts: an open TCP flow is tracked as established (long
// timeout); once both sides have closed it, its entry expires within the
// short close timeout.
func TestTCPStateTimeouts(t *testing.T) {
	w := newWorld(t, 2)
	n1 := w.nodes[0]
	w.addNetwork(7, "10.70.0.0/16", "fd00:70::/48", false)
	a := w.addPod("a", n1, 7, 2)
	c := w.addPod("c", w.nodes[1], 7, 2)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	conn, err := netutil.DialContext(ctx, netutil.Path(a.ns), "tcp", netip.AddrPortFrom(c.v4, 7).String())
	must(t, err)
	if _, err := bufio.NewReader(conn).ReadString('\n'); err != nil {
		t.Fatal(err)
	}
	isFlow := func(f datapath.Flow) bool {
		return f.Proto == 6 && f.Local.Addr() == a.v4 && f.Remote == netip.AddrPortFrom(c.v4, 7)
	}
	established := expectFlow(t, n1, isFlow, "open TCP flow")
	if left := time.Duration(established.ExpiresMonotonicNanos - monotonic(t)); left < time.Hour {
		t.Errorf("established flow expires in %s, want the established timeout (hours)", left)
	}
	conn.Close() // the server closes back when its copy sees EOF
	deadline := time.Now().Add(5 * time.Second)
	for {
		f := expectFlow(t, n1, isFlow, "closing TCP flow")
		if f.FinLocal && f.FinRemote {
			if left := time.Duration(f.ExpiresMonotonicNanos - monotonic(t)); left > 10*time.Second {
				t.Errorf("closed flow expires in %s, want at most 10s", left)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("flow never saw FIN from both sides: %+v", f)
		}
		// Polling the map for the FINs the kernel is sending now.
		time.Sleep(50 * time.Millisecond)
	}
}

// TestExternalNetworks: an external network classifies the fabric host; a
// pod whose view holds it reaches the host with the node's address as
// source (SNAT, reversed for the replies), a pod whose view does not is
// dropped; the host reaches pods of a network whose view it holds on any
// node (entering at n1, delivered there or encapsulated to n2) with its
// own address preserved, and nothing else; a source no external prefix
// covers is dropped as unclassified.
func TestExternalNetworks(t *testing.T) {
	w := newWorld(t, 2)
	n1, n2 := w.nodes[0], w.nodes[1]
	for _, n := range w.nodes {
		must(t, netutil.Sysctl(netutil.Path(n.ns), "net.ipv4.ip_forward", "1"))
	}
	w.addNetwork(7, "10.70.0.0/16", "fd00:70::/48", false)
	w.addNetwork(8, "10.80.0.0/16", "fd00:80::/48", false)
	a := w.addPod("a", n1, 7, 2)
	b := w.addPod("b", n2, 7, 2)
	c := w.addPod("c", n2, 8, 2)
	ext := w.addExternalHost(n1, netip.MustParsePrefix("10.0.0.0/8"), netip.MustParsePrefix("fd00::/16"))
	world4, world6 := netip.MustParsePrefix("172.31.0.0/24"), netip.MustParsePrefix("fd00:99::/64")
	w.addExternal(100, world4, world6)
	w.grantExternal(7, 100, world4, world6)
	w.grant(100, 7)

	// The host says who it sees.
	serveClientAddr(t, ext.ns, netip.AddrPortFrom(ext.v4, 8), "")
	serveClientAddr(t, ext.ns, netip.AddrPortFrom(ext.v6, 8), "")
	for _, tc := range []struct {
		from *pod
		dst  netip.Addr
		want netip.Addr
	}{{a, ext.v4, n1.v4}, {a, ext.v6, n1.v6}, {b, ext.v4, n2.v4}, {b, ext.v6, n2.v6}} {
		got, err := dialPort(tc.from, tc.dst, 8)
		if err != nil || got != tc.want.String() {
			t.Errorf("TCP %s -> external %s: seen as %q (%v), want the node's %s", tc.from.name, tc.dst, got, err, tc.want)
		}
		if got, err := tc.from.dialUDP(tc.dst); err != nil || got != "ext" {
			t.Errorf("UDP %s -> external %s: %q %v", tc.from.name, tc.dst, got, err)
		}
		if err := tc.from.ping(tc.dst); err != nil {
			t.Errorf("ICMP %s -> external: %v", tc.from.name, err)
		}
	}
	expectFlow(t, n1, func(f datapath.Flow) bool {
		return f.Local.Addr() == a.v4 && f.Remote.Addr() == ext.v4 && f.SNATPort >= 61000 && f.PeerNet == 100
	}, "a's SNAT flow")
	// The host's port unreachable about a translated datagram reaches the
	// pod's socket, translated back: connection refused at once.
	for _, dst := range []netip.Addr{ext.v4, ext.v6} {
		if err := udpRefused(a, netip.AddrPortFrom(dst, 9)); err != nil {
			t.Errorf("UDP a -> external %s:9 (closed): %v, want connection refused", dst, err)
		}
	}
	// Network 8 does not reach the external network.
	expectDropped(t, n2, "isolated", "TCP c -> external", func() error {
		got, err := c.dialTCP(ext.v4)
		if err == nil {
			return fmt.Errorf("connected (answered %q)", got)
		}
		return err
	})

	// The host reaches network 7's pods on both nodes, its source kept.
	for _, tc := range []struct {
		to  *pod
		dst netip.Addr
	}{{a, a.v4}, {a, a.v6}, {b, b.v4}, {b, b.v6}} {
		if got, err := ext.dialTCP(tc.dst); err != nil || got != tc.to.name {
			t.Errorf("TCP external -> %s (%s): %q %v", tc.to.name, tc.dst, got, err)
		}
		if got, err := ext.dialUDP(tc.dst); err != nil || got != tc.to.name {
			t.Errorf("UDP external -> %s (%s): %q %v", tc.to.name, tc.dst, got, err)
		}
	}
	serveClientAddr(t, b.ns, netip.AddrPortFrom(b.v4, 8), "")
	if got, err := dialPort(ext, b.v4, 8); err != nil || got != ext.v4.String() {
		t.Errorf("external -> b: b saw %q (%v), want the external address %s", got, err, ext.v4)
	}
	// ... and not network 8's.
	expectDropped(t, n1, "isolated", "TCP external -> c", func() error {
		got, err := ext.dialTCP(c.v4)
		if err == nil {
			return fmt.Errorf("connected (answered %q)", got)
		}
		return err
	})
	// A source no external prefix covers gets nowhere.
	for _, n := range w.nodes {
		must(t, n.dp.DeleteClassifier(world4))
	}
	expectDropped(t, n1, "unclassified-source", "TCP unclassified external -> a", func() error {
		got, err := ext.dialTCP(a.v4)
		if err == nil {
			return fmt.Errorf("connected (answered %q)", got)
		}
		return err
	})
}

// udpRefused sends a datagram from p to a closed port and expects the
// ICMP port unreachable to surface as connection refused.
func udpRefused(p *pod, dst netip.AddrPort) error {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	c, err := netutil.DialContext(ctx, netutil.Path(p.ns), "udp", dst.String())
	if err != nil {
		return err
	}
	defer c.Close()
	buf := make([]byte, 64)
	for range 3 {
		_ = c.SetDeadline(time.Now().Add(500 * time.Millisecond))
		if _, err := c.Write([]byte("hi")); err != nil {
			if errors.Is(err, unix.ECONNREFUSED) {
				return nil
			}
			return err
		}
		_, err := c.Read(buf)
		if errors.Is(err, unix.ECONNREFUSED) {
			return nil
		}
		if err == nil {
			return fmt.Errorf("answered")
		}
	}
	return fmt.Errorf("no ICMP error reached the socket")
}

// dialPort connects from p to dst:port and returns the first line.
func dialPort(p *pod, dst netip.Addr, port uint16) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	c, err := netutil.DialContext(ctx, netutil.Path(p.ns), "tcp", netip.AddrPortFrom(dst, port).String())
	if err != nil {
		return "", err
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(2 * time.Second))
	line, err := bufio.NewReader(c).ReadString('\n')
	return strings.TrimSpace(line), err
}

// expectFlow returns the conntrack entry of node n that match selects,
// failing the test when there is none.
func expectFlow(t *testing.T, n *node, match func(datapath.Flow) bool, what string) datapath.Flow {
	t.Helper()
	flows, err := n.dp.Conntrack()
	must(t, err)
	for _, f := range flows {
		if match(f) {
			return f
		}
	}
	t.Fatalf("%s: no such conntrack entry on %s among %d: %+v", what, n.name, len(flows), flows)
	return datapath.Flow{}
}

func monotonic(t *testing.T) uint64 {
	var ts unix.Timespec
	must(t, unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts))
	return uint64(ts.Nano())
}

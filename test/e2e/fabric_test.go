package e2e

import (
	"context"
	"encoding/binary"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os/exec"
	"strings"
	"testing"
	"time"

	lacev1 "github.com/lace-cni/lace/api/v1alpha1"
	"github.com/lace-cni/lace/internal/datapath"
	"github.com/lace-cni/lace/internal/netutil"
	"github.com/lace-cni/lace/lab"
	"github.com/vishvananda/netlink"
)

// TestFabricEntersOnlyWherePolicyAllows: the lab's external host (on the
// fabric, classified into the shipped world network) routes the pod
// prefixes of the default network and of an isolated one via n1. It
// reaches the default pod (world -> default) with its own address as
// source; toward the isolated network its TCP SYNs, UDP and ICMP never
// arrive in the pod (captured inside it), TCP times out rather than being
// refused, and n1 counts each as isolated. SRv6 forged to n1's SID of the
// default network is refused as coming from no node.
func TestFabricEntersOnlyWherePolicyAllows(t *testing.T) {
	needLab(t)
	c := laceClient(t)
	ctx := context.Background()
	network(t, c, "fenced", "10.91.0.0/16", "fd00:91::/48", false)
	open := netPod(t, "inj-default", "default", "n1", true)
	fenced := netPod(t, "inj-fenced", "fenced", "n1", true)

	cfg := labConfig()
	ext := netutil.Path(cfg.NetNS("external"))
	n1v4, n1v6 := lab.NodeUnderlay(1)
	extV4, extV6 := lab.ExternalUnderlay()
	// More specific than the lab's routes over every node: everything
	// enters at n1, whose counters are read.
	for _, r := range []struct {
		dst string
		via netip.Addr
	}{
		{"10.244.0.0/16", n1v4}, {"10.91.0.0/16", n1v4}, {"fd00:244::/56", n1v6}, {"fd00:91::/48", n1v6},
		{"fd1a:ce::/48", n1v6}, // the nodes' locators, to forge SRv6
	} {
		dst := netip.MustParsePrefix(r.dst)
		if err := netutil.EnsureRoute(ext, dst, r.via, "eth0"); err != nil {
			t.Fatal(err)
		}
		defer func() { _ = netutil.DeleteRoute(ext, dst, "eth0") }()
	}

	// world -> default: the external host reaches the default pod, which
	// sees the external host's own address.
	ov4, ov6 := podAddrs(open)
	for _, dst := range []netip.Addr{ov4, ov6} {
		eventually(t, 20*time.Second, fmt.Sprintf("external host -> %s (%s)", open.Name, dst), func() error {
			body, err := httpFrom(ctx, ext, dst, "/clientip")
			if err != nil {
				return err
			}
			host, _, err := net.SplitHostPort(body)
			if err != nil {
				return fmt.Errorf("clientip %q: %w", body, err)
			}
			if want := map[bool]netip.Addr{true: extV4, false: extV6}[dst.Is4()]; host != want.String() {
				return fmt.Errorf("the pod saw %s, want the external host's %s", host, want)
			}
			return nil
		})
		if out, err := exec.Command("ip", "netns", "exec", cfg.NetNS("external"), "ping", "-c", "1", "-W", "2", dst.String()).CombinedOutput(); err != nil {
			t.Errorf("ping from the external host to %s: %v\n%s", dst, err, out)
		}
	}

	var uep lacev1.UnderlayEndpoint
	if err := c.Get(ctx, crKey("n1"), &uep); err != nil {
		t.Fatal(err)
	}
	var def lacev1.Network
	if err := c.Get(ctx, crKey("default"), &def); err != nil {
		t.Fatal(err)
	}
	id := uint32(def.Status.ID)
	sid := datapath.SID(netip.MustParsePrefix(string(uep.Spec.Locator)), datapath.BehaviourL3Decap, id, id)

	before := nodeDrops(t, "n1")
	sent := 0
	fv4, fv6 := podAddrs(fenced)
	frames, err := netutil.Capture(podNetNS(t, fenced), "eth0", func() {
		for _, dst := range []netip.Addr{fv4, fv6} {
			// TCP: a SYN that is dropped times out; a refused one would
			// mean it arrived somewhere.
			dctx, cancel := context.WithTimeout(ctx, 1500*time.Millisecond)
			conn, err := netutil.DialContext(dctx, ext, "tcp", net.JoinHostPort(dst.String(), "8080"))
			cancel()
			if err == nil {
				conn.Close()
				t.Errorf("TCP from the external host reached %s at %s", fenced.Name, dst)
			} else if !isTimeout(err) {
				t.Errorf("TCP to %s at %s: %v, want a timeout (dropped, not refused)", fenced.Name, dst, err)
			}
			sent++ // at least the SYN
			u, err := netutil.DialContext(ctx, ext, "udp", net.JoinHostPort(dst.String(), "8081"))
			if err != nil {
				t.Fatal(err)
			}
			for range 3 {
				if _, err := u.Write([]byte("hostname")); err != nil {
					t.Fatal(err)
				}
				sent++
			}
			u.Close()
			if out, err := exec.Command("ip", "netns", "exec", cfg.NetNS("external"), "ping", "-c", "2", "-i", "0.2", "-W", "1", dst.String()).CombinedOutput(); err == nil {
				t.Errorf("ping from the external host answered by %s at %s:\n%s", fenced.Name, dst, out)
			}
			sent += 2
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range frames {
		if fromHost(f, extV4, extV6) {
			t.Errorf("a frame from the external host arrived in %s: % x", fenced.Name, f[:min(len(f), 64)])
		}
	}
	// Forged SRv6 toward the default pod never arrives.
	frames, err = netutil.Capture(podNetNS(t, open), "eth0", func() { forgeSRv6(t, ext, sid, extV4, ov4) })
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range frames {
		if fromHost(f, extV4, extV6) {
			t.Errorf("a forged SRv6 packet was delivered to %s: % x", open.Name, f[:min(len(f), 64)])
		}
	}

	// The counters are the node's pinned per-CPU maps, read at once.
	after := nodeDrops(t, "n1")
	if got := after["isolated"] - before["isolated"]; got < uint64(sent) {
		t.Errorf("n1 counted %d packets isolated, want at least the %d sent", got, sent)
	}
	if got := after["decap-unknown-source"] - before["decap-unknown-source"]; got < 3 {
		t.Errorf("n1 counted %d forged SRv6 packets as decap-unknown-source, want 3", got)
	}
}

// httpFrom sends GET path to netexec at dst:8080 from the namespace at
// nsPath and returns the body.
func httpFrom(ctx context.Context, nsPath string, dst netip.Addr, path string) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	conn, err := netutil.DialContext(ctx, nsPath, "tcp", net.JoinHostPort(dst.String(), "8080"))
	if err != nil {
		return "", err
	}
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(2 * time.Second))
	fmt.Fprintf(conn, "GET %s HTTP/1.0\r\nHost: e2e\r\n\r\n", path)
	b, err := io.ReadAll(conn)
	if err != nil {
		return "", err
	}
	_, body, _ := strings.Cut(string(b), "\r\n\r\n")
	return strings.TrimSpace(body), nil
}

// forgeSRv6 sends three SRv6 packets (reduced encapsulation: IPv6 to the
// SID, next header IPIP) from the external host, each carrying a UDP
// datagram to the pod at dst.
func forgeSRv6(t *testing.T, ext string, sid, src, dst netip.Addr) {
	t.Helper()
	var pc net.PacketConn
	err := netutil.Do(ext, func() error {
		var err error
		pc, err = net.ListenPacket("ip6:4", "::") // IPPROTO_IPIP over IPv6
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	defer pc.Close()
	inner := make([]byte, 20+8+8)
	inner[0], inner[8], inner[9] = 0x45, 64, 17
	binary.BigEndian.PutUint16(inner[2:4], uint16(len(inner)))
	s, d := src.As4(), dst.As4()
	copy(inner[12:16], s[:])
	copy(inner[16:20], d[:])
	binary.BigEndian.PutUint16(inner[20:22], 4000)
	binary.BigEndian.PutUint16(inner[22:24], 8081)
	binary.BigEndian.PutUint16(inner[24:26], 16)
	for range 3 {
		if _, err := pc.WriteTo(inner, &net.IPAddr{IP: sid.AsSlice()}); err != nil {
			t.Fatalf("forge SRv6 to %s: %v", sid, err)
		}
	}
}

// fromHost tells whether an Ethernet frame carries an IP packet from
// either of the host's addresses (inner headers included would show the
// same source at the same offsets only after decapsulation).
func fromHost(f []byte, v4, v6 netip.Addr) bool {
	if len(f) < 14 {
		return false
	}
	switch binary.BigEndian.Uint16(f[12:14]) {
	case 0x0800:
		return len(f) >= 30 && netip.AddrFrom4([4]byte(f[26:30])) == v4
	case 0x86dd:
		return len(f) >= 38 && netip.AddrFrom16([16]byte(f[22:38])) == v6
	}
	return false
}

// TestNextHopsKeptResolved: on every node, the next hop of each of Lace's
// underlay routes (the other nodes) is a managed neighbour the kernel
// keeps resolved, whether or not anything was sent there: the data
// plane's FIB lookups read the neighbour table only.
func TestNextHopsKeptResolved(t *testing.T) {
	needLab(t)
	for _, node := range []string{"n1", "n2", "n3"} {
		ns := netutil.Path(labConfig().NetNS(node))
		routes, err := netutil.OwnedRoutes(ns)
		if err != nil {
			t.Fatal(err)
		}
		hops := map[netip.Addr]bool{}
		for _, via := range routes {
			hops[via] = true
		}
		if len(hops) < 2 {
			t.Fatalf("%s: Lace's underlay routes %v name %d next hops, want the 2 other nodes", node, routes, len(hops))
		}
		eventually(t, 20*time.Second, node+": every next hop managed and resolved", func() error {
			h, err := netutil.Handle(ns)
			if err != nil {
				return err
			}
			defer h.Close()
			l, err := h.LinkByName("eth0")
			if err != nil {
				return err
			}
			list, err := h.NeighList(l.Attrs().Index, netlink.FAMILY_ALL)
			if err != nil {
				return err
			}
			for hop := range hops {
				var found *netlink.Neigh
				for i := range list {
					if a, ok := netip.AddrFromSlice(list[i].IP); ok && a.Unmap() == hop {
						found = &list[i]
					}
				}
				if found == nil || found.FlagsExt&netlink.NTF_EXT_MANAGED == 0 || len(found.HardwareAddr) != 6 {
					return fmt.Errorf("next hop %s: %+v, want a managed entry with its MAC", hop, found)
				}
			}
			return nil
		})
	}
}

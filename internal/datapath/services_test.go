package datapath_test

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/lace-cni/lace/internal/datapath"
	"github.com/lace-cni/lace/internal/netutil"
	"github.com/lace-cni/lace/internal/tables"
)

// serveVIP puts a service VIP into the view of network view (as the model
// does for the service's own network, its peers and ServiceRoutingPolicy
// sources) on every node, and the service on every node.
func (w *world) serve(view uint32, svcs ...datapath.Service) {
	for _, n := range w.nodes {
		for _, s := range svcs {
			bits := 32
			if s.VIP.Is6() {
				bits = 128
			}
			must(w.t, n.dp.UpsertRoute(datapath.Route{NetID: view, Prefix: netip.PrefixFrom(s.VIP, bits), Kind: tables.RouteService, DstNet: s.NetID}))
		}
		gone, err := n.dp.ApplyServices(svcs)
		must(w.t, err)
		_, err = n.dp.FlushServiceFlows(gone)
		must(w.t, err)
	}
}

func tcpSvc(vip string, port uint16, net uint32, backends ...datapath.Backend) datapath.Service {
	return datapath.Service{VIP: netip.MustParseAddr(vip), Proto: 6, Port: port, NetID: net, Backends: backends}
}

func udpSvc(vip string, port uint16, net uint32, backends ...datapath.Backend) datapath.Service {
	s := tcpSvc(vip, port, net, backends...)
	s.Proto = 17
	return s
}

func be(a netip.Addr) datapath.Backend { return datapath.Backend{Addr: a, Port: 7} }

// TestClusterIP: a VIP per family, TCP and UDP, translated per packet to a
// random endpoint on this node or another, replies coming back from the
// VIP (a connected UDP socket accepts nothing else); a service without
// endpoints refuses at once; one whose endpoints are not eligible here
// drops; an endpoint that goes away takes its flows with it, so the same
// UDP socket reaches the remaining one; another network reaches the VIP
// only when its view holds it, and never the endpoints directly; an
// outside endpoint is reached with SNAT.
func TestClusterIP(t *testing.T) {
	w := newWorld(t, 2)
	n1, n2 := w.nodes[0], w.nodes[1]
	for _, n := range w.nodes {
		must(t, netutil.Sysctl(netutil.Path(n.ns), "net.ipv4.ip_forward", "1"))
	}
	w.addNetwork(7, "10.70.0.0/16", "fd00:70::/48", false)
	w.addNetwork(8, "10.80.0.0/16", "fd00:80::/48", false)
	a := w.addPod("a", n1, 7, 2)
	b := w.addPod("b", n2, 7, 2)
	c := w.addPod("c", n1, 7, 3)
	x := w.addPod("x", n2, 8, 2)
	ext := w.addExternalHost(n1, netip.MustParsePrefix("10.0.0.0/8"), netip.MustParsePrefix("fd00::/16"))
	world4, world6 := netip.MustParsePrefix("172.31.0.0/24"), netip.MustParsePrefix("fd00:99::/64")
	w.addExternal(100, world4, world6)
	w.grantExternal(7, 100, world4, world6)

	web4 := tcpSvc("10.96.0.10", 80, 7, be(b.v4), be(c.v4))
	web6 := tcpSvc("fd00:96::10", 80, 7, be(b.v6), be(c.v6))
	dns4 := udpSvc("10.96.0.10", 53, 7, be(b.v4))
	dns6 := udpSvc("fd00:96::10", 53, 7, be(b.v6))
	empty := tcpSvc("10.96.0.11", 80, 7)
	emptyU := udpSvc("fd00:96::11", 53, 7)
	local := tcpSvc("10.96.0.12", 80, 7)
	local.Drop = true
	outside := tcpSvc("10.96.0.13", 443, 7, be(ext.v4))
	sticky := tcpSvc("10.96.0.15", 80, 7, be(b.v4), be(c.v4))
	sticky.AffinitySeconds = 60
	self4 := tcpSvc("10.96.0.14", 80, 7, be(a.v4))
	self6 := tcpSvc("fd00:96::14", 80, 7, be(a.v6))
	// Endpoints at n1's own addresses, as hostNetwork pods on n1 are.
	host4 := tcpSvc("10.96.0.16", 80, 7, be(n1.v4))
	host6 := tcpSvc("fd00:96::16", 80, 7, be(n1.v6))
	hostU := udpSvc("10.96.0.16", 53, 7, be(n1.v4))
	(&pod{name: "n1", ns: n1.ns, v4: n1.v4, v6: n1.v6}).serve(t)
	all := []datapath.Service{web4, web6, dns4, dns6, empty, emptyU, local, outside, self4, self6, host4, host6, hostU, sticky}
	w.serve(7, all...)

	for _, vip := range []netip.Addr{web4.VIP, web6.VIP} {
		seen := map[string]int{}
		for range 24 {
			got, err := dialPort(a, vip, 80)
			if err != nil {
				d1, _ := n1.dp.Drops()
				d2, _ := n2.dp.Drops()
				f1, _ := n1.dp.Forwarded()
				f2, _ := n2.dp.Forwarded()
				t.Fatalf("TCP a -> %s:80: %v\n%v\n%v\n%v\n%v", vip, err, nz(d1), nz(d2), nz(f1), nz(f2))
			}
			seen[got]++
		}
		if seen["b"] == 0 || seen["c"] == 0 || len(seen) != 2 {
			t.Errorf("TCP a -> %s:80 over 24 connections answered by %v, want both b and c", vip, seen)
		}
	}
	for _, vip := range []netip.Addr{dns4.VIP, dns6.VIP} {
		if got, err := dialUDPPort(a, netip.AddrPortFrom(vip, 53)); err != nil || got != "b" {
			t.Errorf("UDP a -> %s:53: %q %v, want b answering from the VIP", vip, got, err)
		}
	}
	expectFlow(t, n1, func(f datapath.Flow) bool {
		return f.Service && f.Remote == netip.AddrPortFrom(dns4.VIP, 53) && f.NAT == netip.AddrPortFrom(b.v4, 7)
	}, "a's flow to the DNS VIP")

	// An answered connection keeps its endpoint for the flow's life, not
	// the 60 s of an unanswered SYN (the client's entry sees no answer
	// itself: it takes the translated flow's state).
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	held, err := netutil.DialContext(ctx, netutil.Path(a.ns), "tcp", netip.AddrPortFrom(web4.VIP, 80).String())
	must(t, err)
	defer held.Close()
	_ = held.SetDeadline(time.Now().Add(2 * time.Second))
	rd := bufio.NewReader(held)
	_, err = rd.ReadString('\n')
	must(t, err)
	_, err = held.Write([]byte("x\n"))
	must(t, err)
	_, err = rd.ReadString('\n')
	must(t, err)
	heldPort := held.LocalAddr().(*net.TCPAddr).AddrPort().Port()
	f := expectFlow(t, n1, func(f datapath.Flow) bool {
		return f.Service && f.Local.Port() == heldPort && f.Remote == netip.AddrPortFrom(web4.VIP, 80)
	}, "a's held connection to the web VIP")
	var ts unix.Timespec
	must(t, unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts))
	if left := time.Duration(f.ExpiresMonotonicNanos - uint64(ts.Nano())); !f.SeenReply || left < time.Hour {
		t.Errorf("client entry of an answered connection: seen reply %v, expires in %v; want established (hours)", f.SeenReply, left)
	}

	// No endpoints: refused at once, TCP and UDP.
	if _, err := dialPort(a, empty.VIP, 80); !errors.Is(err, unix.ECONNREFUSED) {
		t.Errorf("TCP to a service without endpoints: %v, want connection refused", err)
	}
	if err := udpRefused(a, netip.AddrPortFrom(emptyU.VIP, 53)); err != nil {
		t.Errorf("UDP to a service without endpoints: %v", err)
	}
	// Endpoints exist but none is eligible here: dropped.
	expectDropped(t, n1, "no-local-endpoints", "TCP to a service without local endpoints", func() error {
		_, err := dialPort(a, local.VIP, 80)
		return err
	})

	// The endpoint behind a UDP flow goes away: the same socket reaches
	// the one that remains.
	conn := udpConn(t, a, netip.AddrPortFrom(dns4.VIP, 53))
	if got := askUDP(t, conn); got != "b" {
		t.Fatalf("UDP flow answered by %q, want b", got)
	}
	dns4.Backends = []datapath.Backend{be(c.v4)}
	all[2] = dns4
	w.serve(7, all...)
	if got := askUDP(t, conn); got != "c" {
		t.Errorf("after b left the service, the same UDP socket was answered by %q, want c", got)
	}

	// Network 8 does not reach the VIP until its view holds it (as a
	// ServiceRoutingPolicy grants), and never the endpoints themselves.
	expectDropped(t, n2, "isolated", "TCP x -> VIP without a grant", func() error {
		_, err := dialPort(x, web4.VIP, 80)
		return err
	})
	w.serve(8, all...)
	if got, err := dialPort(x, web4.VIP, 80); err != nil || (got != "b" && got != "c") {
		t.Errorf("TCP x -> VIP with a grant: %q %v", got, err)
	}
	expectDropped(t, n2, "isolated", "TCP x -> b directly", func() error {
		_, err := dialPort(x, b.v4, 7)
		return err
	})

	// ClientIP affinity: every connection of a client goes to one
	// endpoint; when it leaves the service, the client moves.
	first, err := dialPort(a, sticky.VIP, 80)
	if err != nil {
		t.Fatal(err)
	}
	for range 10 {
		if got, err := dialPort(a, sticky.VIP, 80); err != nil || got != first {
			t.Fatalf("affinity: answered by %q (%v), want %s every time", got, err, first)
		}
	}
	stay := map[string]datapath.Backend{"b": be(c.v4), "c": be(b.v4)}[first]
	sticky.Backends = []datapath.Backend{stay}
	all[len(all)-1] = sticky
	w.serve(7, all...)
	if got, err := dialPort(a, sticky.VIP, 80); err != nil || got == first {
		t.Errorf("affinity after %s left: answered by %q (%v), want the other endpoint", first, got, err)
	}

	// Hairpin: a pod reaching itself through its service.
	for _, vip := range []netip.Addr{self4.VIP, self6.VIP} {
		if got, err := dialPort(a, vip, 80); err != nil || got != "a" {
			t.Errorf("hairpin a -> %s -> a: %q %v", vip, got, err)
		}
	}

	// An endpoint at the node's own address, from a pod on that node (the
	// node's stack answers; to_pod restores the VIP) and from another.
	for _, p := range []*pod{a, b} {
		for _, vip := range []netip.Addr{host4.VIP, host6.VIP} {
			if got, err := dialPort(p, vip, 80); err != nil || got != "n1" {
				t.Errorf("TCP %s -> %s -> n1's own address: %q %v", p.name, vip, got, err)
			}
		}
		if got, err := dialUDPPort(p, netip.AddrPortFrom(hostU.VIP, 53)); err != nil || got != "n1" {
			t.Errorf("UDP %s -> %s -> n1's own address: %q %v, want n1 answering from the VIP", p.name, hostU.VIP, got, err)
		}
	}

	// An outside endpoint (as the kubernetes Service's API server).
	if got, err := dialPort(a, outside.VIP, 443); err != nil || got != "ext" {
		t.Errorf("TCP a -> VIP of an outside endpoint: %q %v", got, err)
	}
}

func dialUDPPort(p *pod, dst netip.AddrPort) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	c, err := netutil.DialContext(ctx, netutil.Path(p.ns), "udp", dst.String())
	if err != nil {
		return "", err
	}
	defer c.Close()
	buf := make([]byte, 256)
	for range 3 {
		_ = c.SetDeadline(time.Now().Add(700 * time.Millisecond))
		if _, err := c.Write([]byte("hi")); err != nil {
			return "", err
		}
		if n, err := c.Read(buf); err == nil {
			return string(buf[:n]), nil
		}
	}
	return "", fmt.Errorf("no UDP answer from %s", dst)
}

type udpClient struct {
	c interface {
		Write([]byte) (int, error)
		Read([]byte) (int, error)
		SetDeadline(time.Time) error
		Close() error
	}
}

func udpConn(t *testing.T, p *pod, dst netip.AddrPort) udpClient {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	c, err := netutil.DialContext(ctx, netutil.Path(p.ns), "udp", dst.String())
	must(t, err)
	t.Cleanup(func() { c.Close() })
	return udpClient{c}
}

func askUDP(t *testing.T, u udpClient) string {
	t.Helper()
	buf := make([]byte, 256)
	for range 3 {
		_ = u.c.SetDeadline(time.Now().Add(700 * time.Millisecond))
		if _, err := u.c.Write([]byte("hi")); err != nil {
			t.Fatalf("send: %v", err)
		}
		if n, err := u.c.Read(buf); err == nil {
			return string(buf[:n])
		}
	}
	return ""
}

func nz(m map[string]uint64) map[string]uint64 {
	out := map[string]uint64{}
	for k, v := range m {
		if v != 0 {
			out[k] = v
		}
	}
	return out
}

// TestHostSocketsReachServices: a process of the node itself (in the
// node's cgroup and network namespace) reaches a ClusterIP over TCP and
// UDP through connect-time translation, to an endpoint on its own node or
// on another (its packets then cross the fabric as plain IP from the node
// address, admitted by the endpoint's node through the view of the
// network the node address classifies into). A process in the same cgroup
// but another network namespace (a pod) is left alone by the hooks.
func TestHostSocketsReachServices(t *testing.T) {
	w := newWorld(t, 2)
	n1, n2 := w.nodes[0], w.nodes[1]
	for _, n := range w.nodes {
		must(t, netutil.Sysctl(netutil.Path(n.ns), "net.ipv4.ip_forward", "1"))
	}
	w.addNetwork(7, "10.70.0.0/16", "fd00:70::/48", false)
	b := w.addPod("b", n2, 7, 2)
	world4, world6 := netip.MustParsePrefix("172.31.0.0/24"), netip.MustParsePrefix("fd00:99::/64")
	w.addExternal(100, world4, world6)
	w.grant(100, 7) // the nodes' addresses reach network 7's pods
	svc := tcpSvc("10.96.0.20", 80, 7, be(b.v4))
	svcU := udpSvc("10.96.0.20", 53, 7, be(b.v4))
	svc6 := tcpSvc("fd00:96::20", 80, 7, be(b.v6))
	none := tcpSvc("10.96.0.21", 80, 7)
	none6 := tcpSvc("fd00:96::21", 80, 7)
	w.serve(100, svc, svcU, svc6, none, none6)
	cg := filepath.Join("/sys/fs/cgroup/unified", w.prefix+"-"+n1.name)
	must(t, os.Mkdir(cg, 0o755))
	t.Cleanup(func() { _ = os.Remove(cg) })
	cookie, err := datapath.NetNSCookie(netutil.Path(n1.ns))
	must(t, err)
	cfg, err := n1.dp.Config()
	must(t, err)
	cfg.HostNetNS, cfg.HostNet4, cfg.HostNet6 = cookie, 100, 100
	must(t, n1.dp.SetConfig(cfg))
	must(t, n1.dp.AttachHostSockets(cg))
	// n1's host stack routes network 7's blocks on n2 over the fabric.
	for _, p := range []netip.Prefix{block(netip.MustParsePrefix("10.70.0.0/16"), 2), block(netip.MustParsePrefix("fd00:70::/48"), 2)} {
		via := n2.v6
		if p.Addr().Is4() {
			via = n2.v4
		}
		must(t, netutil.EnsureRoute(netutil.Path(n1.ns), p, via, "eth0"))
	}
	run := func(ns string, args ...string) (string, error) {
		script := fmt.Sprintf("echo $$ > %s/cgroup.procs && exec ip netns exec %s busybox nc %s", cg, ns, strings.Join(args, " "))
		out, err := exec.Command("sh", "-c", script).CombinedOutput()
		return strings.TrimSpace(string(out)), err
	}
	for _, vip := range []string{"10.96.0.20", "fd00:96::20"} {
		if out, err := run(n1.ns, "-w", "2", vip, "80"); err != nil || !strings.HasPrefix(out, "b") {
			t.Errorf("node process -> %s:80: %q %v, want b", vip, out, err)
		}
	}
	// No endpoints: refused at once, as kube-proxy's ICMP port
	// unreachable makes it (not EPERM).
	for _, vip := range []string{"10.96.0.21", "fd00:96::21"} {
		if out, err := run(n1.ns, "-w", "2", vip, "80"); err == nil || !strings.Contains(out, "refused") {
			t.Errorf("node process -> %s:80 without endpoints: %q %v, want connection refused", vip, out, err)
		}
	}
	// UDP through an unconnected socket (sendmsg and recvmsg hooks): the
	// answer comes from the VIP.
	udp := exec.Command("sh", "-c", fmt.Sprintf("echo $$ > %s/cgroup.procs && exec ip netns exec %s %s -test.run='^TestUDPClientHelper$'", cg, n1.ns, os.Args[0]))
	udp.Env = append(os.Environ(), "LACE_UDP_HELPER=10.96.0.20:53")
	if out, _ := udp.CombinedOutput(); !strings.Contains(string(out), "answer b from 10.96.0.20:53") {
		dump, _ := exec.Command("bpftool", "map", "dump", "pinned", filepath.Join(n1.pinDir, "lace_sock_rnat")).CombinedOutput()
		t.Errorf("node process -> 10.96.0.20:53/UDP: %s, want answer b from the VIP\n%s", out, dump)
	}
	// A pod's socket in the same cgroup is not translated by the hooks.
	p := w.addPod("p", n1, 7, 5)
	if out, err := run(p.ns, "-w", "1", "10.96.0.20", "80"); err == nil && strings.HasPrefix(out, "b") {
		t.Errorf("a pod socket in the node's cgroup was translated by the host hooks (its view does not hold the VIP): %q", out)
	}
}

// TestUDPClientHelper is run by TestHostSocketsReachServices in another
// process (inside a cgroup and a network namespace): it sends one datagram
// with an unconnected socket to $LACE_UDP_HELPER and prints the answer and
// where it came from.
func TestUDPClientHelper(t *testing.T) {
	dst := os.Getenv("LACE_UDP_HELPER")
	if dst == "" {
		t.Skip("run by TestHostSocketsReachServices")
	}
	pc, err := net.ListenPacket("udp", ":0")
	must(t, err)
	defer pc.Close()
	to, err := net.ResolveUDPAddr("udp", dst)
	must(t, err)
	buf := make([]byte, 256)
	for range 3 {
		_, _ = pc.WriteTo([]byte("hi"), to)
		_ = pc.SetDeadline(time.Now().Add(700 * time.Millisecond))
		n, from, err := pc.ReadFrom(buf)
		if err == nil {
			fmt.Printf("answer %s from %s\n", buf[:n], from)
			return
		}
	}
	t.Fatal("no answer")
}

// TestPodHairpinSeesItself: a pod reaching itself through its service
// sees its own address as the client's, both families: its sockets pass
// the socket hooks (its namespace's cookie on its port), which point the
// connection at the pod's own address. Of a service with another
// endpoint, both are used. A socket the hooks do not see (the test's own,
// outside the cgroup) still hairpins per packet, from the VIP.
func TestPodHairpinSeesItself(t *testing.T) {
	w := newWorld(t, 1)
	n1 := w.nodes[0]
	w.addNetwork(7, "10.70.0.0/16", "fd00:70::/48", false)
	a := w.addPod("a", n1, 7, 2)
	b := w.addPod("b", n1, 7, 3)
	cg := hookPod(t, a)

	// Port 9 of a answers with the client's address.
	for _, ad := range []netip.Addr{a.v4, a.v6} {
		serveClientAddr(t, a.ns, netip.AddrPortFrom(ad, 9), "")
	}
	self4 := tcpSvc("10.96.0.30", 80, 7, datapath.Backend{Addr: a.v4, Port: 9})
	self6 := tcpSvc("fd00:96::30", 80, 7, datapath.Backend{Addr: a.v6, Port: 9})
	both := tcpSvc("10.96.0.31", 80, 7, be(a.v4), be(b.v4))
	w.serve(7, self4, self6, both)

	inPod := func(vip netip.Addr, port uint16) (string, error) {
		script := fmt.Sprintf("echo $$ > %s/cgroup.procs && exec ip netns exec %s busybox nc -w 2 %s %d", cg, a.ns, vip, port)
		out, err := exec.Command("sh", "-c", script).CombinedOutput()
		return strings.TrimSpace(string(out)), err
	}
	for _, c := range []struct{ vip, self netip.Addr }{{self4.VIP, a.v4}, {self6.VIP, a.v6}} {
		if got, err := inPod(c.vip, 80); err != nil || got != c.self.String() {
			t.Errorf("a -> %s:80 -> a (socket hooks): the server saw %q (%v), want a's own %s", c.vip, got, err, c.self)
		}
		if got, err := dialPort(a, c.vip, 80); err != nil || got != c.vip.String() {
			t.Errorf("a -> %s:80 -> a (per packet): the server saw %q (%v), want the VIP", c.vip, got, err)
		}
	}
	seen := map[string]int{}
	for range 30 {
		got, err := inPod(both.VIP, 80)
		if err != nil {
			t.Fatalf("a -> %s:80: %q %v", both.VIP, got, err)
		}
		seen[strings.Fields(got + " ?")[0]]++
	}
	if seen["a"] == 0 || seen["b"] == 0 || len(seen) != 2 {
		t.Errorf("a -> %s:80 over 30 connections answered by %v, want both a and b", both.VIP, seen)
	}
}

// TestServiceOverlapIsNotHairpin: a client whose address is also the
// address of a service's endpoint in another (overlapping) network is not
// that endpoint: neither per packet nor through the socket hooks is its
// flow through the VIP turned back to itself. (The endpoint cannot answer
// either: its kernel drops a packet from its own address, as it would
// without a service; only the wrong answer is what this test excludes.)
func TestServiceOverlapIsNotHairpin(t *testing.T) {
	w := newWorld(t, 1)
	n1 := w.nodes[0]
	w.addNetwork(7, "10.70.0.0/16", "fd00:70::/48", false)
	w.addNetwork(9, "10.70.0.0/16", "fd00:70::/48", false)
	a := w.addPod("a", n1, 7, 2)
	z := w.addPod("z", n1, 9, 2)
	if a.v4 != z.v4 {
		t.Fatalf("a %s and z %s should share an address", a.v4, z.v4)
	}
	cg := hookPod(t, a)

	// A service of network 9 whose endpoint is z, reached from network 7
	// (a ServiceRoutingPolicy's grant).
	svc := tcpSvc("10.96.0.40", 80, 9, be(z.v4))
	w.serve(7, svc)
	w.serve(9, svc)
	before, err := n1.dp.Forwarded()
	must(t, err)
	if got, _ := dialPort(a, svc.VIP, 80); got == "a" {
		t.Errorf("a -> %s (per packet): answered by a itself, want z's flow", svc.VIP)
	}
	after, err := n1.dp.Forwarded()
	must(t, err)
	if after["local"] <= before["local"] {
		t.Errorf("a -> %s (per packet): nothing delivered (local %d -> %d), want the flow sent to z", svc.VIP, before["local"], after["local"])
	}
	script := fmt.Sprintf("echo $$ > %s/cgroup.procs && exec ip netns exec %s busybox nc -w 1 %s 80", cg, a.ns, svc.VIP)
	out, _ := exec.Command("sh", "-c", script).CombinedOutput()
	if got := strings.TrimSpace(string(out)); got == "a" {
		t.Errorf("a -> %s (socket hooks): answered by a itself, want z's flow", svc.VIP)
	}
}

// hookPod attaches the socket hooks to a new cgroup of p's node (whose
// namespace becomes the host's) and records p's namespace on its port, as
// the agent does at ADD: processes in the returned cgroup are p's sockets
// the hooks see.
func hookPod(t *testing.T, p *pod) string {
	n := p.node
	cg := filepath.Join("/sys/fs/cgroup/unified", n.w.prefix+"-"+n.name)
	must(t, os.Mkdir(cg, 0o755))
	t.Cleanup(func() { _ = os.Remove(cg) })
	hostNS, err := datapath.NetNSCookie(netutil.Path(n.ns))
	must(t, err)
	cfg, err := n.dp.Config()
	must(t, err)
	cfg.HostNetNS = hostNS
	must(t, n.dp.SetConfig(cfg))
	must(t, n.dp.AttachHostSockets(cg))
	podNS, err := datapath.NetNSCookie(netutil.Path(p.ns))
	must(t, err)
	hostIf, err := netutil.GetLink(netutil.Path(n.ns), p.hostIf)
	must(t, err)
	must(t, n.dp.UpsertPort(datapath.Port{IfIndex: uint32(hostIf.Index), NetID: p.netID, V4: p.v4, V6: p.v6, NetNSCookie: podNS}))
	return cg
}

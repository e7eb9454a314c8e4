package e2e

import (
	"bufio"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	lacev1 "github.com/lace-cni/lace/api/v1alpha1"
	"github.com/lace-cni/lace/internal/datapath"
	"github.com/lace-cni/lace/internal/netutil"
	"github.com/lace-cni/lace/lab"
)

// The isolation boundaries of docs/security.md sections 4, 5 and 8, as a
// tenant or a host on the fabric would attack them.

// rawSend sends whole IP packets (headers included) to dst from the
// namespace at nsPath, as a forger with CAP_NET_RAW does.
func rawSend(t *testing.T, nsPath string, dst netip.Addr, pkts ...[]byte) {
	t.Helper()
	fam := unix.AF_INET
	if dst.Is6() {
		fam = unix.AF_INET6
	}
	var fd int
	if err := netutil.Do(nsPath, func() error {
		var err error
		fd, err = unix.Socket(fam, unix.SOCK_RAW, unix.IPPROTO_RAW)
		return err
	}); err != nil {
		t.Fatalf("raw socket: %v", err)
	}
	defer unix.Close(fd)
	for _, p := range pkts {
		var sa unix.Sockaddr
		if dst.Is4() {
			sa = &unix.SockaddrInet4{Addr: dst.As4()}
		} else {
			sa = &unix.SockaddrInet6{Addr: dst.As16()}
		}
		if err := unix.Sendto(fd, p, 0, sa); err != nil {
			t.Fatalf("send a forged packet to %s: %v", dst, err)
		}
	}
}

// ip4Packet builds an IPv4 packet with a valid L4 checksum (TCP, UDP;
// ICMP carries its own).
func ip4Packet(src, dst netip.Addr, proto byte, l4 []byte) []byte {
	b := make([]byte, 20, 20+len(l4))
	b[0], b[8], b[9] = 0x45, 64, proto
	binary.BigEndian.PutUint16(b[2:4], uint16(20+len(l4)))
	s, d := src.As4(), dst.As4()
	copy(b[12:16], s[:])
	copy(b[16:20], d[:])
	if proto == 6 || proto == 17 {
		pseudo := append(append(append([]byte{}, s[:]...), d[:]...), 0, proto, byte(len(l4)>>8), byte(len(l4)))
		off := map[byte]int{6: 16, 17: 6}[proto]
		l4[off], l4[off+1] = 0, 0
		binary.BigEndian.PutUint16(l4[off:], icmpChecksum(append(pseudo, l4...)))
	}
	binary.BigEndian.PutUint16(b[10:12], icmpChecksum(b[:20]))
	return append(b, l4...)
}

func tcpSegment(sport, dport uint16, flags byte, seq uint32) []byte {
	b := make([]byte, 20)
	binary.BigEndian.PutUint16(b[0:2], sport)
	binary.BigEndian.PutUint16(b[2:4], dport)
	binary.BigEndian.PutUint32(b[4:8], seq)
	b[12], b[13] = 5<<4, flags
	binary.BigEndian.PutUint16(b[14:16], 64240)
	return b
}

func udpDatagram(sport, dport uint16, payload string) []byte {
	b := make([]byte, 8, 8+len(payload))
	binary.BigEndian.PutUint16(b[0:2], sport)
	binary.BigEndian.PutUint16(b[2:4], dport)
	binary.BigEndian.PutUint16(b[4:6], uint16(8+len(payload)))
	return append(b, payload...)
}

// keepAliveGet sends GET /hostname on an open HTTP/1.1 connection and
// returns the body.
func keepAliveGet(conn net.Conn, br *bufio.Reader) (string, error) {
	_ = conn.SetDeadline(time.Now().Add(3 * time.Second))
	if _, err := fmt.Fprintf(conn, "GET /hostname HTTP/1.1\r\nHost: e2e\r\n\r\n"); err != nil {
		return "", err
	}
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return strings.TrimSpace(string(b)), err
}

// TestSpoofedOutsideSourceBreaksNoFlow: while a pod on n2 holds a TCP
// connection to a pod on n1, the external host sends n1 packets with the
// client pod's address and port as source (RSTs, SYNs, UDP): n1 drops
// them all as outside-spoofed-source, and the connection keeps working.
// Before, they passed as the world network's, and a RST then a SYN gave
// the flow's conntrack entry to the world network: the server's answers
// were then dropped as isolated.
func TestSpoofedOutsideSourceBreaksNoFlow(t *testing.T) {
	needLab(t)
	ctx := context.Background()
	srv := netPod(t, "spoof-srv", "default", "n1", true)
	cli := netPod(t, "spoof-cli", "default", "n2", true)
	srvV4, _ := podAddrs(srv)
	cliV4, _ := podAddrs(cli)
	ext := externalNS()
	n1v4, _ := lab.NodeUnderlay(1)
	// The forger's packets to the server enter at n1, the server's node.
	host := netip.PrefixFrom(srvV4, 32)
	if err := netutil.EnsureRoute(ext, host, n1v4, "eth0"); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = netutil.DeleteRoute(ext, host, "eth0") }()

	conn, err := netutil.DialContext(ctx, podNetNS(t, cli), "tcp", net.JoinHostPort(srvV4.String(), "8080"))
	if err != nil {
		t.Fatalf("client pod -> server pod: %v", err)
	}
	defer conn.Close()
	br := bufio.NewReader(conn)
	if body, err := keepAliveGet(conn, br); err != nil || body != srv.Name {
		t.Fatalf("first request: %q %v", body, err)
	}
	lport := uint16(conn.LocalAddr().(*net.TCPAddr).Port)

	before := nodeDrops(t, "n1")
	var forged [][]byte
	for i := range 3 {
		forged = append(forged,
			ip4Packet(cliV4, srvV4, 6, tcpSegment(lport, 8080, 0x04, uint32(i)*7919)),   // RST
			ip4Packet(cliV4, srvV4, 6, tcpSegment(lport, 8080, 0x02, uint32(i)*104729)), // SYN
			ip4Packet(cliV4, srvV4, 17, udpDatagram(lport, 8081, "hostname")))
	}
	rawSend(t, ext, srvV4, forged...)

	// The stream goes on, on the same connection.
	for i := range 5 {
		if body, err := keepAliveGet(conn, br); err != nil || body != srv.Name {
			t.Fatalf("request %d after the spoofed packets: %q %v (the flow broke)", i, body, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
	after := nodeDrops(t, "n1")
	if got := after["outside-spoofed-source"] - before["outside-spoofed-source"]; got < uint64(len(forged)) {
		t.Errorf("n1 counted %d packets as outside-spoofed-source, want the %d forged", got, len(forged))
	}
}

// icmp4Unreach is an ICMP port unreachable quoting quote.
func icmp4Unreach(quote []byte) []byte {
	b := append([]byte{3, 3, 0, 0, 0, 0, 0, 0}, quote...)
	binary.BigEndian.PutUint16(b[2:4], icmpChecksum(b))
	return b
}

// sendICMP sends ICMP message msg to dst from the namespace at nsPath (the
// kernel adds the IP header, from the pod's address).
func sendICMP(t *testing.T, nsPath string, dst netip.Addr, msg []byte) {
	t.Helper()
	var pc net.PacketConn
	if err := netutil.Do(nsPath, func() error {
		var err error
		pc, err = net.ListenPacket("ip4:icmp", "0.0.0.0")
		return err
	}); err != nil {
		t.Fatal(err)
	}
	defer pc.Close()
	if _, err := pc.WriteTo(msg, &net.IPAddr{IP: dst.AsSlice()}); err != nil {
		t.Fatalf("send ICMP to %s: %v", dst, err)
	}
}

// icmpFrom tells whether an Ethernet frame is an ICMP message from src.
func icmpFrom(f []byte, src netip.Addr) bool {
	return len(f) >= 34 && binary.BigEndian.Uint16(f[12:14]) == 0x0800 && f[23] == 1 &&
		netip.AddrFrom4([4]byte(f[26:30])) == src
}

// udpFlowFrom opens a UDP flow from the namespace at nsPath to netexec at
// dst:8081, waits for its answer and speaks once more, so the flow is
// assured (held 120 s, not the few seconds of an unanswered one); it
// returns the local port.
func udpFlowFrom(t *testing.T, nsPath string, dst netip.Addr) uint16 {
	t.Helper()
	u, err := netutil.DialContext(context.Background(), nsPath, "udp", net.JoinHostPort(dst.String(), "8081"))
	if err != nil {
		t.Fatal(err)
	}
	defer u.Close()
	eventually(t, 20*time.Second, "UDP flow to "+dst.String(), func() error {
		if _, err := u.Write([]byte("hostname")); err != nil {
			return err
		}
		_ = u.SetReadDeadline(time.Now().Add(time.Second))
		buf := make([]byte, 256)
		_, err := u.Read(buf)
		return err
	})
	if _, err := u.Write([]byte("hostname")); err != nil {
		t.Fatal(err)
	}
	return uint16(u.LocalAddr().(*net.UDPAddr).Port)
}

// TestICMPErrorsIsolated: network iso-q has no route out; the world and
// network iso-o may open flows to its pods. Its pod A sends ICMP errors
// (raw socket in its namespace): quoting the external host's flow to
// another pod Q of its network, to the external host; quoting iso-o's
// flow to Q, to iso-o's pod; quoting flows that never were. Nothing
// arrives (captured in the external host and in iso-o's pod), and n1
// counts each as icmp-error-no-flow. An error about A's own flow from the
// external host does reach it.
func TestICMPErrorsIsolated(t *testing.T) {
	needLab(t)
	c := laceClient(t)
	network(t, c, "iso-q", "10.121.0.0/16", "fd00:121::/48", false)
	network(t, c, "iso-o", "10.122.0.0/16", "fd00:122::/48", false)
	labelNetwork(t, c, "iso-q", map[string]string{"e2e-iso": "q"})
	labelNetwork(t, c, "iso-o", map[string]string{"e2e-iso": "o"})
	routingPolicy(t, c, "e2e-world-to-iso-q", map[string]string{"lace-cni.io/network": "world"}, map[string]string{"e2e-iso": "q"})
	routingPolicy(t, c, "e2e-iso-o-to-iso-q", map[string]string{"e2e-iso": "o"}, map[string]string{"e2e-iso": "q"})
	a := netPod(t, "icmp-a", "iso-q", "n1", true)
	q := netPod(t, "icmp-q", "iso-q", "n1", true)
	o := netPod(t, "icmp-o", "iso-o", "n2", true)
	aV4, _ := podAddrs(a)
	qV4, _ := podAddrs(q)
	oV4, _ := podAddrs(o)
	ext := externalNS()
	extV4, _ := lab.ExternalUnderlay()
	n1v4, _ := lab.NodeUnderlay(1)
	for _, dst := range []netip.Addr{aV4, qV4} {
		host := netip.PrefixFrom(dst, 32)
		if err := netutil.EnsureRoute(ext, host, n1v4, "eth0"); err != nil {
			t.Fatal(err)
		}
		defer func() { _ = netutil.DeleteRoute(ext, host, "eth0") }()
	}
	// Flows the isolated network's pods hold: the external host's and
	// iso-o's to Q, the external host's to A.
	extToQ := udpFlowFrom(t, ext, qV4)
	oToQ := udpFlowFrom(t, podNetNS(t, o), qV4)
	extToA := udpFlowFrom(t, ext, aV4)

	quote := func(src netip.Addr, sport uint16, dst netip.Addr) []byte {
		return ip4Packet(src, dst, 17, udpDatagram(sport, 8081, "hostname"))[:28]
	}
	aNS := podNetNS(t, a)
	before := nodeDrops(t, "n1")
	forged := []struct {
		to    netip.Addr
		quote []byte
	}{
		{extV4, quote(extV4, extToQ, qV4)}, // another pod's flow, out of the network
		{oV4, quote(oV4, oToQ, qV4)},       // another pod's flow, into another network
		{extV4, quote(extV4, 4444, aV4)},   // a flow that never was
		{oV4, quote(oV4, 4445, aV4)},       // a flow that never was, into another network
		{oV4, quote(extV4, extToA, aV4)},   // its own flow, to somebody else
	}
	capture := func(ns, ifName string, f func()) [][]byte {
		frames, err := netutil.Capture(ns, ifName, f)
		if err != nil {
			t.Fatal(err)
		}
		return frames
	}
	var oFrames [][]byte
	extFrames := capture(ext, "eth0", func() {
		oFrames = capture(podNetNS(t, o), "eth0", func() {
			for _, f := range forged {
				sendICMP(t, aNS, f.to, icmp4Unreach(f.quote))
			}
			time.Sleep(500 * time.Millisecond)
		})
	})
	for _, f := range append(extFrames, oFrames...) {
		if icmpFrom(f, aV4) {
			t.Errorf("an ICMP error from the isolated pod arrived: % x", f[:min(len(f), 64)])
		}
	}
	after := nodeDrops(t, "n1")
	if got := after["icmp-error-no-flow"] - before["icmp-error-no-flow"]; got < uint64(len(forged)) {
		t.Errorf("n1 counted %d ICMP errors as icmp-error-no-flow, want the %d sent", got, len(forged))
	}

	// About its own flow, to its peer: delivered (the capture sees it).
	extFrames = capture(ext, "eth0", func() {
		sendICMP(t, aNS, extV4, icmp4Unreach(quote(extV4, extToA, aV4)))
		time.Sleep(500 * time.Millisecond)
	})
	seen := false
	for _, f := range extFrames {
		seen = seen || icmpFrom(f, aV4)
	}
	if !seen {
		t.Error("the pod's ICMP error about the external host's own flow to it never arrived")
	}
}

// TestForgedSRv6FromNode: a process on n1 (what a hostNetwork pod with
// CAP_NET_RAW can do) forges SRv6 toward n3's SID of the default network,
// with n2's underlay address as outer source, and with n1's own, and the
// same behind three VLAN tags: n1's to_underlay drops them all
// (node-forged-underlay) and nothing reaches the pod on n3. Before, n3
// took n2's packet for n2's and delivered it, and a third tag passed
// n1's check unread.
func TestForgedSRv6FromNode(t *testing.T) {
	needLab(t)
	c := laceClient(t)
	ctx := context.Background()
	target := netPod(t, "forge-target", "default", "n3", true)
	tV4, _ := podAddrs(target)
	var uep lacev1.UnderlayEndpoint
	if err := c.Get(ctx, crKey("n3"), &uep); err != nil {
		t.Fatal(err)
	}
	var def lacev1.Network
	if err := c.Get(ctx, crKey("default"), &def); err != nil {
		t.Fatal(err)
	}
	id := uint32(def.Status.ID)
	sid := datapath.SID(netip.MustParsePrefix(string(uep.Spec.Locator)), datapath.BehaviourL3Decap, id, id)
	_, n1v6 := lab.NodeUnderlay(1)
	_, n2v6 := lab.NodeUnderlay(2)
	n1 := netutil.Path(labConfig().NetNS("n1"))
	forgedSrc := netip.MustParseAddr("192.0.2.77")

	srv6 := func(outer netip.Addr) []byte {
		inner := ip4Packet(forgedSrc, tV4, 17, udpDatagram(4000, 8081, "hostname"))
		b := make([]byte, 40, 40+len(inner))
		b[0], b[6], b[7] = 0x60, 4, 64
		binary.BigEndian.PutUint16(b[4:6], uint16(len(inner)))
		s, d := outer.As16(), sid.As16()
		copy(b[8:24], s[:])
		copy(b[24:40], d[:])
		return append(b, inner...)
	}
	// The same SRv6 from n2's address behind three VLAN tags (802.1ad,
	// 802.1Q, 802.1Q), sent as raw frames: to_underlay reads two tags, and
	// a frame still tagged after them is refused, not passed unread.
	tagged := func(pkt []byte) []byte {
		f := []byte{0x02, 0, 0, 0, 0x17, 0x03, 0x02, 0, 0, 0, 0x17, 0x01}
		for _, tpid := range []uint16{0x88a8, 0x8100, 0x8100} {
			f = binary.BigEndian.AppendUint16(f, tpid)
			f = append(f, 0, 0)
		}
		return append(binary.BigEndian.AppendUint16(f, 0x86dd), pkt...)
	}
	before := nodeDrops(t, "n1")
	frames, err := netutil.Capture(podNetNS(t, target), "eth0", func() {
		rawSend(t, n1, sid, srv6(n2v6), srv6(n2v6), srv6(n2v6), srv6(n1v6))
		for range 2 {
			// A frame the egress program drops fails the send with
			// ENOBUFS; the counter below says what happened to it.
			if err := netutil.SendFrames(n1, "eth0", [][]byte{tagged(srv6(n2v6))}); err != nil && !errors.Is(err, unix.ENOBUFS) {
				t.Fatal(err)
			}
		}
		time.Sleep(500 * time.Millisecond)
	})
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range frames {
		if len(f) >= 34 && binary.BigEndian.Uint16(f[12:14]) == 0x0800 && netip.AddrFrom4([4]byte(f[26:30])) == forgedSrc {
			t.Errorf("forged SRv6 from n1 was delivered to the pod on n3: % x", f[:min(len(f), 64)])
		}
	}
	after := nodeDrops(t, "n1")
	if got := after["node-forged-underlay"] - before["node-forged-underlay"]; got < 6 {
		t.Errorf("n1 counted %d forged packets as node-forged-underlay, want the 6 sent (4 plain, 2 behind three VLAN tags)", got)
	}
}

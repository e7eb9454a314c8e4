package datapath

import (
	"crypto/rand"
	"encoding/binary"
	"encoding/hex"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"testing"

	"github.com/cilium/ebpf"

	"github.com/lace-cni/lace/internal/netutil"
	"github.com/lace-cni/lace/internal/tables"
	"github.com/lace-cni/lace/internal/testutil"
)

// The BPF_PROG_RUN tier: the programs run on crafted packets, without
// namespaces or interfaces, so every branch is reached on purpose and its
// verdict and counter checked.

// tc verdicts, as the kernel returns them from a test run.
const (
	actOK       = 0
	actShot     = 2
	actRedirect = 7
)

var (
	progNodeV4  = netip.MustParseAddr("172.31.0.1")
	progNodeV6  = netip.MustParseAddr("fd00:99::1")
	progPeerV6  = netip.MustParseAddr("fd00:99::2")
	progLocator = netip.MustParsePrefix("fd1a:ce:0:1::/64")
	progOther   = netip.MustParsePrefix("fd1a:ce:0:2::/64") // another node's locator
	progPodV4   = netip.MustParseAddr("10.70.1.2")
	progPodV6   = netip.MustParseAddr("fd00:70:0:1::2")
	progNet     = uint32(7)
)

// progDatapath loads the programs with fresh maps in a temporary bpffs and
// programs one node with one pod (network 7) and one peer node.
func progDatapath(t *testing.T) *Datapath {
	t.Helper()
	testutil.NeedRoot(t, "BPF_PROG_RUN")
	suffix := make([]byte, 3)
	_, _ = rand.Read(suffix)
	dir := filepath.Join(os.TempDir(), "lprog"+hex.EncodeToString(suffix))
	if err := netutil.EnsureBPFFS(dir); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = netutil.UnmountBPFFS(dir) })
	d, err := Load(filepath.Join(dir, "node"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { d.Close() })
	mac := net.HardwareAddr{2, 0, 0, 0, 0, 1}
	for _, err := range []error{
		d.SetConfig(Config{UnderlayIP: progNodeV6, Locator: progLocator, UnderlayIfIndex: 1, GuardUnderlay: true}),
		d.UpsertHostAddr(progNodeV4), d.UpsertHostAddr(progNodeV6),
		d.UpsertNode(progNodeV6), d.UpsertNode(progPeerV6),
		d.UpsertNetwork(Network{ID: progNet}),
		d.UpsertEndpoint(Endpoint{NetID: progNet, Addr: progPodV4, IfIndex: 1, PodMAC: mac, HostMAC: mac}),
		d.UpsertEndpoint(Endpoint{NetID: progNet, Addr: progPodV6, IfIndex: 1, PodMAC: mac, HostMAC: mac}),
	} {
		if err != nil {
			t.Fatal(err)
		}
	}
	return d
}

// Packet builders. Checksums are left zero: no branch under test reads them.

func ether(dst net.HardwareAddr, proto uint16, payload []byte) []byte {
	b := make([]byte, 14, 14+len(payload))
	copy(b[0:6], dst)
	copy(b[6:12], net.HardwareAddr{2, 0, 0, 0, 0, 0xee})
	binary.BigEndian.PutUint16(b[12:14], proto)
	return append(b, payload...)
}

// unicastMAC is the node's own: BPF_PROG_RUN receives a frame on the
// loopback device, whose MAC is all zeros, and a frame sent to any other
// is another host's (from_underlay serves none of its IP).
var unicastMAC = net.HardwareAddr{0, 0, 0, 0, 0, 0}

// otherMAC is another host's: the kernel marks a frame to it
// PACKET_OTHERHOST.
var otherMAC = net.HardwareAddr{2, 0, 0, 0, 0, 0xbb}

func ipv4(src, dst netip.Addr, proto byte, payload []byte) []byte {
	b := make([]byte, 20, 20+len(payload))
	b[0], b[8], b[9] = 0x45, 64, proto
	binary.BigEndian.PutUint16(b[2:4], uint16(20+len(payload)))
	s, d := src.As4(), dst.As4()
	copy(b[12:16], s[:])
	copy(b[16:20], d[:])
	return append(b, payload...)
}

func ipv6(src, dst netip.Addr, next byte, payload []byte) []byte {
	b := make([]byte, 40, 40+len(payload))
	b[0], b[6], b[7] = 0x60, next, 64
	binary.BigEndian.PutUint16(b[4:6], uint16(len(payload)))
	s, d := src.As16(), dst.As16()
	copy(b[8:24], s[:])
	copy(b[24:40], d[:])
	return append(b, payload...)
}

func udp(sport, dport uint16) []byte {
	b := make([]byte, 8+4)
	binary.BigEndian.PutUint16(b[0:2], sport)
	binary.BigEndian.PutUint16(b[2:4], dport)
	binary.BigEndian.PutUint16(b[4:6], uint16(len(b)))
	return b
}

func tcpSYN(sport, dport uint16) []byte {
	b := make([]byte, 20)
	binary.BigEndian.PutUint16(b[0:2], sport)
	binary.BigEndian.PutUint16(b[2:4], dport)
	b[12], b[13] = 5<<4, 0x02
	return b
}

func icmpEcho(v6 bool) []byte {
	if v6 {
		return []byte{128, 0, 0, 0, 0, 1, 0, 1}
	}
	return []byte{8, 0, 0, 0, 0, 1, 0, 1}
}

// srv6 wraps an inner IP packet for network netID on this node, from src.
func srv6(src, dst netip.Addr, inner []byte, v4inner bool) []byte {
	next := byte(41)
	if v4inner {
		next = 4
	}
	return ether(unicastMAC, 0x86dd, ipv6(src, dst, next, inner))
}

func runProg(t *testing.T, p *ebpf.Program, pkt []byte) uint32 {
	t.Helper()
	// The kernel wants at least an Ethernet header and pads nothing.
	ret, err := p.Run(&ebpf.RunOptions{Data: pkt})
	if err != nil {
		t.Fatalf("BPF_PROG_RUN: %v", err)
	}
	return ret
}

// onlyDrop runs f and checks that the drop counter reason (none when
// empty) moved by exactly one and no other did.
func onlyDrop(t *testing.T, d *Datapath, reason string, f func()) {
	t.Helper()
	before, err := d.Drops()
	if err != nil {
		t.Fatal(err)
	}
	f()
	after, err := d.Drops()
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range DropReasons {
		want := before[r]
		if r == reason {
			want++
		}
		if after[r] != want {
			t.Errorf("drop counter %s went %d -> %d, want %d", r, before[r], after[r], want)
		}
	}
}

func TestProgUnderlay(t *testing.T) {
	d := progDatapath(t)
	ext4, ext6 := netip.MustParseAddr("172.31.0.200"), netip.MustParseAddr("fd00:99::c8")
	mySID := SID(progLocator, BehaviourL3Decap, progNet, progNet)
	inner4 := ipv4(netip.MustParseAddr("10.70.2.2"), progPodV4, 17, udp(1000, 7))
	inner6 := ipv6(netip.MustParseAddr("fd00:70:0:2::2"), progPodV6, 17, udp(1000, 7))
	arp := ether(net.HardwareAddr{0xff, 0xff, 0xff, 0xff, 0xff, 0xff}, 0x0806, make([]byte, 28))

	fragment := append([]byte{4, 0, 0, 0, 0, 0, 0, 1}, inner4...) // next header IPIP
	hopByHop := append([]byte{4, 0, 1, 4, 0, 0, 0, 0}, inner4...)
	cases := []struct {
		name   string
		pkt    []byte
		want   uint32
		reason string // drop counter that must move by one, or "" for none
	}{
		// Plain IP from a source no external network covers: nothing
		// enters a pod so, and the node forwards nothing.
		{"plain UDP to a pod", ether(unicastMAC, 0x0800, ipv4(ext4, progPodV4, 17, udp(999, 7))), actShot, "unclassified-source"},
		{"plain TCP SYN to a pod", ether(unicastMAC, 0x0800, ipv4(ext4, progPodV4, 6, tcpSYN(999, 7))), actShot, "unclassified-source"},
		{"plain ICMP echo to a pod", ether(unicastMAC, 0x0800, ipv4(ext4, progPodV4, 1, icmpEcho(false))), actShot, "unclassified-source"},
		{"plain IPv6 UDP to a pod", ether(unicastMAC, 0x86dd, ipv6(ext6, progPodV6, 17, udp(999, 7))), actShot, "unclassified-source"},
		{"plain ICMPv6 echo to a pod", ether(unicastMAC, 0x86dd, ipv6(ext6, progPodV6, 58, icmpEcho(true))), actShot, "unclassified-source"},
		{"SRv6 to another node's SID", srv6(progPeerV6, SID(progOther, BehaviourL3Decap, progNet, progNet), inner4, true), actShot, "unclassified-source"},
		// The node's own traffic passes to its stack.
		{"IPv4 to the node", ether(unicastMAC, 0x0800, ipv4(ext4, progNodeV4, 6, tcpSYN(999, 10250))), actOK, ""},
		{"IPv6 to the node", ether(unicastMAC, 0x86dd, ipv6(ext6, progNodeV6, 6, tcpSYN(999, 10250))), actOK, ""},
		{"neighbour solicitation", ether(net.HardwareAddr{0x33, 0x33, 0xff, 0, 0, 1}, 0x86dd,
			ipv6(netip.MustParseAddr("fe80::1"), netip.MustParseAddr("ff02::1:ff00:1"), 58, []byte{135, 0, 0, 0})), actOK, ""},
		{"link-local unicast", ether(unicastMAC, 0x86dd, ipv6(netip.MustParseAddr("fe80::1"), netip.MustParseAddr("fe80::2"), 58, icmpEcho(true))), actOK, ""},
		{"IPv4 broadcast", ether(net.HardwareAddr{0xff, 0xff, 0xff, 0xff, 0xff, 0xff}, 0x0800,
			ipv4(ext4, netip.MustParseAddr("172.31.0.255"), 17, udp(68, 67))), actOK, ""},
		{"ARP", arp, actOK, ""},
		// SRv6 to this node: only well-formed packets from nodes.
		{"SRv6 IPv4 from a node", srv6(progPeerV6, mySID, inner4, true), actRedirect, ""},
		{"SRv6 IPv6 from a node", srv6(progPeerV6, mySID, inner6, false), actRedirect, ""},
		{"SRv6 from the external host", srv6(ext6, mySID, inner4, true), actShot, "decap-unknown-source"},
		{"SRv6 to an unknown network", srv6(progPeerV6, SID(progLocator, BehaviourL3Decap, progNet, 99), inner4, true), actShot, "decap-unknown-sid"},
		{"SRv6 with an unknown behaviour", srv6(progPeerV6, SID(progLocator, 9, progNet, progNet), inner4, true), actShot, "decap-unknown-sid"},
		{"SRv6 to a pod that is not here", srv6(progPeerV6, mySID,
			ipv4(netip.MustParseAddr("10.70.2.2"), netip.MustParseAddr("10.70.1.99"), 17, udp(1, 7)), true), actShot, "no-endpoint"},
		{"SRv6 carrying TCP", ether(unicastMAC, 0x86dd, ipv6(progPeerV6, mySID, 6, tcpSYN(1, 7))), actShot, "decap-bad-protocol"},
		{"SRv6 fragment", ether(unicastMAC, 0x86dd, ipv6(progPeerV6, mySID, 44, fragment)), actShot, "decap-fragment"},
		{"SRv6 with hop-by-hop options", ether(unicastMAC, 0x86dd, ipv6(progPeerV6, mySID, 0, hopByHop)), actShot, "decap-extension-header"},
		{"SRv6 truncated inner header", srv6(progPeerV6, mySID, inner4[:12], true), actShot, "decap-truncated"},
		// Sent to another MAC (a switch flooded it): nothing is served or
		// forwarded; what is addressed to the node is the kernel's (an
		// upper device with that MAC takes it, else the kernel drops it).
		{"another MAC: plain IP to a pod", ether(otherMAC, 0x0800, ipv4(ext4, progPodV4, 17, udp(999, 7))), actShot, "other-host"},
		{"another MAC: IPv6 to a pod", ether(otherMAC, 0x86dd, ipv6(ext6, progPodV6, 17, udp(999, 7))), actShot, "other-host"},
		{"another MAC: SRv6 from a node", ether(otherMAC, 0x86dd, ipv6(progPeerV6, mySID, 4, inner4)), actShot, "other-host"},
		{"another MAC: IPv4 to the node", ether(otherMAC, 0x0800, ipv4(ext4, progNodeV4, 6, tcpSYN(999, 10250))), actOK, ""},
		{"another MAC: IPv6 to the node", ether(otherMAC, 0x86dd, ipv6(ext6, progNodeV6, 6, tcpSYN(999, 10250))), actOK, ""},
		{"another MAC: link-local", ether(otherMAC, 0x86dd, ipv6(netip.MustParseAddr("fe80::1"), netip.MustParseAddr("fe80::2"), 58, icmpEcho(true))), actOK, ""},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			onlyDrop(t, d, c.reason, func() {
				if got := runProg(t, d.underlay.FromUnderlay, c.pkt); got != c.want {
					t.Errorf("verdict %d, want %d", got, c.want)
				}
			})
		})
	}
}

// TestProgUnderlayUnguarded: before the agent has written the node's own
// addresses the guard is off, so a node that is still starting does not
// cut itself off from the fabric.
func TestProgUnderlayUnguarded(t *testing.T) {
	d := progDatapath(t)
	if err := d.SetConfig(Config{UnderlayIP: progNodeV6, Locator: progLocator, UnderlayIfIndex: 1}); err != nil {
		t.Fatal(err)
	}
	pkt := ether(unicastMAC, 0x0800, ipv4(netip.MustParseAddr("172.31.0.200"), netip.MustParseAddr("172.31.0.9"), 6, tcpSYN(1, 2)))
	if got := runProg(t, d.underlay.FromUnderlay, pkt); got != actOK {
		t.Errorf("verdict %d without the guard, want %d", got, actOK)
	}
}

// TestProgUnderlayClassified: plain IP from a source an external network
// covers is judged by that network's view: a pod of a network in it is
// delivered, a pod of another network is isolated, and an outside
// destination is transit, which a node never does.
func TestProgUnderlayClassified(t *testing.T) {
	d := progDatapath(t)
	ext4, ext6 := netip.MustParseAddr("172.31.0.200"), netip.MustParseAddr("fd00:99::c8")
	const world = 100
	for _, err := range []error{
		d.UpsertNetwork(Network{ID: world}),
		d.UpsertClassifier(Classifier{NetID: world, Prefix: netip.MustParsePrefix("0.0.0.0/0")}),
		d.UpsertClassifier(Classifier{NetID: world, Prefix: netip.MustParsePrefix("::/0")}),
		d.UpsertRoute(Route{NetID: world, Prefix: netip.MustParsePrefix("0.0.0.0/0"), Kind: tables.RouteExternal, DstNet: world}),
		d.UpsertRoute(Route{NetID: world, Prefix: netip.MustParsePrefix("10.70.1.0/24"), Kind: tables.RouteLocal, DstNet: progNet}),
		d.UpsertRoute(Route{NetID: world, Prefix: netip.MustParsePrefix("fd00:70:0:1::/64"), Kind: tables.RouteLocal, DstNet: progNet}),
	} {
		if err != nil {
			t.Fatal(err)
		}
	}
	cases := []struct {
		name   string
		pkt    []byte
		want   uint32
		reason string
	}{
		{"IPv4 to a pod of a granted network", ether(unicastMAC, 0x0800, ipv4(ext4, progPodV4, 6, tcpSYN(999, 7))), actRedirect, ""},
		{"IPv6 to a pod of a granted network", ether(unicastMAC, 0x86dd, ipv6(ext6, progPodV6, 17, udp(999, 7))), actRedirect, ""},
		{"IPv6 to an address outside the view", ether(unicastMAC, 0x86dd, ipv6(ext6, netip.MustParseAddr("fd00:80::2"), 17, udp(999, 7))), actShot, "isolated"},
		{"IPv4 transit to another outside address", ether(unicastMAC, 0x0800, ipv4(ext4, netip.MustParseAddr("192.0.2.1"), 17, udp(999, 7))), actShot, "not-for-this-node"},
		{"IPv4 to an absent pod of a granted block", ether(unicastMAC, 0x0800, ipv4(ext4, netip.MustParseAddr("10.70.1.77"), 17, udp(999, 7))), actShot, "no-endpoint"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			onlyDrop(t, d, c.reason, func() {
				if got := runProg(t, d.underlay.FromUnderlay, c.pkt); got != c.want {
					t.Errorf("verdict %d, want %d", got, c.want)
				}
			})
		})
	}
}

// The pod program runs as if the packet arrived on the host side of pod
// port progPort; the test world's pod is progPodV4/progPodV6 in network 7.
const progPort = 4242

// skbCtx is an __sk_buff for BPF_PROG_RUN with only ingress_ifindex set
// (offset 36; the kernel takes a shorter context and zeroes the rest).
func skbCtx(ingress uint32) []byte {
	b := make([]byte, 40)
	binary.LittleEndian.PutUint32(b[36:40], ingress)
	return b
}

func progPodDatapath(t *testing.T) *Datapath {
	t.Helper()
	d := progDatapath(t)
	for _, err := range []error{
		d.SetConfig(Config{UnderlayIP: progNodeV6, UnderlayIPv4: progNodeV4, Locator: progLocator, UnderlayIfIndex: 1, GuardUnderlay: true}),
		d.UpsertPort(Port{IfIndex: progPort, NetID: progNet, V4: progPodV4, V6: progPodV6}),
		d.UpsertRoute(Route{NetID: progNet, DstNet: progNet, Prefix: netip.MustParsePrefix("10.70.2.0/24"), SID: SID(progOther, BehaviourL3Decap, progNet, progNet)}),
		d.UpsertRoute(Route{NetID: progNet, DstNet: progNet, Prefix: netip.MustParsePrefix("fd00:70:0:2::/64"), SID: SID(progOther, BehaviourL3Decap, progNet, progNet)}),
	} {
		if err != nil {
			t.Fatal(err)
		}
	}
	return d
}

// runPod runs from_pod on pkt and returns the verdict and the packet as
// the program left it.
func runPod(t *testing.T, d *Datapath, pkt []byte) (uint32, []byte) {
	t.Helper()
	out := make([]byte, len(pkt)+256)
	opts := &ebpf.RunOptions{Data: pkt, DataOut: out, Context: skbCtx(progPort)}
	ret, err := d.pod.FromPod.Run(opts)
	if err != nil {
		t.Fatalf("BPF_PROG_RUN: %v", err)
	}
	return ret, opts.DataOut
}

func withTTL(pkt []byte, ttl byte) []byte {
	switch binary.BigEndian.Uint16(pkt[12:14]) {
	case 0x0800:
		pkt[14+8] = ttl
	case 0x86dd:
		pkt[14+7] = ttl
	}
	return pkt
}

// onesSum is the Internet checksum of b (0 when b holds a valid checksum).
func onesSum(b []byte) uint16 {
	var s uint32
	for i := 0; i+1 < len(b); i += 2 {
		s += uint32(binary.BigEndian.Uint16(b[i:]))
	}
	if len(b)%2 == 1 {
		s += uint32(b[len(b)-1]) << 8
	}
	for s>>16 != 0 {
		s = s&0xffff + s>>16
	}
	return ^uint16(s)
}

// TestProgPodTimeExceeded: a packet whose TTL runs out at this node is
// answered with ICMP time exceeded from the node, sent back into the pod,
// quoting the packet (so traceroute shows the hop).
func TestProgPodTimeExceeded(t *testing.T) {
	d := progPodDatapath(t)
	remote4, remote6 := netip.MustParseAddr("10.70.2.2"), netip.MustParseAddr("fd00:70:0:2::2")
	podMAC, hostMAC := net.HardwareAddr{2, 0, 0, 0, 0, 0xee}, net.HardwareAddr{2, 0, 0, 0, 0, 0xaa}
	t.Run("IPv4", func(t *testing.T) {
		in := withTTL(ether(hostMAC, 0x0800, ipv4(progPodV4, remote4, 17, udp(33434, 33434))), 1)
		before, _ := d.Drops()
		ret, out := runPod(t, d, in)
		if ret != actRedirect {
			t.Fatalf("verdict %d, want a redirect back into the pod", ret)
		}
		after, _ := d.Drops()
		if after["ttl-exceeded"] != before["ttl-exceeded"]+1 {
			t.Errorf("ttl-exceeded went %d -> %d", before["ttl-exceeded"], after["ttl-exceeded"])
		}
		if len(out) != 14+20+8+20+24 {
			t.Fatalf("reply of %d bytes, want %d", len(out), 14+20+8+20+24)
		}
		if !bytesEqual(out[0:6], podMAC) || !bytesEqual(out[6:12], hostMAC) {
			t.Errorf("reply MACs %s <- %s, want to the pod from the host side", net.HardwareAddr(out[0:6]), net.HardwareAddr(out[6:12]))
		}
		ip := out[14:]
		if src, dst := netip.AddrFrom4([4]byte(ip[12:16])), netip.AddrFrom4([4]byte(ip[16:20])); src != progNodeV4 || dst != progPodV4 || ip[9] != 1 {
			t.Errorf("reply %s -> %s proto %d, want ICMP from the node to the pod", src, dst, ip[9])
		}
		if onesSum(ip[:20]) != 0 || onesSum(ip[20:]) != 0 {
			t.Errorf("bad checksums: IP %#x, ICMP %#x", onesSum(ip[:20]), onesSum(ip[20:]))
		}
		if ip[20] != 11 || ip[21] != 0 {
			t.Errorf("ICMP type %d code %d, want time exceeded (11/0)", ip[20], ip[21])
		}
		// The 32-byte probe is quoted whole, padded to the quote's size.
		want := append(append([]byte(nil), in[14:]...), make([]byte, 44-len(in[14:]))...)
		if quoted := ip[28:]; !bytesEqual(quoted, want) {
			t.Errorf("quote % x, want the packet and padding % x", quoted, want)
		}
	})
	t.Run("IPv6", func(t *testing.T) {
		in := withTTL(ether(hostMAC, 0x86dd, ipv6(progPodV6, remote6, 17, udp(33434, 33434))), 1)
		ret, out := runPod(t, d, in)
		if ret != actRedirect {
			t.Fatalf("verdict %d, want a redirect back into the pod", ret)
		}
		if len(out) != 14+40+8+40+24 {
			t.Fatalf("reply of %d bytes, want %d", len(out), 14+40+8+40+24)
		}
		ip := out[14:]
		if src, dst := netip.AddrFrom16([16]byte(ip[8:24])), netip.AddrFrom16([16]byte(ip[24:40])); src != progNodeV6 || dst != progPodV6 || ip[6] != 58 {
			t.Errorf("reply %s -> %s next %d, want ICMPv6 from the node to the pod", src, dst, ip[6])
		}
		if ip[40] != 3 || ip[41] != 0 {
			t.Errorf("ICMPv6 type %d code %d, want time exceeded (3/0)", ip[40], ip[41])
		}
		if !icmp6ChecksumOK(ip) {
			t.Error("bad ICMPv6 checksum")
		}
	})
	t.Run("ICMP errors earn none", func(t *testing.T) {
		in := withTTL(ether(hostMAC, 0x0800, ipv4(progPodV4, remote4, 1, []byte{3, 3, 0, 0, 0, 0, 0, 0})), 1)
		if ret, _ := runPod(t, d, in); ret != actShot {
			t.Errorf("verdict %d for an expiring ICMP error, want a plain drop", ret)
		}
	})
}

func bytesEqual(a, b []byte) bool { return string(a) == string(b) }

// icmp6ChecksumOK checks the ICMPv6 checksum of an IPv6 packet ip.
func icmp6ChecksumOK(ip []byte) bool {
	payload := ip[40:]
	ph := make([]byte, 0, 40+len(payload))
	ph = append(ph, ip[8:40]...)
	ph = binary.BigEndian.AppendUint32(ph, uint32(len(payload)))
	ph = append(ph, 0, 0, 0, ip[6])
	return onesSum(append(ph, payload...)) == 0
}

// TestProgPodTooBig: a packet that would not fit the underlay once
// encapsulated is answered with fragmentation needed / packet too big
// carrying the underlay MTU less the encapsulation, read from the device
// at that moment. The program runs in a namespace whose "underlay" is a
// veth of MTU 1400.
func TestProgPodTooBig(t *testing.T) {
	d := progPodDatapath(t)
	suffix := make([]byte, 3)
	_, _ = rand.Read(suffix)
	ns := "lprog" + hex.EncodeToString(suffix)
	if err := netutil.CreateNamed(ns); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = netutil.DeleteNamed(ns) })
	if err := netutil.EnsureVeth(netutil.VethSpec{NSPath: netutil.Path(ns), Name: "ul0", PeerNSPath: netutil.Path(ns), PeerName: "ul1", MTU: 1400}); err != nil {
		t.Fatal(err)
	}
	ul, err := netutil.GetLink(netutil.Path(ns), "ul0")
	if err != nil {
		t.Fatal(err)
	}
	if err := d.SetConfig(Config{UnderlayIP: progNodeV6, UnderlayIPv4: progNodeV4, Locator: progLocator, UnderlayIfIndex: uint32(ul.Index), GuardUnderlay: true}); err != nil {
		t.Fatal(err)
	}
	remote4, remote6 := netip.MustParseAddr("10.70.2.2"), netip.MustParseAddr("fd00:70:0:2::2")
	run := func(pkt []byte) (ret uint32, out []byte) {
		t.Helper()
		if err := netutil.Do(netutil.Path(ns), func() error {
			ret, out = runPod(t, d, pkt)
			return nil
		}); err != nil {
			t.Fatal(err)
		}
		return ret, out
	}
	big4 := ether(unicastMAC, 0x0800, ipv4(progPodV4, remote4, 6, append(tcpSYN(4000, 80), make([]byte, 1420-40)...)))
	before, _ := d.Drops()
	ret, out := run(big4)
	if ret != actRedirect {
		t.Fatalf("verdict %d for a 1420-byte IPv4 packet over a 1400 underlay, want the ICMP error redirected to the pod", ret)
	}
	ip := out[14:]
	if ip[20] != 3 || ip[21] != 4 || binary.BigEndian.Uint16(ip[26:28]) != 1360 {
		t.Errorf("ICMP %d/%d mtu %d, want fragmentation needed (3/4) with MTU 1360", ip[20], ip[21], binary.BigEndian.Uint16(ip[26:28]))
	}
	if after, _ := d.Drops(); after["too-big"] != before["too-big"]+1 {
		t.Errorf("too-big went %d -> %d", before["too-big"], after["too-big"])
	}
	big6 := ether(unicastMAC, 0x86dd, ipv6(progPodV6, remote6, 6, append(tcpSYN(4000, 80), make([]byte, 1400-20)...)))
	ret, out = run(big6)
	ip = out[14:]
	if ret != actRedirect || ip[40] != 2 || binary.BigEndian.Uint32(ip[44:48]) != 1360 || !icmp6ChecksumOK(ip) {
		t.Errorf("verdict %d, ICMPv6 type %d mtu %d, want packet too big with MTU 1360", ret, ip[40], binary.BigEndian.Uint32(ip[44:48]))
	}
	// What fits goes on: 1360 bytes of IPv4 plus 40 is the MTU exactly.
	fits := ether(unicastMAC, 0x0800, ipv4(progPodV4, remote4, 6, append(tcpSYN(4000, 80), make([]byte, 1360-40)...)))
	if ret, _ := run(fits); ret == actRedirect {
		t.Error("a packet that fits was answered with an ICMP error")
	}
}

// TestProgEncapCopiesTrafficClass: the outer header carries the inner
// DSCP and ECN. The FIB lookup fails in a bare test run (no route to the
// SID), so the encapsulated packet is checked as the program left it.
func TestProgEncapCopiesTrafficClass(t *testing.T) {
	d := progPodDatapath(t)
	in := ether(unicastMAC, 0x0800, ipv4(progPodV4, netip.MustParseAddr("10.70.2.2"), 17, udp(1, 2)))
	in[15] = 0xb8 | 0x02 // DSCP EF, ECT(0)
	_, out := runPod(t, d, in)
	if binary.BigEndian.Uint16(out[12:14]) != 0x86dd {
		t.Fatalf("not encapsulated: ethertype %#x", binary.BigEndian.Uint16(out[12:14]))
	}
	tc := out[14]<<4 | out[15]>>4
	if tc != 0xba {
		t.Errorf("outer traffic class %#x, want the inner TOS 0xba", tc)
	}
}

// TestProgDecapKeepsCongestion: CE on the outer header sets CE on an
// ECN-capable inner packet (RFC 6040), with a valid IPv4 checksum.
func TestProgDecapKeepsCongestion(t *testing.T) {
	d := progDatapath(t)
	inner := ipv4(netip.MustParseAddr("10.70.2.2"), progPodV4, 17, udp(1000, 7))
	inner[1] = 0x02 // ECT(0)
	binary.BigEndian.PutUint16(inner[10:12], onesSum(inner[:20]))
	pkt := srv6(progPeerV6, SID(progLocator, BehaviourL3Decap, progNet, progNet), inner, true)
	pkt[14] |= 0x00
	pkt[15] |= 0x30 // outer ECN CE (traffic class low bits)
	out := make([]byte, len(pkt)+64)
	opts := &ebpf.RunOptions{Data: pkt, DataOut: out}
	ret, err := d.underlay.FromUnderlay.Run(opts)
	if err != nil || ret != actRedirect {
		t.Fatalf("verdict %d %v, want delivery", ret, err)
	}
	ip := opts.DataOut[14:]
	if ip[1]&3 != 3 {
		t.Errorf("inner ECN %d after decapsulation, want CE (3)", ip[1]&3)
	}
	if onesSum(ip[:20]) != 0 {
		t.Error("inner IPv4 checksum broken by the CE mark")
	}
}

// TestProgPodRefuses: what a pod may not send is dropped, each under its
// reason, before anything else looks at it.
func TestProgPodRefuses(t *testing.T) {
	d := progPodDatapath(t)
	other4 := netip.MustParseAddr("10.70.2.2")
	cases := []struct {
		name   string
		port   uint32
		pkt    []byte
		reason string
	}{
		{"spoofed IPv4 source", progPort, ether(unicastMAC, 0x0800, ipv4(netip.MustParseAddr("10.70.1.3"), other4, 17, udp(1, 7))), "spoofed-source"},
		{"spoofed IPv6 source", progPort, ether(unicastMAC, 0x86dd, ipv6(netip.MustParseAddr("fd00:70:0:1::3"), netip.MustParseAddr("fd00:70:0:2::2"), 17, udp(1, 7))), "spoofed-source"},
		{"another network's prefix", progPort, ether(unicastMAC, 0x0800, ipv4(progPodV4, netip.MustParseAddr("10.99.0.1"), 17, udp(1, 7))), "isolated"},
		{"a new connection to the node", progPort, ether(unicastMAC, 0x0800, ipv4(progPodV4, progNodeV4, 6, tcpSYN(1, 22))), "to-node-not-answer"},
		{"UDP to the node", progPort, ether(unicastMAC, 0x0800, ipv4(progPodV4, progNodeV4, 17, udp(1, 53))), "to-node-not-answer"},
		{"router solicitation", progPort, ether(unicastMAC, 0x86dd, ipv6(progPodV6, netip.MustParseAddr("ff02::2"), 58, []byte{133, 0, 0, 0})), "link-local"},
		{"not IP", progPort, ether(unicastMAC, 0x0806, make([]byte, 28)), "link-local"},
		{"a port without state", 999, ether(unicastMAC, 0x0800, ipv4(progPodV4, other4, 17, udp(1, 7))), "unknown-port"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			onlyDrop(t, d, c.reason, func() {
				ret, err := d.pod.FromPod.Run(&ebpf.RunOptions{Data: c.pkt, Context: skbCtx(c.port)})
				if err != nil {
					t.Fatal(err)
				}
				if ret != actShot {
					t.Errorf("verdict %d, want a drop", ret)
				}
			})
		})
	}
	// An answer to the node's own probe is let through to the node.
	ack := tcpSYN(8080, 40000)
	ack[13] = 0x12 // SYN-ACK
	if ret, _ := runPod(t, d, ether(unicastMAC, 0x0800, ipv4(progPodV4, progNodeV4, 6, ack))); ret != actOK {
		t.Errorf("verdict %d for the pod's answer to a node probe, want it passed to the node", ret)
	}
}

// TestConfigRoundTrip: what SetConfig writes, Config reads back, so the
// agent can leave an unchanged configuration alone.
func TestConfigRoundTrip(t *testing.T) {
	d := progDatapath(t)
	want := Config{UnderlayIP: progNodeV6, UnderlayIPv4: progNodeV4, Locator: progLocator, UnderlayIfIndex: 7, GuardUnderlay: true}
	if err := d.SetConfig(want); err != nil {
		t.Fatal(err)
	}
	got, err := d.Config()
	if err != nil || got != want {
		t.Errorf("Config() = %+v, %v; want %+v", got, err, want)
	}
}

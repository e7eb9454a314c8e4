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
	if os.Geteuid() != 0 {
		if os.Getenv("CI") != "" {
			t.Fatal("BPF_PROG_RUN tests need root")
		}
		t.Skip("BPF_PROG_RUN tests need root")
	}
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

var unicastMAC = net.HardwareAddr{2, 0, 0, 0, 0, 0xaa}

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

func TestProgUnderlay(t *testing.T) {
	d := progDatapath(t)
	ext4, ext6 := netip.MustParseAddr("172.31.0.200"), netip.MustParseAddr("fd00:99::c8")
	mySID := SID(progLocator, BehaviourL3Decap, progNet)
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
		// Plain IP that the node would forward: nothing enters a pod so.
		{"plain UDP to a pod", ether(unicastMAC, 0x0800, ipv4(ext4, progPodV4, 17, udp(999, 7))), actShot, "not-for-this-node"},
		{"plain TCP SYN to a pod", ether(unicastMAC, 0x0800, ipv4(ext4, progPodV4, 6, tcpSYN(999, 7))), actShot, "not-for-this-node"},
		{"plain ICMP echo to a pod", ether(unicastMAC, 0x0800, ipv4(ext4, progPodV4, 1, icmpEcho(false))), actShot, "not-for-this-node"},
		{"plain IPv6 UDP to a pod", ether(unicastMAC, 0x86dd, ipv6(ext6, progPodV6, 17, udp(999, 7))), actShot, "not-for-this-node"},
		{"plain ICMPv6 echo to a pod", ether(unicastMAC, 0x86dd, ipv6(ext6, progPodV6, 58, icmpEcho(true))), actShot, "not-for-this-node"},
		{"SRv6 to another node's SID", srv6(progPeerV6, SID(progOther, BehaviourL3Decap, progNet), inner4, true), actShot, "not-for-this-node"},
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
		{"SRv6 to an unknown network", srv6(progPeerV6, SID(progLocator, BehaviourL3Decap, 99), inner4, true), actShot, "decap-unknown-sid"},
		{"SRv6 with an unknown behaviour", srv6(progPeerV6, SID(progLocator, 9, progNet), inner4, true), actShot, "decap-unknown-sid"},
		{"SRv6 to a pod that is not here", srv6(progPeerV6, mySID,
			ipv4(netip.MustParseAddr("10.70.2.2"), netip.MustParseAddr("10.70.1.99"), 17, udp(1, 7)), true), actShot, "no-endpoint"},
		{"SRv6 carrying TCP", ether(unicastMAC, 0x86dd, ipv6(progPeerV6, mySID, 6, tcpSYN(1, 7))), actShot, "decap-bad-protocol"},
		{"SRv6 fragment", ether(unicastMAC, 0x86dd, ipv6(progPeerV6, mySID, 44, fragment)), actShot, "decap-fragment"},
		{"SRv6 with hop-by-hop options", ether(unicastMAC, 0x86dd, ipv6(progPeerV6, mySID, 0, hopByHop)), actShot, "decap-extension-header"},
		{"SRv6 truncated inner header", srv6(progPeerV6, mySID, inner4[:12], true), actShot, "decap-truncated"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			before, err := d.Drops()
			if err != nil {
				t.Fatal(err)
			}
			if got := runProg(t, d.underlay.FromUnderlay, c.pkt); got != c.want {
				t.Errorf("verdict %d, want %d", got, c.want)
			}
			after, err := d.Drops()
			if err != nil {
				t.Fatal(err)
			}
			for _, r := range DropReasons {
				want := before[r]
				if r == c.reason {
					want++
				}
				if after[r] != want {
					t.Errorf("drop counter %s went %d -> %d, want %d", r, before[r], after[r], want)
				}
			}
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

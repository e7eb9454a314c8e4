package datapath

import (
	"bytes"
	"encoding/binary"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/lace-cni/lace/internal/tables"
)

// TestXLBResetAheadOfReusedPort: under a SYN flood every node port toward
// a NodePort's remote endpoint comes round again within a second, while
// the endpoint keeps each flood flow's connection request half open for
// up to a minute (its SYN-ACKs go to forged sources that never answer).
// A new client given such a port met the old request: the endpoint
// answered its SYN with a bare ACK for the old sequence, or (rate-limited)
// not at all, and the client's connect timed out (TestSYNFloodKeepsStreams
// in CI: 1 of 20). The SYN that takes over a port whose last client sent
// only SYNs is now preceded, on the same path, by a reset of the old flow
// (sequence number its SYN's + 1, what the endpoint expects next): it
// leaves the node, and the SYN after it is intact. A SYN on a port never
// used sends none, nor one on a port whose last client spoke past its SYN.
func TestXLBResetAheadOfReusedPort(t *testing.T) {
	remote := netip.MustParseAddr("10.70.2.5")
	d := nodePortWorld(t, remote)
	capture := resetWorld(t, d)

	before := forwarded(t, d)["reset-ahead"]
	client := func(i int) netip.AddrPort {
		return netip.AddrPortFrom(netip.MustParseAddr("203.0.113.5"), uint16(40000+i))
	}
	// A port never used: no reset.
	syn := synWithSeq(client(0), progNodeV4, 30080, 0x01020304)
	if v, _ := runUnder(t, d, syn); v != actRedirect {
		t.Fatalf("first SYN: verdict %d", v)
	}
	if got := capture.resets(300 * time.Millisecond); len(got) != 0 {
		t.Errorf("a SYN on a free port sent %d resets", len(got))
	}
	// Its ACK, and the endpoint's (over SRv6 from its node), which
	// acknowledges more than the SYN: the endpoint showed a connection,
	// the port is not half open. The client's ACK alone does not tell (a
	// blind client sends one).
	p0 := nodePortFlow(t, d, client(0)).SNATPort
	runUnder(t, d, ether(unicastMAC, 0x0800, ipv4(client(0).Addr(), progNodeV4, 6, seg4(client(0).Port(), 30080, 0x10))))
	if _, half := xlbRevOf(t, d, remote, p0); !half {
		t.Errorf("port %d not half open after the client's ACK alone", p0)
	}
	if err := d.UpsertNetwork(Network{ID: tables.NodeNetID}); err != nil {
		t.Fatal(err)
	}
	sid := SID(progLocator, BehaviourL3Decap, progNet, tables.NodeNetID)
	for _, a := range []struct {
		flags byte
		ack   uint32
	}{{0x12, 0x01020305}, {0x10, 0x01020306}} { // its SYN-ACK, its ACK of a byte of data
		seg := seg4(8080, p0, a.flags)
		binary.BigEndian.PutUint32(seg[8:12], a.ack)
		runUnder(t, d, srv6(progPeerV6, sid, ipv4(remote, progNodeV4, 6, seg), true))
	}
	if isn, half := xlbRevOf(t, d, remote, p0); half {
		t.Errorf("port %d still half open (isn %#x) after the endpoint's ACK", p0, isn)
	}

	// The flood: every port taken by a bare SYN, each with its own
	// sequence number, and 500 more SYNs taking ports over.
	for i := range snatPorts + 500 {
		src := netip.AddrFrom4([4]byte{172, 31, byte(i / 60000), 200})
		runUnder(t, d, synWithSeq(netip.AddrPortFrom(src, uint16(1024+i%60000)), progNodeV4, 30080, 0x40000000+uint32(i)))
	}
	capture.resets(300 * time.Millisecond) // those 500 takeovers' resets
	if n := forwarded(t, d)["reset-ahead"] - before; n < 500 {
		t.Errorf("reset-ahead +%d after 500 takeovers of flood ports, want at least 500", n)
	}
	owners := map[uint16]uint32{}
	// Ports the flood's random tries never hit are free.
	free := map[uint16]bool{}
	val := make([]byte, d.underlay.LaceXlbRev.ValueSize())
	for port := range uint16(snatPorts) {
		p := 61000 + port
		if isn, half := xlbRevOf(t, d, remote, p); half {
			owners[p] = isn
		} else if d.underlay.LaceXlbRev.Lookup(xlbRevKey(remote, p), val) != nil {
			free[p] = true
		}
	}

	honest := client(1)
	const honestISN = 0x12345678
	v, out := runUnder(t, d, synWithSeq(honest, progNodeV4, 30080, honestISN))
	if v != actRedirect {
		t.Fatalf("honest SYN: verdict %d", v)
	}
	p := nodePortFlow(t, d, honest).SNATPort
	old, ok := owners[p]
	if !ok && !free[p] {
		t.Fatalf("the honest SYN took port %d, neither free nor held half open (%d is the first client's, whose endpoint answered)", p, p0)
	}
	// The SYN leaves intact: SYN, its own sequence number, a valid checksum.
	inner := out[14+40:]
	seg := inner[20:binary.BigEndian.Uint16(inner[2:4])]
	if seg[13] != 0x02 || binary.BigEndian.Uint32(seg[4:8]) != honestISN || tcpSum4(inner[12:16], inner[16:20], seg) != 0 {
		t.Errorf("the SYN left as flags %#x seq %#x (checksum sum %#x), want SYN %#x valid", seg[13], binary.BigEndian.Uint32(seg[4:8]), tcpSum4(inner[12:16], inner[16:20], seg), honestISN)
	}
	got := capture.resets(time.Second)
	var mine []capturedReset
	for _, r := range got {
		if r.sport == p {
			mine = append(mine, r)
		}
	}
	if !ok {
		// A free port.
		if len(mine) != 0 {
			t.Errorf("%d resets for port %d, which was free", len(mine), p)
		}
		return
	}
	if len(mine) != 1 {
		t.Fatalf("%d resets from node port %d left the underlay (of %d), want 1", len(mine), p, len(got))
	}
	r := mine[0]
	if r.src != progNodeV4 || r.dst != remote || r.dport != 8080 || r.flags != 0x04 || r.seq != old+1 || !r.sumOK {
		t.Errorf("reset %+v, want RST %s:%d -> %s:8080 seq %#x with a valid checksum", r, progNodeV4, p, remote, old+1)
	}
	if isn, half := xlbRevOf(t, d, remote, p); !half || isn != honestISN {
		t.Errorf("port %d records isn %#x half-open %v, want the honest client's %#x", p, isn, half, uint32(honestISN))
	}
}

// synWithSeq is a TCP SYN from client to dst:port with sequence number seq
// and a valid checksum, in an Ethernet frame.
func synWithSeq(client netip.AddrPort, dst netip.Addr, port uint16, seq uint32) []byte {
	seg := tcpSYN(client.Port(), port)
	binary.BigEndian.PutUint32(seg[4:8], seq)
	s, dd := client.Addr().As4(), dst.As4()
	binary.BigEndian.PutUint16(seg[16:18], tcpSum4(s[:], dd[:], seg))
	return ether(unicastMAC, 0x0800, ipv4(client.Addr(), dst, 6, seg))
}

// tcpSum4 is the TCP checksum over seg (0 when seg's own is valid).
func tcpSum4(src, dst, seg []byte) uint16 {
	ph := append(append(append([]byte(nil), src...), dst...), 0, 6, byte(len(seg)>>8), byte(len(seg)))
	return onesSum(append(ph, seg...))
}

// xlbRevOf returns the sequence number lace_xlb_rev records for node port
// port toward remote:8080 (TCP), and whether its flow is half open.
func xlbRevOf(t *testing.T, d *Datapath, remote netip.Addr, port uint16) (uint32, bool) {
	t.Helper()
	val := make([]byte, d.underlay.LaceXlbRev.ValueSize())
	if err := d.underlay.LaceXlbRev.Lookup(xlbRevKey(remote, port), val); err != nil {
		return 0, false
	}
	return binary.BigEndian.Uint32(val[48:52]), binary.NativeEndian.Uint32(val[52:56])&1 != 0
}

// xlbRevKey is lace_xlb_rev's key of node port port toward remote:8080
// (TCP).
func xlbRevKey(remote netip.Addr, port uint16) []byte {
	return xlbRevKeyOf(6, netip.AddrPortFrom(remote, 8080), port)
}

// xlbRevKeyOf is lace_xlb_rev's key of node port port toward IPv4
// endpoint ep over proto.
func xlbRevKeyOf(proto byte, ep netip.AddrPort, port uint16) []byte {
	key := make([]byte, 24)
	key[0], key[1] = 4, proto
	binary.BigEndian.PutUint16(key[2:4], port)
	binary.BigEndian.PutUint16(key[4:6], ep.Port())
	a := ep.Addr().As4()
	copy(key[8:12], a[:])
	return key
}

func forwarded(t *testing.T, d *Datapath) map[string]uint64 {
	t.Helper()
	f, err := d.Forwarded()
	if err != nil {
		t.Fatal(err)
	}
	return f
}

// resetCapture reads what leaves the underlay (the far end of its veth).
type resetCapture struct {
	t  *testing.T
	fd int
}

type capturedReset struct {
	src, dst     netip.Addr
	sport, dport uint16
	flags        byte
	seq          uint32
	sumOK        bool
}

// resetWorld gives d an underlay of its own in the test's network
// namespace (TestMain): a veth whose far end a packet socket reads, a
// route to the other node's locator through a neighbour that exists
// only there. What the data plane sends itself leaves through it.
func resetWorld(t *testing.T, d *Datapath) *resetCapture {
	t.Helper()
	if !ownNetns() {
		t.Fatal("not in a network namespace of the test's own (TestMain)")
	}
	la := netlink.NewLinkAttrs()
	la.Name = "lrstA"
	if err := netlink.LinkAdd(&netlink.Veth{LinkAttrs: la, PeerName: "lrstB"}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if l, err := netlink.LinkByName("lrstA"); err == nil {
			_ = netlink.LinkDel(l)
		}
	})
	a, err := netlink.LinkByName("lrstA")
	if err != nil {
		t.Fatal(err)
	}
	b, err := netlink.LinkByName("lrstB")
	if err != nil {
		t.Fatal(err)
	}
	gw := net.ParseIP("fe80::1")
	for _, err := range []error{
		netlink.LinkSetUp(a), netlink.LinkSetUp(b),
		os.WriteFile("/proc/sys/net/ipv6/conf/lrstA/forwarding", []byte("1"), 0o644),
		netlink.NeighAdd(&netlink.Neigh{LinkIndex: a.Attrs().Index, Family: unix.AF_INET6, State: netlink.NUD_PERMANENT, IP: gw, HardwareAddr: net.HardwareAddr{2, 0, 0, 0, 0, 0x99}}),
		netlink.RouteAdd(&netlink.Route{LinkIndex: a.Attrs().Index, Dst: &net.IPNet{IP: progOther.Addr().AsSlice(), Mask: net.CIDRMask(64, 128)}, Gw: gw}),
		d.SetConfig(Config{UnderlayIP: progNodeV6, UnderlayIPv4: progNodeV4, Locator: progLocator, UnderlayIfIndex: uint32(a.Attrs().Index), GuardUnderlay: true}),
	} {
		if err != nil {
			t.Fatal(err)
		}
	}
	fd, err := unix.Socket(unix.AF_PACKET, unix.SOCK_RAW, int(htons(unix.ETH_P_ALL)))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { unix.Close(fd) })
	if err := unix.Bind(fd, &unix.SockaddrLinklayer{Protocol: htons(unix.ETH_P_ALL), Ifindex: b.Attrs().Index}); err != nil {
		t.Fatal(err)
	}
	return &resetCapture{t: t, fd: fd}
}

// resets returns the TCP resets in IPv4 in SRv6 read until nothing came
// for quiet.
func (c *resetCapture) resets(quiet time.Duration) []capturedReset {
	c.t.Helper()
	tv := unix.NsecToTimeval(quiet.Nanoseconds())
	if err := unix.SetsockoptTimeval(c.fd, unix.SOL_SOCKET, unix.SO_RCVTIMEO, &tv); err != nil {
		c.t.Fatal(err)
	}
	var out []capturedReset
	buf := make([]byte, 2048)
	for {
		n, _, err := unix.Recvfrom(c.fd, buf, 0)
		if err != nil {
			return out
		}
		f := buf[:n]
		// Ethernet, outer IPv6 (IPv4 inside: next header 4), IPv4, TCP.
		if n < 14+40+20+20 || binary.BigEndian.Uint16(f[12:14]) != 0x86dd || f[14+6] != 4 {
			continue
		}
		ip := f[14+40:]
		if ip[9] != 6 {
			continue
		}
		seg := ip[20:binary.BigEndian.Uint16(ip[2:4])]
		if seg[13]&0x04 == 0 {
			continue
		}
		out = append(out, capturedReset{
			src: netip.AddrFrom4([4]byte(ip[12:16])), dst: netip.AddrFrom4([4]byte(ip[16:20])),
			sport: binary.BigEndian.Uint16(seg[0:2]), dport: binary.BigEndian.Uint16(seg[2:4]),
			flags: seg[13], seq: binary.BigEndian.Uint32(seg[4:8]),
			sumOK: seg[12]>>4 == 5 && tcpSum4(ip[12:16], ip[16:20], seg) == 0,
		})
	}
}

// TestXLBRevMigratesFromV1: a node port mapping pinned by an agent from
// before the reset ahead (48-byte values, layout version 1) is kept
// across the upgrade, through version 2, with no sequence numbers: it
// asks no reset, and no client's ACK ends its half open state.
func TestXLBRevMigratesFromV1(t *testing.T) {
	pin := tempPinDir(t)
	loadSized(t, pin, MapSizes{}).Close()
	path := filepath.Join(pin, "lace_xlb_rev")
	if err := os.Remove(path); err != nil {
		t.Fatal(err)
	}
	old, err := ebpf.NewMap(&ebpf.MapSpec{Name: "lace_xlb_rev", Type: ebpf.LRUHash, KeySize: 24, ValueSize: 48, MaxEntries: 65536})
	if err != nil {
		t.Fatal(err)
	}
	key, val := make([]byte, 24), make([]byte, 48)
	key[0], key[1], key[2], key[3] = 4, 6, 0xee, 0x48
	for i := range val {
		val[i] = byte(i + 1)
	}
	if err := old.Put(key, val); err != nil {
		t.Fatal(err)
	}
	if err := old.Pin(path); err != nil {
		t.Fatal(err)
	}
	old.Close()

	up := loadSized(t, pin, MapSizes{})
	if !slices.Contains(up.ReplacedMaps(), "lace_xlb_rev") {
		t.Errorf("replaced %v, want lace_xlb_rev migrated", up.ReplacedMaps())
	}
	got := make([]byte, up.underlay.LaceXlbRev.ValueSize())
	if err := up.underlay.LaceXlbRev.Lookup(key, got); err != nil {
		t.Fatalf("the mapping after the upgrade: %v", err)
	}
	if want := append(append([]byte(nil), val...), make([]byte, 16)...); !bytes.Equal(got, want) {
		t.Errorf("mapping after the upgrade % x, want % x", got, want)
	}
}

package datapath

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/binary"
	"encoding/hex"
	"net/netip"
	"testing"
	"time"

	"github.com/cilium/ebpf"

	"github.com/lace-cni/lace/internal/netutil"
	"github.com/lace-cni/lace/internal/tables"
)

// IP fragments through translation (frag.h): the first fragment of a
// datagram carries the ports and gets the normal decision; each later one
// takes its ports and the same translation, its payload untouched.

var fragPayload = []byte{0xAA, 0xBB, 0xCC, 0xDD, 0x11, 0x22, 0x33, 0x44, 0x55, 0x66, 0x77, 0x88}

// fragIP builds an IP fragment from src to dst (proto 17) with ID id:
// the first (L4 header in payload, more fragments) or a later one (offset
// 1448, the last). IPv4 gets a valid header checksum.
func fragIP(src, dst netip.Addr, id uint32, first bool, payload []byte) []byte {
	if src.Is4() {
		b := ipv4(src, dst, 17, payload)
		binary.BigEndian.PutUint16(b[4:6], uint16(id))
		if first {
			binary.BigEndian.PutUint16(b[6:8], 0x2000)
		} else {
			binary.BigEndian.PutUint16(b[6:8], 1448/8)
		}
		binary.BigEndian.PutUint16(b[10:12], onesSum(b[:20]))
		return ether(unicastMAC, 0x0800, b)
	}
	fh := make([]byte, 8, 8+len(payload))
	fh[0] = 17
	off := uint16(1448)
	if first {
		off = 1
	}
	binary.BigEndian.PutUint16(fh[2:4], off)
	binary.BigEndian.PutUint32(fh[4:8], id)
	return ether(unicastMAC, 0x86dd, ipv6(src, dst, 44, append(fh, payload...)))
}

// fragL3 is the length of the IP header (and IPv6 fragment header) of a
// fragment of the family of a.
func fragL3(a netip.Addr) int {
	if a.Is4() {
		return 20
	}
	return 48
}

// ipAddrs reads the source and destination of the IP header at off.
func ipAddrs(b []byte, off int) (src, dst netip.Addr) {
	if b[off]>>4 == 4 {
		return netip.AddrFrom4([4]byte(b[off+12 : off+16])), netip.AddrFrom4([4]byte(b[off+16 : off+20]))
	}
	return netip.AddrFrom16([16]byte(b[off+8 : off+24])), netip.AddrFrom16([16]byte(b[off+24 : off+40]))
}

func runPodAt(t *testing.T, d *Datapath, ifindex uint32, pkt []byte) (uint32, []byte) {
	t.Helper()
	out := make([]byte, len(pkt)+256)
	opts := &ebpf.RunOptions{Data: pkt, DataOut: out, Context: skbCtx(ifindex)}
	ret, err := d.pod.FromPod.Run(opts)
	if err != nil {
		t.Fatalf("BPF_PROG_RUN: %v", err)
	}
	return ret, opts.DataOut
}

func fragFamilies() []struct {
	name     string
	pod, ext netip.Addr
	node     netip.Addr
} {
	return []struct {
		name     string
		pod, ext netip.Addr
		node     netip.Addr
	}{
		{"IPv4", progPodV4, netip.MustParseAddr("198.51.100.7"), progNodeV4},
		{"IPv6", progPodV6, netip.MustParseAddr("2001:db8:51::7"), progNodeV6},
	}
}

func fragSNATDatapath(t *testing.T) *Datapath {
	t.Helper()
	d := snatDatapath(t)
	fragMust(t, d.UpsertRoute(Route{NetID: progNet, Prefix: netip.MustParsePrefix("2001:db8:51::/64"), Kind: tables.RouteExternal, DstNet: snatWorld}))
	return d
}

// A later fragment of a pod's datagram to an external network leaves
// through SNAT like its first (the node's address), and the fragments of
// the answer come back to the pod, both families; one flow, no drop.
func TestProgFragSNATLaterLikeFirst(t *testing.T) {
	for _, f := range fragFamilies() {
		t.Run(f.name, func(t *testing.T) {
			d := fragSNATDatapath(t)
			l3 := 14 + fragL3(f.pod)
			var first, later []byte
			moved := snatDrops(t, d, func() {
				_, first = runPod(t, d, fragIP(f.pod, f.ext, 0x1234, true, append(udp(41000, 53), fragPayload...)))
				_, later = runPod(t, d, fragIP(f.pod, f.ext, 0x1234, false, fragPayload))
			})
			if len(moved) != 0 {
				t.Fatalf("drops %v; want none", moved)
			}
			if s, _ := ipAddrs(first, 14); s != f.node {
				t.Fatalf("first fragment left from %s, want the node's %s", s, f.node)
			}
			port := binary.BigEndian.Uint16(first[l3 : l3+2])
			if s, dst := ipAddrs(later, 14); s != f.node || dst != f.ext {
				t.Errorf("UNTRANSLATED: later fragment %s -> %s, want %s -> %s like the first", s, dst, f.node, f.ext)
			}
			if !bytes.Equal(later[l3:l3+len(fragPayload)], fragPayload) {
				t.Errorf("MANGLED: later fragment payload % x became % x", fragPayload, later[l3:l3+len(fragPayload)])
			}
			if f.pod.Is4() && onesSum(later[14:34]) != 0 {
				t.Errorf("later fragment's IPv4 header checksum is wrong")
			}
			if flows, _ := d.Conntrack(); len(flows) != 1 {
				t.Errorf("flows %+v; want the one flow of the first fragment", flows)
			}

			// The fragmented answer, to the node's port.
			var v1, v2 uint32
			var a1, a2 []byte
			moved = snatDrops(t, d, func() {
				v1, a1 = runUnder(t, d, fragIP(f.ext, f.node, 0x77, true, append(udp(53, port), fragPayload...)))
				v2, a2 = runUnder(t, d, fragIP(f.ext, f.node, 0x77, false, fragPayload))
			})
			if v1 != actRedirect || v2 != actRedirect || len(moved) != 0 {
				t.Fatalf("answer verdicts %d, %d, drops %v; want both delivered", v1, v2, moved)
			}
			if _, dst := ipAddrs(a1, 14); dst != f.pod || binary.BigEndian.Uint16(a1[l3+2:l3+4]) != 41000 {
				t.Errorf("first answer fragment to %s port %d, want %s:41000", dst, binary.BigEndian.Uint16(a1[l3+2:l3+4]), f.pod)
			}
			if _, dst := ipAddrs(a2, 14); dst != f.pod {
				t.Errorf("UNTRANSLATED: later answer fragment to %s, want the pod %s", dst, f.pod)
			}
			if !bytes.Equal(a2[l3:l3+len(fragPayload)], fragPayload) {
				t.Errorf("MANGLED: later answer fragment payload became % x", a2[l3:l3+len(fragPayload)])
			}
		})
	}
}

// A later fragment to a ClusterIP goes to the endpoint its first went to
// (encapsulated to the endpoint's node), and the endpoint's fragmented
// answer, decapsulated here, comes from the VIP again.
func TestProgFragClusterIPLaterLikeFirst(t *testing.T) {
	for _, f := range []struct {
		name          string
		pod, vip, end netip.Addr
	}{
		{"IPv4", progPodV4, netip.MustParseAddr("10.96.0.10"), netip.MustParseAddr("10.70.2.5")},
		{"IPv6", progPodV6, netip.MustParseAddr("fd00:96::10"), netip.MustParseAddr("fd00:70:0:2::5")},
	} {
		t.Run(f.name, func(t *testing.T) {
			d := progPodDatapath(t)
			fragMust(t, d.UpsertRoute(Route{NetID: progNet, Prefix: netip.PrefixFrom(f.vip, f.vip.BitLen()), Kind: tables.RouteService, DstNet: progNet}))
			if _, err := d.ApplyServices([]Service{{VIP: f.vip, Proto: 17, Port: 53, NetID: progNet, Backends: []tables.Backend{{Addr: f.end, Port: 5353}}}}); err != nil {
				t.Fatal(err)
			}
			in := 14 + 40 // the inner packet after the SRv6 header
			l4 := in + fragL3(f.pod)
			var first, later []byte
			moved := snatDrops(t, d, func() {
				_, first = runPod(t, d, fragIP(f.pod, f.vip, 0x4321, true, append(udp(41000, 53), fragPayload...)))
				_, later = runPod(t, d, fragIP(f.pod, f.vip, 0x4321, false, fragPayload))
			})
			if len(moved) != 0 {
				t.Fatalf("drops %v; want none", moved)
			}
			if _, dst := ipAddrs(first, in); dst != f.end || binary.BigEndian.Uint16(first[l4+2:l4+4]) != 5353 {
				t.Fatalf("first fragment to %s, want the endpoint %s:5353", dst, f.end)
			}
			if _, dst := ipAddrs(later, in); dst != f.end {
				t.Errorf("UNTRANSLATED: later fragment to %s, want the endpoint %s like the first", dst, f.end)
			}
			if !bytes.Equal(later[l4:l4+len(fragPayload)], fragPayload) {
				t.Errorf("MANGLED: later fragment payload became % x", later[l4:l4+len(fragPayload)])
			}

			// The endpoint's answer, in fragments over SRv6.
			sid := SID(progLocator, BehaviourL3Decap, progNet, progNet)
			decap := func(pkt []byte) []byte {
				inner := pkt[14:]
				return srv6(progPeerV6, sid, inner, f.pod.Is4())
			}
			var v1, v2 uint32
			var a1, a2 []byte
			l4 = 14 + fragL3(f.pod)
			moved = snatDrops(t, d, func() {
				v1, a1 = runUnder(t, d, decap(fragIP(f.end, f.pod, 0x99, true, append(udp(5353, 41000), fragPayload...))))
				v2, a2 = runUnder(t, d, decap(fragIP(f.end, f.pod, 0x99, false, fragPayload)))
			})
			if v1 != actRedirect || v2 != actRedirect || len(moved) != 0 {
				t.Fatalf("answer verdicts %d, %d, drops %v; want both delivered", v1, v2, moved)
			}
			if src, _ := ipAddrs(a1, 14); src != f.vip || binary.BigEndian.Uint16(a1[l4:l4+2]) != 53 {
				t.Errorf("first answer fragment from %s, want the VIP %s:53", src, f.vip)
			}
			if src, _ := ipAddrs(a2, 14); src != f.vip {
				t.Errorf("UNTRANSLATED: later answer fragment from %s, want the VIP %s", src, f.vip)
			}
			if !bytes.Equal(a2[l4:l4+len(fragPayload)], fragPayload) {
				t.Errorf("MANGLED: later answer fragment payload became % x", a2[l4:l4+len(fragPayload)])
			}
			if flows, _ := d.Conntrack(); len(flows) != 2 {
				t.Errorf("flows %+v; want the client's and the translated one", flows)
			}
		})
	}
}

// A later fragment whose first was not seen (it overtook it, or there
// never was one) is dropped and counted, and opens nothing.
func TestProgFragBeforeFirstDropped(t *testing.T) {
	for _, f := range fragFamilies() {
		t.Run(f.name, func(t *testing.T) {
			d := fragSNATDatapath(t)
			var out []byte
			var v uint32
			moved := snatDrops(t, d, func() { v, out = runPod(t, d, fragIP(f.pod, f.ext, 0x5555, false, fragPayload)) })
			if v != actShot || moved["fragment-before-first"] != 1 || len(moved) != 1 {
				t.Errorf("verdict %d, drops %v; want one fragment-before-first drop", v, moved)
			}
			if s, _ := ipAddrs(out, 14); s != f.pod {
				t.Errorf("an orphan fragment was translated (source %s)", s)
			}
			if flows, _ := d.Conntrack(); len(flows) != 0 {
				t.Errorf("an orphan fragment opened flows: %+v", flows)
			}
			// From the fabric, to an external frontend's node or a pod:
			// the same.
			moved = snatDrops(t, d, func() { v, _ = runUnder(t, d, fragIP(f.ext, progPodV4Of(f.pod), 0x5556, false, fragPayload)) })
			if v != actShot || moved["fragment-before-first"] != 1 {
				t.Errorf("from outside: verdict %d, drops %v; want one fragment-before-first drop", v, moved)
			}
		})
	}
}

// progPodV4Of is the test pod's address of a's family.
func progPodV4Of(a netip.Addr) netip.Addr {
	if a.Is4() {
		return progPodV4
	}
	return progPodV6
}

// A pod of another network with the same addresses (overlapping subnets)
// sends a later fragment with the ID of a datagram in flight: it finds no
// record (the key holds the network) and never takes that flow's
// translation.
func TestProgFragOtherNetworkNotTranslated(t *testing.T) {
	const otherNet, otherPort = 8, 4343
	for _, f := range fragFamilies() {
		t.Run(f.name, func(t *testing.T) {
			d := fragSNATDatapath(t)
			fragMust(t, d.UpsertNetwork(Network{ID: otherNet}))
			fragMust(t, d.UpsertPort(Port{IfIndex: otherPort, NetID: otherNet, V4: progPodV4, V6: progPodV6}))
			for _, p := range []string{"198.51.100.0/24", "2001:db8:51::/64"} {
				fragMust(t, d.UpsertRoute(Route{NetID: otherNet, Prefix: netip.MustParsePrefix(p), Kind: tables.RouteExternal, DstNet: snatWorld}))
			}
			if _, first := runPod(t, d, fragIP(f.pod, f.ext, 0x2222, true, append(udp(41000, 53), fragPayload...))); func() bool {
				s, _ := ipAddrs(first, 14)
				return s != f.node
			}() {
				t.Fatal("the first fragment was not translated")
			}
			var v uint32
			var out []byte
			moved := snatDrops(t, d, func() { v, out = runPodAt(t, d, otherPort, fragIP(f.pod, f.ext, 0x2222, false, fragPayload)) })
			if s, _ := ipAddrs(out, 14); s == f.node {
				t.Errorf("ISOLATION: network %d's fragment took network %d's translation", otherNet, progNet)
			}
			if v != actShot || moved["fragment-before-first"] != 1 {
				t.Errorf("verdict %d, drops %v; want one fragment-before-first drop", v, moved)
			}
			// The flow's own later fragment still passes.
			_, later := runPod(t, d, fragIP(f.pod, f.ext, 0x2222, false, fragPayload))
			if s, _ := ipAddrs(later, 14); s != f.node {
				t.Errorf("the flow's own later fragment left from %s", s)
			}
		})
	}
}

func fragMust(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

// An outside host's fragments to a NodePort whose endpoint is on another
// node must cross the fabric encapsulated: a first fragment that would
// not fit then is answered with fragmentation needed from the node, out
// of the interface it came in by, quoting it untouched (its sender
// fragments smaller from then on); a later one is dropped (too-big). The
// "underlay" is a veth of MTU 1400 in a namespace of the test's own.
func TestProgFragNodePortTooBigAnswered(t *testing.T) {
	d := progPodDatapath(t)
	suffix := make([]byte, 3)
	_, _ = rand.Read(suffix)
	ns := "lprog" + hex.EncodeToString(suffix)
	fragMust(t, netutil.CreateNamed(ns))
	t.Cleanup(func() { _ = netutil.DeleteNamed(ns) })
	fragMust(t, netutil.EnsureVeth(netutil.VethSpec{NSPath: netutil.Path(ns), Name: "ul0", PeerNSPath: netutil.Path(ns), PeerName: "ul1", MTU: 1400}))
	ul, err := netutil.GetLink(netutil.Path(ns), "ul0")
	fragMust(t, err)
	fragMust(t, d.SetConfig(Config{UnderlayIP: progNodeV6, UnderlayIPv4: progNodeV4, Locator: progLocator, UnderlayIfIndex: uint32(ul.Index), GuardUnderlay: true}))
	cip, be := netip.MustParseAddr("10.96.0.10"), netip.MustParseAddr("10.70.2.5")
	fragMust(t, d.UpsertNetwork(Network{ID: snatWorld}))
	fragMust(t, d.UpsertClassifier(Classifier{NetID: snatWorld, Prefix: netip.MustParsePrefix("0.0.0.0/0")}))
	fragMust(t, d.UpsertRoute(Route{NetID: snatWorld, Prefix: netip.MustParsePrefix("0.0.0.0/0"), Kind: tables.RouteExternal, DstNet: snatWorld}))
	fragMust(t, d.UpsertRoute(Route{NetID: snatWorld, Prefix: netip.PrefixFrom(cip, 32), Kind: tables.RouteService, DstNet: progNet}))
	bes := []tables.Backend{{Addr: be, Port: 9300}}
	if _, err := d.ApplyServices([]Service{
		{VIP: cip, Proto: 17, Port: 82, NetID: progNet, Backends: bes},
		{VIP: progNodeV4, Proto: 17, Port: 30082, NetID: progNet, Backends: bes, Frontend: tables.FrontendNodePort, ClusterIP: cip, ClusterPort: 82},
	}); err != nil {
		t.Fatal(err)
	}
	client := netip.MustParseAddr("203.0.113.5")
	big := make([]byte, 1480-8)
	run := func(pkt []byte) (v uint32, out []byte) {
		t.Helper()
		fragMust(t, netutil.Do(netutil.Path(ns), func() error {
			v, out = runUnder(t, d, pkt)
			return nil
		}))
		return v, out
	}
	first := fragIP(client, progNodeV4, 0x3333, true, append(udp(5555, 30082), big...))
	var v uint32
	var out []byte
	fragMust(t, d.SetFlows(true, 100))
	moved := snatDrops(t, d, func() { v, out = run(first) })
	// Told as the client sent it, not as the error it became.
	ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
	var told []FlowEvent
	_ = d.ReadFlows(ctx, func(e FlowEvent) { told = append(told, e) })
	cancel()
	if len(told) != 1 || told[0].Reason != "too-big" || told[0].Proto != 17 || told[0].Src != netip.AddrPortFrom(client, 5555) {
		t.Errorf("told %+v; want the client's datagram, too-big", told)
	}
	if v != actRedirect || moved["too-big"] != 1 {
		t.Fatalf("verdict %d, drops %v; want the first fragment answered (redirect), counted too-big", v, moved)
	}
	src, dst := ipAddrs(out, 14)
	if out[14+9] != 1 || out[34] != 3 || out[35] != 4 || src != progNodeV4 || dst != client {
		t.Fatalf("answer %s -> %s proto %d type %d/%d; want ICMP fragmentation needed from the node to the client", src, dst, out[14+9], out[34], out[35])
	}
	if mtu := binary.BigEndian.Uint16(out[40:42]); mtu != 1360 {
		t.Errorf("fragmentation needed carries MTU %d, want 1360 (1400 less the encapsulation)", mtu)
	}
	if q, _ := ipAddrs(out, 42); q != client || binary.BigEndian.Uint16(out[62+2:62+4]) != 30082 {
		t.Errorf("the error quotes %s port %d, want the client's packet to the NodePort as sent", q, binary.BigEndian.Uint16(out[62+2:62+4]))
	}
	moved = snatDrops(t, d, func() { v, _ = run(fragIP(client, progNodeV4, 0x3333, false, big)) })
	if v != actShot || moved["too-big"] != 1 {
		t.Errorf("later fragment: verdict %d, drops %v; want dropped too-big", v, moved)
	}
}

package datapath

import (
	"encoding/binary"
	"errors"
	"net/netip"
	"testing"
	"time"

	"github.com/cilium/ebpf"

	"github.com/lace-cni/lace/internal/tables"
)

// The SNAT tier of BPF_PROG_RUN: a node SNAT port lives exactly as long as
// the pod's flow that holds it. The pod (progPodV4, network 7) reaches
// 198.51.100.0/24 in external network 100 with the node's address.

const (
	snatWorld   = 100
	snatPortMin = 61000
	snatPorts   = 4536
)

func snatDatapath(t *testing.T) *Datapath {
	t.Helper()
	d := progPodDatapath(t)
	for _, err := range []error{
		d.UpsertNetwork(Network{ID: snatWorld}),
		d.UpsertRoute(Route{NetID: progNet, Prefix: netip.MustParsePrefix("198.51.100.0/24"), Kind: tables.RouteExternal, DstNet: snatWorld}),
	} {
		if err != nil {
			t.Fatal(err)
		}
	}
	return d
}

// snatOut runs from_pod on a packet from the pod's sport to dst (UDP, or a
// TCP SYN) and returns the node port it was translated to, 0 when it was
// not. (Whether the test's own namespace then routes it is no matter.)
func snatOut(t *testing.T, d *Datapath, proto byte, sport uint16, dst netip.AddrPort) uint16 {
	t.Helper()
	l4 := udp(sport, dst.Port())
	if proto == 6 {
		l4 = tcpSYN(sport, dst.Port())
	}
	_, out := runPod(t, d, ether(unicastMAC, 0x0800, ipv4(progPodV4, dst.Addr(), proto, l4)))
	if netip.AddrFrom4([4]byte(out[26:30])) != progNodeV4 {
		return 0
	}
	return binary.BigEndian.Uint16(out[34:36])
}

// snatDrops runs f and returns how much each drop counter moved, but the
// routing of translated packets in the test's namespace.
func snatDrops(t *testing.T, d *Datapath, f func()) map[string]uint64 {
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
	moved := map[string]uint64{}
	for r, n := range after {
		if n != before[r] && r != "no-underlay-route" {
			moved[r] = n - before[r]
		}
	}
	return moved
}

// leaves checks that a new flow from sport to dst leaves on a node port
// and nothing is dropped.
func leaves(t *testing.T, d *Datapath, proto byte, sport uint16, dst netip.AddrPort) uint16 {
	t.Helper()
	var port uint16
	if moved := snatDrops(t, d, func() { port = snatOut(t, d, proto, sport, dst) }); len(moved) != 0 || port < snatPortMin {
		t.Fatalf("proto %d %d -> %s: node port %d, drops %v; want it out on a node port", proto, sport, dst, port, moved)
	}
	return port
}

// snatReply runs from_underlay on a reply from src to the node's port.
func snatReply(t *testing.T, d *Datapath, proto byte, src netip.AddrPort, port uint16) uint32 {
	t.Helper()
	l4 := udp(src.Port(), port)
	if proto == 6 {
		l4 = tcpSYN(src.Port(), port)
		l4[13] = 0x12 // SYN-ACK
	}
	return runProg(t, d.underlay.FromUnderlay, ether(unicastMAC, 0x0800, ipv4(src.Addr(), progNodeV4, proto, l4)))
}

func snatKeyOf(proto byte, dst netip.AddrPort, port uint16) podSnatKey {
	k := podSnatKey{Family: 4, Proto: proto, Port: ntohs(port), Rport: ntohs(dst.Port())}
	a := dst.Addr().As4()
	copy(k.Raddr[:], a[:])
	return k
}

// ctOf returns the key and value of the pod's flow from sport to dst.
func ctOf(t *testing.T, d *Datapath, proto byte, sport uint16, dst netip.AddrPort) (podCtKey, podCtVal) {
	t.Helper()
	var k podCtKey
	var v podCtVal
	// Unanswered, it waits in a pending map; answered, it is in lace_ct.
	for _, m := range d.ctMaps() {
		it := m.Iterate()
		for it.Next(&k, &v) {
			if k.Proto == proto && ntohs(k.Lport) == sport && ntohs(k.Rport) == dst.Port() && fromAddr16(k.Family, k.Raddr) == dst.Addr() {
				return k, v
			}
		}
		if err := it.Err(); err != nil {
			t.Fatal(err)
		}
	}
	t.Fatalf("no conntrack entry for %d -> %s", sport, dst)
	return k, v
}

// holdAllPorts gives every node port toward dst to another pod flow
// (addresses 10.70.1.100+ of the pod's network), with a conntrack entry
// of flags expiring at expires, or none when flags is 0.
func holdAllPorts(t *testing.T, d *Datapath, proto byte, dst netip.AddrPort, flags uint16, expires uint64) {
	t.Helper()
	keys := make([]podSnatKey, 0, snatPorts)
	vals := make([]podSnatVal, 0, snatPorts)
	var cks []podCtKey
	var cvs []podCtVal
	for i := range snatPorts {
		port := uint16(snatPortMin + i)
		owner := netip.AddrFrom4([4]byte{10, 70, 1, byte(100 + i%100)})
		lport := uint16(20000 + i)
		sv := podSnatVal{NetId: progNet, Lport: ntohs(lport)}
		a := owner.As4()
		copy(sv.Laddr[:], a[:])
		keys = append(keys, snatKeyOf(proto, dst, port))
		vals = append(vals, sv)
		if flags == 0 {
			continue
		}
		ck := podCtKey{NetId: progNet, Family: 4, Proto: proto, Lport: ntohs(lport), Rport: ntohs(dst.Port())}
		copy(ck.Laddr[:], a[:])
		da := dst.Addr().As4()
		copy(ck.Raddr[:], da[:])
		cks = append(cks, ck)
		cvs = append(cvs, podCtVal{Expires: expires, PeerNet: snatWorld, Flags: flags, SnatPort: ntohs(port)})
	}
	if _, err := d.pod.LaceSnat.BatchUpdate(keys, vals, nil); err != nil {
		t.Fatal(err)
	}
	if len(cks) > 0 {
		if _, err := d.pod.LaceCt.BatchUpdate(cks, cvs, nil); err != nil {
			t.Fatal(err)
		}
	}
}

// TestProgSNATPortsFreed: a node port toward a destination is free again
// as soon as the flow holding it is over (its conntrack entry gone or
// expired, a TCP flow its pod reset, or one closed by FINs both ways and
// silent until its last ACK passed), and only live flows exhaust a
// destination, which is then counted snat-failed and named in
// lace_snat_exhausted.
func TestProgSNATPortsFreed(t *testing.T) {
	d := snatDatapath(t)
	const (
		ctOriginLocalSNAT = ctOriginLocal | ctSNAT | ctSeenReply
	)
	now, err := monotonicNow()
	if err != nil {
		t.Fatal(err)
	}
	far := now + 3600e9

	t.Run("ports of flows that are over", func(t *testing.T) {
		for _, proto := range []byte{6, 17} {
			dst := netip.MustParseAddrPort("198.51.100.7:53")
			holdAllPorts(t, d, proto, dst, 0, 0) // mappings without flows
			leaves(t, d, proto, 40000, dst)
			// Expired flows free their ports just the same.
			dst = netip.MustParseAddrPort("198.51.100.8:53")
			holdAllPorts(t, d, proto, dst, ctOriginLocalSNAT, 1)
			leaves(t, d, proto, 40001, dst)
		}
	})

	t.Run("a closing TCP flow's port", func(t *testing.T) {
		dst := netip.MustParseAddrPort("198.51.100.9:443")
		holdAllPorts(t, d, 6, dst, ctOriginLocalSNAT|ctRST, far)
		leaves(t, d, 6, 40002, dst)
	})

	t.Run("live flows exhaust one destination, counted", func(t *testing.T) {
		dst := netip.MustParseAddrPort("198.51.100.10:443")
		holdAllPorts(t, d, 6, dst, ctOriginLocalSNAT, far)
		var port uint16
		if moved := snatDrops(t, d, func() { port = snatOut(t, d, 6, 40003, dst) }); port != 0 || len(moved) != 1 || moved["snat-failed"] != 1 {
			t.Fatalf("node port %d, drops %v; want no port, snat-failed=1: every port is held", port, moved)
		}
		ex, err := d.SNATExhaustedCounts()
		if err != nil {
			t.Fatal(err)
		}
		if ex["tcp/198.51.100.10:443"] != 1 || len(ex) != 1 {
			t.Errorf("exhausted destinations %v, want tcp/198.51.100.10:443=1 only", ex)
		}
		// Another port of the same address is another destination.
		leaves(t, d, 6, 40003, netip.MustParseAddrPort("198.51.100.10:80"))
	})

	// FINs both ways free the port once the flow fell silent long enough
	// for its last ACK to have passed: the pod's, a moment after the
	// outside host's FIN, when the pod closed first (100 ms); the host's,
	// a round trip after the pod's FIN, when the host closed first (1 s).
	// Handed on before, the port's next flow meets the old connection at
	// the host. An entry's expiry is its last packet plus 10 s once
	// closed.
	for i, tc := range []struct {
		name  string
		flags uint16
		// silent: ns since the last packet (as the ports are written,
		// which takes a while: ahead of now for "just now").
		silent int64
		free   bool
	}{
		{"the pod closed first, just now", ctFinOrig | ctFinReply, -5e8, false},
		{"the pod closed first, silent 0.3 s", ctFinOrig | ctFinReply, 3e8, true},
		{"the host closed first, silent 0.3 s", ctFinOrig | ctFinReply | ctFinReplyFirst, 3e8, false},
		{"the host closed first, silent 2 s", ctFinOrig | ctFinReply | ctFinReplyFirst, 2e9, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dst := netip.AddrPortFrom(netip.AddrFrom4([4]byte{198, 51, 100, byte(20 + i)}), 443)
			now, err := monotonicNow()
			if err != nil {
				t.Fatal(err)
			}
			holdAllPorts(t, d, 6, dst, ctOriginLocalSNAT|tc.flags, uint64(int64(now)+10e9-tc.silent))
			var port uint16
			moved := snatDrops(t, d, func() { port = snatOut(t, d, 6, uint16(40010+i), dst) })
			if tc.free && (port == 0 || len(moved) != 0) {
				t.Errorf("node port %d, drops %v; want a port: the flows' last ACKs passed", port, moved)
			}
			if !tc.free && (port != 0 || len(moved) != 1 || moved["snat-failed"] != 1) {
				t.Errorf("node port %d, drops %v; want no port, snat-failed=1: the flows' last ACKs may be on the way", port, moved)
			}
		})
	}
}

// TestProgSNATNeedsSYN: a pod's TCP segment toward an outside address that
// opens nothing (a SYN-ACK to a flow whose entry is gone, as a flood's SYN
// evicted before the pod answered) takes no SNAT port and leaves no
// conntrack entry: dropped as no-flow.
func TestProgSNATNeedsSYN(t *testing.T) {
	d := snatDatapath(t)
	dst := netip.MustParseAddrPort("198.51.100.7:40000")
	synAck := tcpSYN(8080, dst.Port())
	synAck[13] = 0x12
	var out []byte
	moved := snatDrops(t, d, func() {
		_, out = runPod(t, d, ether(unicastMAC, 0x0800, ipv4(progPodV4, dst.Addr(), 6, synAck)))
	})
	if len(moved) != 1 || moved["no-flow"] != 1 {
		t.Errorf("drops %v, want no-flow=1", moved)
	}
	if netip.AddrFrom4([4]byte(out[26:30])) == progNodeV4 {
		t.Error("the SYN-ACK was translated to the node's address")
	}
	flows, err := d.Conntrack()
	if err != nil {
		t.Fatal(err)
	}
	if len(flows) != 0 {
		t.Errorf("conntrack holds %+v, want nothing", flows)
	}
}

// TestProgSNATClosedAfterFlow: a packet to a node SNAT port reaches the
// pod only while the pod's flow lives; once its conntrack entry expired or
// is gone, the same packet is dropped as snat-closed.
func TestProgSNATClosedAfterFlow(t *testing.T) {
	d := snatDatapath(t)
	for _, proto := range []byte{17, 6} {
		dst := netip.MustParseAddrPort("198.51.100.7:53")
		port := leaves(t, d, proto, 41000, dst)
		onlyDrop(t, d, "", func() {
			if got := snatReply(t, d, proto, dst, port); got != actRedirect {
				t.Errorf("proto %d: reply verdict %d while the flow lives, want it delivered", proto, got)
			}
		})
		k, v := ctOf(t, d, proto, 41000, dst)
		v.Expires = 1
		if err := d.pod.LaceCt.Put(k, v); err != nil {
			t.Fatal(err)
		}
		onlyDrop(t, d, "snat-closed", func() {
			if got := snatReply(t, d, proto, dst, port); got != actShot {
				t.Errorf("proto %d: verdict %d after the flow expired, want a drop", proto, got)
			}
		})
		if err := d.pod.LaceCt.Delete(k); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
			t.Fatal(err)
		}
		onlyDrop(t, d, "snat-closed", func() {
			if got := snatReply(t, d, proto, dst, port); got != actShot {
				t.Errorf("proto %d: verdict %d after the flow's entry is gone, want a drop", proto, got)
			}
		})
	}
}

// TestProgFloodKeepsEstablished: a flow opened from outside lives in
// lace_ct_new, for CT_NEW_IN, until its opener speaks again after the
// pod's answer; then it is established in lace_ct. A flood of 200,000 new
// flows from outside (more than both maps hold) evicts only other
// unassured flows: the established one stays, and the flood's entries
// expire within seconds.
func TestProgFloodKeepsEstablished(t *testing.T) {
	d := progPodDatapath(t)
	ext4 := netip.MustParseAddr("172.31.0.200")
	for _, err := range []error{
		d.UpsertNetwork(Network{ID: snatWorld}),
		d.UpsertClassifier(Classifier{NetID: snatWorld, Prefix: netip.MustParsePrefix("0.0.0.0/0")}),
		d.UpsertRoute(Route{NetID: snatWorld, Prefix: netip.MustParsePrefix("0.0.0.0/0"), Kind: tables.RouteExternal, DstNet: snatWorld}),
		d.UpsertRoute(Route{NetID: snatWorld, Prefix: netip.MustParsePrefix("10.70.1.0/24"), Kind: tables.RouteLocal, DstNet: progNet}),
		d.UpsertRoute(Route{NetID: progNet, Prefix: netip.MustParsePrefix("0.0.0.0/0"), Kind: tables.RouteExternal, DstNet: snatWorld}),
	} {
		if err != nil {
			t.Fatal(err)
		}
	}
	seg := func(sport, dport uint16, flags byte) []byte {
		b := tcpSYN(sport, dport)
		b[13] = flags
		return b
	}
	in := func(src netip.Addr, sport uint16, flags byte) {
		if got := runProg(t, d.underlay.FromUnderlay, ether(unicastMAC, 0x0800, ipv4(src, progPodV4, 6, seg(sport, 7, flags)))); got != actRedirect {
			t.Fatalf("verdict %d for %d -> the pod, want it delivered", got, sport)
		}
	}
	flowFrom := func(src netip.AddrPort) (Flow, bool) {
		flows, err := d.Conntrack()
		if err != nil {
			t.Fatal(err)
		}
		for _, f := range flows {
			if f.Remote == src && f.Local.Port() == 7 {
				return f, true
			}
		}
		return Flow{}, false
	}
	flow := func(sport uint16) (Flow, bool) { return flowFrom(netip.AddrPortFrom(ext4, sport)) }

	// A source that resets the pod's answer assures nothing.
	in(ext4, 998, 0x02)
	runPod(t, d, ether(unicastMAC, 0x0800, ipv4(progPodV4, ext4, 6, seg(7, 998, 0x12))))
	in(ext4, 998, 0x04)
	if f, ok := flow(998); !ok || !f.New || f.Assured {
		t.Errorf("after SYN, SYN-ACK, RST: %+v (found %v), want it unassured in lace_ct_new", f, ok)
	}

	in(ext4, 999, 0x02) // SYN
	if f, ok := flow(999); !ok || !f.New || f.Assured {
		t.Errorf("after the SYN: %+v (found %v), want an unassured flow in lace_ct_new", f, ok)
	}
	runPod(t, d, ether(unicastMAC, 0x0800, ipv4(progPodV4, ext4, 6, seg(7, 999, 0x12)))) // SYN-ACK
	in(ext4, 999, 0x10)                                                                  // ACK
	f, ok := flow(999)
	if !ok || f.New || !f.Assured {
		t.Errorf("after the handshake: %+v (found %v), want it assured in lace_ct", f, ok)
	}

	const flood = 200000
	for i := range flood {
		// Distinct flows: 60,000 source ports of each of 4 addresses.
		in(netip.AddrFrom4([4]byte{172, 31, byte(1 + i/60000), 200}), uint16(1000+i%60000), 0x02)
		if i == 60000 {
			// A bare SYN is held seconds, not a minute.
			now, err := monotonicNow()
			if err != nil {
				t.Fatal(err)
			}
			g, ok := flowFrom(netip.AddrPortFrom(netip.MustParseAddr("172.31.1.200"), 1000+59000))
			if !ok {
				t.Fatal("a flood SYN left no entry")
			}
			if left := time.Duration(g.ExpiresMonotonicNanos - now); !g.New || left > 5*time.Second {
				t.Errorf("a flood SYN's entry: new %v, expires in %v, want it in lace_ct_new for at most 5s", g.New, left)
			}
		}
	}
	now, err := monotonicNow()
	if err != nil {
		t.Fatal(err)
	}
	f, ok = flow(999)
	if !ok || f.New || f.ExpiresMonotonicNanos < now {
		t.Fatalf("after a flood of %d SYNs the established flow is %+v (found %v), want it live in lace_ct", flood, f, ok)
	}
	sizes, err := d.MapSizes()
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("after the flood: %d established, %d new entries", sizes["conntrack"], sizes["conntrack-new"])
}

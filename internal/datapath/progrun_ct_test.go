package datapath

import (
	"encoding/binary"
	"net/netip"
	"testing"

	"github.com/cilium/ebpf"

	"github.com/lace-cni/lace/internal/tables"
)

// The conntrack and SNAT regressions of the h2 review: each test replays
// an attack by BPF_PROG_RUN and asserts that the data plane withstands it.

// runUnder runs from_underlay and returns the verdict and the packet out.
func runUnder(t *testing.T, d *Datapath, pkt []byte) (uint32, []byte) {
	t.Helper()
	out := make([]byte, len(pkt)+256)
	opts := &ebpf.RunOptions{Data: pkt, DataOut: out}
	ret, err := d.underlay.FromUnderlay.Run(opts)
	if err != nil {
		t.Fatal(err)
	}
	return ret, opts.DataOut
}

// seg4 is a TCP segment from sport to dport with the given flags.
func seg4(sport, dport uint16, flags byte) []byte {
	b := tcpSYN(sport, dport)
	b[13] = flags
	return b
}

// stealPort: the pod (as attacker, other source ports) opens flows toward
// dst until one is given port want; returns its source port, 0 if none was.
func stealPort(t *testing.T, d *Datapath, proto byte, dst netip.AddrPort, want uint16) uint16 {
	t.Helper()
	for s := uint16(10000); s < 30000; s++ {
		if p := snatOut(t, d, proto, s, dst); p == want {
			return s
		}
	}
	return 0
}

// established opens a TCP flow from the pod's sport to dst through SNAT
// and completes its handshake; returns the node port.
func established(t *testing.T, d *Datapath, sport uint16, dst netip.AddrPort) uint16 {
	t.Helper()
	P := leaves(t, d, 6, sport, dst)
	if v, _ := runUnder(t, d, ether(unicastMAC, 0x0800, ipv4(dst.Addr(), progNodeV4, 6, seg4(dst.Port(), P, 0x12)))); v != actRedirect {
		t.Fatal("SYN-ACK not delivered")
	}
	runPod(t, d, ether(unicastMAC, 0x0800, ipv4(progPodV4, dst.Addr(), 6, seg4(sport, dst.Port(), 0x10))))
	return P
}

// A blind RST from the fabric (spoofed from the remote, swept over all
// node ports) must not free a live flow's port: the pod keeps its port,
// no other flow is given it, and the remote's data still reaches the pod.
func TestCTBlindRSTKeepsSNATFlow(t *testing.T) {
	d := snatDatapath(t)
	dst := netip.MustParseAddrPort("198.51.100.7:443")
	P := established(t, d, 41000, dst)
	for i := 0; i < snatPorts; i++ {
		runUnder(t, d, ether(unicastMAC, 0x0800, ipv4(dst.Addr(), progNodeV4, 6, seg4(443, uint16(snatPortMin+i), 0x04))))
	}
	// The port is not handed out while the reset flow's entry lives,
	// even before the victim speaks again.
	if a := stealPort(t, d, 6, dst, P); a != 0 {
		t.Fatalf("HIJACK: the reset flow's port %d went to another flow (source port %d)", P, a)
	}
	// The victim keeps talking (its kernel ignored the out-of-window RST).
	if v, out := runPod(t, d, ether(unicastMAC, 0x0800, ipv4(progPodV4, dst.Addr(), 6, seg4(41000, 443, 0x18)))); binary.BigEndian.Uint16(out[34:36]) != P {
		t.Fatalf("victim no longer leaves on %d (verdict %d)", P, v)
	}
	if _, cv := ctOf(t, d, 6, 41000, dst); cv.Flags&ctRST != 0 {
		t.Errorf("flow still marked reset (flags %#x) after the pod spoke on", cv.Flags)
	}
	v, out := runUnder(t, d, ether(unicastMAC, 0x0800, ipv4(dst.Addr(), progNodeV4, 6, seg4(443, P, 0x18))))
	if got := binary.BigEndian.Uint16(out[36:38]); v != actRedirect || got != 41000 {
		t.Errorf("remote's data to %d: verdict %d, to pod port %d; want it delivered to the victim (41000)", P, v, got)
	}
}

// A flow whose port somebody else holds (its mapping was taken) is over:
// its packets are dropped snat-closed, never sent from the shared port.
func TestCTSNATPortNeverShared(t *testing.T) {
	d := snatDatapath(t)
	dst := netip.MustParseAddrPort("198.51.100.7:443")
	P := established(t, d, 41000, dst)
	// Another pod flow (same pod, port 42000) holds P now.
	other := podSnatVal{NetId: progNet, Lport: ntohs(42000)}
	a := progPodV4.As4()
	copy(other.Laddr[:], a[:])
	if err := d.pod.LaceSnat.Put(snatKeyOf(6, dst, P), other); err != nil {
		t.Fatal(err)
	}
	moved := snatDrops(t, d, func() {
		runPod(t, d, ether(unicastMAC, 0x0800, ipv4(progPodV4, dst.Addr(), 6, seg4(41000, 443, 0x18))))
	})
	if moved["snat-closed"] != 1 {
		t.Errorf("drops %v; want the flow whose port is taken dropped snat-closed", moved)
	}
}

// Two new flows may judge one port free at once, and the later write of
// the mapping wins: the loser, which nothing answered yet, takes another
// port with its next SYN or datagram (dropped snat-closed, its connect
// timed out); once answered, or with any other segment, it is over.
func TestCTSNATRaceLoserTakesAnotherPort(t *testing.T) {
	for _, proto := range []byte{6, 17} {
		d := snatDatapath(t)
		dst := netip.MustParseAddrPort("198.51.100.7:443")
		P := leaves(t, d, proto, 41000, dst)
		// The winner: flow 42000 holds P, its entry live and naming P.
		Q := leaves(t, d, proto, 42000, dst)
		ck, cv := ctOf(t, d, proto, 42000, dst)
		cv.SnatPort = ntohs(P)
		for _, m := range d.ctMaps() {
			if err := m.Update(ck, cv, ebpf.UpdateExist); err == nil {
				break
			}
		}
		winner := podSnatVal{NetId: progNet, Lport: ntohs(42000)}
		a := progPodV4.As4()
		copy(winner.Laddr[:], a[:])
		if err := d.pod.LaceSnat.Put(snatKeyOf(proto, dst, P), winner); err != nil {
			t.Fatal(err)
		}
		if err := d.pod.LaceSnat.Delete(snatKeyOf(proto, dst, Q)); err != nil {
			t.Fatal(err)
		}
		if proto == 6 {
			// Not a SYN: it opens nothing, and the port is not its own.
			moved := snatDrops(t, d, func() {
				runPod(t, d, ether(unicastMAC, 0x0800, ipv4(progPodV4, dst.Addr(), 6, seg4(41000, 443, 0x10))))
			})
			if moved["snat-closed"] != 1 {
				t.Errorf("an ACK of the loser: drops %v, want snat-closed=1", moved)
			}
		}
		R := leaves(t, d, proto, 41000, dst)
		if R == P {
			t.Fatalf("proto %d: the loser's retry left on %d, the winner's port", proto, P)
		}
		if _, v := ctOf(t, d, proto, 41000, dst); ntohs(v.SnatPort) != R {
			t.Errorf("proto %d: the loser's entry names port %d, it left on %d", proto, ntohs(v.SnatPort), R)
		}
		// Answered on its new port, it keeps it: the next packet leaves
		// from R, and the winner's flow still leaves from P.
		if v := snatReply(t, d, proto, dst, R); v != actRedirect {
			t.Fatalf("proto %d: the reply to port %d was not delivered (%d)", proto, R, v)
		}
		if again := leaves(t, d, proto, 41000, dst); again != R {
			t.Errorf("proto %d: the answered flow moved from %d to %d", proto, R, again)
		}
		if w := leaves(t, d, proto, 42000, dst); w != P {
			t.Errorf("proto %d: the winner moved from %d to %d", proto, P, w)
		}
		// Answered, a flow whose port another takes is over, SYN or
		// datagram: its answers may be on the way to the port.
		other := podSnatVal{NetId: progNet, Lport: ntohs(43000)}
		copy(other.Laddr[:], a[:])
		if err := d.pod.LaceSnat.Put(snatKeyOf(proto, dst, R), other); err != nil {
			t.Fatal(err)
		}
		var port uint16
		moved := snatDrops(t, d, func() { port = snatOut(t, d, proto, 41000, dst) })
		if port != 0 || moved["snat-closed"] != 1 {
			t.Errorf("proto %d: the answered flow whose port was taken left on %d, drops %v; want snat-closed=1", proto, port, moved)
		}
	}
}

// The last ACK of a closed TCP flow is sent by the side that closed first;
// the entry records when that was the other side (CT_FIN_REPLY_FIRST), whose
// ACK then comes a round trip after the pod's FIN (ct_port_free).
func TestCTFinOrder(t *testing.T) {
	for _, hostFirst := range []bool{false, true} {
		d := snatDatapath(t)
		dst := netip.MustParseAddrPort("198.51.100.7:443")
		P := established(t, d, 41000, dst)
		podFIN := func() {
			runPod(t, d, ether(unicastMAC, 0x0800, ipv4(progPodV4, dst.Addr(), 6, seg4(41000, 443, 0x11))))
		}
		hostFIN := func() {
			if v, _ := runUnder(t, d, ether(unicastMAC, 0x0800, ipv4(dst.Addr(), progNodeV4, 6, seg4(443, P, 0x11)))); v != actRedirect {
				t.Fatal("the host's FIN was not delivered")
			}
		}
		if hostFirst {
			hostFIN()
			podFIN()
		} else {
			podFIN()
			hostFIN()
		}
		_, v := ctOf(t, d, 6, 41000, dst)
		if v.Flags&(ctFinOrig|ctFinReply) != ctFinOrig|ctFinReply {
			t.Fatalf("flags %#x, want both FINs", v.Flags)
		}
		if got := v.Flags&ctFinReplyFirst != 0; got != hostFirst {
			t.Errorf("the host closed first: %t; the entry says %t (flags %#x)", hostFirst, got, v.Flags)
		}
	}
}

// lace_snat evicts nothing: a tenant's many SNAT flows fill it and then
// fail (snat-failed), but never take a live flow's mapping, nor its port
// toward the same destination.
func TestCTSNATMappingNotEvicted(t *testing.T) {
	d := snatDatapath(t)
	dst := netip.MustParseAddrPort("198.51.100.7:53")
	P := leaves(t, d, 17, 41000, dst) // victim (UDP)
	runUnder(t, d, ether(unicastMAC, 0x0800, ipv4(dst.Addr(), progNodeV4, 17, udp(53, P))))
	moved := snatDrops(t, d, func() {
		for i := 0; i < 70000; i++ {
			a := netip.AddrFrom4([4]byte{198, 51, 100, byte(10 + i%200)})
			snatOut(t, d, 17, uint16(1024+i/200), netip.AddrPortFrom(a, 9))
		}
	})
	if moved["snat-failed"] == 0 {
		t.Errorf("drops %v; want snat-failed once lace_snat is full", moved)
	}
	var sv podSnatVal
	if err := d.pod.LaceSnat.Lookup(snatKeyOf(17, dst, P), &sv); err != nil {
		t.Fatalf("the live flow's mapping is gone: %v", err)
	}
	if a := stealPort(t, d, 17, dst, P); a != 0 {
		t.Errorf("HIJACK: port %d handed to source port %d while its flow lives", P, a)
	}
	v, out := runUnder(t, d, ether(unicastMAC, 0x0800, ipv4(dst.Addr(), progNodeV4, 17, udp(53, P))))
	if got := binary.BigEndian.Uint16(out[36:38]); v != actRedirect || got != 41000 {
		t.Errorf("reply to %d: verdict %d, to pod port %d; want the victim (41000)", P, v, got)
	}
	// The agent's sweep frees the mappings of flows that are over (the
	// unanswered ones lace_ct_new evicted), never the live flow's.
	n, err := d.ReclaimSNAT()
	if err != nil || n == 0 {
		t.Errorf("ReclaimSNAT: %d, %v; want the evicted flows' mappings freed", n, err)
	}
	if err := d.pod.LaceSnat.Lookup(snatKeyOf(17, dst, P), &sv); err != nil {
		t.Errorf("the sweep removed the live flow's mapping: %v", err)
	}
	if p := leaves(t, d, 17, 41001, netip.MustParseAddrPort("198.51.100.250:9")); p == 0 {
		t.Error("no port after the sweep")
	}
}

// A pod's unanswered flows wait in lace_ct_new: 200,000 of them toward
// silent destinations never evict another pod's established flow.
func TestCTPodFloodKeepsEstablished(t *testing.T) {
	d := snatDatapath(t)
	dst := netip.MustParseAddrPort("198.51.100.7:443")
	P := established(t, d, 41000, dst)
	for i := 0; i < 200000; i++ {
		a := netip.AddrFrom4([4]byte{198, 51, 100, byte(10 + i%200)})
		snatOut(t, d, 17, uint16(1024+i/200), netip.AddrPortFrom(a, 9))
	}
	moved := snatDrops(t, d, func() {
		runUnder(t, d, ether(unicastMAC, 0x0800, ipv4(dst.Addr(), progNodeV4, 6, seg4(443, P, 0x18))))
		runPod(t, d, ether(unicastMAC, 0x0800, ipv4(progPodV4, dst.Addr(), 6, seg4(41000, 443, 0x18))))
	})
	if moved["snat-closed"] > 0 || moved["no-flow"] > 0 {
		t.Errorf("EVICTED: drops %v after the pod's 200,000 unanswered flows", moved)
	}
}

// A pod's UDP answer to a client whose entry is gone may leave (UDP has
// no SYN to tell), but only as an unanswered flow in lace_ct_new.
func TestCTUDPAnswerWaitsInNew(t *testing.T) {
	d := snatDatapath(t)
	c := netip.MustParseAddr("198.51.100.9")
	runPod(t, d, ether(unicastMAC, 0x0800, ipv4(progPodV4, c, 17, udp(53, 40000))))
	flows, err := d.Conntrack()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range flows {
		if !f.New && f.SNATPort != 0 {
			t.Errorf("a UDP answer to nobody holds node port %d and a lace_ct entry: %+v", f.SNATPort, f)
		}
	}
}

// A spoofed outside host handshakes blindly with a NodePort whose
// endpoint is on this node (SYN, an ACK for a SYN-ACK it never saw); the
// pod resets it: no entry may stay established. The spoofer then ignores
// the reset and sends one more ACK: the pod's own reset left this node
// from the pod (nobody on the path forged it), so the flow is not revived
// to the established 6 h in lace_ct (rev17b review).
func TestCTBlindNodePortHandshakeCloses(t *testing.T) {
	d := nodePortWorld(t, progPodV4)
	c := netip.MustParseAddr("203.0.113.5")
	if v, _ := runUnder(t, d, ether(unicastMAC, 0x0800, ipv4(c, progNodeV4, 6, seg4(5555, 30080, 0x02)))); v != actRedirect {
		t.Fatalf("SYN verdict %d", v)
	}
	runPod(t, d, ether(unicastMAC, 0x0800, ipv4(progPodV4, c, 6, seg4(8080, 5555, 0x12))))     // SYN-ACK (to nobody)
	runUnder(t, d, ether(unicastMAC, 0x0800, ipv4(c, progNodeV4, 6, seg4(5555, 30080, 0x10)))) // blind ACK
	runPod(t, d, ether(unicastMAC, 0x0800, ipv4(progPodV4, c, 6, seg4(8080, 5555, 0x04))))     // the pod resets it
	noLongEntries(t, d, "PINNED", "after the pod refused the handshake")
	runUnder(t, d, ether(unicastMAC, 0x0800, ipv4(c, progNodeV4, 6, seg4(5555, 30080, 0x10)))) // the spoofer ignores it
	noLongEntries(t, d, "REVIVED", "after the pod reset the blind handshake")
}

// nodePortWorld programs a world network classifying every IPv4 source,
// a ClusterIP 10.96.0.10:80 of the pods' network in its view, and its
// NodePort 30080 on this node, both to the backends, port 8080.
func nodePortWorld(t *testing.T, backends ...netip.Addr) *Datapath {
	t.Helper()
	d := progPodDatapath(t)
	cip := netip.MustParseAddr("10.96.0.10")
	for _, err := range []error{
		d.UpsertNetwork(Network{ID: snatWorld}),
		d.UpsertClassifier(Classifier{NetID: snatWorld, Prefix: netip.MustParsePrefix("0.0.0.0/0")}),
		d.UpsertRoute(Route{NetID: snatWorld, Prefix: netip.MustParsePrefix("0.0.0.0/0"), Kind: tables.RouteExternal, DstNet: snatWorld}),
		d.UpsertRoute(Route{NetID: snatWorld, Prefix: netip.PrefixFrom(cip, 32), Kind: tables.RouteService, DstNet: progNet}),
	} {
		if err != nil {
			t.Fatal(err)
		}
	}
	var be []tables.Backend
	for _, b := range backends {
		be = append(be, tables.Backend{Addr: b, Port: 8080})
	}
	if _, err := d.ApplyServices([]Service{
		{VIP: cip, Proto: 6, Port: 80, NetID: progNet, Backends: be},
		{VIP: progNodeV4, Proto: 6, Port: 30080, NetID: progNet, Backends: be, Frontend: tables.FrontendNodePort, ClusterIP: cip, ClusterPort: 80},
	}); err != nil {
		t.Fatal(err)
	}
	return d
}

// noLongEntries fails (saying what, when) for every conntrack entry left
// with more than 60 s to live, and when there is none at all.
func noLongEntries(t *testing.T, d *Datapath, what, when string) {
	t.Helper()
	now, err := monotonicNow()
	if err != nil {
		t.Fatal(err)
	}
	flows, err := d.Conntrack()
	if err != nil {
		t.Fatal(err)
	}
	if len(flows) == 0 {
		t.Fatal("no conntrack entries")
	}
	for _, f := range flows {
		if left := (int64(f.ExpiresMonotonicNanos) - int64(now)) / 1e9; left > 60 {
			t.Errorf("%s: %+v expires in %ds %s", what, f, left, when)
		}
	}
}

// An answer alone (a forged ACK to an unanswered SYN: SEEN_REPLY, not
// assured) never earns the established timeout.
func TestCTEstablishedOnlyAssured(t *testing.T) {
	d := snatDatapath(t)
	dst := netip.MustParseAddrPort("198.51.100.7:443")
	P := leaves(t, d, 6, 41000, dst)
	runUnder(t, d, ether(unicastMAC, 0x0800, ipv4(dst.Addr(), progNodeV4, 6, seg4(443, P, 0x10))))
	now, _ := monotonicNow()
	_, cv := ctOf(t, d, 6, 41000, dst)
	if left := (int64(cv.Expires) - int64(now)) / 1e9; left > 60 {
		t.Errorf("an unassured flow expires in %ds (flags %#x); want at most the SYN's 60 s", left, cv.Flags)
	}
}

// A later IPv4 fragment has no L4 header: without its first fragment
// (frag.h) it is dropped (fragment-before-first) and nothing of it is
// rewritten nor a port taken.
func TestCTLaterFragmentNotTranslated(t *testing.T) {
	d := snatDatapath(t)
	dst := netip.MustParseAddr("198.51.100.7")
	payload := []byte{0xAA, 0xBB, 0xCC, 0xDD, 0x11, 0x22, 0x33, 0x44, 0x55, 0x66, 0x77, 0x88}
	pkt := ipv4(progPodV4, dst, 17, payload)
	binary.BigEndian.PutUint16(pkt[6:8], 185) // fragment offset 1480, MF clear
	var out []byte
	moved := snatDrops(t, d, func() { _, out = runPod(t, d, ether(unicastMAC, 0x0800, pkt)) })
	if string(out[34:46]) != string(payload) {
		t.Errorf("MANGLED: fragment payload % x became % x", payload, out[34:46])
	}
	if moved["fragment-before-first"] != 1 {
		t.Errorf("drops %v; want one fragment-before-first drop", moved)
	}
	if flows, _ := d.Conntrack(); len(flows) != 0 {
		t.Errorf("a fragment opened flows: %+v", flows)
	}
}

package datapath

import (
	"encoding/binary"
	"net/netip"
	"testing"

	"github.com/lace-cni/lace/internal/tables"
)

// TestXLBPortsOfClosedFlowsFreed: a NodePort's flows to an endpoint on
// another node leave from node ports, SNAT_PORT_RANGE of them toward that
// endpoint. A port whose TCP flow closed by FINs both ways and then fell
// silent for half a second goes to a new flow; held until the client's entry
// expired (10 s after the close), the ports capped new connections at
// about 450 a second per endpoint. A live flow, a flow reset from outside
// (the client's reset, or one forged by anybody on the path), one closed
// one way, and one whose FINs both ways (which anybody on the path can
// forge) are followed by more packets keep their ports: with every port
// so held, a new SYN is dropped snat-failed. So is a port whose client's
// entry was lost while its mapping has time left.
func TestXLBPortsOfClosedFlowsFreed(t *testing.T) {
	remote := netip.MustParseAddr("10.70.2.5")
	const settled = ctSNAT | ctSeenReply | ctAssured
	// expires is a TCP flow's last packet + 10 s once it closed; an
	// established flow's is hours away.
	const closeTimeout = 10e9
	for _, tc := range []struct {
		name  string
		flags uint16
		// left is how long the entries have to live.
		left uint64
		// lost: the clients' entries are gone, and their mappings expire
		// in lost (0: the entries stay).
		lost     int64
		halfOpen bool
		freed    bool
	}{
		{"established", settled, 3600e9, 0, false, false},
		{"reset by the client, silent since", settled | ctRST, closeTimeout - 2e9, 0, false, false},
		{"FIN one way, silent since", settled | ctFinOrig, closeTimeout - 2e9, 0, false, false},
		// Both FINs may be forged: a flow that still talks keeps its port.
		{"FINs both ways, talking", settled | ctFinOrig | ctFinReply, closeTimeout - 1e8, 0, false, false},
		{"FINs both ways, silent 2 s", settled | ctFinOrig | ctFinReply, closeTimeout - 2e9, 0, false, true},
		// The shared lace_ct evicts an idle client's entry when a tenant
		// opens enough flows: the mapping holds the port until its own
		// expiry (the last its entry had), not the first new flow.
		{"entry lost, mapping live", settled, 3600e9, 3600e9, false, false},
		{"entry lost, mapping expired", settled, 3600e9, -1e9, false, true},
		// A flood's mappings (its clients sent only SYNs) whose entries
		// lace_ct_new evicted: the endpoint holds a request at most,
		// which the reset ahead clears; early drop takes them.
		{"entry lost, mapping live, only SYNs", settled, 3600e9, 3600e9, true, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d := nodePortWorld(t, remote)
			holdAllXLBPorts(t, d, remote, tc.flags, tc.left)
			if tc.lost != 0 {
				loseXLBOwners(t, d, remote, tc.lost, tc.halfOpen)
			}
			client := netip.MustParseAddrPort("203.0.113.5:40000")
			// (The test's namespace has no route to the endpoint's node:
			// snatDrops leaves that drop out.)
			moved := snatDrops(t, d, func() {
				runUnder(t, d, ether(unicastMAC, 0x0800, ipv4(client.Addr(), progNodeV4, 6, seg4(client.Port(), 30080, 0x02))))
			})
			if tc.freed {
				if len(moved) != 0 {
					t.Fatalf("a new SYN: drops %v; want it out on a freed port", moved)
				}
				if p := nodePortFlow(t, d, client).SNATPort; p < snatPortMin {
					t.Errorf("the new flow holds node port %d", p)
				}
				return
			}
			if len(moved) != 1 || moved["snat-failed"] != 1 {
				t.Errorf("a new SYN: drops %v; want it dropped snat-failed, every port held", moved)
			}
		})
	}
}

// holdAllXLBPorts gives every node port toward remote:8080 to a client's
// flow through NodePort 30080 (SYNs from many sources), then makes each
// client's entry settled with flags, expiring in left.
func holdAllXLBPorts(t *testing.T, d *Datapath, remote netip.Addr, flags uint16, left uint64) {
	t.Helper()
	// More SYNs than ports: the last ones take the ports left over from
	// their random tries (early drop of the oldest unanswered flows).
	for i := range snatPorts + 500 {
		src := netip.AddrFrom4([4]byte{172, 31, byte(i / 60000), 200})
		runUnder(t, d, ether(unicastMAC, 0x0800, ipv4(src, progNodeV4, 6, seg4(uint16(1024+i%60000), 30080, 0x02))))
	}
	// A few ports the flood's random tries never hit: they go to copies
	// of a flood flow with client ports of their own, so that every port
	// has a live owner.
	var k underlayXlbRevKey
	var v underlayXlbRevVal
	var tmpl *underlayXlbRevVal
	held := map[uint16]bool{}
	it := d.underlay.LaceXlbRev.Iterate()
	for it.Next(&k, &v) {
		if fromAddr16(k.Family, k.Raddr) == remote {
			held[ntohs(k.Port)] = true
			tmpl = &underlayXlbRevVal{}
			*tmpl = v
		}
	}
	if err := it.Err(); err != nil {
		t.Fatal(err)
	}
	if tmpl == nil {
		t.Fatal("the flood took no node port")
	}
	// Each client spoke past its SYN (its flow is settled below): no
	// flow is half open at the endpoint.
	for port := range held {
		rk := xlbRevKey(remote, port)
		if err := d.underlay.LaceXlbRev.Lookup(rk, &v); err != nil {
			t.Fatal(err)
		}
		v.Flags &^= 1 // XLB_REV_HALF_OPEN
		if err := d.underlay.LaceXlbRev.Put(rk, v); err != nil {
			t.Fatal(err)
		}
	}
	tmpl.Flags &^= 1
	filled := 0
	for i := range uint16(snatPorts) {
		port := snatPortMin + i
		if held[port] {
			continue
		}
		rk := underlayXlbRevKey{Family: 4, Proto: 6, Port: ntohs(port), Rport: ntohs(8080)}
		a := remote.As4()
		copy(rk.Raddr[:], a[:])
		rv := *tmpl
		rv.Cport = ntohs(65000 - i)
		ck := podCtKey{NetId: rv.ExtNet, Family: 4, Proto: 6, Lport: rv.Fport, Rport: rv.Cport, Laddr: rv.Front, Raddr: rv.Client}
		cv := podCtVal{Flags: ctSNAT, SnatPort: ntohs(port), PeerNet: rv.ExtNet}
		if err := d.underlay.LaceXlbRev.Put(rk, rv); err != nil {
			t.Fatal(err)
		}
		if err := d.pod.LaceCt.Put(ck, cv); err != nil {
			t.Fatal(err)
		}
		filled++
	}
	t.Logf("the flood held %d node ports, copies of its flows %d", len(held), filled)
	now, err := monotonicNow()
	if err != nil {
		t.Fatal(err)
	}
	keys, vals := takeSNATEntries(t, d)
	for i := range vals {
		vals[i].Flags, vals[i].Expires = flags, now+left
	}
	if _, err := d.pod.LaceCt.BatchUpdate(keys, vals, nil); err != nil {
		t.Fatal(err)
	}
}

// takeSNATEntries deletes the conntrack entries of every flow leaving
// from a node port, and returns them.
func takeSNATEntries(t *testing.T, d *Datapath) ([]podCtKey, []podCtVal) {
	t.Helper()
	var keys []podCtKey
	var vals []podCtVal
	for _, m := range d.ctMaps() {
		var k podCtKey
		var v podCtVal
		var gone []podCtKey
		it := m.Iterate()
		for it.Next(&k, &v) {
			if v.Flags&ctSNAT != 0 {
				keys, vals, gone = append(keys, k), append(vals, v), append(gone, k)
			}
		}
		if err := it.Err(); err != nil {
			t.Fatal(err)
		}
		for _, k := range gone {
			if err := m.Delete(k); err != nil {
				t.Fatal(err)
			}
		}
	}
	return keys, vals
}

// loseXLBOwners deletes the conntrack entries of every flow leaving
// from a node port (an eviction) and gives each mapping toward remote
// left to live, marked as its client's having sent only SYNs when
// halfOpen.
func loseXLBOwners(t *testing.T, d *Datapath, remote netip.Addr, left int64, halfOpen bool) {
	t.Helper()
	now, err := monotonicNow()
	if err != nil {
		t.Fatal(err)
	}
	takeSNATEntries(t, d)
	var k underlayXlbRevKey
	var v underlayXlbRevVal
	var keys []underlayXlbRevKey
	it := d.underlay.LaceXlbRev.Iterate()
	for it.Next(&k, &v) {
		if fromAddr16(k.Family, k.Raddr) == remote {
			keys = append(keys, k)
		}
	}
	if err := it.Err(); err != nil {
		t.Fatal(err)
	}
	for _, k := range keys {
		if err := d.underlay.LaceXlbRev.Lookup(&k, &v); err != nil {
			t.Fatal(err)
		}
		v.Expires = uint64(int64(now) + left)
		if halfOpen {
			v.Flags |= 1 // XLB_REV_HALF_OPEN
		}
		if err := d.underlay.LaceXlbRev.Put(&k, &v); err != nil {
			t.Fatal(err)
		}
	}
}

// TestXLBRestartKeepsPort: a client's reset and then a SYN on the same
// tuple, both of which anybody on the path can forge. After the reset of
// an assured flow the SYN does not start it over: it goes on as the
// flow's, from the same node port to the same endpoint (whose connection
// is still open when the reset was forged: it answers with a challenge
// ACK, which revives the entry). Before, the SYN started the flow over on
// another port, and the old one, with no owner, went to the next client
// toward the endpoint with the endpoint's answers to the open connection.
// After FINs both ways the SYN starts the flow over; the old port stays
// held (its mapping names the client) until the closed flow fell silent.
func TestXLBRestartKeepsPort(t *testing.T) {
	remote := netip.MustParseAddr("10.70.2.5")
	for _, tc := range []struct {
		name           string
		client, answer byte // the close: the client's, then the endpoint's (0: none)
		restart        bool
	}{
		{"reset by the client", 0x04, 0, false},
		{"FINs both ways", 0x11, 0x11, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := newXLBClient(t, remote)
			d, client, send := c.d, c.client, c.send
			p := c.established()
			send(tc.client)
			if tc.answer != 0 {
				c.answer(p, tc.answer)
			}
			send(0x02)
			f := nodePortFlow(t, d, client)
			if f.Assured == tc.restart {
				t.Errorf("the SYN after the close: entry assured %v, want started over %v", f.Assured, tc.restart)
			}
			if !tc.restart && f.SNATPort != p {
				t.Errorf("the SYN left from node port %d, the flow had %d: the old port has no owner", f.SNATPort, p)
			}
			if got, _ := c.mapping(p); got != client {
				t.Errorf("port %d maps back to %s, want %s", p, got, client)
			}
			send(0x10)
			if got := nodePortFlow(t, d, client).SNATPort; got != f.SNATPort {
				t.Errorf("the next segment left from port %d, want %d", got, f.SNATPort)
			}
		})
	}
}

// TestXLBLostEntryHoldKept: an established NodePort flow whose client's
// entry was lost (the shared lace_ct evicts the idle) keeps its port for
// its mapping's hold. A SYN forged on its tuple does not take the mapping
// back as its own (its unanswered entry, expiring in seconds, would set
// the hold): it leaves from another port. A segment of the flow (the
// client's, or one forged) goes on from the same port, and neither it nor
// the endpoint's answer cuts the hold to an unanswered flow's.
func TestXLBLostEntryHoldKept(t *testing.T) {
	remote := netip.MustParseAddr("10.70.2.5")
	client := netip.MustParseAddrPort("203.0.113.5:40000")
	for _, tc := range []struct {
		name  string
		flags byte
	}{{"a SYN", 0x02}, {"a segment", 0x10}} {
		t.Run(tc.name, func(t *testing.T) {
			c := newXLBClient(t, remote)
			d := c.d
			p := c.established()
			loseXLBOwners(t, d, remote, 3600e9, false)
			c.send(tc.flags)
			f := nodePortFlow(t, d, client)
			if tc.flags == 0x02 && f.SNATPort == p {
				t.Errorf("a SYN on the lost flow's tuple took its established mapping (port %d) as its own", p)
			}
			if tc.flags != 0x02 && f.SNATPort != p {
				t.Errorf("the lost flow's segment left from port %d, want %d", f.SNATPort, p)
			}
			if tc.flags != 0x02 {
				c.answer(p, 0x10)
			}
			now, err := monotonicNow()
			if err != nil {
				t.Fatal(err)
			}
			if got, until := c.mapping(p); got != client || until < now+3000e9 {
				t.Errorf("port %d maps back to %s until %d (now %d), want %s held for the hour it had", p, got, until, now, client)
			}
		})
	}
}

// TestXLBPortOfPodSNATKept: a client whose entry was lost comes back on
// its tuple to the port drawn from it, whose mapping still names it. A
// pod's SNAT flow to the same endpoint (outside the cluster: a hostNetwork
// endpoint's node) that took that port meanwhile keeps it: the client's
// flow leaves from another one. Taken back, the endpoint's answers to the
// pod's flow went to the client.
func TestXLBPortOfPodSNATKept(t *testing.T) {
	remote := netip.MustParseAddr("10.70.2.5")
	d := nodePortWorld(t, remote)
	client := netip.MustParseAddrPort("203.0.113.5:40000")
	syn := ether(unicastMAC, 0x0800, ipv4(client.Addr(), progNodeV4, 6, seg4(client.Port(), 30080, 0x02)))
	runUnder(t, d, syn)
	p := nodePortFlow(t, d, client).SNATPort
	if p < snatPortMin {
		t.Fatalf("the flow holds node port %d", p)
	}
	loseXLBOwners(t, d, remote, 3600e9, false)
	now, err := monotonicNow()
	if err != nil {
		t.Fatal(err)
	}
	// The pod's flow 10.244.1.7:5000 -> remote:8080 from node port p.
	podAddr := netip.MustParseAddr("10.244.1.7")
	sk := snatKeyOf(6, netip.AddrPortFrom(remote, 8080), p)
	sv := podSnatVal{NetId: progNet, Lport: ntohs(5000)}
	a := podAddr.As4()
	copy(sv.Laddr[:], a[:])
	ck := podCtKey{NetId: progNet, Family: 4, Proto: 6, Lport: sv.Lport, Rport: ntohs(8080), Laddr: sv.Laddr, Raddr: sk.Raddr}
	cv := podCtVal{Flags: ctOriginLocal | ctSeenReply | ctAssured | ctSNAT, SnatPort: ntohs(p), PeerNet: snatWorld, Expires: now + 3600e9}
	if err := d.pod.LaceSnat.Put(sk, sv); err != nil {
		t.Fatal(err)
	}
	if err := d.pod.LaceCt.Put(ck, cv); err != nil {
		t.Fatal(err)
	}
	runUnder(t, d, syn)
	if got := nodePortFlow(t, d, client).SNATPort; got == p || got < snatPortMin {
		t.Errorf("the client's flow took node port %d back, which the pod's SNAT flow holds", got)
	}
}

// TestXLBRevNotEvicted: lace_xlb_rev is a plain hash. Full, a new flow
// toward an endpoint it holds no port for is dropped snat-failed, and no
// mapping is evicted for it (an LRU evicted the idle, whose ports went to
// the next client with their endpoints' answers). The agent's sweep
// deletes the mappings whose flows are over, and only those; the new
// flow then gets its port.
func TestXLBRevNotEvicted(t *testing.T) {
	remote := netip.MustParseAddr("10.70.2.5")
	d := nodePortWorld(t, remote)
	m := d.underlay.LaceXlbRev
	now, err := monotonicNow()
	if err != nil {
		t.Fatal(err)
	}
	// Every entry toward other endpoints (10.71.x.x); one in three has
	// expired, with no entry naming its port (a flow that is over).
	size := int(m.MaxEntries())
	keys := make([]underlayXlbRevKey, size)
	vals := make([]underlayXlbRevVal, size)
	expired := 0
	for i := range size {
		ep := uint16(i / snatPorts)
		keys[i] = underlayXlbRevKey{Family: 4, Proto: 6, Port: ntohs(snatPortMin + uint16(i%snatPorts)), Rport: ntohs(8080)}
		keys[i].Raddr[0], keys[i].Raddr[1], keys[i].Raddr[2], keys[i].Raddr[3] = 10, 71, byte(ep>>8), byte(ep)
		vals[i] = underlayXlbRevVal{Cport: ntohs(uint16(1024 + i%60000)), Fport: ntohs(30080), ExtNet: snatWorld, Expires: now + 3600e9}
		vals[i].Client[0], vals[i].Client[1], vals[i].Client[2], vals[i].Client[3] = 198, 18, byte(i>>8), byte(i)
		if i%3 == 0 {
			vals[i].Expires = now - 1e9
			expired++
		}
	}
	if n, err := m.BatchUpdate(keys, vals, nil); err != nil || n != size {
		t.Fatalf("fill lace_xlb_rev: %d of %d, %v", n, size, err)
	}
	client := netip.MustParseAddrPort("203.0.113.5:40000")
	syn := ether(unicastMAC, 0x0800, ipv4(client.Addr(), progNodeV4, 6, seg4(client.Port(), 30080, 0x02)))
	moved := snatDrops(t, d, func() { runUnder(t, d, syn) })
	if len(moved) != 1 || moved["snat-failed"] != 1 {
		t.Errorf("a SYN with lace_xlb_rev full: drops %v, want it dropped snat-failed", moved)
	}
	if n := countXLBRev(t, d); n != size {
		t.Fatalf("lace_xlb_rev holds %d mappings after the SYN, want the %d it was filled with", n, size)
	}
	var v underlayXlbRevVal
	for i := range keys {
		if err := m.Lookup(&keys[i], &v); err != nil {
			t.Fatalf("EVICTED: mapping %d (port %d toward %v): %v", i, ntohs(keys[i].Port), keys[i].Raddr[:4], err)
		}
	}

	n, err := d.ReclaimSNAT()
	if err != nil || n != expired {
		t.Errorf("ReclaimSNAT: %d, %v; want the %d expired mappings deleted", n, err, expired)
	}
	for i := range keys {
		err := m.Lookup(&keys[i], &v)
		if live := i%3 != 0; live && err != nil {
			t.Fatalf("the sweep deleted live mapping %d: %v", i, err)
		} else if !live && err == nil {
			t.Fatalf("the sweep kept expired mapping %d", i)
		}
	}
	if moved := snatDrops(t, d, func() { runUnder(t, d, syn) }); len(moved) != 0 {
		t.Errorf("the SYN after the sweep: drops %v", moved)
	}
	if p := nodePortFlow(t, d, client).SNATPort; p < snatPortMin {
		t.Errorf("the SYN after the sweep holds node port %d", p)
	}
}

func countXLBRev(t *testing.T, d *Datapath) int {
	t.Helper()
	var k underlayXlbRevKey
	var v underlayXlbRevVal
	n := 0
	it := d.underlay.LaceXlbRev.Iterate()
	for it.Next(&k, &v) {
		n++
	}
	if err := it.Err(); err != nil {
		t.Fatal(err)
	}
	return n
}

// TestXLBEndpointAnswers: what the endpoint of a NodePort flow sends back
// over SRv6 is its own (nobody outside can forge it), and tells what the
// client's resets and SYNs cannot:
//   - its reset is final. A blind client (a spoofed source: a SYN, an ACK
//     for a SYN-ACK it never saw, assured) that the endpoint resets, and
//     that resets in turn and then sends a SYN now and then, used to keep
//     an assured entry, whose port early drop never takes; now the SYN
//     starts the flow over, unassured;
//   - its SYN-ACK to a SYN that went on after the client's reset is a new
//     connection: the entry is revived (its reset forgotten, an
//     established flow's timeout), not left to expire 10 s later while the
//     connection lives;
//   - anything but a SYN says it holds more than a request: the mapping is
//     not half open (its port is not free to early drop once its entry is
//     lost).
func TestXLBEndpointAnswers(t *testing.T) {
	remote := netip.MustParseAddr("10.70.2.5")
	// The client's SYN (sequence number 0) and its node port.
	setup := func(t *testing.T) (*xlbClient, uint16) {
		c := newXLBClient(t, remote)
		c.send(0x02)
		p := nodePortFlow(t, c.d, c.client).SNATPort
		if p < snatPortMin {
			t.Fatalf("the flow holds node port %d", p)
		}
		return c, p
	}
	t.Run("its reset is final", func(t *testing.T) {
		c, p := setup(t)
		c.answer(p, 0x12) // SYN-ACK
		c.blind(0x10)     // the blind ACK: assured
		if !nodePortFlow(t, c.d, c.client).Assured {
			t.Fatal("the handshake did not assure the flow: the test cannot tell")
		}
		c.answer(p, 0x04) // the endpoint refuses it
		c.send(0x04)
		c.send(0x02)
		if f := nodePortFlow(t, c.d, c.client); f.Assured {
			t.Errorf("a SYN after the endpoint's reset and the client's: entry %+v still assured, want the flow started over", f)
		}
	})
	t.Run("its SYN-ACK revives", func(t *testing.T) {
		c, p := setup(t)
		c.answer(p, 0x12)
		c.send(0x10)
		c.send(0x04) // the client's reset
		c.send(0x02) // and its SYN on the same tuple: goes on as the flow's
		c.answer(p, 0x12)
		now, err := monotonicNow()
		if err != nil {
			t.Fatal(err)
		}
		f := nodePortFlow(t, c.d, c.client)
		if f.Reset || f.SNATPort != p || f.ExpiresMonotonicNanos < now+60e9 {
			t.Errorf("after the endpoint's SYN-ACK: entry %+v (now %d), want it revived on port %d with an established flow's timeout", f, now, p)
		}
		if _, until := c.mapping(p); until < now+60e9 {
			t.Errorf("after the endpoint's SYN-ACK: the mapping is held until %d (now %d), want an established flow's hold", until, now)
		}
	})
	// What shows a connection ends the mapping's half open state; what a
	// request also sends does not.
	halfOpen := func(t *testing.T, c *xlbClient, p uint16, want bool, after string) {
		t.Helper()
		if _, half := xlbRevOf(t, c.d, remote, p); half != want {
			t.Errorf("after %s: port %d half open %v, want %v", after, p, half, want)
		}
	}
	t.Run("a blind client stays half open", func(t *testing.T) {
		c, p := setup(t)
		halfOpen(t, c, p, true, "the client's SYN")
		c.answer(p, 0x12)
		halfOpen(t, c, p, true, "the endpoint's SYN-ACK")
		c.send(0x02) // another SYN on the tuple: the request answers it with a bare ACK of the first
		c.answerSeg(p, 0x10, c.isn+1, nil)
		halfOpen(t, c, p, true, "the endpoint's bare ACK of the SYN")
		c.blind(0x10)
		if !nodePortFlow(t, c.d, c.client).Assured {
			t.Fatal("the blind ACK did not assure the flow: the test cannot tell")
		}
		halfOpen(t, c, p, true, "the blind client's ACK")
		c.sendSeg(0x10, c.isn+1, c.eisn+2)
		halfOpen(t, c, p, true, "an ACK of a byte past the SYN-ACK (the endpoint sent none)")
		c.sendSeg(0x14, c.isn+1, c.eisn+1)
		halfOpen(t, c, p, true, "a reset that acknowledges the SYN-ACK")
		c.answer(p, 0x04)
		halfOpen(t, c, p, true, "the endpoint's reset")
	})
	// Only the client the SYN-ACK went to knows its sequence number: its
	// ACK of it shows a connection, one on which nobody may have spoken
	// yet (a pooled connection), which early drop then never takes, and
	// whose port is held as long as its entry.
	t.Run("the client's ACK of the SYN-ACK shows a connection", func(t *testing.T) {
		c, p := setup(t)
		c.answer(p, 0x12)
		c.send(0x10)
		halfOpen(t, c, p, false, "the client's ACK of the SYN-ACK")
		now, err := monotonicNow()
		if err != nil {
			t.Fatal(err)
		}
		if _, until := c.mapping(p); until < now+3600e9 {
			t.Errorf("the mapping is held until %d (now %d), want an established flow's hold", until, now)
		}
	})
	t.Run("data shows a connection", func(t *testing.T) {
		c, p := setup(t)
		c.answer(p, 0x12)
		c.answerSeg(p, 0x18, c.isn+1, []byte("hello")) // the endpoint speaks first
		halfOpen(t, c, p, false, "the endpoint's data")
	})
	// The endpoint's request may be another SYN's than the one the node
	// recorded (a SYN|FIN it dropped, a SYN with a bad checksum, then
	// another SYN on the tuple): its SYN-ACK says which.
	t.Run("the request's own SYN counts", func(t *testing.T) {
		c, p := setup(t)
		other := c.isn + 1000
		c.sendSeq(0x02, other)
		c.answerSeg(p, 0x12, other+1, nil)
		c.answerSeg(p, 0x10, other+1, nil) // the request's bare ACK to a stray segment
		halfOpen(t, c, p, true, "the bare ACK of the request's SYN, another than the one recorded")
		c.answerSeg(p, 0x10, other+2, nil)
		halfOpen(t, c, p, false, "an ACK of data past the request's SYN")
	})
	// An ACK without a SYN-ACK before it (a TIME_WAIT's, an older
	// connection's on the port) shows nothing of this client.
	t.Run("no SYN-ACK, no connection", func(t *testing.T) {
		c, p := setup(t)
		c.answerSeg(p, 0x10, 0x55555555, nil)
		halfOpen(t, c, p, true, "an ACK with no SYN-ACK before it")
	})
	// Data, though, only a connection sends (one revived by a segment
	// after its mapping was gone has no SYN-ACK recorded).
	t.Run("data with no SYN-ACK shows a connection", func(t *testing.T) {
		c, p := setup(t)
		c.answerSeg(p, 0x18, 0x55555555, []byte("hello"))
		halfOpen(t, c, p, false, "the endpoint's data with no SYN-ACK before it")
	})
	t.Run("an ACK of the client's data shows a connection", func(t *testing.T) {
		c, p := setup(t)
		c.answer(p, 0x12)
		c.answer(p, 0x10) // acknowledges a byte past the SYN
		halfOpen(t, c, p, false, "the endpoint's ACK of the client's data")
	})
}

// xlbClient is a client's flow through NodePort 30080 of d to the
// endpoint remote:8080 on another node, whose node answers over SRv6 in
// the nodes' context.
type xlbClient struct {
	t      *testing.T
	d      *Datapath
	remote netip.Addr
	client netip.AddrPort
	isn    uint32 // the client's SYN's sequence number
	eisn   uint32 // the endpoint's SYN-ACK's
}

func newXLBClient(t *testing.T, remote netip.Addr) *xlbClient {
	d := nodePortWorld(t, remote)
	if err := d.UpsertNetwork(Network{ID: tables.NodeNetID}); err != nil {
		t.Fatal(err)
	}
	return &xlbClient{t: t, d: d, remote: remote, client: netip.MustParseAddrPort("203.0.113.5:40000"), isn: 0x11223344, eisn: 0x55667788}
}

// send runs the client's segment with flags through the node (a SYN with
// sequence number isn, anything else isn + 1, acknowledging the endpoint's
// SYN-ACK); nothing may be dropped.
func (c *xlbClient) send(flags byte) { c.sendSeg(flags, c.isn+1, c.eisn+1) }

// sendSeq is send with sequence number seq.
func (c *xlbClient) sendSeq(flags byte, seq uint32) { c.sendSeg(flags, seq, c.eisn+1) }

// blind is send by a blind client (a spoofed source): it never saw the
// endpoint's SYN-ACK, and acknowledges another number.
func (c *xlbClient) blind(flags byte) { c.sendSeg(flags, c.isn+1, c.eisn+0x7000) }

func (c *xlbClient) sendSeg(flags byte, seq, ack uint32) {
	c.t.Helper()
	seg := seg4(c.client.Port(), 30080, flags)
	if flags&0x02 != 0 && seq == c.isn+1 {
		seq = c.isn
	}
	binary.BigEndian.PutUint32(seg[4:8], seq)
	binary.BigEndian.PutUint32(seg[8:12], ack)
	if moved := snatDrops(c.t, c.d, func() {
		runUnder(c.t, c.d, ether(unicastMAC, 0x0800, ipv4(c.client.Addr(), progNodeV4, 6, seg)))
	}); len(moved) != 0 {
		c.t.Fatalf("the client's %#x: drops %v", flags, moved)
	}
}

// answer runs the endpoint's segment with flags to node port port, over
// SRv6 from its node: a SYN-ACK acknowledges the client's SYN (isn + 1),
// anything else a byte of the client's data past it; nothing may be
// dropped.
func (c *xlbClient) answer(port uint16, flags byte) {
	ack := c.isn + 2
	if flags&0x02 != 0 {
		ack = c.isn + 1
	}
	c.answerSeg(port, flags, ack, nil)
}

// answerSeg is answer with acknowledgment number ack and data (a SYN-ACK
// with sequence number eisn, anything else eisn + 1).
func (c *xlbClient) answerSeg(port uint16, flags byte, ack uint32, data []byte) {
	c.t.Helper()
	seg := seg4(8080, port, flags)
	seq := c.eisn + 1
	if flags&0x02 != 0 {
		seq = c.eisn
	}
	binary.BigEndian.PutUint32(seg[4:8], seq)
	binary.BigEndian.PutUint32(seg[8:12], ack)
	sid := SID(progLocator, BehaviourL3Decap, progNet, tables.NodeNetID)
	if moved := snatDrops(c.t, c.d, func() {
		runUnder(c.t, c.d, srv6(progPeerV6, sid, ipv4(c.remote, progNodeV4, 6, append(seg, data...)), true))
	}); len(moved) != 0 {
		c.t.Fatalf("the endpoint's %#x: drops %v", flags, moved)
	}
}

// answered runs the client's SYN and the endpoint's SYN-ACK, and returns
// the flow's node port.
func (c *xlbClient) answered() uint16 {
	c.t.Helper()
	c.send(0x02)
	p := nodePortFlow(c.t, c.d, c.client).SNATPort
	if p < snatPortMin {
		c.t.Fatalf("the flow holds node port %d", p)
	}
	c.answer(p, 0x12)
	return p
}

// afterLoss loses every client's entry (an eviction) and runs the
// client's segment with flags, which must leave from port p still.
func (c *xlbClient) afterLoss(p uint16, flags byte) {
	c.t.Helper()
	takeSNATEntries(c.t, c.d)
	c.send(flags)
	if f := nodePortFlow(c.t, c.d, c.client); f.SNATPort != p {
		c.t.Fatalf("the client's %#x after its entry was lost left from port %d, want %d: the test cannot tell", flags, f.SNATPort, p)
	}
}

// established runs the client's handshake with the endpoint (its SYN,
// the endpoint's SYN-ACK, its ACK) and an ACK of the endpoint (a
// connection there), and returns the flow's node port.
func (c *xlbClient) established() uint16 {
	c.t.Helper()
	p := c.answered()
	c.send(0x10)
	c.answer(p, 0x10)
	if f := nodePortFlow(c.t, c.d, c.client); !f.Assured {
		c.t.Fatalf("the handshake left entry %+v, not assured", f)
	}
	return p
}

// mapping returns the client node port port maps back to, and until when.
func (c *xlbClient) mapping(port uint16) (netip.AddrPort, uint64) {
	c.t.Helper()
	var v underlayXlbRevVal
	if err := c.d.underlay.LaceXlbRev.Lookup(xlbRevKey(c.remote, port), &v); err != nil {
		c.t.Fatalf("the mapping of port %d: %v", port, err)
	}
	return netip.AddrPortFrom(fromAddr16(4, v.Client), ntohs(v.Cport)), v.Expires
}

// TestXLBBlindClientEarlyDropped: a blind client (a spoofed source: a SYN,
// an ACK for the SYN-ACK it never saw) is assured, with an established
// flow's timeout, but its endpoint never showed a connection (it keeps a
// request, or reset it): its mapping stays half open. With every port
// toward the endpoint held by such clients, a new SYN takes one of their
// ports (early drop, a reset ahead of it), where before it was dropped
// snat-failed: 4,536 such flows, three packets each, shut the endpoint
// off this node for hours.
func TestXLBBlindClientEarlyDropped(t *testing.T) {
	remote := netip.MustParseAddr("10.70.2.5")
	d := nodePortWorld(t, remote)
	holdAllXLBPorts(t, d, remote, ctSNAT|ctSeenReply|ctAssured, 3600e9)
	var k underlayXlbRevKey
	var v underlayXlbRevVal
	var keys []underlayXlbRevKey
	var vals []underlayXlbRevVal
	it := d.underlay.LaceXlbRev.Iterate()
	for it.Next(&k, &v) {
		v.Flags |= 1 | 2 // XLB_REV_HALF_OPEN | XLB_REV_ISN: what the blind client's handshake leaves
		keys, vals = append(keys, k), append(vals, v)
	}
	if err := it.Err(); err != nil {
		t.Fatal(err)
	}
	if _, err := d.underlay.LaceXlbRev.BatchUpdate(keys, vals, nil); err != nil {
		t.Fatal(err)
	}
	client := netip.MustParseAddrPort("203.0.113.5:40000")
	moved := snatDrops(t, d, func() {
		runUnder(t, d, ether(unicastMAC, 0x0800, ipv4(client.Addr(), progNodeV4, 6, seg4(client.Port(), 30080, 0x02))))
	})
	if len(moved) != 0 {
		t.Fatalf("a new SYN with every port held by blind clients: drops %v; want it out on one of theirs", moved)
	}
	if p := nodePortFlow(t, d, client).SNATPort; p < snatPortMin {
		t.Errorf("the new SYN holds node port %d", p)
	}
}

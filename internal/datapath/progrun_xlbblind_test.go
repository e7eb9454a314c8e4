package datapath

import (
	"bytes"
	"encoding/binary"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/cilium/ebpf"
)

// TestXLBBlindClientHeldSeconds: a blind client (a spoofed source: a SYN,
// then an ACK for the endpoint's SYN-ACK it never saw, sent so that it
// never reaches the endpoint intact) is assured, with an established
// flow's six hours, and its mapping used to follow the entry: two packets
// held a node port, and a slot of lace_xlb_rev, for hours, and about
// 131,000 of them filled the map, refusing new flows toward every other
// endpoint (snat-failed). Its mapping now stays half open and is held
// CT_NEW_IN after its last packet; past that, the agent's sweep deletes it
// although the assured entry still names its port.
func TestXLBBlindClientHeldSeconds(t *testing.T) {
	remote := netip.MustParseAddr("10.70.2.5")
	c := newXLBClient(t, remote)
	p := c.answered()
	c.blind(0x10)
	f := nodePortFlow(t, c.d, c.client)
	now, err := monotonicNow()
	if err != nil {
		t.Fatal(err)
	}
	if !f.Assured || f.ExpiresMonotonicNanos < now+3600e9 {
		t.Fatalf("the blind ACK left entry %+v (now %d), not assured for hours: the test cannot tell", f, now)
	}
	_, until := c.mapping(p)
	if until > now+5e9 {
		t.Errorf("the blind client's mapping is held %.0f s, want at most CT_NEW_IN (5 s)", float64(until-now)/1e9)
	}

	fillXLBRevHalf(t, c.d, now)
	// CT_NEW_IN later (the mapping's expiry moved back instead of
	// waiting): the client's entry still names the port.
	m := c.d.underlay.LaceXlbRev
	var v underlayXlbRevVal
	if err := m.Lookup(xlbRevKey(remote, p), &v); err != nil {
		t.Fatal(err)
	}
	v.Expires = now - 1
	if err := m.Put(xlbRevKey(remote, p), &v); err != nil {
		t.Fatal(err)
	}
	if got, err := c.d.ReclaimSNAT(); err != nil || got != 1 {
		t.Errorf("ReclaimSNAT: %d, %v; want the blind client's mapping deleted, and only it", got, err)
	}
	if err := m.Lookup(xlbRevKey(remote, p), &v); err == nil {
		t.Errorf("the blind client's mapping outlived its hold: %+v", v)
	}
	if f := nodePortFlow(t, c.d, c.client); !f.Assured || f.SNATPort != p {
		t.Fatalf("the blind client's entry %+v changed: the test no longer shows a mapping swept under a live owner", f)
	}
}

// TestXLBRevMigratesFromV2: mappings pinned by an agent of layout version
// 2 (56-byte values, no eisn) are kept as they were, without
// XLB_REV_EISN: a half open one held for hours may be a blind client's or
// an honest connection nobody spoke on, and cut short it would go first
// to early drop. It is marked XLB_REV_V2, which keeps it from the sweep
// while its entry lives.
func TestXLBRevMigratesFromV2(t *testing.T) {
	pin := tempPinDir(t)
	loadSized(t, pin, MapSizes{}).Close()
	path := filepath.Join(pin, "lace_xlb_rev")
	if err := os.Remove(path); err != nil {
		t.Fatal(err)
	}
	old, err := ebpf.NewMap(&ebpf.MapSpec{Name: "lace_xlb_rev", Type: ebpf.Hash, KeySize: 24, ValueSize: 56, MaxEntries: 65536})
	if err != nil {
		t.Fatal(err)
	}
	now, err := monotonicNow()
	if err != nil {
		t.Fatal(err)
	}
	val := func(flags uint32) []byte {
		v := make([]byte, 56)
		for i := range 40 {
			v[i] = byte(i + 1)
		}
		binary.NativeEndian.PutUint64(v[40:48], now+6*3600e9)
		binary.NativeEndian.PutUint32(v[48:52], 0x01020304)
		binary.NativeEndian.PutUint32(v[52:56], flags)
		return v
	}
	blind, conn := xlbRevKey(netip.MustParseAddr("10.70.2.5"), 61000), xlbRevKey(netip.MustParseAddr("10.70.2.5"), 61001)
	blindV, connV := val(1|2|4), val(2|4) // HALF_OPEN|ISN|SYNACK; a connection
	for _, e := range [][2][]byte{{blind, blindV}, {conn, connV}} {
		if err := old.Put(e[0], e[1]); err != nil {
			t.Fatal(err)
		}
	}
	if err := old.Pin(path); err != nil {
		t.Fatal(err)
	}
	meta, err := openLayoutMap(pin, false)
	if err != nil || meta == nil {
		t.Fatalf("lace_layout: %v", err)
	}
	id, ok := mapID(old)
	if !ok {
		t.Fatal("no ID for the old map")
	}
	if err := meta.Put(layoutKeyOf("lace_xlb_rev"), layoutRecord{2, id}); err != nil {
		t.Fatal(err)
	}
	meta.Close()
	old.Close()

	up := loadSized(t, pin, MapSizes{})
	if !slices.Contains(up.ReplacedMaps(), "lace_xlb_rev") {
		t.Errorf("replaced %v, want lace_xlb_rev migrated", up.ReplacedMaps())
	}
	got := make([]byte, up.underlay.LaceXlbRev.ValueSize())
	if err := up.underlay.LaceXlbRev.Lookup(conn, got); err != nil {
		t.Fatal(err)
	}
	if want := append(append([]byte(nil), connV...), make([]byte, 8)...); !bytes.Equal(got, want) {
		t.Errorf("the connection's mapping after the upgrade % x, want % x", got, want)
	}
	if err := up.underlay.LaceXlbRev.Lookup(blind, got); err != nil {
		t.Fatal(err)
	}
	want := append(append([]byte(nil), blindV...), make([]byte, 8)...)
	binary.NativeEndian.PutUint32(want[52:56], 1|2|4|16)
	if !bytes.Equal(got, want) {
		t.Errorf("the half open mapping after the upgrade % x, want % x", got, want)
	}
}

// TestXLBSynAckAgainNoHold: the endpoint retransmits its SYN-ACK to a
// client that never acknowledged it (a blind one's) for up to a minute;
// the same SYN-ACK again does not renew the half open mapping's hold. A
// new one (another connection on the tuple) does.
func TestXLBSynAckAgainNoHold(t *testing.T) {
	remote := netip.MustParseAddr("10.70.2.5")
	c := newXLBClient(t, remote)
	p := c.answered()
	var v underlayXlbRevVal
	key := xlbRevKey(remote, p)
	if err := c.d.underlay.LaceXlbRev.Lookup(key, &v); err != nil {
		t.Fatal(err)
	}
	now, err := monotonicNow()
	if err != nil {
		t.Fatal(err)
	}
	v.Expires = now + 1e9 // 4 s after the SYN-ACK
	if err := c.d.underlay.LaceXlbRev.Put(key, &v); err != nil {
		t.Fatal(err)
	}
	c.answer(p, 0x12)
	if err := c.d.underlay.LaceXlbRev.Lookup(key, &v); err != nil {
		t.Fatal(err)
	}
	if v.Expires > now+1e9 {
		t.Errorf("the retransmitted SYN-ACK renewed the half open hold by %.1f s", float64(v.Expires-now-1e9)/1e9)
	}
	c.eisn += 1000
	c.answer(p, 0x12)
	if err := c.d.underlay.LaceXlbRev.Lookup(key, &v); err != nil {
		t.Fatal(err)
	}
	if v.Expires <= now+1e9 {
		t.Error("a new SYN-ACK did not renew the half open hold")
	}
}

// TestXLBEarlyDropRanksByMappingHold: with every port toward the endpoint
// half open, a new SYN takes the port whose mapping's hold ends first.
// Each port's mapping and entry expire in opposite orders, as a blind
// client's (mapping seconds, entry assured for hours) and an honest
// handshake's (mapping just renewed, entry an unanswered flow's 5 s) do:
// ranked by the entry, the SYN took the port of the one held longest; of
// the 32 ports it tries, that lies in the lower half of the holds with
// probability 2^-32.
func TestXLBEarlyDropRanksByMappingHold(t *testing.T) {
	remote := netip.MustParseAddr("10.70.2.5")
	d := nodePortWorld(t, remote)
	holdAllXLBPorts(t, d, remote, ctSNAT|ctSeenReply|ctAssured, 3600e9)
	now, err := monotonicNow()
	if err != nil {
		t.Fatal(err)
	}
	var v underlayXlbRevVal
	var cv podCtVal
	for i := range uint16(snatPorts) {
		key := xlbRevKey(remote, snatPortMin+i)
		if err := d.underlay.LaceXlbRev.Lookup(key, &v); err != nil {
			t.Fatal(err)
		}
		v.Flags |= 1 | 2 // HALF_OPEN | ISN
		v.Expires = now + 2e9 + uint64(i)*1e5
		if err := d.underlay.LaceXlbRev.Put(key, &v); err != nil {
			t.Fatal(err)
		}
		ck := podCtKey{NetId: v.ExtNet, Family: 4, Proto: 6, Lport: v.Fport, Rport: v.Cport, Laddr: v.Front, Raddr: v.Client}
		if err := d.pod.LaceCt.Lookup(ck, &cv); err != nil {
			t.Fatalf("the entry of port %d: %v", snatPortMin+i, err)
		}
		cv.Expires = now + 3600e9 - uint64(i)*1e6
		if err := d.pod.LaceCt.Put(ck, cv); err != nil {
			t.Fatal(err)
		}
	}
	client := netip.MustParseAddrPort("203.0.113.5:40000")
	if moved := snatDrops(t, d, func() {
		runUnder(t, d, ether(unicastMAC, 0x0800, ipv4(client.Addr(), progNodeV4, 6, seg4(client.Port(), 30080, 0x02))))
	}); len(moved) != 0 {
		t.Fatalf("a new SYN with every port half open: drops %v", moved)
	}
	p := nodePortFlow(t, d, client).SNATPort
	if p < snatPortMin || p-snatPortMin >= snatPorts/2 {
		t.Errorf("the new SYN took port %d, the %dth of %d by hold; want one of the lower half (the shortest hold of those tried)", p, p-snatPortMin, snatPorts)
	}
}

// fillXLBRevHalf fills half of d's lace_xlb_rev (and one more) with live
// mappings toward other endpoints than the tests', no entry naming them:
// the sweep runs once the map is half full, and must keep them.
func fillXLBRevHalf(t *testing.T, d *Datapath, now uint64) {
	t.Helper()
	m := d.underlay.LaceXlbRev
	n := int(m.MaxEntries())/2 + 1
	keys := make([]underlayXlbRevKey, n)
	vals := make([]underlayXlbRevVal, n)
	for i := range n {
		keys[i] = underlayXlbRevKey{Family: 4, Proto: 6, Port: ntohs(snatPortMin + uint16(i%snatPorts)), Rport: ntohs(8080)}
		keys[i].Raddr[0], keys[i].Raddr[1], keys[i].Raddr[2], keys[i].Raddr[3] = 10, 71, byte(i/snatPorts), 1
		vals[i] = underlayXlbRevVal{Cport: ntohs(uint16(1024 + i)), Fport: ntohs(30080), ExtNet: snatWorld, Expires: now + 3600e9}
		vals[i].Client[0], vals[i].Client[1], vals[i].Client[2], vals[i].Client[3] = 198, 18, byte(i>>8), byte(i)
	}
	if _, err := m.BatchUpdate(keys, vals, nil); err != nil {
		t.Fatal(err)
	}
}

// TestXLBLostEntryACKShowsConnection: the handshake's last ACK may be the
// first packet after the client's entry was lost (an unanswered flow's,
// in the budget a flood evicts from). It goes on from the tuple's own
// port, and it shows the client saw the endpoint's SYN-ACK as it would
// with its entry: the mapping is not half open, so early drop never takes
// the connection. (Before, the mapping lost its record of the SYN-ACK
// there, and stayed half open for good.)
func TestXLBLostEntryACKShowsConnection(t *testing.T) {
	remote := netip.MustParseAddr("10.70.2.5")
	c := newXLBClient(t, remote)
	p := c.answered()
	c.afterLoss(p, 0x10)
	if _, half := xlbRevOf(t, c.d, remote, p); half {
		t.Error("the client's ACK of the SYN-ACK, its entry lost, left the mapping half open")
	}
}

// TestXLBSegmentTakesNoAnsweredPort: a TCP segment that is not a SYN (a
// flow whose entry was lost, or a forged one) may not take a port whose
// endpoint answered, even once the mapping expired and no entry names it:
// no reset can go ahead of it, and what the endpoint still sends on the
// old connection would be the new client's. A SYN takes one (with a reset
// ahead).
func TestXLBSegmentTakesNoAnsweredPort(t *testing.T) {
	remote := netip.MustParseAddr("10.70.2.5")
	d := nodePortWorld(t, remote)
	holdAllXLBPorts(t, d, remote, ctSNAT|ctSeenReply|ctAssured, 3600e9)
	loseXLBOwners(t, d, remote, -1e9, false)
	var v underlayXlbRevVal
	for i := range uint16(snatPorts) {
		key := xlbRevKey(remote, snatPortMin+i)
		if err := d.underlay.LaceXlbRev.Lookup(key, &v); err != nil {
			t.Fatal(err)
		}
		v.Flags |= 2 | 4 // ISN | SYNACK: the endpoint answered
		if err := d.underlay.LaceXlbRev.Put(key, &v); err != nil {
			t.Fatal(err)
		}
	}
	client := netip.MustParseAddrPort("203.0.113.5:40000")
	ack := ether(unicastMAC, 0x0800, ipv4(client.Addr(), progNodeV4, 6, seg4(client.Port(), 30080, 0x10)))
	if moved := snatDrops(t, d, func() { runUnder(t, d, ack) }); len(moved) != 1 || moved["snat-failed"] != 1 {
		t.Errorf("an ACK with every port's mapping expired, answered and ownerless: drops %v, want it dropped snat-failed", moved)
	}
	syn := ether(unicastMAC, 0x0800, ipv4(client.Addr(), progNodeV4, 6, seg4(client.Port()+1, 30080, 0x02)))
	if moved := snatDrops(t, d, func() { runUnder(t, d, syn) }); len(moved) != 0 {
		t.Errorf("a SYN with every port's mapping expired, answered and ownerless: drops %v, want it out on one", moved)
	}
}

// TestXLBSameSYNKeepsSynAck: a SYN sent again on a tuple whose entry was
// lost continues the same request at the endpoint (the same sequence
// number: no reset goes ahead of it); the endpoint's SYN-ACK to it stays
// recorded. Rewritten without it, the mapping had nothing left to prove
// or disprove a connection, and a blind client kept it out of the sweep.
func TestXLBSameSYNKeepsSynAck(t *testing.T) {
	remote := netip.MustParseAddr("10.70.2.5")
	c := newXLBClient(t, remote)
	p := c.answered()
	c.afterLoss(p, 0x02)
	var v underlayXlbRevVal
	if err := c.d.underlay.LaceXlbRev.Lookup(xlbRevKey(remote, p), &v); err != nil {
		t.Fatal(err)
	}
	eisn := binary.BigEndian.Uint32(binary.NativeEndian.AppendUint32(nil, v.Eisn))
	if v.Flags&(4|8) != 4|8 || eisn != c.eisn {
		t.Errorf("after the same SYN again: mapping flags %#x, eisn %#x; want the SYN-ACK %#x kept", v.Flags, eisn, c.eisn)
	}
}

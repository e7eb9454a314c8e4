package datapath

import (
	"net/netip"
	"testing"
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
	c.send(0x02)
	p := nodePortFlow(t, c.d, c.client).SNATPort
	if p < snatPortMin {
		t.Fatalf("the flow holds node port %d", p)
	}
	c.answer(p, 0x12)
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

	// The sweep runs once the map is half full: live mappings toward
	// other endpoints, which it must keep, fill it so.
	m := c.d.underlay.LaceXlbRev
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
	// CT_NEW_IN later (the mapping's expiry moved back instead of
	// waiting): the client's entry still names the port.
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

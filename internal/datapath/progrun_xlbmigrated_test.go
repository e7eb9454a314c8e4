package datapath

import (
	"net/netip"
	"testing"
)

// TestXLBMigratedHalfOpenNotEndedByACK1: a half open mapping migrated
// from layout version 2 after the endpoint's SYN-ACK (XLB_REV_SYNACK, no
// eisn: 0) meets an ACK of 1 from its client, which a blind client can
// send: it stays half open. Past its hold, its entry live, the sweep
// keeps it (XLB_REV_V2), and deletes the same without the mark. (With XLB_REV_SYNACK taken for the eisn's
// flag, it ended the state, and the mapping then followed its 6 h entry,
// out of early drop's and the sweep's reach.)
func TestXLBMigratedHalfOpenNotEndedByACK1(t *testing.T) {
	remote := netip.MustParseAddr("10.70.2.5")
	c := newXLBClient(t, remote)
	p := c.answered()
	var v underlayXlbRevVal
	if err := c.d.underlay.LaceXlbRev.Lookup(xlbRevKey(remote, p), &v); err != nil {
		t.Fatal(err)
	}
	if v.Flags&8 == 0 || v.Eisn == 0 {
		t.Fatalf("the SYN-ACK left mapping %+v without XLB_REV_EISN: the test cannot tell", v)
	}
	v.Flags = v.Flags&^8 | 16 // as migrated: XLB_REV_EISN unset, eisn 0, XLB_REV_V2
	v.Eisn = 0
	if err := c.d.underlay.LaceXlbRev.Put(xlbRevKey(remote, p), &v); err != nil {
		t.Fatal(err)
	}
	c.sendSeg(0x10, c.isn+1, 1)
	if _, half := xlbRevOf(t, c.d, remote, p); !half {
		t.Error("an ACK of 1 ended a migrated mapping's half open state")
	}
	// Past its hold, its entry live: the sweep keeps it (it may be an
	// honest connection nobody spoke on; a blind client's has eisn).
	now, err := monotonicNow()
	if err != nil {
		t.Fatal(err)
	}
	fillXLBRevHalf(t, c.d, now)
	if err := c.d.underlay.LaceXlbRev.Lookup(xlbRevKey(remote, p), &v); err != nil {
		t.Fatal(err)
	}
	v.Expires = now - 1
	if err := c.d.underlay.LaceXlbRev.Put(xlbRevKey(remote, p), &v); err != nil {
		t.Fatal(err)
	}
	if got, err := c.d.ReclaimSNAT(); err != nil || got != 0 {
		t.Errorf("ReclaimSNAT: %d, %v; want the migrated mapping of a live entry kept", got, err)
	}
	// Not migrated, nothing recorded to prove a connection: swept.
	v.Flags &^= 16
	if err := c.d.underlay.LaceXlbRev.Put(xlbRevKey(remote, p), &v); err != nil {
		t.Fatal(err)
	}
	if got, err := c.d.ReclaimSNAT(); err != nil || got != 1 {
		t.Errorf("ReclaimSNAT: %d, %v; want the half open mapping past its hold deleted", got, err)
	}
}

package datapath

import (
	"net/netip"
	"testing"
)

// TestXLBPendingUDPAnswerKept: a UDP client's request through a NodePort
// to an endpoint on another node may be answered any time, and no reset
// can go ahead of a datagram. With every port toward the endpoint held by
// such requests, unanswered and with no entry naming them (a flood
// evicted them from lace_ct_new), a new client's datagram takes none of
// them: it is dropped snat-failed, where before it took one, and the
// endpoint's answer to the request pending there went to it. Each
// mapping's flags are the ones the data plane gave a real request.
func TestXLBPendingUDPAnswerKept(t *testing.T) {
	d := progPodDatapath(t)
	client, be := netip.MustParseAddr("203.0.113.5"), netip.MustParseAddr("10.70.2.5")
	nport := revfragNodePort(t, d, client, be)
	key := func(port uint16) []byte { return xlbRevKeyOf(17, netip.AddrPortFrom(be, 9300), port) }
	var tmpl underlayXlbRevVal
	if err := d.underlay.LaceXlbRev.Lookup(key(nport), &tmpl); err != nil {
		t.Fatalf("the request's mapping: %v", err)
	}
	if tmpl.Flags&1 == 0 {
		t.Fatalf("the unanswered request's mapping has flags %#x, not half open: the test cannot tell", tmpl.Flags)
	}
	takeSNATEntries(t, d)
	now, err := monotonicNow()
	if err != nil {
		t.Fatal(err)
	}
	for i := range uint16(snatPorts) {
		v := tmpl
		v.Cport = ntohs(20000 + i)
		v.Expires = now + 4e9
		if err := d.underlay.LaceXlbRev.Put(key(snatPortMin+i), &v); err != nil {
			t.Fatal(err)
		}
	}
	other := netip.MustParseAddr("198.51.100.7")
	moved := snatDrops(t, d, func() {
		runUnder(t, d, ether(unicastMAC, 0x0800, ipv4(other, progNodeV4, 17, udp(6666, 30082))))
	})
	if len(moved) != 1 || moved["snat-failed"] != 1 {
		t.Errorf("a datagram with every port held by pending requests: drops %v, want it dropped snat-failed", moved)
	}
	var v underlayXlbRevVal
	for i := range uint16(snatPorts) {
		if err := d.underlay.LaceXlbRev.Lookup(key(snatPortMin+i), &v); err != nil || ntohs(v.Cport) != 20000+i {
			t.Fatalf("port %d's pending request lost its mapping (%v): client port %d", snatPortMin+i, err, ntohs(v.Cport))
		}
	}
}

package datapath

import (
	"net/netip"
	"testing"
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
// so held, a new SYN is dropped snat-failed.
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
		left  uint64
		freed bool
	}{
		{"established", settled, 3600e9, false},
		{"reset by the client, silent since", settled | ctRST, closeTimeout - 2e9, false},
		{"FIN one way, silent since", settled | ctFinOrig, closeTimeout - 2e9, false},
		// Both FINs may be forged: a flow that still talks keeps its port.
		{"FINs both ways, talking", settled | ctFinOrig | ctFinReply, closeTimeout - 1e8, false},
		{"FINs both ways, silent 2 s", settled | ctFinOrig | ctFinReply, closeTimeout - 2e9, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d := nodePortWorld(t, remote)
			holdAllXLBPorts(t, d, remote, tc.flags, tc.left)
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
	// The map is an LRU: a few mappings of the flood are gone. Their ports
	// go to copies of a flood flow with client ports of their own, so
	// that every port has a live owner.
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
	var keys []podCtKey
	var vals []podCtVal
	for _, m := range d.ctMaps() {
		var k podCtKey
		var v podCtVal
		var gone []podCtKey
		it := m.Iterate()
		for it.Next(&k, &v) {
			if v.Flags&ctSNAT == 0 {
				continue
			}
			v.Flags, v.Expires = flags, now+left
			keys, vals, gone = append(keys, k), append(vals, v), append(gone, k)
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
	if _, err := d.pod.LaceCt.BatchUpdate(keys, vals, nil); err != nil {
		t.Fatal(err)
	}
}

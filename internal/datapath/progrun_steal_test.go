package datapath

import (
	"net/netip"
	"testing"
)

// TestCTFloodStealsOldestHandshake: a SYN flood from outside holds every
// node port toward a NodePort's remote endpoint, so each further SYN takes
// the port of a flow that is not assured yet (early drop). An honest
// client's handshake, between its SYN and its last ACK, is such a flow; if
// it loses its port meanwhile, its ACK starts the flow over (another port,
// maybe another endpoint) and the endpoint resets it: the client's connect
// fails with "connection reset by peer" (seen in TestSYNFloodKeepsStreams).
// Taking the port silent longest keeps the handshake's: ten honest
// clients, each followed by 2,000 flood SYNs, keep their ports. Taking the
// first unassured port met loses each with probability 1-e^(-2000/4536),
// all ten survive about once in eighty runs.
func TestCTFloodStealsOldestHandshake(t *testing.T) {
	// The endpoint is on another node: its flows leave with a node port.
	d := nodePortWorld(t, netip.MustParseAddr("10.70.2.5"))
	flooded := 0
	flood := func(n int) {
		for range n {
			src := netip.AddrFrom4([4]byte{172, 31, byte(flooded / 60000), 200})
			runUnder(t, d, ether(unicastMAC, 0x0800, ipv4(src, progNodeV4, 6, seg4(uint16(1024+flooded%60000), 30080, 0x02))))
			flooded++
		}
	}
	// nodePortOf returns the node port the client's flow holds.
	nodePortOf := func(client netip.AddrPort) uint16 {
		t.Helper()
		flows, err := d.Conntrack()
		if err != nil {
			t.Fatal(err)
		}
		for _, f := range flows {
			if f.Remote == client && f.Local.Port() == 30080 {
				return f.SNATPort
			}
		}
		t.Fatalf("no flow of %s", client)
		return 0
	}
	// Every port taken: more flows than ports, and more again.
	flood(snatPorts + 500)
	kept := 0
	const honest = 10
	for i := range honest {
		client := netip.AddrPortFrom(netip.MustParseAddr("203.0.113.5"), uint16(40000+i))
		runUnder(t, d, ether(unicastMAC, 0x0800, ipv4(client.Addr(), progNodeV4, 6, seg4(client.Port(), 30080, 0x02))))
		p := nodePortOf(client)
		if p == 0 {
			t.Fatalf("client %d: its SYN took no node port", i)
		}
		flood(2000)
		// Its last ACK (the SYN-ACK crossed the fabric meanwhile).
		runUnder(t, d, ether(unicastMAC, 0x0800, ipv4(client.Addr(), progNodeV4, 6, seg4(client.Port(), 30080, 0x10))))
		if got := nodePortOf(client); got != p {
			t.Errorf("STOLEN: client %d's handshake lost node port %d to the flood; its ACK left on %d (the endpoint resets it)", i, p, got)
			continue
		}
		kept++
	}
	t.Logf("%d of %d handshakes kept their node port through %d flood SYNs", kept, honest, flooded)
}

// TestCTLostHandshakeKeepsEndpoint: a flood from outside churns
// lace_ct_new, the budget an honest client's handshake waits in, so its
// entry can be evicted between its SYN and its last ACK. That ACK then
// starts the flow over; with a random pick it goes to another endpoint
// (seven in eight here) or leaves from another node port, and the endpoint
// resets it: the client's connect fails with "connection reset by peer"
// (CI saw it in TestSYNFloodKeepsStreams). The pick is drawn from the
// flow's tuple (lb_flow_hash), so the ACK finds the endpoint and the node
// port the SYN had.
func TestCTLostHandshakeKeepsEndpoint(t *testing.T) {
	var backends []netip.Addr
	for i := range 7 {
		backends = append(backends, netip.AddrFrom4([4]byte{10, 70, 2, byte(5 + i)}))
	}
	d := nodePortWorld(t, append(backends, progPodV4)...)
	flowOf := func(client netip.AddrPort) Flow {
		t.Helper()
		flows, err := d.Conntrack()
		if err != nil {
			t.Fatal(err)
		}
		for _, f := range flows {
			if f.Remote == client && f.Local.Port() == 30080 {
				return f
			}
		}
		t.Fatalf("no flow of %s", client)
		return Flow{}
	}
	evictPending := func() {
		t.Helper()
		var k podCtKey
		var keys []podCtKey
		it := d.pod.LaceCtNew.Iterate()
		var v podCtVal
		for it.Next(&k, &v) {
			keys = append(keys, k)
		}
		if err := it.Err(); err != nil {
			t.Fatal(err)
		}
		for _, k := range keys {
			if err := d.pod.LaceCtNew.Delete(k); err != nil {
				t.Fatal(err)
			}
		}
		if len(keys) == 0 {
			t.Fatal("the handshake's entry was not in lace_ct_new")
		}
	}
	endpoints := map[netip.AddrPort]bool{}
	for i := range 24 {
		client := netip.AddrPortFrom(netip.MustParseAddr("203.0.113.5"), uint16(40000+i))
		runUnder(t, d, ether(unicastMAC, 0x0800, ipv4(client.Addr(), progNodeV4, 6, seg4(client.Port(), 30080, 0x02))))
		syn := flowOf(client)
		endpoints[syn.NAT] = true
		evictPending()
		runUnder(t, d, ether(unicastMAC, 0x0800, ipv4(client.Addr(), progNodeV4, 6, seg4(client.Port(), 30080, 0x10))))
		ack := flowOf(client)
		if ack.NAT != syn.NAT || ack.SNATPort != syn.SNATPort {
			t.Errorf("client %s: its SYN went to %s from node port %d, its ACK after the entry was lost to %s from %d (the endpoint resets it)",
				client, syn.NAT, syn.SNATPort, ack.NAT, ack.SNATPort)
		}
	}
	// The draw still spreads clients: 24 flows over 8 endpoints.
	if len(endpoints) < 4 {
		t.Errorf("24 clients drew only %d of 8 endpoints: %v", len(endpoints), endpoints)
	}
}

// TestFlowSeedKeptAcrossAgents: the flow hash's key is drawn once per
// node and an agent after the first (a restart, an upgrade) keeps it, so
// no flow's draw changes under it; two nodes draw their own.
func TestFlowSeedKeptAcrossAgents(t *testing.T) {
	seedOf := func(d *Datapath) uint32 {
		t.Helper()
		var v podLaceConfig
		if err := d.pod.LaceCfg.Lookup(uint32(0), &v); err != nil {
			t.Fatal(err)
		}
		return v.FlowSeed
	}
	d := progPodDatapath(t)
	first := seedOf(d)
	if first == 0 {
		t.Fatal("SetConfig left the flow hash key 0")
	}
	again, err := Load(d.pinDir)
	if err != nil {
		t.Fatal(err)
	}
	defer again.Close()
	if err := again.SetConfig(Config{UnderlayIP: progNodeV6, UnderlayIPv4: progNodeV4, Locator: progLocator, UnderlayIfIndex: 2}); err != nil {
		t.Fatal(err)
	}
	if got := seedOf(again); got != first {
		t.Errorf("the next agent's SetConfig changed the flow hash key from %#x to %#x", first, got)
	}
	if other := seedOf(progPodDatapath(t)); other == first {
		t.Errorf("two nodes drew the same flow hash key %#x", other)
	}
}

package datapath

import (
	"encoding/binary"
	"math/bits"
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
	nodePortOf := func(client netip.AddrPort) uint16 { return nodePortFlow(t, d, client).SNATPort }
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

// nodePortFlow returns the conntrack entry of client's flow to NodePort
// 30080 (nodePortWorld).
func nodePortFlow(t *testing.T, d *Datapath, client netip.AddrPort) Flow {
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
	flowOf := func(client netip.AddrPort) Flow { return nodePortFlow(t, d, client) }
	evictPending := func() { t.Helper(); evictPending(t, d) }
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

// TestFlowKeyKeptAcrossAgents: the flow hash's key is drawn once per
// node and an agent after the first (a restart, an upgrade) keeps it, so
// no flow's draw changes under it; two nodes draw their own.
func TestFlowKeyKeptAcrossAgents(t *testing.T) {
	d := progPodDatapath(t)
	first := flowKeyOf(t, d)
	if first == [2]uint64{} {
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
	if got := flowKeyOf(t, again); got != first {
		t.Errorf("the next agent's SetConfig changed the flow hash key from %#x to %#x", first, got)
	}
	if other := flowKeyOf(t, progPodDatapath(t)); other == first {
		t.Errorf("two nodes drew the same flow hash key %#x", other)
	}
}

func flowKeyOf(t *testing.T, d *Datapath) [2]uint64 {
	t.Helper()
	var v podLaceConfig
	if err := d.pod.LaceCfg.Lookup(uint32(0), &v); err != nil {
		t.Fatal(err)
	}
	return v.FlowKey
}

// sipHash24 is SipHash-2-4 (Aumasson and Bernstein) of msg under key.
func sipHash24(key [2]uint64, msg []byte) uint64 {
	v0, v1 := key[0]^0x736f6d6570736575, key[1]^0x646f72616e646f6d
	v2, v3 := key[0]^0x6c7967656e657261, key[1]^0x7465646279746573
	round := func() {
		v0 += v1
		v1 = bits.RotateLeft64(v1, 13) ^ v0
		v0 = bits.RotateLeft64(v0, 32)
		v2 += v3
		v3 = bits.RotateLeft64(v3, 16) ^ v2
		v0 += v3
		v3 = bits.RotateLeft64(v3, 21) ^ v0
		v2 += v1
		v1 = bits.RotateLeft64(v1, 17) ^ v2
		v2 = bits.RotateLeft64(v2, 32)
	}
	block := func(m uint64) {
		v3 ^= m
		round()
		round()
		v0 ^= m
	}
	n := len(msg)
	for ; len(msg) >= 8; msg = msg[8:] {
		block(binary.LittleEndian.Uint64(msg))
	}
	var last [8]byte
	copy(last[:], msg)
	last[7] = byte(n)
	block(binary.LittleEndian.Uint64(last[:]))
	v2 ^= 0xff
	round()
	round()
	round()
	round()
	return v0 ^ v1 ^ v2 ^ v3
}

// TestFlowHashIsKeyedSipHash: the data plane's draw is SipHash-2-4 of the
// flow's tuple under the node's key (a PRF: what a tenant sees of its
// draws tells nothing of the key), checked against this file's SipHash,
// itself checked against the reference vector: each NodePort client's
// endpoint is the hash's low 32 bits modulo the endpoints, its node port
// toward an endpoint elsewhere the first the high 32 bits name.
func TestFlowHashIsKeyedSipHash(t *testing.T) {
	ref := make([]byte, 15)
	var refKey [16]byte
	for i := range ref {
		ref[i] = byte(i)
	}
	for i := range refKey {
		refKey[i] = byte(i)
	}
	if got := sipHash24([2]uint64{binary.LittleEndian.Uint64(refKey[:8]), binary.LittleEndian.Uint64(refKey[8:])}, ref); got != 0xa129ca6149be45e5 {
		t.Fatalf("sipHash24 of the reference vector: %#x, want 0xa129ca6149be45e5", got)
	}
	var backends []netip.Addr
	for i := range 8 {
		backends = append(backends, netip.AddrFrom4([4]byte{10, 70, 2, byte(5 + i)}))
	}
	d := nodePortWorld(t, backends...)
	key := flowKeyOf(t, d)
	flows := map[netip.AddrPort]Flow{}
	for i := range 16 {
		client := netip.AddrPortFrom(netip.MustParseAddr("203.0.113.5"), uint16(40000+i))
		runUnder(t, d, ether(unicastMAC, 0x0800, ipv4(client.Addr(), progNodeV4, 6, seg4(client.Port(), 30080, 0x02))))
		flows[client] = Flow{}
	}
	all, err := d.Conntrack()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range all {
		if _, ok := flows[f.Remote]; ok && f.Local.Port() == 30080 {
			flows[f.Remote] = f
		}
	}
	for client, f := range flows {
		msg := make([]byte, 38)
		src, dst := client.Addr().As4(), progNodeV4.As4()
		copy(msg[0:], src[:])
		copy(msg[16:], dst[:])
		binary.BigEndian.PutUint16(msg[32:], client.Port())
		binary.BigEndian.PutUint16(msg[34:], 30080)
		msg[36], msg[37] = 4, 6
		h := sipHash24(key, msg)
		want := netip.AddrPortFrom(backends[uint32(h)%8], 8080)
		wantPort := uint16(61000 + uint32(h>>32)%4536)
		if f.NAT != want || f.SNATPort != wantPort {
			t.Errorf("client %s: endpoint %s from node port %d, SipHash draws %s from %d", client, f.NAT, f.SNATPort, want, wantPort)
		}
	}
}

// evictPending empties lace_ct_new, as a flood does to the handshakes
// waiting there; it fails when there was nothing to evict.
func evictPending(t *testing.T, d *Datapath) {
	t.Helper()
	var k podCtKey
	var v podCtVal
	var keys []podCtKey
	it := d.pod.LaceCtNew.Iterate()
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
		t.Fatal("no handshake's entry in lace_ct_new")
	}
}

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

package datapath

import (
	"encoding/binary"
	"net/netip"
	"testing"

	"github.com/lace-cni/lace/internal/tables"
)

// revfragNodePort programs a NodePort (UDP 30082 on the node's IPv4)
// whose endpoint be:9300 (network progNet) is on another node, with the
// whole IPv4 world classified as snatWorld, and sends it one datagram from
// client:5555. It returns the node's port the flow leaves from.
func revfragNodePort(t *testing.T, d *Datapath, client, be netip.Addr) uint16 {
	t.Helper()
	cip := netip.MustParseAddr("10.96.0.10")
	fragMust(t, d.UpsertNetwork(Network{ID: snatWorld}))
	fragMust(t, d.UpsertNetwork(Network{ID: tables.NodeNetID}))
	fragMust(t, d.UpsertClassifier(Classifier{NetID: snatWorld, Prefix: netip.MustParsePrefix("0.0.0.0/0")}))
	fragMust(t, d.UpsertRoute(Route{NetID: snatWorld, Prefix: netip.MustParsePrefix("0.0.0.0/0"), Kind: tables.RouteExternal, DstNet: snatWorld}))
	fragMust(t, d.UpsertRoute(Route{NetID: snatWorld, Prefix: netip.PrefixFrom(cip, 32), Kind: tables.RouteService, DstNet: progNet}))
	bes := []tables.Backend{{Addr: be, Port: 9300}}
	if _, err := d.ApplyServices([]Service{
		{VIP: cip, Proto: 17, Port: 82, NetID: progNet, Backends: bes},
		{VIP: progNodeV4, Proto: 17, Port: 30082, NetID: progNet, Backends: bes, Frontend: tables.FrontendNodePort, ClusterIP: cip, ClusterPort: 82},
	}); err != nil {
		t.Fatal(err)
	}
	_, out := runUnder(t, d, ether(unicastMAC, 0x0800, ipv4(client, progNodeV4, 17, udp(5555, 30082))))
	// Out encapsulated: Ethernet, outer IPv6, inner IPv4, UDP.
	in := 14 + 40
	if out[12] != 0x86 || out[13] != 0xdd {
		t.Fatalf("the NodePort datagram did not leave encapsulated: % x", out[:64])
	}
	if s, dst := ipAddrs(out, in); s != progNodeV4 || dst != be {
		t.Fatalf("the NodePort datagram left %s -> %s, want the node to the endpoint %s", s, dst, be)
	}
	return binary.BigEndian.Uint16(out[in+20 : in+22])
}

// The nodes' context (xlb_reply) carries the answers of endpoints of
// external frontends that this node translated. Its fragment record is
// keyed (NODE, NODE): the SID's source network (the endpoint's network)
// is not in it, nor in lace_xlb_rev. So a pod of another network at the
// same address (overlapping subnets; tenant B's endpoint of its own
// NodePort through this node) whose later fragment carries the ID of
// tenant A's endpoint's answer in flight takes A's ports and is
// translated into A's flow, to A's outside client: another network's
// bytes injected into A's datagram. docs/security.md section 6 says the
// key "holds the networks the packet travels between". The record must
// hold the SID's source network here too.
func TestRevFragNodeContextOtherNetworkNotTranslated(t *testing.T) {
	const otherNet = 8
	d := progPodDatapath(t)
	fragMust(t, d.UpsertNetwork(Network{ID: otherNet}))
	client, be := netip.MustParseAddr("203.0.113.5"), netip.MustParseAddr("10.70.2.5")
	nport := revfragNodePort(t, d, client, be)

	answer := func(srcNet uint32, pkt []byte) (uint32, []byte) {
		sid := SID(progLocator, BehaviourL3Decap, srcNet, tables.NodeNetID)
		return runUnder(t, d, srv6(progPeerV6, sid, pkt[14:], true))
	}
	// A's endpoint answers in fragments; the first is translated.
	var v uint32
	var out []byte
	moved := snatDrops(t, d, func() {
		v, out = answer(progNet, fragPkt(be, progNodeV4, 17, 0x7007, 0, true, append(udp(9300, nport), fragPayload...)))
	})
	if _, dst := ipAddrs(out, 14); dst != client {
		t.Fatalf("A's first answer fragment: verdict %d, drops %v, to %s; want it translated to the client %s", v, moved, dst, client)
	}
	// B's pod, same address, another network, the same ID.
	moved = snatDrops(t, d, func() {
		v, out = answer(otherNet, fragPkt(be, progNodeV4, 17, 0x7007, 1448, false, fragPayload))
	})
	if s, dst := ipAddrs(out, 14); dst == client {
		t.Errorf("ISOLATION: network %d's later fragment was translated into network %d's flow: %s -> %s (verdict %d)", otherNet, progNet, s, dst, v)
	}
	if v != actShot || moved["fragment-before-first"] != 1 {
		t.Errorf("verdict %d, drops %v; want one fragment-before-first drop", v, moved)
	}
	// A's own later fragment still is.
	if _, out = answer(progNet, fragPkt(be, progNodeV4, 17, 0x7007, 1448, false, fragPayload)); func() bool {
		_, dst := ipAddrs(out, 14)
		return dst != client
	}() {
		t.Errorf("A's own later answer fragment was not translated")
	}
}

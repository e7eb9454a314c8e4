//go:build revhost

package datapath

import (
	"net/netip"
	"testing"

	"github.com/lace-cni/lace/internal/tables"
)

// TestProgHostPortNodeFlowAnswers: a hostPort may be any port below the
// SNAT range (the upstream spec itself uses 54323), so inside the node's
// ephemeral range (32768-60999), where the node's own sockets (kubelet,
// containerd, the agent) connect from. The answers to such a connection
// reach to_host addressed to the node's port, find the hostPort's
// frontend there and go to the pod (xlb_in): the tenant's pod receives
// the server's SYN-ACK and data and the node's connection dies.
// portmap's DNAT never does this (conntrack matches the node's own flow
// first). A TCP packet that opens nothing (no SYN) and belongs to no
// frontend flow is not the hostPort's: the host must get it as it came.
// (UDP has the same hole, e.g. a DNS answer to the node's resolver; no
// packet test can tell it from a client's first datagram: it takes the
// node's sockets, bpf_sk_lookup_udp.)
func TestProgHostPortNodeFlowAnswers(t *testing.T) {
	d := progPodDatapath(t)
	const world = 100
	srv4 := netip.MustParseAddr("10.70.1.3")
	server := netip.MustParseAddr("172.31.0.200")
	mac := []byte{2, 0, 0, 0, 0, 3}
	for _, err := range []error{
		d.UpsertNetwork(Network{ID: world}),
		d.UpsertClassifier(Classifier{NetID: world, Prefix: netip.MustParsePrefix("0.0.0.0/0")}),
		d.UpsertRoute(Route{NetID: world, Prefix: netip.MustParsePrefix("0.0.0.0/0"), Kind: tables.RouteExternal, DstNet: world}),
		d.UpsertRoute(Route{NetID: world, Prefix: netip.MustParsePrefix("10.70.1.0/24"), Kind: tables.RouteLocal, DstNet: progNet}),
		d.UpsertRoute(Route{NetID: progNet, Prefix: netip.MustParsePrefix("10.70.1.0/24"), Kind: tables.RouteLocal, DstNet: progNet}),
		d.UpsertEndpoint(Endpoint{NetID: progNet, Addr: srv4, IfIndex: 3, PodMAC: mac, HostMAC: mac}),
	} {
		if err != nil {
			t.Fatal(err)
		}
	}
	const eph = 45000 // a port of the node's ephemeral range
	if _, err := d.ApplyServices([]Service{{VIP: progNodeV4, Proto: 6, Port: eph, NetID: progNet,
		Backends: []Backend{{Addr: srv4, Port: 80}}, Frontend: tables.FrontendHostPort, ClusterIP: srv4, ClusterPort: 80}}); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		name  string
		flags byte
	}{{"SYN-ACK", 0x12}, {"ACK", 0x10}, {"data", 0x18}} {
		t.Run(c.name, func(t *testing.T) {
			v, out := runUnder(t, d, ether(unicastMAC, 0x0800, ipv4(server, progNodeV4, 6, seg4(443, eph, c.flags))))
			if v != actOK || pktDst(out) != netip.AddrPortFrom(progNodeV4, eph) {
				t.Errorf("the server's %s to the node's own connection (port %d): verdict %d to %s, want it passed to the host untouched",
					c.name, eph, v, pktDst(out))
			}
		})
	}
	// A client's SYN still opens a flow to the pod.
	if v, out := runUnder(t, d, ether(unicastMAC, 0x0800, ipv4(server, progNodeV4, 6, seg4(5555, eph, 0x02)))); v != actRedirect ||
		pktDst(out) != netip.AddrPortFrom(srv4, 80) {
		t.Errorf("a client's SYN to the hostPort: verdict %d to %s, want redirected to the pod", v, pktDst(out))
	}
}

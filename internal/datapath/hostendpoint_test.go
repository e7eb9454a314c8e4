package datapath

import (
	"encoding/binary"
	"net/netip"
	"testing"

	"github.com/cilium/ebpf"

	"github.com/lace-cni/lace/internal/tables"
)

// Endpoints at node addresses (hostNetwork pods) behind an external
// frontend, by BPF_PROG_RUN: the decisions xlb_in, xlb_back and
// to_underlay's host_answer take for a client outside the cluster.

// runToUnderlay runs to_underlay (the underlay's egress) on pkt.
func runToUnderlay(t *testing.T, d *Datapath, pkt []byte) (uint32, []byte) {
	t.Helper()
	out := make([]byte, len(pkt)+256)
	opts := &ebpf.RunOptions{Data: pkt, DataOut: out}
	ret, err := d.underlay.ToUnderlay.Run(opts)
	if err != nil {
		t.Fatal(err)
	}
	return ret, opts.DataOut
}

// hostEPFamily is one family's addresses for the host endpoint cases.
type hostEPFamily struct {
	name                 string
	node, peer, client   netip.Addr // this node, another node, an outside client
	clusterIP            netip.Addr
	all                  netip.Prefix
	ethType              uint16
	srcOff, dstOff, l4At int // offsets in the frame
}

func (f hostEPFamily) ip(src, dst netip.Addr, l4 []byte) []byte {
	if f.node.Is4() {
		return ether(unicastMAC, f.ethType, ipv4(src, dst, 6, l4))
	}
	return ether(unicastMAC, f.ethType, ipv6(src, dst, 6, l4))
}

func (f hostEPFamily) addrs(pkt []byte) (src, dst netip.AddrPort) {
	n := 4
	if !f.node.Is4() {
		n = 16
	}
	s, _ := netip.AddrFromSlice(pkt[f.srcOff : f.srcOff+n])
	d, _ := netip.AddrFromSlice(pkt[f.dstOff : f.dstOff+n])
	return netip.AddrPortFrom(s, binary.BigEndian.Uint16(pkt[f.l4At:])),
		netip.AddrPortFrom(d, binary.BigEndian.Uint16(pkt[f.l4At+2:]))
}

var hostEPFamilies = []hostEPFamily{
	{name: "IPv4", node: progNodeV4, peer: netip.MustParseAddr("172.31.0.2"), client: netip.MustParseAddr("203.0.113.5"),
		clusterIP: netip.MustParseAddr("10.96.0.10"), all: netip.MustParsePrefix("0.0.0.0/0"), ethType: 0x0800,
		srcOff: 26, dstOff: 30, l4At: 34},
	{name: "IPv6", node: progNodeV6, peer: progPeerV6, client: netip.MustParseAddr("2001:db8:5::5"),
		clusterIP: netip.MustParseAddr("fd00:96::10"), all: netip.MustParsePrefix("::/0"), ethType: 0x86dd,
		srcOff: 22, dstOff: 38, l4At: 54},
}

// hostEPDatapath programs a world network classifying every source, a
// service network (the pods') whose view reaches the outside, a ClusterIP
// in world's view, and two NodePorts of it on this node: 30080 to a
// hostNetwork endpoint at this node's address, 30081 to one at another
// node's.
func hostEPDatapath(t *testing.T, f hostEPFamily) *Datapath {
	t.Helper()
	d := progPodDatapath(t)
	for _, err := range []error{
		d.UpsertNetwork(Network{ID: snatWorld}),
		d.UpsertClassifier(Classifier{NetID: snatWorld, Prefix: f.all}),
		d.UpsertRoute(Route{NetID: snatWorld, Prefix: f.all, Kind: tables.RouteExternal, DstNet: snatWorld}),
		d.UpsertRoute(Route{NetID: progNet, Prefix: f.all, Kind: tables.RouteExternal, DstNet: snatWorld}),
		d.UpsertRoute(Route{NetID: snatWorld, Prefix: netip.PrefixFrom(f.clusterIP, f.clusterIP.BitLen()), Kind: tables.RouteService, DstNet: progNet}),
	} {
		if err != nil {
			t.Fatal(err)
		}
	}
	here := []tables.Backend{{Addr: f.node, Port: 8080}}
	there := []tables.Backend{{Addr: f.peer, Port: 8080}}
	if _, err := d.ApplyServices([]Service{
		{VIP: f.clusterIP, Proto: 6, Port: 80, NetID: progNet, Backends: here},
		{VIP: f.clusterIP, Proto: 6, Port: 81, NetID: progNet, Backends: there},
		{VIP: f.node, Proto: 6, Port: 30080, NetID: progNet, Backends: here, Frontend: tables.FrontendNodePort, ClusterIP: f.clusterIP, ClusterPort: 80},
		{VIP: f.node, Proto: 6, Port: 30081, NetID: progNet, Backends: there, Frontend: tables.FrontendNodePort, ClusterIP: f.clusterIP, ClusterPort: 81},
	}); err != nil {
		t.Fatal(err)
	}
	return d
}

// TestProgHostEndpointHere: a NodePort whose endpoint is this node's own
// address is handed to the node's stack translated to the endpoint's
// port, with the client's address; the stack's answer leaves the
// underlay from the NodePort, and the client's next segment finds its
// flow.
func TestProgHostEndpointHere(t *testing.T) {
	for _, f := range hostEPFamilies {
		t.Run(f.name, func(t *testing.T) {
			d := hostEPDatapath(t, f)
			var v uint32
			var out []byte
			onlyDrop(t, d, "", func() { v, out = runUnder(t, d, f.ip(f.client, f.node, seg4(5555, 30080, 0x02))) })
			src, dst := f.addrs(out)
			if v != actOK || src != netip.AddrPortFrom(f.client, 5555) || dst != netip.AddrPortFrom(f.node, 8080) {
				t.Fatalf("SYN to the NodePort: verdict %d, %s -> %s; want the host stack (%d) to get %s -> %s:8080",
					v, src, dst, actOK, f.client, f.node)
			}
			onlyDrop(t, d, "", func() { v, out = runToUnderlay(t, d, f.ip(f.node, f.client, seg4(8080, 5555, 0x12))) })
			src, dst = f.addrs(out)
			if v != actOK || src != netip.AddrPortFrom(f.node, 30080) || dst != netip.AddrPortFrom(f.client, 5555) {
				t.Fatalf("the stack's SYN-ACK leaves as %s -> %s (verdict %d); want it from the NodePort %s:30080", src, dst, v, f.node)
			}
			// The host's other traffic passes untouched.
			if v, out = runToUnderlay(t, d, f.ip(f.node, f.client, seg4(8080, 5556, 0x12))); v != actOK {
				t.Fatalf("unrelated traffic from the node: verdict %d", v)
			}
			if src, _ = f.addrs(out); src.Port() != 8080 {
				t.Errorf("unrelated traffic from the node rewritten to %s", src)
			}
			onlyDrop(t, d, "", func() { v, out = runUnder(t, d, f.ip(f.client, f.node, seg4(5555, 30080, 0x10))) })
			if _, dst = f.addrs(out); v != actOK || dst.Port() != 8080 {
				t.Errorf("the client's ACK: verdict %d to %s; want the stack's port 8080", v, dst)
			}
		})
	}
}

// TestProgHostEndpointElsewhere: a NodePort whose endpoint is another
// node's address leaves as plain IP from this node's address and one of
// its ports (no SRv6: the endpoint is that node's stack), and the plain
// answer to that port goes back to the client from the NodePort. A
// spoofed answer from a pod address is refused.
func TestProgHostEndpointElsewhere(t *testing.T) {
	for _, f := range hostEPFamilies {
		t.Run(f.name, func(t *testing.T) {
			d := hostEPDatapath(t, f)
			_, out := runUnder(t, d, f.ip(f.client, f.node, seg4(5555, 30081, 0x02)))
			src, dst := f.addrs(out)
			if src.Addr() != f.node || src.Port() < snatPortMin || dst != netip.AddrPortFrom(f.peer, 8080) {
				t.Fatalf("SYN to the NodePort left as %s -> %s; want plain IP from %s and a node port to %s:8080", src, dst, f.node, f.peer)
			}
			nport := src.Port()
			// (The FIB of the test's namespace decides the verdict.)
			v, out := runUnder(t, d, f.ip(f.peer, f.node, seg4(8080, nport, 0x12)))
			src, dst = f.addrs(out)
			if src != netip.AddrPortFrom(f.node, 30081) || dst != netip.AddrPortFrom(f.client, 5555) {
				t.Fatalf("the endpoint's SYN-ACK went on as %s -> %s (verdict %d); want %s:30081 -> %s:5555", src, dst, v, f.node, f.client)
			}
			// Not from the endpoint: no such flow, the host's.
			if v, _ = runUnder(t, d, f.ip(f.client, f.node, seg4(8080, nport, 0x12))); v != actOK {
				t.Errorf("an answer from elsewhere to the node port: verdict %d, want the host's", v)
			}
		})
	}
}

// TestProgHostEndpointOutsideView: an endpoint outside the cluster that the
// service's network does not reach is not reached through a frontend
// either.
func TestProgHostEndpointOutsideView(t *testing.T) {
	f := hostEPFamilies[0]
	d := hostEPDatapath(t, f)
	if err := d.UpsertRoute(Route{NetID: progNet, Prefix: netip.PrefixFrom(f.peer, 32), Kind: tables.RouteDeny, DstNet: snatWorld}); err != nil {
		t.Fatal(err)
	}
	onlyDrop(t, d, "isolated", func() {
		if v, _ := runUnder(t, d, f.ip(f.client, f.node, seg4(5555, 30081, 0x02))); v != actShot {
			t.Errorf("verdict %d, want a drop", v)
		}
	})
}

// TestProgHostAnswerFragments: a hostNetwork UDP server behind a
// NodePort (a node-local DNS cache) answers an outside client with a
// datagram larger than the MTU, which leaves the node's stack in
// fragments. The first, which carries the ports, must leave from the
// NodePort as an unfragmented answer does (passed untranslated, it left
// from the server's own port: the client matches nothing and learns the
// endpoint's port); its later fragment passes with the frontend's
// address. A node's own large datagram (no frontend's answer) is
// untouched and recorded nowhere: its later fragment passes as it came.
func TestProgHostAnswerFragments(t *testing.T) {
	for _, f := range hostEPFamilies {
		t.Run(f.name, func(t *testing.T) {
			d := hostEPDatapath(t, f)
			here := []tables.Backend{{Addr: f.node, Port: 53}}
			if _, err := d.ApplyServices([]Service{
				{VIP: f.clusterIP, Proto: 17, Port: 53, NetID: progNet, Backends: here},
				{VIP: f.node, Proto: 17, Port: 30053, NetID: progNet, Backends: here, Frontend: tables.FrontendNodePort, ClusterIP: f.clusterIP, ClusterPort: 53},
			}); err != nil {
				t.Fatal(err)
			}
			ip := func(src, dst netip.Addr, l4 []byte) []byte {
				if src.Is4() {
					return ether(unicastMAC, f.ethType, ipv4(src, dst, 17, l4))
				}
				return ether(unicastMAC, f.ethType, ipv6(src, dst, 17, l4))
			}
			v, out := runUnder(t, d, ip(f.client, f.node, udp20(5555, 30053)))
			if dst := pktDst(out); v != actOK || dst != netip.AddrPortFrom(f.node, 53) {
				t.Fatalf("query to the NodePort: verdict %d to %s, want the host stack on :53", v, dst)
			}
			_, out = runToUnderlay(t, d, ip(f.node, f.client, udp20(53, 5555)))
			if src, _ := f.addrs(out); src != netip.AddrPortFrom(f.node, 30053) {
				t.Fatalf("unfragmented answer leaves from %s, want the NodePort", src)
			}
			// In IPv6 the fragment header comes before the ports.
			fragSport := func(pkt []byte) netip.AddrPort {
				src, _ := f.addrs(pkt)
				at := f.l4At
				if !f.node.Is4() {
					at += 8
				}
				return netip.AddrPortFrom(src.Addr(), binary.BigEndian.Uint16(pkt[at:]))
			}
			payload := append(udp20(53, 5555), make([]byte, 28)...)
			v, out = runToUnderlay(t, d, fragPkt(f.node, f.client, 17, 0x4242, 0, true, payload))
			if src := fragSport(out); v != actOK || src != netip.AddrPortFrom(f.node, 30053) {
				t.Errorf("the answer's first fragment: verdict %d from %s, want it to leave from the NodePort %s:30053", v, src, f.node)
			}
			v, out = runToUnderlay(t, d, fragPkt(f.node, f.client, 17, 0x4242, 48, false, make([]byte, 16)))
			if src, _ := f.addrs(out); v != actOK || src.Addr() != f.node {
				t.Errorf("the answer's later fragment: verdict %d from %s, want it to leave from %s", v, src.Addr(), f.node)
			}
			// The node's own large datagram from port 54 (no frontend's).
			own := append(udp20(54, 5555), make([]byte, 28)...)
			_, out = runToUnderlay(t, d, fragPkt(f.node, f.client, 17, 0x4343, 0, true, own))
			if src := fragSport(out); src != netip.AddrPortFrom(f.node, 54) {
				t.Errorf("the node's own first fragment left from %s, want it untouched", src)
			}
			var n int
			var k, val []byte
			for it := d.pod.LaceFrags.Iterate(); it.Next(&k, &val); {
				n++
			}
			if n != 1 {
				t.Errorf("lace_frags holds %d records, want only the frontend answer's", n)
			}
		})
	}
}

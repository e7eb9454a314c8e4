package datapath

import (
	"encoding/binary"
	"net/netip"
	"testing"

	"github.com/cilium/ebpf"

	"github.com/lace-cni/lace/internal/tables"
)

// TestProgHostPort drives the data plane's decisions on a pod's hostPort
// (a frontend of kind HostPort whose one backend is the pod, admitted as
// the pod is): an outside source whose external network's view reaches
// the pod is translated to it with its address kept, one whose view does
// not is refused (isolated); a pod of a network that reaches the hostPort
// pod is translated, one of a network that does not is refused
// (isolated); a loopback hostPort (hostIP 127.0.0.1, the node's own
// sockets') is never reached by a packet, from the fabric or a pod.
func TestProgHostPort(t *testing.T) {
	d := progPodDatapath(t)
	const world, corp, other = 100, 101, 8
	srv4, srv6 := netip.MustParseAddr("10.70.1.3"), netip.MustParseAddr("fd00:70:0:1::3")
	x4 := netip.MustParseAddr("10.80.1.2")
	const xPort = progPort + 1
	ext4, ext6 := netip.MustParseAddr("172.31.0.200"), netip.MustParseAddr("fd00:99::c8")
	corp4 := netip.MustParseAddr("192.0.2.7")
	loop4, loop6 := netip.MustParseAddr("127.0.0.1"), netip.MustParseAddr("::1")
	mac := []byte{2, 0, 0, 0, 0, 3}
	for _, err := range []error{
		d.UpsertNetwork(Network{ID: world}), d.UpsertNetwork(Network{ID: corp}), d.UpsertNetwork(Network{ID: other}),
		d.UpsertClassifier(Classifier{NetID: world, Prefix: netip.MustParsePrefix("0.0.0.0/0")}),
		d.UpsertClassifier(Classifier{NetID: world, Prefix: netip.MustParsePrefix("::/0")}),
		d.UpsertClassifier(Classifier{NetID: corp, Prefix: netip.MustParsePrefix("192.0.2.0/24")}),
		// world -> 7: the outside reaches network 7's pods.
		d.UpsertRoute(Route{NetID: world, Prefix: netip.MustParsePrefix("0.0.0.0/0"), Kind: tables.RouteExternal, DstNet: world}),
		d.UpsertRoute(Route{NetID: world, Prefix: netip.MustParsePrefix("10.70.1.0/24"), Kind: tables.RouteLocal, DstNet: progNet}),
		d.UpsertRoute(Route{NetID: world, Prefix: netip.MustParsePrefix("fd00:70:0:1::/64"), Kind: tables.RouteLocal, DstNet: progNet}),
		// corp reaches only the outside.
		d.UpsertRoute(Route{NetID: corp, Prefix: netip.MustParsePrefix("0.0.0.0/0"), Kind: tables.RouteExternal, DstNet: world}),
		// Network 7 reaches itself and the outside; network 8 only the
		// outside.
		d.UpsertRoute(Route{NetID: progNet, Prefix: netip.MustParsePrefix("10.70.1.0/24"), Kind: tables.RouteLocal, DstNet: progNet}),
		d.UpsertRoute(Route{NetID: progNet, Prefix: netip.MustParsePrefix("0.0.0.0/0"), Kind: tables.RouteExternal, DstNet: world}),
		d.UpsertRoute(Route{NetID: progNet, Prefix: netip.MustParsePrefix("::/0"), Kind: tables.RouteExternal, DstNet: world}),
		d.UpsertRoute(Route{NetID: other, Prefix: netip.MustParsePrefix("0.0.0.0/0"), Kind: tables.RouteExternal, DstNet: world}),
		d.UpsertEndpoint(Endpoint{NetID: progNet, Addr: srv4, IfIndex: 3, PodMAC: mac, HostMAC: mac}),
		d.UpsertEndpoint(Endpoint{NetID: progNet, Addr: srv6, IfIndex: 3, PodMAC: mac, HostMAC: mac}),
		d.UpsertPort(Port{IfIndex: xPort, NetID: other, V4: x4}),
	} {
		if err != nil {
			t.Fatal(err)
		}
	}
	hostPort := func(at netip.Addr, proto uint8, pod netip.Addr) Service {
		return Service{VIP: at, Proto: proto, Port: 8080, NetID: progNet, Backends: []Backend{{Addr: pod, Port: 80}},
			Frontend: tables.FrontendHostPort, ClusterIP: pod, ClusterPort: 80}
	}
	if _, err := d.ApplyServices([]Service{
		hostPort(progNodeV4, 6, srv4), hostPort(progNodeV6, 17, srv6),
		hostPort(loop4, 6, srv4), hostPort(loop6, 6, srv6),
	}); err != nil {
		t.Fatal(err)
	}
	// The entries read back as hostPorts.
	got, err := d.Services()
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range got {
		if s.Frontend != tables.FrontendHostPort || s.Local || s.ClusterIP.IsUnspecified() {
			t.Errorf("read back %+v, want a HostPort frontend", s)
		}
	}

	underlay := []struct {
		name   string
		pkt    []byte
		want   uint32
		reason string
		dst    netip.AddrPort // the translated destination, when redirected
	}{
		{"outside TCP to the node's hostPort", ether(unicastMAC, 0x0800, ipv4(ext4, progNodeV4, 6, tcpSYN(999, 8080))), actRedirect, "",
			netip.AddrPortFrom(srv4, 80)},
		{"outside UDP to the node's IPv6 hostPort", ether(unicastMAC, 0x86dd, ipv6(ext6, progNodeV6, 17, udp(999, 8080))), actRedirect, "",
			netip.AddrPortFrom(srv6, 80)},
		{"outside network that does not reach the pod", ether(unicastMAC, 0x0800, ipv4(corp4, progNodeV4, 6, tcpSYN(999, 8080))), actShot, "isolated", netip.AddrPort{}},
		{"outside UDP where only TCP is published", ether(unicastMAC, 0x0800, ipv4(ext4, progNodeV4, 17, udp(999, 8080))), actOK, "", netip.AddrPort{}},
	}
	for _, c := range underlay {
		t.Run(c.name, func(t *testing.T) {
			onlyDrop(t, d, c.reason, func() {
				out := make([]byte, len(c.pkt)+256)
				opts := &ebpf.RunOptions{Data: c.pkt, DataOut: out}
				ret, err := d.underlay.FromUnderlay.Run(opts)
				if err != nil {
					t.Fatal(err)
				}
				if ret != c.want {
					t.Errorf("verdict %d, want %d", ret, c.want)
				}
				if c.dst.IsValid() {
					if dst := pktDst(opts.DataOut); dst != c.dst {
						t.Errorf("translated to %s, want %s", dst, c.dst)
					}
					if src := pktSrc(opts.DataOut); src != ext4 && src != ext6 {
						t.Errorf("source %s, want the client's kept", src)
					}
				}
			})
		})
	}
	// A loopback destination from the fabric is forged: never the
	// loopback hostPort, whatever else becomes of it.
	for _, pkt := range [][]byte{
		ether(unicastMAC, 0x0800, ipv4(ext4, loop4, 6, tcpSYN(999, 8080))),
		ether(unicastMAC, 0x86dd, ipv6(ext6, loop6, 6, tcpSYN(999, 8080))),
	} {
		if ret := runProg(t, d.underlay.FromUnderlay, pkt); ret == actRedirect {
			t.Errorf("a packet to a loopback hostPort from the fabric was redirected (to %s)", pktDst(pkt))
		}
	}

	// Pods.
	ret, out := runPod(t, d, ether(unicastMAC, 0x0800, ipv4(progPodV4, progNodeV4, 6, tcpSYN(999, 8080))))
	if ret != actRedirect || pktDst(out) != netip.AddrPortFrom(srv4, 80) {
		t.Errorf("pod of network 7 -> hostPort: verdict %d to %s, want redirected to %s:80", ret, pktDst(out), srv4)
	}
	onlyDrop(t, d, "isolated", func() {
		ret, err := d.pod.FromPod.Run(&ebpf.RunOptions{Data: ether(unicastMAC, 0x0800, ipv4(x4, progNodeV4, 6, tcpSYN(999, 8080))), Context: skbCtx(xPort)})
		if err != nil {
			t.Fatal(err)
		}
		if ret != actShot {
			t.Errorf("pod of network 8 -> hostPort of network 7's pod: verdict %d, want a drop", ret)
		}
	})
	ret, out = runPod(t, d, ether(unicastMAC, 0x0800, ipv4(progPodV4, loop4, 6, tcpSYN(999, 8080))))
	if ret == actRedirect && pktDst(out) == netip.AddrPortFrom(srv4, 80) {
		t.Errorf("a pod's packet to 127.0.0.1 reached the node's loopback hostPort")
	}
}

// pktDst and pktSrc read an Ethernet frame's IP destination (with its
// TCP or UDP port) and source.
func pktDst(pkt []byte) netip.AddrPort {
	ip, l4 := ipOf(pkt)
	if !ip.IsValid() || len(pkt) < l4+4 {
		return netip.AddrPort{}
	}
	var a netip.Addr
	if ip.Is4() {
		a = netip.AddrFrom4([4]byte(pkt[14+16 : 14+20]))
	} else {
		a = netip.AddrFrom16([16]byte(pkt[14+24 : 14+40]))
	}
	return netip.AddrPortFrom(a, binary.BigEndian.Uint16(pkt[l4+2:l4+4]))
}

func pktSrc(pkt []byte) netip.Addr {
	ip, _ := ipOf(pkt)
	return ip
}

// ipOf returns the frame's IP source and where its L4 header starts.
func ipOf(pkt []byte) (netip.Addr, int) {
	if len(pkt) < 14+40 {
		return netip.Addr{}, 0
	}
	switch binary.BigEndian.Uint16(pkt[12:14]) {
	case 0x0800:
		return netip.AddrFrom4([4]byte(pkt[14+12 : 14+16])), 14 + int(pkt[14]&0xf)*4
	case 0x86dd:
		return netip.AddrFrom16([16]byte(pkt[14+8 : 14+24])), 14 + 40
	}
	return netip.Addr{}, 0
}

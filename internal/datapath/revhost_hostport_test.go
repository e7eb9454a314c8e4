package datapath

import (
	"crypto/rand"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"net/netip"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/lace-cni/lace/internal/netutil"
	"github.com/lace-cni/lace/internal/tables"
)

// TestProgHostPortNodeFlowAnswers: a hostPort may be any port below the
// SNAT range (the upstream spec itself uses 54323), so inside the node's
// ephemeral range (32768-60999), where the node's own sockets (kubelet,
// containerd, the resolver) connect from. The answers to such a
// connection reach to_host addressed to the node's port and must go to
// the node's socket, not to the hostPort's pod through xlb_in (portmap's
// DNAT never takes them: conntrack matches the node's flow first). The
// "node" is a namespace of the test's own holding the node's address, a
// TCP socket connecting from the hostPort's port and a connected UDP
// socket on another; the programs run there (their socket lookups see
// its sockets). A client's new flow to the same ports still reaches the
// pod.
func TestProgHostPortNodeFlowAnswers(t *testing.T) {
	d := progPodDatapath(t)
	const world = 100
	srv4 := netip.MustParseAddr("10.70.1.3")
	server, client := netip.MustParseAddr("172.31.0.200"), netip.MustParseAddr("172.31.0.201")
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
	const tcpPort, udpPort = 45000, 45001 // ports of the node's ephemeral range
	hp := func(proto uint8, port uint16) Service {
		return Service{VIP: progNodeV4, Proto: proto, Port: port, NetID: progNet, Backends: []Backend{{Addr: srv4, Port: 80}},
			Frontend: tables.FrontendHostPort, ClusterIP: srv4, ClusterPort: 80}
	}
	if _, err := d.ApplyServices([]Service{hp(6, tcpPort), hp(17, udpPort)}); err != nil {
		t.Fatal(err)
	}

	suffix := make([]byte, 3)
	_, _ = rand.Read(suffix)
	ns := "lrvh" + hex.EncodeToString(suffix)
	fragMust(t, netutil.CreateNamed(ns))
	t.Cleanup(func() { _ = netutil.DeleteNamed(ns) })
	fragMust(t, netutil.EnsureVeth(netutil.VethSpec{NSPath: netutil.Path(ns), Name: "ul0", PeerNSPath: netutil.Path(ns), PeerName: "ul1", MTU: 1500}))
	fragMust(t, netutil.EnsureAddr(netutil.Path(ns), "ul0", netip.PrefixFrom(progNodeV4, 24)))

	cases := []struct {
		name string
		pkt  []byte
		node bool // the node's socket's: passed to the host untouched
	}{
		{"the server's SYN-ACK to the node's connection", ipv4(server, progNodeV4, 6, seg4(443, tcpPort, 0x12)), true},
		{"the server's data to the node's connection", ipv4(server, progNodeV4, 6, seg4(443, tcpPort, 0x18)), true},
		{"the resolver's answer to the node's connected UDP socket", ipv4(server, progNodeV4, 17, udp20(53, udpPort)), true},
		{"a client's SYN to the TCP hostPort", ipv4(client, progNodeV4, 6, seg4(5555, tcpPort, 0x02)), false},
		{"a client's datagram to the UDP hostPort", ipv4(client, progNodeV4, 17, udp20(5555, udpPort)), false},
	}
	err := netutil.Do(netutil.Path(ns), func() error {
		tfd, err := unix.Socket(unix.AF_INET, unix.SOCK_STREAM|unix.SOCK_NONBLOCK|unix.SOCK_CLOEXEC, 0)
		if err != nil {
			return err
		}
		defer unix.Close(tfd)
		ufd, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
		if err != nil {
			return err
		}
		defer unix.Close(ufd)
		node := progNodeV4.As4()
		if err := unix.Bind(tfd, &unix.SockaddrInet4{Port: tcpPort, Addr: node}); err != nil {
			return err
		}
		if err := unix.Connect(tfd, &unix.SockaddrInet4{Port: 443, Addr: server.As4()}); err != nil && !errors.Is(err, unix.EINPROGRESS) {
			return err
		}
		if err := unix.Bind(ufd, &unix.SockaddrInet4{Port: udpPort, Addr: node}); err != nil {
			return err
		}
		if err := unix.Connect(ufd, &unix.SockaddrInet4{Port: 53, Addr: server.As4()}); err != nil {
			return err
		}
		for _, c := range cases {
			v, out := runUnder(t, d, ether(unicastMAC, 0x0800, c.pkt))
			dst := pktDst(out)
			if c.node && (v != actOK || dst.Addr() != progNodeV4) {
				t.Errorf("%s: verdict %d to %s, want it passed to the host untouched", c.name, v, dst)
			}
			if !c.node && (v != actRedirect || dst != netip.AddrPortFrom(srv4, 80)) {
				t.Errorf("%s: verdict %d to %s, want redirected to the pod", c.name, v, dst)
			}
		}
		return nil
	})
	fragMust(t, err)
}

// udp20 is a UDP datagram with 12 bytes of payload (long enough for
// pktDst to read an IPv4 frame back).
func udp20(sport, dport uint16) []byte {
	b := make([]byte, 8+12)
	binary.BigEndian.PutUint16(b[0:2], sport)
	binary.BigEndian.PutUint16(b[2:4], dport)
	binary.BigEndian.PutUint16(b[4:6], uint16(len(b)))
	return b
}

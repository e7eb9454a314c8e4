package datapath_test

import (
	"encoding/binary"
	"net"
	"net/netip"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/lace-cni/lace/internal/datapath"
	"github.com/lace-cni/lace/internal/netutil"
	"github.com/lace-cni/lace/internal/tables"
)

// TestFloodedFramesServedOnce: a switch floods a unicast frame whose
// destination MAC it has not learned (a port that just moved, an aged-out
// entry) to every port. The chaos harness saw streams through a VIP reset
// while a node's fabric port moved: every node that has the VIP's frontend
// served the flooded segments, picked an endpoint of its own, and that
// endpoint, which knew no such connection, reset it. IP sent to another
// node's MAC is served by none but that node: dropped as other-host.
//
// The fabric learns nothing of n1's port here, so every frame the outside
// sends to n1 reaches n2 too. The LoadBalancer's one endpoint is on n2:
// served by n1 it sees n1's address; served by n2, the outside's. n2
// counts each flooded frame as other-host.
func TestFloodedFramesServedOnce(t *testing.T) {
	w := newWorld(t, 2)
	n1, n2 := w.nodes[0], w.nodes[1]
	for _, n := range w.nodes {
		must(t, netutil.Sysctl(netutil.Path(n.ns), "net.ipv4.ip_forward", "1"))
	}
	w.addNetwork(7, "10.70.0.0/16", "fd00:70::/48", false)
	w.nodeContext()
	b := w.addPod("b", n2, 7, 2)
	whoami(t, b)
	ext := w.addExternalHost(n1)
	world4 := netip.MustParsePrefix("172.31.0.0/24")
	w.addExternal(100, world4)
	w.grantExternal(7, 100, world4)
	lb4 := netip.MustParseAddr("172.31.1.10")
	must(t, netutil.EnsureRoute(netutil.Path(ext.ns), netip.PrefixFrom(lb4, 32), n1.v4, "eth0"))
	web := tcpSvc("10.96.0.10", 8, 7, be8(b.v4))
	for _, n := range w.nodes {
		// The ClusterIP in its network's view and the outside's.
		for _, v := range []uint32{web.NetID, 100} {
			must(t, n.dp.UpsertRoute(datapath.Route{NetID: v, Prefix: netip.PrefixFrom(web.VIP, 32), Kind: tables.RouteService, DstNet: web.NetID}))
		}
		_, err := n.dp.ApplyServices([]datapath.Service{web, frontend(tables.FrontendLoadBalancer, lb4, 8, web, false, web.Backends...)})
		must(t, err)
	}
	eth, err := netutil.GetLink(netutil.Path(n1.ns), "eth0")
	must(t, err)
	unlearn(t, netutil.Path(w.fabric), n1.name)
	flooded := framesTo(t, netutil.Path(n2.ns), eth.MAC, lb4, 8)
	before, err := n2.dp.Drops()
	must(t, err)

	want := "b " + n1.v4.String()
	for i := range 8 {
		if got, err := dialPort(ext, lb4, 8); err != nil || got != want {
			t.Fatalf("ext -> LoadBalancer %s:8, connection %d: %q %v, want %q (n1's alone)", lb4, i, got, err, want)
		}
	}
	// The test stands only if the fabric did flood: n2 was sent the
	// connections' frames for n1. Counted once, before the drops are
	// read: a frame read after would not be in them yet.
	n := flooded()
	if n < 8*3 {
		t.Fatalf("n2 was flooded %d frames for n1's MAC to %s:8, want the 8 connections' (at least 24)", n, lb4)
	}
	after, err := n2.dp.Drops()
	must(t, err)
	if after["other-host"]-before["other-host"] < uint64(n) {
		t.Errorf("n2 counted %d other-host drops for the %d frames flooded to it", after["other-host"]-before["other-host"], n)
	}
	flows, err := n2.dp.Conntrack()
	must(t, err)
	for _, f := range flows {
		if f.Remote.Addr() == ext.v4 || f.Local.Addr() == ext.v4 {
			t.Errorf("n2 served a frame flooded to n1's MAC: flow %+v", f)
		}
	}
}

// unlearn stops the bridge in the namespace at ns learning where port's
// MACs are, and forgets what it learned: frames to them are flooded.
func unlearn(t *testing.T, ns, port string) {
	t.Helper()
	must(t, netutil.Do(ns, func() error {
		l, err := netlink.LinkByName(port)
		if err != nil {
			return err
		}
		if err := netlink.LinkSetLearning(l, false); err != nil {
			return err
		}
		fdb, err := netlink.NeighList(l.Attrs().Index, unix.AF_BRIDGE)
		if err != nil {
			return err
		}
		for _, e := range fdb {
			if e.State&netlink.NUD_PERMANENT != 0 {
				continue // the port's own MAC
			}
			if err := netlink.NeighDel(&e); err != nil {
				return err
			}
		}
		return nil
	}))
}

// framesTo counts, from now until the returned function is called (a
// running total), the TCP frames to dst that arrive at eth0 in the
// namespace at ns with destination MAC mac: all of them, read ahead of the
// data plane (ETH_P_ALL), whatever it does with them.
func framesTo(t *testing.T, ns string, mac net.HardwareAddr, dst netip.Addr, port uint16) func() int {
	t.Helper()
	var fd int
	must(t, netutil.Do(ns, func() error {
		iface, err := net.InterfaceByName("eth0")
		if err != nil {
			return err
		}
		if fd, err = unix.Socket(unix.AF_PACKET, unix.SOCK_RAW, int(htons(unix.ETH_P_ALL))); err != nil {
			return err
		}
		return unix.Bind(fd, &unix.SockaddrLinklayer{Protocol: htons(unix.ETH_P_ALL), Ifindex: iface.Index})
	}))
	t.Cleanup(func() { unix.Close(fd) })
	tv := unix.NsecToTimeval((200 * time.Millisecond).Nanoseconds())
	must(t, unix.SetsockoptTimeval(fd, unix.SOL_SOCKET, unix.SO_RCVTIMEO, &tv))
	d := dst.As4()
	n := 0
	return func() int {
		buf := make([]byte, 2048)
		for {
			got, _, err := unix.Recvfrom(fd, buf, 0)
			if err != nil {
				return n
			}
			f := buf[:got]
			if got < 14+20+4 || net.HardwareAddr(f[0:6]).String() != mac.String() || binary.BigEndian.Uint16(f[12:14]) != unix.ETH_P_IP || f[14+9] != 6 ||
				[4]byte(f[14+16:14+20]) != d {
				continue
			}
			ihl := int(f[14]&0x0f) * 4
			if got >= 14+ihl+4 && binary.BigEndian.Uint16(f[14+ihl+2:]) == port {
				n++
			}
		}
	}
}

func htons(v uint16) uint16 { return v<<8 | v>>8 }

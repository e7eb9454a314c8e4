package datapath_test

import (
	"encoding/binary"
	"net"
	"net/netip"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/lace-cni/lace/internal/datapath"
	"github.com/lace-cni/lace/internal/netutil"
	"github.com/lace-cni/lace/internal/podnet"
)

// vlanFrames counts the frames that leave or enter ifName in nsPath with a
// VLAN tag while f runs. The kernel keeps a tag out of the frame's bytes
// (skb metadata) on veths and most NICs: a packet socket sees it only in
// PACKET_AUXDATA, so it is read from there.
func vlanFrames(t *testing.T, nsPath, ifName string, f func()) int {
	t.Helper()
	proto := int(binary.NativeEndian.Uint16(binary.BigEndian.AppendUint16(nil, unix.ETH_P_ALL))) // htons
	var fd int
	must(t, netutil.Do(nsPath, func() error {
		var err error
		if fd, err = unix.Socket(unix.AF_PACKET, unix.SOCK_RAW, proto); err != nil {
			return err
		}
		ifc, err := net.InterfaceByName(ifName)
		if err != nil {
			return err
		}
		if err := unix.SetsockoptInt(fd, unix.SOL_PACKET, unix.PACKET_AUXDATA, 1); err != nil {
			return err
		}
		return unix.Bind(fd, &unix.SockaddrLinklayer{Protocol: uint16(proto), Ifindex: ifc.Index})
	}))
	defer unix.Close(fd)
	tv := unix.NsecToTimeval((200 * time.Millisecond).Nanoseconds())
	must(t, unix.SetsockoptTimeval(fd, unix.SOL_SOCKET, unix.SO_RCVTIMEO, &tv))
	f()
	tagged := 0
	buf, oob := make([]byte, 65536), make([]byte, 256)
	for {
		_, oobn, _, _, err := unix.Recvmsg(fd, buf, oob, 0)
		if err != nil {
			return tagged
		}
		msgs, err := unix.ParseSocketControlMessage(oob[:oobn])
		if err != nil {
			continue
		}
		for _, m := range msgs {
			if m.Header.Level == unix.SOL_PACKET && m.Header.Type == unix.PACKET_AUXDATA && len(m.Data) >= 20 {
				status := binary.NativeEndian.Uint32(m.Data[0:4])
				if status&unix.TP_STATUS_VLAN_VALID != 0 {
					tagged++
				}
			}
		}
	}
}

// sendTagged sends, from pod p's eth0, a raw frame to dst carrying an
// IPv4 UDP datagram from the pod to to:7 behind an 802.1Q tag of VLAN
// vid, as a pod with NET_RAW can.
func sendTagged(t *testing.T, p *pod, dst net.HardwareAddr, vid uint16, to netip.Addr) {
	t.Helper()
	udp := make([]byte, 8+4)
	binary.BigEndian.PutUint16(udp[0:], 4321)
	binary.BigEndian.PutUint16(udp[2:], 7)
	binary.BigEndian.PutUint16(udp[4:], uint16(len(udp)))
	ip := make([]byte, 20)
	ip[0], ip[8], ip[9] = 0x45, 64, 17
	binary.BigEndian.PutUint16(ip[2:], uint16(20+len(udp)))
	s, d := p.v4.As4(), to.As4()
	copy(ip[12:16], s[:])
	copy(ip[16:20], d[:])
	var sum uint32
	for i := 0; i < 20; i += 2 {
		sum += uint32(binary.BigEndian.Uint16(ip[i:]))
	}
	for sum > 0xffff {
		sum = sum>>16 + sum&0xffff
	}
	binary.BigEndian.PutUint16(ip[10:], ^uint16(sum))
	must(t, netutil.Do(netutil.Path(p.ns), func() error {
		ifc, err := net.InterfaceByName("eth0")
		if err != nil {
			return err
		}
		fr := append(append([]byte(nil), dst...), ifc.HardwareAddr...)
		fr = binary.BigEndian.AppendUint16(fr, 0x8100)
		fr = binary.BigEndian.AppendUint16(fr, vid)
		fr = binary.BigEndian.AppendUint16(fr, 0x0800)
		fr = append(append(fr, ip...), udp...)
		fd, err := unix.Socket(unix.AF_PACKET, unix.SOCK_RAW, 0)
		if err != nil {
			return err
		}
		defer unix.Close(fd)
		return unix.Sendto(fd, fr, 0, &unix.SockaddrLinklayer{Ifindex: ifc.Index, Halen: 6})
	}))
}

// TestVLANTaggedFromPod: a pod's frame with an 802.1Q tag (sent raw, or
// through a VLAN device on its eth0) has its tag moved out of the frame by
// the node's kernel before tc sees it, and bpf_redirect keeps it: the
// packet would leave the node's underlay interface tagged, into whatever
// VLAN the pod chose (a trunk's management or storage VLAN). A pod's
// tagged frame is dropped instead.
func TestVLANTaggedFromPod(t *testing.T) {
	w := newWorld(t, 2)
	n1, n2 := w.nodes[0], w.nodes[1]
	w.addNetwork(7, "10.70.0.0/16", "fd00:70::/48", false)
	a := w.addPod("a", n1, 7, 2)
	c := w.addPod("c", n2, 7, 2)
	host, err := netutil.GetLink(netutil.Path(n1.ns), a.hostIf)
	must(t, err)
	before, err := n1.dp.Drops()
	must(t, err)
	tagged := vlanFrames(t, netutil.Path(n1.ns), "eth0", func() {
		for range 3 {
			sendTagged(t, a, host.MAC, 5, c.v4)
		}
	})
	if tagged > 0 {
		t.Errorf("%d frames left the node's underlay with the VLAN tag the pod chose", tagged)
	}
	after, err := n1.dp.Drops()
	must(t, err)
	if after["link-local"] < before["link-local"]+3 {
		t.Errorf("drop counter link-local went %d -> %d, want +3", before["link-local"], after["link-local"])
	}
	// Untagged, the pod still reaches c.
	if err := a.ping(c.v4); err != nil {
		t.Error(err)
	}
	_ = n2
}

// addL2Pod wires pod name into l2 network id on n at address a (its MAC
// derived from it), as the agent does for an l2 pod: host side with the
// network's gateway MAC, from_l2 attached, the port's MAC in the FDB.
func (w *world) addL2Pod(name string, n *node, id uint32, a, gw netip.Addr, bits int) (*pod, int) {
	mac := net.HardwareAddr{0x0a, 0x58, a.As4()[0], a.As4()[1], a.As4()[2], a.As4()[3]}
	gwMAC := net.HardwareAddr{0x0a, 0x5a, 0, 0, byte(id >> 8), byte(id)}
	p := &pod{name: name, node: n, ns: w.prefix + "-p-" + name, netID: id, v4: a, hostIf: podnet.HostIfName(w.prefix + name)}
	must(w.t, netutil.CreateNamed(p.ns))
	res, err := podnet.Setup(podnet.Spec{NodeNS: netutil.Path(n.ns), PodNS: netutil.Path(p.ns), HostIf: p.hostIf, PodIf: "eth0",
		MTU: 1400, Addrs: []netip.Addr{a}, Gateways: []netip.Addr{gw}, L2: true, PrefixBits: []int{bits}, PodMAC: mac, HostMAC: gwMAC})
	must(w.t, err)
	must(w.t, n.dp.UpsertEndpoint(datapath.Endpoint{NetID: id, Addr: a, IfIndex: uint32(res.HostIfIndex), PodMAC: mac, HostMAC: gwMAC}))
	must(w.t, n.dp.UpsertPort(datapath.Port{IfIndex: uint32(res.HostIfIndex), NetID: id, V4: a, L2: true}))
	must(w.t, n.dp.AttachPod(netutil.Path(n.ns), p.hostIf, true))
	return p, res.HostIfIndex
}

// TestVLANTaggedFromL2Pod: on an l2 port too, a tagged frame is dropped
// (from_l2), never switched to a peer with its tag.
func TestVLANTaggedFromL2Pod(t *testing.T) {
	w := newWorld(t, 1)
	n1 := w.nodes[0]
	const id = 8
	must(t, n1.dp.UpsertNetwork(datapath.Network{ID: id}))
	gw := netip.MustParseAddr("10.88.0.1")
	a, ai := w.addL2Pod("a", n1, id, netip.MustParseAddr("10.88.0.2"), gw, 24)
	b, bi := w.addL2Pod("b", n1, id, netip.MustParseAddr("10.88.0.3"), gw, 24)
	macOf := func(p *pod) net.HardwareAddr {
		l, err := netutil.GetLink(netutil.Path(p.ns), "eth0")
		must(t, err)
		return l.MAC
	}
	am, bm := macOf(a), macOf(b)
	must(t, n1.dp.SyncL2Local([]datapath.L2Neighbor{{NetID: id, Addr: a.v4, MAC: am}, {NetID: id, Addr: b.v4, MAC: bm}},
		[]datapath.FDBEntry{{NetID: id, MAC: am, IfIndex: uint32(ai)}, {NetID: id, MAC: bm, IfIndex: uint32(bi)}}))
	before, err := n1.dp.Drops()
	must(t, err)
	tagged := vlanFrames(t, netutil.Path(b.ns), "eth0", func() {
		for range 3 {
			sendTagged(t, a, bm, 5, b.v4)
		}
	})
	if tagged > 0 {
		t.Errorf("%d frames reached the peer with the VLAN tag the pod chose", tagged)
	}
	after, err := n1.dp.Drops()
	must(t, err)
	if after["link-local"] < before["link-local"]+3 {
		t.Errorf("drop counter link-local went %d -> %d, want +3", before["link-local"], after["link-local"])
	}
	// Untagged, a reaches b.
	if err := a.ping(b.v4); err != nil {
		t.Error(err)
	}
}

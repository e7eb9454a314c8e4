package datapath

import (
	"encoding/binary"
	"net/netip"
	"testing"

	"github.com/cilium/ebpf"

	"github.com/lace-cni/lace/internal/tables"
)

// BPF_PROG_RUN cases of the isolation boundaries (docs/security.md
// sections 4, 5 and 8): each refusal moves exactly one drop counter.

const progWorld = 100 // an external network classifying every source

// progWorldDatapath is progDatapath with an external network that covers
// every source and reaches the pod's block, and the inside prefixes: the
// pod network's subnets, a service range and the peer's locator.
func progWorldDatapath(t *testing.T) *Datapath {
	t.Helper()
	d := progPodDatapath(t)
	for _, err := range []error{
		d.UpsertNetwork(Network{ID: progWorld}),
		d.UpsertNetwork(Network{ID: progNet + 1}),
		d.UpsertClassifier(Classifier{NetID: progWorld, Prefix: netip.MustParsePrefix("0.0.0.0/0")}),
		d.UpsertClassifier(Classifier{NetID: progWorld, Prefix: netip.MustParsePrefix("::/0")}),
		d.UpsertRoute(Route{NetID: progWorld, Prefix: netip.MustParsePrefix("0.0.0.0/0"), Kind: tables.RouteExternal, DstNet: progWorld}),
		d.UpsertRoute(Route{NetID: progWorld, Prefix: netip.MustParsePrefix("10.70.1.0/24"), Kind: tables.RouteLocal, DstNet: progNet}),
		d.UpsertRoute(Route{NetID: progWorld, Prefix: netip.MustParsePrefix("fd00:70:0:1::/64"), Kind: tables.RouteLocal, DstNet: progNet}),
		d.UpsertInside(Inside{Prefix: netip.MustParsePrefix("10.70.0.0/16"), Kind: tables.InsidePodSubnet}),
		d.UpsertInside(Inside{Prefix: netip.MustParsePrefix("fd00:70::/48"), Kind: tables.InsidePodSubnet}),
		d.UpsertInside(Inside{Prefix: netip.MustParsePrefix("10.96.0.0/12"), Kind: tables.InsideServiceRange}),
		d.UpsertInside(Inside{Prefix: progOther, Kind: tables.InsideLocator}),
		d.UpsertNodeLocator(NodeLocator{Addr: progPeerV6, Locator: progOther}),
	} {
		if err != nil {
			t.Fatal(err)
		}
	}
	return d
}

func underlayVerdict(t *testing.T, d *Datapath, pkt []byte, want uint32) {
	t.Helper()
	if got := runProg(t, d.underlay.FromUnderlay, pkt); got != want {
		t.Errorf("verdict %d, want %d", got, want)
	}
}

// flowOf finds the conntrack entry of the local pod address and port with
// remote, in network net.
func flowOf(t *testing.T, d *Datapath, net uint32, local, remote netip.AddrPort) *Flow {
	t.Helper()
	flows, err := d.Conntrack()
	if err != nil {
		t.Fatal(err)
	}
	for i, f := range flows {
		if f.NetID == net && f.Local == local && f.Remote == remote {
			return &flows[i]
		}
	}
	return nil
}

// TestProgOutsideSpoofedSource: plain IP from the fabric whose source lies
// inside the cluster (a pod subnet, a service range, a node's locator) is
// dropped before classification, and a real pod-to-pod flow keeps its
// conntrack entry: no spoofed packet refreshes, closes or takes it.
func TestProgOutsideSpoofedSource(t *testing.T) {
	d := progWorldDatapath(t)
	peerPod := netip.MustParseAddr("10.70.2.2")
	sid := SID(progLocator, BehaviourL3Decap, progNet, progNet)
	// The real flow: the peer node's pod to ours, over SRv6.
	onlyDrop(t, d, "", func() {
		underlayVerdict(t, d, srv6(progPeerV6, sid, ipv4(peerPod, progPodV4, 6, tcpSYN(1000, 7)), true), actRedirect)
	})
	local, remote := netip.AddrPortFrom(progPodV4, 7), netip.AddrPortFrom(peerPod, 1000)
	if f := flowOf(t, d, progNet, local, remote); f == nil || f.PeerNet != progNet {
		t.Fatalf("the pod-to-pod flow's entry is %+v, want one with peer network %d", f, progNet)
	}
	rst := tcpSYN(1000, 7)
	rst[13] = 0x04
	cases := []struct {
		name string
		pkt  []byte
	}{
		{"IPv4 RST from a pod's address", ether(unicastMAC, 0x0800, ipv4(peerPod, progPodV4, 6, rst))},
		{"IPv4 SYN from a pod's address", ether(unicastMAC, 0x0800, ipv4(peerPod, progPodV4, 6, tcpSYN(1000, 7)))},
		{"IPv6 from a pod's address", ether(unicastMAC, 0x86dd, ipv6(netip.MustParseAddr("fd00:70:0:2::2"), progPodV6, 17, udp(1000, 7)))},
		{"IPv4 from a service range", ether(unicastMAC, 0x0800, ipv4(netip.MustParseAddr("10.96.0.10"), progPodV4, 17, udp(53, 7)))},
		{"IPv6 from a node's locator", ether(unicastMAC, 0x86dd, ipv6(netip.MustParseAddr("fd1a:ce:0:2::5"), progPodV6, 17, udp(1000, 7)))},
		{"IPv4 transit from a pod's address", ether(unicastMAC, 0x0800, ipv4(peerPod, netip.MustParseAddr("192.0.2.9"), 17, udp(1000, 7)))},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			onlyDrop(t, d, "outside-spoofed-source", func() { underlayVerdict(t, d, c.pkt, actShot) })
		})
	}
	f := flowOf(t, d, progNet, local, remote)
	if f == nil || f.PeerNet != progNet || f.Reset {
		t.Errorf("after the spoofed packets the pod-to-pod flow's entry is %+v, want it untouched (peer %d, no RST)", f, progNet)
	}
	// A true outside source still enters.
	onlyDrop(t, d, "", func() {
		underlayVerdict(t, d, ether(unicastMAC, 0x0800, ipv4(netip.MustParseAddr("172.31.0.200"), progPodV4, 17, udp(999, 7))), actRedirect)
	})
}

// TestProgFlowOfAnotherNetwork: conntrack entries belong to their peer
// network. A packet of network 8 whose tuple is a live flow of network 7
// (overlapping subnets) is refused, and the flow stays network 7's.
func TestProgFlowOfAnotherNetwork(t *testing.T) {
	d := progWorldDatapath(t)
	peerPod := netip.MustParseAddr("10.70.2.2")
	// Network 8 overlaps network 7: the same block on the peer node.
	if err := d.UpsertRoute(Route{NetID: progNet + 1, DstNet: progNet + 1, Prefix: netip.MustParsePrefix("10.70.2.0/24"),
		SID: SID(progOther, BehaviourL3Decap, progNet+1, progNet+1)}); err != nil {
		t.Fatal(err)
	}
	underlayVerdict(t, d, srv6(progPeerV6, SID(progLocator, BehaviourL3Decap, progNet, progNet), ipv4(peerPod, progPodV4, 17, udp(1000, 7)), true), actRedirect)
	other := SID(progLocator, BehaviourL3Decap, progNet+1, progNet)
	rst := tcpSYN(1000, 7)
	rst[13] = 0x04
	onlyDrop(t, d, "flow-of-another-network", func() {
		underlayVerdict(t, d, srv6(progPeerV6, other, ipv4(peerPod, progPodV4, 17, udp(1000, 7)), true), actShot)
	})
	if f := flowOf(t, d, progNet, netip.AddrPortFrom(progPodV4, 7), netip.AddrPortFrom(peerPod, 1000)); f == nil || f.PeerNet != progNet {
		t.Errorf("the flow's entry is %+v, want it still network %d's", f, progNet)
	}
	// A TCP flow: another network's RST neither resets nor takes it.
	underlayVerdict(t, d, srv6(progPeerV6, SID(progLocator, BehaviourL3Decap, progNet, progNet), ipv4(peerPod, progPodV4, 6, tcpSYN(2000, 7)), true), actRedirect)
	onlyDrop(t, d, "flow-of-another-network", func() {
		underlayVerdict(t, d, srv6(progPeerV6, other, ipv4(peerPod, progPodV4, 6, append([]byte{0x07, 0xd0, 0, 7}, rst[4:]...)), true), actShot)
	})
	if f := flowOf(t, d, progNet, netip.AddrPortFrom(progPodV4, 7), netip.AddrPortFrom(peerPod, 2000)); f == nil || f.PeerNet != progNet || f.Reset {
		t.Errorf("the TCP flow's entry is %+v, want it network %d's and not reset", f, progNet)
	}
}

// icmpUnreach is an ICMP (or ICMPv6) destination unreachable quoting
// the packet quote.
func icmpUnreach(v6 bool, quote []byte) []byte {
	if v6 {
		return append([]byte{1, 4, 0, 0, 0, 0, 0, 0}, quote...)
	}
	return append([]byte{3, 3, 0, 0, 0, 0, 0, 0}, quote...)
}

// TestProgPodICMPErrors: a pod sends an ICMP error only about a flow that
// conntrack holds for it: the quoted packet is addressed to the pod, comes
// from the error's destination, and its flow exists. Everything else is
// dropped as icmp-error-no-flow.
func TestProgPodICMPErrors(t *testing.T) {
	d := progWorldDatapath(t)
	peerPod := netip.MustParseAddr("10.70.2.2")
	ext := netip.MustParseAddr("172.31.0.200")
	// Flows the pod holds: one from a pod of its network, one from an
	// outside client.
	underlayVerdict(t, d, srv6(progPeerV6, SID(progLocator, BehaviourL3Decap, progNet, progNet), ipv4(peerPod, progPodV4, 17, udp(1000, 7)), true), actRedirect)
	underlayVerdict(t, d, ether(unicastMAC, 0x0800, ipv4(ext, progPodV4, 17, udp(999, 7))), actRedirect)
	// A flow of another pod of the same network on this node, and one of
	// network 8 at the pod's own address (overlapping subnets).
	neighbour := netip.MustParseAddr("10.70.1.3")
	for _, k := range []podCtKey{
		{NetId: progNet, Family: 4, Proto: 17, Lport: htons(7), Rport: htons(999), Laddr: addr16(neighbour), Raddr: addr16(ext)},
		{NetId: progNet + 1, Family: 4, Proto: 17, Lport: htons(7), Rport: htons(998), Laddr: addr16(progPodV4), Raddr: addr16(ext)},
	} {
		if err := d.pod.LaceCt.Put(k, podCtVal{Expires: ^uint64(0), PeerNet: progWorld}); err != nil {
			t.Fatal(err)
		}
	}
	quote := func(src netip.Addr, sport uint16, dst netip.Addr) []byte { return ipv4(src, dst, 17, udp(sport, 7)) }
	errTo := func(dst netip.Addr, q []byte) []byte {
		return ether(unicastMAC, 0x0800, ipv4(progPodV4, dst, 1, icmpUnreach(false, q)))
	}
	cases := []struct {
		name string
		pkt  []byte
	}{
		{"about a flow that never was", errTo(peerPod, quote(peerPod, 4444, progPodV4))},
		{"about its flow, to another pod", errTo(netip.MustParseAddr("10.70.2.3"), quote(peerPod, 1000, progPodV4))},
		{"about its outside flow, to another outside address", errTo(netip.MustParseAddr("198.51.100.7"), quote(ext, 999, progPodV4))},
		{"about another pod's flow", errTo(ext, quote(ext, 999, neighbour))},
		{"about a flow of another network", errTo(ext, quote(ext, 998, progPodV4))},
		{"to an outside address, about nothing", errTo(netip.MustParseAddr("198.51.100.7"), quote(netip.MustParseAddr("198.51.100.7"), 53, progPodV4))},
		{"IPv6, about a flow that never was", ether(unicastMAC, 0x86dd, ipv6(progPodV6, netip.MustParseAddr("fd00:70:0:2::2"), 58,
			icmpUnreach(true, ipv6(netip.MustParseAddr("fd00:70:0:2::2"), progPodV6, 17, udp(1000, 7)))))},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			onlyDrop(t, d, "icmp-error-no-flow", func() {
				if ret, _ := runPod(t, d, c.pkt); ret != actShot {
					t.Errorf("verdict %d, want a drop", ret)
				}
			})
		})
	}
	// About its own flow, to its peer: sent (encapsulated back to the
	// peer pod's node, in network 7).
	before, _ := d.Drops()
	_, out := runPod(t, d, errTo(peerPod, quote(peerPod, 1000, progPodV4)))
	after, _ := d.Drops()
	if after["icmp-error-no-flow"] != before["icmp-error-no-flow"] {
		t.Error("the pod's ICMP error about its own flow was refused")
	}
	if binary.BigEndian.Uint16(out[12:14]) != 0x86dd || !bytesEqual(out[14+24:14+40], addr16Slice(SID(progOther, BehaviourL3Decap, progNet, progNet))) {
		t.Errorf("the ICMP error about the pod's own flow was not encapsulated to its peer's SID")
	}
}

func htons(v uint16) uint16 { return ntohs(v) }

func addr16Slice(a netip.Addr) []byte {
	b := a.As16()
	return b[:]
}

// skbMarkCtx is an __sk_buff for BPF_PROG_RUN with only mark (offset 8)
// set.
func skbMarkCtx(mark uint32) []byte {
	b := make([]byte, 40)
	binary.LittleEndian.PutUint32(b[8:12], mark)
	return b
}

// TestProgNodeSpeaksForItself: on the underlay's egress, nothing but the
// node's own encapsulation reaches another node's locator, and nothing
// leaves from another node's address; at decapsulation, SRv6 from this
// node's own address (it never sends itself SRv6 over the fabric) is
// refused.
func TestProgNodeSpeaksForItself(t *testing.T) {
	d := progWorldDatapath(t)
	peerSID := SID(progOther, BehaviourL3Decap, progNet, progNet)
	inner := ipv4(netip.MustParseAddr("10.70.1.2"), netip.MustParseAddr("10.70.2.2"), 17, udp(1000, 7))
	egress := func(pkt []byte, mark uint32) uint32 {
		ret, err := d.underlay.ToUnderlay.Run(&ebpf.RunOptions{Data: pkt, Context: skbMarkCtx(mark)})
		if err != nil {
			t.Fatal(err)
		}
		return ret
	}
	refused := []struct {
		name string
		pkt  []byte
	}{
		{"the host's SRv6 with another node's outer source", srv6(progPeerV6, peerSID, inner, true)},
		{"the host's SRv6 with its own outer source", srv6(progNodeV6, peerSID, inner, true)},
		{"plain IPv6 from another node's address", ether(unicastMAC, 0x86dd, ipv6(progPeerV6, netip.MustParseAddr("fd00:99::c8"), 17, udp(1, 2)))},
	}
	for _, c := range refused {
		t.Run(c.name, func(t *testing.T) {
			onlyDrop(t, d, "node-forged-underlay", func() {
				if ret := egress(c.pkt, 0); ret != actShot {
					t.Errorf("verdict %d, want a drop", ret)
				}
			})
		})
	}
	passed := []struct {
		name string
		pkt  []byte
		mark uint32
	}{
		{"Lace's own encapsulation", srv6(progNodeV6, peerSID, inner, true), laceMarkEncap},
		{"the host's own plain IPv6", ether(unicastMAC, 0x86dd, ipv6(progNodeV6, netip.MustParseAddr("fd00:99::c8"), 6, tcpSYN(1, 2))), 0},
		{"the host's own IPv4", ether(unicastMAC, 0x0800, ipv4(progNodeV4, netip.MustParseAddr("172.31.0.200"), 6, tcpSYN(1, 2))), 0},
		{"the host to a pod block (plain IP)", ether(unicastMAC, 0x0800, ipv4(progNodeV4, netip.MustParseAddr("10.70.2.2"), 6, tcpSYN(1, 2))), 0},
	}
	for _, c := range passed {
		t.Run(c.name, func(t *testing.T) {
			onlyDrop(t, d, "", func() {
				if ret := egress(c.pkt, c.mark); ret != actOK {
					t.Errorf("verdict %d, want it passed", ret)
				}
			})
		})
	}
	// The encapsulation marks what it sends (the packet leaves by
	// redirect or is dropped for want of a route; either way marked).
	out := make([]byte, 256)
	ctxOut := make([]byte, 256)
	opts := &ebpf.RunOptions{Data: ether(unicastMAC, 0x0800, inner), DataOut: out, Context: skbCtx(progPort), ContextOut: ctxOut}
	if _, err := d.pod.FromPod.Run(opts); err != nil {
		t.Fatal(err)
	}
	if m := binary.LittleEndian.Uint32(ctxOut[8:12]); m != laceMarkEncap {
		t.Errorf("encapsulated packet's mark %#x, want LACE_MARK_ENCAP", m)
	}
	onlyDrop(t, d, "decap-unknown-source", func() {
		underlayVerdict(t, d, srv6(progNodeV6, SID(progLocator, BehaviourL3Decap, progNet, progNet),
			ipv4(netip.MustParseAddr("10.70.2.2"), progPodV4, 17, udp(1000, 7)), true), actShot)
	})
}

// TestProgDecapForeignSource: a node speaks for its own pods only. SRv6
// whose inner source is a pod is accepted only from the node whose
// locator holds that pod's block (in the source network's view); a third
// node claiming it, a node claiming a pod of this node's block, or of no
// block, is refused as decap-foreign-source. Outside sources (transit a
// node took from the fabric) are not pods and pass.
func TestProgDecapForeignSource(t *testing.T) {
	d := progWorldDatapath(t)
	third, thirdLoc := netip.MustParseAddr("fd00:99::3"), netip.MustParsePrefix("fd1a:ce:0:3::/64")
	for _, err := range []error{
		d.UpsertNode(third), d.UpsertNodeLocator(NodeLocator{Addr: third, Locator: thirdLoc}),
		d.UpsertRoute(Route{NetID: progNet, DstNet: progNet, Prefix: netip.MustParsePrefix("10.70.1.0/24"), Kind: tables.RouteLocal}),
	} {
		if err != nil {
			t.Fatal(err)
		}
	}
	sid := SID(progLocator, BehaviourL3Decap, progNet, progNet)
	cases := []struct {
		name   string
		outer  netip.Addr
		inner  netip.Addr
		sid    netip.Addr
		want   uint32
		reason string
	}{
		{"its own pod", progPeerV6, netip.MustParseAddr("10.70.2.2"), sid, actRedirect, ""},
		{"another node's pod", third, netip.MustParseAddr("10.70.2.2"), sid, actShot, "decap-foreign-source"},
		{"a pod of this node's block", progPeerV6, netip.MustParseAddr("10.70.1.3"), sid, actShot, "decap-foreign-source"},
		{"a pod subnet address of no block", progPeerV6, netip.MustParseAddr("10.70.9.9"), sid, actShot, "decap-foreign-source"},
		{"an outside source it took from the fabric", third, netip.MustParseAddr("172.31.0.200"), SID(progLocator, BehaviourL3Decap, progWorld, progNet), actRedirect, ""},
	}
	for i, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			onlyDrop(t, d, c.reason, func() {
				underlayVerdict(t, d, srv6(c.outer, c.sid, ipv4(c.inner, progPodV4, 17, udp(uint16(3000+i), 7)), true), c.want)
			})
		})
	}
}

// laceMarkEncap is LACE_MARK_ENCAP (bpf/include/lace.h).
const laceMarkEncap = 0x1ace0001

package datapath

import (
	"encoding/binary"
	"net/netip"
	"testing"
)

// icmpTooBig is IPv4 fragmentation needed (or ICMPv6 packet too big)
// with the given MTU, quoting quote.
func icmpTooBig(v6 bool, mtu uint16, quote []byte) []byte {
	if v6 {
		b := []byte{2, 0, 0, 0, 0, 0, 0, 0}
		binary.BigEndian.PutUint32(b[4:], uint32(mtu))
		return append(b, quote...)
	}
	b := []byte{3, 4, 0, 0, 0, 0, 0, 0}
	binary.BigEndian.PutUint16(b[6:], mtu)
	return append(b, quote...)
}

// TestProgICMPErrorsIn: an ICMP error toward a pod must be about a live
// flow of the pod (the quoted packet is one the pod sent) whose peer is
// the error's sender: the flow's peer network, or, for a flow whose remote
// side is outside, any outside source (a router on its path). A host on
// the fabric quoting a pod-to-pod flow, a pod of another network quoting
// it, and a quote of a flow that never was are dropped as
// icmp-error-in-no-flow; the peer's own errors, and a router's
// fragmentation needed about an outside flow, are delivered. Both
// families. Before, ct_track_in let every ICMP error through.
func TestProgICMPErrorsIn(t *testing.T) {
	d := progWorldDatapath(t)
	peer4, peer6 := netip.MustParseAddr("10.70.2.2"), netip.MustParseAddr("fd00:70:0:2::2")
	ext4, ext6 := netip.MustParseAddr("172.31.0.200"), netip.MustParseAddr("2001:db8::200")
	router4, router6 := netip.MustParseAddr("198.51.100.1"), netip.MustParseAddr("2001:db8:1::1")
	host4, host6 := netip.MustParseAddr("198.51.100.9"), netip.MustParseAddr("2001:db8:1::9")
	for _, r := range []Route{
		// Network 8 holds the same block on the peer node (overlapping).
		{NetID: progNet + 1, DstNet: progNet + 1, Prefix: netip.MustParsePrefix("10.70.2.0/24"), SID: SID(progOther, BehaviourL3Decap, progNet+1, progNet+1)},
		{NetID: progNet + 1, DstNet: progNet + 1, Prefix: netip.MustParsePrefix("fd00:70:0:2::/64"), SID: SID(progOther, BehaviourL3Decap, progNet+1, progNet+1)},
	} {
		if err := d.UpsertRoute(r); err != nil {
			t.Fatal(err)
		}
	}
	mine := SID(progLocator, BehaviourL3Decap, progNet, progNet)    // from network 7
	other := SID(progLocator, BehaviourL3Decap, progNet+1, progNet) // from network 8
	// The pod's flows: with a pod of its network on the peer node, and
	// with an outside client; each family.
	underlayVerdict(t, d, srv6(progPeerV6, mine, ipv4(peer4, progPodV4, 17, udp(1000, 7)), true), actRedirect)
	underlayVerdict(t, d, srv6(progPeerV6, mine, ipv6(peer6, progPodV6, 17, udp(1000, 7)), false), actRedirect)
	underlayVerdict(t, d, ether(unicastMAC, 0x0800, ipv4(ext4, progPodV4, 17, udp(999, 7))), actRedirect)
	underlayVerdict(t, d, ether(unicastMAC, 0x86dd, ipv6(ext6, progPodV6, 17, udp(999, 7))), actRedirect)
	// What the pod sent on them: the errors' quotes.
	pod4 := ipv4(progPodV4, peer4, 17, udp(7, 1000))
	pod6 := ipv6(progPodV6, peer6, 17, udp(7, 1000))
	out4 := ipv4(progPodV4, ext4, 17, udp(7, 999))
	out6 := ipv6(progPodV6, ext6, 17, udp(7, 999))
	plain4 := func(src netip.Addr, msg []byte) []byte {
		return ether(unicastMAC, 0x0800, ipv4(src, progPodV4, 1, msg))
	}
	plain6 := func(src netip.Addr, msg []byte) []byte {
		return ether(unicastMAC, 0x86dd, ipv6(src, progPodV6, 58, msg))
	}

	for _, c := range []struct {
		name string
		pkt  []byte
	}{
		{"a fabric host's port unreachable about a pod-to-pod flow", plain4(host4, icmpUnreach(false, pod4))},
		{"a fabric host's fragmentation needed about a pod-to-pod flow", plain4(host4, icmpTooBig(false, 576, pod4))},
		{"a fabric host's IPv6 port unreachable about a pod-to-pod flow", plain6(host6, icmpUnreach(true, pod6))},
		{"a fabric host's packet too big about a pod-to-pod flow", plain6(host6, icmpTooBig(true, 1280, pod6))},
		{"network 8's port unreachable about network 7's flow", srv6(progPeerV6, other, ipv4(peer4, progPodV4, 1, icmpUnreach(false, pod4)), true)},
		{"network 8's fragmentation needed about network 7's flow", srv6(progPeerV6, other, ipv4(peer4, progPodV4, 1, icmpTooBig(false, 576, pod4)), true)},
		{"network 8's IPv6 packet too big about network 7's flow", srv6(progPeerV6, other, ipv6(peer6, progPodV6, 58, icmpTooBig(true, 1280, pod6)), false)},
		{"the peer's error about a flow that never was", srv6(progPeerV6, mine, ipv4(peer4, progPodV4, 1, icmpUnreach(false, ipv4(progPodV4, peer4, 17, udp(7, 4444)))), true)},
		{"the peer's error quoting another source", srv6(progPeerV6, mine, ipv4(peer4, progPodV4, 1, icmpUnreach(false, ipv4(netip.MustParseAddr("10.70.1.3"), peer4, 17, udp(7, 1000)))), true)},
		{"an outside error about a flow that never was", plain4(router4, icmpTooBig(false, 576, ipv4(progPodV4, ext4, 17, udp(7, 4444))))},
	} {
		t.Run(c.name, func(t *testing.T) {
			onlyDrop(t, d, "icmp-error-in-no-flow", func() {
				underlayVerdict(t, d, c.pkt, actShot)
			})
		})
	}
	for _, c := range []struct {
		name string
		pkt  []byte
	}{
		{"the peer's port unreachable", srv6(progPeerV6, mine, ipv4(peer4, progPodV4, 1, icmpUnreach(false, pod4)), true)},
		{"the peer's IPv6 packet too big", srv6(progPeerV6, mine, ipv6(peer6, progPodV6, 58, icmpTooBig(true, 1280, pod6)), false)},
		{"the outside client's port unreachable", plain4(ext4, icmpUnreach(false, out4))},
		{"a router's fragmentation needed about an outside flow", plain4(router4, icmpTooBig(false, 576, out4))},
		{"a router's packet too big about an outside flow", plain6(router6, icmpTooBig(true, 1280, out6))},
	} {
		t.Run(c.name, func(t *testing.T) {
			onlyDrop(t, d, "", func() {
				underlayVerdict(t, d, c.pkt, actRedirect)
			})
		})
	}
	// The refused errors changed nothing: the flows live on, their peer
	// unchanged.
	for _, f := range []struct {
		local, remote netip.AddrPort
		peer          uint32
	}{
		{netip.AddrPortFrom(progPodV4, 7), netip.AddrPortFrom(peer4, 1000), progNet},
		{netip.AddrPortFrom(progPodV6, 7), netip.AddrPortFrom(peer6, 1000), progNet},
	} {
		if got := flowOf(t, d, progNet, f.local, f.remote); got == nil || got.PeerNet != f.peer {
			t.Errorf("flow %s -> %s is %+v, want it live with peer network %d", f.local, f.remote, got, f.peer)
		}
	}
}

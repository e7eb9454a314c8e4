package datapath

import (
	"context"
	"net/netip"
	"reflect"
	"testing"
	"time"

	"github.com/cilium/ebpf"

	"github.com/lace-cni/lace/internal/netpol"
	"github.com/lace-cni/lace/internal/tables"
)

// The policy tables as the programs read them: classes by network and
// address, verdicts by longest prefix, replies through conntrack, drops
// counted on the deciding policy.

const (
	polDenyIn  = 0x1001
	polDenyOut = 0x1002
	polAllow   = 0x2001
)

// policyWorld is progPodDatapath with a second network (8) whose
// addresses overlap network 7's, and sync writes policy tables t.
func policyWorld(t *testing.T) (*Datapath, func(netpol.Tables)) {
	t.Helper()
	d := progPodDatapath(t)
	if err := d.UpsertNetwork(Network{ID: 8}); err != nil {
		t.Fatal(err)
	}
	return d, func(tb netpol.Tables) {
		t.Helper()
		if tb.Policies == nil {
			tb.Policies = map[uint32]netpol.PolicyRef{}
		}
		for _, id := range []uint32{polDenyIn, polDenyOut, polAllow} {
			tb.Policies[id] = netpol.PolicyRef{Kind: "NetworkPolicy", Namespace: "ns", Name: "p"}
		}
		if err := d.SyncPolicies(tb); err != nil {
			t.Fatal(err)
		}
	}
}

func policyDrops(t *testing.T, d *Datapath, id uint32) uint64 {
	t.Helper()
	m, err := d.PolicyDrops()
	if err != nil {
		t.Fatal(err)
	}
	return m[id]
}

// TestProgPolicyIngress: a packet from another node to an isolated pod
// passes only as its verdicts say: by the peer's class (its network and
// address, or a CIDR), protocol and port range; a miss is dropped as
// policy and counted on the policy that isolates the pod.
func TestProgPolicyIngress(t *testing.T) {
	d, sync := policyWorld(t)
	peer := netip.MustParseAddr("10.70.2.2")
	sid := func(src uint32) netip.Addr { return SID(progLocator, BehaviourL3Decap, src, progNet) }
	from := func(src uint32, a netip.Addr, proto byte, l4 []byte) []byte {
		return srv6(progPeerV6, sid(src), ipv4(a, progPodV4, proto, l4), true)
	}
	// The pod's ingress: UDP 7 and TCP 1000-1003 from the pod peer
	// (class 5, network 7 only); anything from 10.99.0.0/16 (class 9).
	tables := netpol.Tables{
		Endpoints: map[uint32]netpol.Endpoint{1: {Lookup: netpol.Ingress, Isolated: netpol.Ingress, DenyIn: polDenyIn}},
		Peers:     map[netpol.PeerKey]uint32{{NetID: progNet, Addr: peer}: 5},
		CIDRs:     map[netip.Prefix]uint32{netip.MustParsePrefix("10.99.0.0/16"): 9, netip.MustParsePrefix("10.99.7.0/24"): 0},
		Verdicts: map[netpol.VerdictKey]netpol.Verdict{
			{Ifindex: 1, Class: 5, Dir: netpol.Ingress, Proto: 17, Port: 7, PrefixLen: 96}:   {Policy: polAllow, Allow: true},
			{Ifindex: 1, Class: 5, Dir: netpol.Ingress, Proto: 6, Port: 1000, PrefixLen: 94}: {Policy: polAllow, Allow: true},
			{Ifindex: 1, Class: 9, Dir: netpol.Ingress, PrefixLen: 72}:                       {Policy: polAllow, Allow: true},
		},
	}
	sync(tables)
	cases := []struct {
		name   string
		pkt    []byte
		want   uint32
		reason string
	}{
		{"UDP 7 from the peer", from(progNet, peer, 17, udp(1000, 7)), actRedirect, ""},
		{"UDP 8 from the peer", from(progNet, peer, 17, udp(1000, 8)), actShot, "policy"},
		{"TCP 7 from the peer", from(progNet, peer, 6, tcpSYN(1000, 7)), actShot, "policy"},
		{"TCP 1000 from the peer", from(progNet, peer, 6, tcpSYN(40000, 1000)), actRedirect, ""},
		{"TCP 1003 from the peer", from(progNet, peer, 6, tcpSYN(40000, 1003)), actRedirect, ""},
		{"TCP 1004 from the peer", from(progNet, peer, 6, tcpSYN(40000, 1004)), actShot, "policy"},
		{"TCP 999 from the peer", from(progNet, peer, 6, tcpSYN(40000, 999)), actShot, "policy"},
		{"ICMP echo from the peer", from(progNet, peer, 1, icmpEcho(false)), actShot, "policy"},
		// The same address in another network is another peer.
		{"UDP 7 from the peer's address in network 8", from(8, peer, 17, udp(1001, 7)), actShot, "policy"},
		{"another pod of the network", from(progNet, netip.MustParseAddr("10.70.2.3"), 17, udp(1000, 7)), actShot, "policy"},
		{"any protocol from the CIDR", from(progNet, netip.MustParseAddr("10.99.1.1"), 1, icmpEcho(false)), actRedirect, ""},
		{"the CIDR from network 8", from(8, netip.MustParseAddr("10.99.1.1"), 17, udp(1, 2)), actRedirect, ""},
		{"the CIDR's except", from(progNet, netip.MustParseAddr("10.99.7.1"), 17, udp(1000, 7)), actShot, "policy"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			before := policyDrops(t, d, polDenyIn)
			onlyDrop(t, d, c.reason, func() {
				if got := runProg(t, d.underlay.FromUnderlay, c.pkt); got != c.want {
					t.Errorf("verdict %d, want %d", got, c.want)
				}
			})
			want := before
			if c.reason == "policy" {
				want++
			}
			if got := policyDrops(t, d, polDenyIn); got != want {
				t.Errorf("drops of the isolating policy %d -> %d, want %d", before, got, want)
			}
		})
	}

	// A reply to the pod's own flow passes whatever its ingress says.
	t.Run("reply to the pod's flow", func(t *testing.T) {
		onlyDrop(t, d, "no-underlay-route", func() {
			if got, _ := runPod(t, d, ether(unicastMAC, 0x0800, ipv4(progPodV4, peer, 17, udp(5555, 9000)))); got != actShot {
				t.Errorf("the pod's request: verdict %d", got)
			}
		})
		onlyDrop(t, d, "", func() {
			if got := runProg(t, d.underlay.FromUnderlay, from(progNet, peer, 17, udp(9000, 5555))); got != actRedirect {
				t.Errorf("the reply: verdict %d, want a redirect", got)
			}
		})
		// Not the same ports from the same peer.
		onlyDrop(t, d, "policy", func() {
			if got := runProg(t, d.underlay.FromUnderlay, from(progNet, peer, 17, udp(9000, 5556))); got != actShot {
				t.Errorf("no reply: verdict %d, want a drop", got)
			}
		})
	})

	// Policies gone: the pod is open again, and the counters go with them.
	t.Run("no policy", func(t *testing.T) {
		if err := d.SyncPolicies(netpol.Tables{}); err != nil {
			t.Fatal(err)
		}
		onlyDrop(t, d, "", func() {
			if got := runProg(t, d.underlay.FromUnderlay, from(progNet, peer, 17, udp(1000, 8))); got != actRedirect {
				t.Errorf("verdict %d, want a redirect", got)
			}
		})
		if m, err := d.PolicyDrops(); err != nil || len(m) != 0 {
			t.Errorf("drop counters %v (%v), want none", m, err)
		}
		for name, n := range map[string]int{"lace_pol": mapLen(t, d.pod.LacePol), "lace_pol_eps": mapLen(t, d.pod.LacePolEps),
			"lace_pol_peers": mapLen(t, d.pod.LacePolPeers), "lace_pol_cidrs": mapLen(t, d.pod.LacePolCidrs)} {
			if n != 0 {
				t.Errorf("%s holds %d entries, want none", name, n)
			}
		}
	})
}

// TestProgPolicyEgress: what an isolated pod sends is decided on its
// destination, a service's after translation too; an open pod sends.
func TestProgPolicyEgress(t *testing.T) {
	d, sync := policyWorld(t)
	peer := netip.MustParseAddr("10.70.2.2")
	send := func(dst netip.Addr, proto byte, l4 []byte) []byte {
		return ether(unicastMAC, 0x0800, ipv4(progPodV4, dst, proto, l4))
	}
	// Sent on to the peer node: the test has no underlay route.
	const sent = "no-underlay-route"
	onlyDrop(t, d, sent, func() { runPod(t, d, send(peer, 17, udp(1, 53))) })
	sync(netpol.Tables{
		Endpoints: map[uint32]netpol.Endpoint{progPort: {Lookup: netpol.Egress, Isolated: netpol.Egress, DenyOut: polDenyOut}},
		Peers:     map[netpol.PeerKey]uint32{{NetID: progNet, Addr: peer}: 5},
		Verdicts: map[netpol.VerdictKey]netpol.Verdict{
			{Ifindex: progPort, Class: 5, Dir: netpol.Egress, Proto: 17, PrefixLen: 80}: {Policy: polAllow, Allow: true},
		},
	})
	cases := []struct {
		name   string
		pkt    []byte
		reason string
	}{
		{"UDP to the peer", send(peer, 17, udp(1, 53)), sent},
		{"UDP to the peer's last port", send(peer, 17, udp(1, 65535)), sent},
		{"TCP to the peer", send(peer, 6, tcpSYN(1, 53)), "policy"},
		{"UDP to another pod", send(netip.MustParseAddr("10.70.2.3"), 17, udp(1, 53)), "policy"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			before := policyDrops(t, d, polDenyOut)
			onlyDrop(t, d, c.reason, func() { runPod(t, d, c.pkt) })
			want := before
			if c.reason == "policy" {
				want++
			}
			if got := policyDrops(t, d, polDenyOut); got != want {
				t.Errorf("drops of the isolating policy %d -> %d, want %d", before, got, want)
			}
		})
	}
}

// TestProgPolicyPortReused: a port deleted takes its policy with it, so
// the next pod given its ifindex starts without the last one's.
func TestProgPolicyPortReused(t *testing.T) {
	d, sync := policyWorld(t)
	sync(netpol.Tables{Endpoints: map[uint32]netpol.Endpoint{progPort: {Lookup: netpol.Egress, Isolated: netpol.Egress, DenyOut: polDenyOut}}})
	if err := d.DeletePort(progPort); err != nil {
		t.Fatal(err)
	}
	if n := mapLen(t, d.pod.LacePolEps); n != 0 {
		t.Fatalf("lace_pol_eps holds %d entries after the port's deletion", n)
	}
	// The mirror knows: the next sync writes the entry again.
	sync(netpol.Tables{Endpoints: map[uint32]netpol.Endpoint{progPort: {Lookup: netpol.Egress, Isolated: netpol.Egress, DenyOut: polDenyOut}}})
	if n := mapLen(t, d.pod.LacePolEps); n != 1 {
		t.Fatalf("lace_pol_eps holds %d entries after a sync, want 1", n)
	}
}

// mapLen counts m's entries.
func mapLen(t *testing.T, m *ebpf.Map) int {
	t.Helper()
	n := 0
	key, next := make([]byte, m.KeySize()), make([]byte, m.KeySize())
	err := m.NextKey(nil, &next)
	for ; err == nil; err = m.NextKey(key, &next) {
		n++
		copy(key, next)
	}
	return n
}

// TestProgPolicyLookupOnly: a pod a ClusterNetworkPolicy rule selects but
// no NetworkPolicy isolates: what a verdict denies is dropped and counted
// on the verdict's policy; what no verdict names passes.
func TestProgPolicyLookupOnly(t *testing.T) {
	d, sync := policyWorld(t)
	const cnp = 0x3001
	peer := netip.MustParseAddr("10.70.2.2")
	from := func(sport, dport uint16) []byte {
		return srv6(progPeerV6, SID(progLocator, BehaviourL3Decap, progNet, progNet), ipv4(peer, progPodV4, 17, udp(sport, dport)), true)
	}
	sync(netpol.Tables{
		Endpoints: map[uint32]netpol.Endpoint{1: {Lookup: netpol.Ingress}},
		Peers:     map[netpol.PeerKey]uint32{{NetID: progNet, Addr: peer}: 5},
		Verdicts: map[netpol.VerdictKey]netpol.Verdict{
			{Ifindex: 1, Class: 5, Dir: netpol.Ingress, Proto: 17, Port: 53, PrefixLen: 96}: {Policy: cnp},
		},
		Policies: map[uint32]netpol.PolicyRef{cnp: {Kind: "ClusterNetworkPolicy", Name: "deny-dns"}},
	})
	onlyDrop(t, d, "policy", func() {
		if got := runProg(t, d.underlay.FromUnderlay, from(1000, 53)); got != actShot {
			t.Errorf("denied by the verdict: verdict %d, want a drop", got)
		}
	})
	if n := policyDrops(t, d, cnp); n != 1 {
		t.Errorf("drops counted on the denying policy: %d, want 1", n)
	}
	onlyDrop(t, d, "", func() {
		if got := runProg(t, d.underlay.FromUnderlay, from(1000, 54)); got != actRedirect {
			t.Errorf("no verdict, not isolated: verdict %d, want a redirect", got)
		}
	})
}

// TestProgFlows: with flow events on, a pod's new flow, a packet a
// policy refuses and a packet dropped for another reason are told
// through the ring, every field as the program saw it (a Service's flow
// with the frontend it addressed, a drop after encapsulation by the
// packet inside); off, nothing is.
func TestProgFlows(t *testing.T) {
	d, sync := policyWorld(t)
	peer := netip.MustParseAddr("10.70.2.2")
	sync(netpol.Tables{Endpoints: map[uint32]netpol.Endpoint{1: {Lookup: netpol.Ingress, Isolated: netpol.Ingress, DenyIn: polDenyIn}}})
	in := srv6(progPeerV6, SID(progLocator, BehaviourL3Decap, progNet, progNet), ipv4(peer, progPodV4, 6, tcpSYN(40000, 80)), true)
	out := ether(unicastMAC, 0x0800, ipv4(progPodV4, peer, 17, udp(5555, 53)))

	read := func() []FlowEvent {
		ctx, cancel := context.WithTimeout(context.Background(), 700*time.Millisecond)
		defer cancel()
		var got []FlowEvent
		_ = d.ReadFlows(ctx, func(e FlowEvent) { got = append(got, e) })
		return got
	}
	// Off: nothing told.
	runProg(t, d.underlay.FromUnderlay, in)
	if got := read(); len(got) != 0 {
		t.Fatalf("flows off told %+v", got)
	}
	if err := d.SetFlows(true, 100); err != nil {
		t.Fatal(err)
	}
	runProg(t, d.underlay.FromUnderlay, in)
	runPod(t, d, out)
	got := read()
	// The test's node has no underlay route: the new flow is dropped
	// once encapsulated, and told as the pod's packet.
	if len(got) != 3 {
		t.Fatalf("told %d events (%+v), want the refused SYN, the new flow and its drop", len(got), got)
	}
	drop, fwd, noRoute := got[0], got[1], got[2]
	if !noRoute.Dropped || noRoute.Reason != "no-underlay-route" || noRoute.PolicyDirDecided || noRoute.IfIndex != progPort ||
		noRoute.SrcNet != progNet || noRoute.Proto != 17 || noRoute.Src != fwd.Src || noRoute.Dst != fwd.Dst || noRoute.Service.IsValid() {
		t.Errorf("the flow dropped after encapsulation told as %+v", noRoute)
	}
	if !drop.Dropped || drop.Reason != "policy" || !drop.Ingress || drop.Policy != polDenyIn || drop.IfIndex != 1 ||
		drop.SrcNet != progNet || drop.DstNet != 0 || drop.Proto != 6 || drop.TCPFlags&0x02 == 0 ||
		drop.Src != netip.AddrPortFrom(peer, 40000) || drop.Dst != netip.AddrPortFrom(progPodV4, 80) || drop.Boot == 0 {
		t.Errorf("the refused SYN told as %+v", drop)
	}
	if fwd.Dropped || fwd.PolicyDirDecided || fwd.IfIndex != progPort || fwd.SrcNet != progNet || fwd.DstNet != progNet ||
		fwd.Proto != 17 || fwd.Src != netip.AddrPortFrom(progPodV4, 5555) || fwd.Dst != netip.AddrPortFrom(peer, 53) {
		t.Errorf("the new flow told as %+v", fwd)
	}
	// Through a Service: the flow names the frontend it addressed; a
	// Service without endpoints rejects, told before any translation.
	vip, empty := netip.MustParseAddr("10.96.0.50"), netip.MustParseAddr("10.96.0.51")
	for _, a := range []netip.Addr{vip, empty} {
		lbMust(t, d.UpsertRoute(Route{NetID: progNet, Prefix: netip.PrefixFrom(a, 32), Kind: tables.RouteService, DstNet: progNet}))
	}
	if _, err := d.ApplyServices([]Service{
		{VIP: vip, Proto: 6, Port: 80, NetID: progNet, Backends: []Backend{{Addr: peer, Port: 8080}}},
		{VIP: empty, Proto: 6, Port: 80, NetID: progNet},
	}); err != nil {
		t.Fatal(err)
	}
	runPod(t, d, ether(unicastMAC, 0x0800, ipv4(progPodV4, vip, 6, tcpSYN(41000, 80))))
	runPod(t, d, ether(unicastMAC, 0x0800, ipv4(progPodV4, empty, 6, tcpSYN(41001, 80))))
	got = read()
	if len(got) != 3 {
		t.Fatalf("told %d events (%+v), want the Service's flow, its drop and the rejection", len(got), got)
	}
	if e := got[0]; e.Dropped || e.Service != netip.AddrPortFrom(vip, 80) || e.Dst != netip.AddrPortFrom(peer, 8080) ||
		e.Src != netip.AddrPortFrom(progPodV4, 41000) || e.IfIndex != progPort {
		t.Errorf("the Service's flow told as %+v", e)
	}
	if e := got[2]; !e.Dropped || e.Reason != "no-endpoints" || e.Dst != netip.AddrPortFrom(empty, 80) || e.SrcNet != progNet {
		t.Errorf("the rejection told as %+v", e)
	}
	// Off again: a drop is neither told nor noted for a later packet.
	if err := d.SetFlows(false, 100); err != nil {
		t.Fatal(err)
	}
	runPod(t, d, ether(unicastMAC, 0x0800, ipv4(progPodV4, empty, 6, tcpSYN(41002, 80))))
	if err := d.SetFlows(true, 100); err != nil {
		t.Fatal(err)
	}
	runPod(t, d, ether(unicastMAC, 0x0800, ipv4(progPodV4, vip, 6, tcpSYN(41003, 80))))
	if got = read(); len(got) != 2 || got[0].Dropped || got[1].Reason != "no-underlay-route" {
		t.Errorf("after a drop while off, told %+v, want only the new flow and its drop", got)
	}
	// The budget: 100 a second on each CPU, the rest counted as lost
	// (250 packets in well under a second span two seconds at most).
	for range 250 {
		runProg(t, d.underlay.FromUnderlay, in)
	}
	if n := len(read()); n > 200 {
		t.Errorf("told %d events, over the budget of 100 a second", n)
	}
	if lost, err := d.FlowsLost(); err != nil || lost == 0 {
		t.Errorf("lost %d (%v), want the events over the budget counted", lost, err)
	}
}

// TestProgPolicyHiddenAndSCTP: SCTP is decided by its ports; a protocol
// behind an IPv6 extension header is refused wherever a policy has a say
// (no rule could be matched to it), and passes where none has.
func TestProgPolicyHiddenAndSCTP(t *testing.T) {
	d, sync := policyWorld(t)
	peer4, peer6 := netip.MustParseAddr("10.70.2.2"), netip.MustParseAddr("fd00:70:0:2::2")
	sid := SID(progLocator, BehaviourL3Decap, progNet, progNet)
	sctp := func(dport uint16) []byte {
		b := make([]byte, 12)
		b[0], b[1], b[2], b[3] = 0x13, 0x88, byte(dport>>8), byte(dport)
		return b
	}
	destOpts := append([]byte{6, 0, 1, 4, 0, 0, 0, 0}, tcpSYN(40000, 22)...) // then TCP
	sync(netpol.Tables{
		Endpoints: map[uint32]netpol.Endpoint{1: {Lookup: netpol.Ingress, Isolated: netpol.Ingress, DenyIn: polDenyIn}},
		Peers:     map[netpol.PeerKey]uint32{{NetID: progNet, Addr: peer4}: 5, {NetID: progNet, Addr: peer6}: 5},
		Verdicts: map[netpol.VerdictKey]netpol.Verdict{
			{Ifindex: 1, Class: 5, Dir: netpol.Ingress, Proto: 132, Port: 5000, PrefixLen: 96}: {Policy: polAllow, Allow: true},
			{Ifindex: 1, Class: 5, Dir: netpol.Ingress, Proto: 6, PrefixLen: 80}:               {Policy: polAllow, Allow: true},
		},
	})
	cases := []struct {
		name   string
		pkt    []byte
		want   uint32
		reason string
	}{
		{"SCTP to the allowed port", srv6(progPeerV6, sid, ipv4(peer4, progPodV4, 132, sctp(5000)), true), actRedirect, ""},
		{"SCTP to another port", srv6(progPeerV6, sid, ipv4(peer4, progPodV4, 132, sctp(5001)), true), actShot, "policy"},
		{"TCP, every port allowed", srv6(progPeerV6, sid, ipv6(peer6, progPodV6, 6, tcpSYN(40000, 22)), false), actRedirect, ""},
		{"TCP behind destination options", srv6(progPeerV6, sid, ipv6(peer6, progPodV6, 60, destOpts), false), actShot, "policy"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			onlyDrop(t, d, c.reason, func() {
				if got := runProg(t, d.underlay.FromUnderlay, c.pkt); got != c.want {
					t.Errorf("verdict %d, want %d", got, c.want)
				}
			})
		})
	}
	// No policy has a say: extension headers pass as before.
	sync(netpol.Tables{})
	onlyDrop(t, d, "", func() {
		if got := runProg(t, d.underlay.FromUnderlay, srv6(progPeerV6, sid, ipv6(peer6, progPodV6, 60, destOpts), false)); got != actRedirect {
			t.Errorf("an open pod: verdict %d, want a redirect", got)
		}
	})
}

// TestPolicyTablesFull: a new state that fits only once the old one is
// gone is written (stale entries first); one that never fits leaves every
// pod a policy has a say on refusing what no verdict admits.
func TestPolicyTablesFull(t *testing.T) {
	d, sync := policyWorld(t)
	verdicts := func(class uint32, n int) map[netpol.VerdictKey]netpol.Verdict {
		m := make(map[netpol.VerdictKey]netpol.Verdict, n)
		for i := range n {
			m[netpol.VerdictKey{Ifindex: uint32(1 + i/60000), Class: class, Dir: netpol.Ingress, Proto: 6, Port: uint16(i % 60000), PrefixLen: 96}] =
				netpol.Verdict{Policy: polAllow, Allow: true}
		}
		return m
	}
	eps := map[uint32]netpol.Endpoint{1: {Lookup: netpol.Ingress, Isolated: netpol.Ingress, DenyIn: polDenyIn},
		2: {Lookup: netpol.Ingress, DenyIn: polDenyIn}}
	sync(netpol.Tables{Endpoints: eps, Verdicts: verdicts(5, 300000)})
	sync(netpol.Tables{Endpoints: eps, Verdicts: verdicts(6, 300000)})
	if n := mapLen(t, d.pod.LacePol); n != 300000 {
		t.Fatalf("lace_pol holds %d entries, want the new 300000", n)
	}
	// Over the map's size: an error, and port 2 (a say, no isolation)
	// now refuses what no verdict admits.
	tb := netpol.Tables{Endpoints: eps, Verdicts: verdicts(7, 600000), Policies: map[uint32]netpol.PolicyRef{}}
	if err := d.SyncPolicies(tb); err == nil {
		t.Fatal("600000 verdicts written into a map of 524288")
	}
	var v podPolEpVal
	if err := d.pod.LacePolEps.Lookup(uint32(2), &v); err != nil || v.Flags != 1|1<<2 {
		t.Errorf("port 2 after a failed write: %+v (%v), want ingress looked up and isolated", v, err)
	}
}

// TestReadPolicies: the maps read back are the tables written.
func TestReadPolicies(t *testing.T) {
	d, sync := policyWorld(t)
	want := netpol.Tables{
		Endpoints: map[uint32]netpol.Endpoint{1: {Lookup: netpol.Ingress | netpol.Egress, Isolated: netpol.Ingress, DenyIn: polDenyIn},
			2: {Lookup: netpol.Egress, DenyOut: polDenyOut}},
		Peers: map[netpol.PeerKey]uint32{{NetID: progNet, Addr: netip.MustParseAddr("10.70.2.2")}: 5,
			{NetID: 8, Addr: netip.MustParseAddr("fd00:70:0:2::2")}: 6},
		CIDRs: map[netip.Prefix]uint32{netip.MustParsePrefix("10.0.0.0/8"): 7, netip.MustParsePrefix("10.1.0.0/16"): 0,
			netip.MustParsePrefix("fd00::/8"): 7},
		Verdicts: map[netpol.VerdictKey]netpol.Verdict{
			{Ifindex: 1, Class: 5, Dir: netpol.Ingress, Proto: 6, Port: 0x1230, PrefixLen: 92}: {Policy: polAllow, Rule: 3, Allow: true},
			{Ifindex: 2, Class: 7, Dir: netpol.Egress, PrefixLen: 72}:                          {Policy: polDenyOut, Rule: 1},
		},
	}
	sync(want)
	got, err := d.ReadPolicies()
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(got.Endpoints, want.Endpoints) || !reflect.DeepEqual(got.Peers, want.Peers) ||
		!reflect.DeepEqual(got.CIDRs, want.CIDRs) || !reflect.DeepEqual(got.Verdicts, want.Verdicts) {
		t.Errorf("read back %+v\nwant %+v", got, want)
	}
}

package datapath

import (
	"net/netip"
	"testing"

	"github.com/lace-cni/lace/internal/tables"
)

// Errors entering a pod, hostile review rev17b:
//   - a pod's flow to an external frontend (a LoadBalancer address of the
//     cluster) never leaves the node as addressed (to_service translated
//     it), so nobody on a path can have seen it; its entry's remote (the
//     LoadBalancer address) is not in lace_inside, and any outside host
//     that guesses the tuple could abort it or lower its path MTU: the
//     pod's socket, connected to that address, takes the error;
//   - an error about a pod-to-pod flow that comes over SRv6 in the flow's
//     network but from another inner source than the flow's peer (an
//     outside address: foreign_source checks only pod sources): any node
//     (a hostNetwork pod with CAP_NET_RAW speaks as its node) could abort
//     flows between pods of two other nodes.
func TestRev17bICMPErrorsInForged(t *testing.T) {
	d := progWorldDatapath(t)
	peer4 := netip.MustParseAddr("10.70.2.2")
	lb4 := netip.MustParseAddr("198.51.100.50")
	router4 := netip.MustParseAddr("198.51.100.1")
	cip := netip.MustParseAddr("10.96.0.10")
	for _, r := range []Route{
		{NetID: progNet, Prefix: netip.MustParsePrefix("0.0.0.0/0"), Kind: tables.RouteExternal, DstNet: progWorld},
		{NetID: progNet, Prefix: netip.PrefixFrom(cip, 32), Kind: tables.RouteService, DstNet: progNet},
	} {
		if err := d.UpsertRoute(r); err != nil {
			t.Fatal(err)
		}
	}
	be := []tables.Backend{{Addr: peer4, Port: 8080}}
	cluster := Service{VIP: cip, Proto: 17, Port: 80, NetID: progNet, Backends: be}
	if _, err := d.ApplyServices([]Service{cluster,
		{VIP: lb4, Proto: 17, Port: 80, NetID: progNet, Backends: be, Frontend: tables.FrontendLoadBalancer, ClusterIP: cip, ClusterPort: 80},
	}); err != nil {
		t.Fatal(err)
	}
	mine := SID(progLocator, BehaviourL3Decap, progNet, progNet)
	// A pod-to-pod flow, and the pod's flow to the LoadBalancer address.
	underlayVerdict(t, d, srv6(progPeerV6, mine, ipv4(peer4, progPodV4, 17, udp(1000, 7)), true), actRedirect)
	var v uint32
	moved := snatDrops(t, d, func() { v, _ = runPod(t, d, ether(unicastMAC, 0x0800, ipv4(progPodV4, lb4, 17, udp(7777, 80)))) })
	t.Logf("the pod's datagram to the LoadBalancer address: verdict %d, drops %v", v, moved)
	if f := flowOf(t, d, progNet, netip.AddrPortFrom(progPodV4, 7777), netip.AddrPortFrom(lb4, 80)); f == nil {
		t.Fatal("no entry for the pod's flow to the LoadBalancer address")
	}
	pod4 := ipv4(progPodV4, peer4, 17, udp(7, 1000))
	front4 := ipv4(progPodV4, lb4, 17, udp(7777, 80))
	for _, c := range []struct {
		name string
		pkt  []byte
	}{
		{"an outside host's port unreachable about the pod's flow to a LoadBalancer address",
			ether(unicastMAC, 0x0800, ipv4(router4, progPodV4, 1, icmpUnreach(false, front4)))},
		{"an outside host's fragmentation needed about the pod's flow to a LoadBalancer address",
			ether(unicastMAC, 0x0800, ipv4(router4, progPodV4, 1, icmpTooBig(false, 68, front4)))},
		{"the peer node's SRv6 port unreachable from an outside inner source about a pod-to-pod flow",
			srv6(progPeerV6, mine, ipv4(router4, progPodV4, 1, icmpUnreach(false, pod4)), true)},
		{"the peer node's SRv6 fragmentation needed from an outside inner source about a pod-to-pod flow",
			srv6(progPeerV6, mine, ipv4(router4, progPodV4, 1, icmpTooBig(false, 552, pod4)), true)},
	} {
		t.Run(c.name, func(t *testing.T) {
			onlyDrop(t, d, "icmp-error-in-no-flow", func() {
				underlayVerdict(t, d, c.pkt, actShot)
			})
		})
	}
	// The peer's own error about the pod-to-pod flow still arrives.
	onlyDrop(t, d, "", func() {
		underlayVerdict(t, d, srv6(progPeerV6, mine, ipv4(peer4, progPodV4, 1, icmpUnreach(false, pod4)), true), actRedirect)
	})
}

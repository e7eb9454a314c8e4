package datapath

import (
	"net/netip"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/lace-cni/lace/internal/tables"
)

// TestProgLoadBalancing drives bpf/include/lb.h through both programs
// that translate per packet, from_pod (to_service) and from_underlay
// (xlb_in): the one frontend admission (closed, reach of the ClusterIP,
// loadBalancerSourceRanges, an unclassified source, externalTrafficPolicy
// Local for in-cluster and outside clients) and the one endpoint pick
// (ClientIP affinity and its expiry in nanoseconds, and the redraw of a
// pod whose sockets pass the socket hooks). The socket hooks' own calls
// (sock.c) are cgroup programs, which BPF_PROG_RUN does not run: the
// namespace tests TestHostSocketsReachServices, TestPodHairpinSeesItself
// and TestExternalFrontends cover them.
func TestProgLoadBalancing(t *testing.T) {
	d := progPodDatapath(t)
	const world, corp = 100, 101
	epA := netip.AddrPortFrom(netip.MustParseAddr("10.70.1.3"), 8080)
	epB := netip.AddrPortFrom(netip.MustParseAddr("10.70.1.4"), 8080)
	self := netip.AddrPortFrom(progPodV4, 8080)
	cip := netip.MustParseAddr("10.96.0.10")      // endpoint A
	sticky := netip.MustParseAddr("10.96.0.11")   // A and B, ClientIP affinity
	withSelf := netip.MustParseAddr("10.96.0.12") // the client pod itself and A
	// A VIP handed from corp's service to network 7's: lace_services has
	// the new one while the view still routes the VIP to corp's.
	moved := netip.MustParseAddr("10.96.0.13")
	lbVIP := netip.MustParseAddr("192.0.2.100")
	client := netip.MustParseAddr("198.51.100.7")       // world
	outOfRange := netip.MustParseAddr("198.51.100.200") // world, outside the source ranges
	corpClient := netip.MustParseAddr("203.0.113.5")    // corp: reaches no service
	unclassified := netip.MustParseAddr("192.0.2.99")
	mac := []byte{2, 0, 0, 0, 0, 3}
	for _, err := range []error{
		d.UpsertNetwork(Network{ID: world}), d.UpsertNetwork(Network{ID: corp}),
		d.UpsertClassifier(Classifier{NetID: world, Prefix: netip.MustParsePrefix("198.51.100.0/24")}),
		d.UpsertClassifier(Classifier{NetID: corp, Prefix: netip.MustParsePrefix("203.0.113.0/24")}),
		d.UpsertEndpoint(Endpoint{NetID: progNet, Addr: epA.Addr(), IfIndex: 3, PodMAC: mac, HostMAC: mac}),
		d.UpsertEndpoint(Endpoint{NetID: progNet, Addr: epB.Addr(), IfIndex: 4, PodMAC: mac, HostMAC: mac}),
		d.UpsertRoute(Route{NetID: progNet, Prefix: netip.MustParsePrefix("10.70.1.0/24"), Kind: tables.RouteLocal, DstNet: progNet}),
		d.UpsertRoute(Route{NetID: progNet, Prefix: netip.MustParsePrefix("0.0.0.0/0"), Kind: tables.RouteExternal, DstNet: world}),
		d.UpsertRoute(Route{NetID: world, Prefix: netip.MustParsePrefix("0.0.0.0/0"), Kind: tables.RouteExternal, DstNet: world}),
		d.UpsertRoute(Route{NetID: corp, Prefix: netip.MustParsePrefix("0.0.0.0/0"), Kind: tables.RouteExternal, DstNet: world}),
	} {
		if err != nil {
			t.Fatal(err)
		}
	}
	// Network 7 and the world reach the services' ClusterIPs; corp none.
	for _, vip := range []netip.Addr{cip, sticky, withSelf} {
		for _, view := range []uint32{progNet, world} {
			lbMust(t, d.UpsertRoute(Route{NetID: view, Prefix: netip.PrefixFrom(vip, 32), Kind: tables.RouteService, DstNet: progNet}))
		}
	}
	lbMust(t, d.UpsertRoute(Route{NetID: progNet, Prefix: netip.PrefixFrom(moved, 32), Kind: tables.RouteService, DstNet: corp}))
	be := func(ap netip.AddrPort) Backend { return Backend{Addr: ap.Addr(), Port: ap.Port()} }
	svc := func(vip netip.Addr, affinity uint32, eps ...netip.AddrPort) Service {
		s := Service{VIP: vip, Proto: 6, Port: 80, NetID: progNet, AffinitySeconds: affinity}
		for _, ep := range eps {
			s.Backends = append(s.Backends, be(ep))
		}
		return s
	}
	front := func(kind tables.Frontend, at netip.Addr, port uint16, s Service) Service {
		s.VIP, s.Port, s.Frontend, s.ClusterIP, s.ClusterPort = at, port, kind, cip, 80
		return s
	}
	local := front(tables.FrontendNodePort, progNodeV4, 30080, svc(netip.Addr{}, 0, epB)) // Local: B is this node's
	local.Local = true
	closed := front(tables.FrontendNodePort, progNodeV4, 30081, svc(netip.Addr{}, 0, epA))
	closed.Closed = true
	stickyPort := front(tables.FrontendNodePort, progNodeV4, 30082, svc(netip.Addr{}, 60, epA, epB))
	ranged := front(tables.FrontendLoadBalancer, lbVIP, 80, svc(netip.Addr{}, 0, epA))
	ranged.SourceRanges = []netip.Prefix{netip.MustParsePrefix("198.51.100.0/25"), netip.MustParsePrefix("10.70.1.0/24")}
	if _, err := d.ApplyServices([]Service{
		svc(cip, 0, epA), svc(sticky, 60, epA, epB), svc(withSelf, 0, self, epA), svc(moved, 0, epA),
		local, closed, stickyPort, ranged,
	}); err != nil {
		t.Fatal(err)
	}

	sport := uint16(20000)
	fromPod := func(dst netip.Addr, port uint16) (uint32, netip.AddrPort) {
		sport++
		ret, out := runPod(t, d, ether(unicastMAC, 0x0800, ipv4(progPodV4, dst, 6, tcpSYN(sport, port))))
		return ret, pktDst(out)
	}
	fromOutside := func(src, dst netip.Addr, port uint16) (uint32, netip.AddrPort) {
		sport++
		ret, out := runUnderlay(t, d, ether(unicastMAC, 0x0800, ipv4(src, dst, 6, tcpSYN(sport, port))))
		return ret, pktDst(out)
	}

	// Admission.
	refusals := []struct {
		name   string
		run    func() (uint32, netip.AddrPort)
		reason string
	}{
		{"pod to a closed NodePort", func() (uint32, netip.AddrPort) { return fromPod(progNodeV4, 30081) }, "frontend-closed"},
		{"outside to a closed NodePort", func() (uint32, netip.AddrPort) { return fromOutside(client, progNodeV4, 30081) }, "frontend-closed"},
		{"unclassified source to a closed NodePort: closed first", func() (uint32, netip.AddrPort) { return fromOutside(unclassified, progNodeV4, 30081) }, "frontend-closed"},
		{"unclassified source to a NodePort", func() (uint32, netip.AddrPort) { return fromOutside(unclassified, progNodeV4, 30080) }, "unclassified-source"},
		{"outside network that does not reach the ClusterIP", func() (uint32, netip.AddrPort) { return fromOutside(corpClient, progNodeV4, 30080) }, "isolated"},
		{"outside source outside the source ranges", func() (uint32, netip.AddrPort) { return fromOutside(outOfRange, lbVIP, 80) }, "source-range"},
		{"pod to a ClusterIP its view routes to another network's service", func() (uint32, netip.AddrPort) { return fromPod(moved, 80) }, "isolated"},
	}
	for _, c := range refusals {
		t.Run(c.name, func(t *testing.T) {
			onlyDrop(t, d, c.reason, func() {
				if ret, _ := c.run(); ret != actShot {
					t.Errorf("verdict %d, want a drop", ret)
				}
			})
		})
	}
	admitted := []struct {
		name string
		run  func() (uint32, netip.AddrPort)
		want netip.AddrPort
	}{
		// Local: the pod is an in-cluster client, served by the
		// ClusterIP's endpoint (A); the outside client by the frontend's
		// own, this node's (B).
		{"pod to a Local NodePort: the ClusterIP's endpoint", func() (uint32, netip.AddrPort) { return fromPod(progNodeV4, 30080) }, epA},
		{"outside to a Local NodePort: the frontend's endpoint", func() (uint32, netip.AddrPort) { return fromOutside(client, progNodeV4, 30080) }, epB},
		{"outside source in the source ranges", func() (uint32, netip.AddrPort) { return fromOutside(client, lbVIP, 80) }, epA},
		{"pod in the source ranges", func() (uint32, netip.AddrPort) { return fromPod(lbVIP, 80) }, epA},
		{"pod to a ClusterIP", func() (uint32, netip.AddrPort) { return fromPod(cip, 80) }, epA},
	}
	for _, c := range admitted {
		t.Run(c.name, func(t *testing.T) {
			onlyDrop(t, d, "", func() {
				if ret, dst := c.run(); ret != actRedirect || dst != c.want {
					t.Errorf("verdict %d to %s, want redirected to %s", ret, dst, c.want)
				}
			})
		})
	}

	// The pick: ClientIP affinity holds every new flow of a client on
	// one endpoint, in both programs, and its entry expires the
	// service's seconds from now (bpf_ktime_get_ns: CLOCK_MONOTONIC).
	t.Run("affinity", func(t *testing.T) {
		// left is how long the affinity entry of client c has to live.
		left := func(c netip.Addr) time.Duration {
			var ts unix.Timespec
			lbMust(t, unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts))
			var k podAffinityKey
			var v podAffinityVal
			it := d.pod.LaceAffinity.Iterate()
			for it.Next(&k, &v) {
				if netip.AddrFrom4([4]byte(k.Client[:4])) == c {
					return time.Duration(int64(v.Expires) - ts.Nano())
				}
			}
			lbMust(t, it.Err())
			t.Fatalf("no affinity entry for %s", c)
			return 0
		}
		for _, c := range []struct {
			name   string
			client netip.Addr
			run    func() (uint32, netip.AddrPort)
		}{
			{"pod to a ClusterIP", progPodV4, func() (uint32, netip.AddrPort) { return fromPod(sticky, 80) }},
			{"outside to a NodePort", client, func() (uint32, netip.AddrPort) { return fromOutside(client, progNodeV4, 30082) }},
		} {
			seen := map[netip.AddrPort]int{}
			for i := range 16 {
				ret, dst := c.run()
				if ret != actRedirect {
					t.Fatalf("%s: verdict %d, want redirected", c.name, ret)
				}
				seen[dst]++
				// Written by the first flow, renewed by the others: the
				// service's 60 seconds from now each time.
				if l := left(c.client); l > 60*time.Second || l < 55*time.Second {
					t.Errorf("%s: after flow %d the affinity expires in %v, want about 60s", c.name, i, l)
				}
			}
			if len(seen) != 1 {
				t.Errorf("%s: 16 new flows went to %v, want one endpoint (affinity)", c.name, seen)
			}
		}
	})

	// A pod whose sockets pass the socket hooks had its chance at itself
	// at connect time (pod_hairpin): per packet, a draw of itself is drawn
	// again among the others. Without the hooks it hairpins per packet.
	t.Run("redraw of the pod itself", func(t *testing.T) {
		draw := func() map[netip.AddrPort]int {
			seen := map[netip.AddrPort]int{}
			for range 24 {
				ret, dst := fromPod(withSelf, 80)
				if ret != actRedirect {
					t.Fatalf("verdict %d, want redirected", ret)
				}
				seen[dst]++
			}
			return seen
		}
		if seen := draw(); seen[self] == 0 || seen[epA] == 0 {
			t.Errorf("without the socket hooks, 24 flows went to %v, want both the pod itself and %s", seen, epA)
		}
		lbMust(t, d.UpsertPort(Port{IfIndex: progPort, NetID: progNet, V4: progPodV4, V6: progPodV6, NetNSCookie: 4711}))
		if seen := draw(); seen[epA] != 24 {
			t.Errorf("with the socket hooks, 24 flows went to %v, want all to %s", seen, epA)
		}
	})
}

func lbMust(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

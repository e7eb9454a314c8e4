package datapath_test

import (
	"net/netip"
	"strings"
	"testing"

	"github.com/lace-cni/lace/internal/datapath"
	"github.com/lace-cni/lace/internal/netutil"
	"github.com/lace-cni/lace/internal/tables"
)

// whoami serves TCP port 8 in p's namespace on both its addresses,
// answering "<name> <client address>".
func whoami(t *testing.T, p *pod) {
	for _, a := range []netip.Addr{p.v4, p.v6} {
		serveClientAddr(t, p.ns, netip.AddrPortFrom(a, 8), p.name+" ")
	}
}

// nodeContext wires the nodes' own context (tables.NodeNetID) as the
// model does: every node knows it, and its view holds the other nodes'
// addresses at their locators.
func (w *world) nodeContext() {
	for _, n := range w.nodes {
		must(w.t, n.dp.UpsertNetwork(datapath.Network{ID: tables.NodeNetID}))
		for _, o := range w.nodes {
			if o == n {
				continue
			}
			for _, a := range []netip.Addr{o.v4, o.v6} {
				must(w.t, n.dp.UpsertRoute(datapath.Route{NetID: tables.NodeNetID, Prefix: netip.PrefixFrom(a, a.BitLen()),
					Kind: tables.RouteRemote, DstNet: tables.NodeNetID,
					SID: datapath.SID(o.locator, datapath.BehaviourL3Decap, tables.NodeNetID, tables.NodeNetID)}))
			}
		}
	}
}

func frontend(kind tables.Frontend, addr netip.Addr, port uint16, cluster datapath.Service, local bool, backends ...datapath.Backend) datapath.Service {
	return datapath.Service{VIP: addr, Proto: cluster.Proto, Port: port, NetID: cluster.NetID, Backends: backends,
		Frontend: kind, ClusterIP: cluster.VIP, ClusterPort: cluster.Port, Local: local}
}

// TestExternalFrontends drives an outside host, pods and the node's view
// through NodePorts, a LoadBalancer address and their policies:
//   - externalTrafficPolicy Cluster: every node answers on both families,
//     whichever endpoint the flow lands on; an endpoint on the node keeps
//     the client's address, one on another node sees the entry node's, and
//     its answers come back through it (a connected UDP socket would
//     refuse any other source);
//   - Local: the client's address is kept; a node without a local
//     endpoint drops (no-local-endpoints);
//   - a NodePort closed on a node address drops (frontend-closed); a
//     source whose external network does not reach the service's ClusterIP
//     is refused (isolated); loadBalancerSourceRanges (source-range);
//   - a pod reaches a NodePort of its node and a LoadBalancer address,
//     with the Local service's in-cluster endpoints all eligible.
func TestExternalFrontends(t *testing.T) {
	w := newWorld(t, 2)
	n1, n2 := w.nodes[0], w.nodes[1]
	for _, n := range w.nodes {
		must(t, netutil.Sysctl(netutil.Path(n.ns), "net.ipv4.ip_forward", "1"))
	}
	w.addNetwork(7, "10.70.0.0/16", "fd00:70::/48", false)
	w.addNetwork(8, "10.80.0.0/16", "fd00:80::/48", false)
	w.nodeContext()
	a := w.addPod("a", n1, 7, 2)
	b := w.addPod("b", n2, 7, 2)
	c := w.addPod("c", n1, 7, 3)
	x := w.addPod("x", n2, 8, 2)
	for _, p := range []*pod{b, c, x} {
		whoami(t, p)
	}
	ext := w.addExternalHost(n1)
	world4, world6 := netip.MustParsePrefix("172.31.0.0/24"), netip.MustParsePrefix("fd00:99::/64")
	w.addExternal(100, world4, world6)
	w.grantExternal(7, 100, world4, world6)
	lb4 := netip.MustParseAddr("172.31.1.10")
	must(t, netutil.EnsureRoute(netutil.Path(ext.ns), netip.PrefixFrom(lb4, 32), n1.v4, "eth0"))

	web4 := tcpSvc("10.96.0.10", 8, 7, be8(b.v4), be8(c.v4))
	web6 := tcpSvc("fd00:96::10", 8, 7, be8(b.v6), be8(c.v6))
	dns4 := udpSvc("10.96.0.10", 7, 7, be(b.v4))
	loc4 := tcpSvc("10.96.0.20", 8, 7, be8(b.v4), be8(c.v4))
	iso4 := tcpSvc("10.96.0.30", 8, 8, be8(x.v4))
	clusterIPs := []datapath.Service{web4, web6, dns4, loc4, iso4}
	// The ClusterIPs are in the views of their networks and (but iso4's)
	// of the outside's: the policy world -> 7.
	for _, n := range w.nodes {
		for _, s := range clusterIPs {
			views := []uint32{s.NetID}
			if s.NetID == 7 {
				views = append(views, 100)
			}
			for _, v := range views {
				must(t, n.dp.UpsertRoute(datapath.Route{NetID: v, Prefix: netip.PrefixFrom(s.VIP, s.VIP.BitLen()),
					Kind: tables.RouteService, DstNet: s.NetID}))
			}
		}
	}
	lb := frontend(tables.FrontendLoadBalancer, lb4, 8, web4, false, web4.Backends...)
	lb.SourceRanges = []netip.Prefix{netip.MustParsePrefix("172.31.0.200/32")}
	apply := func(lbRanges []netip.Prefix) {
		for _, n := range w.nodes {
			local := []datapath.Backend{be8(c.v4)}
			if n == n2 {
				local = []datapath.Backend{be8(b.v4)}
			}
			svcs := append([]datapath.Service(nil), clusterIPs...)
			svcs = append(svcs,
				frontend(tables.FrontendNodePort, n.v4, 30080, web4, false, web4.Backends...),
				frontend(tables.FrontendNodePort, n.v6, 30080, web6, false, web6.Backends...),
				frontend(tables.FrontendNodePort, n.v4, 30080, dns4, false, dns4.Backends...),
				frontend(tables.FrontendNodePort, n.v4, 30081, loc4, true, local...),
				frontend(tables.FrontendNodePort, n.v4, 30083, iso4, false, iso4.Backends...))
			closed := frontend(tables.FrontendNodePort, n.v4, 30084, web4, false, web4.Backends...)
			closed.Closed = true
			none := frontend(tables.FrontendNodePort, n.v4, 30082, loc4, true)
			none.Drop = true
			l := lb
			l.SourceRanges = lbRanges
			svcs = append(svcs, closed, none, l)
			_, err := n.dp.ApplyServices(svcs)
			must(t, err)
		}
	}
	apply(lb.SourceRanges)

	// Cluster: every node, both families; endpoints here keep the
	// client's address, those elsewhere see the entry node's.
	for _, n := range w.nodes {
		for _, addr := range []netip.Addr{n.v4, n.v6} {
			seen := map[string]bool{}
			for range 16 {
				got, err := dialPort(ext, addr, 30080)
				if err != nil {
					d1, _ := n1.dp.Drops()
					d2, _ := n2.dp.Drops()
					t.Fatalf("ext -> NodePort %s:30080: %v\n%v\n%v", addr, err, nz(d1), nz(d2))
				}
				seen[got] = true
			}
			var wantB, wantC string
			if n == n1 {
				wantB, wantC = "b "+n1.addr(addr).String(), "c "+ext.addr(addr).String()
			} else {
				wantB, wantC = "b "+ext.addr(addr).String(), "c "+n2.addr(addr).String()
			}
			if len(seen) != 2 || !seen[wantB] || !seen[wantC] {
				t.Errorf("ext -> NodePort %s:30080 over 16 connections: %v, want %q and %q", addr, keys(seen), wantB, wantC)
			}
		}
		// UDP, on a connected socket: the answer must come from the
		// NodePort.
		if got, err := dialUDPPort(ext, netip.AddrPortFrom(n.v4, 30080)); err != nil || got != "b" {
			t.Errorf("UDP ext -> NodePort %s:30080: %q %v, want b answering from the NodePort", n.v4, got, err)
		}
	}

	// Local keeps the client's address.
	for _, tc := range []struct {
		n    *node
		want string
	}{{n1, "c " + ext.v4.String()}, {n2, "b " + ext.v4.String()}} {
		for range 4 {
			if got, err := dialPort(ext, tc.n.v4, 30081); err != nil || got != tc.want {
				t.Errorf("ext -> Local NodePort %s:30081: %q %v, want %q", tc.n.v4, got, err, tc.want)
			}
		}
	}
	expectDropped(t, n1, "no-local-endpoints", "ext -> Local NodePort without a local endpoint", func() error { _, err := dialPort(ext, n1.v4, 30082); return err })
	expectDropped(t, n1, "frontend-closed", "ext -> closed NodePort", func() error { _, err := dialPort(ext, n1.v4, 30084); return err })
	expectDropped(t, n2, "isolated", "ext -> NodePort of a network the outside does not reach", func() error { _, err := dialPort(ext, n2.v4, 30083); return err })

	// LoadBalancer with source ranges.
	if got, err := dialPort(ext, lb4, 8); err != nil || !strings.HasSuffix(got, " "+ext.v4.String()) && !strings.HasSuffix(got, " "+n1.v4.String()) {
		t.Errorf("ext -> LoadBalancer %s:8 from an admitted source: %q %v", lb4, got, err)
	}
	apply([]netip.Prefix{netip.MustParsePrefix("10.0.0.0/8")})
	w.grantExternal(7, 100, netip.MustParsePrefix("172.31.1.0/24"))
	expectDropped(t, n1, "source-range", "ext -> LoadBalancer from outside its source ranges", func() error { _, err := dialPort(ext, lb4, 8); return err })
	// Source ranges hold for pods too (as kube-proxy's firewall does).
	apply(lb.SourceRanges)
	expectDropped(t, n1, "source-range", "pod a -> LoadBalancer from outside its source ranges", func() error {
		_, err := dialPort(a, lb4, 8)
		return err
	})
	apply(nil)

	// Pods: a NodePort of their node, the LoadBalancer address (an
	// outside address the view reaches), and a Local service's frontend
	// with every endpoint eligible.
	lbNet := netip.MustParsePrefix("172.31.1.0/24")
	w.grantExternal(7, 100, lbNet)
	for _, dst := range []netip.AddrPort{netip.AddrPortFrom(n1.v4, 30080), netip.AddrPortFrom(n1.v6, 30080), netip.AddrPortFrom(lb4, 8)} {
		if got, err := dialPort(a, dst.Addr(), dst.Port()); err != nil || !(strings.HasPrefix(got, "b ") || strings.HasPrefix(got, "c ")) {
			t.Errorf("pod a -> %s: %q %v", dst, got, err)
		}
	}
	seen := map[string]bool{}
	for range 16 {
		got, err := dialPort(a, n1.v4, 30081)
		if err != nil {
			t.Fatalf("pod a -> Local NodePort %s:30081: %v", n1.v4, err)
		}
		seen[strings.Fields(got)[0]] = true
	}
	if !seen["b"] || !seen["c"] {
		t.Errorf("pod a -> Local NodePort over 16 connections reached %v, want b (another node's) and c", keys(seen))
	}
	// x's network does not reach web's ClusterIP: nor its frontend.
	w.grantExternal(8, 100, lbNet)
	expectDropped(t, n2, "isolated", "pod x (network 8) -> LoadBalancer of network 7", func() error { _, err := dialPort(x, lb4, 8); return err })
}

func be8(a netip.Addr) datapath.Backend { return datapath.Backend{Addr: a, Port: 8} }

// addr is p's address of a's family.
func (p *pod) addr(a netip.Addr) netip.Addr {
	if a.Is4() {
		return p.v4
	}
	return p.v6
}

func (n *node) addr(a netip.Addr) netip.Addr {
	if a.Is4() {
		return n.v4
	}
	return n.v6
}

func keys(m map[string]bool) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	return out
}

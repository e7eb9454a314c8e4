package agent

import (
	"net/netip"

	"github.com/lace-cni/lace/internal/datapath"
	"github.com/lace-cni/lace/internal/netutil"
	"github.com/lace-cni/lace/internal/podnet"
)

// linuxNode is the node's network namespace as the agent's parts see it
// (cni.Kernel, nodesync.Kernel, status.Kernel); tests use fakes.
type linuxNode struct {
	ns       string // path of the node's network namespace
	underlay string // name of the underlay interface
	// neigh keeps the next hops of Lace's underlay routes resolved.
	neigh *netutil.NeighKeeper
	// kept is the node namespace's netlink handle for what every sync
	// asks (its addresses, the underlay link, the owned routes): opening
	// one per call cost a setns and a socket per netlink family.
	kept *netutil.KeptNS
	// routes keeps the last listing of the owned routes while the
	// namespace's route and link events say nothing changed them.
	routes *netutil.OwnedRouteCache
}

func (n linuxNode) UnderlayAddrs() (addrs []netip.Addr, err error) {
	err = n.kept.Do(func(ns *netutil.NS) error {
		addrs, err = ns.GlobalAddrs(n.underlay)
		return err
	})
	return addrs, err
}

func (n linuxNode) underlayLink() (l netutil.LinkInfo, err error) {
	err = n.kept.Do(func(ns *netutil.NS) error {
		l, _, err = ns.Link(n.underlay)
		return err
	})
	return l, err
}

func (n linuxNode) UnderlayIndex() (int, error) {
	l, err := n.underlayLink()
	return l.Index, err
}

func (n linuxNode) UnderlayMTU() (int, error) {
	l, err := n.underlayLink()
	return l.MTU, err
}

// Reachable asks the node's routing table for dst: a route must exist
// and leave through the underlay interface with a source address of
// dst's family (an IPv6 route without any IPv6 address on the node has
// none).
func (n linuxNode) Reachable(dst netip.Addr) error { return netutil.RouteOut(n.ns, dst, n.underlay) }

// EnableForwarding turns forwarding on: fib lookups answer FWD_DISABLED
// without it.
func (n linuxNode) NetNSCookie() (uint64, error) { return datapath.NetNSCookie(n.ns) }

func (n linuxNode) PodNetNSCookie(nsPath string) (uint64, error) { return datapath.NetNSCookie(nsPath) }

func (n linuxNode) EnableForwarding() error {
	for _, kv := range [][2]string{{"net.ipv4.ip_forward", "1"}, {"net.ipv6.conf.all.forwarding", "1"}} {
		if err := netutil.Sysctl(n.ns, kv[0], kv[1]); err != nil {
			return err
		}
	}
	return nil
}

func (n linuxNode) OwnedRoutes() (map[netip.Prefix]netip.Addr, error) {
	return n.routes.Get(func() (routes map[netip.Prefix]netip.Addr, err error) {
		err = n.kept.Do(func(ns *netutil.NS) error {
			routes, err = ns.OwnedRoutes()
			return err
		})
		return routes, err
	})
}

func (n linuxNode) ReplaceOwnedRoute(dst netip.Prefix, via netip.Addr) error {
	defer n.routes.Changed()
	return n.kept.Do(func(ns *netutil.NS) error { return ns.ReplaceOwnedRoute(dst, via, n.underlay) })
}

func (n linuxNode) KeepResolved(hops []netip.Addr) error {
	return n.kept.Do(func(ns *netutil.NS) error { return n.neigh.Keep(ns, n.underlay, hops) })
}

func (n linuxNode) DeleteRoute(dst netip.Prefix) error {
	defer n.routes.Changed()
	return netutil.DeleteRoute(n.ns, dst, "")
}

func (n linuxNode) SetupPod(s podnet.Spec) (podnet.Result, error) { return podnet.Setup(s) }

func (n linuxNode) TeardownPod(hostIf string, addrs []netip.Addr) error {
	return podnet.Teardown(n.ns, hostIf, addrs)
}

func (n linuxNode) HostLinks() (map[string]podnet.Link, error) {
	return podnet.HostLinks(n.ns, datapath.PodIfPrefix)
}

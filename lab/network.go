package lab

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"strings"

	"github.com/vishvananda/netlink"

	"github.com/lace-cni/lace/internal/netutil"
)

// fabricBridge joins every host of the lab on one L2 segment.
const fabricBridge = "br0"

// setupNetwork creates the fabric, node and external namespaces and wires
// them. It is idempotent.
func setupNetwork(c Config) error {
	fabric := c.NetNS("fabric")
	if err := netutil.CreateNamed(fabric); err != nil {
		return err
	}
	if err := netutil.EnsureBridge(netutil.Path(fabric), fabricBridge); err != nil {
		return err
	}
	// The fabric namespace is also where the control plane sits on the
	// fabric: the API server's relay listens on these addresses and the
	// API server's connections to kubelets leave from here.
	av4, av6 := APIServerAddrs()
	for _, a := range []netip.Prefix{netip.PrefixFrom(av4, UnderlayV4.Bits()), netip.PrefixFrom(av6, UnderlayV6.Bits())} {
		if err := netutil.EnsureAddr(netutil.Path(fabric), fabricBridge, a); err != nil {
			return fmt.Errorf("fabric address: %w", err)
		}
	}
	for i := 1; i <= c.Nodes; i++ {
		if err := setupNode(c, i, nil); err != nil {
			return err
		}
	}
	v4, v6 := ExternalUnderlay()
	if err := attachHost(c, c.NetNS("external"), "ext", v4, v6, nil); err != nil {
		return fmt.Errorf("external host: %w", err)
	}
	return setupExternalRouting(c)
}

// attachHost creates namespace ns (when missing) and plugs it into the
// fabric bridge as eth0 (with MAC mac, when given), its end on the bridge
// named fabricEnd, with the host's fabric addresses.
func attachHost(c Config, ns, fabricEnd string, v4, v6 netip.Addr, mac net.HardwareAddr) error {
	if err := netutil.CreateNamed(ns); err != nil {
		return err
	}
	if err := netutil.EnsureVeth(netutil.VethSpec{
		NSPath: netutil.Path(c.NetNS("fabric")), Name: fabricEnd, Master: fabricBridge,
		PeerNSPath: netutil.Path(ns), PeerName: "eth0", PeerMAC: mac,
	}); err != nil {
		return err
	}
	for _, a := range []netip.Prefix{netip.PrefixFrom(v4, UnderlayV4.Bits()), netip.PrefixFrom(v6, UnderlayV6.Bits())} {
		if err := netutil.EnsureAddr(netutil.Path(ns), "eth0", a); err != nil {
			return err
		}
	}
	return nil
}

// setupNode makes node i's network namespace as a host booting on the
// fabric has it: its port on the fabric, forwarding on, and a route to
// the external host's served prefix (setupExternalRouting). It is
// idempotent, and all a rebooted node gets before its kubelet starts (with
// its NIC's MAC, mac).
func setupNode(c Config, i int, mac net.HardwareAddr) error {
	name := c.NodeName(i)
	v4, v6 := NodeUnderlay(i)
	ns := c.NetNS(name)
	if err := attachHost(c, ns, name, v4, v6, mac); err != nil {
		return fmt.Errorf("node %s: %w", name, err)
	}
	for _, kv := range [][2]string{
		{"net.ipv4.ip_forward", "1"},
		{"net.ipv6.conf.all.forwarding", "1"},
	} {
		if err := netutil.Sysctl(netutil.Path(ns), kv[0], kv[1]); err != nil {
			return fmt.Errorf("node %s: %w", name, err)
		}
	}
	extV4, extV6 := ExternalUnderlay()
	for _, r := range []struct {
		dst netip.Prefix
		gw  netip.Addr
	}{{ExternalServedV4, extV4}, {ExternalServedV6, extV6}} {
		if err := netutil.EnsureRoute(netutil.Path(ns), r.dst, r.gw, "eth0"); err != nil {
			return fmt.Errorf("node %s: route to the external host's served prefix: %w", name, err)
		}
	}
	return nil
}

// setupExternalRouting makes the external host a site beyond the fabric
// and a router toward the cluster (docs/external-networks.md, "Pods
// reaching the outside"). It is idempotent: every address and route is replaced.
//
//   - The external host holds ExternalServedAddrs as host addresses (/32,
//     /128) on its fabric interface: it answers for them and may send from
//     them, and nothing else of the served prefixes becomes on-link there.
//   - Every node routes ExternalServedV4/V6 via the external host's fabric
//     address, as a node routes a site behind a router: the node's host
//     stack and the data plane's FIB lookups (bpf_fib_lookup in the node
//     namespace) resolve the served prefixes to the external host, which is
//     also where replies to a served address must go.
//   - The external host routes PodRoutesViaNodes over every node with equal
//     cost, as a fabric router with routes to the cluster would: outside
//     traffic to a pod network may enter at any node, which must deliver it
//     (encapsulating it to the pod's node if needed), so the lab exercises
//     that path rather than only the owner node's.
func setupExternalRouting(c Config) error {
	ext := netutil.Path(c.NetNS("external"))
	extV4, extV6 := ExternalUnderlay()
	servedV4, servedV6 := ExternalServedAddrs()
	for _, a := range []netip.Addr{servedV4, servedV6} {
		if err := netutil.EnsureAddr(ext, "eth0", netip.PrefixFrom(a, a.BitLen())); err != nil {
			return fmt.Errorf("external host: served address: %w", err)
		}
	}
	var gwV4, gwV6 []netip.Addr
	for i := 1; i <= c.Nodes; i++ {
		v4, v6 := NodeUnderlay(i)
		gwV4, gwV6 = append(gwV4, v4), append(gwV6, v6)
	}
	// Hash flows over the next hops by ports too (L4), as fabric routers
	// commonly do: with the kernel's default (addresses only) every
	// connection between two addresses would enter at the same node, and
	// the path through a node that does not host the pod would go unused.
	for _, key := range []string{"net.ipv4.fib_multipath_hash_policy", "net.ipv6.fib_multipath_hash_policy"} {
		if err := netutil.Sysctl(ext, key, "1"); err != nil {
			return fmt.Errorf("external host: %w", err)
		}
	}
	for _, p := range PodRoutesViaNodes {
		// The fabric address is the preferred source: a plain connection
		// from the external host comes from its fabric address (world),
		// and only a socket bound to a served address speaks for the
		// served site.
		gws, src := gwV4, extV4
		if p.Addr().Is6() {
			gws, src = gwV6, extV6
		}
		if err := replaceMultipathRoute(ext, "eth0", p, src, gws); err != nil {
			return fmt.Errorf("external host: %w", err)
		}
	}
	return nil
}

// replaceMultipathRoute installs dst out of link in the namespace at nsPath
// with one equal-cost next hop per gateway and src as the preferred source,
// replacing any route to dst. netutil has no multipath helper, and only the
// lab needs one.
func replaceMultipathRoute(nsPath, link string, dst netip.Prefix, src netip.Addr, gws []netip.Addr) error {
	if len(gws) == 0 {
		return fmt.Errorf("route %s: no next hop", dst)
	}
	h, err := netutil.Handle(nsPath)
	if err != nil {
		return err
	}
	defer h.Close()
	l, err := h.LinkByName(link)
	if err != nil {
		return fmt.Errorf("route %s: find %s: %w", dst, link, err)
	}
	r := &netlink.Route{
		Dst:       &net.IPNet{IP: dst.Addr().AsSlice(), Mask: net.CIDRMask(dst.Bits(), dst.Addr().BitLen())},
		Src:       src.AsSlice(),
		LinkIndex: l.Attrs().Index,
	}
	if len(gws) == 1 {
		r.Gw = gws[0].AsSlice()
	} else {
		r.LinkIndex = 0
		for _, gw := range gws {
			r.MultiPath = append(r.MultiPath, &netlink.NexthopInfo{LinkIndex: l.Attrs().Index, Gw: gw.AsSlice()})
		}
	}
	if err := h.RouteReplace(r); err != nil {
		return fmt.Errorf("route %s via %v out of %s: %w", dst, gws, link, err)
	}
	return nil
}

// labNamespaces lists the namespaces of lab name that exist.
func labNamespaces(name string) ([]string, error) {
	all, err := netutil.ListNamed(name + "-")
	if err != nil {
		return nil, err
	}
	var out []string
	for _, ns := range all {
		if isLabNetNS(name, ns) {
			out = append(out, ns)
		}
	}
	return out, nil
}

// isLabNetNS tells whether ns is one of the names a lab called name gives
// its namespaces, so that cleanup never removes someone else's namespace.
func isLabNetNS(name, ns string) bool {
	role, ok := strings.CutPrefix(ns, name+"-")
	if !ok {
		return false
	}
	switch {
	case role == "fabric" || role == "external":
		return true
	case strings.HasPrefix(role, "n"):
		for _, r := range role[1:] {
			if r < '0' || r > '9' {
				return false
			}
		}
		return len(role) > 1
	}
	return false
}

// teardownNetwork removes every namespace of the lab.
func teardownNetwork(name string) error {
	nss, err := labNamespaces(name)
	if err != nil {
		return err
	}
	var errs []error
	for _, ns := range nss {
		errs = append(errs, netutil.DeleteNamed(ns))
	}
	return errors.Join(errs...)
}

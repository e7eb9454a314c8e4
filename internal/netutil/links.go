package netutil

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"sort"
	"strings"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

// EnsureBridge creates bridge name (up) in the namespace at nsPath.
// An existing bridge is kept.
func EnsureBridge(nsPath, name string) error {
	h, err := Handle(nsPath)
	if err != nil {
		return err
	}
	defer h.Close()
	if _, err := h.LinkByName(name); err == nil {
		return nil
	}
	br := &netlink.Bridge{LinkAttrs: netlink.LinkAttrs{Name: name}}
	if err := h.LinkAdd(br); err != nil && !errors.Is(err, unix.EEXIST) {
		return fmt.Errorf("add bridge %s: %w", name, err)
	}
	if err := h.LinkSetUp(br); err != nil {
		return fmt.Errorf("set %s up: %w", name, err)
	}
	return nil
}

// VethSpec is one veth pair between two namespaces.
type VethSpec struct {
	// NSPath and Name are the first end (created there).
	NSPath, Name string
	// PeerNSPath and PeerName are the second end.
	PeerNSPath, PeerName string
	// Master, when set, is a bridge in NSPath the first end joins.
	Master string
	// MTU of both ends (0 keeps the default).
	MTU int
	// MAC and PeerMAC, when set, are the MACs of the first and second end.
	MAC, PeerMAC net.HardwareAddr
}

// EnsureVeth creates the pair (both ends up) unless the first end exists.
func EnsureVeth(s VethSpec) error {
	h, err := Handle(s.NSPath)
	if err != nil {
		return err
	}
	defer h.Close()
	if _, err := h.LinkByName(s.Name); err == nil {
		return nil
	}
	peerNS, err := netns.GetFromPath(s.PeerNSPath)
	if err != nil {
		return fmt.Errorf("open netns %s: %w", s.PeerNSPath, err)
	}
	defer peerNS.Close()
	veth := &netlink.Veth{
		LinkAttrs:     netlink.LinkAttrs{Name: s.Name, MTU: s.MTU, HardwareAddr: s.MAC},
		PeerName:      s.PeerName,
		PeerNamespace: netlink.NsFd(peerNS),
	}
	if s.PeerMAC != nil {
		veth.PeerHardwareAddr = s.PeerMAC
	}
	if err := h.LinkAdd(veth); err != nil {
		return fmt.Errorf("add veth %s/%s: %w", s.Name, s.PeerName, err)
	}
	link, err := h.LinkByName(s.Name)
	if err != nil {
		return fmt.Errorf("find %s: %w", s.Name, err)
	}
	if s.Master != "" {
		br, err := h.LinkByName(s.Master)
		if err != nil {
			return fmt.Errorf("find bridge %s: %w", s.Master, err)
		}
		if err := h.LinkSetMaster(link, br); err != nil {
			return fmt.Errorf("attach %s to %s: %w", s.Name, s.Master, err)
		}
	}
	if err := h.LinkSetUp(link); err != nil {
		return fmt.Errorf("set %s up: %w", s.Name, err)
	}
	ph, err := Handle(s.PeerNSPath)
	if err != nil {
		return err
	}
	defer ph.Close()
	peer, err := ph.LinkByName(s.PeerName)
	if err != nil {
		return fmt.Errorf("find %s: %w", s.PeerName, err)
	}
	if s.MTU > 0 {
		if err := ph.LinkSetMTU(peer, s.MTU); err != nil {
			return fmt.Errorf("set %s mtu: %w", s.PeerName, err)
		}
	}
	if err := ph.LinkSetUp(peer); err != nil {
		return fmt.Errorf("set %s up: %w", s.PeerName, err)
	}
	return nil
}

// EnsureAddr adds prefix (an address with its prefix length) to link in the
// namespace at nsPath. IPv6 addresses skip duplicate address detection: Lace
// assigns them uniquely and waiting for DAD only slows everything down.
func EnsureAddr(nsPath, link string, prefix netip.Prefix) error {
	return withLink(nsPath, link, func(n *NS, l netlink.Link) error { return n.ReplaceAddr(l, prefix) })
}

// EnsureRoute installs dst via gw (a device route when gw is invalid) out
// of link in the namespace at nsPath, replacing a route to the same
// destination.
func EnsureRoute(nsPath string, dst netip.Prefix, gw netip.Addr, link string) error {
	return withLink(nsPath, link, func(n *NS, l netlink.Link) error { return n.ReplaceRoute(l, dst, gw) })
}

// SetMTU sets the MTU of link in the namespace at nsPath.
func SetMTU(nsPath, link string, mtu int) error {
	return withLink(nsPath, link, func(n *NS, l netlink.Link) error {
		if err := n.h.LinkSetMTU(l, mtu); err != nil {
			return fmt.Errorf("set MTU of %s to %d: %w", link, mtu, err)
		}
		return nil
	})
}

// withLink runs f with a handle in the namespace at nsPath and the link.
func withLink(nsPath, link string, f func(*NS, netlink.Link) error) error {
	n, err := OpenNS(nsPath)
	if err != nil {
		return err
	}
	defer n.Close()
	_, l, err := n.Link(link)
	if err != nil {
		return err
	}
	return f(n, l)
}

// LinkInfo is what callers need to know of a link.
type LinkInfo struct {
	Name  string
	Index int
	MAC   net.HardwareAddr
	MTU   int
}

func linkInfo(l netlink.Link) LinkInfo {
	at := l.Attrs()
	return LinkInfo{Name: at.Name, Index: at.Index, MAC: at.HardwareAddr, MTU: at.MTU}
}

// GetLink returns the index, MAC and MTU of link name in the namespace at
// nsPath.
func GetLink(nsPath, name string) (LinkInfo, error) {
	n, err := OpenNS(nsPath)
	if err != nil {
		return LinkInfo{}, err
	}
	defer n.Close()
	info, _, err := n.Link(name)
	return info, err
}

// DeleteLink removes link name from the namespace at nsPath. A missing
// link (or namespace) is success.
func DeleteLink(nsPath, name string) error {
	h, err := Handle(nsPath)
	if err != nil {
		if errors.Is(err, unix.ENOENT) {
			return nil
		}
		return err
	}
	defer h.Close()
	l, err := h.LinkByName(name)
	if err != nil {
		var nf netlink.LinkNotFoundError
		if errors.As(err, &nf) {
			return nil
		}
		return fmt.Errorf("find %s: %w", name, err)
	}
	if err := h.LinkDel(l); err != nil && !errors.Is(err, unix.ENODEV) {
		return fmt.Errorf("delete %s: %w", name, err)
	}
	return nil
}

// DeleteRoute removes the route to dst out of link; a missing route is fine.
func DeleteRoute(nsPath string, dst netip.Prefix, link string) error {
	h, err := Handle(nsPath)
	if err != nil {
		return err
	}
	defer h.Close()
	r := &netlink.Route{Dst: &net.IPNet{IP: dst.Addr().AsSlice(), Mask: net.CIDRMask(dst.Bits(), dst.Addr().BitLen())}}
	if link != "" {
		if l, err := h.LinkByName(link); err == nil {
			r.LinkIndex = l.Attrs().Index
		}
	}
	if err := h.RouteDel(r); err != nil && !errors.Is(err, unix.ESRCH) && !errors.Is(err, unix.ENOENT) {
		return fmt.Errorf("delete route %s: %w", dst, err)
	}
	return nil
}

// GlobalAddrs returns the global unicast addresses of link.
func GlobalAddrs(nsPath, link string) ([]netip.Addr, error) {
	n, err := OpenNS(nsPath)
	if err != nil {
		return nil, err
	}
	defer n.Close()
	return n.GlobalAddrs(link)
}

// GlobalAddrs returns the global unicast addresses of link.
func (n *NS) GlobalAddrs(link string) ([]netip.Addr, error) {
	h := n.h
	l, err := h.LinkByName(link)
	if err != nil {
		return nil, fmt.Errorf("find %s: %w", link, err)
	}
	addrs, err := h.AddrList(l, netlink.FAMILY_ALL)
	if err != nil {
		return nil, fmt.Errorf("list addresses of %s: %w", link, err)
	}
	var out []netip.Addr
	for _, a := range addrs {
		ip, ok := netip.AddrFromSlice(a.IP)
		if ok && ip.Unmap().IsGlobalUnicast() {
			out = append(out, ip.Unmap())
		}
	}
	return out, nil
}

// RouteProto marks the routes Lace owns in a node's namespace, so that it
// can find and remove exactly its own.
const RouteProto = 0x1a

// ReplaceOwnedRoute installs dst via gw out of link, marked as Lace's.
func (n *NS) ReplaceOwnedRoute(dst netip.Prefix, gw netip.Addr, link string) error {
	h := n.h
	l, err := h.LinkByName(link)
	if err != nil {
		return fmt.Errorf("find %s: %w", link, err)
	}
	r := &netlink.Route{
		Dst:       &net.IPNet{IP: dst.Addr().AsSlice(), Mask: net.CIDRMask(dst.Bits(), dst.Addr().BitLen())},
		Gw:        gw.AsSlice(),
		LinkIndex: l.Attrs().Index,
		Protocol:  RouteProto,
	}
	if err := h.RouteReplace(r); err != nil {
		return fmt.Errorf("route %s via %s: %w", dst, gw, err)
	}
	return nil
}

// OwnedRoutes lists the routes marked as Lace's: destination -> gateway.
func OwnedRoutes(nsPath string) (map[netip.Prefix]netip.Addr, error) {
	n, err := OpenNS(nsPath)
	if err != nil {
		return nil, err
	}
	defer n.Close()
	return n.OwnedRoutes()
}

// OwnedRoutes lists the routes marked as Lace's: destination -> gateway.
func (n *NS) OwnedRoutes() (map[netip.Prefix]netip.Addr, error) {
	routes, err := n.h.RouteListFiltered(netlink.FAMILY_ALL, &netlink.Route{Protocol: RouteProto}, netlink.RT_FILTER_PROTOCOL)
	if err != nil {
		return nil, fmt.Errorf("list routes: %w", err)
	}
	out := map[netip.Prefix]netip.Addr{}
	for _, r := range routes {
		if r.Dst == nil {
			continue
		}
		a, _ := netip.AddrFromSlice(r.Dst.IP)
		ones, _ := r.Dst.Mask.Size()
		gw, _ := netip.AddrFromSlice(r.Gw)
		out[netip.PrefixFrom(a.Unmap(), ones)] = gw.Unmap()
	}
	return out, nil
}

// LinksWithPrefix returns the links of the namespace at nsPath whose names
// start with prefix, by name.
func LinksWithPrefix(nsPath, prefix string) (map[string]LinkInfo, error) {
	h, err := Handle(nsPath)
	if err != nil {
		return nil, err
	}
	defer h.Close()
	links, err := h.LinkList()
	if err != nil {
		return nil, fmt.Errorf("list links: %w", err)
	}
	out := map[string]LinkInfo{}
	for _, l := range links {
		if strings.HasPrefix(l.Attrs().Name, prefix) {
			out[l.Attrs().Name] = linkInfo(l)
		}
	}
	return out, nil
}

// RouteOut tells whether the namespace at nsPath routes dst out of link
// with a global source address of dst's family (nil), or why not.
func RouteOut(nsPath string, dst netip.Addr, link string) error {
	return withLink(nsPath, link, func(n *NS, l netlink.Link) error {
		routes, err := n.h.RouteGet(dst.AsSlice())
		if err != nil {
			return fmt.Errorf("no route to %s: %w", dst, err)
		}
		for _, r := range routes {
			if r.LinkIndex != l.Attrs().Index {
				continue
			}
			if src, ok := netip.AddrFromSlice(r.Src); ok && src.Unmap().Is4() == dst.Is4() && src.IsGlobalUnicast() {
				return nil
			}
		}
		return fmt.Errorf("no route to %s out of %s with a source address", dst, link)
	})
}

// ListLinks returns the names of the links in the namespace at nsPath.
func ListLinks(nsPath string) ([]string, error) {
	links, err := LinksWithPrefix(nsPath, "")
	if err != nil {
		return nil, err
	}
	out := make([]string, 0, len(links))
	for name := range links {
		out = append(out, name)
	}
	sort.Strings(out)
	return out, nil
}

package netutil

import (
	"errors"
	"fmt"
	"net"
	"net/netip"

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
	// PeerMAC, when set, is the MAC of the second end.
	PeerMAC net.HardwareAddr
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
		LinkAttrs:     netlink.LinkAttrs{Name: s.Name, MTU: s.MTU},
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
// namespace at nsPath. IPv6 addresses skip duplicate address detection: the
// lab assigns them uniquely and waiting for DAD only slows everything down.
func EnsureAddr(nsPath, link string, prefix netip.Prefix) error {
	h, err := Handle(nsPath)
	if err != nil {
		return err
	}
	defer h.Close()
	l, err := h.LinkByName(link)
	if err != nil {
		return fmt.Errorf("find %s: %w", link, err)
	}
	addr := &netlink.Addr{IPNet: &net.IPNet{IP: prefix.Addr().AsSlice(), Mask: net.CIDRMask(prefix.Bits(), prefix.Addr().BitLen())}}
	if prefix.Addr().Is6() {
		addr.Flags = unix.IFA_F_NODAD
	}
	if err := h.AddrReplace(l, addr); err != nil {
		return fmt.Errorf("add %s to %s: %w", prefix, link, err)
	}
	return nil
}

// EnsureRoute installs dst via gw (out of link when set) in the namespace at
// nsPath, replacing a route to the same destination.
func EnsureRoute(nsPath string, dst netip.Prefix, gw netip.Addr, link string) error {
	h, err := Handle(nsPath)
	if err != nil {
		return err
	}
	defer h.Close()
	r := &netlink.Route{Dst: &net.IPNet{IP: dst.Addr().AsSlice(), Mask: net.CIDRMask(dst.Bits(), dst.Addr().BitLen())}}
	if gw.IsValid() {
		r.Gw = gw.AsSlice()
	}
	if link != "" {
		l, err := h.LinkByName(link)
		if err != nil {
			return fmt.Errorf("find %s: %w", link, err)
		}
		r.LinkIndex = l.Attrs().Index
	}
	if err := h.RouteReplace(r); err != nil {
		return fmt.Errorf("route %s via %s: %w", dst, gw, err)
	}
	return nil
}

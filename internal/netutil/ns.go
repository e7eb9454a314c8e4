package netutil

import (
	"bytes"
	"fmt"
	"net"
	"net/netip"
	"sync"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// NS is an open netlink handle in one namespace, for callers that make
// several changes in a row (a pod's interface): opening a handle per call
// costs more than the calls themselves.
type NS struct {
	path string
	h    *netlink.Handle
}

// OpenNS opens a handle in the namespace at nsPath. Close it when done.
func OpenNS(nsPath string) (*NS, error) {
	h, err := Handle(nsPath)
	if err != nil {
		return nil, err
	}
	return &NS{path: nsPath, h: h}, nil
}

// Close releases the handle.
func (n *NS) Close() { n.h.Close() }

// KeptNS keeps an NS open for a namespace queried on every sync (the
// node's own: its addresses, links and routes), and opens it again when
// its path comes to name another namespace (a node's namespace made
// again). Calls through it run one at a time.
type KeptNS struct {
	path string
	mu   sync.Mutex
	ns   *NS
	id   [2]uint64 // the namespace's device and inode when opened
}

// NewKeptNS keeps the namespace at path; nothing is opened before the
// first Do.
func NewKeptNS(path string) *KeptNS { return &KeptNS{path: path} }

// Do runs f with the namespace's handle.
func (k *KeptNS) Do(f func(*NS) error) error {
	var st unix.Stat_t
	if err := unix.Stat(k.path, &st); err != nil {
		return fmt.Errorf("open netns %s: %w", k.path, err)
	}
	id := [2]uint64{uint64(st.Dev), st.Ino}
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.ns == nil || k.id != id {
		if k.ns != nil {
			k.ns.Close()
			k.ns = nil
		}
		n, err := OpenNS(k.path)
		if err != nil {
			return err
		}
		k.ns, k.id = n, id
	}
	return f(k.ns)
}

// Close releases the handle, if one is open.
func (k *KeptNS) Close() {
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.ns != nil {
		k.ns.Close()
		k.ns = nil
	}
}

// Link returns the index and MAC of link name.
func (n *NS) Link(name string) (LinkInfo, netlink.Link, error) {
	l, err := n.h.LinkByName(name)
	if err != nil {
		return LinkInfo{}, nil, fmt.Errorf("find %s: %w", name, err)
	}
	return linkInfo(l), l, nil
}

// ReplaceAddr sets prefix on l (IPv6 without duplicate address detection).
func (n *NS) ReplaceAddr(l netlink.Link, prefix netip.Prefix) error {
	addr := &netlink.Addr{IPNet: &net.IPNet{IP: prefix.Addr().AsSlice(), Mask: net.CIDRMask(prefix.Bits(), prefix.Addr().BitLen())}}
	if prefix.Addr().Is6() {
		addr.Flags = unix.IFA_F_NODAD
	}
	if err := n.h.AddrReplace(l, addr); err != nil {
		return fmt.Errorf("add %s to %s: %w", prefix, l.Attrs().Name, err)
	}
	return nil
}

// ReplaceRoute installs dst out of l, via gw when valid (a device route
// otherwise).
func (n *NS) ReplaceRoute(l netlink.Link, dst netip.Prefix, gw netip.Addr) error {
	r := &netlink.Route{Dst: &net.IPNet{IP: dst.Addr().AsSlice(), Mask: net.CIDRMask(dst.Bits(), dst.Addr().BitLen())},
		LinkIndex: l.Attrs().Index}
	if gw.IsValid() {
		r.Gw = gw.AsSlice()
	} else {
		r.Scope = netlink.SCOPE_LINK
	}
	if err := n.h.RouteReplace(r); err != nil {
		return fmt.Errorf("route %s via %s: %w", dst, gw, err)
	}
	return nil
}

// SetNeigh installs a permanent neighbour ip -> mac on l.
func (n *NS) SetNeigh(l netlink.Link, ip netip.Addr, mac net.HardwareAddr) error {
	fam := unix.AF_INET
	if ip.Is6() {
		fam = unix.AF_INET6
	}
	nb := &netlink.Neigh{LinkIndex: l.Attrs().Index, Family: fam, State: netlink.NUD_PERMANENT, IP: ip.AsSlice(), HardwareAddr: mac}
	if err := n.h.NeighSet(nb); err != nil {
		return fmt.Errorf("neighbour %s on %s: %w", ip, l.Attrs().Name, err)
	}
	return nil
}

// SetMAC gives l the MAC mac unless it has it already.
func (n *NS) SetMAC(l netlink.Link, mac net.HardwareAddr) error {
	if bytes.Equal(l.Attrs().HardwareAddr, mac) {
		return nil
	}
	if err := n.h.LinkSetHardwareAddr(l, mac); err != nil {
		return fmt.Errorf("set MAC of %s to %s: %w", l.Attrs().Name, mac, err)
	}
	return nil
}

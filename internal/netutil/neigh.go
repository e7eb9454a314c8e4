package netutil

import (
	"errors"
	"fmt"
	"net/netip"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// KeepResolved keeps the kernel resolving addrs, next hops on link, for
// good: managed neighbour entries (NTF_EXT_MANAGED, kernel 5.16), which
// the kernel probes on its own and never lets age out. The data plane's
// FIB lookups read the neighbour table only: for a next hop that aged out
// a packet takes the slower path through neighbour resolution, and a
// flood's copies (cloned, sent as they are) to such a node cannot be sent
// at all. Lace marks its entries extern_learn and managed; entries so
// marked on link that addrs does not name are removed, the others (the
// kernel's own, an operator's) are left alone.
func KeepResolved(nsPath, link string, addrs []netip.Addr) error {
	h, err := Handle(nsPath)
	if err != nil {
		return err
	}
	defer h.Close()
	l, err := h.LinkByName(link)
	if err != nil {
		return fmt.Errorf("find %s: %w", link, err)
	}
	want := map[netip.Addr]bool{}
	for _, a := range addrs {
		want[a.Unmap()] = true
	}
	have := map[netip.Addr]bool{}
	list, err := h.NeighList(l.Attrs().Index, netlink.FAMILY_ALL)
	if err != nil {
		return fmt.Errorf("list neighbours of %s: %w", link, err)
	}
	var errs []error
	for _, n := range list {
		a, ok := netip.AddrFromSlice(n.IP)
		if !ok || n.FlagsExt&netlink.NTF_EXT_MANAGED == 0 || n.Flags&netlink.NTF_EXT_LEARNED == 0 {
			continue
		}
		a = a.Unmap()
		if want[a] {
			have[a] = true
			continue
		}
		if err := h.NeighDel(&n); err != nil && !errors.Is(err, unix.ENOENT) {
			errs = append(errs, fmt.Errorf("remove managed neighbour %s on %s: %w", a, link, err))
		}
	}
	for a := range want {
		if have[a] {
			continue
		}
		family := unix.AF_INET6
		if a.Is4() {
			family = unix.AF_INET
		}
		n := &netlink.Neigh{LinkIndex: l.Attrs().Index, Family: family, IP: a.AsSlice(), State: netlink.NUD_NONE,
			Flags: netlink.NTF_EXT_LEARNED, FlagsExt: netlink.NTF_EXT_MANAGED}
		if err := h.NeighSet(n); err != nil {
			errs = append(errs, fmt.Errorf("managed neighbour %s on %s: %w", a, link, err))
		}
	}
	return errors.Join(errs...)
}

package netutil

import (
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"sync"
	"time"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// NeighKeeper keeps next hops resolved for good: managed neighbour entries
// (NTF_EXT_MANAGED, kernel 5.16), which the kernel probes on its own and
// never lets age out. The data plane's FIB lookups read the neighbour
// table only: for a next hop that aged out a packet takes the slower path
// through neighbour resolution, and a flood's copies (clones, sent as they
// are) cannot be sent to it at all.
//
// It removes only entries it made, took over from the kernel's own
// dynamic ones, or adopted: an operator's static entry (permanent, noarp)
// is already resolved and left as it is, whether wanted or not. A managed
// extern_learn entry for a wanted next hop is adopted (an earlier
// process's; another agent marking its entries alike, as Cilium does,
// cannot be told apart). One for a next hop gone while no agent ran stays
// until removed by hand (the kernel keeps probing it).
type NeighKeeper struct {
	mu   sync.Mutex
	mine map[netip.Addr]bool
	// kept are the next hops last kept without error (sorted), at
	// keptAt: the same again within neighRecheck lists nothing (every
	// sync asks, and the listing is most of its garbage).
	kept   []netip.Addr
	keptAt time.Time
	// keptOn is the link (its index) they were kept on: one made again
	// lost its neighbours.
	keptOn int
}

// neighRecheck is how long the same next hops are taken as kept: an entry
// someone removed meanwhile is made again after at most that long.
const neighRecheck = 5 * time.Second

func lacesManaged(n netlink.Neigh) bool {
	return n.FlagsExt&netlink.NTF_EXT_MANAGED != 0 && n.Flags&netlink.NTF_EXT_LEARNED != 0
}

// Keep makes want the next hops on link (in the namespace ns has open)
// that stay resolved.
func (k *NeighKeeper) Keep(ns *NS, link string, want []netip.Addr) (err error) {
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.mine == nil {
		k.mine = map[netip.Addr]bool{}
	}
	sorted := make([]netip.Addr, len(want))
	for i, a := range want {
		sorted[i] = a.Unmap()
	}
	slices.SortFunc(sorted, netip.Addr.Compare)
	sorted = slices.Compact(sorted)
	h := ns.h
	l, err := h.LinkByName(link)
	if err == nil && slices.Equal(sorted, k.kept) && k.kept != nil && k.keptOn == l.Attrs().Index && time.Since(k.keptAt) < neighRecheck {
		return nil
	}
	k.kept = nil
	defer func() {
		if err == nil {
			k.kept, k.keptAt, k.keptOn = sorted, time.Now(), l.Attrs().Index
		}
	}()
	if err != nil {
		return fmt.Errorf("find %s: %w", link, err)
	}
	list, err := h.NeighList(l.Attrs().Index, netlink.FAMILY_ALL)
	if err != nil {
		return fmt.Errorf("list neighbours of %s: %w", link, err)
	}
	have := map[netip.Addr]netlink.Neigh{}
	for _, n := range list {
		if a, ok := netip.AddrFromSlice(n.IP); ok {
			have[a.Unmap()] = n
		}
	}
	wanted := map[netip.Addr]bool{}
	var errs []error
	for _, a := range want {
		a = a.Unmap()
		wanted[a] = true
		n, ok := have[a]
		switch {
		case ok && lacesManaged(n):
			// Ours, or an earlier process's: adopted. Another agent's
			// alike is resolved all the same.
			if !k.mine[a] && n.State&(netlink.NUD_PERMANENT|netlink.NUD_NOARP) == 0 {
				k.mine[a] = true
			}
			continue
		case ok && (n.State&(netlink.NUD_PERMANENT|netlink.NUD_NOARP) != 0 || n.FlagsExt&netlink.NTF_EXT_MANAGED != 0):
			continue // static, or managed by someone else
		}
		family := unix.AF_INET6
		if a.Is4() {
			family = unix.AF_INET
		}
		e := &netlink.Neigh{LinkIndex: l.Attrs().Index, Family: family, IP: a.AsSlice(), State: netlink.NUD_NONE,
			Flags: netlink.NTF_EXT_LEARNED, FlagsExt: netlink.NTF_EXT_MANAGED}
		if err := h.NeighSet(e); err != nil {
			errs = append(errs, fmt.Errorf("managed neighbour %s on %s: %w", a, link, err))
			continue
		}
		k.mine[a] = true
	}
	for a := range k.mine {
		if wanted[a] {
			continue
		}
		if n, ok := have[a]; ok && lacesManaged(n) {
			if err := h.NeighDel(&n); err != nil && !errors.Is(err, unix.ENOENT) {
				errs = append(errs, fmt.Errorf("remove managed neighbour %s on %s: %w", a, link, err))
				continue
			}
		}
		delete(k.mine, a)
	}
	return errors.Join(errs...)
}

package netutil

import (
	"errors"
	"fmt"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// ReplaceFilter runs the BPF program progFD (direct action) on the ingress
// or egress of link, as the filter named name in a clsact qdisc. Replacing
// the filter of the same handle swaps the program atomically, so a new
// agent takes over without a gap.
//
// This is the classic tc hook, not tcx: on this kernel every tcx attach
// waits for an RCU grace period under the RTNL lock (12-17 ms measured per
// attach, serialised even when two run at once), a cls_bpf filter on a
// fresh clsact about 1.3 ms. A pod's ADD pays for its attachments.
func ReplaceFilter(nsPath, link string, ingress bool, progFD int, name string) error {
	return withLink(nsPath, link, func(n *NS, l netlink.Link) error {
		q := &netlink.GenericQdisc{QdiscAttrs: netlink.QdiscAttrs{LinkIndex: l.Attrs().Index,
			Handle: netlink.MakeHandle(0xffff, 0), Parent: netlink.HANDLE_CLSACT}, QdiscType: "clsact"}
		if err := n.h.QdiscAdd(q); err != nil && !errors.Is(err, unix.EEXIST) {
			return fmt.Errorf("add clsact to %s: %w", link, err)
		}
		parent := uint32(netlink.HANDLE_MIN_EGRESS)
		if ingress {
			parent = netlink.HANDLE_MIN_INGRESS
		}
		f := &netlink.BpfFilter{FilterAttrs: netlink.FilterAttrs{LinkIndex: l.Attrs().Index,
			Parent: parent, Handle: 1, Protocol: unix.ETH_P_ALL, Priority: 1},
			Fd: progFD, Name: name, DirectAction: true}
		if err := n.h.FilterReplace(f); err != nil {
			return fmt.Errorf("attach %s to %s: %w", name, link, err)
		}
		return nil
	})
}

// RemoveFilters removes link's clsact qdisc and with it every filter
// ReplaceFilter put there. A link that is gone already is fine.
func RemoveFilters(nsPath, link string) error {
	err := withLink(nsPath, link, func(n *NS, l netlink.Link) error {
		q := &netlink.GenericQdisc{QdiscAttrs: netlink.QdiscAttrs{LinkIndex: l.Attrs().Index,
			Handle: netlink.MakeHandle(0xffff, 0), Parent: netlink.HANDLE_CLSACT}, QdiscType: "clsact"}
		if err := n.h.QdiscDel(q); err != nil && !errors.Is(err, unix.ENOENT) && !errors.Is(err, unix.EINVAL) {
			return fmt.Errorf("remove clsact of %s: %w", link, err)
		}
		return nil
	})
	var nf netlink.LinkNotFoundError
	if errors.As(err, &nf) {
		return nil
	}
	return err
}

package netutil

import (
	"errors"
	"fmt"
	"net"
	"os"
	"runtime"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

// What the lab needs to stand in for a virtual machine behind its pod
// (lab/vmsim): a namespace of its own for the guest, the pod's side as
// KubeVirt's bridge binding leaves it, and a wire that joins the guest's
// link to one pod's tap at a time, switched as a live migration switches
// the VM's NIC from one host's tap to another's.

// NewAnonNS makes a network namespace of no name (no mount anywhere: the
// root namespace's mounts stay as they were), with its loopback up. It
// lives while the returned file is open; the path enters it.
func NewAnonNS() (string, *os.File, error) {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	orig, err := netns.Get()
	if err != nil {
		return "", nil, fmt.Errorf("current netns: %w", err)
	}
	defer orig.Close()
	ns, err := netns.New()
	if err != nil {
		return "", nil, fmt.Errorf("new netns: %w", err)
	}
	if err := netns.Set(orig); err != nil {
		// The thread is in the new namespace: never hand it back.
		panic(fmt.Sprintf("return to the original network namespace: %v", err))
	}
	f := os.NewFile(uintptr(ns), "anon-netns")
	path := fmt.Sprintf("/proc/%d/fd/%d", os.Getpid(), f.Fd())
	if err := withLink(path, "lo", func(n *NS, l netlink.Link) error { return n.h.LinkSetUp(l) }); err != nil {
		f.Close()
		return "", nil, err
	}
	return path, f, nil
}

// BindBridge does to link in the namespace at nsPath what KubeVirt's
// bridge binding does to a pod's interface: its addresses go (the VM holds
// them now), its MAC becomes mac (the VM holds the old one), and it joins
// bridge, created here, up and without addresses of its own. It returns
// the link's MTU, which the VM's link must not exceed.
func BindBridge(nsPath, link, bridge string, mac net.HardwareAddr) (int, error) {
	if err := EnsureBridge(nsPath, bridge); err != nil {
		return 0, err
	}
	mtu := 0
	err := withLink(nsPath, link, func(n *NS, l netlink.Link) error {
		mtu = l.Attrs().MTU
		addrs, err := n.h.AddrList(l, netlink.FAMILY_ALL)
		if err != nil {
			return fmt.Errorf("list addresses of %s: %w", link, err)
		}
		for _, a := range addrs {
			if err := n.h.AddrDel(l, &a); err != nil {
				return fmt.Errorf("remove %s from %s: %w", a.IPNet, link, err)
			}
		}
		if err := n.SetMAC(l, mac); err != nil {
			return err
		}
		_, br, err := n.Link(bridge)
		if err != nil {
			return err
		}
		// The bridge speaks for nobody: no IPv6 of its own (its router
		// solicitations and reports would carry a MAC the port does not
		// hold).
		if err := n.h.LinkSetMTU(br, mtu); err != nil {
			return fmt.Errorf("set MTU of %s: %w", bridge, err)
		}
		if err := Do(nsPath, func() error {
			return os.WriteFile("/proc/sys/net/ipv6/conf/"+bridge+"/disable_ipv6", []byte("1"), 0o644)
		}); err != nil {
			return fmt.Errorf("turn IPv6 off on %s: %w", bridge, err)
		}
		if err := n.h.LinkSetMaster(l, br); err != nil {
			return fmt.Errorf("attach %s to %s: %w", link, bridge, err)
		}
		return n.h.LinkSetUp(l)
	})
	return mtu, err
}

// Patch joins links a and b of the namespace at nsPath as one wire: what
// arrives on either leaves on the other (tc mirred, no bridge, no link
// going down), replacing whatever either was joined to.
func Patch(nsPath, a, b string) error {
	for _, p := range [][2]string{{a, b}, {b, a}} {
		to, err := GetLink(nsPath, p[1])
		if err != nil {
			return err
		}
		err = withLink(nsPath, p[0], func(n *NS, l netlink.Link) error {
			q := &netlink.GenericQdisc{QdiscAttrs: netlink.QdiscAttrs{LinkIndex: l.Attrs().Index,
				Handle: netlink.MakeHandle(0xffff, 0), Parent: netlink.HANDLE_CLSACT}, QdiscType: "clsact"}
			if err := n.h.QdiscAdd(q); err != nil && !errors.Is(err, unix.EEXIST) {
				return fmt.Errorf("add clsact to %s: %w", p[0], err)
			}
			// u32 with no key matches everything (matchall is not built
			// into every kernel); its handle 800::800 makes a second
			// Patch replace the filter in place.
			f := &netlink.U32{FilterAttrs: netlink.FilterAttrs{LinkIndex: l.Attrs().Index,
				Parent: netlink.HANDLE_MIN_INGRESS, Handle: 0x80000800, Protocol: unix.ETH_P_ALL, Priority: 1},
				Actions: []netlink.Action{netlink.NewMirredAction(to.Index)}}
			if err := n.h.FilterReplace(f); err != nil {
				return fmt.Errorf("join %s to %s: %w", p[0], p[1], err)
			}
			return nil
		})
		if err != nil {
			return err
		}
	}
	return nil
}

// Unplug joins link of the namespace at nsPath to nothing: what arrives
// on it goes to the namespace's own stack, which must hold no address to
// answer it (QuietNS).
func Unplug(nsPath, link string) error {
	return RemoveFilters(nsPath, link)
}

// QuietNS makes the namespace at nsPath speak no IPv6 on its links (no
// link-local address, no router solicitation, no MLD): a namespace of
// wires only.
func QuietNS(nsPath string) error {
	return Do(nsPath, func() error {
		for _, c := range []string{"all", "default"} {
			if err := os.WriteFile("/proc/sys/net/ipv6/conf/"+c+"/disable_ipv6", []byte("1"), 0o644); err != nil {
				return fmt.Errorf("turn IPv6 off (%s): %w", c, err)
			}
		}
		return nil
	})
}

// ICMPSocket opens a raw ICMP (or ICMPv6) socket in the namespace at
// nsPath: it stays in that namespace once open.
func ICMPSocket(nsPath string, v6 bool) (int, error) {
	fd := -1
	err := Do(nsPath, func() error {
		var err error
		if v6 {
			fd, err = unix.Socket(unix.AF_INET6, unix.SOCK_RAW|unix.SOCK_CLOEXEC, unix.IPPROTO_ICMPV6)
		} else {
			fd, err = unix.Socket(unix.AF_INET, unix.SOCK_RAW|unix.SOCK_CLOEXEC, unix.IPPROTO_ICMP)
		}
		return err
	})
	if err != nil {
		return -1, fmt.Errorf("ICMP socket in %s: %w", nsPath, err)
	}
	return fd, nil
}

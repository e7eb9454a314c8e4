package netutil

import (
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
// KubeVirt's bridge binding leaves it, and the guest's link moving between
// pods as a live migration moves the VM.

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

// MoveLink moves link from the namespace at fromNS into the one at toNS,
// where it joins bridge master and comes up.
func MoveLink(fromNS, link, toNS, master string) error {
	target, err := netns.GetFromPath(toNS)
	if err != nil {
		return fmt.Errorf("open netns %s: %w", toNS, err)
	}
	defer target.Close()
	if err := withLink(fromNS, link, func(n *NS, l netlink.Link) error {
		if err := n.h.LinkSetNsFd(l, int(target)); err != nil {
			return fmt.Errorf("move %s to %s: %w", link, toNS, err)
		}
		return nil
	}); err != nil {
		return err
	}
	return withLink(toNS, link, func(n *NS, l netlink.Link) error {
		_, br, err := n.Link(master)
		if err != nil {
			return err
		}
		if err := n.h.LinkSetMaster(l, br); err != nil {
			return fmt.Errorf("attach %s to %s: %w", link, master, err)
		}
		if err := n.h.LinkSetUp(l); err != nil {
			return fmt.Errorf("set %s up: %w", link, err)
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

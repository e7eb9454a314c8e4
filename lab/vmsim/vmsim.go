// Package vmsim stands in for a KubeVirt virtual machine on the lab: a
// guest network namespace (its own MAC and addresses, its sockets) behind a
// pod's bridge binding, as KubeVirt wires a VM. The guest's link reaches
// the pod's tap through a wire (a namespace of its own joining two links
// with tc), which a live migration switches to the target pod's tap: the
// guest, its link and its sockets untouched and never down, as a VM's NIC
// is while QEMU moves it between hosts. The announcement QEMU sends on
// arrival (RARP) is the guest's to send. It owns the guest's and the
// wire's namespaces and the links it makes; the pods' namespaces are the
// lab's.
package vmsim

import (
	"encoding/binary"
	"fmt"
	"net"
	"net/netip"
	"os"

	"github.com/lace-cni/lace/internal/netutil"
)

// Names of the links: the pod's bridge and the VM's tap (its side in the
// pod), and the guest's own link.
const (
	Bridge   = "k6t-eth0"
	tapName  = "tap0"
	linkName = "vm0"
	wireLink = "w0"
	podLink  = "eth0"
)

// Guest is a VM behind a pod of an l2 network.
type Guest struct {
	// NS enters the guest's network namespace.
	NS    string
	MAC   net.HardwareAddr
	Addrs []netip.Prefix
	mtu   int
	files []*os.File
	wire  string
	// ends are the wire's links to the pods' taps, by pod namespace; at
	// is the pod the guest runs behind now.
	ends map[string]string
	at   string
}

// Bind wires pod's namespace (podNS) as KubeVirt's bridge binding does:
// eth0 keeps no address and takes a MAC of its own (the VM takes its
// address and MAC), and joins a bridge. It returns eth0's MTU.
func Bind(podNS string) (int, error) {
	info, err := netutil.GetLink(podNS, podLink)
	if err != nil {
		return 0, err
	}
	// A locally administered MAC from the old one: the pod's side of the
	// bridge never speaks as the VM.
	mac := append(net.HardwareAddr(nil), info.MAC...)
	mac[0] = (mac[0] | 0x02) ^ 0x80
	return netutil.BindBridge(podNS, podLink, Bridge, mac)
}

// Start boots a guest with mac and addrs behind the pod at podNS, whose
// namespace Bind wired; its link has mtu.
func Start(podNS string, mac net.HardwareAddr, mtu int, addrs ...netip.Prefix) (*Guest, error) {
	g := &Guest{MAC: mac, Addrs: addrs, mtu: mtu, ends: map[string]string{}}
	for _, ns := range []*string{&g.NS, &g.wire} {
		path, f, err := netutil.NewAnonNS()
		if err != nil {
			g.Close()
			return nil, err
		}
		*ns, g.files = path, append(g.files, f)
	}
	if err := netutil.QuietNS(g.wire); err != nil {
		g.Close()
		return nil, err
	}
	if err := netutil.EnsureVeth(netutil.VethSpec{NSPath: g.wire, Name: wireLink, PeerNSPath: g.NS, PeerName: linkName,
		MTU: mtu, PeerMAC: mac}); err != nil {
		g.Close()
		return nil, fmt.Errorf("the guest's link: %w", err)
	}
	for _, a := range addrs {
		if err := netutil.EnsureAddr(g.NS, linkName, a); err != nil {
			g.Close()
			return nil, err
		}
	}
	if err := g.Plug(podNS); err != nil {
		g.Close()
		return nil, err
	}
	if err := netutil.Patch(g.wire, wireLink, g.ends[podNS]); err != nil {
		g.Close()
		return nil, err
	}
	g.at = podNS
	return g, nil
}

// Plug gives the pod at podNS (wired by Bind) a tap for the guest, as a
// migration's target launcher has one before the VM arrives: joined to
// nothing until Migrate.
func (g *Guest) Plug(podNS string) error {
	if _, ok := g.ends[podNS]; ok {
		return nil
	}
	end := fmt.Sprintf("p%d", len(g.ends))
	if err := netutil.EnsureVeth(netutil.VethSpec{NSPath: podNS, Name: tapName, PeerNSPath: g.wire, PeerName: end,
		Master: Bridge, MTU: g.mtu}); err != nil {
		return fmt.Errorf("the tap of %s: %w", podNS, err)
	}
	if err := netutil.Unplug(g.wire, end); err != nil {
		return err
	}
	g.ends[podNS] = end
	return nil
}

// Migrate switches the guest to the pod at podNS (Plug gave it a tap), as
// a live migration's switch-over does: from now on its frames reach that
// pod, and only that pod's reach it. With announce, the guest then
// announces itself as QEMU does (a RARP from its MAC); a lost announcement
// leaves the guest's first frame to say it.
func (g *Guest) Migrate(podNS string, announce bool) error {
	if err := g.Plug(podNS); err != nil {
		return err
	}
	if err := netutil.Patch(g.wire, wireLink, g.ends[podNS]); err != nil {
		return err
	}
	if err := netutil.Unplug(g.wire, g.ends[g.at]); err != nil {
		return err
	}
	g.at = podNS
	if !announce {
		return nil
	}
	return netutil.SendFrames(g.NS, linkName, [][]byte{RARP(g.MAC)})
}

// Close removes the guest and its wire: their namespaces, and the links
// with them (the pods' taps go with their peers).
func (g *Guest) Close() {
	for _, f := range g.files {
		f.Close()
	}
}

// RARP is QEMU's self-announcement of a migrated VM (qemu_announce_self):
// a broadcast reverse ARP request from and for its MAC.
func RARP(mac net.HardwareAddr) []byte {
	f := make([]byte, 60)
	copy(f[0:6], net.HardwareAddr{0xff, 0xff, 0xff, 0xff, 0xff, 0xff})
	copy(f[6:12], mac)
	binary.BigEndian.PutUint16(f[12:], 0x8035)
	p := f[14:]
	binary.BigEndian.PutUint16(p[0:], 1)      // Ethernet
	binary.BigEndian.PutUint16(p[2:], 0x0800) // IPv4
	p[4], p[5] = 6, 4
	binary.BigEndian.PutUint16(p[6:], 3) // reverse request
	copy(p[8:], mac)
	copy(p[18:], mac)
	return f
}

// Package vmsim stands in for a KubeVirt virtual machine on the lab: a
// guest network namespace (its own MAC and addresses, its sockets) behind a
// pod's bridge binding, as KubeVirt wires a VM, which a live migration
// moves to another pod by moving the guest's link, the guest and its
// sockets untouched, as a VM's are. The announcement QEMU sends on arrival
// (RARP) is the guest's to send. It owns the guest namespace and the links
// it makes; the pods' namespaces are the lab's.
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
	podLink  = "eth0"
)

// Guest is a VM behind a pod of an l2 network.
type Guest struct {
	// NS enters the guest's network namespace.
	NS    string
	MAC   net.HardwareAddr
	Addrs []netip.Prefix
	file  *os.File
	pod   string // the namespace of the pod it runs behind now
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
	path, f, err := netutil.NewAnonNS()
	if err != nil {
		return nil, err
	}
	g := &Guest{NS: path, MAC: mac, Addrs: addrs, file: f, pod: podNS}
	if err := netutil.EnsureVeth(netutil.VethSpec{NSPath: podNS, Name: tapName, PeerNSPath: path, PeerName: linkName,
		Master: Bridge, MTU: mtu, PeerMAC: mac}); err != nil {
		f.Close()
		return nil, fmt.Errorf("the guest's link: %w", err)
	}
	for _, a := range addrs {
		if err := netutil.EnsureAddr(path, linkName, a); err != nil {
			g.Close()
			return nil, err
		}
	}
	return g, nil
}

// Migrate moves the guest behind the pod at podNS (wired by Bind), as a
// live migration's switch-over does: its link leaves the old pod and joins
// the new one's bridge. With announce, the guest then announces itself as
// QEMU does (a RARP from its MAC); a lost announcement leaves the guest's
// first frame to say it.
func (g *Guest) Migrate(podNS string, announce bool) error {
	if err := netutil.MoveLink(g.pod, tapName, podNS, Bridge); err != nil {
		return err
	}
	g.pod = podNS
	if !announce {
		return nil
	}
	return netutil.SendFrames(g.NS, linkName, [][]byte{RARP(g.MAC)})
}

// Close removes the guest: its link (and the tap with it) and namespace.
func (g *Guest) Close() {
	_ = netutil.DeleteLink(g.NS, linkName)
	g.file.Close()
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

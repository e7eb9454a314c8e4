package netutil

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"net/netip"

	"golang.org/x/sys/unix"
)

// GratuitousARP is the frame announcing that vip (IPv4) is at mac: an ARP
// request for the address from itself, broadcast (RFC 5227's
// announcement), which a Linux neighbour updates an existing entry from
// whatever its locktime.
func GratuitousARP(mac net.HardwareAddr, vip netip.Addr) []byte {
	f := make([]byte, 42)
	copy(f[0:6], []byte{0xff, 0xff, 0xff, 0xff, 0xff, 0xff})
	copy(f[6:12], mac)
	binary.BigEndian.PutUint16(f[12:], 0x0806)
	binary.BigEndian.PutUint16(f[14:], 1)      // Ethernet
	binary.BigEndian.PutUint16(f[16:], 0x0800) // IPv4
	f[18], f[19] = 6, 4
	binary.BigEndian.PutUint16(f[20:], 1) // request
	a := vip.As4()
	copy(f[22:28], mac)
	copy(f[28:32], a[:])
	copy(f[38:42], a[:])
	return f
}

// UnsolicitedNA is the frame announcing that vip (IPv6) is at mac: a
// neighbour advertisement to all nodes with the override flag (RFC 4861
// 7.2.6), which updates existing entries.
func UnsolicitedNA(mac net.HardwareAddr, vip netip.Addr) []byte {
	const icmpLen = 32
	f := make([]byte, 14+40+icmpLen)
	copy(f[0:6], []byte{0x33, 0x33, 0, 0, 0, 1})
	copy(f[6:12], mac)
	binary.BigEndian.PutUint16(f[12:], 0x86dd)
	ip := f[14:54]
	ip[0] = 0x60
	binary.BigEndian.PutUint16(ip[4:], icmpLen)
	ip[6], ip[7] = 58, 255
	src, dst := vip.As16(), netip.MustParseAddr("ff02::1").As16()
	copy(ip[8:24], src[:])
	copy(ip[24:40], dst[:])
	m := f[54:]
	m[0] = 136
	binary.BigEndian.PutUint32(m[4:], 0x20000000) // override
	copy(m[8:24], src[:])
	m[24], m[25] = 2, 1 // target link-layer address
	copy(m[26:32], mac)
	var sum uint32
	add := func(b []byte) {
		for i := 0; i+1 < len(b); i += 2 {
			sum += uint32(binary.BigEndian.Uint16(b[i:]))
		}
	}
	add(src[:])
	add(dst[:])
	sum += icmpLen + 58
	add(m)
	for sum > 0xffff {
		sum = sum&0xffff + sum>>16
	}
	binary.BigEndian.PutUint16(m[2:], ^uint16(sum))
	return f
}

// SendFrames writes raw Ethernet frames out of ifName in the namespace
// nsPath.
func SendFrames(nsPath, ifName string, frames [][]byte) error {
	return Do(nsPath, func() error {
		iface, err := net.InterfaceByName(ifName)
		if err != nil {
			return err
		}
		fd, err := unix.Socket(unix.AF_PACKET, unix.SOCK_RAW|unix.SOCK_CLOEXEC, 0)
		if err != nil {
			return fmt.Errorf("packet socket: %w", err)
		}
		defer unix.Close(fd)
		for _, f := range frames {
			to := &unix.SockaddrLinklayer{Ifindex: iface.Index, Halen: 6}
			copy(to.Addr[:], f[0:6])
			if err := unix.Sendto(fd, f, 0, to); err != nil {
				return fmt.Errorf("send on %s: %w", ifName, err)
			}
		}
		return nil
	})
}

// SolicitedNode is the solicited-node multicast group of a (RFC 4291
// 2.7.1), where neighbour solicitations for a are sent.
func SolicitedNode(a netip.Addr) netip.Addr {
	b := a.As16()
	g := netip.MustParseAddr("ff02::1:ff00:0").As16()
	copy(g[13:], b[13:])
	return netip.AddrFrom16(g)
}

// GroupMember holds multicast group memberships on one interface of a
// network namespace, so that the interface (and MLD-snooping switches)
// let solicitations for addresses no interface holds reach it.
type GroupMember struct {
	fd      int
	ifindex int
	joined  map[netip.Addr]bool
}

// NewGroupMember opens the socket holding the memberships on ifName in
// nsPath.
func NewGroupMember(nsPath, ifName string) (*GroupMember, error) {
	g := &GroupMember{fd: -1, joined: map[netip.Addr]bool{}}
	err := Do(nsPath, func() error {
		iface, err := net.InterfaceByName(ifName)
		if err != nil {
			return err
		}
		g.ifindex = iface.Index
		g.fd, err = unix.Socket(unix.AF_INET6, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("multicast membership socket on %s: %w", ifName, err)
	}
	return g, nil
}

// Set makes the joined groups exactly groups.
func (g *GroupMember) Set(groups []netip.Addr) error {
	want := map[netip.Addr]bool{}
	var errs []error
	for _, a := range groups {
		want[a] = true
		if g.joined[a] {
			continue
		}
		m := &unix.IPv6Mreq{Multiaddr: a.As16(), Interface: uint32(g.ifindex)}
		if err := unix.SetsockoptIPv6Mreq(g.fd, unix.IPPROTO_IPV6, unix.IPV6_JOIN_GROUP, m); err != nil {
			errs = append(errs, fmt.Errorf("join %s: %w", a, err))
			continue
		}
		g.joined[a] = true
	}
	for a := range g.joined {
		if want[a] {
			continue
		}
		m := &unix.IPv6Mreq{Multiaddr: a.As16(), Interface: uint32(g.ifindex)}
		if err := unix.SetsockoptIPv6Mreq(g.fd, unix.IPPROTO_IPV6, unix.IPV6_LEAVE_GROUP, m); err != nil {
			errs = append(errs, fmt.Errorf("leave %s: %w", a, err))
		}
		delete(g.joined, a)
	}
	return errors.Join(errs...)
}

// Close leaves every group.
func (g *GroupMember) Close() error { return unix.Close(g.fd) }

package netutil

import (
	"encoding/binary"
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

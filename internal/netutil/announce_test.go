package netutil

import (
	"encoding/binary"
	"net"
	"net/netip"
	"testing"
)

func TestSolicitedNode(t *testing.T) {
	if got := SolicitedNode(netip.MustParseAddr("fd00:30::12:34f0")); got != netip.MustParseAddr("ff02::1:ff12:34f0") {
		t.Errorf("solicited-node group %s", got)
	}
}

// TestAnnouncementFrames: the gratuitous ARP says the VIP is at the MAC,
// and the unsolicited NA's ICMPv6 checksum verifies (a receiver drops it
// otherwise).
func TestAnnouncementFrames(t *testing.T) {
	mac, _ := net.ParseMAC("02:00:00:00:00:0b")
	vip4, vip6 := netip.MustParseAddr("192.0.2.10"), netip.MustParseAddr("2001:db8::a")
	arp := GratuitousARP(mac, vip4)
	if binary.BigEndian.Uint16(arp[12:]) != 0x0806 || net.HardwareAddr(arp[22:28]).String() != mac.String() ||
		netip.AddrFrom4([4]byte(arp[28:32])) != vip4 || netip.AddrFrom4([4]byte(arp[38:42])) != vip4 {
		t.Errorf("gratuitous ARP % x", arp)
	}
	na := UnsolicitedNA(mac, vip6)
	ip, icmp := na[14:54], na[54:]
	var sum uint32
	add := func(b []byte) {
		for i := 0; i+1 < len(b); i += 2 {
			sum += uint32(binary.BigEndian.Uint16(b[i:]))
		}
	}
	add(ip[8:40])
	sum += uint32(len(icmp)) + 58
	add(icmp)
	for sum > 0xffff {
		sum = sum&0xffff + sum>>16
	}
	if sum != 0xffff {
		t.Errorf("NA checksum does not verify (%#x): % x", sum, na)
	}
	if icmp[0] != 136 || icmp[4]&0x20 == 0 || netip.AddrFrom16([16]byte(icmp[8:24])) != vip6 || net.HardwareAddr(icmp[26:32]).String() != mac.String() {
		t.Errorf("NA % x", icmp)
	}
}

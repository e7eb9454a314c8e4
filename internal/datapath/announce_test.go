package datapath

import (
	"encoding/binary"
	"net"
	"net/netip"
	"testing"
	"time"

	"github.com/cilium/ebpf"
)

func runUnderlay(t *testing.T, d *Datapath, pkt []byte) (uint32, []byte) {
	t.Helper()
	out := make([]byte, len(pkt)+256)
	opts := &ebpf.RunOptions{Data: pkt, DataOut: out}
	ret, err := d.underlay.FromUnderlay.Run(opts)
	if err != nil {
		t.Fatalf("BPF_PROG_RUN: %v", err)
	}
	return ret, opts.DataOut
}

func arpRequest(sha net.HardwareAddr, spa, tpa netip.Addr) []byte {
	a := make([]byte, 28)
	binary.BigEndian.PutUint16(a[0:], 1)
	binary.BigEndian.PutUint16(a[2:], 0x0800)
	a[4], a[5] = 6, 4
	binary.BigEndian.PutUint16(a[6:], 1)
	copy(a[8:14], sha)
	s, d := spa.As4(), tpa.As4()
	copy(a[14:18], s[:])
	copy(a[24:28], d[:])
	return ether(net.HardwareAddr{0xff, 0xff, 0xff, 0xff, 0xff, 0xff}, 0x0806, a)
}

func neighbourSolicitation(src, target netip.Addr, sha net.HardwareAddr) []byte {
	m := make([]byte, 32)
	m[0] = 135
	tg := target.As16()
	copy(m[8:24], tg[:])
	m[24], m[25] = 1, 1 // source link-layer address
	copy(m[26:32], sha)
	group := netip.MustParseAddr("ff02::1:ff00:0").As16()
	copy(group[13:], tg[13:])
	ip := ipv6(src, netip.AddrFrom16(group), 58, m)
	ip[7] = 255
	return ether(net.HardwareAddr{0x33, 0x33, 0xff, tg[13], tg[14], tg[15]}, 0x86dd, ip)
}

// TestProgAnnounce: the underlay answers ARP requests and neighbour
// solicitations for announced VIPs, in place and back out of the
// interface, with the announced MAC; a VIP no longer announced, one whose
// entry lapsed, another address and duplicate address detection go to
// the host untouched.
func TestProgAnnounce(t *testing.T) {
	d := progDatapath(t)
	mac := net.HardwareAddr{2, 0, 0, 0, 0, 0x0b}
	peer := net.HardwareAddr{2, 0, 0, 0, 0, 0xee}
	vip4, vip6 := netip.MustParseAddr("172.31.0.240"), netip.MustParseAddr("fd00:99::f0")
	client4, client6 := netip.MustParseAddr("172.31.0.200"), netip.MustParseAddr("fd00:99::c8")
	if err := d.SetAnnounced([]netip.Addr{vip4, vip6}, mac, time.Minute); err != nil {
		t.Fatal(err)
	}

	ret, out := runUnderlay(t, d, arpRequest(peer, client4, vip4))
	if ret != actRedirect {
		t.Fatalf("ARP for an announced VIP: verdict %d, want a redirect back out", ret)
	}
	a := out[14:]
	if !bytesEqual(out[0:6], peer) || !bytesEqual(out[6:12], mac) || binary.BigEndian.Uint16(a[6:]) != 2 ||
		!bytesEqual(a[8:14], mac) || netip.AddrFrom4([4]byte(a[14:18])) != vip4 ||
		!bytesEqual(a[18:24], peer) || netip.AddrFrom4([4]byte(a[24:28])) != client4 {
		t.Errorf("ARP reply % x", out[:42])
	}

	ret, out = runUnderlay(t, d, neighbourSolicitation(client6, vip6, peer))
	if ret != actRedirect {
		t.Fatalf("NS for an announced VIP: verdict %d, want a redirect back out", ret)
	}
	ip, na := out[14:54], out[54:86]
	if !bytesEqual(out[0:6], peer) || !bytesEqual(out[6:12], mac) || ip[7] != 255 ||
		netip.AddrFrom16([16]byte(ip[8:24])) != vip6 || netip.AddrFrom16([16]byte(ip[24:40])) != client6 ||
		na[0] != 136 || na[4] != 0x60 || netip.AddrFrom16([16]byte(na[8:24])) != vip6 || na[24] != 2 || !bytesEqual(na[26:32], mac) {
		t.Errorf("neighbour advertisement % x", out[:86])
	}
	// The ICMPv6 checksum (pseudo header included) verifies.
	var sum uint32
	for _, b := range [][]byte{ip[8:40], na} {
		for i := 0; i+1 < len(b); i += 2 {
			sum += uint32(binary.BigEndian.Uint16(b[i:]))
		}
	}
	sum += 32 + 58
	for sum > 0xffff {
		sum = sum&0xffff + sum>>16
	}
	if sum != 0xffff {
		t.Errorf("NA checksum does not verify: %#x", sum)
	}

	for _, c := range []struct {
		name string
		pkt  []byte
	}{
		{"ARP for another address", arpRequest(peer, client4, netip.MustParseAddr("172.31.0.241"))},
		{"gratuitous ARP of the VIP by another host", arpRequest(peer, vip4, vip4)},
		{"duplicate address detection", neighbourSolicitation(netip.IPv6Unspecified(), vip6, peer)},
	} {
		if ret, _ := runUnderlay(t, d, c.pkt); ret != actOK {
			t.Errorf("%s: verdict %d, want it passed to the host", c.name, ret)
		}
	}
	// Withdrawn, then lapsed: nobody answers.
	if err := d.SetAnnounced([]netip.Addr{vip6}, mac, time.Minute); err != nil {
		t.Fatal(err)
	}
	if ret, _ := runUnderlay(t, d, arpRequest(peer, client4, vip4)); ret != actOK {
		t.Errorf("ARP for a withdrawn VIP: verdict %d, want it passed to the host", ret)
	}
	if err := d.SetAnnounced([]netip.Addr{vip6}, mac, 0); err != nil {
		t.Fatal(err)
	}
	if ret, _ := runUnderlay(t, d, neighbourSolicitation(client6, vip6, peer)); ret != actOK {
		t.Errorf("NS for a lapsed VIP: verdict %d, want it passed to the host", ret)
	}
	if got, err := d.Announced(); err != nil || len(got) != 0 {
		t.Errorf("Announced() = %v, %v after the entry lapsed", got, err)
	}
}

// TestSetAnnouncedNeverWaitsForSyncs: the announcer renews its entries
// while a sync holds the other tables (a burst of pods held them for
// seconds, the announcer's tick waited, its Lease lapsed and the VIP
// moved to another node and back).
func TestSetAnnouncedNeverWaitsForSyncs(t *testing.T) {
	d := progDatapath(t)
	d.tab.mu.Lock()
	defer d.tab.mu.Unlock()
	done := make(chan error, 1)
	go func() {
		done <- d.SetAnnounced([]netip.Addr{netip.MustParseAddr("172.31.0.240")}, net.HardwareAddr{2, 0, 0, 0, 0, 0x0b}, time.Second)
	}()
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("SetAnnounced waited for the tables' lock a sync holds")
	}
}

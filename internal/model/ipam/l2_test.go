package ipam

import (
	"net"
	"net/netip"
	"testing"
)

func TestL2AssignableSkipsNetworkGatewayBroadcast(t *testing.T) {
	p := netip.MustParsePrefix("10.50.0.0/29")
	var got []string
	for a, ok := L2Next(p, netip.Addr{}); ok; a, ok = L2Next(p, a) {
		got = append(got, a.String())
	}
	want := []string{"10.50.0.2", "10.50.0.3", "10.50.0.4", "10.50.0.5", "10.50.0.6"}
	if len(got) != len(want) {
		t.Fatalf("assignable %v, want %v", got, want)
	}
	for i := range want {
		if got[i] != want[i] {
			t.Fatalf("assignable %v, want %v", got, want)
		}
	}
	if c := L2Capacity(p); c != 5 {
		t.Errorf("capacity %d, want 5", c)
	}
	if L2Gateway(p).String() != "10.50.0.1" {
		t.Errorf("gateway %s", L2Gateway(p))
	}
	p6 := netip.MustParsePrefix("fd00:50::/126")
	var got6 []string
	for a, ok := L2Next(p6, netip.Addr{}); ok; a, ok = L2Next(p6, a) {
		got6 = append(got6, a.String())
	}
	if len(got6) != 2 || got6[0] != "fd00:50::2" || got6[1] != "fd00:50::3" || L2Capacity(p6) != 2 {
		t.Errorf("IPv6 assignable %v capacity %d, want [fd00:50::2 fd00:50::3] 2", got6, L2Capacity(p6))
	}
	if L2Capacity(netip.MustParsePrefix("fd00::/64")) != 1<<31-1 {
		t.Error("a /64's capacity is not saturated")
	}
}

func TestL2MACAndNames(t *testing.T) {
	a := netip.MustParseAddr("10.50.0.5")
	if m := L2MAC(a, 0).String(); m != "0a:58:0a:32:00:05" {
		t.Errorf("MAC of %s: %s", a, m)
	}
	if m := L2MAC(a, 1).String(); m != "0a:58:0a:32:00:04" {
		t.Errorf("salted MAC of %s: %s", a, m)
	}
	if m := L2MAC(netip.MustParseAddr("fd00:50::1:2"), 0).String(); m != "0a:59:00:01:00:02" {
		t.Errorf("IPv6 MAC: %s", m)
	}
	if g := L2GatewayMAC(258).String(); g != "0a:5a:00:00:01:02" {
		t.Errorf("gateway MAC: %s", g)
	}
	if n := NeighborName("storage", a); n != "storage.v4-0a320005" {
		t.Errorf("neighbor name %s", n)
	}
	if n := NeighborName("storage", netip.MustParseAddr("fd00:50::2")); n != "storage.v6-fd000050000000000000000000000002" {
		t.Errorf("neighbor name %s", n)
	}
	if n := FDBEntryName("storage", L2MAC(a, 0)); n != "storage.0a580a320005" {
		t.Errorf("FDB name %s", n)
	}
}

func TestL2Claimable(t *testing.T) {
	for mac, want := range map[string]bool{
		"52:54:00:12:34:56": true, "02:00:00:00:00:42": true, "0a:57:ff:00:00:01": true, "0a:5b:00:00:00:01": true,
		"0a:58:0a:32:00:05": false, "0a:59:00:00:00:05": false, "0a:5a:00:00:00:07": false, // derived: endpoints', the gateway's
		"01:00:5e:00:00:01": false, "ff:ff:ff:ff:ff:ff": false, "00:00:00:00:00:00": false,
	} {
		m, _ := net.ParseMAC(mac)
		if got := L2Claimable(m); got != want {
			t.Errorf("L2Claimable(%s) = %v, want %v", mac, got, want)
		}
	}
}

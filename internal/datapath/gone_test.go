package datapath

import (
	"net/netip"
	"testing"

	"golang.org/x/sys/unix"
)

// TestGoneWalks: only what FlushServiceFlows forgets flows of makes it
// walk the maps; TCP endpoints that only left the backends keep theirs.
func TestGoneWalks(t *testing.T) {
	vip := netip.MustParseAddr("10.96.0.1")
	ep := []Backend{{Addr: netip.MustParseAddr("10.1.0.1"), Port: 80}}
	tcp, udp := ServiceKey{VIP: vip, Proto: unix.IPPROTO_TCP, Port: 80}, ServiceKey{VIP: vip, Proto: unix.IPPROTO_UDP, Port: 53}
	for _, c := range []struct {
		name string
		g    Gone
		want bool
	}{
		{"nothing", Gone{}, false},
		{"a TCP endpoint not ready", Gone{Left: map[ServiceKey][]Backend{tcp: ep}}, false},
		{"a UDP endpoint not ready", Gone{Left: map[ServiceKey][]Backend{udp: ep}}, true},
		{"a TCP endpoint gone from the slices", Gone{Unlisted: map[ServiceKey][]Backend{tcp: ep}}, true},
		{"every endpoint listed (a restart's sweep)", Gone{Listed: map[ServiceKey][]Backend{}}, true},
	} {
		if got := c.g.Walks(); got != c.want {
			t.Errorf("%s: Walks() = %v, want %v", c.name, got, c.want)
		}
	}
}

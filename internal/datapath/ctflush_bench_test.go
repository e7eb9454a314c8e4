package datapath

import (
	"fmt"
	"net/netip"
	"testing"

	"golang.org/x/sys/unix"
)

// BenchmarkFlushServiceFlows measures the sync's cost of an endpoint that
// left its service (a UDP one not ready, or any unlisted) on a node
// holding flows flows: the flush walks every conntrack map, so an
// endpoint change on a busy node costs what the node's flows are.
// go test ./internal/datapath -run XXX -bench FlushServiceFlows (root).
func BenchmarkFlushServiceFlows(b *testing.B) {
	for _, flows := range []int{1000, 1000000} {
		b.Run(fmt.Sprintf("flows=%d", flows), func(b *testing.B) {
			d := benchDatapathWith(b, LoadOptions{Sizes: MapSizes{Conntrack: uint32(flows + flows/8)}})
			// Pods' established flows to a VIP, translated to endpoints
			// that stay.
			keys := make([]podCtKey, 0, 10000)
			vals := make([]podCtVal, 0, 10000)
			vip := netip.MustParseAddr("10.96.0.1")
			for i := range flows {
				var k podCtKey
				k.NetId, k.Family, k.Proto = 1, 4, unix.IPPROTO_UDP
				k.Lport, k.Rport = htons(uint16(i)), htons(53)
				ip := netip.AddrFrom4([4]byte{10, 1, byte(i >> 16), byte(i >> 8)}).As4()
				copy(k.Laddr[:], ip[:])
				v4 := vip.As4()
				copy(k.Raddr[:], v4[:])
				var v podCtVal
				v.Flags = ctOriginLocal | ctService
				ep := netip.AddrFrom4([4]byte{10, 2, 0, byte(i % 10)}).As4()
				copy(v.NatAddr[:], ep[:])
				v.NatPort, v.Expires = htons(53), ^uint64(0)
				keys, vals = append(keys, k), append(vals, v)
				if len(keys) == cap(keys) || i == flows-1 {
					if _, err := d.pod.LaceCt.BatchUpdate(keys, vals, nil); err != nil {
						b.Fatal(err)
					}
					keys, vals = keys[:0], vals[:0]
				}
			}
			gone := Gone{Left: map[ServiceKey][]Backend{
				{VIP: vip, Proto: unix.IPPROTO_UDP, Port: 53}: {{Addr: netip.MustParseAddr("10.2.0.99"), Port: 53}}}}
			b.ResetTimer()
			for range b.N {
				if _, err := d.FlushServiceFlows(gone); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

package datapath

import (
	"net/netip"
	"testing"

	"github.com/lace-cni/lace/internal/tables"
)

// BenchmarkServicesApplyOneChange: one endpoint of one of 10,000 services
// (10 backends each) changes and the desired list is applied, as the
// agent's sync hands it over after an EndpointSlice change. The
// unchanged services' backends share their arrays with the previous
// list, as the agent's merge of its cached results does.
func BenchmarkServicesApplyOneChange(b *testing.B) {
	const n, eps = 10000, 10
	d := benchDatapath(b)
	t := NewServiceTable(d)
	want := make([]Service, n)
	for i := range want {
		s := &want[i]
		s.VIP = netip.AddrFrom4([4]byte{10, 96, byte(i >> 8), byte(i)})
		s.Proto, s.Port, s.NetID = 6, 80, 1
		for j := range eps {
			k := i*eps + j
			s.Backends = append(s.Backends, tables.Backend{Addr: netip.AddrFrom4([4]byte{10, byte(100 + k>>16), byte(k >> 8), byte(k)}), Port: 8080})
		}
	}
	if _, err := t.Apply(want); err != nil {
		b.Fatal(err)
	}
	// whole: the table walks every frontend; keys: it is told which one
	// changed (ApplyKeys), as the agent's patched merge tells it.
	for _, keyed := range []bool{false, true} {
		b.Run(map[bool]string{false: "whole", true: "keys"}[keyed], func(b *testing.B) {
			b.ReportAllocs()
			for i := range b.N {
				b.StopTimer()
				next := make([]Service, n)
				copy(next, want)
				s := &next[i%n]
				s.Backends = append([]tables.Backend(nil), s.Backends...)
				s.Backends[0].Port = uint16(8081 + i%2)
				b.StartTimer()
				var err error
				if keyed {
					_, err = t.ApplyKeys(next, []ServiceKey{s.Key()})
				} else {
					_, err = t.Apply(next)
				}
				if err != nil {
					b.Fatal(err)
				}
				want = next
			}
		})
	}
}

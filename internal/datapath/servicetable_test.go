package datapath

import (
	"cmp"
	"math/rand"
	"net/netip"
	"reflect"
	"slices"
	"testing"

	"github.com/cilium/ebpf"
)

// TestServiceTableMatchesReadBack: a ServiceTable kept across applies
// writes the maps exactly as applying each desired state against the maps
// read back does (ApplyServices), reports the same endpoints gone, and a
// new table (an agent restart) adopts what the maps hold: over random
// changes of services, backends, counts, networks, drop flags and
// affinity, including large batches.
func TestServiceTableMatchesReadBack(t *testing.T) {
	kept, fresh := progDatapath(t), progDatapath(t)
	table := NewServiceTable(kept)
	rng := rand.New(rand.NewSource(7))
	backend := func() Backend {
		return Backend{Addr: netip.AddrFrom4([4]byte{10, 1, byte(rng.Intn(4)), byte(rng.Intn(8))}), Port: uint16(8080 + rng.Intn(2))}
	}
	backend6 := func() Backend {
		return Backend{Addr: netip.AddrFrom16([16]byte{0xfd, 0, 0, 1, 14: byte(rng.Intn(4)), 15: byte(rng.Intn(8))}), Port: 8080}
	}
	svc := func(i int) Service {
		s := Service{VIP: netip.AddrFrom4([4]byte{10, 96, byte(i >> 8), byte(i)}), Proto: 6, Port: 80, NetID: uint32(1 + rng.Intn(2))}
		if i%5 == 0 {
			s.VIP = netip.AddrFrom16([16]byte{0xfd, 0, 0, 0x96, 14: byte(i >> 8), 15: byte(i)})
		}
		seen := map[Backend]bool{}
		for range rng.Intn(6) {
			b := backend()
			if s.VIP.Is6() {
				b = backend6()
			}
			if !seen[b] {
				seen[b] = true
				s.Backends = append(s.Backends, b)
			}
		}
		s.Drop = len(s.Backends) == 0 && rng.Intn(2) == 0
		if rng.Intn(4) == 0 {
			s.AffinitySeconds = uint32(60 * (1 + rng.Intn(2)))
		}
		return s
	}
	var want []Service
	at := map[netip.Addr]int{}
	for round := range 40 {
		switch {
		case round == 5:
			// Thousands at once: batches of several syscalls.
			for i := range 9000 {
				s := svc(i)
				if j, ok := at[s.VIP]; ok {
					want[j] = s
				} else {
					at[s.VIP] = len(want)
					want = append(want, s)
				}
			}
		case round == 20:
			want = want[:10] // most go at once
		case round == 30:
			table = NewServiceTable(kept) // a restarted agent
		default:
			for range 1 + rng.Intn(20) {
				i := rng.Intn(300)
				if j := slices.IndexFunc(want, func(s Service) bool { return s.VIP == svc(i).VIP }); j >= 0 {
					if rng.Intn(3) == 0 {
						want = slices.Delete(want, j, j+1)
					} else {
						want[j] = svc(i)
					}
				} else {
					want = append(want, svc(i))
				}
			}
		}
		clear(at)
		for i, s := range want {
			at[s.VIP] = i
		}
		// Each round hands over a desired state of its own, as the agent
		// does: the table keeps its backends.
		cur := make([]Service, len(want))
		for i, s := range want {
			s.Backends = slices.Clone(s.Backends)
			cur[i] = s
		}
		gotGone, err := table.Apply(cur)
		if err != nil {
			t.Fatalf("round %d: table: %v", round, err)
		}
		wantGone, err := fresh.ApplyServices(cur)
		if err != nil {
			t.Fatalf("round %d: read back: %v", round, err)
		}
		if !reflect.DeepEqual(sortedGone(gotGone.Left), sortedGone(wantGone.Left)) ||
			!reflect.DeepEqual(sortedGone(gotGone.Unlisted), sortedGone(wantGone.Unlisted)) {
			t.Fatalf("round %d: gone %v, want %v", round, gotGone, wantGone)
		}
		got, err := kept.Services()
		if err != nil {
			t.Fatalf("round %d: %v", round, err)
		}
		ref, err := fresh.Services()
		if err != nil {
			t.Fatalf("round %d: %v", round, err)
		}
		if !reflect.DeepEqual(sortServices(got), sortServices(ref)) || !reflect.DeepEqual(sortServices(got), sortServices(slices.Clone(cur))) {
			t.Fatalf("round %d: the maps hold %d services, the read-back path %d, want %d", round, len(got), len(ref), len(cur))
		}
		if n := countEntries(t, kept); n != countEntries(t, fresh) {
			t.Fatalf("round %d: %d backends, the read-back path %d", round, n, countEntries(t, fresh))
		}
		if sizes, err := kept.MapSizes(); err != nil || sizes["services"] != len(cur) || sizes["backends"] != countEntries(t, kept) ||
			sizes["networks"] != 1 || sizes["routes"] != iterCount(t, kept.pod.LaceRoutes) {
			t.Fatalf("round %d: map sizes %v (%v), want %d services", round, sizes, err, len(cur))
		}
	}
}

func countEntries(t *testing.T, d *Datapath) int {
	t.Helper()
	n := 0
	if err := readMap(d.pod.LaceBackends, func(podBackendKey, podBackendVal) { n++ }); err != nil {
		t.Fatal(err)
	}
	return n
}

func iterCount(t *testing.T, m *ebpf.Map) int {
	t.Helper()
	n := 0
	var k, v []byte
	it := m.Iterate()
	for it.Next(&k, &v) {
		n++
	}
	if err := it.Err(); err != nil {
		t.Fatal(err)
	}
	return n
}

func sortServices(s []Service) []Service {
	for i := range s {
		if len(s[i].Backends) == 0 {
			s[i].Backends = nil
		}
	}
	slices.SortFunc(s, func(a, b Service) int {
		return cmp.Or(a.VIP.Compare(b.VIP), cmp.Compare(a.Proto, b.Proto), cmp.Compare(a.Port, b.Port))
	})
	return s
}

func sortedGone(g map[ServiceKey][]Backend) map[ServiceKey][]Backend {
	out := map[ServiceKey][]Backend{}
	for k, bs := range g {
		bs = slices.Clone(bs)
		slices.SortFunc(bs, func(a, b Backend) int { return cmp.Or(a.Addr.Compare(b.Addr), cmp.Compare(a.Port, b.Port)) })
		if len(bs) == 0 {
			bs = nil
		}
		out[k] = bs
	}
	return out
}

package ipam

import (
	"net/netip"
	"testing"
)

func TestBlocks(t *testing.T) {
	for _, tc := range []struct {
		pool  Pool
		i     uint64
		block string
		cap   uint64
	}{
		{MustPool("10.40.0.0/16", 24), 0, "10.40.0.0/24", 256},
		{MustPool("10.40.0.0/16", 24), 255, "10.40.255.0/24", 256},
		{MustPool("10.0.0.0/24", 26), 3, "10.0.0.192/26", 4},
		{MustPool("fd00:40::/48", 64), 0x1234, "fd00:40:0:1234::/64", 1 << 16},
		{MustPool("fd1a:ce::/48", 64), 1, "fd1a:ce:0:1::/64", 1 << 16},
		{MustPool("fd00::/8", 120), 5, "fd00::500/120", ^uint64(0)},
	} {
		got := tc.pool.Block(tc.i)
		if got.String() != tc.block {
			t.Errorf("%v block %d = %s, want %s", tc.pool, tc.i, got, tc.block)
		}
		if idx, ok := tc.pool.Index(got); !ok || idx != tc.i {
			t.Errorf("%v index of %s = %d,%v, want %d", tc.pool, got, idx, ok, tc.i)
		}
		if c := tc.pool.Capacity(); c != tc.cap {
			t.Errorf("%v capacity %d, want %d", tc.pool, c, tc.cap)
		}
	}
}

func TestIndexRejectsForeignPrefixes(t *testing.T) {
	p := MustPool("10.40.0.0/16", 24)
	for _, s := range []string{"10.41.0.0/24", "10.40.0.0/25", "10.40.0.128/24", "fd00::/24"} {
		pfx, err := netip.ParsePrefix(s)
		if err != nil {
			t.Fatal(err)
		}
		if _, ok := p.Index(pfx); ok {
			t.Errorf("%s accepted as a block of %v", s, p)
		}
	}
}

func TestLowestFree(t *testing.T) {
	p := MustPool("10.0.0.0/24", 26)
	used := map[uint64]bool{0: true, 2: true}
	if i, ok := p.LowestFree(used); !ok || i != 1 {
		t.Fatalf("lowest free = %d,%v, want 1", i, ok)
	}
	used[1], used[3] = true, true
	if _, ok := p.LowestFree(used); ok {
		t.Fatal("a full pool reported a free block")
	}
	if _, err := NewPool(netip.MustParsePrefix("10.0.0.0/24"), 16); err == nil {
		t.Fatal("a block larger than the pool was accepted")
	}
}

func TestNextID(t *testing.T) {
	if id, ok := NextID(nil, 10); !ok || id != 1 {
		t.Fatalf("first id = %d,%v", id, ok)
	}
	if id, _ := NextID(map[int32]bool{1: true, 5: true}, 10); id != 6 {
		t.Fatalf("after 5 got %d, want 6", id)
	}
	if id, _ := NextID(map[int32]bool{2: true, 10: true}, 10); id != 1 {
		t.Fatalf("wrap got %d, want 1", id)
	}
	full := map[int32]bool{}
	for i := int32(1); i <= 3; i++ {
		full[i] = true
	}
	if _, ok := NextID(full, 3); ok {
		t.Fatal("full id space reported a free id")
	}
}

// Package ipam is the pure arithmetic of Lace's address management: cutting
// a prefix into equal blocks, naming block i, finding which block holds a
// prefix, and choosing the lowest free block. It does no I/O and knows
// nothing of Kubernetes; the controller decides what "used" means.
package ipam

import (
	"fmt"
	"math"
	"math/big"
	"net/netip"
	"sort"
)

// Pool is a prefix cut into blocks of BlockLen bits.
type Pool struct {
	Prefix   netip.Prefix
	BlockLen int
}

// NewPool validates that blocks of blockLen fit in prefix.
func NewPool(prefix netip.Prefix, blockLen int) (Pool, error) {
	if !prefix.IsValid() {
		return Pool{}, fmt.Errorf("invalid prefix")
	}
	prefix = prefix.Masked()
	if blockLen < prefix.Bits() || blockLen > prefix.Addr().BitLen() {
		return Pool{}, fmt.Errorf("block length /%d does not fit in %s", blockLen, prefix)
	}
	return Pool{Prefix: prefix, BlockLen: blockLen}, nil
}

// MustPool is NewPool for constants known to be valid.
func MustPool(prefix string, blockLen int) Pool {
	p, err := NewPool(netip.MustParsePrefix(prefix), blockLen)
	if err != nil {
		panic(err)
	}
	return p
}

// Capacity is the number of blocks, saturated at math.MaxUint64.
func (p Pool) Capacity() uint64 {
	bits := p.BlockLen - p.Prefix.Bits()
	if bits >= 64 {
		return math.MaxUint64
	}
	return 1 << bits
}

// Capacity32 is Capacity saturated at math.MaxInt32, for status fields.
func (p Pool) Capacity32() int32 {
	if c := p.Capacity(); c < math.MaxInt32 {
		return int32(c)
	}
	return math.MaxInt32
}

// Block returns block i. It panics when i is out of range: callers choose i
// from LowestFree or Index.
func (p Pool) Block(i uint64) netip.Prefix {
	if i >= p.Capacity() {
		panic(fmt.Sprintf("block %d out of range for %s/%d", i, p.Prefix, p.BlockLen))
	}
	width := p.Prefix.Addr().BitLen()
	base := new(big.Int).SetBytes(p.Prefix.Addr().AsSlice())
	off := new(big.Int).Lsh(new(big.Int).SetUint64(i), uint(width-p.BlockLen))
	sum := base.Add(base, off).Bytes()
	buf := make([]byte, width/8)
	copy(buf[len(buf)-len(sum):], sum)
	addr, _ := netip.AddrFromSlice(buf)
	return netip.PrefixFrom(addr, p.BlockLen)
}

// Index returns the index of block b, and false when b is not exactly one
// block of the pool.
func (p Pool) Index(b netip.Prefix) (uint64, bool) {
	if b.Bits() != p.BlockLen || b.Addr().BitLen() != p.Prefix.Addr().BitLen() ||
		!p.Prefix.Contains(b.Addr()) || b.Masked() != b {
		return 0, false
	}
	width := p.Prefix.Addr().BitLen()
	diff := new(big.Int).Sub(new(big.Int).SetBytes(b.Addr().AsSlice()), new(big.Int).SetBytes(p.Prefix.Addr().AsSlice()))
	diff.Rsh(diff, uint(width-p.BlockLen))
	if !diff.IsUint64() {
		return 0, false
	}
	return diff.Uint64(), true
}

// LowestFree returns the lowest block index not in used, and false when
// every block is used.
func (p Pool) LowestFree(used map[uint64]bool) (uint64, bool) {
	// The answer is at most len(used): scanning that far is enough.
	limit := p.Capacity()
	for i := uint64(0); i < limit; i++ {
		if !used[i] {
			return i, true
		}
	}
	return 0, false
}

// Contains reports whether a lies in the pool.
func (p Pool) Contains(a netip.Addr) bool { return p.Prefix.Contains(a) }

// String is prefix/blockLen, for messages.
func (p Pool) String() string { return fmt.Sprintf("%s (blocks /%d)", p.Prefix, p.BlockLen) }

// Family is "IPv4" or "IPv6".
func Family(a netip.Addr) string {
	if a.Is4() {
		return "IPv4"
	}
	return "IPv6"
}

// SortedIndices returns the keys of used in ascending order.
func SortedIndices(used map[uint64]bool) []uint64 {
	out := make([]uint64, 0, len(used))
	for i := range used {
		out = append(out, i)
	}
	sort.Slice(out, func(a, b int) bool { return out[a] < out[b] })
	return out
}

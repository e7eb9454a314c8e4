package model

import (
	"fmt"
	"hash/fnv"
	"math/big"
	"net/netip"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
)

// LBAvoid is what a pool never hands out, whatever its ranges say.
type LBAvoid struct {
	// Reserved: node addresses, the API server's, pod subnets, service
	// ranges (ReservedFor). A load balancer address there would be
	// translated for the node's own sockets too (the kubelet's port on a
	// node address answered by a tenant's pods), so a pool address in
	// them is neither handed out nor kept.
	Reserved []netip.Prefix
	// AllowedExternalIPs: the operator's allow-list. An address another
	// Service names as an admitted external IP is not handed out (a load
	// balancer address would take it from that Service, which had it
	// first); one already held is kept (the external IP is the newcomer
	// then, and is reported contested).
	AllowedExternalIPs []netip.Prefix
}

// Reasons of a class's AddressesExcluded condition.
const (
	LBConditionAddressesExcluded = "AddressesExcluded"
	LBReasonReservedOverlap      = "ReservedOverlap"
	LBReasonNoneExcluded         = "NoneExcluded"
)

// externalIPClaims maps the admitted external IPs of every Service to the
// first Service (namespace/name) naming each.
func externalIPClaims(svcs []corev1.Service, avoid LBAvoid) map[netip.Addr]string {
	if len(avoid.AllowedExternalIPs) == 0 {
		return nil
	}
	out := map[netip.Addr]string{}
	for i := range svcs {
		s := &svcs[i]
		for _, x := range s.Spec.ExternalIPs {
			a, ok := parseSloppyIP(x)
			if !ok {
				continue
			}
			if r, _ := admitExternalIP(a, avoid.Reserved, avoid.AllowedExternalIPs); r == "" && out[a] == "" {
				out[a] = s.Namespace + "/" + s.Name
			}
		}
	}
	return out
}

// reservedIn says which reserved prefix holds a ("" when none).
func reservedIn(a netip.Addr, reserved []netip.Prefix) string {
	if i := slices.IndexFunc(reserved, func(p netip.Prefix) bool { return p.Contains(a) }); i >= 0 {
		return reserved[i].String()
	}
	return ""
}

// excludedFrom describes what of the class's ranges is never handed out:
// the reserved prefixes and other Services' external IPs inside them ("":
// nothing).
func excludedFrom(c *lbClass, avoid LBAvoid, xips map[netip.Addr]string) string {
	var parts []string
	for _, p := range avoid.Reserved {
		cut := IPRange{First: p.Masked().Addr(), Last: lastOf(p.Masked())}
		if slices.ContainsFunc(c.ranges, cut.overlaps) {
			parts = append(parts, p.String()+" (reserved: a node or API server address, pod subnet or service range)")
		}
	}
	var xs []netip.Addr
	for a := range xips {
		if inPool(c, a) {
			xs = append(xs, a)
		}
	}
	slices.SortFunc(xs, netip.Addr.Compare)
	for _, a := range xs {
		parts = append(parts, a.String()+" (external IP of "+xips[a]+")")
	}
	if len(parts) == 0 {
		return ""
	}
	return "addresses of the pool never handed out: " + strings.Join(parts, ", ")
}

// carve is the ranges less the reserved prefixes.
func carve(rs []IPRange, reserved []netip.Prefix) []IPRange {
	out := slices.Clone(rs)
	for _, p := range reserved {
		p = p.Masked()
		cut := IPRange{First: p.Addr(), Last: lastOf(p)}
		var next []IPRange
		for _, r := range out {
			if !r.overlaps(cut) {
				next = append(next, r)
				continue
			}
			if r.First.Less(cut.First) {
				next = append(next, IPRange{First: r.First, Last: cut.First.Prev()})
			}
			if cut.Last.Less(r.Last) {
				next = append(next, IPRange{First: cut.Last.Next(), Last: r.Last})
			}
		}
		out = next
	}
	return out
}

func addrInt(a netip.Addr) *big.Int { return new(big.Int).SetBytes(a.AsSlice()) }

func intAddr(i *big.Int, v4 bool) netip.Addr {
	n := 16
	if v4 {
		n = 4
	}
	b := make([]byte, n)
	i.FillBytes(b)
	a, _ := netip.AddrFromSlice(b)
	return a
}

// allocSeed is where in the pool a Service's search for a free address
// starts: a hash of its UID (which the API server makes up at creation)
// and family. A tenant cannot walk to a chosen address by creating and
// deleting Services in order, as it could when every new Service got the
// lowest free address; it can only retry at random. A Service with no UID
// (never one from the API server) starts at the pool's first address.
func allocSeed(s *corev1.Service, v4 bool) uint64 {
	if s.UID == "" {
		return 0
	}
	h := fnv.New64a()
	h.Write([]byte(s.UID))
	if v4 {
		h.Write([]byte{4})
	} else {
		h.Write([]byte{6})
	}
	return h.Sum64()
}

// pickFree is a free address of the family in the class's ranges less the
// reserved ones: the first one nobody holds or names as an external IP,
// from the seed's place in the pool on (wrapping). Taken addresses are
// few (one per Service and family, and the external IPs), so the search
// looks at no more than that many plus one.
func pickFree(c *lbClass, v4 bool, seed uint64, reserved []netip.Prefix, taken func(netip.Addr) bool, takenCount int) (netip.Addr, bool) {
	var free []IPRange
	for _, r := range carve(c.ranges, reserved) {
		if r.First.Is4() == v4 {
			free = append(free, r)
		}
	}
	if len(free) == 0 {
		return netip.Addr{}, false
	}
	one := big.NewInt(1)
	sizes := make([]*big.Int, len(free))
	total := new(big.Int)
	for i, r := range free {
		sizes[i] = new(big.Int).Sub(addrInt(r.Last), addrInt(r.First))
		sizes[i].Add(sizes[i], one)
		total.Add(total, sizes[i])
	}
	off := new(big.Int).Mod(new(big.Int).SetUint64(seed), total)
	ri := 0
	for off.Cmp(sizes[ri]) >= 0 {
		off.Sub(off, sizes[ri])
		ri++
	}
	a := intAddr(off.Add(off, addrInt(free[ri].First)), v4)
	steps := takenCount + 1
	if total.IsInt64() && total.Int64() < int64(steps) {
		steps = int(total.Int64())
	}
	for range steps {
		if !taken(a) {
			return a, true
		}
		if a == free[ri].Last {
			ri = (ri + 1) % len(free)
			a = free[ri].First
		} else {
			a = a.Next()
		}
	}
	return netip.Addr{}, false
}

// avoidProblem says why a requested address of the pool cannot be handed
// out ("" when it can).
func avoidProblem(a netip.Addr, key string, avoid LBAvoid, xips map[netip.Addr]string) string {
	if p := reservedIn(a, avoid.Reserved); p != "" {
		return fmt.Sprintf("%s is reserved (in %s: a node or API server address, pod subnet or service range)", a, p)
	}
	if k := xips[a]; k != "" && k != key {
		return fmt.Sprintf("%s is an external IP of %s", a, k)
	}
	return ""
}

package netpol

import (
	"encoding/binary"
	"slices"
)

// entry is a verdict entry without its endpoint: local pods with the same
// rules (replicas) share one computation and differ only by ifindex.
type entry struct {
	key VerdictKey
	v   Verdict
}

// span is the ports lo..hi (inclusive; 32 bits so that 65535+1 does not
// wrap) that the rule at position attr of a matched-rule list matches.
type span struct {
	lo, hi uint32
	attr   int
}

var portProtos = [...]uint8{protoTCP, protoUDP, protoSCTP}

// emitVerdicts writes the endpoints and the verdicts of every local pod
// the data plane must look up.
func (c *compiler) emitVerdicts() {
	cache := map[string][]entry{}
	var key []byte
	for _, l := range c.locals {
		if l.lookup == 0 {
			continue
		}
		c.t.Endpoints[l.ifindex] = Endpoint{Lookup: l.lookup, Isolated: l.isolated, DenyIn: l.denyIn, DenyOut: l.denyOut}
		c.usePolicy(l.denyIn)
		c.usePolicy(l.denyOut)
		for _, d := range [...]Dir{Ingress, Egress} {
			if l.lookup&d == 0 {
				continue
			}
			key = c.entriesKey(key[:0], l, d)
			es, ok := cache[string(key)]
			if !ok {
				es = c.entries(l, d)
				cache[string(key)] = es
			}
			for _, e := range es {
				k := e.key
				k.Ifindex = l.ifindex
				c.t.Verdicts[k] = e.v
				c.usePolicy(e.v.Policy)
			}
		}
	}
}

func (c *compiler) usePolicy(id uint32) {
	if id == 0 {
		return
	}
	if _, ok := c.t.Policies[id]; !ok {
		c.t.Policies[id] = c.refs[id]
	}
}

// missVerdict is what a miss of l's lookup in direction d means, as an
// entry would spell it: a drop counted on the first isolating
// NetworkPolicy, or, not isolated, a pass decided by no policy.
func missVerdict(l *local, d Dir) Verdict {
	switch {
	case l.isolated&d == 0:
		return Verdict{Allow: true}
	case d == Ingress:
		return Verdict{Policy: l.denyIn}
	}
	return Verdict{Policy: l.denyOut}
}

// entriesKey is everything entries(l, d) depends on of l: what a miss
// means, its rules, and for ingress the resolution of their named ports on
// l's own pod.
func (c *compiler) entriesKey(dst []byte, l *local, d Dir) []byte {
	dst = append(dst, byte(d))
	dst = binary.BigEndian.AppendUint32(dst, missVerdict(l, d).Policy) // 0 iff not isolated
	list := l.rules[dirIndex(d)]
	for _, seq := range list {
		dst = binary.AppendUvarint(dst, uint64(seq))
	}
	if d != Ingress {
		return dst
	}
	dst = append(dst, 0xff)
	for _, seq := range list {
		for _, np := range c.rules[seq].named {
			ports := c.podPorts(l.pod)[np]
			dst = binary.AppendUvarint(dst, uint64(len(ports)))
			for _, p := range ports {
				dst = binary.BigEndian.AppendUint16(dst, p)
			}
		}
	}
	return dst
}

// entries computes l's verdict entries in direction d for every class.
func (c *compiler) entries(l *local, d Dir) []entry {
	matched := make([][]int, len(c.classes))
	for _, seq := range l.rules[dirIndex(d)] {
		if c.rules[seq].peerless {
			for ci := range matched {
				matched[ci] = append(matched[ci], seq)
			}
			continue
		}
		for _, ci := range c.classesOf[seq] {
			matched[ci] = append(matched[ci], seq)
		}
	}
	var out []entry
	var spans []span
	var cuts []uint32
	for ci, m := range matched {
		if len(m) > 0 {
			out = c.classEntries(out, &spans, &cuts, c.classes[ci], m, l, d)
		}
	}
	return out
}

// classEntries encodes as LPM entries what the rules m (seqs in evaluation
// order, all matching the class's peers) decide of every packet of l in
// direction d, wherever that differs from what a miss means.
//
// The decision is painted over the key space. First the protocols without
// ports (the key's proto 0 exists only at prefix 72): their decision, base,
// is that of the rules without protocols, and becomes the one prefix-72
// entry unless a miss means the same. Then, per port protocol, the ports
// are cut wherever some rule's ports start or end, each piece is decided,
// and the pieces decided otherwise than base are merged where the
// decision does not change and cut into maximal aligned blocks (one
// prefix-80 entry for all 65536 ports). So port entries never overlap one
// another; they overlap only the prefix-72 entry, which they must
// override (LPM makes the longer one win), and never repeat it.
func (c *compiler) classEntries(out []entry, spans *[]span, cuts *[]uint32, cl *class, m []int, l *local, d Dir) []entry {
	miss := missVerdict(l, d)
	isolated := l.isolated&d != 0
	s := c.spansOf((*spans)[:0], cl, m, l.pod, d, 0)
	base := c.decideSpans(s, m, 0, isolated, miss)
	if base != miss {
		out = append(out, entry{key: VerdictKey{Class: cl.id, Dir: d, PrefixLen: prefixAnyProto}, v: base})
	}
	for _, proto := range portProtos {
		s = c.spansOf(s[:0], cl, m, l.pod, d, proto)
		if len(s) == 0 {
			continue // no rule matches: a miss, and so is base (a rule without protocols spans every protocol)
		}
		cs := append((*cuts)[:0], 0, 65536)
		for _, sp := range s {
			cs = append(cs, sp.lo, sp.hi+1)
		}
		slices.Sort(cs)
		cs = slices.Compact(cs)
		*cuts = cs
		var run struct {
			lo, hi uint32
			v      Verdict
			open   bool
		}
		flush := func() {
			for lo := run.lo; run.open && lo <= run.hi; {
				port, k, size := alignedBlock(lo, run.hi)
				out = append(out, entry{
					key: VerdictKey{Class: cl.id, Dir: d, Proto: proto, Port: port, PrefixLen: uint8(prefixAnyPort + k)},
					v:   run.v,
				})
				lo += size
			}
			run.open = false
		}
		for i := 0; i+1 < len(cs); i++ {
			lo, hi := cs[i], cs[i+1]-1
			v := c.decideSpans(s, m, lo, isolated, miss)
			switch {
			case v == base:
				flush()
			case run.open && run.v == v && run.hi+1 == lo:
				run.hi = hi
			default:
				flush()
				run.lo, run.hi, run.v, run.open = lo, hi, v, true
			}
		}
		flush()
	}
	*spans = s
	return out
}

// spansOf appends the ports of protocol proto (0: a protocol without
// ports) that each rule of m matches. A rule without protocols matches
// every port of every protocol; a named port is the subject's own on
// ingress, the peer's (which the class carries) on egress.
func (c *compiler) spansOf(dst []span, cl *class, m []int, subject *Pod, d Dir, proto uint8) []span {
	passes := false
	for i, seq := range m {
		r := c.rules[seq]
		if r.allPorts {
			dst = append(dst, span{lo: 0, hi: 65535, attr: i})
			// A rule deciding every packet that reaches it hides the rest,
			// unless it is an Admin one and an earlier Pass can skip it.
			if r.tier != TierAdmin || (r.action != ActionPass && !passes) {
				break
			}
		}
		if r.tier == TierAdmin && r.action == ActionPass {
			passes = true
		}
		if r.allPorts || proto == 0 {
			continue
		}
		if proto == 0 {
			continue
		}
		for _, pr := range r.ports {
			if pr.proto == proto {
				dst = append(dst, span{lo: uint32(pr.lo), hi: uint32(pr.hi), attr: i})
			}
		}
		for _, np := range r.named {
			if np.proto != proto {
				continue
			}
			ports := cl.named[np]
			if d == Ingress {
				ports = c.podPorts(subject)[np]
			}
			for _, p := range ports {
				dst = append(dst, span{lo: uint32(p), hi: uint32(p), attr: i})
			}
		}
	}
	return dst
}

// decideSpans is the tiers' decision on port x of the spans' protocol:
// the first Admin rule matching decides unless it passes (which skips the
// other Admin rules); then, isolated, the first NetworkPolicy rule
// matching allows, or nothing does and it is a miss; not isolated, the
// first Baseline rule matching decides, a Pass leaving it undecided.
func (c *compiler) decideSpans(s []span, m []int, x uint32, isolated bool, miss Verdict) Verdict {
	passed := false
	for _, sp := range s {
		if x < sp.lo || x > sp.hi {
			continue
		}
		r := c.rules[m[sp.attr]]
		switch r.tier {
		case TierAdmin:
			if passed {
				continue
			}
			if r.action == ActionPass {
				passed = true
				continue
			}
		case tierNetworkPolicy:
			return Verdict{Policy: r.policy, Rule: uint16(r.index), Allow: true}
		case TierBaseline:
			if isolated {
				return miss
			}
			if r.action == ActionPass {
				return Verdict{Allow: true}
			}
		}
		return Verdict{Policy: r.policy, Rule: uint16(r.index), Allow: r.action == ActionAccept}
	}
	return miss
}

// alignedBlock is the largest block of ports starting at lo, aligned to its
// size and ending at or before hi: its first port, the number k of leading
// port bits it fixes (its entry's prefix length is 80+k) and its size.
func alignedBlock(lo, hi uint32) (port uint16, k int, size uint32) {
	s := 16
	for s > 0 && (lo&(1<<s-1) != 0 || lo+(1<<s)-1 > hi) {
		s--
	}
	return uint16(lo), 16 - s, 1 << s
}

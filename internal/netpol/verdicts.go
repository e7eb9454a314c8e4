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
// wrap) attributed to the rule at position attr of a matched-rule list.
type span struct {
	lo, hi uint32
	attr   int
}

var portProtos = [...]uint8{protoTCP, protoUDP, protoSCTP}

// emitVerdicts writes the endpoints and the verdicts of every isolated
// local pod.
func (c *compiler) emitVerdicts() {
	cache := map[string][]entry{}
	var key []byte
	for _, l := range c.locals {
		if l.isolated == 0 {
			continue
		}
		c.t.Endpoints[l.ifindex] = Endpoint{Isolated: l.isolated, DenyIn: l.denyIn, DenyOut: l.denyOut}
		c.usePolicy(l.denyIn)
		c.usePolicy(l.denyOut)
		for _, d := range [...]Dir{Ingress, Egress} {
			if l.isolated&d == 0 {
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

// entriesKey is everything entries(l, d) depends on of l: its rules, and
// for ingress the resolution of their named ports on l's own pod.
func (c *compiler) entriesKey(dst []byte, l *local, d Dir) []byte {
	dst = append(dst, byte(d))
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
	for ci, m := range matched {
		if len(m) > 0 {
			out = c.classEntries(out, &spans, c.classes[ci], m, l.pod, d)
		}
	}
	return out
}

// classEntries encodes what the rules m (seqs in attribution order, all
// matching the class's peers) allow as LPM entries.
//
// When some rule allows every protocol and port, one prefix-72 entry
// carries it; it is also the only way to allow a non-port protocol (the
// key's proto 0 exists only at prefix 72). Ports that an earlier rule
// allows are then refined by longer entries naming that earlier rule, so
// that every packet is attributed to the first rule allowing it: these are
// the only entries that overlap, and LPM makes the longer one win.
// Otherwise each protocol's allowed ports are split where the first
// allowing rule changes, merged where it does not, and each run is cut into
// maximal aligned blocks (one prefix-80 entry for all 65536 ports), none
// overlapping.
func (c *compiler) classEntries(out []entry, spans *[]span, cl *class, m []int, subject *Pod, d Dir) []entry {
	verdict := func(seq int) Verdict {
		r := c.rules[seq]
		return Verdict{Policy: r.policy, Rule: uint16(r.index), Allow: true}
	}
	limit := len(m)
	for i, seq := range m {
		if c.rules[seq].allPorts {
			limit = i
			out = append(out, entry{
				key: VerdictKey{Class: cl.id, Dir: d, PrefixLen: prefixAnyProto},
				v:   verdict(seq),
			})
			break
		}
	}
	for _, proto := range portProtos {
		s := (*spans)[:0]
		for i := range limit {
			r := c.rules[m[i]]
			for _, pr := range r.ports {
				if pr.proto == proto {
					s = append(s, span{lo: uint32(pr.lo), hi: uint32(pr.hi), attr: i})
				}
			}
			for _, np := range r.named {
				if np.proto != proto {
					continue
				}
				// Ingress: the port is the subject pod's own; egress: the
				// peer's, which the class carries.
				ports := cl.named[np]
				if d == Ingress {
					ports = c.podPorts(subject)[np]
				}
				for _, p := range ports {
					s = append(s, span{lo: uint32(p), hi: uint32(p), attr: i})
				}
			}
		}
		*spans = s
		for _, run := range firstCover(s) {
			v := verdict(m[run.attr])
			for lo := run.lo; lo <= run.hi; {
				port, k, size := alignedBlock(lo, run.hi)
				out = append(out, entry{
					key: VerdictKey{Class: cl.id, Dir: d, Proto: proto, Port: port, PrefixLen: uint8(prefixAnyPort + k)},
					v:   v,
				})
				lo += size
			}
		}
	}
	return out
}

// firstCover returns the ports covered by spans as disjoint ascending runs,
// each attributed to the lowest attr covering it, adjacent runs with the
// same attribution merged.
func firstCover(spans []span) []span {
	if len(spans) == 0 {
		return nil
	}
	cuts := make([]uint32, 0, 2*len(spans))
	for _, s := range spans {
		cuts = append(cuts, s.lo, s.hi+1)
	}
	slices.Sort(cuts)
	cuts = slices.Compact(cuts)
	var out []span
	for i := 0; i+1 < len(cuts); i++ {
		lo, hi := cuts[i], cuts[i+1]-1
		best := -1
		for _, s := range spans {
			if s.lo <= lo && hi <= s.hi && (best < 0 || s.attr < best) {
				best = s.attr
			}
		}
		if best < 0 {
			continue
		}
		if n := len(out); n > 0 && out[n-1].attr == best && out[n-1].hi+1 == lo {
			out[n-1].hi = hi
			continue
		}
		out = append(out, span{lo: lo, hi: hi, attr: best})
	}
	return out
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

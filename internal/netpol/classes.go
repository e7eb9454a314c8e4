package netpol

import (
	"cmp"
	"encoding/binary"
	"maps"
	"net/netip"
	"slices"

	"k8s.io/apimachinery/pkg/labels"
)

// class is one signature: what the verdict of a packet depends on, of its
// peer address. Two addresses with the same signature are decided alike
// for every local pod, so they share one class and the verdict table
// grows with the number of distinct signatures, not of addresses.
type class struct {
	id uint32
	// rules holds the seqs, ascending, of the rules with peers that match
	// the address (by pod selector or ipBlock). Peerless rules match every
	// address and so are left out: they cannot tell addresses apart.
	rules []int
	// named holds, for a pod address, the resolution on that pod of every
	// egress named port of a rule that can match it (one in rules, or a
	// peerless one); names that do not resolve are left out, as they match
	// nothing, exactly as on a non-pod address.
	named map[nameProto][]uint16
}

// hashClass turns a signature's stable encoding into a class id. It is a
// variable so that a test can force collisions.
var hashClass = func(data []byte) uint32 {
	h := uint32(fnvOffset32)
	for _, b := range data {
		h ^= uint32(b)
		h *= fnvPrime32
	}
	return h
}

// region is an emitted CIDR prefix and the signature of the addresses it
// is the longest emitted prefix of.
type region struct {
	prefix netip.Prefix
	rules  []int
}

// classify computes every class: those of the CIDR regions, then those of
// the pod addresses. Both walks are in a fixed order so that collision
// resolution, which depends on the order ids are taken in, is too.
func (c *compiler) classify() {
	c.classes = []*class{{id: 0}}
	c.classOf = map[string]int{}
	c.classIDs = map[uint32]int{0: 0}

	lpm := prefixTable{index: map[netip.Prefix]int{}}
	regions := c.regions()
	for i, rg := range regions {
		ci := c.intern(rg.rules, nil)
		c.t.CIDRs[rg.prefix] = c.classes[ci].id
		lpm.add(rg.prefix, i)
	}
	c.classifyPods(regions, &lpm)

	c.classesOf = make([][]int, len(c.rules))
	for ci, cl := range c.classes {
		for _, seq := range cl.rules {
			c.classesOf[seq] = append(c.classesOf[seq], ci)
		}
	}
}

// covers reports whether outer contains all of inner (same family).
func covers(outer, inner netip.Prefix) bool {
	return outer.Bits() <= inner.Bits() && outer.Contains(inner.Addr())
}

// regions emits every cidr and except of the rules' ipBlocks. An address
// whose longest emitted prefix is P is in block b exactly when b.cidr
// covers P and no except of b does (every prefix holding the address is
// either P or shorter than it, so it covers P), so the rules matching P
// are the signature of all of P's addresses that no pod owns. Pod
// signatures are not mixed in: a pod's address is classed by the exact
// Peers lookup, which the data plane makes first.
func (c *compiler) regions() []region {
	var withBlocks []*rule
	set := map[netip.Prefix]bool{}
	for _, r := range c.rules {
		if len(r.blocks) == 0 {
			continue
		}
		withBlocks = append(withBlocks, r)
		for _, b := range r.blocks {
			set[b.cidr] = true
			for _, e := range b.except {
				set[e] = true
			}
		}
	}
	prefixes := slices.SortedFunc(maps.Keys(set), func(a, b netip.Prefix) int {
		return cmp.Or(a.Addr().Compare(b.Addr()), cmp.Compare(a.Bits(), b.Bits()))
	})
	out := make([]region, 0, len(prefixes))
	for _, p := range prefixes {
		rg := region{prefix: p}
		for _, r := range withBlocks {
			for _, b := range r.blocks {
				if blockCovers(b, p) {
					rg.rules = append(rg.rules, r.seq)
					break
				}
			}
		}
		out = append(out, rg)
	}
	return out
}

func blockCovers(b ipBlock, p netip.Prefix) bool {
	if !covers(b.cidr, p) {
		return false
	}
	for _, e := range b.except {
		if covers(e, p) {
			return false
		}
	}
	return true
}

// prefixTable is a longest-prefix match over the emitted regions.
type prefixTable struct {
	index map[netip.Prefix]int
	bits4 []int // lengths present, longest first
	bits6 []int
}

func (t *prefixTable) add(p netip.Prefix, i int) {
	t.index[p] = i
	lens := &t.bits6
	if p.Addr().Is4() {
		lens = &t.bits4
	}
	if !slices.Contains(*lens, p.Bits()) {
		*lens = append(*lens, p.Bits())
		slices.SortFunc(*lens, func(a, b int) int { return b - a })
	}
}

// lookup returns the region of a's longest emitted prefix, or -1.
func (t *prefixTable) lookup(a netip.Addr) int {
	lens := t.bits6
	if a.Is4() {
		lens = t.bits4
	}
	for _, bits := range lens {
		p, err := a.Prefix(bits)
		if err != nil {
			continue
		}
		if i, ok := t.index[p]; ok {
			return i
		}
	}
	return -1
}

// classifyPods gives each pod address (its network and address) the class
// of what it matches: the rules whose selectors pick the pod, those whose
// ipBlocks hold the address, and the egress named ports those rules and
// the peerless ones ask of the pod.
func (c *compiler) classifyPods(regions []region, lpm *prefixTable) {
	var peerlessNamed []nameProto
	for _, r := range c.rules {
		if r.peerless && r.dir == Egress {
			peerlessNamed = append(peerlessNamed, r.named...)
		}
	}
	var selRules []*rule
	for _, r := range c.rules {
		if len(r.sels) > 0 {
			selRules = append(selRules, r)
		}
	}
	// Selectors see only a pod's namespace and labels, and many pods share
	// both (replicas), so they are evaluated once per such group.
	groups := map[string][]int{}
	claimed := map[PeerKey]bool{}
	var key []byte
	for _, p := range c.pods {
		key = groupKey(key[:0], p)
		sr, ok := groups[string(key)]
		if !ok {
			sr = c.selectorRules(selRules, p)
			groups[string(key)] = sr
		}
		for _, a := range p.Addrs {
			k := PeerKey{NetID: p.NetID, Addr: a}
			if !a.IsValid() || claimed[k] {
				continue
			}
			claimed[k] = true
			rules := sr
			if i := lpm.lookup(a); i >= 0 && len(regions[i].rules) > 0 {
				rules = mergeSorted(sr, regions[i].rules)
			}
			ci := c.intern(rules, c.namedFor(p, rules, peerlessNamed))
			if ci != 0 {
				c.t.Peers[k] = c.classes[ci].id
			}
		}
	}
}

// groupKey encodes a pod's namespace and labels without ambiguity.
func groupKey(dst []byte, p *Pod) []byte {
	dst = appendString(dst, p.Namespace)
	for _, k := range slices.Sorted(maps.Keys(p.Labels)) {
		dst = appendString(dst, k)
		dst = appendString(dst, p.Labels[k])
	}
	return dst
}

func appendString(dst []byte, s string) []byte {
	dst = binary.AppendUvarint(dst, uint64(len(s)))
	return append(dst, s...)
}

func (c *compiler) selectorRules(rules []*rule, p *Pod) []int {
	podLabels := labels.Set(p.Labels)
	nsLabels := labels.Set(c.in.Namespaces[p.Namespace])
	var out []int
	for _, r := range rules {
		for _, s := range r.sels {
			var ok bool
			if s.nsSel == nil {
				ok = p.Namespace == s.ownNS && s.podSel.Matches(podLabels)
			} else {
				ok = s.nsSel.Matches(nsLabels) && s.podSel.Matches(podLabels)
			}
			if ok {
				out = append(out, r.seq)
				break
			}
		}
	}
	return out
}

// mergeSorted is the sorted union of two ascending lists.
func mergeSorted(a, b []int) []int {
	out := make([]int, 0, len(a)+len(b))
	i, j := 0, 0
	for i < len(a) || j < len(b) {
		switch {
		case j == len(b) || (i < len(a) && a[i] < b[j]):
			out = append(out, a[i])
			i++
		case i == len(a) || b[j] < a[i]:
			out = append(out, b[j])
			j++
		default:
			out = append(out, a[i])
			i++
			j++
		}
	}
	return out
}

func (c *compiler) namedFor(p *Pod, rules []int, peerlessNamed []nameProto) map[nameProto][]uint16 {
	var out map[nameProto][]uint16
	own := c.podPorts(p)
	if len(own) == 0 {
		return nil
	}
	add := func(nps []nameProto) {
		for _, np := range nps {
			if ports := own[np]; len(ports) > 0 {
				if out == nil {
					out = map[nameProto][]uint16{}
				}
				out[np] = ports
			}
		}
	}
	for _, seq := range rules {
		if r := c.rules[seq]; r.dir == Egress {
			add(r.named)
		}
	}
	add(peerlessNamed)
	return out
}

func sortedNames(named map[nameProto][]uint16) []nameProto {
	return slices.SortedFunc(maps.Keys(named), func(a, b nameProto) int {
		return cmp.Or(cmp.Compare(a.name, b.name), cmp.Compare(a.proto, b.proto))
	})
}

// intern returns the index of the class of a signature, creating it.
// Equality is on the rules' seqs; the id hashes the rules' stable names
// (policy id, direction, index), so an unchanged signature keeps its id
// when other policies come and go and the agent rewrites only what
// changed.
func (c *compiler) intern(rules []int, named map[nameProto][]uint16) int {
	if len(rules) == 0 && len(named) == 0 {
		return 0
	}
	names := sortedNames(named)
	var key, stable []byte
	key = binary.AppendUvarint(key, uint64(len(rules)))
	for _, seq := range rules {
		key = binary.AppendUvarint(key, uint64(seq))
		r := c.rules[seq]
		stable = binary.BigEndian.AppendUint32(stable, r.policy)
		stable = append(stable, byte(r.dir))
		stable = binary.BigEndian.AppendUint32(stable, uint32(r.index))
	}
	var tail []byte
	for _, np := range names {
		tail = appendString(tail, np.name)
		tail = append(tail, np.proto)
		tail = binary.AppendUvarint(tail, uint64(len(named[np])))
		for _, port := range named[np] {
			tail = binary.BigEndian.AppendUint16(tail, port)
		}
	}
	key = append(key, tail...)
	if ci, ok := c.classOf[string(key)]; ok {
		return ci
	}
	stable = append(append(stable, 0xff), tail...)
	// Two signatures with one id would merge their verdicts; the later one
	// (in the fixed walk order) is rehashed with a salt until its id is
	// free. 0 is class 0, the empty signature, and never taken.
	var id uint32
	for salt := uint32(0); ; salt++ {
		data := stable
		if salt > 0 {
			data = binary.BigEndian.AppendUint32(slices.Clip(stable), salt)
		}
		id = hashClass(data)
		if _, taken := c.classIDs[id]; !taken {
			break
		}
	}
	ci := len(c.classes)
	c.classes = append(c.classes, &class{id: id, rules: rules, named: named})
	c.classOf[string(key)] = ci
	c.classIDs[id] = ci
	return ci
}

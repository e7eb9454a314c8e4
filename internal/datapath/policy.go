package datapath

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net/netip"

	"github.com/lace-cni/lace/internal/netpol"
)

// policyTables are the maps of the node's compiled NetworkPolicies
// (bpf/include/policy.h), written from netpol.Tables.
type policyTables struct {
	eps      *table[uint32, podPolEpVal]
	peers    *table[podPolPeerKey, uint32]
	cidrs    *table[podPolCidrKey, uint32]
	verdicts *table[podPolKey, podPolVal]
}

func (d *Datapath) newPolicyTables() {
	p := &d.pod
	d.tab.pol = policyTables{
		eps:      newTable[uint32, podPolEpVal]("lace_pol_eps", p.LacePolEps),
		peers:    newTable[podPolPeerKey, uint32]("lace_pol_peers", p.LacePolPeers),
		cidrs:    newTable[podPolCidrKey, uint32]("lace_pol_cidrs", p.LacePolCidrs),
		verdicts: newTable[podPolKey, podPolVal]("lace_pol", p.LacePol),
	}
}

// SyncPolicies makes the policy maps exactly t. The order keeps every
// packet decided by a consistent state, the old or the new: what a new
// class or isolation needs (verdicts, then classes) is written before
// the endpoints that lead to it, and what only the old state needed is
// deleted after. Drop counters of policies that are gone are deleted.
func (d *Datapath) SyncPolicies(t netpol.Tables) error {
	eps := make(map[uint32]podPolEpVal, len(t.Endpoints))
	for ifindex, e := range t.Endpoints {
		eps[ifindex] = podPolEpVal{Flags: uint32(e.Lookup) | uint32(e.Isolated)<<2, DenyIn: e.DenyIn, DenyOut: e.DenyOut}
	}
	peers := make(map[podPolPeerKey]uint32, len(t.Peers))
	for p, class := range t.Peers {
		peers[polPeerKey(p)] = class
	}
	cidrs := make(map[podPolCidrKey]uint32, len(t.CIDRs))
	for p, class := range t.CIDRs {
		cidrs[polCIDRKey(p)] = class
	}
	verdicts := make(map[podPolKey]podPolVal, len(t.Verdicts))
	for k, v := range t.Verdicts {
		verdicts[polKey(k)] = polVal(v)
	}

	pt := &d.tab.pol
	d.tab.mu.Lock()
	defer d.tab.mu.Unlock()
	err := pt.sync(verdicts, cidrs, peers, eps, false)
	if err != nil {
		// The maps may not hold the old state and the new at once:
		// what only the old needed goes first (a packet may meet a mix
		// for that moment).
		err = pt.sync(verdicts, cidrs, peers, eps, true)
	}
	if err != nil {
		// Still not written: every pod a policy has a say on refuses
		// what no verdict written admits (fail closed), never the
		// other way.
		for k, v := range eps {
			v.Flags |= (v.Flags & 3) << 2
			eps[k] = v
		}
		return errors.Join(err, pt.eps.sync(eps, nil))
	}
	return d.prunePolicyDrops(t.Policies)
}

// sync writes the policy tables: new entries before the endpoints that
// lead to them and stale ones after, or (delsFirst) every stale entry
// first, for room.
func (pt *policyTables) sync(verdicts map[podPolKey]podPolVal, cidrs map[podPolCidrKey]uint32, peers map[podPolPeerKey]uint32,
	eps map[uint32]podPolEpVal, delsFirst bool) error {
	steps := []tableStep{diffStep(pt.verdicts, verdicts), diffStep(pt.cidrs, cidrs), diffStep(pt.peers, peers)}
	if delsFirst {
		if err := pt.eps.sync(eps, nil); err != nil {
			return err
		}
		for _, s := range steps {
			if err := s.dels(); err != nil {
				return err
			}
		}
	}
	for _, s := range steps {
		if err := s.puts(); err != nil {
			return err
		}
	}
	if err := pt.eps.sync(eps, nil); err != nil {
		return err
	}
	for i := len(steps) - 1; i >= 0; i-- {
		if err := steps[i].dels(); err != nil {
			return err
		}
	}
	return nil
}

// tableStep is a table's sync split in two: its writes and its deletions.
type tableStep struct{ puts, dels func() error }

func diffStep[K, V comparable](t *table[K, V], want map[K]V) (s tableStep) {
	s.puts = func() error {
		if err := t.known(); err != nil {
			return err
		}
		puts, vals, _ := t.diff(want, nil)
		return t.put(puts, vals)
	}
	s.dels = func() error {
		if err := t.known(); err != nil {
			return err
		}
		_, _, dels := t.diff(want, nil)
		return t.del(dels)
	}
	return s
}

// PolicyCapacity is how many verdicts lace_pol holds.
func (d *Datapath) PolicyCapacity() int { return int(d.pod.LacePol.MaxEntries()) }

// PolicyDrops returns the packets each policy refused, by policy id
// (netpol.PolicyID), summed over CPUs.
func (d *Datapath) PolicyDrops() (map[uint32]uint64, error) {
	out := map[uint32]uint64{}
	var k uint32
	var per []uint64
	it := d.pod.LacePolDrops.Iterate()
	for it.Next(&k, &per) {
		var n uint64
		for _, c := range per {
			n += c
		}
		out[k] = n
	}
	if err := it.Err(); err != nil {
		return nil, fmt.Errorf("read lace_pol_drops: %w", err)
	}
	return out, nil
}

// prunePolicyDrops deletes the counters of policies not in keep.
func (d *Datapath) prunePolicyDrops(keep map[uint32]netpol.PolicyRef) error {
	have, err := d.PolicyDrops()
	if err != nil {
		return err
	}
	var errs []error
	for id := range have {
		if _, ok := keep[id]; !ok {
			if err := d.pod.LacePolDrops.Delete(id); err != nil {
				errs = append(errs, fmt.Errorf("delete policy %d's drop counter: %w", id, err))
			}
		}
	}
	return errors.Join(errs...)
}

func polPeerKey(p netpol.PeerKey) podPolPeerKey {
	return podPolPeerKey{NetId: p.NetID, Family: family(p.Addr), Addr: addr16(p.Addr)}
}

func polCIDRKey(p netip.Prefix) podPolCidrKey {
	return podPolCidrKey{Prefixlen: 8 + uint32(p.Bits()), Family: family(p.Addr()), Addr: addr16(p.Masked().Addr())}
}

func polKey(k netpol.VerdictKey) podPolKey {
	var port [2]byte
	binary.BigEndian.PutUint16(port[:], k.Port)
	return podPolKey{Prefixlen: uint32(k.PrefixLen), Ifindex: k.Ifindex, Class: k.Class, Dir: uint8(k.Dir), Proto: k.Proto,
		Port: binary.NativeEndian.Uint16(port[:])}
}

func polVal(v netpol.Verdict) podPolVal {
	out := podPolVal{Policy: v.Policy, Rule: v.Rule}
	if v.Allow {
		out.Allow = 1
	}
	return out
}

// ReadPolicies reads the policy maps back as netpol.Tables (without
// Policies): what the node's programs decide by now, for tests and
// tools that check it against netpol.Decide.
func (d *Datapath) ReadPolicies() (netpol.Tables, error) {
	t := netpol.Tables{Peers: map[netpol.PeerKey]uint32{}, CIDRs: map[netip.Prefix]uint32{},
		Endpoints: map[uint32]netpol.Endpoint{}, Verdicts: map[netpol.VerdictKey]netpol.Verdict{}}
	p := &d.pod
	var ifindex uint32
	var ep podPolEpVal
	it0 := p.LacePolEps.Iterate()
	for it0.Next(&ifindex, &ep) {
		t.Endpoints[ifindex] = netpol.Endpoint{Lookup: netpol.Dir(ep.Flags & 3), Isolated: netpol.Dir(ep.Flags >> 2 & 3),
			DenyIn: ep.DenyIn, DenyOut: ep.DenyOut}
	}
	var pk podPolPeerKey
	var class uint32
	it := p.LacePolPeers.Iterate()
	for it.Next(&pk, &class) {
		t.Peers[netpol.PeerKey{NetID: pk.NetId, Addr: fromAddr16(pk.Family, pk.Addr)}] = class
	}
	var ck podPolCidrKey
	it2 := p.LacePolCidrs.Iterate()
	for it2.Next(&ck, &class) {
		t.CIDRs[netip.PrefixFrom(fromAddr16(ck.Family, ck.Addr), int(ck.Prefixlen)-8)] = class
	}
	var vk podPolKey
	var vv podPolVal
	it3 := p.LacePol.Iterate()
	for it3.Next(&vk, &vv) {
		var port [2]byte
		binary.NativeEndian.PutUint16(port[:], vk.Port)
		t.Verdicts[netpol.VerdictKey{Ifindex: vk.Ifindex, Class: vk.Class, Dir: netpol.Dir(vk.Dir), Proto: vk.Proto,
			Port: binary.BigEndian.Uint16(port[:]), PrefixLen: uint8(vk.Prefixlen)}] = netpol.Verdict{Policy: vv.Policy, Rule: vv.Rule, Allow: vv.Allow != 0}
	}
	var errs []error
	for _, e := range []error{it0.Err(), it.Err(), it2.Err(), it3.Err()} {
		if e != nil {
			errs = append(errs, e)
		}
	}
	if err := errors.Join(errs...); err != nil {
		return t, fmt.Errorf("read policy maps: %w", err)
	}
	return t, nil
}

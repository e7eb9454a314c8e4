package datapath

import (
	"errors"
	"fmt"
	"net/netip"
	"slices"

	"github.com/cilium/ebpf"

	"github.com/lace-cni/lace/internal/tables"
)

// Service and Backend are the values of the services and backends maps.
type (
	Service = tables.Service
	Backend = tables.Backend
)

// svc_val.flags (lace.h).
const svcDrop = 1

func svcKey(s Service) podSvcKey {
	return podSvcKey{Family: family(s.VIP), Proto: s.Proto, Port: ntohs(s.Port), Vip: addr16(s.VIP)}
}

type svcEntry struct {
	key podSvcKey
	val podSvcVal
}

// ServiceKey names one service port.
type ServiceKey struct {
	VIP   netip.Addr
	Proto uint8
	Port  uint16
}

// Services reads the services the data plane serves, backends included.
func (d *Datapath) Services() ([]Service, error) {
	entries, err := d.serviceEntries()
	if err != nil {
		return nil, err
	}
	out := make([]Service, 0, len(entries))
	for _, e := range entries {
		s := Service{VIP: fromAddr16(e.key.Family, e.key.Vip), Proto: e.key.Proto, Port: ntohs(e.key.Port),
			NetID: e.val.NetId, Drop: e.val.Flags&svcDrop != 0, AffinitySeconds: e.val.Affinity}
		for i := range uint32(e.val.Count) {
			var b podBackendVal
			if err := d.pod.LaceBackends.Lookup(podBackendKey{Id: e.val.Id, Index: i}, &b); err != nil {
				return nil, fmt.Errorf("backend %d of service %s:%d: %w", i, s.VIP, s.Port, err)
			}
			s.Backends = append(s.Backends, Backend{Addr: fromAddr16(e.key.Family, b.Addr), Port: ntohs(b.Port)})
		}
		out = append(out, s)
	}
	return out, nil
}

func (d *Datapath) serviceEntries() (map[ServiceKey]svcEntry, error) {
	out := map[ServiceKey]svcEntry{}
	var k podSvcKey
	var v podSvcVal
	it := d.pod.LaceServices.Iterate()
	for it.Next(&k, &v) {
		out[ServiceKey{fromAddr16(k.Family, k.Vip), k.Proto, ntohs(k.Port)}] = svcEntry{k, v}
	}
	return out, it.Err()
}

// ApplyServices makes the services map equal want, writing only what
// differs. A changed service's backends are written before its count (and
// removed after it shrinks), so the programs never pick an index without a
// backend. It returns the endpoints that stopped being a backend of a
// service, so that their flows can be forgotten (FlushServiceFlows).
func (d *Datapath) ApplyServices(want []Service) (gone map[ServiceKey][]Backend, err error) {
	cur, err := d.serviceEntries()
	if err != nil {
		return nil, fmt.Errorf("read services: %w", err)
	}
	used := map[uint32]bool{}
	for _, e := range cur {
		used[e.val.Id] = true
	}
	next := uint32(1)
	newID := func() uint32 {
		for used[next] {
			next++
		}
		used[next] = true
		return next
	}
	have, err := d.Services()
	if err != nil {
		return nil, err
	}
	haveBy := map[ServiceKey]Service{}
	for _, s := range have {
		haveBy[ServiceKey{s.VIP, s.Proto, s.Port}] = s
	}
	gone = map[ServiceKey][]Backend{}
	seen := map[ServiceKey]bool{}
	// Affinity entries to forget: every one of a removed service (its ID
	// may be reused), those of endpoints that left, and all of a service
	// whose affinity was turned off or changed.
	deadAff := map[uint32]map[Backend]bool{}
	for _, s := range want {
		k := ServiceKey{s.VIP, s.Proto, s.Port}
		seen[k] = true
		old, exists := haveBy[k]
		if exists && slices.Equal(old.Backends, s.Backends) && old.NetID == s.NetID && old.Drop == s.Drop && old.AffinitySeconds == s.AffinitySeconds {
			continue
		}
		var id uint32
		oldCount := 0
		if e, ok := cur[k]; ok {
			id, oldCount = e.val.Id, int(e.val.Count)
		} else {
			id = newID()
		}
		if len(s.Backends) > 1<<16-1 {
			return nil, fmt.Errorf("service %s:%d has %d backends, more than the data plane holds", s.VIP, s.Port, len(s.Backends))
		}
		for i, b := range s.Backends {
			if err := d.pod.LaceBackends.Put(podBackendKey{Id: id, Index: uint32(i)}, podBackendVal{Addr: addr16(b.Addr), Port: ntohs(b.Port)}); err != nil {
				return nil, fmt.Errorf("put backend %d of %s:%d: %w", i, s.VIP, s.Port, err)
			}
		}
		v := podSvcVal{Id: id, NetId: s.NetID, Count: uint16(len(s.Backends)), Affinity: s.AffinitySeconds}
		if s.Drop {
			v.Flags |= svcDrop
		}
		if err := d.pod.LaceServices.Put(svcKey(s), v); err != nil {
			return nil, fmt.Errorf("put service %s:%d: %w", s.VIP, s.Port, err)
		}
		for i := len(s.Backends); i < oldCount; i++ {
			if err := ignoreMissing(d.pod.LaceBackends.Delete(podBackendKey{Id: id, Index: uint32(i)})); err != nil {
				return nil, err
			}
		}
		if exists {
			if lost := missing(old.Backends, s.Backends); len(lost) > 0 {
				gone[k] = lost
				deadAff[id] = map[Backend]bool{}
				for _, b := range lost {
					deadAff[id][b] = true
				}
			}
			if old.AffinitySeconds != s.AffinitySeconds {
				deadAff[id] = nil
			}
		}
	}
	for k, e := range cur {
		if seen[k] {
			continue
		}
		if err := ignoreMissing(d.pod.LaceServices.Delete(e.key)); err != nil {
			return nil, err
		}
		for i := range uint32(e.val.Count) {
			if err := ignoreMissing(d.pod.LaceBackends.Delete(podBackendKey{Id: e.val.Id, Index: i})); err != nil {
				return nil, err
			}
		}
		gone[k] = haveBy[k].Backends
		deadAff[e.val.Id] = nil
	}
	if err := d.forgetAffinity(deadAff); err != nil {
		return nil, err
	}
	return gone, nil
}

// forgetAffinity removes the affinity entries of the given service IDs:
// all of them for a nil set, else those pointing to one of its backends.
func (d *Datapath) forgetAffinity(dead map[uint32]map[Backend]bool) error {
	if len(dead) == 0 {
		return nil
	}
	var doomed []podAffinityKey
	var k podAffinityKey
	var v podAffinityVal
	it := d.pod.LaceAffinity.Iterate()
	for it.Next(&k, &v) {
		set, ok := dead[k.Id]
		if !ok {
			continue
		}
		if set == nil || set[Backend{Addr: fromAddr16(k.Family, v.Addr), Port: ntohs(v.Port)}] {
			doomed = append(doomed, k)
		}
	}
	if err := it.Err(); err != nil {
		return fmt.Errorf("walk affinity: %w", err)
	}
	for _, k := range doomed {
		if err := d.pod.LaceAffinity.Delete(k); err != nil && !isMissing(err) {
			return fmt.Errorf("forget affinity: %w", err)
		}
	}
	return nil
}

func missing(old, now []Backend) []Backend {
	var out []Backend
	for _, b := range old {
		if !slices.Contains(now, b) {
			out = append(out, b)
		}
	}
	return out
}

// FlushServiceFlows forgets the conntrack entries of flows translated to
// an endpoint that is no longer a backend of their service (gone, from
// ApplyServices): the client's next packet picks a live endpoint instead of
// being sent to one that went away (a UDP client, DNS, would otherwise be
// black-holed until the entry expires). It returns how many it removed.
func (d *Datapath) FlushServiceFlows(gone map[ServiceKey][]Backend) (int, error) {
	if len(gone) == 0 {
		return 0, nil
	}
	type vipEP struct {
		vip  netip.AddrPort
		ep   netip.AddrPort
		prot uint8
	}
	dead := map[vipEP]bool{}
	for k, bs := range gone {
		for _, b := range bs {
			dead[vipEP{netip.AddrPortFrom(k.VIP, k.Port), netip.AddrPortFrom(b.Addr, b.Port), k.Proto}] = true
		}
	}
	var doomed []podCtKey
	var k podCtKey
	var v podCtVal
	it := d.pod.LaceCt.Iterate()
	for it.Next(&k, &v) {
		nat := netip.AddrPortFrom(fromAddr16(k.Family, v.NatAddr), ntohs(v.NatPort))
		remote := netip.AddrPortFrom(fromAddr16(k.Family, k.Raddr), ntohs(k.Rport))
		switch {
		case v.Flags&ctService != 0 && dead[vipEP{remote, nat, k.Proto}]:
			doomed = append(doomed, k)
		case v.Flags&ctDNAT != 0 && dead[vipEP{nat, remote, k.Proto}]:
			doomed = append(doomed, k)
		}
	}
	if err := it.Err(); err != nil {
		return 0, fmt.Errorf("walk conntrack: %w", err)
	}
	for _, k := range doomed {
		if err := d.pod.LaceCt.Delete(k); err != nil && !isMissing(err) {
			return 0, fmt.Errorf("forget flow: %w", err)
		}
	}
	return len(doomed), nil
}

func isMissing(err error) bool { return errors.Is(err, ebpf.ErrKeyNotExist) }

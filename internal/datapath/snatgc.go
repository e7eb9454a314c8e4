package datapath

import (
	"errors"
	"fmt"

	"github.com/cilium/ebpf"
)

// ReclaimSNAT deletes the SNAT mappings whose pod flow is over, once the
// map is half full (until then a finished flow's mapping stays, and
// traffic to it is dropped and counted snat-closed rather than handed to
// the host's stack): no live
// conntrack entry of that flow holds the mapping's port any more (it
// expired, was evicted, or took another port). lace_snat is a plain hash,
// never evicted (an eviction would free a live flow's port): the data
// plane takes a stale mapping again only when a new flow picks its very
// port toward the same destination, so without this sweep mappings toward
// destinations never used again would fill it. It mirrors snat_owner
// (ct.h). Returns how many it deleted.
func (d *Datapath) ReclaimSNAT() (int, error) {
	now, err := monotonicNow()
	if err != nil {
		return 0, err
	}
	type mapping struct {
		k podSnatKey
		v podSnatVal
	}
	var stale []mapping
	var k podSnatKey
	var v podSnatVal
	total := 0
	it := d.pod.LaceSnat.Iterate()
	for it.Next(&k, &v) {
		total++
		ck := podCtKey{NetId: v.NetId, Family: k.Family, Proto: k.Proto, Lport: v.Lport, Rport: k.Rport, Laddr: v.Laddr, Raddr: k.Raddr}
		if k.Proto == 1 || k.Proto == 58 { // ICMP echo: the identifier on both sides
			ck.Rport = v.Lport
		}
		live := false
		for _, m := range d.ctMaps() {
			var cv podCtVal
			err := m.Lookup(&ck, &cv)
			if errors.Is(err, ebpf.ErrKeyNotExist) {
				continue
			}
			if err != nil {
				return 0, fmt.Errorf("look up the flow of a SNAT mapping: %w", err)
			}
			if cv.Expires >= now && cv.Flags&ctSNAT != 0 && cv.SnatPort == k.Port {
				live = true
				break
			}
		}
		if !live {
			stale = append(stale, mapping{k, v})
		}
	}
	if err := it.Err(); err != nil {
		return 0, fmt.Errorf("iterate lace_snat: %w", err)
	}
	if total < int(d.pod.LaceSnat.MaxEntries())/2 {
		return 0, nil
	}
	n := 0
	for i := range stale {
		// The data plane may have given the port to a new flow since:
		// delete only a mapping still the stale one (a flow that lost
		// its mapping in the remaining race puts it back with its next
		// packet: snat_out).
		var cur podSnatVal
		if err := d.pod.LaceSnat.Lookup(&stale[i].k, &cur); err != nil || cur != stale[i].v {
			continue
		}
		if err := d.pod.LaceSnat.Delete(&stale[i].k); err == nil {
			n++
		}
	}
	return n, nil
}

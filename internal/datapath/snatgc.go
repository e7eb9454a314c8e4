package datapath

import (
	"errors"
	"fmt"
	"net/netip"

	"github.com/cilium/ebpf"
)

// ReclaimSNAT deletes the node port mappings whose flows are over, once
// their map is half full (until then a finished flow's mapping stays, and
// traffic to it is dropped and counted snat-closed rather than handed to
// the host's stack). Both maps are plain hashes, never evicted (an
// eviction would free a live flow's port): the data plane takes a stale
// mapping again only when a new flow picks its very port toward the same
// destination, so without this sweep mappings toward destinations never
// used again would fill them.
//   - lace_snat (a pod's flow leaving from the node's address): stale when
//     no live conntrack entry of that flow holds the mapping's port any
//     more (it expired, was evicted, or took another port). It mirrors
//     snat_owner (ct.h).
//   - lace_xlb_rev (a NodePort or LoadBalancer flow sent to an endpoint on
//     another node): stale when no live entry of its client's flow holds
//     the port and the mapping itself expired. xlb_port (underlay.c) holds
//     a mapping whose entry was lost until its own expiry too, but takes a
//     half open one at once (a SYN, with a reset ahead, once the endpoint
//     answered). A half open mapping past its own hold (CT_NEW_IN after
//     its last packet) is stale whoever names it: nobody showed a
//     connection on it (the client's ACK of the endpoint's SYN-ACK, the
//     endpoint's data), and a blind client's entry, assured by an ACK the
//     endpoint never took, lives for hours. (One migrated from layout
//     version 2 half open, XLB_REV_V2, may be an honest connection nobody
//     spoke on, with nothing recorded to prove it: kept while its entry
//     lives. Deleted, a mapping asks no reset ahead of the next flow on
//     its port: a request the endpoint still holds then answers that
//     flow's SYN with an ACK, the client resets it, and its SYN's
//     retransmission gets through.)
//
// Returns how many it deleted.
func (d *Datapath) ReclaimSNAT() (int, error) {
	now, err := monotonicNow()
	if err != nil {
		return 0, err
	}
	// Each map is swept even when the other's sweep failed.
	n, errPod := d.reclaimPodSNAT(now)
	m, errXLB := d.reclaimXLB(now)
	return n + m, errors.Join(errPod, errXLB)
}

func (d *Datapath) reclaimPodSNAT(now uint64) (int, error) {
	return sweepStale(d.pod.LaceSnat, "lace_snat", func(k podSnatKey, v podSnatVal) (bool, error) {
		ck := podCtKey{NetId: v.NetId, Family: k.Family, Proto: k.Proto, Lport: v.Lport, Rport: k.Rport, Laddr: v.Laddr, Raddr: k.Raddr}
		if k.Proto == 1 || k.Proto == 58 { // ICMP echo: the identifier on both sides
			ck.Rport = v.Lport
		}
		live, err := d.portOwned(ck, k.Port, now)
		return !live, err
	})
}

// xlbRevHalfOpen is XLB_REV_HALF_OPEN (ct.h), and xlbHalfOpenHold how
// long a half open mapping is held after its last packet (CT_NEW_IN).
const (
	xlbRevHalfOpen  = 1
	xlbRevEISN      = 8  // XLB_REV_EISN
	xlbRevV2        = 16 // XLB_REV_V2
	xlbHalfOpenHold = 5e9
)

func (d *Datapath) reclaimXLB(now uint64) (int, error) {
	return sweepStale(d.underlay.LaceXlbRev, "lace_xlb_rev", func(k underlayXlbRevKey, v underlayXlbRevVal) (bool, error) {
		if v.Expires >= now {
			return false, nil
		}
		// Past its hold and still half open: nobody showed a
		// connection (a blind client's), unless it was migrated so.
		if v.Flags&xlbRevHalfOpen != 0 && v.Flags&(xlbRevV2|xlbRevEISN) != xlbRevV2 {
			return true, nil
		}
		ck := podCtKey{NetId: v.ExtNet, Family: k.Family, Proto: k.Proto, Lport: v.Fport, Rport: v.Cport, Laddr: v.Front, Raddr: v.Client}
		live, err := d.portOwned(ck, k.Port, now)
		return !live, err
	})
}

// sweepStale deletes the entries of node port map m (named name) that
// stale says are over, once m is half full. Each goes only if it is still
// the entry seen: the data plane may have given its port to a new flow
// since (xlb_port rewrites a mapping in place; a pod's flow that lost its
// mapping in the remaining race puts it back with its next packet,
// snat_out). Returns how many it deleted.
func sweepStale[K any, V comparable](m *ebpf.Map, name string, stale func(K, V) (bool, error)) (int, error) {
	type entry struct {
		k K
		v V
	}
	var gone []entry
	var k K
	var v V
	total := 0
	it := m.Iterate()
	for it.Next(&k, &v) {
		total++
		over, err := stale(k, v)
		if err != nil {
			return 0, fmt.Errorf("look up the flow of a %s mapping: %w", name, err)
		}
		if over {
			gone = append(gone, entry{k, v})
		}
	}
	if err := it.Err(); err != nil {
		return 0, fmt.Errorf("iterate %s: %w", name, err)
	}
	if total < int(m.MaxEntries())/2 {
		return 0, nil
	}
	n := 0
	for i := range gone {
		var cur V
		if err := m.Lookup(&gone[i].k, &cur); err != nil || cur != gone[i].v {
			continue
		}
		if err := m.Delete(&gone[i].k); err == nil {
			n++
		}
	}
	return n, nil
}

// portOwned tells whether flow ck has a live conntrack entry that leaves
// from node port port (network order).
func (d *Datapath) portOwned(ck podCtKey, port uint16, now uint64) (bool, error) {
	for _, m := range d.ctMaps() {
		var cv podCtVal
		err := m.Lookup(&ck, &cv)
		if errors.Is(err, ebpf.ErrKeyNotExist) {
			continue
		}
		if err != nil {
			return false, err
		}
		if cv.Expires >= now && cv.Flags&ctSNAT != 0 && cv.SnatPort == port {
			return true, nil
		}
	}
	return false, nil
}

// NodePortMapping is a node port held toward an endpoint on another node
// by a NodePort or LoadBalancer flow from outside (lace_xlb_rev).
type NodePortMapping struct {
	Proto    uint8
	Port     uint16         // the node's port
	Endpoint netip.AddrPort // where the flow goes
	Client   netip.AddrPort // where it comes from
	Frontend netip.AddrPort // what the client asked
	// HalfOpen: nobody has shown a connection on the port; it is held
	// CT_NEW_IN after its last packet at most, and early drop may take it.
	HalfOpen              bool
	ExpiresMonotonicNanos uint64
}

// NodePortMappings lists lace_xlb_rev, expired mappings included.
func (d *Datapath) NodePortMappings() ([]NodePortMapping, error) {
	var out []NodePortMapping
	var k underlayXlbRevKey
	var v underlayXlbRevVal
	it := d.underlay.LaceXlbRev.Iterate()
	for it.Next(&k, &v) {
		out = append(out, NodePortMapping{
			Proto:                 k.Proto,
			Port:                  ntohs(k.Port),
			Endpoint:              netip.AddrPortFrom(fromAddr16(k.Family, k.Raddr), ntohs(k.Rport)),
			Client:                netip.AddrPortFrom(fromAddr16(k.Family, v.Client), ntohs(v.Cport)),
			Frontend:              netip.AddrPortFrom(fromAddr16(k.Family, v.Front), ntohs(v.Fport)),
			HalfOpen:              v.Flags&xlbRevHalfOpen != 0,
			ExpiresMonotonicNanos: v.Expires,
		})
	}
	if err := it.Err(); err != nil {
		return nil, fmt.Errorf("iterate lace_xlb_rev: %w", err)
	}
	return out, nil
}

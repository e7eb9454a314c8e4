package datapath

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"slices"

	"github.com/cilium/ebpf"

	"github.com/lace-cni/lace/internal/tables"
)

// L2Neighbor, FDBEntry and L2FloodNode are entries of the l2 tables
// (tables package).
type (
	L2Neighbor  = tables.L2Neighbor
	FDBEntry    = tables.FDBEntry
	L2FloodNode = tables.L2FloodNode
)

// l2FloodMax is L2_FLOOD_MAX (bpf/include/l2.h): a network floods to at
// most so many ports on a node and so many other nodes.
const l2FloodMax = 128

// fdb_val.flags and l2_neigh_val.flags (bpf/include/l2.h).
const (
	fdbLocal    = 1
	fdbGateway  = 2
	fdbRemote   = 4
	fdbAlt      = 8
	neighRouter = 1
)

func l2NeighEntry(n L2Neighbor) (l2L2NeighKey, l2L2NeighVal) {
	k := l2L2NeighKey{NetId: n.NetID, Family: family(n.Addr), Addr: addr16(n.Addr)}
	v := l2L2NeighVal{Mac: mac6(n.MAC)}
	if n.Router {
		v.Flags = neighRouter
	}
	return k, v
}

func fdbEntry(e FDBEntry) (l2FdbKey, l2FdbVal) {
	k := l2FdbKey{NetId: e.NetID, Mac: mac6(e.MAC)}
	var v l2FdbVal
	switch {
	case e.Gateway:
		return k, l2FdbVal{Flags: fdbGateway}
	case e.IfIndex != 0:
		v = l2FdbVal{Flags: fdbLocal, Ifindex: e.IfIndex}
	default:
		v = l2FdbVal{Flags: fdbRemote, Sid: e.SID.As16()}
	}
	v.Seq = e.Seq
	switch {
	case e.StandbyIfIndex != 0 && e.IfIndex == 0:
		v.Flags |= fdbAlt
		v.AltIfindex = e.StandbyIfIndex
	case e.StandbySID.Is6():
		v.Flags |= fdbAlt
		v.AltSid = e.StandbySID.As16()
	}
	return k, v
}

// mergeFDB is the FDB of w: the cluster's entries of the networks here,
// the pods' ports over them (a MAC that just moved here is this node's
// before the API says so), except where the cluster names a standby: a
// MAC that lives here with a standby elsewhere keeps it, a pod here that
// is a MAC's standby (a live migration's target) is only that until the
// MAC shows up at its port, and a pod here that is neither (a third pod of
// the claim) holds nothing: only the MAC's node and its standby may.
func mergeFDB(w *l2Want, here map[uint32]bool) map[l2FdbKey]l2FdbVal {
	cluster := make(map[l2FdbKey]FDBEntry, len(w.clusterFDB))
	for _, e := range w.clusterFDB {
		if here[e.NetID] {
			cluster[l2FdbKey{NetId: e.NetID, Mac: mac6(e.MAC)}] = e
		}
	}
	wf := make(map[l2FdbKey]l2FdbVal, len(w.localFDB)+len(w.clusterFDB))
	for k, e := range cluster {
		if !e.Here {
			e.StandbyHere = false // its port, if any, is merged below
			_, v := fdbEntry(e)
			wf[k] = v
		}
	}
	for _, l := range w.localFDB {
		k := l2FdbKey{NetId: l.NetID, Mac: mac6(l.MAC)}
		c, ok := cluster[k]
		switch {
		case ok && c.StandbyHere && l.IfIndex != 0:
			c.StandbyIfIndex = l.IfIndex
			_, wf[k] = fdbEntry(c)
		case ok && c.Here && l.IfIndex != 0:
			l.Seq, l.StandbySID = c.Seq, c.StandbySID
			_, wf[k] = fdbEntry(l)
		case ok && c.StandbySID.IsValid():
			// Placed elsewhere, standing by elsewhere: the cluster's.
		default:
			_, wf[k] = fdbEntry(l)
		}
	}
	return wf
}

// l2Want is the desired content of the l2 tables from each of their two
// writers: the pods of this node (the CNI server: their ports, addresses
// and the gateways of their networks) and the cluster (the node's sync:
// every network's Neighbors and the MACs living on other nodes). Written
// as one: a key both give takes the local entry (a MAC that just moved
// here is this node's before the API says so).
type l2Want struct {
	localNeigh, clusterNeigh []L2Neighbor
	localFDB, clusterFDB     []FDBEntry
	flood                    []L2FloodNode
}

// SyncL2Local makes this node's pods' part of the l2 tables neigh and fdb.
func (d *Datapath) SyncL2Local(neigh []L2Neighbor, fdb []FDBEntry) error {
	if err := checkL2(neigh, fdb); err != nil {
		return err
	}
	d.tab.mu.Lock()
	defer d.tab.mu.Unlock()
	d.tab.l2.localNeigh, d.tab.l2.localFDB = neigh, fdb
	return d.syncL2()
}

// SyncL2Cluster makes the cluster's part of the l2 tables neigh and fdb,
// and the other nodes a network's flooded frames go to. The ports a
// network floods to on this node are its local FDB entries' (SyncL2Local).
func (d *Datapath) SyncL2Cluster(neigh []L2Neighbor, fdb []FDBEntry, flood []L2FloodNode) error {
	if err := checkL2(neigh, fdb); err != nil {
		return err
	}
	for _, f := range flood {
		if !f.SID.Is6() {
			return fmt.Errorf("flood node of network %d: SID %v is no IPv6 address", f.NetID, f.SID)
		}
	}
	d.tab.mu.Lock()
	defer d.tab.mu.Unlock()
	d.tab.l2.clusterNeigh, d.tab.l2.clusterFDB, d.tab.l2.flood = neigh, fdb, flood
	return d.syncL2()
}

// floodTables are the flood lists of want: per network its local ports
// (sorted, from the local FDB entries) at 0.., and the other nodes at
// l2FloodMax.., each list cut at l2FloodMax.
func floodTables(w *l2Want) (map[uint32]l2L2NetVal, map[l2L2FloodKey]l2L2FloodVal) {
	ports := map[uint32][]uint32{}
	for _, e := range w.localFDB {
		if e.IfIndex != 0 && !e.Gateway {
			ports[e.NetID] = append(ports[e.NetID], e.IfIndex)
		}
	}
	nodes := map[uint32][]netip.Addr{}
	for _, f := range w.flood {
		nodes[f.NetID] = append(nodes[f.NetID], f.SID)
	}
	nets := map[uint32]l2L2NetVal{}
	entries := map[l2L2FloodKey]l2L2FloodVal{}
	for id, ps := range ports {
		slices.Sort(ps)
		ps = slices.Compact(ps)
		if len(ps) > l2FloodMax {
			ps = ps[:l2FloodMax]
		}
		for i, ifi := range ps {
			entries[l2L2FloodKey{NetId: id, Idx: uint32(i)}] = l2L2FloodVal{Ifindex: ifi}
		}
		v := nets[id]
		v.Nlocal = uint32(len(ps))
		nets[id] = v
	}
	for id, ns := range nodes {
		slices.SortFunc(ns, func(a, b netip.Addr) int { return a.Compare(b) })
		ns = slices.Compact(ns)
		if len(ns) > l2FloodMax {
			ns = ns[:l2FloodMax]
		}
		for i, sid := range ns {
			entries[l2L2FloodKey{NetId: id, Idx: uint32(l2FloodMax + i)}] = l2L2FloodVal{Sid: sid.As16()}
		}
		v := nets[id]
		v.Nremote = uint32(len(ns))
		nets[id] = v
	}
	return nets, entries
}

func checkL2(neigh []L2Neighbor, fdb []FDBEntry) error {
	for _, n := range neigh {
		if !n.Addr.IsValid() || len(n.MAC) != 6 {
			return fmt.Errorf("l2 neighbour %v of network %d: invalid address or MAC %v", n.Addr, n.NetID, n.MAC)
		}
	}
	for _, e := range fdb {
		if len(e.MAC) != 6 || (!e.Gateway && e.IfIndex == 0 && !e.SID.Is6() && !(e.Here && e.StandbySID.Is6())) {
			return fmt.Errorf("fdb entry %v of network %d: invalid MAC, or neither port, gateway nor SID", e.MAC, e.NetID)
		}
	}
	return nil
}

// syncL2 writes the merged desired state (the caller holds d.tab.mu).
// Entries are written before the neighbours that name their MACs and
// removed after them, so an answered address always leads somewhere.
// The cluster's entries are held only for the networks with a port here:
// nothing reads another network's (from_l2 reads its port's network, the
// receiver needs a local endpoint of it), and holding every l2 network's
// every address on every node would let one large network fill the maps
// for all (a claim's addresses outlive its pods), after which no new
// port of any network gets its entries.
func (d *Datapath) syncL2() error {
	t, w := d.tab, &d.tab.l2
	here := map[uint32]bool{}
	for _, e := range w.localFDB {
		here[e.NetID] = true
	}
	wn := make(map[l2L2NeighKey]l2L2NeighVal, len(w.localNeigh)+len(w.clusterNeigh))
	for _, n := range w.clusterNeigh {
		if here[n.NetID] {
			k, v := l2NeighEntry(n)
			wn[k] = v
		}
	}
	for _, n := range w.localNeigh {
		k, v := l2NeighEntry(n)
		wn[k] = v
	}
	wf := mergeFDB(w, here)
	wNets, wFlood := floodTables(w)
	if err := errors.Join(t.l2Neigh.known(), t.fdb.known(), t.l2Nets.known(), t.l2Flood.known()); err != nil {
		return err
	}
	nPuts, nVals, nDels := t.l2Neigh.diff(wn, nil)
	fPuts, fVals, fDels := t.fdb.diff(wf, nil)
	stale := staleMoves(t.fdb.have, wf, append(fPuts, fDels...))
	// A list's entries are written before its count grows and removed
	// after it shrinks: the programs read entries below the count only.
	cPuts, cVals, cDels := t.l2Nets.diff(wNets, nil)
	lPuts, lVals, lDels := t.l2Flood.diff(wFlood, nil)
	for _, step := range []func() error{
		// Before the entries change: a move the data plane makes after
		// the new entry is written is for the new entry, and stays.
		func() error { return d.forgetMoves(stale) },
		func() error { return t.l2Neigh.del(nDels) },
		func() error { return t.fdb.put(fPuts, fVals) },
		func() error { return t.fdb.del(fDels) },
		func() error { return t.l2Neigh.put(nPuts, nVals) },
		func() error { return t.l2Flood.put(lPuts, lVals) },
		func() error { return t.l2Nets.put(cPuts, cVals) },
		func() error { return t.l2Nets.del(cDels) },
		func() error { return t.l2Flood.del(lDels) },
	} {
		if err := step(); err != nil {
			return err
		}
	}
	return nil
}

// staleMoves are the keys among changed whose move (lace_l2_moves) the
// new entry no longer stands behind: it lost its standby, or has another
// standby or sequence. A stale move is never read (fdb_moved checks the
// sequence), but a new standby of the same sequence and place must start
// where the MAC lives, not where an aborted migration moved it.
func staleMoves(have, want map[l2FdbKey]l2FdbVal, changed []l2FdbKey) []l2FdbKey {
	var out []l2FdbKey
	for _, k := range changed {
		old, ok := have[k]
		if !ok || old.Flags&fdbAlt == 0 {
			continue
		}
		if v, ok := want[k]; !ok || v.Flags&fdbAlt == 0 || v.Seq != old.Seq || v.AltIfindex != old.AltIfindex || v.AltSid != old.AltSid {
			out = append(out, k)
		}
	}
	return out
}

// forgetMoves deletes the data plane's moves of keys.
func (d *Datapath) forgetMoves(keys []l2FdbKey) error {
	for _, k := range keys {
		if err := d.l2.LaceL2Moves.Delete(k); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
			return fmt.Errorf("forget the move of %v in network %d: %w", net.HardwareAddr(k.Mac[:]), k.NetId, err)
		}
	}
	return nil
}

// L2Move is a MAC the data plane moved to its standby location.
type L2Move struct {
	NetID uint32
	MAC   net.HardwareAddr
	Seq   uint32
}

// L2Activated lists the MACs the data plane moved to a standby port on
// this node that still hold (their entry's sequence), as the ring reports
// them (Activated): what a report lost on the way, or an agent that
// restarted after the move, did not record.
func (d *Datapath) L2Activated() ([]L2Learned, error) {
	var out []L2Learned
	var k l2FdbKey
	var m l2L2MoveVal
	it := d.l2.LaceL2Moves.Iterate()
	for it.Next(&k, &m) {
		var v l2FdbVal
		if err := d.l2.LaceFdb.Lookup(k, &v); err != nil || v.Flags&fdbAlt == 0 || v.AltIfindex == 0 || v.Seq != m.Seq {
			continue
		}
		out = append(out, L2Learned{IfIndex: v.AltIfindex, NetID: k.NetId, MAC: append(net.HardwareAddr(nil), k.Mac[:]...),
			Activated: true, Seq: m.Seq})
	}
	return out, it.Err()
}

// L2Moves lists the data plane's moves (lace_l2_moves), current or stale.
func (d *Datapath) L2Moves() ([]L2Move, error) {
	var out []L2Move
	var k l2FdbKey
	var v l2L2MoveVal
	it := d.l2.LaceL2Moves.Iterate()
	for it.Next(&k, &v) {
		out = append(out, L2Move{NetID: k.NetId, MAC: append(net.HardwareAddr(nil), k.Mac[:]...), Seq: v.Seq})
	}
	return out, it.Err()
}

// L2Neighbors lists the l2 neighbour tables as the kernel holds them.
func (d *Datapath) L2Neighbors() ([]L2Neighbor, error) {
	var out []L2Neighbor
	var k l2L2NeighKey
	var v l2L2NeighVal
	it := d.l2.LaceL2Neigh.Iterate()
	for it.Next(&k, &v) {
		out = append(out, L2Neighbor{NetID: k.NetId, Addr: fromAddr16(k.Family, k.Addr),
			MAC: append(net.HardwareAddr(nil), v.Mac[:]...), Router: v.Flags&neighRouter != 0})
	}
	return out, it.Err()
}

// FDB lists the l2 forwarding databases as the kernel holds them.
func (d *Datapath) FDB() ([]FDBEntry, error) {
	var out []FDBEntry
	var k l2FdbKey
	var v l2FdbVal
	it := d.l2.LaceFdb.Iterate()
	for it.Next(&k, &v) {
		e := FDBEntry{NetID: k.NetId, MAC: append(net.HardwareAddr(nil), k.Mac[:]...),
			IfIndex: v.Ifindex, Gateway: v.Flags&fdbGateway != 0, Seq: v.Seq}
		if v.Flags&fdbRemote != 0 {
			e.SID = netip.AddrFrom16(v.Sid)
		}
		if v.Flags&fdbAlt != 0 {
			e.StandbyIfIndex = v.AltIfindex
			if v.AltIfindex == 0 {
				e.StandbySID = netip.AddrFrom16(v.AltSid)
			}
		}
		out = append(out, e)
	}
	return out, it.Err()
}

package datapath

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"slices"

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
	switch {
	case e.Gateway:
		return k, l2FdbVal{Flags: fdbGateway}
	case e.IfIndex != 0:
		return k, l2FdbVal{Flags: fdbLocal, Ifindex: e.IfIndex}
	}
	return k, l2FdbVal{Flags: fdbRemote, Sid: e.SID.As16()}
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
		if len(e.MAC) != 6 || (!e.Gateway && e.IfIndex == 0 && !e.SID.Is6()) {
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
	wf := make(map[l2FdbKey]l2FdbVal, len(w.localFDB)+len(w.clusterFDB))
	for _, e := range w.clusterFDB {
		if here[e.NetID] {
			k, v := fdbEntry(e)
			wf[k] = v
		}
	}
	for _, e := range w.localFDB {
		k, v := fdbEntry(e)
		wf[k] = v
	}
	wNets, wFlood := floodTables(w)
	if err := errors.Join(t.l2Neigh.known(), t.fdb.known(), t.l2Nets.known(), t.l2Flood.known()); err != nil {
		return err
	}
	nPuts, nVals, nDels := t.l2Neigh.diff(wn, nil)
	fPuts, fVals, fDels := t.fdb.diff(wf, nil)
	// A list's entries are written before its count grows and removed
	// after it shrinks: the programs read entries below the count only.
	cPuts, cVals, cDels := t.l2Nets.diff(wNets, nil)
	lPuts, lVals, lDels := t.l2Flood.diff(wFlood, nil)
	for _, step := range []func() error{
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
			IfIndex: v.Ifindex, Gateway: v.Flags&fdbGateway != 0}
		if v.Flags&fdbRemote != 0 {
			e.SID = netip.AddrFrom16(v.Sid)
		}
		out = append(out, e)
	}
	return out, it.Err()
}

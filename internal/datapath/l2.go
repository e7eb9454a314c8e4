package datapath

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
)

// L2Neighbor is an entry of an l2 network's neighbour table: the MAC an
// ARP request or neighbour solicitation for Addr is answered with.
type L2Neighbor struct {
	NetID uint32
	Addr  netip.Addr
	MAC   net.HardwareAddr
	// Router: the network's anycast gateway (its advertisement says so).
	Router bool
}

// FDBEntry is an entry of an l2 network's forwarding database: where a
// frame to MAC goes. Exactly one of IfIndex (a port on this node) and
// Gateway (the anycast gateway, routed by from_pod) is set.
type FDBEntry struct {
	NetID   uint32
	MAC     net.HardwareAddr
	IfIndex uint32
	Gateway bool
}

// fdb_val.flags and l2_neigh_val.flags (bpf/include/l2.h).
const (
	fdbLocal    = 1
	fdbGateway  = 2
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
	v := l2FdbVal{Ifindex: e.IfIndex}
	if e.Gateway {
		v.Flags = fdbGateway
		v.Ifindex = 0
	} else {
		v.Flags = fdbLocal
	}
	return k, v
}

// SyncL2 makes the l2 networks' neighbour tables and forwarding databases
// exactly neigh and fdb. Entries are written before the neighbours that
// name their MACs and removed after them, so an answered address always
// leads somewhere.
func (d *Datapath) SyncL2(neigh []L2Neighbor, fdb []FDBEntry) error {
	wn := make(map[l2L2NeighKey]l2L2NeighVal, len(neigh))
	for _, n := range neigh {
		if !n.Addr.IsValid() || len(n.MAC) != 6 {
			return fmt.Errorf("l2 neighbour %v of network %d: invalid address or MAC %v", n.Addr, n.NetID, n.MAC)
		}
		k, v := l2NeighEntry(n)
		wn[k] = v
	}
	wf := make(map[l2FdbKey]l2FdbVal, len(fdb))
	for _, e := range fdb {
		if len(e.MAC) != 6 || (!e.Gateway && e.IfIndex == 0) {
			return fmt.Errorf("fdb entry %v of network %d: invalid MAC or no port", e.MAC, e.NetID)
		}
		k, v := fdbEntry(e)
		wf[k] = v
	}
	t := d.tab
	t.mu.Lock()
	defer t.mu.Unlock()
	if err := errors.Join(t.l2Neigh.known(), t.fdb.known()); err != nil {
		return err
	}
	nPuts, nVals, nDels := t.l2Neigh.diff(wn, nil)
	fPuts, fVals, fDels := t.fdb.diff(wf, nil)
	for _, step := range []func() error{
		func() error { return t.l2Neigh.del(nDels) },
		func() error { return t.fdb.put(fPuts, fVals) },
		func() error { return t.fdb.del(fDels) },
		func() error { return t.l2Neigh.put(nPuts, nVals) },
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
		out = append(out, FDBEntry{NetID: k.NetId, MAC: append(net.HardwareAddr(nil), k.Mac[:]...),
			IfIndex: v.Ifindex, Gateway: v.Flags&fdbGateway != 0})
	}
	return out, it.Err()
}

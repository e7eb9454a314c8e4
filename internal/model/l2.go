package model

import (
	"bytes"
	"net"
	"net/netip"
	"slices"
	"sort"

	lacev1 "github.com/lace-cni/lace/api/v1alpha1"
	"github.com/lace-cni/lace/internal/tables"
)

// l2Place is an address of an l2 network placed where its MAC lives: a
// Neighbor (address -> MAC) joined with the FDBEntry of its MAC (MAC ->
// node). Both are lace-controller's, so a node cannot place another
// node's address by writing them.
type l2Place struct {
	network string
	addr    netip.Addr
	mac     net.HardwareAddr
	node    string
	learned bool
	// seq and standby are its FDBEntry's: the move sequence, and the
	// node a live migration's target runs on ("": none).
	seq     uint32
	standby string
}

// l2Located joins Neighbors and FDBEntries, in name order, skipping what is
// being deleted, malformed, or whose MAC is on no node. A Neighbor joins
// only the FDBEntry of its own holder (sameHolder): one left pointing at a
// MAC another holds (an assignment refused after its address was claimed,
// a MAC that moved) must not place that address where the other's MAC
// lives, on whose port it would be delivered.
func l2Located(in NodeInput) []l2Place {
	type macKey struct{ network, mac string }
	where := make(map[macKey]*lacev1.FDBEntry, len(in.FDBEntries))
	for i, f := range in.FDBEntries {
		mac, err := net.ParseMAC(string(f.Spec.MAC))
		if f.DeletionTimestamp != nil || err != nil || len(mac) != 6 || f.Spec.Node == "" {
			continue
		}
		where[macKey{f.Spec.Network, mac.String()}] = &in.FDBEntries[i]
	}
	nbrs := append([]lacev1.Neighbor(nil), in.Neighbors...)
	sort.Slice(nbrs, func(i, j int) bool { return nbrs[i].Name < nbrs[j].Name })
	var out []l2Place
	for _, n := range nbrs {
		a, err1 := netip.ParseAddr(string(n.Spec.Address))
		mac, err2 := net.ParseMAC(string(n.Spec.MAC))
		if n.DeletionTimestamp != nil || err1 != nil || err2 != nil || len(mac) != 6 {
			continue
		}
		f, ok := where[macKey{n.Spec.Network, mac.String()}]
		if !ok || !sameHolder(&n, f) {
			continue
		}
		p := l2Place{network: n.Spec.Network, addr: a.Unmap(), mac: mac, node: f.Spec.Node, learned: n.Spec.Learned, seq: uint32(f.Spec.Sequence)}
		if !f.Spec.Learned { // a learned MAC moves by the learning, never to a standby
			p.standby = f.Spec.Standby
		}
		out = append(out, p)
	}
	return out
}

// sameHolder tells whether a Neighbor and an FDBEntry are held for the
// same endpoint or IPAMClaim (lace-controller's holder labels). A learned
// address on a MAC its endpoint holds through an IPAMClaim carries both.
func sameHolder(n *lacev1.Neighbor, f *lacev1.FDBEntry) bool {
	for _, l := range []string{lacev1.LabelEndpointUID, lacev1.LabelIPAMClaimUID} {
		if v := n.Labels[l]; v != "" && v == f.Labels[l] {
			return true
		}
	}
	return false
}

// l2Host gives an l2 network a block for one of its addresses, at the node
// its MAC lives on: an l2 subnet spans nodes, so views route it address by
// address (what is switched inside the network never looks at views). An
// address outside the network's subnets, or on a node without a locator,
// is not routed, nor a learned one: routing reaches a pod's assigned
// addresses (its endpoint entry), a learned address is only switched.
func l2Host(h l2Place, self string, byName map[string]*viewNet, locators map[string]netip.Prefix) {
	vn := byName[h.network]
	if vn == nil || !vn.l2 || h.learned {
		return
	}
	p := netip.PrefixFrom(h.addr, h.addr.BitLen())
	if !coveredBy(vn.prefixes, p) {
		return
	}
	for _, b := range vn.blocks {
		if b.prefix == p {
			return // the first Neighbor of an address wins
		}
	}
	b := viewBlock{prefix: p, local: h.node == self}
	if !b.local {
		loc, ok := locators[h.node]
		if !ok {
			return
		}
		b.locator = loc
	}
	vn.blocks = append(vn.blocks, b)
}

// l2Tables are the node's l2 neighbour tables (every located address of
// an l2 network with an ID), the MACs that live on other nodes (with the
// SID of the network in that node's locator; the sender sets its
// behaviour), and per network the other nodes with ports in it, which its
// flooded frames go to (their DT2M SIDs).
func l2Tables(in NodeInput, located []l2Place, ids map[string]uint32, locators map[string]netip.Prefix) ([]tables.L2Neighbor, []tables.FDBEntry, []tables.L2FloodNode) {
	l2 := map[string]*lacev1.Network{}
	for i := range in.Networks {
		if n := &in.Networks[i]; n.Spec.Type == lacev1.NetworkTypeL2 {
			l2[n.Name] = n
		}
	}
	var neigh []tables.L2Neighbor
	var fdb []tables.FDBEntry
	var flood []tables.L2FloodNode
	seenAddr := map[string]bool{}
	seenMAC := map[string]bool{}
	seenNode := map[string]bool{}
	for _, h := range located {
		id, ok := ids[h.network]
		if l2[h.network] == nil || !ok || !inSubnets(l2[h.network], h.addr) {
			continue
		}
		if k := h.network + "/" + h.addr.String(); !seenAddr[k] {
			seenAddr[k] = true
			neigh = append(neigh, tables.L2Neighbor{NetID: id, Addr: h.addr, MAC: h.mac})
		}
		if k := h.network + "/" + h.mac.String(); !seenMAC[k] {
			if e, ok := fdbEntryOf(h, in.Node, id, locators); ok {
				seenMAC[k] = true
				fdb = append(fdb, e)
			}
		}
		// A live migration's target node hears the network's floods too:
		// its VM may be there already.
		for _, node := range []string{h.node, h.standby} {
			loc, ok := locators[node]
			if k := h.network + "/" + node; node != "" && node != in.Node && ok && !seenNode[k] {
				seenNode[k] = true
				flood = append(flood, tables.L2FloodNode{NetID: id, SID: tables.SID(loc, tables.BehaviourL2Flood, id, id)})
			}
		}
	}
	sort.Slice(neigh, func(i, j int) bool {
		if neigh[i].NetID != neigh[j].NetID {
			return neigh[i].NetID < neigh[j].NetID
		}
		return neigh[i].Addr.Less(neigh[j].Addr)
	})
	sort.Slice(fdb, func(i, j int) bool {
		if fdb[i].NetID != fdb[j].NetID {
			return fdb[i].NetID < fdb[j].NetID
		}
		return bytes.Compare(fdb[i].MAC, fdb[j].MAC) < 0
	})
	sort.Slice(flood, func(i, j int) bool {
		if flood[i].NetID != flood[j].NetID {
			return flood[i].NetID < flood[j].NetID
		}
		return flood[i].SID.Less(flood[j].SID)
	})
	return neigh, fdb, flood
}

// fdbEntryOf is the cluster's FDB entry on node self for the MAC of h:
// where it lives when that is another node, and its standby (a live
// migration's target) when it has one, here or on another node.
func fdbEntryOf(h l2Place, self string, id uint32, locators map[string]netip.Prefix) (tables.FDBEntry, bool) {
	e := tables.FDBEntry{NetID: id, MAC: h.mac, Seq: h.seq}
	if h.standby != "" && h.standby != h.node {
		if h.standby == self {
			e.StandbyHere = true
		} else if loc, ok := locators[h.standby]; ok {
			e.StandbySID = tables.SID(loc, tables.BehaviourL2IP, id, id)
		}
	}
	if h.node == self {
		e.Here = true
		return e, e.StandbySID.IsValid()
	}
	loc, ok := locators[h.node]
	if !ok {
		return e, false
	}
	e.SID = tables.SID(loc, tables.BehaviourL2IP, id, id)
	return e, true
}

// inSubnets tells whether a is in one of n's subnets (the controller gives
// no other address; a Neighbor outside them is not believed).
func inSubnets(n *lacev1.Network, a netip.Addr) bool {
	for _, sn := range []*lacev1.Subnet{n.Spec.IPv4Subnet, n.Spec.IPv6Subnet} {
		if sn == nil {
			continue
		}
		if p, err := netip.ParsePrefix(string(sn.Prefix)); err == nil && p.Masked().Contains(a) {
			return true
		}
	}
	return false
}

// IsAnonymous tells whether n is closed to its own endpoints. Never an l2
// network: the API refuses the flag there (its ports are one segment,
// switched, never through a view), and one stored before that rule is
// read as open, as its ports behave.
func IsAnonymous(n *lacev1.Network) bool {
	return n.Spec.Anonymous && n.Spec.Type != lacev1.NetworkTypeL2
}

// L2Learned is a learned MAC of an l2 network that lives on this node, at
// the port of Endpoint (the NetworkEndpoint's namespace/name).
type L2Learned struct {
	NetID    uint32
	MAC      net.HardwareAddr
	Endpoint string
}

// l2Learning are the IDs of the learning l2 networks and the learned MACs
// placed on this node (FDBEntries lace-controller published, learned,
// with the endpoint they are held for), in order.
func l2Learning(in NodeInput, ids map[string]uint32) ([]uint32, []L2Learned) {
	var learning []uint32
	for _, n := range in.Networks {
		if id, ok := ids[n.Name]; ok && n.Spec.Type == lacev1.NetworkTypeL2 && n.Spec.L2 != nil && n.Spec.L2.Learning {
			learning = append(learning, id)
		}
	}
	slices.Sort(learning)
	var out []L2Learned
	for _, f := range in.FDBEntries {
		mac, err := net.ParseMAC(string(f.Spec.MAC))
		id, ok := ids[f.Spec.Network]
		ep := f.Annotations[lacev1.AnnotationEndpoint]
		if !f.Spec.Learned || f.Spec.Node != in.Node || f.DeletionTimestamp != nil || err != nil || len(mac) != 6 || !ok || ep == "" ||
			!slices.Contains(learning, id) {
			continue
		}
		out = append(out, L2Learned{NetID: id, MAC: mac, Endpoint: ep})
	}
	sort.Slice(out, func(i, j int) bool {
		if out[i].NetID != out[j].NetID {
			return out[i].NetID < out[j].NetID
		}
		return bytes.Compare(out[i].MAC, out[j].MAC) < 0
	})
	return learning, out
}

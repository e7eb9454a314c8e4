package datapath

import (
	"errors"
	"fmt"
	"maps"
	"net/netip"
	"slices"
	"sync"

	"github.com/cilium/ebpf"
)

// nodeTables are the maps the agent programs from its desired state, each
// written through its table (reconcile.go). mu serializes them: the
// applier syncs, the periodic check repairs. The announcer's table has a
// lock of its own (announceMu, taken after mu): its renewals, a few times
// a lease duration, must never wait for a sync (a burst of pods held mu
// for seconds, the renewal lapsed, and the VIP moved).
type nodeTables struct {
	mu         sync.Mutex
	announceMu sync.Mutex
	// checkSkips counts each table's checks skipped in a row
	// (maxCheckSkips).
	checkSkips map[string]int
	cfg        *table[uint32, podLaceConfig]
	hostAddrs  *table[podHostKey, uint32]
	nodes      *table[podHostKey, uint32]
	nodeLocs   *table[podHostKey, uint64]
	networks   *table[uint32, podNetVal]
	routes     *table[podRouteKey, podRouteVal]
	classify   *table[podClassKey, uint32]
	inside     *table[podClassKey, uint32]
	endpoints  *table[podEpKey, podEpVal]
	ports      *table[uint32, podPortVal]
	podNetns   *table[uint64, uint32]
	services   *table[podSvcKey, podSvcVal]
	backends   *table[podBackendKey, podBackendVal]
	srcRanges  *table[podSrcRangeKey, uint32]
	announce   *table[podHostKey, underlayAnnounceVal]
	l2Neigh    *table[l2L2NeighKey, l2L2NeighVal]
	fdb        *table[l2FdbKey, l2FdbVal]
	l2Nets     *table[uint32, l2L2NetVal]
	l2Flood    *table[l2L2FloodKey, l2L2FloodVal]
	l2         l2Want
	pol        policyTables
	// endpointsRead says the endpoint table was read from the kernel
	// once (SyncEndpoints' first sync); removedAddrs are the pod
	// addresses it removed whose flows ForgetRemovedFlows has not
	// forgotten yet.
	endpointsRead bool
	removedAddrs  map[podEpKey]bool
	// flowKey keys the endpoint pick's flow hash (lb_flow_hash): drawn
	// once per node and kept in the pinned config, so that an agent
	// restart leaves every flow's draw as it was.
	flowKey [2]uint64
}

func (d *Datapath) newTables() {
	p := &d.pod
	d.tab = &nodeTables{
		removedAddrs: map[podEpKey]bool{},
		cfg:          newTable[uint32, podLaceConfig]("lace_cfg", p.LaceCfg),
		hostAddrs:    newTable[podHostKey, uint32]("lace_host_addrs", p.LaceHostAddrs),
		nodes:        newTable[podHostKey, uint32]("lace_nodes", p.LaceNodes),
		nodeLocs:     newTable[podHostKey, uint64]("lace_node_locs", p.LaceNodeLocs),
		networks:     newTable[uint32, podNetVal]("lace_networks", p.LaceNetworks),
		routes:       newTable[podRouteKey, podRouteVal]("lace_routes", p.LaceRoutes),
		classify:     newTable[podClassKey, uint32]("lace_classify", p.LaceClassify),
		inside:       newTable[podClassKey, uint32]("lace_inside", p.LaceInside),
		endpoints:    newTable[podEpKey, podEpVal]("lace_endpoints", p.LaceEndpoints),
		ports:        newTable[uint32, podPortVal]("lace_ports", p.LacePorts),
		podNetns:     newTable[uint64, uint32]("lace_pod_netns", p.LacePodNetns),
		services:     newTable[podSvcKey, podSvcVal]("lace_services", p.LaceServices),
		backends:     newTable[podBackendKey, podBackendVal]("lace_backends", p.LaceBackends),
		srcRanges:    newTable[podSrcRangeKey, uint32]("lace_src_ranges", p.LaceSrcRanges),
		announce:     newTable[podHostKey, underlayAnnounceVal]("lace_announce", d.underlay.LaceAnnounce),
		l2Neigh:      newTable[l2L2NeighKey, l2L2NeighVal]("lace_l2_neigh", d.l2.LaceL2Neigh),
		fdb:          newTable[l2FdbKey, l2FdbVal]("lace_fdb", d.l2.LaceFdb),
		l2Nets:       newTable[uint32, l2L2NetVal]("lace_l2_nets", d.l2.LaceL2Nets),
		l2Flood:      newTable[l2L2FloodKey, l2L2FloodVal]("lace_l2_flood", d.l2.LaceL2Flood),
	}
	d.newPolicyTables()
}

// checker is a table as CheckTables sees it.
type checker interface {
	check() (int, error)
	tableName() string
}

// outsideChecker is a checker that can read the kernel while the tables'
// lock is released (table.checkOutside).
type outsideChecker interface {
	checkOutside(unlocked func(func())) (n int, skipped bool, err error)
}

// maxCheckSkips is how many checks in a row a table may skip for writes
// that came during its read before one is made under the lock: a table
// written on every sync (a Service changing every second) is still
// checked, every few periods.
const maxCheckSkips = 3

func (t *table[K, V]) tableName() string { return t.name }

// announceChecker checks the announcer's table under its own lock.
type announceChecker struct{ t *nodeTables }

func (a announceChecker) check() (int, error) {
	a.t.announceMu.Lock()
	defer a.t.announceMu.Unlock()
	return a.t.announce.check()
}

func (a announceChecker) tableName() string { return a.t.announce.tableName() }

// CheckTables reads every map the agent programs and repairs what differs
// from what was written (an entry someone else deleted, added or
// changed), as a periodic safety net: syncs never read the kernel. It
// returns the number of entries repaired, by map (none: an empty map).
// A map whose mirror is unknown is read and adopted instead.
func (d *Datapath) CheckTables() (map[string]int, error) {
	t := d.tab
	t.mu.Lock()
	defer t.mu.Unlock()
	// Entries before those pointing to them: backends and ranges before
	// services, namespaces before ports.
	out := map[string]int{}
	var errs []error
	unlocked := func(read func()) {
		t.mu.Unlock()
		defer t.mu.Lock()
		read()
	}
	if t.checkSkips == nil {
		t.checkSkips = map[string]int{}
	}
	for _, c := range []checker{t.hostAddrs, t.cfg, t.nodes, t.nodeLocs, t.networks, t.backends, t.srcRanges, t.services,
		t.routes, t.classify, t.inside, t.podNetns, t.ports, t.endpoints, announceChecker{t}, t.fdb, t.l2Neigh, t.l2Flood, t.l2Nets,
		t.pol.verdicts, t.pol.cidrs, t.pol.peers, t.pol.eps} {
		var n int
		var err error
		name := c.tableName()
		if oc, ok := c.(outsideChecker); ok && t.checkSkips[name] < maxCheckSkips {
			var skipped bool
			if n, skipped, err = oc.checkOutside(unlocked); skipped {
				t.checkSkips[name]++
				continue
			}
		} else {
			n, err = c.check()
		}
		t.checkSkips[name] = 0
		if err != nil {
			errs = append(errs, err)
		}
		if n > 0 {
			out[c.tableName()] = n
		}
	}
	return out, errors.Join(errs...)
}

// set is the desired state of a table whose value is a constant.
func set[K comparable, T any](items []T, key func(T) K, v uint32) map[K]uint32 {
	out := make(map[K]uint32, len(items))
	for _, it := range items {
		out[key(it)] = v
	}
	return out
}

// SyncHostAddrs makes the node's own addresses exactly want.
func (d *Datapath) SyncHostAddrs(want []netip.Addr) error {
	d.tab.mu.Lock()
	defer d.tab.mu.Unlock()
	return d.tab.hostAddrs.sync(set(want, hostKey, 1), nil)
}

// SyncNodes makes the cluster nodes' underlay addresses exactly want.
func (d *Datapath) SyncNodes(want []netip.Addr) error {
	d.tab.mu.Lock()
	defer d.tab.mu.Unlock()
	return d.tab.nodes.sync(set(want, hostKey, 1), nil)
}

// SyncNodeLocators makes the nodes' locators exactly want.
func (d *Datapath) SyncNodeLocators(want []NodeLocator) error {
	m := make(map[podHostKey]uint64, len(want))
	for _, n := range want {
		k, v := nodeLocEntry(n)
		m[k] = v
	}
	d.tab.mu.Lock()
	defer d.tab.mu.Unlock()
	return d.tab.nodeLocs.sync(m, nil)
}

// SyncNetworks makes the networks exactly want.
func (d *Datapath) SyncNetworks(want []Network) error {
	m := make(map[uint32]podNetVal, len(want))
	for _, n := range want {
		m[n.ID] = netVal(n)
	}
	d.tab.mu.Lock()
	defer d.tab.mu.Unlock()
	return d.tab.networks.sync(m, nil)
}

// SyncRoutes makes the views exactly want. A route that cannot be written
// (an unknown kind) is an error; the entry the map has for its prefix, if
// any, stays.
func (d *Datapath) SyncRoutes(want []Route) error {
	m := make(map[podRouteKey]podRouteVal, len(want))
	var bad map[podRouteKey]bool
	var errs []error
	for _, r := range want {
		k, v, err := routeEntry(r)
		if err != nil {
			if bad == nil {
				bad = map[podRouteKey]bool{}
			}
			bad[k] = true
			errs = append(errs, err)
			continue
		}
		m[k] = v
	}
	d.tab.mu.Lock()
	defer d.tab.mu.Unlock()
	errs = append(errs, d.tab.routes.sync(m, func(k podRouteKey) bool { return bad[k] }))
	return errors.Join(errs...)
}

// SyncClassifiers makes the external prefixes that classify sources
// exactly want.
func (d *Datapath) SyncClassifiers(want []Classifier) error {
	m := make(map[podClassKey]uint32, len(want))
	for _, c := range want {
		m[classKey(c.Prefix)] = c.NetID
	}
	d.tab.mu.Lock()
	defer d.tab.mu.Unlock()
	return d.tab.classify.sync(m, nil)
}

// SyncInsides makes the prefixes inside the cluster exactly want.
func (d *Datapath) SyncInsides(want []Inside) error {
	m := make(map[podClassKey]uint32, len(want))
	for _, in := range want {
		m[classKey(in.Prefix)] = uint32(in.Kind)
	}
	d.tab.mu.Lock()
	defer d.tab.mu.Unlock()
	return d.tab.inside.sync(m, nil)
}

// SyncEndpoints makes the local pod addresses want, except that an entry
// busy says so (a pod whose ADD is in progress owns it) is never removed.
func (d *Datapath) SyncEndpoints(want []Endpoint, busy func(netID uint32, a netip.Addr) bool) error {
	m := make(map[podEpKey]podEpVal, len(want))
	for _, e := range want {
		k, v := endpointEntry(e)
		m[k] = v
	}
	var keep func(podEpKey) bool
	if busy != nil {
		keep = func(k podEpKey) bool { return busy(k.NetId, fromAddr16(k.Family, k.Addr)) }
	}
	d.tab.mu.Lock()
	defer d.tab.mu.Unlock()
	t := d.tab.endpoints
	// The first sync after a load (an agent's start) only reads what the
	// kernel holds: an entry missing there is a pod the map lost (a map
	// recreated by an upgrade), not an address given to a new pod, and
	// its flows are the pod's own. Only the first: a sync that failed
	// leaves the table unknown, and the next one reads it again, but an
	// address it then finds missing is a new pod's.
	first := !d.tab.endpointsRead
	if err := t.known(); err != nil {
		return err
	}
	d.tab.endpointsRead = true
	var fresh []podEpKey
	for k := range m {
		if _, ok := t.have[k]; !ok && !first {
			fresh = append(fresh, k)
			delete(d.tab.removedAddrs, k) // forgotten now, with its peers' flows
		}
	}
	for k := range t.have {
		if _, ok := m[k]; !ok && (keep == nil || !keep(k)) {
			d.tab.removedAddrs[k] = true
		}
	}
	if err := d.forgetAddrFlows(fresh, true); err != nil {
		return err
	}
	return t.sync(m, keep)
}

// ForgetRemovedFlows forgets the flows of the pod addresses SyncEndpoints
// removed, once their ports are gone too (the caller's order: endpoints,
// ports, programs, then this), so that no packet of the pod makes a new
// one after. A deleted pod's flows go with it: a TCP flow the pod never
// closed would otherwise stay established for CT_TCP_EST and hold its
// SNAT port (ReclaimSNAT frees only the mappings of flows that are over)
// for hours after the pod. Only the flows keyed from the address go: a
// local client's flow toward it may still be answered from elsewhere (an
// l2 VM that migrated to another node); reuse forgets those.
func (d *Datapath) ForgetRemovedFlows() error {
	d.tab.mu.Lock()
	defer d.tab.mu.Unlock()
	if len(d.tab.removedAddrs) == 0 {
		return nil
	}
	if err := d.forgetAddrFlows(slices.Collect(maps.Keys(d.tab.removedAddrs)), false); err != nil {
		return err
	}
	clear(d.tab.removedAddrs)
	return nil
}

// forgetAddrFlows removes this node's conntrack entries keyed from the
// pod addresses keys name, and with toward those of flows toward them in
// their network. Before an address is given to a new pod, both go: a flow
// of the pod that held the address before (or of a local pod with it)
// would otherwise pass the new one's packets as replies, past its
// policies and its view, and deliver the old peer's "replies" to it, past
// its ingress policy. Conntrack keys carry addresses, not pods. It walks
// every conntrack map: the cost of a pod's first attach and of its
// delete.
func (d *Datapath) forgetAddrFlows(keys []podEpKey, toward bool) error {
	if len(keys) == 0 {
		return nil
	}
	type netAddr struct {
		net uint32
		a   netip.Addr
	}
	addrs := map[netAddr]bool{}
	for _, k := range keys {
		addrs[netAddr{k.NetId, fromAddr16(k.Family, k.Addr)}] = true
	}
	for _, m := range d.ctMaps() {
		var doomed []podCtKey
		var noBatch bool
		err := walk(m, &noBatch, func(k podCtKey, v podCtVal) {
			if addrs[netAddr{k.NetId, fromAddr16(k.Family, k.Laddr)}] || (toward && addrs[netAddr{v.PeerNet, fromAddr16(k.Family, k.Raddr)}]) {
				doomed = append(doomed, k)
			}
		})
		if err != nil {
			return fmt.Errorf("walk conntrack: %w", err)
		}
		if err := deleteFlows(m, doomed); err != nil {
			return fmt.Errorf("forget the flows of pod addresses: %w", err)
		}
	}
	return nil
}

// deleteFlows deletes keys from a conntrack map, in batches where the
// kernel has them; keys the LRU took meanwhile are no matter.
func deleteFlows(m *ebpf.Map, keys []podCtKey) error {
	for len(keys) > 0 {
		n := min(len(keys), tableBatch)
		done, err := m.BatchDelete(keys[:n], nil)
		switch {
		case errors.Is(err, ebpf.ErrNotSupported):
			for _, k := range keys {
				if err := m.Delete(k); err != nil && !isMissing(err) {
					return err
				}
			}
			return nil
		case errors.Is(err, ebpf.ErrKeyNotExist):
			// The batch stops at the missing key: go on after it.
			n = min(done+1, n)
		case err != nil:
			return err
		}
		keys = keys[n:]
	}
	return nil
}

// SyncPorts makes the pod ports want (and their namespaces' entries),
// except that a port busy says so is never removed. The ports that go
// are removed first; a port's namespace entry is written before the port
// (PORT_SOCK_LB sends its pod's sockets to the socket hooks, which must
// find the pod) and removed after it.
func (d *Datapath) SyncPorts(want []Port, busy func(ifindex uint32) bool) error {
	wantPorts := make(map[uint32]podPortVal, len(want))
	wantNS := map[uint64]uint32{}
	for _, p := range want {
		wantPorts[p.IfIndex] = portVal(p)
		if p.NetNSCookie != 0 {
			wantNS[p.NetNSCookie] = p.IfIndex
		}
	}
	t := d.tab
	t.mu.Lock()
	defer t.mu.Unlock()
	if err := errors.Join(t.ports.known(), t.podNetns.known()); err != nil {
		return err
	}
	portPuts, portVals, portDels := t.ports.diff(wantPorts, busy)
	nsPuts, nsVals, nsDels := t.podNetns.diff(wantNS, func(c uint64) bool { return busy != nil && busy(t.podNetns.have[c]) })
	// The namespaces of ports that go, with them; those of ports that
	// stay (a cookie that changed), once the port is rewritten.
	var early, late []uint64
	for _, c := range nsDels {
		if _, ok := wantPorts[t.podNetns.have[c]]; ok {
			late = append(late, c)
		} else {
			early = append(early, c)
		}
	}
	for _, step := range []func() error{
		func() error { return t.ports.del(portDels) },
		func() error { return t.podNetns.del(early) },
		func() error { return t.podNetns.put(nsPuts, nsVals) },
		func() error { return t.ports.put(portPuts, portVals) },
		func() error { return t.podNetns.del(late) },
	} {
		if err := step(); err != nil {
			return fmt.Errorf("sync ports: %w", err)
		}
	}
	return nil
}

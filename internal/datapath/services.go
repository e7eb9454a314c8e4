package datapath

import (
	"errors"
	"fmt"
	"maps"
	"net/netip"
	"slices"

	"github.com/cilium/ebpf"
	"golang.org/x/sys/unix"

	"github.com/lace-cni/lace/internal/tables"
)

// Service and Backend are the values of the services and backends maps.
type (
	Service = tables.Service
	Backend = tables.Backend
)

// svc_val.flags (bpf/include/maps.h).
const (
	svcDrop      = 1
	svcExternal  = 2
	svcSNAT      = 4
	svcLocal     = 8
	svcClosed    = 16
	svcSrcRanges = 32
	svcKindShift = 6
	svcKindMask  = 7
	// backendClusterRef is the backend index of a frontend's ClusterIP.
	backendClusterRef = 1<<32 - 1
	// maxFrontendBackends is the most backends one frontend holds: the
	// count in lace_services is 16 bits (model.MaxFrontendBackends).
	maxFrontendBackends = 1<<16 - 1
)

// svcVal is the map value of s (ID id).
func svcVal(s *Service, id uint32) podSvcVal {
	v := podSvcVal{Id: id, NetId: s.NetID, Count: uint16(len(s.Backends)), Affinity: s.AffinitySeconds}
	if s.Drop {
		v.Flags |= svcDrop
	}
	if s.External() {
		v.Flags |= svcExternal | uint16(s.Frontend)<<svcKindShift
		// A hostPort's one backend is on this node: neither Local's
		// in-cluster redirection nor Cluster's SNAT applies.
		if s.Local {
			v.Flags |= svcLocal
		} else if s.Frontend != tables.FrontendHostPort {
			v.Flags |= svcSNAT
		}
		if s.Closed {
			v.Flags |= svcClosed
		}
		if len(s.SourceRanges) > 0 {
			v.Flags |= svcSrcRanges
		}
	}
	return v
}

// serviceOf is the service of a map entry, backends aside.
func serviceOf(k podSvcKey, v podSvcVal) Service {
	s := Service{VIP: fromAddr16(k.Family, k.Vip), Proto: k.Proto, Port: ntohs(k.Port),
		NetID: v.NetId, Drop: v.Flags&svcDrop != 0, AffinitySeconds: v.Affinity}
	if v.Flags&svcExternal != 0 {
		s.Frontend = tables.Frontend(v.Flags >> svcKindShift & svcKindMask)
		s.Local = v.Flags&svcLocal != 0
		s.Closed = v.Flags&svcClosed != 0
	}
	return s
}

// sameService tells whether a and b are written the same way.
func sameService(a, b *Service) bool {
	return slices.Equal(a.Backends, b.Backends) && a.NetID == b.NetID && a.Drop == b.Drop &&
		a.AffinitySeconds == b.AffinitySeconds && a.Frontend == b.Frontend && a.ClusterIP == b.ClusterIP &&
		a.ClusterPort == b.ClusterPort && a.Local == b.Local && a.Closed == b.Closed &&
		slices.Equal(a.SourceRanges, b.SourceRanges)
}

func srcRangeKey(id uint32, p netip.Prefix) podSrcRangeKey {
	return podSrcRangeKey{Prefixlen: 64 + uint32(p.Bits()), Id: id, Family: family(p.Addr()), Addr: addr16(p.Masked().Addr())}
}

func svcKey(s Service) podSvcKey {
	return podSvcKey{Family: family(s.VIP), Proto: s.Proto, Port: ntohs(s.Port), Vip: addr16(s.VIP)}
}

type svcEntry struct {
	key podSvcKey
	val podSvcVal
}

// ServiceKey names one service port.
type ServiceKey = tables.FrontendKey

// Services reads the services the data plane serves, backends included.
func (d *Datapath) Services() ([]Service, error) {
	entries, err := d.serviceEntries()
	if err != nil {
		return nil, err
	}
	ranges, err := d.sourceRanges()
	if err != nil {
		return nil, err
	}
	out := make([]Service, 0, len(entries))
	for _, e := range entries {
		s := serviceOf(e.key, e.val)
		if s.External() {
			var b podBackendVal
			if err := d.pod.LaceBackends.Lookup(podBackendKey{Id: e.val.Id, Index: backendClusterRef}, &b); err != nil {
				return nil, fmt.Errorf("cluster IP of frontend %s:%d: %w", s.VIP, s.Port, err)
			}
			s.ClusterIP, s.ClusterPort = fromAddr16(e.key.Family, b.Addr), ntohs(b.Port)
			s.SourceRanges = ranges[e.val.Id]
		}
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

// sourceRanges reads the source ranges of every frontend, by service ID,
// sorted.
func (d *Datapath) sourceRanges() (map[uint32][]netip.Prefix, error) {
	out := map[uint32][]netip.Prefix{}
	err := readMap(d.pod.LaceSrcRanges, func(k podSrcRangeKey, _ uint32) {
		out[k.Id] = append(out[k.Id], netip.PrefixFrom(fromAddr16(k.Family, k.Addr), int(k.Prefixlen)-64))
	})
	for _, ps := range out {
		slices.SortFunc(ps, comparePrefix)
	}
	return out, err
}

func comparePrefix(a, b netip.Prefix) int {
	if c := a.Addr().Compare(b.Addr()); c != 0 {
		return c
	}
	return a.Bits() - b.Bits()
}

func (d *Datapath) serviceEntries() (map[ServiceKey]svcEntry, error) {
	out := map[ServiceKey]svcEntry{}
	var k podSvcKey
	var v podSvcVal
	it := d.pod.LaceServices.Iterate()
	for it.Next(&k, &v) {
		out[ServiceKey{VIP: fromAddr16(k.Family, k.Vip), Proto: k.Proto, Port: ntohs(k.Port)}] = svcEntry{k, v}
	}
	return out, it.Err()
}

// ApplyServices makes the services map equal want, writing only what
// differs, judged against what the maps' tables last wrote (a
// ServiceTable kept across calls also spares rebuilding the services
// from them). It returns the endpoints that stopped being a backend of a
// service, so that their flows can be forgotten (FlushServiceFlows).
func (d *Datapath) ApplyServices(want []Service) (Gone, error) {
	return NewServiceTable(d).Apply(want)
}

// Gone is what an Apply took out of the services, by service: Left
// stopped being a backend (an endpoint no longer ready, or gone), and
// Unlisted are those of them that left the service's slices altogether,
// Lingering included, or whose service went.
//
// Listed is set by the first Apply of an agent (the maps read from the
// kernel, what lingered before unknown): every service's endpoints,
// backends and lingering. A flow of a service to an endpoint not listed
// for it goes (the agent may have missed its endpoint leaving while it
// was down).
type Gone struct {
	Left, Unlisted map[ServiceKey][]Backend
	Listed         map[ServiceKey][]Backend
}

// Empty tells whether g names no endpoint to forget the flows of.
func (g Gone) Empty() bool { return len(g.Left) == 0 && len(g.Unlisted) == 0 && g.Listed == nil }

// Walks tells whether FlushServiceFlows(g) walks the conntrack maps: a
// TCP endpoint that only left the backends (not ready, terminating)
// keeps its flows, so g of those alone walks nothing.
func (g Gone) Walks() bool {
	if len(g.Unlisted) > 0 || g.Listed != nil {
		return true
	}
	for k, bs := range g.Left {
		if k.Proto != unix.IPPROTO_TCP && len(bs) > 0 {
			return true
		}
	}
	return false
}

func newGone() Gone {
	return Gone{Left: map[ServiceKey][]Backend{}, Unlisted: map[ServiceKey][]Backend{}}
}

// sameBackends tells whether a and b hold the same endpoints in the same
// order: at once when they are the same slice, as a service the model did
// not compute again hands over.
func sameBackends(a, b []Backend) bool {
	if len(a) != len(b) {
		return false
	}
	if len(a) == 0 || &a[0] == &b[0] {
		return true
	}
	return slices.Equal(a, b)
}

// unlisted are the endpoints old balances over or lets linger that now
// (nil: nothing) does not; with now nil, all of them. Linear: a service
// with many lingering endpoints costs a pass over them, not a square.
func unlisted(old, now *Service) []Backend {
	in := map[Backend]bool{}
	if now != nil {
		for _, l := range [][]Backend{now.Backends, now.Lingering} {
			for _, b := range l {
				in[b] = true
			}
		}
	}
	var out []Backend
	for _, l := range [][]Backend{old.Backends, old.Lingering} {
		for _, b := range l {
			if !in[b] {
				out = append(out, b)
			}
		}
	}
	return out
}

// ServiceTable writes the services, backends and source ranges maps and
// remembers the services it wrote, so that applying a desired state costs
// what changed rather than a comparison of every backend. Its writes go
// through the maps' tables (reconcile.go), whose mirrors it builds its
// services from at its first Apply (the tables read the kernel once: what
// an agent before it left is adopted, and removed when no longer wanted)
// and again after a write failed. It decides the order of the writes
// across the three maps; the tables batch them. Nothing else may write
// the maps while it is in use. It is not safe for concurrent use.
type ServiceTable struct {
	d      *Datapath
	loaded bool
	// sweep: the maps were read for the first time; the next Apply
	// returns every service's endpoints (Gone.Listed).
	sweep bool
	cur   map[ServiceKey]*appliedService
	used  map[uint32]bool
	// gen marks the services of the Apply in progress.
	gen uint64
	// skipped are the services the last Apply left out, and why.
	skipped map[ServiceKey]string
	// pendingAff are the affinity entries still to forget (a walk
	// failed), freeing the IDs of removed services, taken until their
	// entries are forgotten.
	pendingAff map[uint32]map[Backend]bool
	freeing    map[uint32]bool
	// forgetHook stands for Datapath.forgetAffinity in tests (nil: the
	// real walk).
	forgetHook func(map[uint32]map[Backend]bool) error
}

// Skipped are the services the last Apply could not write (more backends
// than the data plane holds on one frontend) and left out, and why: the
// budget (model.Budget) refuses them before, this is the last guard, so
// that one bad Service never stops the others from being programmed.
func (t *ServiceTable) Skipped() map[ServiceKey]string { return t.skipped }

// appliedService is a service as the maps hold it.
type appliedService struct {
	id  uint32
	svc Service
	// broken: some backend below the count was missing when the maps
	// were read; the service is written again whatever it is.
	broken bool
	gen    uint64
}

// NewServiceTable is a table of d's services, read at its first Apply.
func NewServiceTable(d *Datapath) *ServiceTable { return &ServiceTable{d: d} }

// load builds t's services from the three maps' mirrors (read from the
// kernel if unknown). The caller holds d.tab.mu.
func (t *ServiceTable) load() error {
	tab := t.d.tab
	if err := errors.Join(tab.backends.known(), tab.srcRanges.known(), tab.services.known()); err != nil {
		return err
	}
	backends := tab.backends.have
	ranges := map[uint32][]netip.Prefix{}
	for k := range tab.srcRanges.have {
		ranges[k.Id] = append(ranges[k.Id], netip.PrefixFrom(fromAddr16(k.Family, k.Addr), int(k.Prefixlen)-64))
	}
	for _, ps := range ranges {
		slices.SortFunc(ps, comparePrefix)
	}
	cur := map[ServiceKey]*appliedService{}
	used := map[uint32]bool{}
	for k, v := range tab.services.have {
		s := serviceOf(k, v)
		a := &appliedService{id: v.Id}
		if s.External() {
			b, ok := backends[podBackendKey{Id: v.Id, Index: backendClusterRef}]
			if !ok {
				a.broken = true
			}
			s.ClusterIP, s.ClusterPort = fromAddr16(k.Family, b.Addr), ntohs(b.Port)
			s.SourceRanges = ranges[v.Id]
		}
		if v.Count > 0 {
			s.Backends = make([]Backend, 0, v.Count)
		}
		for i := range uint32(v.Count) {
			b, ok := backends[podBackendKey{Id: v.Id, Index: i}]
			if !ok {
				a.broken = true
				continue
			}
			s.Backends = append(s.Backends, Backend{Addr: fromAddr16(k.Family, b.Addr), Port: ntohs(b.Port)})
		}
		a.svc = s
		cur[s.Key()] = a
		used[v.Id] = true
	}
	// Affinity entries of no service the maps hold are a removed
	// service's whose forgetting an agent before this one (or a failed
	// write) left undone: forgotten before any ID is given again.
	if err := t.d.sweepAffinity(used); err != nil {
		return err
	}
	if t.freeing == nil {
		t.freeing, t.pendingAff = map[uint32]bool{}, map[uint32]map[Backend]bool{}
	}
	for id := range t.freeing {
		used[id] = true
	}
	// What lingered is not in the maps: a reload after a failed Apply
	// keeps it from before; the first load of an agent has none, and
	// its first Apply sweeps instead (Gone.Listed).
	for k, a := range t.cur {
		if b := cur[k]; b != nil {
			b.svc.Lingering = a.svc.Lingering
		}
	}
	t.sweep = t.cur == nil
	t.cur, t.used, t.loaded = cur, used, true
	return nil
}

// readMap calls fn for every entry of m (read as a table reads it: by
// batches where the kernel supports them on m's type).
func readMap[K, V comparable](m *ebpf.Map, fn func(K, V)) error {
	all, err := newTable[K, V](m.String(), m).read()
	for k, v := range all {
		fn(k, v)
	}
	return err
}

// countEntries counts m's entries (MapSizes, read every few seconds for
// the node's status and metrics): the services and backends maps, which
// hold a hundred thousand entries on a large cluster, by batches; the
// others one key at a time, without reading values.
func (d *Datapath) countEntries(m *ebpf.Map) (int, error) {
	n := 0
	switch m {
	case d.pod.LaceBackends:
		err := readMap(m, func(podBackendKey, podBackendVal) { n++ })
		return n, err
	case d.pod.LaceServices:
		err := readMap(m, func(podSvcKey, podSvcVal) { n++ })
		return n, err
	}
	key := make([]byte, m.KeySize())
	err := m.NextKey(nil, key)
	for ; err == nil; err = m.NextKey(key, key) {
		n++
		if n > int(m.MaxEntries()) {
			// Keys deleted under the walk restart it: give up, as
			// MapIterator does.
			return 0, ebpf.ErrIterationAborted
		}
	}
	if errors.Is(err, ebpf.ErrKeyNotExist) {
		return n, nil
	}
	return n, err
}

// Apply makes the services map equal want, writing only what differs from
// what the table last wrote, deletions before additions (mapWrites.flush).
// It returns the endpoints that stopped being a backend of a service, so
// that their flows can be forgotten (FlushServiceFlows). want's backends
// are kept, not copied: the caller must not change them afterwards.
func (t *ServiceTable) Apply(want []Service) (gone Gone, err error) {
	t.d.tab.mu.Lock()
	defer t.d.tab.mu.Unlock()
	return t.apply(want, nil, false)
}

// ApplyKeys is Apply for a want that differs from the one last applied
// without error only at keys (a service there changed, came or went): it
// visits those alone, and costs what changed rather than a walk of every
// service. keys name every frontend of a Service whose entries changed,
// old and new: a Local frontend's flows follow its ClusterIP's endpoints
// that left, though its own entry may stay as it was. want is sorted by key, as the agent's merge gives it. Keys the
// table cannot judge alone (its maps not read yet, the first Apply's
// sweep to do) make it a whole Apply.
func (t *ServiceTable) ApplyKeys(want []Service, keys []ServiceKey) (gone Gone, err error) {
	t.d.tab.mu.Lock()
	defer t.d.tab.mu.Unlock()
	return t.apply(want, keys, !t.loaded || t.sweep)
}

// apply is Apply (whole) or ApplyKeys. The caller holds d.tab.mu.
func (t *ServiceTable) apply(want []Service, keys []ServiceKey, whole bool) (gone Gone, err error) {
	if !t.loaded {
		if err := t.load(); err != nil {
			return Gone{}, err
		}
	}
	defer func() {
		if err != nil {
			// What the maps hold now is unknown: read them again next time.
			t.loaded = false
		}
	}()
	t.gen++
	r := &serviceRun{t: t, gone: newGone(), deadAff: map[uint32]map[Backend]bool{}, next: 1}
	if t.sweep {
		r.gone.Listed = make(map[ServiceKey][]Backend, len(want))
		for i := range want {
			s := &want[i]
			r.gone.Listed[s.Key()] = unlisted(s, nil)
		}
		t.sweep = false
	}
	if whole || keys == nil {
		t.skipped = nil
		for i := range want {
			r.put(&want[i])
		}
		for k, a := range t.cur {
			if a.gen != t.gen {
				r.remove(k, a)
			}
		}
		for i := range want {
			r.followLocal(&want[i])
		}
		return r.finish()
	}
	// Each key once: a key listed twice would count its Local
	// frontends' departures twice.
	keys = slices.Clone(keys)
	slices.SortFunc(keys, ServiceKey.Compare)
	keys = slices.Compact(keys)
	var at []int // the keys' places in want
	for _, k := range keys {
		delete(t.skipped, k)
		i, ok := tables.FindFrontend(want, k)
		if ok && r.put(&want[i]) {
			at = append(at, i)
			continue
		}
		// Gone, or left out: removed if it was there.
		if a := t.cur[k]; a != nil && a.gen != t.gen {
			r.remove(k, a)
		}
	}
	for _, i := range at {
		r.followLocal(&want[i])
	}
	return r.finish()
}

// serviceRun is one Apply's work: the writes, the endpoints that left,
// and the affinity entries to forget.
type serviceRun struct {
	t    *ServiceTable
	w    mapWrites
	gone Gone
	// deadAff are the affinity entries to forget: every one of a removed
	// service (its ID may be reused), those of endpoints that left, and
	// all of a service whose affinity was turned off or changed.
	deadAff map[uint32]map[Backend]bool
	freed   []uint32
	next    uint32
}

func (r *serviceRun) newID() uint32 {
	for r.t.used[r.next] {
		r.next++
	}
	r.t.used[r.next] = true
	return r.next
}

// put makes s's entries what it wants, and reports whether it is served
// (false: it has more backends than a frontend holds, and is left out).
func (r *serviceRun) put(s *Service) bool {
	t, w := r.t, &r.w
	k := s.Key()
	old := t.cur[k]
	if old != nil && !old.broken && sameService(&old.svc, s) {
		// The maps stay; an endpoint that stopped lingering left the
		// slices.
		if !sameBackends(old.svc.Lingering, s.Lingering) {
			if lost := unlisted(&old.svc, s); len(lost) > 0 {
				r.gone.Unlisted[k] = lost
			}
			old.svc.Lingering = s.Lingering
		}
		old.gen = t.gen
		return true
	}
	if len(s.Backends) > maxFrontendBackends {
		// Left out (and removed if it was there), the others written.
		if t.skipped == nil {
			t.skipped = map[ServiceKey]string{}
		}
		t.skipped[k] = fmt.Sprintf("service %s:%d has %d backends, more than the %d the data plane holds on one frontend",
			s.VIP, s.Port, len(s.Backends), maxFrontendBackends)
		return false
	}
	a := &appliedService{svc: *s, gen: t.gen}
	var oldBackends []Backend
	if old != nil {
		a.id, oldBackends = old.id, old.svc.Backends
	} else {
		a.id = r.newID()
	}
	for i, b := range s.Backends {
		// A backend the map holds at its index already stays.
		if old != nil && !old.broken && i < len(oldBackends) && oldBackends[i] == b {
			continue
		}
		w.backendPuts = append(w.backendPuts, podBackendKey{Id: a.id, Index: uint32(i)})
		w.backendVals = append(w.backendVals, podBackendVal{Addr: addr16(b.Addr), Port: ntohs(b.Port)})
	}
	// A frontend's ClusterIP and source ranges go before it, as its
	// backends do.
	if s.External() {
		w.backendPuts = append(w.backendPuts, podBackendKey{Id: a.id, Index: backendClusterRef})
		w.backendVals = append(w.backendVals, podBackendVal{Addr: addr16(s.ClusterIP), Port: ntohs(s.ClusterPort)})
		for _, p := range s.SourceRanges {
			w.rangePuts = append(w.rangePuts, srcRangeKey(a.id, p))
		}
	}
	if old != nil && old.svc.External() {
		if !s.External() {
			w.backendDels = append(w.backendDels, podBackendKey{Id: a.id, Index: backendClusterRef})
		}
		for _, p := range old.svc.SourceRanges {
			if !slices.Contains(s.SourceRanges, p) {
				w.rangeDels = append(w.rangeDels, srcRangeKey(a.id, p))
			}
		}
	}
	v := svcVal(s, a.id)
	if old != nil && len(s.Backends) < len(oldBackends) && shrinkFirst(&old.svc, s) {
		// A service that loses backends frees their entries before
		// anything is added: its count goes down first (the backends
		// below it are there, old or new), then its tail.
		w.shrinkPuts = append(w.shrinkPuts, svcKey(*s))
		w.shrinkVals = append(w.shrinkVals, v)
		for i := len(s.Backends); i < len(oldBackends); i++ {
			w.shrinkDels = append(w.shrinkDels, podBackendKey{Id: a.id, Index: uint32(i)})
		}
	} else {
		w.svcPuts = append(w.svcPuts, svcKey(*s))
		w.svcVals = append(w.svcVals, v)
		for i := len(s.Backends); i < len(oldBackends); i++ {
			w.backendDels = append(w.backendDels, podBackendKey{Id: a.id, Index: uint32(i)})
		}
	}
	if old != nil {
		if lost := unlisted(&old.svc, s); len(lost) > 0 {
			r.gone.Unlisted[k] = lost
		}
		if lost := missing(oldBackends, s.Backends); len(lost) > 0 {
			r.gone.Left[k] = lost
			// Only a service with affinity has entries to forget (those
			// of one that had it went when it was turned off): no walk
			// of the affinity map for every endpoint change.
			if old.svc.AffinitySeconds > 0 {
				r.deadAff[a.id] = map[Backend]bool{}
				for _, b := range lost {
					r.deadAff[a.id][b] = true
				}
			}
		}
		if old.svc.AffinitySeconds != s.AffinitySeconds {
			r.deadAff[a.id] = nil
		}
	}
	t.cur[k] = a
	return true
}

// remove takes service k (held as a) out of the maps.
func (r *serviceRun) remove(k ServiceKey, a *appliedService) {
	w := &r.w
	w.svcDels = append(w.svcDels, svcKey(a.svc))
	for i := range uint32(len(a.svc.Backends)) {
		w.goneBackends = append(w.goneBackends, podBackendKey{Id: a.id, Index: i})
	}
	if a.svc.External() {
		w.goneBackends = append(w.goneBackends, podBackendKey{Id: a.id, Index: backendClusterRef})
		for _, p := range a.svc.SourceRanges {
			w.goneRanges = append(w.goneRanges, srcRangeKey(a.id, p))
		}
	}
	r.gone.Left[k] = a.svc.Backends
	r.gone.Unlisted[k] = unlisted(&a.svc, nil)
	r.deadAff[a.id] = nil
	delete(r.t.cur, k)
	r.freed = append(r.freed, a.id)
}

// followLocal: a pod or the node reaching a Local frontend was sent to one
// of the ClusterIP's endpoints, but its flows are keyed by the frontend:
// they go with the ClusterIP's endpoints that left. The ClusterIP is the
// same Service's, so a change of its endpoints is a change of s's too.
func (r *serviceRun) followLocal(s *Service) {
	if !s.External() || !s.Local {
		return
	}
	k := s.Key()
	ck := ServiceKey{VIP: s.ClusterIP, Proto: s.Proto, Port: s.ClusterPort}
	if lost := r.gone.Left[ck]; len(lost) > 0 {
		r.gone.Left[k] = append(r.gone.Left[k], lost...)
	}
	if lost := r.gone.Unlisted[ck]; len(lost) > 0 {
		r.gone.Unlisted[k] = append(r.gone.Unlisted[k], lost...)
	}
}

// finish writes the run's entries and forgets the affinity it names.
func (r *serviceRun) finish() (Gone, error) {
	t := r.t
	// A removed service's ID stays taken until its clients' affinity is
	// forgotten: a new service given the ID would send them to the old
	// one's endpoints. Recorded before the writes, which may fail after
	// the removal reached the maps; what a failed write or walk left is
	// retried by the next Apply, whatever it wants (and an agent
	// restarted meanwhile sweeps it at load: sweepAffinity).
	for _, id := range r.freed {
		t.freeing[id] = true
	}
	mergeAffinity(t.pendingAff, r.deadAff)
	// gone is returned even when a write fails: forgetting the flows of an
	// endpoint whose removal did not reach the maps costs them one new
	// pick, while a retry, reading the maps, would not see it leave.
	if err := r.w.flush(t.d); err != nil {
		return r.gone, err
	}
	forget := t.d.forgetAffinity
	if t.forgetHook != nil {
		forget = t.forgetHook
	}
	if err := forget(t.pendingAff); err != nil {
		return r.gone, err
	}
	if len(t.freeing) > 0 {
		held := map[uint32]bool{}
		for _, a := range t.cur {
			held[a.id] = true
		}
		for id := range t.freeing {
			if !held[id] {
				delete(t.used, id)
			}
		}
		clear(t.freeing)
	}
	clear(t.pendingAff)
	return r.gone, nil
}

// mergeAffinity adds the affinity entries to forget of more to pending:
// per service ID, every entry (a nil set) or those of the given backends.
func mergeAffinity(pending, more map[uint32]map[Backend]bool) {
	for id, set := range more {
		cur, ok := pending[id]
		switch {
		case !ok:
			pending[id] = maps.Clone(set)
		case cur == nil || set == nil:
			pending[id] = nil
		default:
			maps.Copy(cur, set)
		}
	}
}

// mapWrites are the writes of one Apply, in the order they are made.
type mapWrites struct {
	// The services no longer wanted, and their entries.
	svcDels      []podSvcKey
	goneBackends []podBackendKey
	goneRanges   []podSrcRangeKey
	// Services that shrink: their new value, then their tail.
	shrinkPuts []podSvcKey
	shrinkVals []podSvcVal
	shrinkDels []podBackendKey
	// What is added or changed: backends and ranges before the services
	// that point to them.
	backendPuts []podBackendKey
	backendVals []podBackendVal
	rangePuts   []podSrcRangeKey
	svcPuts     []podSvcKey
	svcVals     []podSvcVal
	// What the services written above no longer point to.
	backendDels []podBackendKey
	rangeDels   []podSrcRangeKey
}

// shrinkFirst tells whether old can be rewritten as now before anything
// now needs is added: now's frontend needs no ClusterIP reference or
// source range old lacked.
func shrinkFirst(old, now *Service) bool {
	if !now.External() {
		return true
	}
	if !old.External() || old.ClusterIP != now.ClusterIP || old.ClusterPort != now.ClusterPort {
		return false
	}
	for _, p := range now.SourceRanges {
		if !slices.Contains(old.SourceRanges, p) {
			return false
		}
	}
	return true
}

// flush removes what is no longer wanted before it adds anything, so a
// full map takes a change that fits once done (a service replaced by
// another of its size): first the services that went and their entries,
// then the tails of services that shrink, then the new and changed
// backends, the services pointing to them, and last what those no longer
// point to. Every step keeps a service's count within the backends the
// map holds, so the programs never pick an index without one. Writes go
// by batches (one syscall per few thousand entries, which matters when
// thousands of services arrive at once), entry by entry where the kernel
// has no batch operations.
func (w *mapWrites) flush(d *Datapath) error {
	tab := d.tab
	for _, step := range []struct {
		what string
		do   func() error
	}{
		{"delete services", func() error { return tab.services.del(w.svcDels) }},
		{"delete backends", func() error { return tab.backends.del(w.goneBackends) }},
		{"delete source ranges", func() error { return tab.srcRanges.del(w.goneRanges) }},
		{"put shrunk services", func() error { return tab.services.put(w.shrinkPuts, w.shrinkVals) }},
		{"delete backends", func() error { return tab.backends.del(w.shrinkDels) }},
		{"put backends", func() error { return tab.backends.put(w.backendPuts, w.backendVals) }},
		{"put source ranges", func() error { return tab.srcRanges.put(w.rangePuts, ones(len(w.rangePuts))) }},
		{"put services", func() error { return tab.services.put(w.svcPuts, w.svcVals) }},
		{"delete backends", func() error { return tab.backends.del(w.backendDels) }},
		{"delete source ranges", func() error { return tab.srcRanges.del(w.rangeDels) }},
	} {
		if err := step.do(); err != nil {
			return fmt.Errorf("%s: %w", step.what, err)
		}
	}
	return nil
}

// ones are n values 1 (a source range's).
func ones(n int) []uint32 {
	out := make([]uint32, n)
	for i := range out {
		out[i] = 1
	}
	return out
}

// sweepAffinity removes every affinity entry of a service ID not in live.
func (d *Datapath) sweepAffinity(live map[uint32]bool) error {
	var doomed []podAffinityKey
	var noBatch bool
	err := walk(d.pod.LaceAffinity, &noBatch, func(k podAffinityKey, _ podAffinityVal) {
		if !live[k.Id] {
			doomed = append(doomed, k)
		}
	})
	if err != nil {
		return fmt.Errorf("walk affinity: %w", err)
	}
	return d.deleteAffinity(doomed)
}

func (d *Datapath) deleteAffinity(keys []podAffinityKey) error {
	for _, k := range keys {
		if err := d.pod.LaceAffinity.Delete(k); err != nil && !isMissing(err) {
			return fmt.Errorf("forget affinity: %w", err)
		}
	}
	return nil
}

// forgetAffinity removes the affinity entries of the given service IDs:
// all of them for a nil set, else those pointing to one of its backends.
func (d *Datapath) forgetAffinity(dead map[uint32]map[Backend]bool) error {
	if len(dead) == 0 {
		return nil
	}
	var doomed []podAffinityKey
	var noBatch bool
	err := d.affWalk.walk(d.pod.LaceAffinity, &noBatch, func(k podAffinityKey, v podAffinityVal) {
		set, ok := dead[k.Id]
		if !ok {
			return
		}
		if set == nil || set[Backend{Addr: fromAddr16(k.Family, v.Addr), Port: ntohs(v.Port)}] {
			doomed = append(doomed, k)
		}
	})
	if err != nil {
		return fmt.Errorf("walk affinity: %w", err)
	}
	return d.deleteAffinity(doomed)
}

func missing(old, now []Backend) []Backend {
	if len(old)*len(now) > 1024 {
		return unlisted(&Service{Backends: old}, &Service{Backends: now})
	}
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
// ApplyServices): the client's next packet picks a live endpoint instead
// of being sent to one that went away (a UDP client, DNS, would otherwise
// be black-holed until the entry expires).
//
// A TCP flow keeps its endpoint while the endpoint stays in the service's
// slices (Lingering), as kube-proxy keeps it: an endpoint leaves the
// backends when it stops being ready or starts terminating, while its
// connections may still be served (graceful termination; a node whose
// status the API server missed during an outage). Once the endpoint left
// the slices altogether (gone.Unlisted) its pod is gone, and its address
// may be another pod's: a connection kept to it (a client's SYN
// retransmitted after its node rebooted) would reach whoever holds the
// address next, a pod of no Service at all, so it goes too, and a new
// connection picks a live endpoint. It returns how many it removed.
func (d *Datapath) FlushServiceFlows(gone Gone) (int, error) {
	if !gone.Walks() {
		return 0, nil
	}
	type vipEP struct {
		vip  netip.AddrPort
		ep   netip.AddrPort
		prot uint8
	}
	dead := map[vipEP]bool{}
	for k, bs := range gone.Left {
		if k.Proto == unix.IPPROTO_TCP {
			continue
		}
		for _, b := range bs {
			dead[vipEP{netip.AddrPortFrom(k.VIP, k.Port), netip.AddrPortFrom(b.Addr, b.Port), k.Proto}] = true
		}
	}
	for k, bs := range gone.Unlisted {
		for _, b := range bs {
			dead[vipEP{netip.AddrPortFrom(k.VIP, k.Port), netip.AddrPortFrom(b.Addr, b.Port), k.Proto}] = true
		}
	}
	var alive map[vipEP]bool
	if gone.Listed != nil {
		alive = map[vipEP]bool{}
		for k, bs := range gone.Listed {
			for _, b := range bs {
				alive[vipEP{netip.AddrPortFrom(k.VIP, k.Port), netip.AddrPortFrom(b.Addr, b.Port), k.Proto}] = true
			}
		}
	}
	if len(dead) == 0 && alive == nil {
		return 0, nil
	}
	// goes says whether a pod's (or the node's) flow to a frontend,
	// translated to an endpoint, goes; the sweep looks at those only, the
	// flows a client holds.
	goes := func(e vipEP) bool { return dead[e] || (alive != nil && !alive[e]) }
	n := 0
	// Both conntrack maps: established flows and those not assured yet.
	for _, m := range d.ctMaps() {
		var doomed []podCtKey
		var noBatch bool
		err := d.ctWalk.walk(m, &noBatch, func(k podCtKey, v podCtVal) {
			nat := netip.AddrPortFrom(fromAddr16(k.Family, v.NatAddr), ntohs(v.NatPort))
			remote := netip.AddrPortFrom(fromAddr16(k.Family, k.Raddr), ntohs(k.Rport))
			// The frontend is the remote side of a flow the node's pod
			// (or the node) opened; an outside client's flow is keyed
			// from the frontend's side (xlb_in), the client remote: judged
			// by the client's address, a restarted agent's sweep forgot
			// every outside flow through the node.
			front := remote
			if v.Flags&ctOriginLocal == 0 {
				front = netip.AddrPortFrom(fromAddr16(k.Family, k.Laddr), ntohs(k.Lport))
			}
			switch {
			case v.Flags&ctService != 0 && goes(vipEP{front, nat, k.Proto}):
				doomed = append(doomed, k)
			case v.Flags&ctDNAT != 0 && dead[vipEP{nat, remote, k.Proto}]:
				doomed = append(doomed, k)
			}
		})
		if err != nil {
			return 0, fmt.Errorf("walk conntrack: %w", err)
		}
		if err := deleteFlows(m, doomed); err != nil {
			return 0, fmt.Errorf("forget flow: %w", err)
		}
		n += len(doomed)
	}
	return n, nil
}

func isMissing(err error) bool { return errors.Is(err, ebpf.ErrKeyNotExist) }

package nodesync

import (
	"cmp"
	"maps"
	"net/netip"
	"slices"
	"strconv"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	lacev1 "github.com/lace-cni/lace/api/v1alpha1"
	"github.com/lace-cni/lace/internal/datapath"
	"github.com/lace-cni/lace/internal/model"
	"github.com/lace-cni/lace/internal/tables"
)

// serviceCache computes the node's services incrementally. Each service's
// result (model.ServiceEnv.Compute) is kept with the objects it came from,
// the Service and its EndpointSlices, and computed again only when its
// mirror (svcMirror) says one of them changed, when a NetworkEndpoint
// holding one of the addresses it looked up (model.ServiceResult.PodAddrs)
// did, or its namespace's labels; all of them are computed again when what
// every service shares changes (networks' IDs, binding policies, the
// node's zone, accepted underlays, service CIDRs). The merged
// state is the one model.ComputeServices gives for the same objects: one
// endpoint change costs one service, not ten thousand, and a pod created
// on another node that no Service selects costs none.
type serviceCache struct {
	env     *model.ServiceEnv
	entries map[model.ServiceKey]*svcEntry
	// pods indexes the cluster's NetworkEndpoints by address, kept up to
	// date between updates; byAddr has the services whose results looked
	// each address up.
	pods   *model.PodAddrIndex
	byAddr model.FirstSet[netip.Addr, model.ServiceKey]
	// watched mirrors byAddr's keys for the NetworkEndpoint handler (nil
	// without one).
	watched *watchedAddrs
	// stale are the services a NetworkEndpoint change reached, computed
	// again at the next update.
	stale map[model.ServiceKey]bool
	// touched are the services the update in progress computed or
	// dropped; sum is the budget's running total of all of them.
	touched []model.ServiceKey
	sum     model.Sum
	// mirror has the Services and EndpointSlices, and which changed.
	// triggers are the trigger times of the changes computed and not yet
	// programmed (the Reconcile's to observe).
	mirror   *svcMirror
	triggers []time.Time
	// fronts are the entries' table entries in the merge's order
	// (model.CompareFrontends); frontsIn and frontsOut the entries
	// remembered and forgotten since they were.
	fronts              []model.FrontendRef
	frontsIn, frontsOut []*svcEntry
	// vipsDirty: a service's VIPs may have changed since vips were made
	// (one computed gives others, refusals changed).
	vipsDirty bool
	// order has entries by (namespace, name), the merge's order.
	order []*svcEntry
	gen   uint64
	// before are the entries the update in progress replaced or dropped,
	// as the last merge had them (nil: the service is new), by service:
	// what a patch of that merge (svcpatch.go) compares against.
	before map[model.ServiceKey]*svcEntry
	// mergeGen numbers the merges (model.ServiceChanges.Gen).
	mergeGen uint64
	// inPlace: a patch that only replaces entries changes the merged
	// list where it is, under pub, which the applier holds while it
	// reads the list (readServices). Otherwise every patch copies it.
	inPlace bool
	pub     sync.RWMutex
	// state and vips are the merge of entries.
	state model.ServiceState
	vips  []model.ServiceVIPs
	// budget bounds what the services take of the maps; refused are the
	// services it leaves out of state, and why.
	budget  model.Budget
	refused map[model.ServiceKey]model.Refusal
	// admitted is what each programmed Service was last admitted with
	// (by UID): it keeps that much by its age, and only its growth is
	// judged as new demand (model.Candidate.Admitted).
	admitted map[model.ServiceKey]admittedCost
	// programmed is lace_services as the agent found it at start
	// (datapath.ProgrammedFrontends): the first admit takes what each
	// Service was admitted with from it (seedAdmitted), then drops it.
	programmed map[datapath.ServiceKey]datapath.ProgrammedFrontend
	// judged counts the budget's passes over every service.
	judged int
	// whole: every update computes, judges and merges every service,
	// with none of the shortcuts (the tests' oracle for them).
	whole bool
}

type admittedCost struct {
	uid  types.UID
	cost model.Cost
}

type svcEntry struct {
	key     model.ServiceKey
	uid     types.UID
	created time.Time
	// The entry keeps no Service or EndpointSlice: the mirror has them.
	// An update that changes nothing the agent reads swaps the mirror's
	// object for the informer's newer one, and a copy held here would
	// keep the older alive (a second copy of every annotated Service).
	res  model.ServiceResult
	cost model.Cost
	gen  uint64
}

func byKey(e *svcEntry, k model.ServiceKey) int {
	return cmp.Or(cmp.Compare(e.key.Namespace, k.Namespace), cmp.Compare(e.key.Name, k.Name))
}

// update brings the cache to the services that changed in its mirror
// (every one when sharedChanged) and to the pod address index
// (indexPods), and returns the node's service state and the VIPs of the
// bound services, in (namespace, name) order, for the views. shared is
// what every service depends on (Services, EndpointSlices and
// NetworkEndpoints unset), sharedChanged whether it differs from the last
// call's. vipsChanged says whether the VIPs differ from the last call's.
// The mirror's trigger times of what was taken are left in triggers.
func (c *serviceCache) update(shared model.ServiceInput, sharedChanged bool) (st model.ServiceState, vips []model.ServiceVIPs, vipsChanged bool) {
	if c.entries == nil {
		c.entries = map[model.ServiceKey]*svcEntry{}
	}
	c.gen++
	c.initPods()
	// The first update (no env yet) computes everything, as does a
	// change of what every service shares.
	all := c.env == nil || sharedChanged || c.whole
	if all {
		shared.NetworkEndpoints, shared.PodIndex = nil, c.pods
		c.env = model.NewServiceEnv(shared)
	}
	changes, trig := c.mirror.take(all)
	if room := maxTriggers - len(c.triggers); room > 0 {
		c.triggers = append(c.triggers, trig[:min(len(trig), room)]...)
	}
	c.touched = reuse(c.touched)
	// before is the update's alone: what it holds goes with it.
	defer func() {
		if len(c.before) > reuseMax {
			c.before = nil // a burst's table goes
		}
		clear(c.before)
	}()
	wasRefused := c.refused
	var added []*svcEntry
	gone := false
	for i := range changes {
		ch := &changes[i]
		delete(c.stale, ch.Key)
		if n, e := c.put(ch.Key, ch.Service, ch.Slices); n != nil && e == nil {
			added = append(added, n)
		} else if n == nil && e != nil {
			gone = true
		}
	}
	// A NetworkEndpoint change reached these: computed again from the
	// mirror's objects. One the mirror lost since the take is left to the
	// next take, which removes it.
	for k := range c.stale {
		if c.entries[k] == nil {
			continue
		}
		if svc, group := c.mirror.current(k); svc != nil {
			c.put(k, svc, group)
		}
	}
	c.stale = nil
	if all {
		for k, e := range c.entries {
			if e.gen != c.gen {
				c.forget(e)
				delete(c.entries, k)
				gone, c.vipsDirty = true, true
			}
		}
	}
	if len(c.touched) == 0 && !sharedChanged {
		return c.state, c.vips, false
	}
	c.place(added, gone)
	c.refused = c.admit()
	// A refusal changed bindings and VIPs of services the update did not
	// touch, and a refused service's frontends stay out of the list: the
	// merge is whole unless the same are refused and none was touched.
	patch := !all && maps.Equal(wasRefused, c.refused) && !c.touchesRefused() &&
		len(c.frontsIn)+len(c.frontsOut) <= maxPatchEntries
	c.syncFronts()
	var skip func(*model.ServiceResult) bool
	if len(c.refused) > 0 {
		skip = func(r *model.ServiceResult) bool {
			_, ok := c.refused[model.ServiceKey{Namespace: r.Binding.Namespace, Name: r.Binding.Name}]
			return ok
		}
	}
	c.mergeGen++
	patched := false
	if patch {
		var st model.ServiceState
		if st, patched = c.patch(); patched {
			c.state = st
		}
	}
	if !patched {
		changes := c.state.Changes
		c.state = model.MergeSorted(c.results(), c.fronts, skip)
		c.state.Changes = changes.Next(c.mergeGen, nil)
	}
	if !c.vipsDirty && !sharedChanged {
		return c.state, c.vips, false
	}
	c.vipsDirty = false
	// The VIPs of the bound services, in Bound's order.
	vips = make([]model.ServiceVIPs, 0, len(c.state.Bound))
	for _, b := range c.state.Bound {
		if b.Err != "" {
			continue
		}
		e := c.entries[model.ServiceKey{Namespace: b.Namespace, Name: b.Name}]
		vips = append(vips, model.ServiceVIPs{Namespace: b.Namespace, Name: b.Name, Network: b.Network, VIPs: e.res.VIPs})
	}
	if len(vips) == 0 {
		vips = nil
	}
	vipsChanged = !slices.EqualFunc(vips, c.vips, func(a, b model.ServiceVIPs) bool {
		return a.Namespace == b.Namespace && a.Name == b.Name && a.Network == b.Network && slices.Equal(a.VIPs, b.VIPs)
	})
	if vipsChanged {
		c.vips = vips
	}
	return c.state, c.vips, vipsChanged
}

// results are the entries' results in order, a refused one's bound to
// nothing: neither its frontends nor its VIPs reach the data plane.
func (c *serviceCache) results() []*model.ServiceResult {
	results := make([]*model.ServiceResult, len(c.order))
	for i, e := range c.order {
		results[i] = &e.res
		if r, ok := c.refused[e.key]; ok {
			b := e.res.Binding
			b.Err = r.Message
			results[i] = &model.ServiceResult{Binding: b}
		}
	}
	return results
}

// put computes service k from svc (nil: it is gone) and its slices, and
// returns its new entry (nil when gone) and the one it replaced (nil when
// new). A replaced entry keeps its place in order.
func (c *serviceCache) put(k model.ServiceKey, svc *corev1.Service, group []*discoveryv1.EndpointSlice) (n, e *svcEntry) {
	e = c.entries[k]
	if _, seen := c.before[k]; !seen {
		if c.before == nil {
			c.before = map[model.ServiceKey]*svcEntry{}
		}
		c.before[k] = e
	}
	if e != nil {
		c.forget(e)
	}
	if svc == nil {
		if e != nil {
			delete(c.entries, k)
			c.vipsDirty = true
		}
		return nil, e
	}
	n = &svcEntry{key: k, uid: svc.UID, created: svc.CreationTimestamp.Time, gen: c.gen,
		res: c.env.Compute(svc, group)}
	serviceComputations.Inc()
	n.cost = model.CostOf(&n.res)
	c.remember(n)
	c.entries[k] = n
	if e == nil || !sameVIPs(&e.res, &n.res) {
		c.vipsDirty = true
	}
	if e != nil {
		if i, ok := slices.BinarySearchFunc(c.order, k, byKey); ok {
			c.order[i] = n
		}
	}
	return n, e
}

// sameVIPs: a and b give the views the same VIPs (bound alike, to the same
// network, at the same addresses).
func sameVIPs(a, b *model.ServiceResult) bool {
	return a.Skipped == b.Skipped && (a.Binding.Err == "") == (b.Binding.Err == "") && a.Binding.Network == b.Binding.Network &&
		slices.Equal(a.VIPs, b.VIPs)
}

// place brings order (the merge's: by namespace and name) to the entries:
// added ones are inserted (a sort when many came at once), gone ones
// dropped.
func (c *serviceCache) place(added []*svcEntry, gone bool) {
	if gone {
		c.order = slices.DeleteFunc(c.order, func(e *svcEntry) bool { return c.entries[e.key] != e })
	}
	if len(added) > 64 {
		c.order = append(c.order, added...)
		slices.SortFunc(c.order, func(a, b *svcEntry) int { return byKey(a, b.key) })
		return
	}
	for _, n := range added {
		i, _ := slices.BinarySearchFunc(c.order, n.key, byKey)
		c.order = slices.Insert(c.order, i, n)
	}
}

// indexPods applies the NetworkEndpoints that came, changed or went (by
// name; nil: gone) to the pod address index, and marks stale the services
// whose results read an address they held or hold. Its cost is what
// changed.
func (c *serviceCache) indexPods(changes map[types.NamespacedName]*lacev1.NetworkEndpoint) {
	c.initPods()
	touch := func(ne *lacev1.NetworkEndpoint) {
		for _, a := range model.NetworkEndpointAddrs(ne) {
			c.byAddr.Each(a, func(k model.ServiceKey) bool {
				if c.stale == nil {
					c.stale = map[model.ServiceKey]bool{}
				}
				c.stale[k] = true
				return true
			})
		}
	}
	for k, ne := range changes {
		old := c.pods.Get(k)
		if old == ne {
			continue
		}
		if old != nil {
			c.pods.Remove(old)
			touch(old)
		}
		if ne != nil {
			c.pods.Add(ne)
			touch(ne)
		}
	}
}

func (c *serviceCache) initPods() {
	if c.pods == nil {
		c.pods = model.NewPodAddrIndex()
		c.byAddr = model.NewFirstSet[netip.Addr, model.ServiceKey]()
	}
}

// podChanges are the changes that bring the index to all (a list of
// every NetworkEndpoint): for a sync that has no informer's events to
// learn them from (nePending). It costs a map lookup per object.
func (c *serviceCache) podChanges(all []*lacev1.NetworkEndpoint) map[types.NamespacedName]*lacev1.NetworkEndpoint {
	c.initPods()
	out := map[types.NamespacedName]*lacev1.NetworkEndpoint{}
	seen := make(map[types.NamespacedName]bool, len(all))
	for _, ne := range all {
		k := types.NamespacedName{Namespace: ne.Namespace, Name: ne.Name}
		if seen[k] {
			continue // listed twice: the first one counts
		}
		seen[k] = true
		if old := c.pods.Get(k); old == nil || old != ne && (old.ResourceVersion != ne.ResourceVersion || old.UID != ne.UID) {
			out[k] = ne
		}
	}
	c.pods.Each(func(k types.NamespacedName) {
		if !seen[k] {
			out[k] = nil
		}
	})
	return out
}

// staleNamespaces marks stale the services of the namespaces named (their
// labels bind them): found in order, which is by namespace.
func (c *serviceCache) staleNamespaces(nss []string) {
	for _, ns := range nss {
		i, _ := slices.BinarySearchFunc(c.order, model.ServiceKey{Namespace: ns}, byKey)
		for ; i < len(c.order) && c.order[i].key.Namespace == ns; i++ {
			if c.stale == nil {
				c.stale = map[model.ServiceKey]bool{}
			}
			c.stale[c.order[i].key] = true
		}
	}
}

// remember and forget keep what follows an entry: byAddr (which services
// looked each pod address up), the budget's running sum, and touched.
func (c *serviceCache) remember(e *svcEntry) {
	for _, a := range e.res.PodAddrs {
		if c.watched != nil && !c.byAddr.Has(a) {
			c.watched.set(a, true)
		}
		c.byAddr.Add(a, e.key)
	}
	if counted(e) {
		c.sum.Add(c.budget, e.key.Namespace, e.cost)
	}
	c.touched = append(c.touched, e.key)
	c.frontsIn = append(c.frontsIn, e)
}

func (c *serviceCache) forget(e *svcEntry) {
	for _, a := range e.res.PodAddrs {
		c.byAddr.Remove(a, e.key)
		if c.watched != nil && !c.byAddr.Has(a) {
			c.watched.set(a, false)
		}
	}
	if counted(e) {
		c.sum.Remove(c.budget, e.key.Namespace, e.cost)
	}
	c.touched = append(c.touched, e.key)
	c.frontsOut = append(c.frontsOut, e)
}

// syncFronts brings fronts to the entries remembered and forgotten since
// the last call: each entry's refs taken out and put in at their place
// (a memmove each), or, when many changed, all of them sorted again.
func (c *serviceCache) syncFronts() {
	defer func() { c.frontsIn, c.frontsOut = reuse(c.frontsIn), reuse(c.frontsOut) }()
	if len(c.frontsIn)+len(c.frontsOut) > 256 {
		fronts := reuse(c.fronts)
		for _, e := range c.order {
			for i := range e.res.Services {
				fronts = append(fronts, model.FrontendRef{R: &e.res, I: i})
			}
		}
		slices.SortFunc(fronts, model.CompareFrontends)
		c.fronts = fronts
		return
	}
	for _, e := range c.frontsOut {
		for i := range e.res.Services {
			ref := model.FrontendRef{R: &e.res, I: i}
			if j, ok := slices.BinarySearchFunc(c.fronts, ref, model.CompareFrontends); ok && c.fronts[j].R == ref.R {
				c.fronts = slices.Delete(c.fronts, j, j+1)
			}
		}
	}
	for _, e := range c.frontsIn {
		if c.entries[e.key] != e {
			continue // forgotten since
		}
		for i := range e.res.Services {
			ref := model.FrontendRef{R: &e.res, I: i}
			j, _ := slices.BinarySearchFunc(c.fronts, ref, model.CompareFrontends)
			c.fronts = slices.Insert(c.fronts, j, ref)
		}
	}
}

// reuseMax is the most elements a scratch slice or map of the cache keeps
// room for between updates: a burst (10,000 Services created or deleted)
// leaves no table of its size behind.
const reuseMax = 1024

// reuse empties s for the next update. What s held is cleared, since a
// truncated slice still points at it: the refs of entries forgotten would
// keep every one of them, results and backends, alive (after 10,000
// Services were deleted, about 15 MB of them stayed). A burst's large array
// goes.
func reuse[T any](s []T) []T {
	if cap(s) > reuseMax {
		return nil
	}
	clear(s[:cap(s)])
	return s[:0]
}

// counted: the service takes room in the maps, and the budget judges it.
func counted(e *svcEntry) bool { return !e.res.Skipped && len(e.res.Services) > 0 }

// admit judges the services against the budget.
func (c *serviceCache) admit() map[model.ServiceKey]model.Refusal {
	// While nothing is refused and everything fits, the verdict is the
	// same whatever the order: only what changed is remembered as
	// admitted, with no pass over every service.
	if c.programmed == nil && len(c.refused) == 0 && !c.whole && c.budget.AdmitsAll(&c.sum) {
		if c.admitted == nil {
			c.admitted = map[model.ServiceKey]admittedCost{}
		}
		for _, k := range c.touched {
			if e := c.entries[k]; e != nil && counted(e) {
				c.admitted[k] = admittedCost{e.uid, e.cost}
			} else {
				delete(c.admitted, k)
			}
		}
		return nil
	}
	if c.programmed == nil && !c.whole && c.costsKept() {
		return c.refused
	}
	// Refusals may change for services that did not: their VIPs with them.
	c.vipsDirty = true
	c.judged++
	// A verdict changes what each Service counts as admitted: judged
	// again, a Service refused beside a bigger one that was refused too
	// may fit. The verdict kept is the one judging again leaves as it is,
	// so that it stands while costs do (costsKept). Each round admits
	// what the last refused or nothing more: a few rounds reach it.
	var refused map[model.ServiceKey]model.Refusal
	for round := 0; round < maxJudgeRounds; round++ {
		was := refused
		refused = c.judge()
		if round > 0 && maps.EqualFunc(was, refused, func(model.Refusal, model.Refusal) bool { return true }) {
			break
		}
	}
	return refused
}

// maxJudgeRounds bounds the budget's rounds to a settled verdict.
const maxJudgeRounds = 8

// judge is one verdict of the budget over every counted service, from
// what each was admitted with, and remembers what it admits.
func (c *serviceCache) judge() map[model.ServiceKey]model.Refusal {
	cands := make([]model.Candidate, 0, len(c.order))
	for _, e := range c.order {
		if !counted(e) {
			continue
		}
		var was model.Cost
		if a, ok := c.admitted[e.key]; ok && a.uid == e.uid {
			was = a.cost
		} else if c.programmed != nil {
			was = programmedCost(&e.res, c.programmed)
		}
		cands = append(cands, model.Candidate{Key: e.key, Created: e.created, UID: string(e.uid), Cost: e.cost, Admitted: was})
	}
	refused := c.budget.Admit(cands)
	c.programmed = nil
	// Remember what is programmed now; a refused or deleted Service
	// starts again as new.
	c.admitted = make(map[model.ServiceKey]admittedCost, len(cands))
	for _, cd := range cands {
		if _, ok := refused[cd.Key]; !ok {
			c.admitted[cd.Key] = admittedCost{types.UID(cd.UID), cd.Cost}
		}
	}
	return refused
}

// costsKept: every service the update touched is admitted (a refused one
// is not in admitted) with the cost it has now (the same Service, by
// UID). The budget's candidates are then
// those of its last verdict, which stands, with no pass over every
// service while one is refused.
func (c *serviceCache) costsKept() bool {
	for _, k := range c.touched {
		e := c.entries[k]
		a, ok := c.admitted[k]
		if e == nil || !counted(e) || !ok || a.uid != e.uid || a.cost != e.cost {
			return false
		}
	}
	return true
}

// touchesRefused: a service the update computed or dropped is refused.
func (c *serviceCache) touchesRefused() bool {
	for k := range c.before {
		if _, ok := c.refused[k]; ok {
			return true
		}
	}
	return false
}

// programmedCost is what the agent before this one admitted r with, as the
// data plane holds it: nothing unless one of r's ClusterIP frontends is
// programmed (a ClusterIP is the Service's alone; a refused Service has
// no entry), else each of its frontends in lace_services with the
// endpoints and source ranges programmed there. Endpoints or ports the
// Service gained while no agent ran are then judged as growth, what it
// lost is given back, as they would have been by the agent before.
func programmedCost(r *model.ServiceResult, prog map[datapath.ServiceKey]datapath.ProgrammedFrontend) model.Cost {
	key := func(s *tables.Service) datapath.ServiceKey {
		return datapath.ServiceKey{VIP: s.VIP, Proto: s.Proto, Port: s.Port}
	}
	if !slices.ContainsFunc(r.Services, func(s tables.Service) bool {
		p, ok := prog[key(&s)]
		return ok && !s.External() && !p.External
	}) {
		return model.Cost{}
	}
	var c model.Cost
	for i := range r.Services {
		p, ok := prog[key(&r.Services[i])]
		if !ok {
			continue
		}
		c.Frontends++
		c.Backends += p.Backends
		if p.External {
			c.Backends++
			c.SourceRanges += p.SourceRanges
		}
	}
	return c
}

// versions remembers a version of every object of one kind, to tell
// whether a listing differs from the previous one (an object added,
// changed or removed).
type versions map[types.NamespacedName]string

// update records the n objects at(0..n-1) by resourceVersion and reports
// whether they differ from the last ones recorded.
func (v *versions) update(n int, at func(int) client.Object) bool {
	return v.updateBy(n, at, client.Object.GetResourceVersion)
}

// updateSpec is update by generation (and UID): for kinds whose status
// the node's state never reads, and which their writers' status reports
// change often (an UnderlayEndpoint's data path counters): those writes
// must not count as a change, or every one of them would compute every
// service again.
func (v *versions) updateSpec(n int, at func(int) client.Object) bool {
	return v.updateBy(n, at, func(o client.Object) string {
		return strconv.FormatInt(o.GetGeneration(), 10) + "/" + string(o.GetUID())
	})
}

func (v *versions) updateBy(n int, at func(int) client.Object, version func(client.Object) string) bool {
	if *v != nil && len(*v) == n {
		same := true
		for i := range n {
			o := at(i)
			if ver, ok := (*v)[types.NamespacedName{Namespace: o.GetNamespace(), Name: o.GetName()}]; !ok || ver != version(o) {
				same = false
				break
			}
		}
		if same {
			return false
		}
	}
	m := make(versions, n)
	for i := range n {
		o := at(i)
		m[types.NamespacedName{Namespace: o.GetNamespace(), Name: o.GetName()}] = version(o)
	}
	*v = m
	return true
}

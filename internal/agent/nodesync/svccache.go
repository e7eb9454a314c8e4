package nodesync

import (
	"cmp"
	"net/netip"
	"slices"
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
// result (model.ServiceEnv.Compute) is kept with the versions of the
// objects it came from, the Service and its EndpointSlices, and computed
// again only when one of them changed, or a NetworkEndpoint holding one
// of the addresses it looked up (model.ServiceResult.PodAddrs); all of
// them are computed again when what every service shares changes
// (networks, binding policies, namespaces, the node's zone). The merged
// state is the one model.ComputeServices gives for the same objects: one
// endpoint change costs one service, not ten thousand, and a pod created
// on another node that no Service selects costs none.
type serviceCache struct {
	env     *model.ServiceEnv
	entries map[model.ServiceKey]*svcEntry
	// pods indexes the cluster's NetworkEndpoints by address, kept up to
	// date between updates (indexed has what it holds, by name); byAddr
	// has the services whose results looked each address up.
	pods    *model.PodAddrIndex
	indexed map[types.NamespacedName]*lacev1.NetworkEndpoint
	byAddr  map[netip.Addr][]model.ServiceKey
	// stale are the services a NetworkEndpoint change reached, computed
	// again at the next update.
	stale map[model.ServiceKey]bool
	// touched are the services the update in progress computed or
	// dropped; sum is the budget's running total of all of them.
	touched []model.ServiceKey
	sum     model.Sum
	// order has entries by (namespace, name), the merge's order: sorted
	// again only when services come or go.
	order []*svcEntry
	gen   uint64
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
}

type admittedCost struct {
	uid  types.UID
	cost model.Cost
}

type svcEntry struct {
	key     model.ServiceKey
	pos     int // in order; -1 until placed
	uid     types.UID
	created time.Time
	rv      string
	slices  []objVersion // by name, as the result saw them
	res     model.ServiceResult
	cost    model.Cost
	gen     uint64
}

// objVersion is an object of a known namespace and kind at a version.
type objVersion struct{ name, rv string }

// update brings the cache to svcs and slices (pointers to the informer's
// objects, read only) and to the pod address index (indexPods), and
// returns the node's service state and the VIPs of the bound services,
// in (namespace, name) order, for the views. shared is what every service depends on (Services,
// EndpointSlices and NetworkEndpoints unset), sharedChanged whether it
// differs from the last call's. vipsChanged says whether the VIPs differ
// from the last call's.
func (c *serviceCache) update(shared model.ServiceInput, sharedChanged bool, svcs []*corev1.Service,
	allSlices []*discoveryv1.EndpointSlice) (st model.ServiceState, vips []model.ServiceVIPs, vipsChanged bool) {
	if c.entries == nil {
		c.entries = map[model.ServiceKey]*svcEntry{}
	}
	c.gen++
	c.initPods()
	stale := c.stale
	c.stale = nil
	if c.env == nil || sharedChanged {
		shared.NetworkEndpoints, shared.PodIndex = nil, c.pods
		c.env = model.NewServiceEnv(shared)
	}
	bySvc := make(map[model.ServiceKey][]*discoveryv1.EndpointSlice, len(svcs))
	for _, sl := range allSlices {
		if k, ok := model.SliceService(sl); ok {
			bySvc[k] = append(bySvc[k], sl)
		}
	}
	changed, reorder := sharedChanged, false
	c.touched = c.touched[:0]
	for _, svc := range svcs {
		k := model.ServiceKey{Namespace: svc.Namespace, Name: svc.Name}
		group := bySvc[k]
		if len(group) > 1 {
			slices.SortFunc(group, func(a, b *discoveryv1.EndpointSlice) int {
				switch {
				case a.Name < b.Name:
					return -1
				case a.Name > b.Name:
					return 1
				}
				return 0
			})
		}
		e := c.entries[k]
		if e != nil && e.gen == c.gen {
			continue // listed twice: the first one counts
		}
		if e != nil && !sharedChanged && !stale[k] && e.uid == svc.UID && e.rv == svc.ResourceVersion && sameVersions(e.slices, group) {
			e.gen = c.gen
			continue
		}
		changed = true
		n := &svcEntry{key: k, pos: -1, uid: svc.UID, created: svc.CreationTimestamp.Time, rv: svc.ResourceVersion, gen: c.gen,
			res: c.env.Compute(svc, group)}
		serviceComputations.Inc()
		n.cost = model.CostOf(&n.res)
		if e != nil {
			c.forget(e)
		}
		c.remember(n)
		if e != nil && e.pos >= 0 {
			n.pos, c.order[e.pos] = e.pos, n
		} else {
			reorder = true
		}
		if len(group) > 0 {
			n.slices = make([]objVersion, len(group))
			for i, sl := range group {
				n.slices[i] = objVersion{sl.Name, sl.ResourceVersion}
			}
		}
		c.entries[k] = n
	}
	for k, e := range c.entries {
		if e.gen != c.gen {
			c.forget(e)
			delete(c.entries, k)
			changed, reorder = true, true
		}
	}
	if !changed {
		return c.state, c.vips, false
	}
	if reorder {
		c.order = c.order[:0]
		for _, e := range c.entries {
			c.order = append(c.order, e)
		}
		slices.SortFunc(c.order, func(a, b *svcEntry) int {
			return cmp.Or(cmp.Compare(a.key.Namespace, b.key.Namespace), cmp.Compare(a.key.Name, b.key.Name))
		})
		for i, e := range c.order {
			e.pos = i
		}
	}
	c.refused = c.admit()
	results := make([]*model.ServiceResult, len(c.order))
	for i, e := range c.order {
		results[i] = &e.res
		if r, ok := c.refused[e.key]; ok {
			// Refused whole: bound to nothing, so neither its frontends
			// nor its VIPs reach the data plane.
			b := e.res.Binding
			b.Err = r.Message
			results[i] = &model.ServiceResult{Binding: b}
		}
	}
	c.state = model.MergeServices(results)
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

// indexPods applies the NetworkEndpoints that came, changed or went (by
// name; nil: gone) to the pod address index, and marks stale the services
// whose results read an address they held or hold. Its cost is what
// changed.
func (c *serviceCache) indexPods(changes map[types.NamespacedName]*lacev1.NetworkEndpoint) {
	c.initPods()
	touch := func(ne *lacev1.NetworkEndpoint) {
		for _, a := range model.NetworkEndpointAddrs(ne) {
			for _, k := range c.byAddr[a] {
				if c.stale == nil {
					c.stale = map[model.ServiceKey]bool{}
				}
				c.stale[k] = true
			}
		}
	}
	for k, ne := range changes {
		old := c.indexed[k]
		if old == ne {
			continue
		}
		if old != nil {
			c.pods.Remove(old)
			touch(old)
			delete(c.indexed, k)
		}
		if ne != nil {
			c.pods.Add(ne)
			touch(ne)
			c.indexed[k] = ne
		}
	}
}

func (c *serviceCache) initPods() {
	if c.pods == nil {
		c.pods, c.indexed, c.byAddr = model.NewPodAddrIndex(), map[types.NamespacedName]*lacev1.NetworkEndpoint{}, map[netip.Addr][]model.ServiceKey{}
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
		if old := c.indexed[k]; old == nil || old != ne && (old.ResourceVersion != ne.ResourceVersion || old.UID != ne.UID) {
			out[k] = ne
		}
	}
	for k := range c.indexed {
		if !seen[k] {
			out[k] = nil
		}
	}
	return out
}

// remember and forget keep what follows an entry: byAddr (which services
// looked each pod address up), the budget's running sum, and touched.
func (c *serviceCache) remember(e *svcEntry) {
	for _, a := range e.res.PodAddrs {
		c.byAddr[a] = append(c.byAddr[a], e.key)
	}
	if counted(e) {
		c.sum.Add(c.budget, e.key.Namespace, e.cost)
	}
	c.touched = append(c.touched, e.key)
}

func (c *serviceCache) forget(e *svcEntry) {
	for _, a := range e.res.PodAddrs {
		if l := slices.DeleteFunc(c.byAddr[a], func(k model.ServiceKey) bool { return k == e.key }); len(l) > 0 {
			c.byAddr[a] = l
		} else {
			delete(c.byAddr, a)
		}
	}
	if counted(e) {
		c.sum.Remove(c.budget, e.key.Namespace, e.cost)
	}
	c.touched = append(c.touched, e.key)
}

// counted: the service takes room in the maps, and the budget judges it.
func counted(e *svcEntry) bool { return !e.res.Skipped && len(e.res.Services) > 0 }

// admit judges the services against the budget.
func (c *serviceCache) admit() map[model.ServiceKey]model.Refusal {
	// While nothing is refused and everything fits, the verdict is the
	// same whatever the order: only what changed is remembered as
	// admitted, with no pass over every service.
	if c.programmed == nil && len(c.refused) == 0 && c.budget.AdmitsAll(&c.sum) {
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

func sameVersions(have []objVersion, now []*discoveryv1.EndpointSlice) bool {
	if len(have) != len(now) {
		return false
	}
	for i, sl := range now {
		if have[i].name != sl.Name || have[i].rv != sl.ResourceVersion {
			return false
		}
	}
	return true
}

// versions remembers the resourceVersion of every object of one kind, to
// tell whether a listing differs from the previous one (an object added,
// changed or removed).
type versions map[types.NamespacedName]string

// update records the n objects at(0..n-1) and reports whether they differ
// from the last ones recorded.
func (v *versions) update(n int, at func(int) client.Object) bool {
	if *v != nil && len(*v) == n {
		same := true
		for i := range n {
			o := at(i)
			if rv, ok := (*v)[types.NamespacedName{Namespace: o.GetNamespace(), Name: o.GetName()}]; !ok || rv != o.GetResourceVersion() {
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
		m[types.NamespacedName{Namespace: o.GetNamespace(), Name: o.GetName()}] = o.GetResourceVersion()
	}
	*v = m
	return true
}

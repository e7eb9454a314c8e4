package nodesync

import (
	"net/netip"
	"slices"

	"github.com/lace-cni/lace/internal/model"
	"github.com/lace-cni/lace/internal/tables"
)

// maxPatchEntries is the most entries an update may compute or drop for
// its merge to be a patch of the last one; more make a whole merge, which
// costs about as much.
const maxPatchEntries = 256

// patch is the merge of the entries as a step from the last merge: the
// frontends of the services the update computed or dropped (before) are
// merged again and put in place, every other entry kept as it was, and
// the bindings, excluded endpoints and health checks kept too when those
// services' did not change. Its Changes name the frontends it visited, so
// that the data plane visits only those. It declines (false) what a step
// cannot judge alone: a frontend two services claim (the contest weighs
// them all), or an external IP at an address it visits (its owner is
// judged across every service at that address). A patch gives the state
// model.MergeSorted gives for the same entries.
func (c *serviceCache) patch() (model.ServiceState, bool) {
	prev := c.state
	if prev.Changes.Gen == 0 {
		return model.ServiceState{}, false
	}
	var keys []tables.FrontendKey
	var addrs, owned []netip.Addr
	sides := true
	for k, old := range c.before {
		var was, is *model.ServiceResult
		if old != nil {
			was = &old.res
		}
		if now := c.entries[k]; now != nil {
			is = &now.res
		}
		for _, r := range []*model.ServiceResult{was, is} {
			if r == nil {
				continue
			}
			for i := range r.Services {
				keys = append(keys, r.Services[i].Key())
				addrs = append(addrs, r.Services[i].VIP)
			}
			// A load balancer address claims its address for the
			// external IPs' owners even without a frontend there.
			addrs = append(addrs, r.LoadBalancerAddrs...)
			owned = append(owned, r.VIPs...)
		}
		sides = sides && sameSides(was, is)
	}
	slices.SortFunc(keys, tables.FrontendKey.Compare)
	keys = slices.Compact(keys)
	slices.SortFunc(addrs, netip.Addr.Compare)
	for _, a := range slices.Compact(addrs) {
		for j := c.frontAt(tables.FrontendKey{VIP: a}); j < len(c.fronts) && c.fronts[j].Entry().VIP == a; j++ {
			if c.fronts[j].Entry().Frontend == tables.FrontendExternalIP {
				return model.ServiceState{}, false
			}
		}
	}
	// A contest anywhere is judged by the age of the Service that owns
	// the contestants' addresses: an address of a visited Service that
	// another Service's entries also stand on (a stale cache's duplicate
	// ClusterIP) may change the verdict at keys the patch does not visit.
	slices.SortFunc(owned, netip.Addr.Compare)
	for _, a := range slices.Compact(owned) {
		for j := c.frontAt(tables.FrontendKey{VIP: a}); j < len(c.fronts) && c.fronts[j].Entry().VIP == a; j++ {
			b := c.fronts[j].R.Binding
			if _, visited := c.before[model.ServiceKey{Namespace: b.Namespace, Name: b.Name}]; !visited {
				return model.ServiceState{}, false
			}
		}
	}
	merged := make([]*tables.Service, len(keys))
	for i, k := range keys {
		for j := c.frontAt(k); j < len(c.fronts) && c.fronts[j].Entry().Key() == k; j++ {
			// A refused Service's entries stay in fronts but out of the
			// list: the whole merge judges what stands there.
			b := c.fronts[j].R.Binding
			if _, ok := c.refused[model.ServiceKey{Namespace: b.Namespace, Name: b.Name}]; ok || merged[i] != nil {
				return model.ServiceState{}, false
			}
			merged[i] = c.fronts[j].Entry()
		}
	}
	st := prev
	// Every key is there and stays: the entries are replaced where they
	// are, not copied to a new list (1.6 MB at 10,000 frontends). The
	// applier reads the list under pub; while it does (writing the maps),
	// the computation copies rather than wait for it.
	if c.inPlace && len(keys) > 0 && replaces(prev.Services, keys, merged) && c.pub.TryLock() {
		for i, k := range keys {
			j, _ := tables.FindFrontend(prev.Services, k)
			prev.Services[j] = *merged[i]
		}
		c.pub.Unlock()
	} else if len(keys) > 0 {
		old := prev.Services
		out := make([]tables.Service, 0, len(old)+len(keys))
		j := 0
		for i, k := range keys {
			n, found := tables.FindFrontend(old[j:], k)
			n += j
			out = append(out, old[j:n]...)
			if found {
				n++
			}
			if merged[i] != nil {
				out = append(out, *merged[i])
			}
			j = n
		}
		out = append(out, old[j:]...)
		if len(out) == 0 {
			out = nil
		}
		st.Services = out
	}
	if !sides {
		whole := model.MergeSorted(c.results(), nil, nil)
		st.Bound, st.Excluded, st.HealthChecks = whole.Bound, whole.Excluded, whole.HealthChecks
	}
	if keys == nil {
		keys = []tables.FrontendKey{} // a step all the same
	}
	st.Changes = prev.Changes.Next(c.mergeGen, keys)
	return st, true
}

// replaces: every key is in list and has a merged entry (a change of
// entries, none added or removed).
func replaces(list []tables.Service, keys []tables.FrontendKey, merged []*tables.Service) bool {
	for i, k := range keys {
		if _, ok := tables.FindFrontend(list, k); !ok || merged[i] == nil {
			return false
		}
	}
	return true
}

// readServices runs f, which reads the merged list, while no patch
// changes it in place.
func (c *serviceCache) readServices(f func()) {
	c.pub.RLock()
	defer c.pub.RUnlock()
	f()
}

// frontAt is the index of the first of fronts at or after k.
func (c *serviceCache) frontAt(k tables.FrontendKey) int {
	i, _ := slices.BinarySearchFunc(c.fronts, k, func(f model.FrontendRef, k tables.FrontendKey) int { return f.Entry().Key().Compare(k) })
	return i
}

// sameSides: a service merged as a and then as b (nil: not there) leaves
// the merge's bindings, excluded endpoints and health checks as they
// were. A skipped service has none.
func sameSides(a, b *model.ServiceResult) bool {
	la, lb := a != nil && !a.Skipped, b != nil && !b.Skipped
	if !la || !lb {
		return la == lb
	}
	return a.Binding == b.Binding && slices.Equal(a.Excluded, b.Excluded) &&
		(a.HealthCheck == nil) == (b.HealthCheck == nil) && (a.HealthCheck == nil || *a.HealthCheck == *b.HealthCheck)
}

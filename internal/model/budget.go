package model

import (
	"cmp"
	"fmt"
	"slices"
	"strings"
	"time"
)

// MaxFrontendBackends is the most endpoints one frontend (VIP, protocol,
// port) can have in the data plane: the backend count of lace_services is
// 16 bits. A Service with more on one frontend is refused whole, so
// ServiceTable.Apply is never handed one it cannot write.
const MaxFrontendBackends = 1<<16 - 1

// Budget bounds what the Services of a node may take of the data plane's
// maps: one Service, or one namespace, can never fill a map and stop every
// other Service (and endpoint change) from being programmed. Zero fields
// are no bound.
type Budget struct {
	// ServiceFrontends and ServiceBackends bound one Service: its
	// entries in lace_services (one per VIP, protocol and port) and in
	// lace_backends (one per endpoint of each of them, plus a ClusterIP
	// reference per external frontend). ServiceSourceRanges bounds its
	// loadBalancerSourceRanges entries (lace_src_ranges).
	ServiceFrontends, ServiceBackends, ServiceSourceRanges int
	// NamespaceFrontends and NamespaceBackends bound the Services of one
	// namespace together (a tenant's share): judged before the totals,
	// so one namespace cannot push another's Services out.
	NamespaceFrontends, NamespaceBackends, NamespaceSourceRanges int
	// TotalFrontends and TotalBackends bound all Services together: the
	// maps' sizes.
	TotalFrontends, TotalBackends int
	// TotalSourceRanges bounds the loadBalancerSourceRanges entries
	// (lace_src_ranges) of all Services.
	TotalSourceRanges int
}

// Cost is what one Service takes of the maps. FrontendBackends is the
// most endpoints any one of its frontends has (not summed).
type Cost struct{ Frontends, Backends, SourceRanges, FrontendBackends int }

// CostOf is what r's services take of the maps (an upper bound: two
// Services naming the same frontend share one entry).
func CostOf(r *ServiceResult) Cost {
	c := Cost{Frontends: len(r.Services)}
	for i := range r.Services {
		s := &r.Services[i]
		c.Backends += len(s.Backends)
		c.FrontendBackends = max(c.FrontendBackends, len(s.Backends))
		if s.External() {
			c.Backends++
			c.SourceRanges += len(s.SourceRanges)
		}
	}
	return c
}

func (c Cost) add(d Cost) Cost {
	return Cost{c.Frontends + d.Frontends, c.Backends + d.Backends, c.SourceRanges + d.SourceRanges, 0}
}

func (c Cost) sub(d Cost) Cost {
	return Cost{c.Frontends - d.Frontends, c.Backends - d.Backends, c.SourceRanges - d.SourceRanges, 0}
}

// kept is the part of c already admitted as a: what a Service keeps of
// its room whatever came after it.
func (c Cost) kept(a Cost) Cost {
	return Cost{min(c.Frontends, a.Frontends), min(c.Backends, a.Backends), min(c.SourceRanges, a.SourceRanges), 0}
}

// Reasons of a refusal (Event reasons and metric labels).
const (
	ReasonServiceOverBudget = "ServiceOverBudget"
	ReasonNamespaceShare    = "ServiceNamespaceShareFull"
	ReasonMapsFull          = "ServiceMapsFull"
)

// Refusal says why a Service is not programmed.
type Refusal struct {
	Reason, Message string
}

// Candidate is one Service before the budget: its age orders who keeps
// room when the maps are short (the oldest first). Admitted is what it
// was last admitted with (zero if it was not programmed): that much it
// keeps by its age, and only what it grew by is judged as the newest
// demand, so an old Service that grows cannot push out a working one.
type Candidate struct {
	Key      ServiceKey
	Created  time.Time
	UID      string
	Cost     Cost
	Admitted Cost
}

// Admit judges every candidate: a Service over the per-Service budget is
// refused whole; then each namespace's Services, and then all of them,
// must fit their share (the namespace share, then the maps): what each
// Service was admitted with before is kept oldest first, and what is new
// (new Services, growth) is admitted oldest first after all of it, the
// Services that do not fit being refused. A Service that works keeps
// working whatever is created, or grows, after it. Services are never
// half-programmed. It returns the refused ones.
func (b Budget) Admit(cands []Candidate) map[ServiceKey]Refusal {
	out := map[ServiceKey]Refusal{}
	order := make([]*Candidate, 0, len(cands))
	for i := range cands {
		c := &cands[i]
		if msg := b.serviceOver(c.Cost); msg != "" {
			out[c.Key] = Refusal{ReasonServiceOverBudget, msg}
			continue
		}
		order = append(order, c)
	}
	slices.SortFunc(order, func(x, y *Candidate) int {
		return cmp.Or(x.Created.Compare(y.Created), cmp.Compare(x.UID, y.UID),
			cmp.Compare(x.Key.Namespace, y.Key.Namespace), cmp.Compare(x.Key.Name, y.Key.Name))
	})
	if b.NamespaceFrontends > 0 || b.NamespaceBackends > 0 || b.NamespaceSourceRanges > 0 {
		byNS := map[string][]*Candidate{}
		for _, c := range order {
			byNS[c.Key.Namespace] = append(byNS[c.Key.Namespace], c)
		}
		limit := Cost{Frontends: b.NamespaceFrontends, Backends: b.NamespaceBackends, SourceRanges: b.NamespaceSourceRanges}
		for ns, cs := range byNS {
			fit(cs, limit, out, ReasonNamespaceShare, "namespace "+ns+"'s share of the node's service maps is full")
		}
	}
	fit(order, Cost{Frontends: b.TotalFrontends, Backends: b.TotalBackends, SourceRanges: b.TotalSourceRanges},
		out, ReasonMapsFull, "the node's service maps are full")
	return out
}

// serviceOver says which per-Service bound c exceeds, or "".
func (b Budget) serviceOver(c Cost) string {
	switch {
	case c.FrontendBackends > MaxFrontendBackends:
		return fmt.Sprintf("a port of the service has %d endpoints, more than the %d one frontend (address x port) holds in the data plane",
			c.FrontendBackends, MaxFrontendBackends)
	case b.ServiceFrontends > 0 && c.Frontends > b.ServiceFrontends:
		return fmt.Sprintf("the service needs %d frontend entries (addresses x ports), more than the %d one Service may take on a node",
			c.Frontends, b.ServiceFrontends)
	case b.ServiceBackends > 0 && c.Backends > b.ServiceBackends:
		return fmt.Sprintf("the service needs %d backend entries (frontends x endpoints), more than the %d one Service may take on a node",
			c.Backends, b.ServiceBackends)
	case b.ServiceSourceRanges > 0 && c.SourceRanges > b.ServiceSourceRanges:
		return fmt.Sprintf("the service needs %d loadBalancerSourceRanges entries (external frontends x ranges), more than the %d one Service may take on a node",
			c.SourceRanges, b.ServiceSourceRanges)
	}
	return ""
}

// fit admits order (oldest first, refused ones skipped) within limit:
// first every Service's kept part (what it was admitted with), then what
// is new. A Service that does not fit is refused whole (and its kept part
// given back) with reason and what, naming the full resource.
func fit(order []*Candidate, limit Cost, out map[ServiceKey]Refusal, reason, what string) {
	var used Cost
	refuse := func(c *Candidate, next Cost) {
		out[c.Key] = Refusal{reason, what + ": " + overWhat(next, limit) + " (Services admitted before keep theirs)"}
	}
	for _, c := range order {
		if _, ok := out[c.Key]; ok {
			continue
		}
		next := used.add(c.Cost.kept(c.Admitted))
		if overWhat(next, limit) != "" {
			refuse(c, next)
			continue
		}
		used = next
	}
	for _, c := range order {
		if _, ok := out[c.Key]; ok {
			continue
		}
		k := c.Cost.kept(c.Admitted)
		if k == c.Cost.kept(c.Cost) { // nothing new
			continue
		}
		next := used.add(c.Cost.sub(k))
		if overWhat(next, limit) != "" {
			refuse(c, next)
			used = used.sub(k)
			continue
		}
		used = next
	}
}

// overWhat names the entries of n over limit, or "".
func overWhat(n, limit Cost) string {
	var parts []string
	if over(n.Frontends, limit.Frontends) {
		parts = append(parts, fmt.Sprintf("%d frontend entries (lace_services) would exceed %d", n.Frontends, limit.Frontends))
	}
	if over(n.Backends, limit.Backends) {
		parts = append(parts, fmt.Sprintf("%d backend entries (lace_backends) would exceed %d", n.Backends, limit.Backends))
	}
	if over(n.SourceRanges, limit.SourceRanges) {
		parts = append(parts, fmt.Sprintf("%d source range entries (lace_src_ranges) would exceed %d", n.SourceRanges, limit.SourceRanges))
	}
	return strings.Join(parts, ", ")
}

func over(n, limit int) bool { return limit > 0 && n > limit }

// Sum is the running total of the candidates' costs, whole and by
// namespace, and how many are over a Service's own bounds, kept as
// Services come, change and go (Remove what was Added): what AdmitsAll
// judges without a pass over every Service.
type Sum struct {
	total Cost
	byNS  map[string]Cost
	over  int
}

// Add counts a candidate of namespace ns and cost c.
func (s *Sum) Add(b Budget, ns string, c Cost) {
	if s.byNS == nil {
		s.byNS = map[string]Cost{}
	}
	s.total = s.total.add(c)
	s.byNS[ns] = s.byNS[ns].add(c)
	if b.serviceOver(c) != "" {
		s.over++
	}
}

// Remove takes back what Add(b, ns, c) counted.
func (s *Sum) Remove(b Budget, ns string, c Cost) {
	s.total = s.total.sub(c)
	if n := s.byNS[ns].sub(c); n == (Cost{}) {
		delete(s.byNS, ns)
	} else {
		s.byNS[ns] = n
	}
	if b.serviceOver(c) != "" {
		s.over--
	}
}

// AdmitsAll says whether Admit refuses none of the candidates s sums:
// none is over a Service's own bounds, and every namespace's whole cost,
// and the node's, fits its share. Then no order of them refuses any,
// since every part of a sum of costs is no more than the whole.
func (b Budget) AdmitsAll(s *Sum) bool {
	if s.over > 0 || overWhat(s.total, Cost{Frontends: b.TotalFrontends, Backends: b.TotalBackends, SourceRanges: b.TotalSourceRanges}) != "" {
		return false
	}
	ns := Cost{Frontends: b.NamespaceFrontends, Backends: b.NamespaceBackends, SourceRanges: b.NamespaceSourceRanges}
	if ns == (Cost{}) {
		return true
	}
	for _, c := range s.byNS {
		if overWhat(c, ns) != "" {
			return false
		}
	}
	return true
}

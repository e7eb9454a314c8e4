package model

import (
	"cmp"
	"fmt"
	"slices"
	"time"
)

// Budget bounds what the Services of a node may take of the data plane's
// maps: one Service can never fill a map and stop every other Service
// (and endpoint change) from being programmed. Zero fields are no bound.
type Budget struct {
	// ServiceFrontends and ServiceBackends bound one Service: its
	// entries in lace_services (one per VIP, protocol and port) and in
	// lace_backends (one per endpoint of each of them, plus a ClusterIP
	// reference per external frontend).
	ServiceFrontends, ServiceBackends int
	// TotalFrontends and TotalBackends bound all Services together: the
	// maps' sizes.
	TotalFrontends, TotalBackends int
	// TotalSourceRanges bounds the loadBalancerSourceRanges entries
	// (lace_src_ranges) of all Services.
	TotalSourceRanges int
}

// Cost is what one Service takes of the maps.
type Cost struct{ Frontends, Backends, SourceRanges int }

// CostOf is what r's services take of the maps (an upper bound: two
// Services naming the same frontend share one entry).
func CostOf(r *ServiceResult) Cost {
	c := Cost{Frontends: len(r.Services)}
	for i := range r.Services {
		s := &r.Services[i]
		c.Backends += len(s.Backends)
		if s.External() {
			c.Backends++
			c.SourceRanges += len(s.SourceRanges)
		}
	}
	return c
}

// Reasons of a refusal (Event reasons and metric labels).
const (
	ReasonServiceOverBudget = "ServiceOverBudget"
	ReasonMapsFull          = "ServiceMapsFull"
)

// Refusal says why a Service is not programmed.
type Refusal struct {
	Reason, Message string
}

// Candidate is one Service before the budget: its age orders who keeps
// room when the maps are short (the oldest first).
type Candidate struct {
	Key     ServiceKey
	Created time.Time
	UID     string
	Cost    Cost
}

// Admit judges every candidate: a Service over the per-Service budget is
// refused whole, and when the rest exceeds the totals the newest Services
// (by creation time, then UID) are refused until the others fit, so a
// Service that works keeps working whatever is created after it. Services
// are never half-programmed. It returns the refused ones.
func (b Budget) Admit(cands []Candidate) map[ServiceKey]Refusal {
	out := map[ServiceKey]Refusal{}
	order := make([]*Candidate, 0, len(cands))
	for i := range cands {
		c := &cands[i]
		if b.ServiceFrontends > 0 && c.Cost.Frontends > b.ServiceFrontends {
			out[c.Key] = Refusal{ReasonServiceOverBudget, fmt.Sprintf(
				"the service needs %d frontend entries (addresses x ports), more than the %d one Service may take on a node",
				c.Cost.Frontends, b.ServiceFrontends)}
			continue
		}
		if b.ServiceBackends > 0 && c.Cost.Backends > b.ServiceBackends {
			out[c.Key] = Refusal{ReasonServiceOverBudget, fmt.Sprintf(
				"the service needs %d backend entries (frontends x endpoints), more than the %d one Service may take on a node",
				c.Cost.Backends, b.ServiceBackends)}
			continue
		}
		order = append(order, c)
	}
	slices.SortFunc(order, func(x, y *Candidate) int {
		return cmp.Or(x.Created.Compare(y.Created), cmp.Compare(x.UID, y.UID),
			cmp.Compare(x.Key.Namespace, y.Key.Namespace), cmp.Compare(x.Key.Name, y.Key.Name))
	})
	var used Cost
	for _, c := range order {
		next := Cost{used.Frontends + c.Cost.Frontends, used.Backends + c.Cost.Backends, used.SourceRanges + c.Cost.SourceRanges}
		if over(next.Frontends, b.TotalFrontends) || over(next.Backends, b.TotalBackends) || over(next.SourceRanges, b.TotalSourceRanges) {
			out[c.Key] = Refusal{ReasonMapsFull, fmt.Sprintf(
				"the node's service maps are full: %d frontend and %d backend entries would exceed %d and %d (older Services keep theirs)",
				next.Frontends, next.Backends, b.TotalFrontends, b.TotalBackends)}
			continue
		}
		used = next
	}
	return out
}

func over(n, limit int) bool { return limit > 0 && n > limit }

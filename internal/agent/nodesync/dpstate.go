package nodesync

import (
	"log/slog"
	"slices"

	"github.com/lace-cni/lace/internal/datapath"
	"github.com/lace-cni/lace/internal/model"
	"github.com/lace-cni/lace/internal/tables"
)

// tableDP is the node's data plane with its services written through a
// datapath.ServiceTable: what was written is kept in memory, so a sync
// compares the desired services with that instead of reading every
// backend back from the kernel. The applier is its one writer.
type tableDP struct {
	*datapath.Datapath
	services *datapath.ServiceTable
	// applied is the desired state the table last applied without error.
	applied *appliedSlice[datapath.Service]
	// routes is the desired views last synced without error.
	routes *appliedSlice[datapath.Route]
	// unflushed are the endpoints that left a service whose flows are
	// not forgotten yet (a walk failed): kept until a flush succeeds, or
	// a client would be sent on to an endpoint that went away.
	unflushed *datapath.Gone
}

// WithServiceTable is d with its services written through a
// datapath.ServiceTable (tableDP): the DataPlane the agent syncs.
func WithServiceTable(d *datapath.Datapath) DataPlane {
	return tableDP{Datapath: d, services: datapath.NewServiceTable(d), applied: &appliedSlice[datapath.Service]{},
		routes: &appliedSlice[datapath.Route]{}, unflushed: &datapath.Gone{}}
}

// SyncRoutes implements RouteTable: the views (one per VIP per view, tens
// of thousands with many services) are diffed against what was written
// only when they changed, not when an endpoint did.
func (d tableDP) SyncRoutes(want []datapath.Route) error {
	if d.routes.same(want) {
		return nil
	}
	err := d.Datapath.SyncRoutes(want)
	d.routes.set(want, err == nil)
	return err
}

// ApplyServices implements DataPlane. The desired services are computed
// anew only when they change (serviceCache): the very slice applied last
// time, applied without error, is left alone without even a comparison,
// and one whose changes since the last applied reach back to it is
// applied by those keys alone (ServiceTable.ApplyKeys).
func (d tableDP) ApplyServices(want []datapath.Service, changes model.ServiceChanges) (datapath.Gone, error) {
	a := d.applied
	// The merge's list may be changed in place: it is the one applied
	// when its number, gate and hostPorts are (Same). A list of no number
	// is a new one each time it changes.
	if a.ok && (changes.Same(a.changes) || changes.Gen == 0 && a.changes.Gen == 0 && a.same(want)) {
		return *d.unflushed, nil
	}
	var gone datapath.Gone
	var err error
	keys, ok := changes.Between(a.changes)
	if ok && a.ok {
		gone, err = d.services.ApplyKeys(want, keys)
	} else {
		keys = nil
		gone, err = d.services.Apply(want)
	}
	d.keepUnflushed(gone, want, keys)
	for k, why := range d.services.Skipped() {
		// The budget refuses such a Service (with an Event) before it
		// gets here; this is the last guard.
		slog.Warn("service frontend left out of the data plane", "frontend", k.VIP.String(), "port", k.Port, "why", why)
	}
	a.set(want, err == nil)
	a.changes = model.ServiceChanges{}
	if err == nil {
		a.changes = changes
	}
	return *d.unflushed, err
}

// keepUnflushed adds gone to the endpoints whose flows are still to
// forget, each once, less those that are back in their service in want
// (their flows are live again: a flush would reset them): a backend
// again, or for Unlisted, back in the slices (Lingering). Only the
// services at keys can be back when keys is not nil (ApplyKeys).
func (d tableDP) keepUnflushed(gone datapath.Gone, want []datapath.Service, keys []datapath.ServiceKey) {
	u := d.unflushed
	u.Left = mergeGone(u.Left, gone.Left)
	u.Unlisted = mergeGone(u.Unlisted, gone.Unlisted)
	if gone.Listed != nil {
		u.Listed = gone.Listed // the agent's first apply: swept at the next flush
	}
	if len(u.Left) == 0 && len(u.Unlisted) == 0 {
		return
	}
	prune := func(s *datapath.Service) {
		k := s.Key()
		pruneGone(u.Left, k, func(b datapath.Backend) bool { return slices.Contains(s.Backends, b) })
		pruneGone(u.Unlisted, k, func(b datapath.Backend) bool {
			return slices.Contains(s.Backends, b) || slices.Contains(s.Lingering, b)
		})
	}
	if keys == nil {
		for i := range want {
			prune(&want[i])
		}
		return
	}
	for _, k := range keys {
		if i, ok := tables.FindFrontend(want, k); ok {
			prune(&want[i])
		}
	}
}

// mergeGone adds more's endpoints to to, each once.
func mergeGone(to, more map[datapath.ServiceKey][]datapath.Backend) map[datapath.ServiceKey][]datapath.Backend {
	if len(more) == 0 {
		return to
	}
	if to == nil {
		to = map[datapath.ServiceKey][]datapath.Backend{}
	}
	for k, bs := range more {
		for _, b := range bs {
			if !slices.Contains(to[k], b) {
				to[k] = append(to[k], b)
			}
		}
	}
	return to
}

// pruneGone removes k's endpoints that back says are back.
func pruneGone(m map[datapath.ServiceKey][]datapath.Backend, k datapath.ServiceKey, back func(datapath.Backend) bool) {
	bs, ok := m[k]
	if !ok {
		return
	}
	if bs = slices.DeleteFunc(bs, back); len(bs) == 0 {
		delete(m, k)
	} else {
		m[k] = bs
	}
}

// FlushServiceFlows implements DataPlane: gone is what ApplyServices
// returned, every endpoint that left since the last flush that succeeded.
func (d tableDP) FlushServiceFlows(gone datapath.Gone) (int, error) {
	n, err := d.Datapath.FlushServiceFlows(gone)
	if err == nil {
		*d.unflushed = datapath.Gone{}
	}
	return n, err
}

// appliedSlice remembers which slice was last applied: the desired state
// keeps a slice while it is unchanged and makes a new one when it
// changes, so the same slice, applied without error, needs no work. The
// services' merged list is the exception: it changes in place, and its
// merge number (gen) tells instead.
type appliedSlice[T any] struct {
	ptr *T
	n   int
	ok  bool
	// changes are the applied services' (their merge, gate and
	// hostPorts; Gen 0: not known).
	changes model.ServiceChanges
}

func (a *appliedSlice[T]) same(s []T) bool {
	return a.ok && len(s) > 0 && a.n == len(s) && a.ptr == &s[0]
}

func (a *appliedSlice[T]) set(s []T, ok bool) {
	a.ptr, a.n, a.ok = nil, len(s), ok
	if len(s) > 0 {
		a.ptr = &s[0]
	}
}

package nodesync

import (
	"log/slog"
	"slices"

	"github.com/lace-cni/lace/internal/datapath"
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
	unflushed *map[datapath.ServiceKey][]datapath.Backend
}

// WithServiceTable is d with its services written through a
// datapath.ServiceTable (tableDP): the DataPlane the agent syncs.
func WithServiceTable(d *datapath.Datapath) DataPlane {
	return tableDP{Datapath: d, services: datapath.NewServiceTable(d), applied: &appliedSlice[datapath.Service]{},
		routes: &appliedSlice[datapath.Route]{}, unflushed: new(map[datapath.ServiceKey][]datapath.Backend)}
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
// time, applied without error, is left alone without even a comparison.
func (d tableDP) ApplyServices(want []datapath.Service) (map[datapath.ServiceKey][]datapath.Backend, error) {
	if d.applied.same(want) {
		return *d.unflushed, nil
	}
	gone, err := d.services.Apply(want)
	d.keepUnflushed(gone, want)
	for k, why := range d.services.Skipped() {
		// The budget refuses such a Service (with an Event) before it
		// gets here; this is the last guard.
		slog.Warn("service frontend left out of the data plane", "frontend", k.VIP.String(), "port", k.Port, "why", why)
	}
	d.applied.set(want, err == nil)
	return *d.unflushed, err
}

// keepUnflushed adds gone to the endpoints whose flows are still to
// forget, each once, less those that are a backend of their service
// again in want (their flows are live again: a flush would reset them).
func (d tableDP) keepUnflushed(gone map[datapath.ServiceKey][]datapath.Backend, want []datapath.Service) {
	u := *d.unflushed
	if len(gone) == 0 && len(u) == 0 {
		return
	}
	if u == nil {
		u = map[datapath.ServiceKey][]datapath.Backend{}
	}
	for k, bs := range gone {
		for _, b := range bs {
			if !slices.Contains(u[k], b) {
				u[k] = append(u[k], b)
			}
		}
	}
	for _, s := range want {
		k := datapath.ServiceKey{VIP: s.VIP, Proto: s.Proto, Port: s.Port}
		if bs, ok := u[k]; ok {
			bs = slices.DeleteFunc(bs, func(b datapath.Backend) bool { return slices.Contains(s.Backends, b) })
			if len(bs) == 0 {
				delete(u, k)
			} else {
				u[k] = bs
			}
		}
	}
	*d.unflushed = u
}

// FlushServiceFlows implements DataPlane: gone is what ApplyServices
// returned, every endpoint that left since the last flush that succeeded.
func (d tableDP) FlushServiceFlows(gone map[datapath.ServiceKey][]datapath.Backend) (int, error) {
	n, err := d.Datapath.FlushServiceFlows(gone)
	if err == nil {
		*d.unflushed = nil
	}
	return n, err
}

// appliedSlice remembers which slice was last applied: the desired state
// keeps a slice while it is unchanged and makes a new one when it
// changes (nothing changes one in place), so the same slice, applied
// without error, needs no work.
type appliedSlice[T any] struct {
	ptr *T
	n   int
	ok  bool
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

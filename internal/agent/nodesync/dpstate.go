package nodesync

import (
	"errors"
	"log/slog"
	"net/netip"

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
}

// WithServiceTable is d with its services written through a
// datapath.ServiceTable (tableDP): the DataPlane the agent syncs.
func WithServiceTable(d *datapath.Datapath) DataPlane {
	return tableDP{Datapath: d, services: datapath.NewServiceTable(d), applied: &appliedSlice[datapath.Service]{}}
}

// ApplyServices implements DataPlane. The desired services are computed
// anew only when they change (serviceCache): the very slice applied last
// time, applied without error, is left alone without even a comparison.
func (d tableDP) ApplyServices(want []datapath.Service) (map[datapath.ServiceKey][]datapath.Backend, error) {
	if d.applied.same(want) {
		return nil, nil
	}
	gone, err := d.services.Apply(want)
	for k, why := range d.services.Skipped() {
		// The budget refuses such a Service (with an Event) before it
		// gets here; this is the last guard.
		slog.Warn("service frontend left out of the data plane", "frontend", k.VIP.String(), "port", k.Port, "why", why)
	}
	d.applied.set(want, err == nil)
	return gone, err
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

// routeMirror is the routes map (the views) as the agent last wrote it:
// a sync compares the desired views with it rather than reading every
// entry back (one per VIP per view: tens of thousands with many
// services). It is read from the data plane once, at the first sync (what
// the agent before it left is adopted, and removed when no longer
// wanted), and again whenever the data plane is another one.
type routeMirror struct {
	dp   RouteTable
	have map[routeKey]mirroredRoute
	gen  uint64
	// applied is the desired views last synced without error.
	applied appliedSlice[datapath.Route]
}

type routeKey struct {
	netID  uint32
	prefix netip.Prefix
}

type mirroredRoute struct {
	r   datapath.Route
	gen uint64
}

// sync upserts the wanted routes that are missing or differ and deletes
// the ones not wanted. A write that fails leaves the mirror as the map
// is (the old entry, or none), so the next sync tries it again.
func (m *routeMirror) sync(dp RouteTable, want []datapath.Route) (err error) {
	if m.dp == dp && m.applied.same(want) {
		return nil // the views did not change (an endpoint did)
	}
	defer func() { m.applied.set(want, err == nil) }()
	if m.have == nil || m.dp != dp {
		cur, err := dp.Routes()
		if err != nil {
			return err
		}
		m.dp, m.have = dp, make(map[routeKey]mirroredRoute, len(cur))
		for _, r := range cur {
			m.have[routeKey{r.NetID, r.Prefix}] = mirroredRoute{r: r}
		}
	}
	m.gen++
	var errs []error
	for _, w := range want {
		k := routeKey{w.NetID, w.Prefix}
		c, ok := m.have[k]
		if ok && c.r == w {
			m.have[k] = mirroredRoute{r: w, gen: m.gen}
			continue
		}
		if err := dp.UpsertRoute(w); err != nil {
			errs = append(errs, err)
			if ok {
				// The map keeps the old entry: not to be deleted below.
				m.have[k] = mirroredRoute{r: c.r, gen: m.gen}
			}
			continue
		}
		m.have[k] = mirroredRoute{r: w, gen: m.gen}
	}
	for k, c := range m.have {
		if c.gen == m.gen {
			continue
		}
		if err := dp.DeleteRoute(k.netID, k.prefix); err != nil {
			errs = append(errs, err)
			continue
		}
		delete(m.have, k)
	}
	return errors.Join(errs...)
}

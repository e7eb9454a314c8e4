package nodesync

import (
	"errors"
	"fmt"
	"maps"
	"net/netip"
	"slices"
	"time"

	"github.com/lace-cni/lace/internal/datapath"
	"github.com/lace-cni/lace/internal/model"
)

// apply makes the data plane equal to st, touching only the difference.
func (s *Syncer) apply(st model.NodeState) error {
	start := time.Now()
	defer func() { syncDuration.Observe(time.Since(start).Seconds()) }()
	s.mu.Lock()
	own := append([]netip.Addr(nil), s.ownAddrs...)
	first := !s.applied
	s.mu.Unlock()
	if first {
		if err := s.node.EnableForwarding(); err != nil {
			return err
		}
		err := s.dp.AttachUnderlay(s.opts.NetNS, s.opts.UnderlayInterface)
		if err == nil && s.opts.HostCgroup != "" {
			if s.hostNetNS, err = s.node.NetNSCookie(); err == nil {
				err = s.dp.AttachHostSockets(s.opts.HostCgroup)
			}
		}
		s.mu.Lock()
		s.attachErr = err
		s.mu.Unlock()
		if err != nil {
			s.kickStatus()
			return err
		}
	}
	ethIndex, err := s.node.UnderlayIndex()
	if err != nil {
		return err
	}
	var v4, v6 netip.Addr
	for _, ad := range own {
		if ad.Is6() && !v6.IsValid() {
			v6 = ad
		}
		if ad.Is4() && !v4.IsValid() {
			v4 = ad
		}
	}
	// The node's own addresses go first: the underlay guard drops plain IP
	// to anything else, so it is armed only once they are all written.
	// Each table is synced against what was written to it (datapath's
	// table reconciler), never read back from the kernel.
	if err := s.dp.SyncHostAddrs(own); err != nil {
		return fmt.Errorf("host addresses: %w", err)
	}
	wantCfg := datapath.Config{UnderlayIP: v6, UnderlayIPv4: v4, Locator: st.Locator, UnderlayIfIndex: uint32(ethIndex),
		GuardUnderlay: len(own) > 0, HostNetNS: s.hostNetNS,
		HostNet4: model.ClassifyAddr(st.Classifiers, v4), HostNet6: model.ClassifyAddr(st.Classifiers, v6)}
	if err := s.dp.SetConfig(wantCfg); err != nil { // written only when it changes
		return fmt.Errorf("set config: %w", err)
	}
	var errs []error
	errs = append(errs, s.dp.SyncNodes(st.Nodes), s.dp.SyncNodeLocators(st.NodeLocators), s.dp.SyncNetworks(st.Networks))
	// Services before the views that reach their VIPs, so a new VIP is
	// never looked up before it is served. Flows to endpoints that left a
	// service are forgotten (a UDP client is never black-holed), even
	// when the apply failed part way: what left is kept until forgotten.
	var gone datapath.Gone
	s.compute.services.readServices(func() { gone, err = s.dp.ApplyServices(st.Services, st.ServiceChanges) })
	errs = append(errs, err)
	// Only a flush that walks the maps is paced; one that walks nothing
	// (TCP endpoints no longer ready keep their flows) clears the set.
	if !gone.Empty() && (!gone.Walks() || s.flushPace.due(time.Now(), s.flushLater)) {
		start := time.Now()
		n, err := s.dp.FlushServiceFlows(gone)
		s.flushPace.ran(start, time.Since(start))
		if err != nil {
			errs = append(errs, fmt.Errorf("forget flows to endpoints that left: %w", err))
		} else if n > 0 {
			s.log.Info("forgot flows to endpoints that left their service", "flows", n)
		}
	}
	errs = append(errs, s.dp.SyncRoutes(st.Routes))
	errs = append(errs, s.dp.SyncClassifiers(st.Classifiers), s.dp.SyncInsides(st.Inside))
	errs = append(errs, s.dp.SyncL2Cluster(st.L2Neighbors, st.L2FDB, st.L2Flood))

	// Underlay routes to the other nodes' locators, and to their pod
	// blocks for the node's own sockets (plain IP from the node address,
	// judged by the owner node like any outside host's).
	owned, err := s.node.OwnedRoutes()
	errs = append(errs, err)
	want := map[netip.Prefix]bool{}
	// The next hops of the routes in place stay resolved (below).
	hops := map[netip.Addr]bool{}
	route := func(dst netip.Prefix, via netip.Addr) {
		want[dst] = true
		if v, ok := owned[dst]; ok && v == via {
			hops[via] = true
			return
		}
		if err := s.node.ReplaceOwnedRoute(dst, via); err != nil {
			errs = append(errs, err)
			return
		}
		hops[via] = true
	}
	for _, hr := range st.HostRoutes {
		route(hr.Prefix, hr.Via)
	}
	for _, lr := range st.LocatorRoutes {
		route(lr.Locator, lr.Via)
	}
	for p := range owned {
		if !want[p] {
			errs = append(errs, s.node.DeleteRoute(p))
		}
	}
	// The data plane's FIB lookups read the neighbour table only, and a
	// flood cannot wait for resolution. Best effort: forwarding works
	// without (more slowly), so a failure is logged, not the apply's.
	if err := s.node.KeepResolved(slices.Collect(maps.Keys(hops))); err != nil {
		s.log.Warn("keep the underlay next hops resolved", "error", err)
	}

	s.pods.SetL2Learning(st.L2Learning, st.L2Learned)
	errs = append(errs, s.pods.SyncEntries())
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("apply data plane: %w", err)
	}
	s.mu.Lock()
	first = !s.applied
	s.applied = true
	s.mu.Unlock()
	if first {
		s.kickStatus()
	}
	return nil
}

// syncHealthPorts serves the healthCheckNodePorts (none without health
// ports: a sync made by a test).
func (s *Syncer) syncHealthPorts(hcs []model.HealthCheck) error {
	if s.health == nil {
		return nil
	}
	return s.health.Sync(hcs)
}

// syncPods is the applier's part sync: the pods' entries alone (a CNI ADD
// or DEL changed nothing else; the node's state follows from the API
// objects, its reconciler asks for a full sync).
func (s *Syncer) syncPods() error { return s.pods.SyncEntries() }

// syncDataplane is the applier's full sync: the whole node once its state is
// known, the pods' entries alone before.
//
// Its result is the pods' part: a pod's ADD or DEL must not fail because
// something else of the node could not be applied (a route to a node that
// is unreachable, say). The node part's error is kept for the reconciler,
// which retries and reports it.
func (s *Syncer) syncDataplane() error {
	s.mu.Lock()
	st, have := s.state, s.haveState
	s.mu.Unlock()
	if !have {
		return s.pods.SyncEntries()
	}
	err := s.apply(st)
	s.mu.Lock()
	s.applyErr = err
	s.mu.Unlock()
	if err != nil {
		// apply may have stopped before the pods' entries: apply them on
		// their own, for the waiting ADDs and DELs.
		return s.pods.SyncEntries()
	}
	return nil
}

package cni

import (
	"net/netip"

	"github.com/lace-cni/lace/internal/agent/agenttest"
	"github.com/lace-cni/lace/internal/agent/applier"
	"github.com/lace-cni/lace/internal/datapath"
)

// The fake's syncs diff against its maps (what the real data plane keeps
// as its tables' mirrors) and count a write per entry changed.

func (f *fakeDP) SyncEndpoints(want []datapath.Endpoint, busy func(uint32, netip.Addr) bool) error {
	return applier.SyncList(agenttest.Values(&f.mu, f.eps), want, func(e datapath.Endpoint) endpointKey { return endpointKey{e.NetID, e.Addr} }, sameEndpoint,
		f.UpsertEndpoint, func(e datapath.Endpoint) error {
			if busy(e.NetID, e.Addr) {
				return nil
			}
			f.mu.Lock()
			f.removed = append(f.removed, epKey(e.NetID, e.Addr))
			f.mu.Unlock()
			return f.DeleteEndpoint(e.NetID, e.Addr)
		})
}

func (f *fakeDP) ForgetRemovedFlows() error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if len(f.removed) > 0 {
		f.forgotten = append(f.forgotten, f.removed...)
		f.attachedAtForget = len(f.attached)
		f.removed = nil
	}
	return nil
}

func (f *fakeDP) SyncPorts(want []datapath.Port, busy func(uint32) bool) error {
	return applier.SyncListEq(agenttest.Values(&f.mu, f.ports), want, func(p datapath.Port) uint32 { return p.IfIndex },
		f.UpsertPort, func(p datapath.Port) error {
			if busy(p.IfIndex) {
				return nil
			}
			return f.DeletePort(p.IfIndex)
		})
}

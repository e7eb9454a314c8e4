package nodesync

import (
	"fmt"
	"net/netip"

	"github.com/lace-cni/lace/internal/agent/agenttest"
	"github.com/lace-cni/lace/internal/agent/applier"
	"github.com/lace-cni/lace/internal/datapath"
)

// The fake's table syncs diff against its maps (what the real data plane
// keeps as its tables' mirrors) and count a write per entry changed.

func (f *fakeDP) SyncHostAddrs(want []netip.Addr) error {
	return applier.SyncSet(agenttest.Keys(&f.mu, f.host), want, f.UpsertHostAddr, f.DeleteHostAddr)
}

func (f *fakeDP) SyncNodes(want []netip.Addr) error {
	return applier.SyncSet(agenttest.Keys(&f.mu, f.nodes), want, f.UpsertNode, f.DeleteNode)
}

func (f *fakeDP) SyncNodeLocators(want []datapath.NodeLocator) error {
	return applier.SyncListEq(agenttest.Values(&f.mu, f.nodeLocs), want, func(n datapath.NodeLocator) netip.Addr { return n.Addr },
		f.UpsertNodeLocator, func(n datapath.NodeLocator) error { return f.DeleteNodeLocator(n.Addr) })
}

func (f *fakeDP) SyncNetworks(want []datapath.Network) error {
	return applier.SyncListEq(agenttest.Values(&f.mu, f.nets), want, func(n datapath.Network) uint32 { return n.ID },
		f.UpsertNetwork, func(n datapath.Network) error { return f.DeleteNetwork(n.ID) })
}

func (f *fakeDP) SyncClassifiers(want []datapath.Classifier) error {
	return applier.SyncListEq(agenttest.Values(&f.mu, f.cls), want, func(c datapath.Classifier) netip.Prefix { return c.Prefix },
		f.UpsertClassifier, func(c datapath.Classifier) error { return f.DeleteClassifier(c.Prefix) })
}

func (f *fakeDP) SyncInsides(want []datapath.Inside) error {
	return applier.SyncListEq(agenttest.Values(&f.mu, f.inside), want, func(c datapath.Inside) netip.Prefix { return c.Prefix },
		f.UpsertInside, func(c datapath.Inside) error { return f.DeleteInside(c.Prefix) })
}

func (f *fakeDP) SyncRoutes(want []datapath.Route) error {
	return applier.SyncListEq(agenttest.Values(&f.mu, f.routes), want, func(r datapath.Route) string { return fmt.Sprint(r.NetID, r.Prefix) },
		f.UpsertRoute, func(r datapath.Route) error { return f.DeleteRoute(r.NetID, r.Prefix) })
}

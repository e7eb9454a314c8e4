package nodesync

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"net/netip"
	"reflect"
	"slices"
	"sync"
	"testing"

	"k8s.io/client-go/tools/record"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"

	lacev1 "github.com/lace-cni/lace/api/v1alpha1"
	"github.com/lace-cni/lace/internal/agent/agenttest"
	"github.com/lace-cni/lace/internal/datapath"
	"github.com/lace-cni/lace/internal/model"
	"github.com/lace-cni/lace/internal/tables"
	"github.com/lace-cni/lace/pkg/scheme"
)

// fakeDP is an in-memory DataPlane that counts writes.
type fakeDP struct {
	mu       sync.Mutex
	writes   int
	routes   map[string]datapath.Route
	nets     map[uint32]datapath.Network
	cls      map[netip.Prefix]datapath.Classifier
	inside   map[netip.Prefix]datapath.Inside
	nodeLocs map[netip.Addr]datapath.NodeLocator
	nodes    map[netip.Addr]bool
	host     map[netip.Addr]bool
	attached map[string]bool
	cfg      datapath.Config
	services []datapath.Service
	// servicesApplied are the changes of the services last applied.
	servicesApplied model.ServiceChanges
	l2Neigh         []datapath.L2Neighbor
	l2FDB           []datapath.FDBEntry
}

func (f *fakeDP) SyncL2Cluster(n []datapath.L2Neighbor, fdb []datapath.FDBEntry, _ []datapath.L2FloodNode) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.l2Neigh, f.l2FDB = n, fdb
	return nil
}

func newFakeDP() *fakeDP {
	return &fakeDP{routes: map[string]datapath.Route{},
		nets: map[uint32]datapath.Network{}, cls: map[netip.Prefix]datapath.Classifier{},
		inside: map[netip.Prefix]datapath.Inside{}, nodeLocs: map[netip.Addr]datapath.NodeLocator{}, nodes: map[netip.Addr]bool{},
		host: map[netip.Addr]bool{}, attached: map[string]bool{}}
}

func (f *fakeDP) w(fn func()) error { f.mu.Lock(); defer f.mu.Unlock(); f.writes++; fn(); return nil }

func (f *fakeDP) SetConfig(c datapath.Config) error {
	if cur, _ := f.Config(); cur == c {
		return nil // the real one writes only a change too
	}
	return f.w(func() { f.cfg = c })
}
func (f *fakeDP) Config() (datapath.Config, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.cfg, nil
}
func (f *fakeDP) AttachUnderlay(string, string) error {
	return f.w(func() { f.attached["underlay"] = true })
}
func (f *fakeDP) UpsertRoute(r datapath.Route) error {
	return f.w(func() { f.routes[fmt.Sprint(r.NetID, r.Prefix)] = r })
}
func (f *fakeDP) DeleteRoute(n uint32, p netip.Prefix) error {
	return f.w(func() { delete(f.routes, fmt.Sprint(n, p)) })
}
func (f *fakeDP) Routes() ([]datapath.Route, error)      { return agenttest.Values(&f.mu, f.routes), nil }
func (f *fakeDP) UpsertNetwork(n datapath.Network) error { return f.w(func() { f.nets[n.ID] = n }) }
func (f *fakeDP) DeleteNetwork(id uint32) error          { return f.w(func() { delete(f.nets, id) }) }
func (f *fakeDP) Networks() ([]datapath.Network, error)  { return agenttest.Values(&f.mu, f.nets), nil }
func (f *fakeDP) UpsertClassifier(c datapath.Classifier) error {
	return f.w(func() { f.cls[c.Prefix] = c })
}
func (f *fakeDP) DeleteClassifier(p netip.Prefix) error { return f.w(func() { delete(f.cls, p) }) }
func (f *fakeDP) Classifiers() ([]datapath.Classifier, error) {
	return agenttest.Values(&f.mu, f.cls), nil
}
func (f *fakeDP) UpsertInside(c datapath.Inside) error {
	return f.w(func() { f.inside[c.Prefix] = c })
}
func (f *fakeDP) DeleteInside(p netip.Prefix) error   { return f.w(func() { delete(f.inside, p) }) }
func (f *fakeDP) Insides() ([]datapath.Inside, error) { return agenttest.Values(&f.mu, f.inside), nil }
func (f *fakeDP) UpsertNodeLocator(n datapath.NodeLocator) error {
	return f.w(func() { f.nodeLocs[n.Addr] = n })
}
func (f *fakeDP) DeleteNodeLocator(a netip.Addr) error { return f.w(func() { delete(f.nodeLocs, a) }) }
func (f *fakeDP) NodeLocators() ([]datapath.NodeLocator, error) {
	return agenttest.Values(&f.mu, f.nodeLocs), nil
}

// ApplyServices applies as the service table does: the keys a step names
// when the changes reach back to the list applied last, everything
// otherwise, and the gate's and hostPorts' keys of this list and the last
// one. A change a step leaves unnamed stays unapplied, as it would in the
// maps.
func (f *fakeDP) ApplyServices(s []datapath.Service, ch model.ServiceChanges) (datapath.Gone, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	keys, ok := ch.Between(f.servicesApplied)
	if !ok {
		f.services = slices.Clone(s)
	} else {
		f.services = applyKeys(f.services, s, keys)
	}
	f.servicesApplied = ch
	return datapath.Gone{}, nil
}

// applyKeys is have with the entries of want at keys (added, changed or
// removed), sorted.
func applyKeys(have, want []datapath.Service, keys []datapath.ServiceKey) []datapath.Service {
	m := make(map[datapath.ServiceKey]datapath.Service, len(have))
	for _, s := range have {
		m[s.Key()] = s
	}
	for _, k := range keys {
		delete(m, k)
		if i, ok := tables.FindFrontend(want, k); ok {
			m[k] = want[i]
		}
	}
	out := slices.Collect(maps.Values(m))
	slices.SortFunc(out, func(a, b datapath.Service) int { return a.Key().Compare(b.Key()) })
	return out
}

// unnamedChanges are the frontends whose entries differ between was and
// now (added, removed or changed) and are not in keys.
func unnamedChanges(was, now []datapath.Service, keys []datapath.ServiceKey) []datapath.ServiceKey {
	named := map[datapath.ServiceKey]bool{}
	for _, k := range keys {
		named[k] = true
	}
	entries := func(l []datapath.Service) map[datapath.ServiceKey]*datapath.Service {
		m := make(map[datapath.ServiceKey]*datapath.Service, len(l))
		for i := range l {
			m[l[i].Key()] = &l[i]
		}
		return m
	}
	a, b := entries(was), entries(now)
	var bad []datapath.ServiceKey
	for k, x := range a {
		if y := b[k]; !named[k] && (y == nil || !reflect.DeepEqual(*x, *y)) {
			bad = append(bad, k)
		}
	}
	for k := range b {
		if a[k] == nil && !named[k] {
			bad = append(bad, k)
		}
	}
	return bad
}

func (f *fakeDP) AttachHostSockets(string) error { return nil }

func (f *fakeDP) FlushServiceFlows(datapath.Gone) (int, error) {
	return 0, nil
}
func (f *fakeDP) UpsertNode(a netip.Addr) error     { return f.w(func() { f.nodes[a] = true }) }
func (f *fakeDP) DeleteNode(a netip.Addr) error     { return f.w(func() { delete(f.nodes, a) }) }
func (f *fakeDP) Nodes() ([]netip.Addr, error)      { return agenttest.Keys(&f.mu, f.nodes), nil }
func (f *fakeDP) UpsertHostAddr(a netip.Addr) error { return f.w(func() { f.host[a] = true }) }
func (f *fakeDP) DeleteHostAddr(a netip.Addr) error { return f.w(func() { delete(f.host, a) }) }
func (f *fakeDP) HostAddrs() ([]netip.Addr, error)  { return agenttest.Keys(&f.mu, f.host), nil }

// fakeNode is an in-memory Kernel.
type fakeNode struct {
	mu     sync.Mutex
	addrs  []netip.Addr
	routes map[netip.Prefix]netip.Addr
	// routeWrites counts route replacements, to check they are diffed.
	routeWrites int
	// failRoutes makes every route replacement fail.
	failRoutes bool
	// hops are the next hops last kept resolved.
	hops []netip.Addr
}

func (n *fakeNode) UnderlayAddrs() ([]netip.Addr, error) {
	n.mu.Lock()
	defer n.mu.Unlock()
	return append([]netip.Addr(nil), n.addrs...), nil
}
func (n *fakeNode) UnderlayIndex() (int, error) { return 2, nil }
func (n *fakeNode) EnableForwarding() error     { return nil }

func (n *fakeNode) NetNSCookie() (uint64, error) { return 1, nil }

func (n *fakeNode) OwnedRoutes() (map[netip.Prefix]netip.Addr, error) {
	n.mu.Lock()
	defer n.mu.Unlock()
	out := map[netip.Prefix]netip.Addr{}
	for p, via := range n.routes {
		out[p] = via
	}
	return out, nil
}
func (n *fakeNode) ReplaceOwnedRoute(dst netip.Prefix, via netip.Addr) error {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.failRoutes {
		return fmt.Errorf("no route to %s", via)
	}
	n.routeWrites++
	n.routes[dst] = via
	return nil
}
func (n *fakeNode) KeepResolved(hops []netip.Addr) error {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.hops = append([]netip.Addr(nil), hops...)
	return nil
}
func (n *fakeNode) DeleteRoute(dst netip.Prefix) error {
	n.mu.Lock()
	defer n.mu.Unlock()
	delete(n.routes, dst)
	return nil
}

// fakePods are pod attachments whose entries are always in place.
type fakePods struct {
	mu    sync.Mutex
	syncs int
}

func (p *fakePods) SetL2Learning([]uint32, []model.L2Learned) {}

func (p *fakePods) SyncEntries() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.syncs++
	return nil
}
func (p *fakePods) DropStaleEndpoints(context.Context) error { return nil }
func (p *fakePods) AdoptOnce(context.Context, model.NodeState, []lacev1.Network) error {
	return nil
}
func (p *fakePods) CollectEndpoints(context.Context) error            { return nil }
func (p *fakePods) EnsureNetworkEndpoints(context.Context) error      { return nil }
func (p *fakePods) EachAttachment(func(string, uint32, []netip.Addr)) {}

// testSyncer is the sync of node n1 with fakes for the kernel and the
// pods, its desired state the default network (block
// 10.244.0.0/blockBits on n1).
type testSyncer struct {
	*Syncer
	dp   *fakeDP
	node *fakeNode
	pods *fakePods
	c    client.Client
}

func newTestSyncer(t *testing.T, blockBits int32, objs ...client.Object) *testSyncer {
	t.Helper()
	w := agenttest.DefaultNetwork("n1", blockBits)
	c := fake.NewClientBuilder().WithScheme(scheme.Scheme).WithObjects(append(w.Objects, objs...)...).Build()
	dp := newFakeDP()
	node := &fakeNode{routes: map[netip.Prefix]netip.Addr{}, addrs: []netip.Addr{netip.MustParseAddr("fd00:30::11")}}
	s := New(Options{NodeName: "n1", NetNS: "/fake", UnderlayInterface: "eth0"}, slog.New(slog.NewTextHandler(io.Discard, nil)),
		c, record.NewFakeRecorder(100), nil, nil, dp, node, Capacity{Services: 1024, Backends: 4096, SourceRanges: 256})
	pods := &fakePods{}
	s.Wire(pods, nil, nil)
	s.state = w.State("n1")
	s.haveState = true
	s.ownAddrs = node.addrs
	go func() { _ = s.Run(t.Context()) }()
	return &testSyncer{Syncer: s, dp: dp, node: node, pods: pods, c: c}
}

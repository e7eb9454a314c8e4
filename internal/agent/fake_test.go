package agent

import (
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/netip"
	"path/filepath"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/record"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"

	lacev1 "github.com/lace-cni/lace/api/v1alpha1"
	"github.com/lace-cni/lace/internal/datapath"
	"github.com/lace-cni/lace/internal/model"
	"github.com/lace-cni/lace/internal/podnet"
	"github.com/lace-cni/lace/pkg/scheme"
)

// fakeDP is an in-memory dataplane that counts writes.
type fakeDP struct {
	mu       sync.Mutex
	writes   int
	eps      map[string]datapath.Endpoint
	ports    map[uint32]datapath.Port
	routes   map[string]datapath.Route
	nets     map[uint32]datapath.Network
	cls      map[netip.Prefix]datapath.Classifier
	inside   map[netip.Prefix]datapath.Inside
	nodeLocs map[netip.Addr]datapath.NodeLocator
	nodes    map[netip.Addr]bool
	host     map[netip.Addr]bool
	attached map[string]bool
	attaches map[string]int // AttachPod calls by interface
	cfg      datapath.Config
	services []datapath.Service
}

func newFakeDP() *fakeDP {
	return &fakeDP{eps: map[string]datapath.Endpoint{}, ports: map[uint32]datapath.Port{}, routes: map[string]datapath.Route{},
		nets: map[uint32]datapath.Network{}, cls: map[netip.Prefix]datapath.Classifier{},
		inside: map[netip.Prefix]datapath.Inside{}, nodeLocs: map[netip.Addr]datapath.NodeLocator{}, nodes: map[netip.Addr]bool{},
		host: map[netip.Addr]bool{}, attached: map[string]bool{}, attaches: map[string]int{}}
}

func (f *fakeDP) w(fn func()) error { f.mu.Lock(); defer f.mu.Unlock(); f.writes++; fn(); return nil }

func epKey(n uint32, a netip.Addr) string { return fmt.Sprint(n, a) }
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
func (f *fakeDP) AttachPod(_ string, h string) error {
	return f.w(func() { f.attached[h] = true; f.attaches[h]++ })
}
func (f *fakeDP) DetachPod(h string) error { return f.w(func() { delete(f.attached, h) }) }
func (f *fakeDP) PinnedPodLinks() ([]string, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []string
	for h := range f.attached {
		if h != "underlay" {
			out = append(out, h)
		}
	}
	return out, nil
}
func (f *fakeDP) UpsertEndpoint(e datapath.Endpoint) error {
	return f.w(func() { f.eps[epKey(e.NetID, e.Addr)] = e })
}
func (f *fakeDP) DeleteEndpoint(n uint32, a netip.Addr) error {
	return f.w(func() { delete(f.eps, epKey(n, a)) })
}
func (f *fakeDP) Endpoints() ([]datapath.Endpoint, error) { return values(&f.mu, f.eps), nil }
func (f *fakeDP) UpsertPort(p datapath.Port) error        { return f.w(func() { f.ports[p.IfIndex] = p }) }
func (f *fakeDP) DeletePort(i uint32) error               { return f.w(func() { delete(f.ports, i) }) }
func (f *fakeDP) Ports() ([]datapath.Port, error)         { return values(&f.mu, f.ports), nil }
func (f *fakeDP) UpsertRoute(r datapath.Route) error {
	return f.w(func() { f.routes[fmt.Sprint(r.NetID, r.Prefix)] = r })
}
func (f *fakeDP) DeleteRoute(n uint32, p netip.Prefix) error {
	return f.w(func() { delete(f.routes, fmt.Sprint(n, p)) })
}
func (f *fakeDP) Routes() ([]datapath.Route, error)      { return values(&f.mu, f.routes), nil }
func (f *fakeDP) UpsertNetwork(n datapath.Network) error { return f.w(func() { f.nets[n.ID] = n }) }
func (f *fakeDP) DeleteNetwork(id uint32) error          { return f.w(func() { delete(f.nets, id) }) }
func (f *fakeDP) Networks() ([]datapath.Network, error)  { return values(&f.mu, f.nets), nil }
func (f *fakeDP) UpsertClassifier(c datapath.Classifier) error {
	return f.w(func() { f.cls[c.Prefix] = c })
}
func (f *fakeDP) DeleteClassifier(p netip.Prefix) error       { return f.w(func() { delete(f.cls, p) }) }
func (f *fakeDP) Classifiers() ([]datapath.Classifier, error) { return values(&f.mu, f.cls), nil }
func (f *fakeDP) UpsertInside(c datapath.Inside) error {
	return f.w(func() { f.inside[c.Prefix] = c })
}
func (f *fakeDP) DeleteInside(p netip.Prefix) error   { return f.w(func() { delete(f.inside, p) }) }
func (f *fakeDP) Insides() ([]datapath.Inside, error) { return values(&f.mu, f.inside), nil }
func (f *fakeDP) UpsertNodeLocator(n datapath.NodeLocator) error {
	return f.w(func() { f.nodeLocs[n.Addr] = n })
}
func (f *fakeDP) DeleteNodeLocator(a netip.Addr) error { return f.w(func() { delete(f.nodeLocs, a) }) }
func (f *fakeDP) NodeLocators() ([]datapath.NodeLocator, error) {
	return values(&f.mu, f.nodeLocs), nil
}

func (f *fakeDP) ApplyServices(s []datapath.Service) (map[datapath.ServiceKey][]datapath.Backend, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.services = s
	return nil, nil
}

func (f *fakeDP) AttachHostSockets(string) error { return nil }

func (f *fakeDP) FlushServiceFlows(map[datapath.ServiceKey][]datapath.Backend) (int, error) {
	return 0, nil
}
func (f *fakeDP) UpsertNode(a netip.Addr) error                                    { return f.w(func() { f.nodes[a] = true }) }
func (f *fakeDP) DeleteNode(a netip.Addr) error                                    { return f.w(func() { delete(f.nodes, a) }) }
func (f *fakeDP) Nodes() ([]netip.Addr, error)                                     { return keys(&f.mu, f.nodes), nil }
func (f *fakeDP) SetAnnounced([]netip.Addr, net.HardwareAddr, time.Duration) error { return nil }
func (f *fakeDP) UpsertHostAddr(a netip.Addr) error                                { return f.w(func() { f.host[a] = true }) }
func (f *fakeDP) DeleteHostAddr(a netip.Addr) error                                { return f.w(func() { delete(f.host, a) }) }
func (f *fakeDP) HostAddrs() ([]netip.Addr, error)                                 { return keys(&f.mu, f.host), nil }
func (f *fakeDP) MapSizes() (map[string]int, error)                                { return map[string]int{}, nil }
func (f *fakeDP) Drops() (map[string]uint64, error)                                { return map[string]uint64{}, nil }
func (f *fakeDP) SNATExhaustedCounts() (map[string]uint64, error)                  { return nil, nil }
func (f *fakeDP) Forwarded() (map[string]uint64, error)                            { return map[string]uint64{}, nil }
func (f *fakeDP) Close() error                                                     { return nil }

func values[K comparable, V any](mu *sync.Mutex, m map[K]V) []V {
	mu.Lock()
	defer mu.Unlock()
	out := make([]V, 0, len(m))
	for _, v := range m {
		out = append(out, v)
	}
	return out
}

func keys[K comparable](mu *sync.Mutex, m map[K]bool) []K {
	mu.Lock()
	defer mu.Unlock()
	out := make([]K, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	return out
}

// fakeNode is an in-memory nodeKernel.
type fakeNode struct {
	mu     sync.Mutex
	addrs  []netip.Addr
	mtu    int
	routes map[netip.Prefix]netip.Addr
	// routeWrites counts route replacements, to check they are diffed.
	routeWrites int
	// failRoutes makes every route replacement fail.
	failRoutes bool
	pods       map[string]podnet.Spec
	links      map[string]podnet.Link
	// unreachable are underlay addresses the node has no route to.
	unreachable map[netip.Addr]bool
	next        int
}

func (n *fakeNode) UnderlayAddrs() ([]netip.Addr, error) {
	n.mu.Lock()
	defer n.mu.Unlock()
	return append([]netip.Addr(nil), n.addrs...), nil
}
func (n *fakeNode) UnderlayIndex() (int, error) { return 2, nil }
func (n *fakeNode) UnderlayMTU() (int, error) {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.mtu, nil
}
func (n *fakeNode) Reachable(dst netip.Addr) error {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.unreachable[dst] {
		return fmt.Errorf("no route to %s", dst)
	}
	return nil
}
func (n *fakeNode) HostLinks() (map[string]podnet.Link, error) {
	n.mu.Lock()
	defer n.mu.Unlock()
	out := map[string]podnet.Link{}
	for k, v := range n.links {
		out[k] = v
	}
	return out, nil
}
func (n *fakeNode) EnableForwarding() error { return nil }

func (n *fakeNode) NetNSCookie() (uint64, error) { return 1, nil }

func (n *fakeNode) PodNetNSCookie(string) (uint64, error) { return 2, nil }
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
func (n *fakeNode) DeleteRoute(dst netip.Prefix) error {
	n.mu.Lock()
	defer n.mu.Unlock()
	delete(n.routes, dst)
	return nil
}
func (n *fakeNode) SetupPod(s podnet.Spec) (podnet.Result, error) {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.pods[s.HostIf] = s
	if l, ok := n.links[s.HostIf]; ok {
		return podnet.Result{HostIfIndex: l.Index, HostMAC: l.MAC, PodMAC: net.HardwareAddr{2, 0, 0, 0, 1, byte(l.Index - 100)}}, nil
	}
	n.next++
	n.links[s.HostIf] = podnet.Link{Name: s.HostIf, Index: 100 + n.next, MAC: net.HardwareAddr{2, 0, 0, 0, 0, byte(n.next)}}
	return podnet.Result{HostIfIndex: 100 + n.next, HostMAC: net.HardwareAddr{2, 0, 0, 0, 0, byte(n.next)},
		PodMAC: net.HardwareAddr{2, 0, 0, 0, 1, byte(n.next)}}, nil
}
func (n *fakeNode) TeardownPod(hostIf string, _ []netip.Addr) error {
	n.mu.Lock()
	defer n.mu.Unlock()
	delete(n.pods, hostIf)
	delete(n.links, hostIf)
	return nil
}

// testAgent is an agent on node n1 with fakes for the kernel and a fake API
// holding the default network (block 10.244.0.0/29 on n1, so five pod
// addresses) and a catch-all binding policy.
type testAgent struct {
	*Agent
	dp   *fakeDP
	node *fakeNode
	c    client.Client
	rec  *record.FakeRecorder
}

func newTestAgent(t *testing.T, blockBits int32, objs ...client.Object) *testAgent {
	t.Helper()
	nw := &lacev1.Network{ObjectMeta: metav1.ObjectMeta{Name: "default"},
		Spec: lacev1.NetworkSpec{Type: lacev1.NetworkTypeL3,
			IPv4Subnet: &lacev1.Subnet{Prefix: "10.244.0.0/16", HostLocalPrefixLength: ptr.To(blockBits)}},
		Status: lacev1.NetworkStatus{ID: 1}}
	alloc := &lacev1.Allocation{ObjectMeta: metav1.ObjectMeta{Name: "default.n1"},
		Spec: lacev1.AllocationSpec{Network: "default", Node: "n1", Prefixes: []lacev1.CIDR{lacev1.CIDR(fmt.Sprintf("10.244.0.0/%d", blockBits))}}}
	base := []client.Object{
		&corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "default"}},
		&corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n1"}},
		nw, alloc,
		&lacev1.NetworkBindingPolicy{ObjectMeta: metav1.ObjectMeta{Name: "default"},
			Spec: lacev1.NetworkBindingPolicySpec{Network: "default", Priority: model.CatchAllPriority}},
	}
	// The API server selects pods by node; the fake needs an index for it.
	c := fake.NewClientBuilder().WithScheme(scheme.Scheme).WithObjects(append(base, objs...)...).WithStatusSubresource(&corev1.Pod{}).
		WithIndex(&corev1.Pod{}, "spec.nodeName", func(o client.Object) []string { return []string{o.(*corev1.Pod).Spec.NodeName} }).Build()
	cp, err := loadCheckpoint(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	rec := record.NewFakeRecorder(100)
	dp := newFakeDP()
	node := &fakeNode{routes: map[netip.Prefix]netip.Addr{}, pods: map[string]podnet.Spec{}, links: map[string]podnet.Link{},
		unreachable: map[netip.Addr]bool{}, addrs: []netip.Addr{netip.MustParseAddr("fd00:30::11")}, mtu: 1500}
	a := &Agent{opts: Options{NodeName: "n1", NetNS: "/fake", UnderlayInterface: "eth0", DelQueueDir: filepath.Join(t.TempDir(), "del-queue")},
		log: slog.New(slog.NewTextHandler(io.Discard, nil)), client: c, reader: c, recorder: rec, dp: dp, node: node, cp: cp,
		statusKick: make(chan struct{}, 1)}
	a.state = model.ComputeNode(model.NodeInput{Node: "n1", Networks: []lacev1.Network{*nw}, Allocations: []lacev1.Allocation{*alloc}})
	a.haveState = true
	ap := newApplier(a.syncDataplane, 0)
	a.applier = ap
	go func() { _ = ap.Run(t.Context()) }()
	return &testAgent{Agent: a, dp: dp, node: node, c: c, rec: rec}
}

func pod(name string) *corev1.Pod {
	return &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: name, UID: types.UID("uid-" + name)},
		Spec: corev1.PodSpec{NodeName: "n1"}}
}

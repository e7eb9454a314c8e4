package cni

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/netip"
	"path/filepath"
	"sync"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/record"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"

	lacev1 "github.com/lace-cni/lace/api/v1alpha1"
	"github.com/lace-cni/lace/internal/agent/agenttest"
	"github.com/lace-cni/lace/internal/agent/applier"
	"github.com/lace-cni/lace/internal/datapath"
	"github.com/lace-cni/lace/internal/model"
	"github.com/lace-cni/lace/internal/podnet"
	"github.com/lace-cni/lace/pkg/scheme"
)

// fakeDP is an in-memory Tables (the pods' entries and programs) that
// counts writes.
type fakeDP struct {
	mu       sync.Mutex
	writes   int
	eps      map[string]datapath.Endpoint
	ports    map[uint32]datapath.Port
	attached map[string]bool
	attaches map[string]int  // AttachPod calls by interface
	l2       map[string]bool // the program attached: from_l2 (true) or from_pod
	neigh    []datapath.L2Neighbor
	fdb      []datapath.FDBEntry
	// activated is what L2Activated reports.
	activated []datapath.L2Learned
	// standby is the MACs standing by at a port here (L2Standby), by
	// MAC: their sequence; ActivateStandby moves them to activated.
	standby map[string]datapath.L2Learned
	// removed are the endpoints SyncEndpoints removed since the last
	// ForgetRemovedFlows; forgotten those it forgot, with the interfaces
	// still attached then.
	removed, forgotten []string
	attachedAtForget   int
}

func newFakeDP() *fakeDP {
	return &fakeDP{eps: map[string]datapath.Endpoint{}, ports: map[uint32]datapath.Port{},
		attached: map[string]bool{}, attaches: map[string]int{}, l2: map[string]bool{}}
}

func (f *fakeDP) w(fn func()) error { f.mu.Lock(); defer f.mu.Unlock(); f.writes++; fn(); return nil }

func epKey(n uint32, a netip.Addr) string { return fmt.Sprint(n, a) }
func (f *fakeDP) AttachPod(_ string, h string, l2 bool) error {
	return f.w(func() { f.attached[h] = true; f.attaches[h]++; f.l2[h] = l2 })
}
func (f *fakeDP) SyncL2Local(n []datapath.L2Neighbor, e []datapath.FDBEntry) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.neigh, f.fdb = n, e
	return nil
}
func (f *fakeDP) L2Activated() ([]datapath.L2Learned, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.activated, nil
}
func (f *fakeDP) L2Standby(netID uint32, mac net.HardwareAddr, ifindex uint32) (uint32, bool, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	l, ok := f.standby[mac.String()]
	if !ok || l.NetID != netID || l.IfIndex != ifindex {
		return 0, false, nil
	}
	return l.Seq, true, nil
}
func (f *fakeDP) ActivateStandby(netID uint32, mac net.HardwareAddr, seq uint32) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	l, ok := f.standby[mac.String()]
	if !ok || l.NetID != netID || l.Seq != seq {
		return fmt.Errorf("MAC %s stands by nowhere at sequence %d", mac, seq)
	}
	delete(f.standby, mac.String())
	f.activated = append(f.activated, l)
	return nil
}
func (f *fakeDP) DetachPod(h string) error          { return f.w(func() { delete(f.attached, h) }) }
func (f *fakeDP) PinnedPodLinks() ([]string, error) { return agenttest.Keys(&f.mu, f.attached), nil }
func (f *fakeDP) UpsertEndpoint(e datapath.Endpoint) error {
	return f.w(func() { f.eps[epKey(e.NetID, e.Addr)] = e })
}
func (f *fakeDP) DeleteEndpoint(n uint32, a netip.Addr) error {
	return f.w(func() { delete(f.eps, epKey(n, a)) })
}
func (f *fakeDP) Endpoints() ([]datapath.Endpoint, error) { return agenttest.Values(&f.mu, f.eps), nil }
func (f *fakeDP) UpsertPort(p datapath.Port) error        { return f.w(func() { f.ports[p.IfIndex] = p }) }
func (f *fakeDP) DeletePort(i uint32) error               { return f.w(func() { delete(f.ports, i) }) }
func (f *fakeDP) Ports() ([]datapath.Port, error)         { return agenttest.Values(&f.mu, f.ports), nil }

// fakeNode is an in-memory Kernel.
type fakeNode struct {
	mu    sync.Mutex
	mtu   int
	pods  map[string]podnet.Spec
	links map[string]podnet.Link
	next  int
}

func (n *fakeNode) UnderlayMTU() (int, error) {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.mtu, nil
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

func (n *fakeNode) PodNetNSCookie(string) (uint64, error) { return 2, nil }
func (n *fakeNode) SetupPod(s podnet.Spec) (podnet.Result, error) {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.pods[s.HostIf] = s
	if l, ok := n.links[s.HostIf]; ok {
		if s.L2 {
			return podnet.Result{HostIfIndex: l.Index, HostMAC: s.HostMAC, PodMAC: s.PodMAC}, nil
		}
		return podnet.Result{HostIfIndex: l.Index, HostMAC: l.MAC, PodMAC: net.HardwareAddr{2, 0, 0, 0, 1, byte(l.Index - 100)}}, nil
	}
	n.next++
	hm, pm := net.HardwareAddr{2, 0, 0, 0, 0, byte(n.next)}, net.HardwareAddr{2, 0, 0, 0, 1, byte(n.next)}
	if s.L2 {
		hm, pm = s.HostMAC, s.PodMAC // an l2 port's MACs are given (podnet sets them)
	}
	n.links[s.HostIf] = podnet.Link{Name: s.HostIf, Index: 100 + n.next, MAC: hm}
	return podnet.Result{HostIfIndex: 100 + n.next, HostMAC: hm, PodMAC: pm}, nil
}
func (n *fakeNode) TeardownPod(hostIf string, _ []netip.Addr) error {
	n.mu.Lock()
	defer n.mu.Unlock()
	delete(n.pods, hostIf)
	delete(n.links, hostIf)
	return nil
}

// fakeSync is the node's sync as the server sees it: a fixed desired
// state, and an applier whose sync writes the pods' entries only.
type fakeSync struct {
	mu       sync.Mutex
	state    model.NodeState
	own      []netip.Addr
	applied  bool
	attached bool
	applier  *applier.Applier
	// refreshes counts Refresh calls.
	refreshes int
}

func (f *fakeSync) State() model.NodeState {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.state
}
func (f *fakeSync) Refresh(context.Context) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.refreshes++
	return nil
}
func (f *fakeSync) OwnAddrs() []netip.Addr {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]netip.Addr(nil), f.own...)
}
func (f *fakeSync) Applied() bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.applied
}
func (f *fakeSync) Attached() bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.attached
}
func (f *fakeSync) SyncPods(ctx context.Context) error { return f.applier.SyncPart(ctx) }

// fakeHealth is a node that can carry pod traffic unless problem is set.
type fakeHealth struct {
	mu              sync.Mutex
	problem, detail string
	kicks           int
}

func (f *fakeHealth) Problem() (string, string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.problem, f.detail
}
func (f *fakeHealth) Kick() {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.kicks++
}

// testAgent is a CNI server on node n1 with fakes for the kernel and the
// node's sync, and a fake API holding the default network (block
// 10.244.0.0/29 on n1, so five pod addresses) and a catch-all binding
// policy.
type testAgent struct {
	*Server
	dp     *fakeDP
	node   *fakeNode
	sync   *fakeSync
	health *fakeHealth
	c      client.Client
	rec    *record.FakeRecorder
}

func newTestAgent(t *testing.T, blockBits int32, objs ...client.Object) *testAgent {
	t.Helper()
	a, err := newTestAgentIn(t.Context(), t.TempDir(), blockBits, objs...)
	if err != nil {
		t.Fatal(err)
	}
	return a
}

// newTestAgentIn is newTestAgent keeping its state in dir, with its
// applier running until ctx ends (a fuzz target keeps one agent over
// many inputs, beyond any one test's life).
func newTestAgentIn(ctx context.Context, dir string, blockBits int32, objs ...client.Object) (*testAgent, error) {
	w := agenttest.DefaultNetwork("n1", blockBits)
	// The API server selects pods by node; the fake needs an index for it.
	c := fake.NewClientBuilder().WithScheme(scheme.Scheme).WithObjects(append(w.Objects, objs...)...).WithStatusSubresource(&corev1.Pod{}, &lacev1.NetworkEndpoint{}).
		WithIndex(&corev1.Pod{}, "spec.nodeName", func(o client.Object) []string { return []string{o.(*corev1.Pod).Spec.NodeName} }).Build()
	rec := record.NewFakeRecorder(100)
	dp := newFakeDP()
	node := &fakeNode{pods: map[string]podnet.Spec{}, links: map[string]podnet.Link{}, mtu: 1500}
	s, err := New(Options{NodeName: "n1", NetNS: "/fake", UnderlayInterface: "eth0", DelQueueDir: filepath.Join(dir, "del-queue")},
		filepath.Join(dir, "state"), slog.New(slog.NewTextHandler(io.Discard, nil)), c, c, rec, dp, node)
	if err != nil {
		return nil, err
	}
	fs := &fakeSync{state: w.State("n1"),
		own: []netip.Addr{netip.MustParseAddr("fd00:30::11")}}
	// The goroutine runs this applier, not fs.applier, which a test may
	// replace (a race).
	ap := applier.New(s.SyncEntries, nil, 0)
	fs.applier = ap
	go func() { _ = ap.Run(ctx) }()
	h := &fakeHealth{}
	s.Wire(fs, h)
	return &testAgent{Server: s, dp: dp, node: node, sync: fs, health: h, c: c, rec: rec}, nil
}

func pod(name string) *corev1.Pod {
	return &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: name, UID: types.UID("uid-" + name)},
		Spec: corev1.PodSpec{NodeName: "n1"}}
}

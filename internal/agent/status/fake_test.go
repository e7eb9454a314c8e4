package status

import (
	"fmt"
	"io"
	"log/slog"
	"net/netip"
	"sync"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/record"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"

	lacev1 "github.com/lace-cni/lace/api/v1alpha1"
	"github.com/lace-cni/lace/internal/model"
	"github.com/lace-cni/lace/pkg/scheme"
)

// fakeDP serves map sizes (none).
type fakeDP struct{}

func (fakeDP) MapSizes() (map[string]int, error) { return map[string]int{}, nil }

// fakeNode is an in-memory Kernel.
type fakeNode struct {
	mu    sync.Mutex
	addrs []netip.Addr
	// unreachable are underlay addresses the node has no route to.
	unreachable map[netip.Addr]bool
}

func (n *fakeNode) UnderlayAddrs() ([]netip.Addr, error) {
	n.mu.Lock()
	defer n.mu.Unlock()
	return append([]netip.Addr(nil), n.addrs...), nil
}

func (n *fakeNode) Reachable(dst netip.Addr) error {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.unreachable[dst] {
		return fmt.Errorf("no route to %s", dst)
	}
	return nil
}

// fakeSync is the node's sync as the reporter reads it.
type fakeSync struct {
	mu        sync.Mutex
	attachErr error
	state     model.NodeState
}

func (f *fakeSync) AttachErr() error {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.attachErr
}

func (f *fakeSync) State() model.NodeState {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.state
}

// testReporter is the reporter of node n1 with fakes for the kernel and
// the sync, and a fake API holding its UnderlayEndpoint (status a
// subresource, as on the API server) and Node.
type testReporter struct {
	*Reporter
	node      *fakeNode
	sync      *fakeSync
	c         client.Client
	rec       *record.FakeRecorder
	endpoints int
}

func newTestReporter(t *testing.T) *testReporter {
	t.Helper()
	c := fake.NewClientBuilder().WithScheme(scheme.Scheme).WithStatusSubresource(&lacev1.UnderlayEndpoint{}).
		WithObjects(&lacev1.UnderlayEndpoint{ObjectMeta: metav1.ObjectMeta{Name: "n1"}},
			&corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n1", UID: "node-uid"}}).Build()
	tr := &testReporter{node: &fakeNode{addrs: []netip.Addr{netip.MustParseAddr("fd00:30::11")}, unreachable: map[netip.Addr]bool{}},
		sync: &fakeSync{}, c: c, rec: record.NewFakeRecorder(100)}
	tr.Reporter = New(Options{NodeName: "n1", UnderlayInterface: "eth0"}, slog.New(slog.NewTextHandler(io.Discard, nil)), c, tr.rec,
		fakeDP{}, tr.node, tr.sync, func() int { return tr.endpoints })
	return tr
}

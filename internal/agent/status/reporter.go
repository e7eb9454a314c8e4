package status

import (
	"log/slog"
	"net/netip"
	"sync"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/record"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/lace-cni/lace/internal/model"
)

// Maps is what the reporter reads of the eBPF data plane: its maps'
// sizes. *datapath.Datapath implements it; tests use a fake.
type Maps interface {
	MapSizes() (map[string]int, error)
}

// Kernel is what the reporter reads of the node's namespace.
type Kernel interface {
	// UnderlayAddrs are the global addresses of the underlay interface.
	UnderlayAddrs() ([]netip.Addr, error)
	// Reachable says whether the node routes to dst out of the underlay
	// interface (nil) or why not.
	Reachable(dst netip.Addr) error
}

// Sync is what the reporter reads of the node's sync (nodesync.Syncer).
type Sync interface {
	// AttachErr is why the data plane could not be attached (nil once
	// it is).
	AttachErr() error
	// State is the node's desired state (its locator routes).
	State() model.NodeState
}

// Options configure the reporter.
type Options struct {
	NodeName          string
	UnderlayInterface string
}

// Reporter tells the cluster whether the node can carry pod traffic: the
// UnderlayEndpoint's data plane summary and Ready condition, Events on the
// Node, and the health CNI STATUS reports.
type Reporter struct {
	opts     Options
	log      *slog.Logger
	client   client.Client
	recorder record.EventRecorder
	dp       Maps
	node     Kernel
	sync     Sync
	// endpoints counts the node's pod attachments.
	endpoints func() int
	// statusKick asks Run for an early report.
	statusKick chan struct{}

	mu sync.Mutex
	// reported is the Ready condition last published, so an Event is
	// emitted once per transition even while the cache lags.
	reported *metav1.Condition
}

// New makes a reporter.
func New(o Options, log *slog.Logger, c client.Client, rec record.EventRecorder, dp Maps, node Kernel, s Sync,
	endpoints func() int) *Reporter {
	return &Reporter{opts: o, log: log, client: c, recorder: rec, dp: dp, node: node, sync: s, endpoints: endpoints,
		statusKick: make(chan struct{}, 1)}
}

// Problem is the node's health now: reason is empty when it can carry pod
// traffic.
func (r *Reporter) Problem() (reason, message string) {
	h := r.checkHealth()
	return h.reason, h.message
}

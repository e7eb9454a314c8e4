package nodesync

import (
	"context"
	"log/slog"
	"net/netip"
	"sync"
	"sync/atomic"
	"time"

	"k8s.io/client-go/tools/record"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	lacev1 "github.com/lace-cni/lace/api/v1alpha1"
	"github.com/lace-cni/lace/internal/agent/applier"
	"github.com/lace-cni/lace/internal/datapath"
	"github.com/lace-cni/lace/internal/model"
)

// DataPlane is what the node's sync needs of the eBPF data plane: the
// attachment of its programs and the node's tables. The pods' entries are
// the CNI server's (Pods.SyncEntries). *datapath.Datapath implements it
// (through WithServiceTable); tests use a fake.
type DataPlane interface {
	Attachment
	NodeTables
	RouteTable
	Services
}

// Attachment attaches the programs to the underlay and the node's
// sockets, and holds their configuration.
type Attachment interface {
	AttachUnderlay(nsPath, ifName string) error
	AttachHostSockets(cgroupPath string) error
	SetConfig(datapath.Config) error
	Config() (datapath.Config, error)
}

// NodeTables are the node's tables synced at each apply against what was
// written to them (datapath's table reconciler, no kernel read-back):
// the other nodes, their locators, the networks, the classifiers, the
// inside prefixes and the node's own addresses.
type NodeTables interface {
	UpsertNode(netip.Addr) error
	DeleteNode(netip.Addr) error
	Nodes() ([]netip.Addr, error)
	UpsertNodeLocator(datapath.NodeLocator) error
	DeleteNodeLocator(netip.Addr) error
	NodeLocators() ([]datapath.NodeLocator, error)
	UpsertNetwork(datapath.Network) error
	DeleteNetwork(id uint32) error
	Networks() ([]datapath.Network, error)
	UpsertClassifier(datapath.Classifier) error
	DeleteClassifier(p netip.Prefix) error
	Classifiers() ([]datapath.Classifier, error)
	UpsertInside(datapath.Inside) error
	DeleteInside(p netip.Prefix) error
	Insides() ([]datapath.Inside, error)
	UpsertHostAddr(netip.Addr) error
	DeleteHostAddr(netip.Addr) error
	HostAddrs() ([]netip.Addr, error)
	// The Sync methods make a table exactly the desired entries, judged
	// against what was written to it (no kernel read-back).
	SyncHostAddrs([]netip.Addr) error
	SyncNodes([]netip.Addr) error
	SyncNodeLocators([]datapath.NodeLocator) error
	SyncNetworks([]datapath.Network) error
	SyncClassifiers([]datapath.Classifier) error
	SyncInsides([]datapath.Inside) error
	// SyncL2Cluster makes the cluster's part of the l2 tables: the
	// networks' neighbours, the MACs on other nodes and the nodes their
	// flooded frames go to (the pods' own part is the CNI server's).
	SyncL2Cluster([]datapath.L2Neighbor, []datapath.FDBEntry, []datapath.L2FloodNode) error
}

// RouteTable is the views map, synced against what was written to it
// (datapath's table reconciler: read back once after a start, then
// diffed in memory).
type RouteTable interface {
	SyncRoutes([]datapath.Route) error
}

// Services are the node's service frontends and backends (a
// datapath.ServiceTable, which keeps what it wrote) and the flows to
// endpoints that left.
type Services interface {
	// ApplyServices makes the services want; changes say which of them
	// may differ from earlier ones (model.ServiceChanges).
	ApplyServices(want []datapath.Service, changes model.ServiceChanges) (datapath.Gone, error)
	FlushServiceFlows(datapath.Gone) (int, error)
}

// Kernel is what the sync changes and reads in the node's namespace
// besides the eBPF maps: the underlay, forwarding, and the underlay
// routes to other nodes' locators.
type Kernel interface {
	// UnderlayAddrs are the global addresses of the underlay interface.
	UnderlayAddrs() ([]netip.Addr, error)
	UnderlayIndex() (int, error)
	EnableForwarding() error
	// NetNSCookie is the node network namespace's cookie.
	NetNSCookie() (uint64, error)
	OwnedRoutes() (map[netip.Prefix]netip.Addr, error)
	ReplaceOwnedRoute(dst netip.Prefix, via netip.Addr) error
	DeleteRoute(dst netip.Prefix) error
	// KeepResolved keeps the next hops of those routes resolved (managed
	// neighbours), and only those of Lace's.
	KeepResolved(hops []netip.Addr) error
}

// Pods is what the sync needs of the pod attachments (cni.Server): their
// entries in the data plane, and the steps of a reconcile that make the
// checkpoint true to the kernel and the API.
type Pods interface {
	// SyncEntries makes the pods' entries follow their records.
	SyncEntries() error
	// SetL2Learning tells which l2 networks learn and which learned MACs
	// live at this node's ports (model.NodeState), for SyncEntries.
	SetL2Learning(learning []uint32, learned []model.L2Learned)
	DropStaleEndpoints(ctx context.Context) error
	AdoptOnce(ctx context.Context, st model.NodeState, nets []lacev1.Network) error
	CollectEndpoints(ctx context.Context) error
	EnsureNetworkEndpoints(ctx context.Context) error
	// EachAttachment calls fn with every Ready attachment that names a
	// pod (hostPorts are served at its addresses).
	EachAttachment(fn func(podUID string, netID uint32, addrs []netip.Addr))
}

// HealthPorts serves the healthCheckNodePorts of the node's services
// (status.HealthChecks).
type HealthPorts interface {
	Sync([]model.HealthCheck) error
}

// Options configure the node's sync.
type Options struct {
	NodeName string
	// NetNS is the path of the node's network namespace.
	NetNS             string
	UnderlayInterface string
	// HostCgroup is where the node's socket hooks attach (empty: none).
	HostCgroup string
	// AllowedExternalIPs are the only addresses Services' externalIPs
	// may name.
	AllowedExternalIPs []netip.Prefix
	// MetricsAddr and HealthAddr are the agent's own ports, which no
	// hostPort may take.
	MetricsAddr, HealthAddr string
	// LocalReservedPorts is the node's ip_local_reserved_ports file
	// (empty: left alone); StateDir keeps its baseline.
	LocalReservedPorts, StateDir string
	// ServiceFrontends, ServiceBackends, NamespaceFrontends and
	// NamespaceBackends bound what Services take of the maps (see
	// agent.Options).
	ServiceFrontends, ServiceBackends     int
	NamespaceFrontends, NamespaceBackends int
}

// Syncer keeps the node's data plane, its underlay routes and its
// UnderlayEndpoint equal to the desired state computed from the API. It
// owns that state, the caches its computation keeps, the mirrors of what
// it wrote, and the applier: the one writer of the data plane.
type Syncer struct {
	opts     Options
	log      *slog.Logger
	client   client.Client
	recorder record.EventRecorder
	// cache is the manager's cache, whose informers' stores are listed
	// without copies (nil in tests: the client lists); hostPods caches
	// the cluster's hostNetwork pods (nil in tests).
	cache    cache.Cache
	hostPods client.Reader
	dp       DataPlane
	node     Kernel
	pods     Pods
	health   HealthPorts
	// kick asks for an early status report.
	kick func()

	// hostNetNS is the cookie of the node's network namespace (0 until
	// host sockets are attached).
	hostNetNS uint64
	// nePending are the NetworkEndpoint changes the services'
	// computation has not seen yet.
	nePending nePending
	// mirror has the Services and EndpointSlices, and which changed.
	mirror   svcMirror
	hostPort hostPortState
	// staleChecked is when a reconcile last looked for endpoints whose
	// interface is gone (Unix nanoseconds): the controller's, a CNI ADD's
	// and the resync's reconciles may run at once.
	staleChecked atomic.Int64

	// applier is the one writer of the data plane.
	applier *applier.Applier
	// flushPace spaces the conntrack walks of FlushServiceFlows.
	flushPace flushPacer

	// computeMu serialises computations of the desired state (the
	// reconciler's, the periodic resync's, a CNI ADD waiting for blocks),
	// which share compute.
	computeMu sync.Mutex
	compute   computeCache

	mu sync.Mutex
	// state is the node's desired state; haveState once computed.
	state     model.NodeState
	haveState bool
	// applyErr is why the last sync could not apply the node's state
	// (nil when it could); the reconciler retries on it.
	applyErr error
	applied  bool
	ownAddrs []netip.Addr
	// attachErr is why the data plane could not be attached to the
	// underlay (nil once it is).
	attachErr error
}

// staleCheckPeriod is how often a reconcile looks for pods' endpoints
// whose host interface is gone.
const staleCheckPeriod = 5 * time.Second

// hostPortState is what the hostPorts keep between syncs.
type hostPortState struct {
	mu sync.Mutex
	// reported are the hostPort refusals already made Events of.
	reported map[model.HostPortRefusal]bool
	// max is the node's share of the service maps for hostPorts.
	max int
	// local keeps served hostPorts and the SNAT range out of the node's
	// ephemeral ports; localErr is its last failure, logged once.
	local    *localPorts
	localErr string
}

// Capacity is the size of the service maps (datapath.MapCapacity) and
// what the agent before this one programmed (datapath.ProgrammedFrontends).
type Capacity struct {
	Services, Backends, SourceRanges int
	Programmed                       map[datapath.ServiceKey]datapath.ProgrammedFrontend
}

// New makes the node's sync. Wire gives it the pods and health ports;
// Run (the applier) must run for its syncs to happen.
func New(o Options, log *slog.Logger, c client.Client, rec record.EventRecorder, ca cache.Cache, hostPods client.Reader,
	dp DataPlane, node Kernel, capacity Capacity) *Syncer {
	s := &Syncer{opts: o, log: log, client: c, recorder: rec, cache: ca, hostPods: hostPods, dp: dp, node: node}
	s.hostPort.local = newLocalPorts(o.LocalReservedPorts, o.StateDir)
	svcMax, beMax, rangeMax := capacity.Services, capacity.Backends, capacity.SourceRanges
	// hostPorts have their own share of the service maps (an entry and
	// two backends each: the pod and its reference), out of the Services'.
	s.hostPort.max = max(min(model.MaxHostPortEntries, svcMax/8, beMax/16), 1)
	svcMax, beMax = svcMax-s.hostPort.max, beMax-2*s.hostPort.max
	// What the agent before this one admitted stays admitted, what it
	// refused stays refused: a restart changes no verdict.
	s.compute.services.programmed = capacity.Programmed
	s.compute.services.mirror = &s.mirror
	s.compute.services.watched = &s.nePending.watched
	s.nePending.node = o.NodeName
	s.compute.services.inPlace = true
	s.compute.services.budget = model.Budget{ServiceFrontends: o.ServiceFrontends, ServiceBackends: o.ServiceBackends,
		// loadBalancerSourceRanges have no bound in Kubernetes: one
		// Service may take a sixteenth of lace_src_ranges.
		ServiceSourceRanges: max(rangeMax/16, 1),
		NamespaceFrontends:  share(o.NamespaceFrontends, svcMax), NamespaceBackends: share(o.NamespaceBackends, beMax),
		NamespaceSourceRanges: share(0, rangeMax),
		TotalFrontends:        svcMax, TotalBackends: beMax, TotalSourceRanges: rangeMax}
	s.applier = applier.New(s.syncDataplane, s.syncPods, 0)
	return s
}

// Wire gives the sync the pods it programs, the health ports it serves
// and how to ask for an early status report.
func (s *Syncer) Wire(p Pods, h HealthPorts, kick func()) { s.pods, s.health, s.kick = p, h, kick }

// Run runs the applier until ctx ends.
func (s *Syncer) Run(ctx context.Context) error {
	defer s.flushPace.stop()
	return s.applier.Run(ctx)
}

// SyncPods asks the applier for a sync of the pods' entries and waits
// for it.
func (s *Syncer) SyncPods(ctx context.Context) error { return s.applier.SyncPart(ctx) }

// Refresh reconciles the node now. Unlike the controller's Reconcile, it
// fails while the informers' handlers have not seen everything yet
// (errNotSynced): its callers (a CNI ADD waiting for blocks, the periodic
// resync) must not take that for a computation.
func (s *Syncer) Refresh(ctx context.Context) error {
	res, err := s.Reconcile(ctx, reconcile.Request{})
	if err == nil && res.RequeueAfter > 0 {
		return errNotSynced
	}
	return err
}

// State is the node's desired state as last computed.
func (s *Syncer) State() model.NodeState {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.state
}

// OwnAddrs are the node's underlay addresses as last read.
func (s *Syncer) OwnAddrs() []netip.Addr {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]netip.Addr(nil), s.ownAddrs...)
}

// Applied says whether the node's state has been applied once.
func (s *Syncer) Applied() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.applied
}

// Attached says whether the data plane is programmed and attached.
func (s *Syncer) Attached() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.applied && s.attachErr == nil
}

// AttachErr is why the data plane could not be attached to the underlay
// (nil once it is).
func (s *Syncer) AttachErr() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.attachErr
}

func (s *Syncer) kickStatus() {
	if s.kick != nil {
		s.kick()
	}
}

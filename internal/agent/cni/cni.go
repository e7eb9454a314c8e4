package cni

import (
	"context"
	"log/slog"
	"net"
	"net/netip"
	"sync"

	"k8s.io/client-go/tools/record"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/lace-cni/lace/internal/datapath"
	"github.com/lace-cni/lace/internal/model"
	"github.com/lace-cni/lace/internal/podnet"
)

// Tables is what the server needs of the node's eBPF data plane: the
// pods' entries (endpoints and ports) and their programs.
// *datapath.Datapath implements it; tests use a fake.
type Tables interface {
	AttachPod(nsPath, hostIf string, l2 bool) error
	DetachPod(hostIf string) error
	PinnedPodLinks() ([]string, error)
	UpsertEndpoint(datapath.Endpoint) error
	DeleteEndpoint(netID uint32, a netip.Addr) error
	Endpoints() ([]datapath.Endpoint, error)
	UpsertPort(datapath.Port) error
	DeletePort(ifindex uint32) error
	Ports() ([]datapath.Port, error)
	// SyncEndpoints and SyncPorts make the pods' entries want, never
	// removing one busy says an ADD in progress owns.
	SyncEndpoints(want []datapath.Endpoint, busy func(netID uint32, a netip.Addr) bool) error
	SyncPorts(want []datapath.Port, busy func(ifindex uint32) bool) error
	// ForgetRemovedFlows forgets the flows of the pod addresses
	// SyncEndpoints removed, once their ports and programs are gone.
	ForgetRemovedFlows() error
	// SyncL2 makes the l2 networks' neighbour tables and forwarding
	// databases exactly neigh and fdb.
	SyncL2Local(neigh []datapath.L2Neighbor, fdb []datapath.FDBEntry) error
	// L2Activated are the MACs that moved to a standby port here and
	// still live there (migrate.go).
	L2Activated() ([]datapath.L2Learned, error)
	// L2Standby tells whether a MAC stands by at a port here, not moved
	// there yet (its entry's sequence); ActivateStandby moves it there.
	L2Standby(netID uint32, mac net.HardwareAddr, ifindex uint32) (uint32, bool, error)
	ActivateStandby(netID uint32, mac net.HardwareAddr, seq uint32) error
}

// Kernel is what the server changes in the node's namespace: pod
// interfaces, and what it reads there (the underlay's MTU, the host-side
// interfaces, a pod namespace's cookie).
type Kernel interface {
	// UnderlayMTU is the MTU of the underlay interface now.
	UnderlayMTU() (int, error)
	// PodNetNSCookie is the cookie of a pod's network namespace.
	PodNetNSCookie(nsPath string) (uint64, error)
	SetupPod(podnet.Spec) (podnet.Result, error)
	TeardownPod(hostIf string, addrs []netip.Addr) error
	// HostLinks are the pod host-side interfaces on the node, by name.
	HostLinks() (map[string]podnet.Link, error)
}

// Node is what the server needs of the node's sync (nodesync.Syncer).
type Node interface {
	// State is the node's desired state as last computed (its blocks).
	State() model.NodeState
	// Refresh computes the node's state again now (a CNI ADD waiting for
	// its network's block).
	Refresh(ctx context.Context) error
	// OwnAddrs are the node's underlay addresses, which no pod is given.
	OwnAddrs() []netip.Addr
	// Applied says whether the data plane has been programmed once;
	// Attached, programmed and attached without error.
	Applied() bool
	Attached() bool
	// SyncPods asks the applier for a sync of the pods' entries and
	// waits for it.
	SyncPods(ctx context.Context) error
}

// Health is what CNI STATUS reports of the node beside its readiness
// (status.Reporter): reason is empty when the node can carry pod traffic.
type Health interface {
	Problem() (reason, message string)
	// Kick asks for an early status report (the node's endpoints changed).
	Kick()
}

// Options configure the server: agent.Options' fields of the same names.
type Options struct {
	NodeName, NetNS, UnderlayInterface, HostCgroup, CNISocket, DelQueueDir string
	MTU                                                                    int
}

// Server serves lace-cni's requests and owns the pod attachments on the
// node: their checkpoint, their addresses, their interfaces, their
// entries in the data plane and their NetworkEndpoints.
type Server struct {
	opts     Options
	log      *slog.Logger
	client   client.Client
	reader   client.Reader
	recorder record.EventRecorder
	dp       Tables
	node     Kernel
	cp       *checkpoint
	sync     Node
	health   Health

	// addLock serialises address allocation, and adoption of what the
	// kernel holds (adopted, once per start) with it.
	addLock sync.Mutex
	adopted bool
	// podsReattached: this agent's first sync has attached every pod's
	// programs again. Until then each sync does: a pod's programs may
	// use maps a Load replaced (another layout), by this start or by an
	// earlier one that died before re-attaching, and nothing pinned
	// tells which (attaching replaces the classic tc filters in place,
	// so doing it once per start is cheap).
	mu             sync.Mutex
	podsReattached bool
	// learn is the l2 learning state (learn.go).
	learn learnState
}

// New loads the checkpoint in stateDir and makes a server; Wire gives it
// the node's sync and health before it serves.
func New(o Options, stateDir string, log *slog.Logger, c client.Client, reader client.Reader, rec record.EventRecorder,
	dp Tables, node Kernel) (*Server, error) {
	cp, err := loadCheckpoint(stateDir)
	if err != nil {
		return nil, err
	}
	return &Server{opts: o, log: log, client: c, reader: reader, recorder: rec, dp: dp, node: node, cp: cp}, nil
}

// Wire gives the server what it needs of the node's sync and health.
func (s *Server) Wire(n Node, h Health) { s.sync, s.health = n, h }

// Count is the number of pod attachments on the node.
func (s *Server) Count() int { return len(s.cp.all()) }

// CheckpointLost says whether no usable checkpoint was found at start.
func (s *Server) CheckpointLost() bool { return s.cp.lost }

// EachLocal calls fn with every pod attachment's pod and host-side port:
// the subjects of the node's network policies. An attachment still being
// made is one: its port may already carry the pod's packets.
func (s *Server) EachLocal(fn func(namespace, name string, ifindex uint32)) {
	for _, e := range s.cp.all() {
		if !e.Deleting && e.PodName != "" && e.HostIfIndex > 0 {
			fn(e.PodNS, e.PodName, uint32(e.HostIfIndex))
		}
	}
}

// EachAttachment calls fn with every Ready attachment that names a pod.
func (s *Server) EachAttachment(fn func(podUID string, netID uint32, addrs []netip.Addr)) {
	for _, e := range s.cp.all() {
		if e.Ready && !e.Deleting && e.PodUID != "" {
			fn(e.PodUID, e.NetID, e.Addrs)
		}
	}
}

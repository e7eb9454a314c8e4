// Package agent is lace-agent: everything Lace does on one node. It only
// wires the parts that own the node's state, each a package of its own:
//
//   - cni: the CNI server lace-cni talks to, IPAM, the checkpoint of the
//     pod attachments, their entries in the data plane, recovery;
//   - nodesync: the node's desired state computed by internal/model from
//     the API, applied to the data plane and the underlay routes by the
//     applier (the one writer), and the published UnderlayEndpoint;
//   - announce: the L2 announcements of LoadBalancer VIPs;
//   - status: the node's health, its UnderlayEndpoint status, metrics and
//     the healthCheckNodePorts.
//
// Each part sees the data plane, the node's namespace and the others
// through narrow interfaces of its own. Kernel work goes through
// internal/netutil, internal/podnet and internal/datapath only.
package agent

import (
	"cmp"
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/pprof"
	"net/netip"
	"os"
	"runtime/debug"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	toolscache "k8s.io/client-go/tools/cache"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/healthz"
	"sigs.k8s.io/controller-runtime/pkg/manager"
	"sigs.k8s.io/controller-runtime/pkg/metrics"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	lacev1 "github.com/lace-cni/lace/api/v1alpha1"
	"github.com/lace-cni/lace/internal/agent/announce"
	"github.com/lace-cni/lace/internal/agent/cni"
	"github.com/lace-cni/lace/internal/agent/flows"
	"github.com/lace-cni/lace/internal/agent/nodesync"
	"github.com/lace-cni/lace/internal/agent/policy"
	"github.com/lace-cni/lace/internal/agent/status"
	"github.com/lace-cni/lace/internal/datapath"
	"github.com/lace-cni/lace/internal/dpmetrics"
	"github.com/lace-cni/lace/internal/model"
	"github.com/lace-cni/lace/internal/netpolapi"
	"github.com/lace-cni/lace/internal/netutil"
	"github.com/lace-cni/lace/pkg/cniapi"
	"github.com/lace-cni/lace/pkg/scheme"
)

// Options configure lace-agent.
type Options struct {
	NodeName string
	// NetNS is the path of the node's network namespace (the agent's own
	// by default; the lab points it at a node namespace).
	NetNS string
	// UnderlayInterface carries SRv6 traffic to the other nodes.
	UnderlayInterface string
	// HostCgroup is the cgroup v2 directory holding the node's processes
	// (and its pods): connect-time service translation for the node's own
	// sockets is attached there. Empty: node processes do not reach
	// ClusterIPs.
	HostCgroup string
	CNISocket  string
	// BPFFS is the directory (on bpffs) where maps and links are pinned.
	BPFFS string
	// StateDir keeps the endpoint checkpoint.
	StateDir string
	// DelQueueDir is where lace-cni queues DELs the agent could not be
	// reached for (the same directory as lace-cni's, on the node).
	DelQueueDir string
	// MTU of pod interfaces; 0 derives it at each ADD from the underlay
	// interface's MTU less the 40-byte outer header.
	MTU         int
	MetricsAddr string
	HealthAddr  string
	// ResyncPeriod bounds how long a missed event can leave state stale.
	ResyncPeriod time.Duration
	// LeaseNamespace holds the agents' heartbeat Leases, from which every
	// agent sees which others are alive (L2 announcement);
	// AnnounceLeaseDuration is how long a silent agent counts as alive,
	// the bound on a VIP's failover.
	LeaseNamespace        string
	AnnounceLeaseDuration time.Duration
	// AnnounceRestartGrace is how long the others wait for this agent's
	// successor before taking its VIPs when it stops (not on a cordoned
	// node); 0 makes a stop a failover.
	AnnounceRestartGrace time.Duration
	// AllowedExternalIPs are the only addresses Services' externalIPs
	// may name (the operator's allow-list; empty refuses them all). The
	// controller is given the same list and reports what is refused.
	AllowedExternalIPs []netip.Prefix
	// SkipNameValidation allows several agents in one process (tests).
	SkipNameValidation bool
	// MapSizes are the sizes of the service and conntrack maps (the
	// chart's values; zero keeps the compiled size).
	MapSizes datapath.MapSizes
	// ServiceFrontends and ServiceBackends bound what one Service may
	// take of lace_services and lace_backends on a node (0: no bound but
	// the maps' sizes). A Service over them is refused whole.
	ServiceFrontends, ServiceBackends int
	// NamespaceFrontends and NamespaceBackends bound the Services of one
	// namespace together (its share of the maps, judged before the maps'
	// sizes so one tenant cannot push another's Services out). 0: a
	// quarter of the map; negative: no share.
	NamespaceFrontends, NamespaceBackends int
	// LocalReservedPorts is the node's net.ipv4.ip_local_reserved_ports
	// file, where the agent reserves the hostPorts it serves and the SNAT
	// range from the node's ephemeral ports (localports.go); empty leaves
	// it alone.
	LocalReservedPorts string
	// Pprof serves net/http/pprof under /debug/pprof/ on the metrics
	// address, to profile an agent in place. Off by default; the
	// LACE_AGENT_PPROF environment variable turns it on.
	Pprof bool
}

// DefaultOptions are the flag defaults of lace-agent.
func DefaultOptions() Options {
	return Options{
		NetNS:              "/proc/self/ns/net",
		UnderlayInterface:  "eth0",
		CNISocket:          cniapi.DefaultSocket,
		BPFFS:              "/sys/fs/bpf/lace",
		StateDir:           "/var/lib/lace",
		DelQueueDir:        cniapi.DefaultDelQueueDir,
		MetricsAddr:        "0",
		HealthAddr:         "0",
		ResyncPeriod:       30 * time.Second,
		LocalReservedPorts: "/proc/sys/net/ipv4/ip_local_reserved_ports",
		Pprof:              os.Getenv("LACE_AGENT_PPROF") != "",
	}
}

// Agent is a running lace-agent: it only wires the parts that own the
// node's state (the CNI server, the node's sync, the L2 announcer, the
// status reporter) and starts them.
type Agent struct {
	opts Options
	log  *slog.Logger
	mgr  manager.Manager
	dp   *datapath.Datapath

	pods *cni.Server
	sync *nodesync.Syncer
	// routes is the node's owned routes' listing, which each periodic
	// resync takes again from the kernel.
	routes *netutil.OwnedRouteCache
	status *status.Reporter
	health *status.HealthChecks
}

// AgentLeaseName is the heartbeat Lease of node's agent.
func AgentLeaseName(node string) string { return announce.LeaseName(node) }

// The data plane and the node's namespace serve every part's narrow view.
var (
	_ cni.Tables         = (*datapath.Datapath)(nil)
	_ announce.DataPlane = (*datapath.Datapath)(nil)
	_ status.Counters    = (*datapath.Datapath)(nil)
	_ cni.Kernel         = linuxNode{}
	_ nodesync.Kernel    = linuxNode{}
	_ status.Kernel      = linuxNode{}
)

// New builds an agent: it loads the data plane (keeping pinned state) and
// the checkpoint, and wires the watches. Run starts it.
func New(cfg *rest.Config, o Options, log *slog.Logger) (*Agent, error) {
	if o.NodeName == "" {
		return nil, fmt.Errorf("--node-name is required")
	}
	if err := netutil.EnsureBPFFS(o.BPFFS); err != nil {
		return nil, err
	}
	dp, err := datapath.LoadWith(o.BPFFS, datapath.LoadOptions{Sizes: o.MapSizes, Migrate: true, Log: log})
	if err != nil {
		return nil, err
	}
	a, err := wire(cfg, o, log, dp)
	if err != nil {
		dp.Close()
		return nil, err
	}
	return a, nil
}

// wire makes the agent's parts on dp and adds them to a new manager.
func wire(cfg *rest.Config, o Options, log *slog.Logger, dp *datapath.Datapath) (*Agent, error) {
	// The flow log names what it serves through the policy enforcer's
	// caches (made below, before anything serves).
	var pol *policy.Enforcer
	var a *Agent
	flowLog := flows.New(o.NodeName, dp, func(ctx context.Context) (flows.Names, error) {
		return flowNames(ctx, a.mgr.GetCache(), a.pods, pol)
	}, log)
	handlers := pprofHandlers(o.Pprof)
	if handlers == nil {
		handlers = map[string]http.Handler{}
	}
	handlers["/flows"] = flowLog.Handler()
	mgr, err := ctrl.NewManager(cfg, ctrl.Options{
		Scheme:                 scheme.Scheme,
		Metrics:                metricsserver.Options{BindAddress: o.MetricsAddr, ExtraHandlers: handlers},
		HealthProbeBindAddress: o.HealthAddr,
		Cache: nodesync.TrimCache(cache.Options{ByObject: map[client.Object]cache.ByObject{
			&corev1.Pod{}: {Field: fields.OneTermEqualSelector("spec.nodeName", o.NodeName)},
			// The agents' heartbeats only.
			&coordinationv1.Lease{}: {Namespaces: map[string]cache.Config{o.LeaseNamespace: {}},
				Label: labels.SelectorFromSet(labels.Set{lacev1.LabelAgentLease: "true"})},
			// Every NetworkEndpoint: services resolve their endpoints'
			// networks from them (this node's own records are read by
			// name, or listed by label from the API).
		}}),
		Controller: ctrlConfig(o),
	})
	if err != nil {
		return nil, fmt.Errorf("create manager: %w", err)
	}
	// The cluster's hostNetwork pods (a few per node), apart from the
	// node's own pods: an endpoint at a node's address is served only
	// when it names one of them on that node (model.HostEndpoints).
	hostPods, err := cache.New(cfg, cache.Options{Scheme: scheme.Scheme, HTTPClient: mgr.GetHTTPClient(), Mapper: mgr.GetRESTMapper(),
		DefaultTransform: model.TrimHostPod,
		ByObject:         map[client.Object]cache.ByObject{&corev1.Pod{}: {Field: fields.OneTermEqualSelector("spec.hostNetwork", "true")}}})
	if err == nil {
		err = mgr.Add(hostPods)
	}
	if err != nil {
		return nil, fmt.Errorf("hostNetwork pods cache: %w", err)
	}
	allPods, err := peerPodInformer(cfg, mgr)
	if err != nil {
		return nil, fmt.Errorf("every-pod informer: %w", err)
	}
	log = log.With("node", o.NodeName)
	c, reader := mgr.GetClient(), mgr.GetAPIReader()
	rec := mgr.GetEventRecorderFor("lace-agent/" + o.NodeName)
	node := linuxNode{ns: o.NetNS, underlay: o.UnderlayInterface, neigh: &netutil.NeighKeeper{}, kept: netutil.NewKeptNS(o.NetNS),
		routes: netutil.NewOwnedRouteCache()}
	if err := mgr.Add(manager.RunnableFunc(func(ctx context.Context) error {
		node.routes.Watch(ctx, o.NetNS, o.UnderlayInterface, log)
		return nil
	})); err != nil {
		return nil, fmt.Errorf("watch the node's routes: %w", err)
	}
	a = &Agent{opts: o, log: log, mgr: mgr, dp: dp, health: status.NewHealthChecks(log), routes: node.routes}
	a.pods, err = cni.New(cni.Options{NodeName: o.NodeName, NetNS: o.NetNS, UnderlayInterface: o.UnderlayInterface,
		HostCgroup: o.HostCgroup, CNISocket: o.CNISocket, DelQueueDir: o.DelQueueDir, MTU: o.MTU},
		o.StateDir, log, c, reader, rec, dp, node)
	if err != nil {
		return nil, err
	}
	svcMax, beMax, rangeMax := dp.MapCapacity()
	a.sync = nodesync.New(nodesync.Options{NodeName: o.NodeName, NetNS: o.NetNS, UnderlayInterface: o.UnderlayInterface,
		HostCgroup: o.HostCgroup, AllowedExternalIPs: o.AllowedExternalIPs, MetricsAddr: o.MetricsAddr, HealthAddr: o.HealthAddr,
		LocalReservedPorts: o.LocalReservedPorts, StateDir: o.StateDir,
		ServiceFrontends: o.ServiceFrontends, ServiceBackends: o.ServiceBackends,
		NamespaceFrontends: o.NamespaceFrontends, NamespaceBackends: o.NamespaceBackends},
		log, c, rec, mgr.GetCache(), hostPods, nodesync.WithServiceTable(dp), node,
		nodesync.Capacity{Services: svcMax, Backends: beMax, SourceRanges: rangeMax, Programmed: dp.ProgrammedFrontends()})
	a.status = status.New(status.Options{NodeName: o.NodeName, UnderlayInterface: o.UnderlayInterface}, log, c, rec, dp, node,
		a.sync, a.pods.Count)
	a.pods.Wire(a.sync, a.status)
	a.sync.Wire(a.pods, a.health, a.status.Kick)
	if o.LeaseNamespace != "" {
		l2 := announce.New(announce.Options{NodeName: o.NodeName, NetNS: o.NetNS, UnderlayInterface: o.UnderlayInterface,
			LeaseNamespace: o.LeaseNamespace, LeaseDuration: cmp.Or(o.AnnounceLeaseDuration, 2*time.Second),
			RestartGrace: o.AnnounceRestartGrace},
			log, c, reader, dp, a.sync)
		if err := mgr.Add(manager.RunnableFunc(l2.Run)); err != nil {
			return nil, fmt.Errorf("add the L2 announcer: %w", err)
		}
	}
	// The DaemonSet's probes: /healthz answers while the process serves;
	// /readyz once the data plane has been programmed (what CNI STATUS
	// reports), so a rolling update moves on only when forwarding is back.
	if err := mgr.AddHealthzCheck("ping", healthz.Ping); err != nil {
		return nil, fmt.Errorf("add healthz: %w", err)
	}
	if err := mgr.AddReadyzCheck("dataplane", func(*http.Request) error { return a.pods.Readyz() }); err != nil {
		return nil, fmt.Errorf("add readyz: %w", err)
	}
	// Data plane counters and map sizes, read from the pinned maps at
	// scrape time, on --metrics-bind-address.
	if err := status.RegisterCollector(metrics.Registry, status.NewCollector(dp, a.pods.Count)); err != nil {
		return nil, fmt.Errorf("register data plane metrics: %w", err)
	}
	if err := status.RegisterCollector(metrics.Registry, cni.DelQueueGauge(o.DelQueueDir)); err != nil {
		return nil, fmt.Errorf("register DEL queue metric: %w", err)
	}
	if err := a.sync.SetupWithManager(mgr, hostPods); err != nil {
		return nil, fmt.Errorf("setup node controller: %w", err)
	}
	// NetworkPolicy: compiled for the node's pods, written to the data
	// plane after every change.
	pol = policy.New(log, mgr.GetCache(), allPods, a.pods, dp, rec)
	if err := status.RegisterCollector(metrics.Registry, policy.NewCollector(pol)); err != nil {
		return nil, fmt.Errorf("register policy metrics: %w", err)
	}
	if err := mgr.Add(manager.RunnableFunc(pol.Run)); err != nil {
		return nil, fmt.Errorf("add the policy enforcer: %w", err)
	}
	// Flow events for lacectl flows, on while someone asks.
	for _, c := range flowLog.Collectors() {
		if err := status.RegisterCollector(metrics.Registry, c); err != nil {
			return nil, fmt.Errorf("register flow metrics: %w", err)
		}
	}
	if err := mgr.Add(manager.RunnableFunc(flowLog.Run)); err != nil {
		return nil, fmt.Errorf("add the flow log: %w", err)
	}
	// l2 learning: the data plane's reports, recorded on the endpoints.
	learnRing := func(ctx context.Context) error { return dp.ReadL2Learned(ctx, a.pods.Learned) }
	for _, r := range []manager.RunnableFunc{a.pods.Serve, a.sync.Run, a.resync, a.status.Run, learnRing, a.pods.RecordLearned} {
		if err := mgr.Add(r); err != nil {
			return nil, err
		}
	}
	return a, nil
}

// peerPodInformer is the informer of every pod's labels and named ports,
// the network policies' peers, run by mgr. Its store holds each pod as a
// netpolapi.PeerPod, not a corev1.Pod: at 30,000 pods that is about 26 MB
// less, which a controller-runtime cache (typed objects only) cannot do.
// It has no index; the enforcer reads the store whole.
func peerPodInformer(cfg *rest.Config, mgr manager.Manager) (toolscache.SharedIndexInformer, error) {
	pcfg := rest.CopyConfig(cfg)
	pcfg.ContentType = "application/vnd.kubernetes.protobuf"
	pcfg.AcceptContentTypes = "application/vnd.kubernetes.protobuf,application/json"
	cs, err := kubernetes.NewForConfigAndClient(pcfg, mgr.GetHTTPClient())
	if err != nil {
		return nil, err
	}
	lw := toolscache.NewListWatchFromClient(cs.CoreV1().RESTClient(), "pods", metav1.NamespaceAll, fields.Everything())
	inf := toolscache.NewSharedIndexInformer(lw, &corev1.Pod{}, 0, toolscache.Indexers{})
	if err := inf.SetTransform(netpolapi.TrimPod); err != nil {
		return nil, err
	}
	err = mgr.Add(manager.RunnableFunc(func(ctx context.Context) error {
		inf.RunWithContext(ctx)
		return nil
	}))
	return inf, err
}

// pprofHandlers are net/http/pprof's handlers for the metrics server, when
// on.
func pprofHandlers(on bool) map[string]http.Handler {
	if !on {
		return nil
	}
	return map[string]http.Handler{
		"/debug/pprof/":        http.HandlerFunc(pprof.Index),
		"/debug/pprof/cmdline": http.HandlerFunc(pprof.Cmdline),
		"/debug/pprof/profile": http.HandlerFunc(pprof.Profile),
		"/debug/pprof/symbol":  http.HandlerFunc(pprof.Symbol),
		"/debug/pprof/trace":   http.HandlerFunc(pprof.Trace),
	}
}

// agentGCPercent is the agent's GOGC unless the environment sets one.
const agentGCPercent = 50

// Run runs the agent until ctx ends. The data plane stays pinned: pods
// keep forwarding while no agent runs.
func (a *Agent) Run(ctx context.Context) error {
	defer a.dp.Close()
	// Most of the agent's heap is live: its cache of every Service and
	// EndpointSlice, and the node's services and views. The default GOGC
	// lets the heap grow to twice that before collecting, on every node
	// of the cluster; the agent allocates little once its state is built
	// (each change costs what it changes), so collecting at 1.5 times
	// costs little CPU. GOGC set in the environment wins.
	if os.Getenv("GOGC") == "" {
		debug.SetGCPercent(agentGCPercent)
	}
	a.log.Info("lace-agent starting", "netns", a.opts.NetNS, "bpffs", a.opts.BPFFS, "endpoints", a.pods.Count(),
		"checkpointLost", a.pods.CheckpointLost())
	defer a.health.Close()
	return a.mgr.Start(ctx)
}

// snatSweepPeriod is how often the node port mappings of flows that are
// over are deleted: lace_snat and lace_xlb_rev never evict (an eviction
// would hand a live flow's port to another), so a node whose pods (or
// NodePort clients) open many short flows to many destinations fills them
// (snat-failed) unless they are swept.
const snatSweepPeriod = 10 * time.Second

// reclaimSNAT deletes the SNAT mappings whose flows are over.
func (a *Agent) reclaimSNAT() {
	if n, err := a.dp.ReclaimSNAT(); err != nil {
		a.log.Info("reclaim SNAT mappings", "err", err)
	} else if n > 0 {
		a.log.Debug("reclaimed SNAT mappings", "count", n)
	}
}

// tableRepairs counts what checkTables repaired, by map.
var tableRepairs = prometheus.NewCounterVec(prometheus.CounterOpts{
	Name: dpmetrics.TableRepairs,
	Help: "Entries of the data plane maps the agent programs that differed from what it wrote (deleted, added or changed by someone else) and were repaired by the periodic check.",
}, []string{dpmetrics.LabelMap})

func init() { _ = metrics.Registry.Register(tableRepairs) }

// checkTables compares the maps the agent programs with what it wrote and
// repairs what differs (syncs never read the kernel: datapath's table
// reconciler diffs against what was written), so a write someone else
// made or undid never lasts longer than a resync period.
func (a *Agent) checkTables() {
	repaired, err := a.dp.CheckTables()
	if err != nil {
		a.log.Info("check the data plane's maps", "err", err)
	}
	for m, n := range repaired {
		tableRepairs.WithLabelValues(m).Add(float64(n))
		a.log.Warn("repaired entries of a data plane map that differed from what the agent wrote", "map", m, "entries", n)
	}
}

// resync replays the DELs queued while the agent was unreachable (at
// start, and periodically for one queued while it restarted) and triggers
// a full reconcile periodically, so a missed event never leaves the node
// stale for long.
func (a *Agent) resync(ctx context.Context) error {
	if err := a.pods.ReplayQueuedDels(ctx); err != nil {
		a.log.Info("replay queued DELs", "err", err)
	}
	t := time.NewTicker(a.opts.ResyncPeriod)
	defer t.Stop()
	sweep := time.NewTicker(snatSweepPeriod)
	defer sweep.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-sweep.C:
			a.reclaimSNAT()
		case <-t.C:
			if err := a.pods.ReplayQueuedDels(ctx); err != nil {
				a.log.Info("replay queued DELs", "err", err)
			}
			// The resync repairs what no event told of, routes too.
			a.routes.Changed()
			if err := a.sync.Refresh(ctx); err != nil {
				a.log.Info("periodic resync failed", "err", err)
			}
			a.checkTables()
		}
	}
}

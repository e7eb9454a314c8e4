// Package agent is lace-agent: everything Lace does on one node. It serves
// CNI requests from lace-cni on a unix socket (pod interfaces, addresses,
// NetworkEndpoints), publishes the node's UnderlayEndpoint, and keeps the
// node's eBPF data plane equal to the desired state computed by
// internal/model from the API. Kernel work goes through internal/netutil,
// internal/podnet and internal/datapath only.
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
	"sync"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/record"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/healthz"
	"sigs.k8s.io/controller-runtime/pkg/manager"
	"sigs.k8s.io/controller-runtime/pkg/metrics"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
	"sigs.k8s.io/controller-runtime/pkg/source"

	lacev1 "github.com/lace-cni/lace/api/v1alpha1"
	"github.com/lace-cni/lace/internal/datapath"
	"github.com/lace-cni/lace/internal/model"
	"github.com/lace-cni/lace/internal/netutil"
	"github.com/lace-cni/lace/internal/predicates"
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

// Agent is a running lace-agent.
type Agent struct {
	// hostNetNS is the cookie of the node's network namespace (0 until
	// host sockets are attached).
	hostNetNS uint64
	// slices tracks EndpointSlice versions for the programming latency.
	slices   sliceTracker
	opts     Options
	log      *slog.Logger
	mgr      manager.Manager
	client   client.Client
	reader   client.Reader
	recorder record.EventRecorder
	dp       dataplane
	node     nodeKernel
	cp       *checkpoint

	// hostPods caches the cluster's hostNetwork pods (nil in tests).
	hostPods client.Reader
	// hostPortReported are the hostPort refusals already made Events of.
	hostPortMu       sync.Mutex
	hostPortReported map[model.HostPortRefusal]bool
	// hostPortMax is the node's share of the service maps for hostPorts.
	hostPortMax int
	// localPorts keeps served hostPorts and the SNAT range out of the
	// node's ephemeral ports; localPortsErr is its last failure, logged
	// once.
	localPorts    *localPorts
	localPortsErr string

	// applier is the one writer of the data plane.
	applier *applier

	// computeMu serialises computations of the desired state (the
	// reconciler's, the periodic resync's, a CNI ADD waiting for blocks),
	// which share compute.
	computeMu sync.Mutex
	compute   computeCache
	// health serves the healthCheckNodePorts; announce keeps the node's
	// L2 announcements (l2, nil without a lease namespace).
	health *healthChecks
	l2     *announcer

	mu sync.Mutex
	// state is the node's desired state; haveState once computed.
	state     model.NodeState
	haveState bool
	// applyErr is why the last sync could not apply the node's state
	// (nil when it could); the reconciler retries on it.
	applyErr error
	applied  bool
	// podsReattached: this agent's first sync has attached every pod's
	// programs again. Until then each sync does: a pod's programs may
	// use maps a Load replaced (another layout), by this start or by an
	// earlier one that died before re-attaching, and nothing pinned
	// tells which (attaching replaces the classic tc filters in place,
	// so doing it once per start is cheap).
	podsReattached bool
	ownAddrs       []netip.Addr
	// attachErr is why the data plane could not be attached to the
	// underlay (nil once it is).
	attachErr error
	// reported is the Ready condition last published, so an Event is
	// emitted once per transition even while the cache lags.
	reported *metav1.Condition
	// addLock serialises address allocation, and adoption of what the
	// kernel holds (adopted, once per start) with it.
	addLock sync.Mutex
	adopted bool
	// statusKick asks reportStatus for an early report.
	statusKick chan struct{}
}

var nodeKey = reconcile.Request{}

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
	cp, err := loadCheckpoint(o.StateDir)
	if err != nil {
		dp.Close()
		return nil, err
	}
	mgr, err := ctrl.NewManager(cfg, ctrl.Options{
		Scheme:                 scheme.Scheme,
		Metrics:                metricsserver.Options{BindAddress: o.MetricsAddr, ExtraHandlers: pprofHandlers(o.Pprof)},
		HealthProbeBindAddress: o.HealthAddr,
		Cache: trimCache(cache.Options{ByObject: map[client.Object]cache.ByObject{
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
		dp.Close()
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
		dp.Close()
		return nil, fmt.Errorf("hostNetwork pods cache: %w", err)
	}
	a := &Agent{opts: o, log: log.With("node", o.NodeName), mgr: mgr, hostPods: hostPods, client: mgr.GetClient(), reader: mgr.GetAPIReader(),
		recorder: mgr.GetEventRecorderFor("lace-agent/" + o.NodeName), dp: newTableDP(dp), cp: cp, statusKick: make(chan struct{}, 1),
		node: linuxNode{ns: o.NetNS, underlay: o.UnderlayInterface}, localPorts: newLocalPorts(o.LocalReservedPorts, o.StateDir)}
	a.health = newHealthChecks(a.log)
	svcMax, beMax, rangeMax := dp.MapCapacity()
	// hostPorts have their own share of the service maps (an entry and
	// two backends each: the pod and its reference), out of the Services'.
	a.hostPortMax = max(min(model.MaxHostPortEntries, svcMax/8, beMax/16), 1)
	svcMax, beMax = svcMax-a.hostPortMax, beMax-2*a.hostPortMax
	// What the agent before this one admitted stays admitted, what it
	// refused stays refused: a restart changes no verdict.
	a.compute.services.programmed = dp.ProgrammedFrontends()
	a.compute.services.budget = model.Budget{ServiceFrontends: o.ServiceFrontends, ServiceBackends: o.ServiceBackends,
		// loadBalancerSourceRanges have no bound in Kubernetes: one
		// Service may take a sixteenth of lace_src_ranges.
		ServiceSourceRanges: max(rangeMax/16, 1),
		NamespaceFrontends:  share(o.NamespaceFrontends, svcMax), NamespaceBackends: share(o.NamespaceBackends, beMax),
		NamespaceSourceRanges: share(0, rangeMax),
		TotalFrontends:        svcMax, TotalBackends: beMax, TotalSourceRanges: rangeMax}
	if o.LeaseNamespace != "" {
		a.l2 = &announcer{a: a, ns: o.LeaseNamespace, duration: cmp.Or(o.AnnounceLeaseDuration, 2*time.Second)}
		if err := mgr.Add(manager.RunnableFunc(a.l2.run)); err != nil {
			dp.Close()
			return nil, fmt.Errorf("add the L2 announcer: %w", err)
		}
	}
	// The DaemonSet's probes: /healthz answers while the process serves;
	// /readyz once the data plane has been programmed (what CNI STATUS
	// reports), so a rolling update moves on only when forwarding is back.
	if err := mgr.AddHealthzCheck("ping", healthz.Ping); err != nil {
		dp.Close()
		return nil, fmt.Errorf("add healthz: %w", err)
	}
	if err := mgr.AddReadyzCheck("dataplane", func(*http.Request) error { return a.readyz() }); err != nil {
		dp.Close()
		return nil, fmt.Errorf("add readyz: %w", err)
	}
	// Data plane counters and map sizes, read from the pinned maps at
	// scrape time, on --metrics-bind-address.
	if err := registerCollector(metrics.Registry, newDPCollector(dp, func() int { return len(a.cp.all()) })); err != nil {
		dp.Close()
		return nil, fmt.Errorf("register data plane metrics: %w", err)
	}
	if err := registerCollector(metrics.Registry, delQueueGauge(o.DelQueueDir)); err != nil {
		dp.Close()
		return nil, fmt.Errorf("register DEL queue metric: %w", err)
	}
	toNode := handler.EnqueueRequestsFromMapFunc(func(context.Context, client.Object) []reconcile.Request {
		return []reconcile.Request{nodeKey}
	})
	// Each watch passes only what the node's desired state reads: a
	// network's status (its ID) does matter; status writes of the other
	// kinds (other agents' UnderlayEndpoint status, binding policy
	// conditions), Node heartbeats and pod condition churn do not.
	specOnly := builder.WithPredicates(predicates.SpecOrLifecycleChanged())
	err = ctrl.NewControllerManagedBy(mgr).
		Named("node-dataplane").
		Watches(&lacev1.Network{}, toNode, builder.WithPredicates(predicate.ResourceVersionChangedPredicate{})).
		Watches(&lacev1.Allocation{}, toNode, specOnly).
		Watches(&lacev1.UnderlayEndpoint{}, toNode, specOnly).
		Watches(&lacev1.NetworkRoutingPolicy{}, toNode, specOnly).
		Watches(&lacev1.NetworkBindingPolicy{}, toNode, specOnly).
		Watches(&lacev1.ServiceRoutingPolicy{}, toNode, specOnly).
		// Services and their endpoints, as kube-proxy watches them (a
		// Service's status holds its load balancer addresses).
		Watches(&corev1.Service{}, toNode, builder.WithPredicates(predicate.ResourceVersionChangedPredicate{})).
		Watches(&discoveryv1.EndpointSlice{}, toNode, builder.WithPredicates(predicate.ResourceVersionChangedPredicate{})).
		Watches(&networkingv1.ServiceCIDR{}, toNode, specOnly).
		// Pools are never a node's underlay address (model.AcceptUnderlays).
		Watches(&lacev1.LoadBalancerClass{}, toNode, specOnly).
		Watches(&corev1.Pod{}, toNode, builder.WithPredicates(predicates.PodChanged())).
		Watches(&corev1.Node{}, toNode, builder.WithPredicates(predicates.NodeChanged())).
		// hostNetwork pods: which node each is on, and when it leaves.
		WatchesRawSource(source.Kind[client.Object](hostPods, &corev1.Pod{}, toNode, predicate.Funcs{
			UpdateFunc: func(e event.UpdateEvent) bool {
				o, n := e.ObjectOld.(*corev1.Pod), e.ObjectNew.(*corev1.Pod)
				return o.Spec.NodeName != n.Spec.NodeName || (o.DeletionTimestamp == nil) != (n.DeletionTimestamp == nil)
			},
		})).
		// A NetworkEndpoint deleted or changed behind the agent's back is
		// written again (its own creations need no reconcile).
		Watches(&lacev1.NetworkEndpoint{}, toNode, builder.WithPredicates(predicate.Funcs{
			CreateFunc: func(event.CreateEvent) bool { return false },
			UpdateFunc: func(e event.UpdateEvent) bool {
				return e.ObjectOld.GetGeneration() != e.ObjectNew.GetGeneration()
			},
			DeleteFunc: func(event.DeleteEvent) bool { return true },
		})).
		// Namespace labels bind services (namespaceSelector) and scope
		// ServiceRoutingPolicies; for pods they matter at CNI ADD only.
		Watches(&corev1.Namespace{}, toNode, builder.WithPredicates(predicate.LabelChangedPredicate{})).
		WithOptions(controller.Options{MaxConcurrentReconciles: 1}).
		Complete(reconcile.Func(a.reconcile))
	if err != nil {
		dp.Close()
		return nil, fmt.Errorf("setup node controller: %w", err)
	}
	if err := mgr.Add(manager.RunnableFunc(a.serveCNI)); err != nil {
		dp.Close()
		return nil, err
	}
	a.applier = newApplier(a.syncDataplane, 0)
	for _, r := range []manager.RunnableFunc{a.applier.Run, a.resync, a.reportStatus} {
		if err := mgr.Add(r); err != nil {
			dp.Close()
			return nil, err
		}
	}
	return a, nil
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
	a.log.Info("lace-agent starting", "netns", a.opts.NetNS, "bpffs", a.opts.BPFFS, "endpoints", len(a.cp.all()),
		"checkpointLost", a.cp.lost)
	defer a.health.close()
	return a.mgr.Start(ctx)
}

// snatSweepPeriod is how often the SNAT mappings of flows that are over
// are deleted: lace_snat never evicts (an eviction would hand a live
// flow's port to another), so a node whose pods open many short flows to
// many destinations fills it (snat-failed) unless they are swept.
const snatSweepPeriod = 10 * time.Second

// reclaimSNAT deletes the SNAT mappings whose flows are over.
func (a *Agent) reclaimSNAT() {
	r, ok := a.dp.(interface{ ReclaimSNAT() (int, error) })
	if !ok {
		return
	}
	if n, err := r.ReclaimSNAT(); err != nil {
		a.log.Info("reclaim SNAT mappings", "err", err)
	} else if n > 0 {
		a.log.Debug("reclaimed SNAT mappings", "count", n)
	}
}

// checkTables compares the maps the agent programs with what it wrote and
// repairs what differs (the data plane's tables never read the kernel
// otherwise): a missed write or someone else's never lasts longer than a
// resync period.
func (a *Agent) checkTables() {
	c, ok := a.dp.(interface {
		CheckTables() (map[string]int, error)
	})
	if !ok {
		return
	}
	repaired, err := c.CheckTables()
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
	if err := a.replayQueuedDels(ctx); err != nil {
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
			if err := a.replayQueuedDels(ctx); err != nil {
				a.log.Info("replay queued DELs", "err", err)
			}
			if _, err := a.reconcile(ctx, nodeKey); err != nil {
				a.log.Info("periodic resync failed", "err", err)
			}
			a.checkTables()
		}
	}
}

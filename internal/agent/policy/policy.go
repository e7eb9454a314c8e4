// Package policy enforces the cluster's NetworkPolicies on the node's
// pods: it watches the policies, every pod's labels and named ports, the
// namespaces' labels, the pods' NetworkEndpoints (their networks and
// addresses) and the networks, compiles them for this node's pods
// (internal/netpol) and writes the result to the data plane's policy
// tables (datapath.SyncPolicies), again after every change.
//
// It owns the policy tables and nothing else of the data plane; the pods'
// own entries are the CNI server's, the node's tables the sync's.
package policy

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	toolscache "k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/record"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"

	lacev1 "github.com/lace-cni/lace/api/v1alpha1"
	"github.com/lace-cni/lace/internal/dpmetrics"
	"github.com/lace-cni/lace/internal/netpol"
	"github.com/lace-cni/lace/internal/netpolapi"
)

// DataPlane is what enforcing needs of the data plane.
type DataPlane interface {
	SyncPolicies(netpol.Tables) error
	PolicyDrops() (map[uint32]uint64, error)
	PolicyCapacity() int
}

// Locals are the node's pods and their ports (the CNI server's records).
type Locals interface {
	EachLocal(fn func(namespace, name string, ifindex uint32))
}

// PodInformer is the informer of every pod of the cluster, whose store
// holds them as netpolapi.PeerPods (its transform is netpolapi.TrimPod).
type PodInformer interface {
	AddEventHandler(toolscache.ResourceEventHandler) (toolscache.ResourceEventHandlerRegistration, error)
	GetStore() toolscache.Store
}

// Enforcer compiles and writes the node's policy tables.
type Enforcer struct {
	log    *slog.Logger
	cache  cache.Cache // policies, namespaces, NetworkEndpoints, networks
	pods   PodInformer
	locals Locals
	dp     DataPlane
	rec    record.EventRecorder
	kick   chan struct{}
	// over are the namespaces enforced as deny-all (limits.go), and why.
	over map[string]string

	mu       sync.Mutex
	policies map[uint32]netpol.PolicyRef // of the tables last written
	// cnpWatched: the ClusterNetworkPolicy CRD is installed and watched
	// (until then the cluster has none).
	cnpWatched atomic.Bool
}

// New makes an Enforcer; Run starts it.
func New(log *slog.Logger, c cache.Cache, pods PodInformer, locals Locals, dp DataPlane, rec record.EventRecorder) *Enforcer {
	return &Enforcer{log: log.With("part", "policy"), cache: c, pods: pods, locals: locals, dp: dp, rec: rec,
		kick: make(chan struct{}, 1)}
}

// Kick asks for the tables to be compiled again (a local pod came or
// went).
func (e *Enforcer) Kick() {
	select {
	case e.kick <- struct{}{}:
	default:
	}
}

// settle is how long a burst of changes is gathered into one compile.
const settle = 20 * time.Millisecond

// retry is how long a failed compile or write waits before the next.
const retry = time.Second

// Run watches the inputs and keeps the tables written until ctx ends.
func (e *Enforcer) Run(ctx context.Context) error {
	h := toolscache.ResourceEventHandlerFuncs{
		AddFunc: func(any) { e.Kick() },
		UpdateFunc: func(was, is any) {
			if changed(was, is) {
				e.Kick()
			}
		},
		DeleteFunc: func(any) { e.Kick() },
	}
	for _, w := range []struct {
		c   cache.Cache
		obj client.Object
	}{
		{e.cache, &networkingv1.NetworkPolicy{}}, {e.cache, &corev1.Namespace{}}, {e.cache, &corev1.Node{}},
		{e.cache, &lacev1.NetworkEndpoint{}}, {e.cache, &lacev1.Network{}},
	} {
		inf, err := w.c.GetInformer(ctx, w.obj)
		if err != nil {
			return fmt.Errorf("watch %T: %w", w.obj, err)
		}
		if _, err := inf.AddEventHandler(h); err != nil {
			return fmt.Errorf("watch %T: %w", w.obj, err)
		}
	}
	// The caches above are synced once GetInformer returns; the pods'
	// informer is waited for here.
	reg, err := e.pods.AddEventHandler(h)
	if err != nil {
		return fmt.Errorf("watch pods: %w", err)
	}
	if !toolscache.WaitForCacheSync(ctx.Done(), reg.HasSynced) {
		return nil
	}
	settled := make(chan struct{})
	go e.watchClusterPolicies(ctx, h, settled)
	select {
	case <-ctx.Done():
		return nil
	case <-settled:
	}
	e.Kick()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-e.kick:
		}
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(settle):
		}
		if err := e.apply(ctx); err != nil {
			e.log.Error("enforce network policies", "err", err)
			time.AfterFunc(retry, e.Kick)
		}
	}
}

// apply compiles the policies for the node's pods and writes them.
func (e *Enforcer) apply(ctx context.Context) error {
	in, err := e.input(ctx)
	if err != nil {
		return err
	}
	start := time.Now()
	over := limitInput(&in)
	t := netpol.Compile(in)
	if more := overVerdicts(t, in.Local, e.dp.PolicyCapacity()); len(more) > 0 {
		for ns, why := range more {
			over[ns] = why
		}
		denyAll(&in, over)
		t = netpol.Compile(in)
	}
	e.report(over, in.Policies)
	if err := e.dp.SyncPolicies(t); err != nil {
		return fmt.Errorf("write policy tables: %w", err)
	}
	e.mu.Lock()
	e.policies = t.Policies
	e.mu.Unlock()
	e.log.Debug("network policies enforced", "policies", len(in.Policies), "subjects", len(t.Endpoints),
		"verdicts", len(t.Verdicts), "classes", len(t.Peers)+len(t.CIDRs), "took", time.Since(start))
	return nil
}

// report says, once each time it starts, that a namespace's policies are
// enforced as deny-all: a Warning on each of them, and a log line.
func (e *Enforcer) report(over map[string]string, policies []*networkingv1.NetworkPolicy) {
	for ns, why := range over {
		if e.over[ns] == why {
			continue
		}
		e.log.Error("a namespace's network policies are over their limits: enforced as deny-all", "namespace", ns, "why", why)
		for _, p := range policies {
			if p.Namespace == ns && e.rec != nil {
				e.rec.Eventf(p, corev1.EventTypeWarning, ReasonPolicyNotEnforced,
					"Enforced as deny-all on this node: %s (the pods the namespace's policies select refuse what they isolate)", why)
			}
		}
	}
	for ns := range e.over {
		if _, ok := over[ns]; !ok {
			e.log.Info("a namespace's network policies are within their limits again", "namespace", ns)
		}
	}
	e.over = over
}

// input reads the compile's input from the caches.
func (e *Enforcer) input(ctx context.Context) (netpol.Input, error) {
	var in netpol.Input
	var nps networkingv1.NetworkPolicyList
	if err := e.cache.List(ctx, &nps); err != nil {
		return in, fmt.Errorf("list network policies: %w", err)
	}
	for i := range nps.Items {
		in.Policies = append(in.Policies, &nps.Items[i])
	}
	var nss corev1.NamespaceList
	if err := e.cache.List(ctx, &nss); err != nil {
		return in, fmt.Errorf("list namespaces: %w", err)
	}
	in.Namespaces = make(map[string]map[string]string, len(nss.Items))
	for _, ns := range nss.Items {
		in.Namespaces[ns.Name] = ns.Labels
	}
	var nets lacev1.NetworkList
	if err := e.cache.List(ctx, &nets); err != nil {
		return in, fmt.Errorf("list networks: %w", err)
	}
	// One per pod of the cluster, read only (PodsOf): not deep-copied.
	var neps lacev1.NetworkEndpointList
	if err := e.cache.List(ctx, &neps, client.UnsafeDisableDeepCopy); err != nil {
		return in, fmt.Errorf("list network endpoints: %w", err)
	}
	pods, err := peerPods(e.pods.GetStore())
	if err != nil {
		return in, err
	}
	in.Pods = netpolapi.PodsOf(pods, neps.Items, nets.Items)
	if err := e.clusterInput(ctx, &in); err != nil {
		return in, err
	}
	e.locals.EachLocal(func(ns, name string, ifindex uint32) {
		in.Local = append(in.Local, netpol.Local{Namespace: ns, Name: name, Ifindex: ifindex})
	})
	return in, nil
}

// peerPods are the pods of the every-pod informer's store. Anything but a
// PeerPod there fails the compile, which leaves the tables written last:
// pods skipped would be peers missing, and a Deny of a ClusterNetworkPolicy
// that selects them would match nothing.
func peerPods(store toolscache.Store) ([]*netpolapi.PeerPod, error) {
	objs := store.List()
	pods := make([]*netpolapi.PeerPod, 0, len(objs))
	for _, o := range objs {
		p, ok := o.(*netpolapi.PeerPod)
		if !ok {
			return nil, fmt.Errorf("the pods' informer holds a %T, not a PeerPod (its transform is not netpolapi.TrimPod)", o)
		}
		pods = append(pods, p)
	}
	return pods, nil
}

// Collector exports the packets each policy refused on this node.
type Collector struct{ e *Enforcer }

var policyDropsDesc = prometheus.NewDesc(dpmetrics.PolicyDrops,
	"Packets refused on this node by each network policy (the policy that isolates the pod, or whose rule denies).",
	[]string{"kind", "namespace", "name"}, nil)

// NewCollector exports e's drop counters.
func NewCollector(e *Enforcer) *Collector { return &Collector{e: e} }

// Describe implements prometheus.Collector.
func (c *Collector) Describe(ch chan<- *prometheus.Desc) { ch <- policyDropsDesc }

// Collect implements prometheus.Collector.
func (c *Collector) Collect(ch chan<- prometheus.Metric) {
	drops, err := c.e.dp.PolicyDrops()
	if err != nil {
		ch <- prometheus.NewInvalidMetric(policyDropsDesc, err)
		return
	}
	c.e.mu.Lock()
	defer c.e.mu.Unlock()
	for id, n := range drops {
		if ref, ok := c.e.policies[id]; ok {
			ch <- prometheus.MustNewConstMetric(policyDropsDesc, prometheus.CounterValue, float64(n), ref.Kind, ref.Namespace, ref.Name)
		}
	}
}

// Policies are the policies of the tables last written, by id.
func (e *Enforcer) Policies() map[uint32]netpol.PolicyRef {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.policies
}

package nodesync

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/metrics"
)

// Programming metrics, as kube-proxy reports them
// (sync_proxy_rules_duration_seconds, network_programming_duration_seconds).
var (
	syncDuration = prometheus.NewHistogram(prometheus.HistogramOpts{
		Name:    "lace_agent_sync_duration_seconds",
		Help:    "Time one sync of the node's data plane (maps, views, services, routes) took.",
		Buckets: prometheus.ExponentialBuckets(0.0005, 2, 16),
	})
	programmingDuration = prometheus.NewHistogram(prometheus.HistogramOpts{
		Name: "lace_network_programming_duration_seconds",
		Help: "Time from a change of a service's endpoints (the EndpointSlice's " + corev1.EndpointsLastChangeTriggerTime +
			" annotation) to the node's data plane serving it.",
		Buckets: prometheus.ExponentialBuckets(0.001, 2, 16),
	})
	// serviceComputations says what a change cost: a pod created on
	// another node that no Service selects must not move it.
	serviceComputations = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "lace_agent_service_computations_total",
		Help: "Services whose table entries the agent computed again from their objects.",
	})
)

func init() {
	for _, c := range []prometheus.Collector{syncDuration, programmingDuration, serviceComputations} {
		_ = metrics.Registry.Register(c)
	}
}

// sliceTracker remembers the EndpointSlice versions the data plane serves,
// to report how long each change took to program.
type sliceTracker struct {
	seen   map[types.UID]seenSlice
	primed bool
	gen    uint64
}

type seenSlice struct {
	rv  string
	gen uint64
}

// changed returns the trigger times of the slices that changed since the
// last call (none the first time: what existed before the agent started
// is not its latency) and remembers the current versions.
func (t *sliceTracker) changed(slices []discoveryv1.EndpointSlice) []time.Time {
	return t.changedPtrs(ptrs(slices))
}

// changedPtrs is changed for the cache's own objects. Its cost is a map
// lookup per slice: nothing is allocated for slices that did not change.
func (t *sliceTracker) changedPtrs(slices []*discoveryv1.EndpointSlice) []time.Time {
	if t.seen == nil {
		t.seen = make(map[types.UID]seenSlice, len(slices))
	}
	t.gen++
	var out []time.Time
	for _, s := range slices {
		old, ok := t.seen[s.UID]
		if ok && old.rv == s.ResourceVersion {
			t.seen[s.UID] = seenSlice{old.rv, t.gen}
			continue
		}
		t.seen[s.UID] = seenSlice{s.ResourceVersion, t.gen}
		if !t.primed {
			continue
		}
		if v, ok := s.Annotations[corev1.EndpointsLastChangeTriggerTime]; ok {
			if at, err := time.Parse(time.RFC3339Nano, v); err == nil {
				out = append(out, at)
			}
		}
	}
	for uid, s := range t.seen {
		if s.gen != t.gen {
			delete(t.seen, uid)
		}
	}
	t.primed = true
	return out
}

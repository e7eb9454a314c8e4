package nodesync

import (
	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"
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

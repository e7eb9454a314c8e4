package nodesync

import (
	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/metrics"

	"github.com/lace-cni/lace/internal/model"
)

// servicesRefused counts the Services the node's budget leaves out of its
// data plane (model.Budget), by reason.
var servicesRefused = prometheus.NewGaugeVec(prometheus.GaugeOpts{
	Name: "lace_agent_services_refused",
	Help: "Services this node does not program because they exceed the per-Service budget (" +
		model.ReasonServiceOverBudget + "), their namespace's share (" + model.ReasonNamespaceShare +
		") or the maps (" + model.ReasonMapsFull + ").",
}, []string{"reason"})

func init() { _ = metrics.Registry.Register(servicesRefused) }

// reportRefused makes a Warning Event on every Service newly refused (or
// refused for another reason), from this node's agent, and updates the
// gauge. The other Services are programmed whatever the refused ones are.
func (s *Syncer) reportRefused(c *computeCache) {
	now := c.services.refused
	counts := map[string]float64{model.ReasonServiceOverBudget: 0, model.ReasonNamespaceShare: 0, model.ReasonMapsFull: 0}
	for k, r := range now {
		counts[r.Reason]++
		if old, ok := c.reported[k]; ok && old.Reason == r.Reason {
			continue
		}
		s.log.Warn("service refused", "service", k.Namespace+"/"+k.Name, "reason", r.Reason, "message", r.Message)
		if s.recorder != nil {
			svc := &corev1.Service{}
			svc.Namespace, svc.Name = k.Namespace, k.Name
			if e := c.services.entries[k]; e != nil {
				svc.UID = e.uid
			}
			s.recorder.Eventf(svc, corev1.EventTypeWarning, r.Reason, "node %s: %s", s.opts.NodeName, r.Message)
		}
	}
	for reason, n := range counts {
		servicesRefused.WithLabelValues(reason).Set(n)
	}
	c.reported = now
}

// share is a namespace's bound: n, a quarter of the map (size) when n is
// 0, none when n is negative.
func share(n, size int) int {
	switch {
	case n < 0:
		return 0
	case n == 0:
		return max(size/4, 1)
	}
	return n
}

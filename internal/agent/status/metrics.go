package status

import (
	"errors"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/lace-cni/lace/internal/dpmetrics"
)

// dpCollector exposes the data plane's counters and map sizes, read from
// the pinned maps at scrape time: nothing is read while nobody scrapes, and
// a scrape always sees the kernel's current numbers (also those counted
// while no agent ran).
type dpCollector struct {
	dp        Counters
	endpoints func() int

	forwarded, dropped, maps, eps, snat *prometheus.Desc
}

// Counters is what the metrics read of the eBPF data plane.
// *datapath.Datapath implements it.
type Counters interface {
	Maps
	Drops() (map[string]uint64, error)
	Forwarded() (map[string]uint64, error)
	SNATExhaustedCounts() (map[string]uint64, error)
}

// NewCollector exposes dp's counters and map sizes, and endpoints.
func NewCollector(dp Counters, endpoints func() int) prometheus.Collector {
	return &dpCollector{dp: dp, endpoints: endpoints,
		forwarded: prometheus.NewDesc(dpmetrics.Forwarded,
			"Packets the eBPF data plane forwarded, by kind: local (pod to pod on the node), encapsulated (SRv6 to another node), decapsulated (SRv6 from another node), to-host.",
			[]string{dpmetrics.LabelKind}, nil),
		dropped: prometheus.NewDesc(dpmetrics.Dropped,
			"Packets the eBPF data plane dropped, by reason.",
			[]string{dpmetrics.LabelReason}, nil),
		maps: prometheus.NewDesc(dpmetrics.MapEntries,
			"Entries in each eBPF data plane map.",
			[]string{dpmetrics.LabelMap}, nil),
		snat: prometheus.NewDesc(dpmetrics.SNATExhausted,
			"New flows that found no free SNAT port, by outside destination (proto/address:port): the node's ports toward it were all held by live flows. The data plane keeps the last 1024 destinations.",
			[]string{dpmetrics.LabelDestination}, nil),
		eps: prometheus.NewDesc(dpmetrics.Endpoints,
			"Pod attachments on the node (the agent's checkpoint).", nil, nil),
	}
}

// Describe implements prometheus.Collector.
func (c *dpCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{c.forwarded, c.dropped, c.maps, c.eps, c.snat} {
		ch <- d
	}
}

// Collect implements prometheus.Collector. A map that cannot be read is
// reported as an invalid metric (the scrape shows the error) while the
// others are still served.
func (c *dpCollector) Collect(ch chan<- prometheus.Metric) {
	counters := func(d *prometheus.Desc, read func() (map[string]uint64, error)) {
		m, err := read()
		if err != nil {
			ch <- prometheus.NewInvalidMetric(d, err)
			return
		}
		for k, v := range m {
			ch <- prometheus.MustNewConstMetric(d, prometheus.CounterValue, float64(v), k)
		}
	}
	counters(c.forwarded, c.dp.Forwarded)
	counters(c.dropped, c.dp.Drops)
	counters(c.snat, c.dp.SNATExhaustedCounts)
	sizes, err := c.dp.MapSizes()
	if err != nil {
		ch <- prometheus.NewInvalidMetric(c.maps, err)
	}
	for k, v := range sizes {
		ch <- prometheus.MustNewConstMetric(c.maps, prometheus.GaugeValue, float64(v), k)
	}
	ch <- prometheus.MustNewConstMetric(c.eps, prometheus.GaugeValue, float64(c.endpoints()))
}

// RegisterCollector adds c to reg. Tests run several agents in one process
// against the one controller-runtime registry: the first keeps it.
func RegisterCollector(reg prometheus.Registerer, c prometheus.Collector) error {
	if err := reg.Register(c); err != nil {
		var are prometheus.AlreadyRegisteredError
		if !errors.As(err, &are) {
			return err
		}
	}
	return nil
}

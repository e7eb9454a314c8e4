// Package dpmetrics names the data plane metrics lace-agent serves on its
// metrics endpoint and reads them back from the Prometheus text
// exposition: the agent serves them, lacectl status and the tests read them.
//
// Counters are not written to the API: they move with traffic, and every
// write of a moving number is an API server write per node per period.
package dpmetrics

import (
	"fmt"
	"io"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
)

// Metric names and their labels.
const (
	// Forwarded counts packets forwarded, by kind (local, encapsulated,
	// decapsulated, to-host): a counter.
	Forwarded = "lace_datapath_forwarded_packets_total"
	// Dropped counts packets dropped, by reason: a counter.
	Dropped = "lace_datapath_dropped_packets_total"
	// MapEntries is the number of entries of each data plane map: a gauge.
	MapEntries = "lace_datapath_map_entries"
	// SNATExhausted counts new flows that found no free SNAT port, by
	// outside destination (proto/address:port): a counter.
	SNATExhausted = "lace_datapath_snat_exhausted_total"
	// Endpoints is the number of pod attachments on the node: a gauge.
	Endpoints = "lace_agent_endpoints"
	// TableRepairs counts the entries of the maps the agent programs
	// that the periodic check found differing from what the agent wrote
	// and repaired, by map: a counter (0 unless someone else writes them).
	TableRepairs = "lace_agent_table_repairs_total"
	// PolicyDrops counts the packets each network policy refused on the
	// node, by policy (kind, namespace, name): a counter.
	PolicyDrops = "lace_policy_drops_total"

	LabelKind   = "kind"
	LabelReason = "reason"
	LabelMap    = "map"

	LabelDestination = "destination"
)

// Snapshot is one scrape of an agent's data plane metrics.
type Snapshot struct {
	Forwarded  map[string]uint64
	Dropped    map[string]uint64
	MapEntries map[string]int64
	// SNATExhausted: failures by outside destination.
	SNATExhausted map[string]uint64
	Endpoints     int64
}

// Parse reads a Prometheus text exposition and keeps the data plane
// metrics; everything else on the endpoint (Go runtime, controller-runtime)
// is skipped.
func Parse(r io.Reader) (Snapshot, error) {
	var p expfmt.TextParser
	fams, err := p.TextToMetricFamilies(r)
	if err != nil {
		return Snapshot{}, fmt.Errorf("parse metrics: %w", err)
	}
	s := Snapshot{Forwarded: map[string]uint64{}, Dropped: map[string]uint64{}, MapEntries: map[string]int64{}, SNATExhausted: map[string]uint64{}}
	for _, m := range fams[Forwarded].GetMetric() {
		s.Forwarded[label(m, LabelKind)] = uint64(m.GetCounter().GetValue())
	}
	for _, m := range fams[Dropped].GetMetric() {
		s.Dropped[label(m, LabelReason)] = uint64(m.GetCounter().GetValue())
	}
	for _, m := range fams[MapEntries].GetMetric() {
		s.MapEntries[label(m, LabelMap)] = int64(m.GetGauge().GetValue())
	}
	for _, m := range fams[SNATExhausted].GetMetric() {
		s.SNATExhausted[label(m, LabelDestination)] = uint64(m.GetCounter().GetValue())
	}
	for _, m := range fams[Endpoints].GetMetric() {
		s.Endpoints = int64(m.GetGauge().GetValue())
	}
	if fams[Forwarded] == nil && fams[Dropped] == nil {
		return s, fmt.Errorf("no %s or %s on the endpoint", Forwarded, Dropped)
	}
	return s, nil
}

func label(m *dto.Metric, name string) string {
	for _, l := range m.GetLabel() {
		if l.GetName() == name {
			return l.GetValue()
		}
	}
	return ""
}

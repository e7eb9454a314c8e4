package dpmetrics

import (
	"strings"
	"testing"
)

func TestParse(t *testing.T) {
	text := `# HELP go_goroutines Number of goroutines.
# TYPE go_goroutines gauge
go_goroutines 12
# HELP lace_datapath_forwarded_packets_total Packets forwarded.
# TYPE lace_datapath_forwarded_packets_total counter
lace_datapath_forwarded_packets_total{kind="local"} 42
lace_datapath_forwarded_packets_total{kind="encapsulated"} 7
# HELP lace_datapath_dropped_packets_total Packets dropped.
# TYPE lace_datapath_dropped_packets_total counter
lace_datapath_dropped_packets_total{reason="isolated"} 3
lace_datapath_dropped_packets_total{reason="no-endpoint"} 0
# HELP lace_datapath_map_entries Entries.
# TYPE lace_datapath_map_entries gauge
lace_datapath_map_entries{map="endpoints"} 4
# HELP lace_agent_endpoints Endpoints.
# TYPE lace_agent_endpoints gauge
lace_agent_endpoints 2
`
	s, err := Parse(strings.NewReader(text))
	if err != nil {
		t.Fatal(err)
	}
	if s.Forwarded["local"] != 42 || s.Forwarded["encapsulated"] != 7 || s.Dropped["isolated"] != 3 ||
		len(s.Dropped) != 2 || s.MapEntries["endpoints"] != 4 || s.Endpoints != 2 {
		t.Errorf("parsed %+v", s)
	}
	if _, err := Parse(strings.NewReader("go_goroutines 1\n")); err == nil {
		t.Error("an endpoint without data plane metrics must be an error")
	}
}

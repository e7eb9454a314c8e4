package agent

import (
	"context"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	promtestutil "github.com/prometheus/client_golang/prometheus/testutil"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"

	lacev1 "github.com/lace-cni/lace/api/v1alpha1"
	"github.com/lace-cni/lace/pkg/scheme"
)

func TestStatusChanged(t *testing.T) {
	base := datapathStatus(2, map[string]int{"endpoints": 2, "routes": 3})
	for _, c := range []struct {
		name     string
		cur, new *lacev1.DatapathStatus
		want     bool
	}{
		{"same", base, datapathStatus(2, map[string]int{"routes": 3, "endpoints": 2}), false},
		{"never published", nil, base, true},
		{"endpoints", base, datapathStatus(3, map[string]int{"endpoints": 2, "routes": 3}), true},
		{"map size", base, datapathStatus(2, map[string]int{"endpoints": 2, "routes": 4}), true},
		{"new map", base, datapathStatus(2, map[string]int{"endpoints": 2, "routes": 3, "nodes": 0}), true},
	} {
		if got := statusChanged(c.cur, c.new); got != c.want {
			t.Errorf("%s: changed=%v, want %v", c.name, got, c.want)
		}
	}
}

// TestPublishStatusWritesOnlyChanges: repeated checks of an unchanged node
// write nothing; a new endpoint is written once.
func TestPublishStatusWritesOnlyChanges(t *testing.T) {
	ta := newTestAgent(t, 29)
	// Status is a subresource, as on the API server.
	c := fake.NewClientBuilder().WithScheme(scheme.Scheme).WithStatusSubresource(&lacev1.UnderlayEndpoint{}).
		WithObjects(&lacev1.UnderlayEndpoint{ObjectMeta: metav1.ObjectMeta{Name: "n1"}}).Build()
	ta.client = c
	ctx := context.Background()
	rv := func() string {
		var u lacev1.UnderlayEndpoint
		if err := c.Get(ctx, types.NamespacedName{Name: "n1"}, &u); err != nil {
			t.Fatal(err)
		}
		return u.ResourceVersion
	}
	check := func(wantWrite bool, what string) {
		t.Helper()
		before := rv()
		if err := ta.publishStatus(ctx); err != nil {
			t.Fatalf("%s: %v", what, err)
		}
		if wrote := rv() != before; wrote != wantWrite {
			t.Errorf("%s: wrote=%v, want %v", what, wrote, wantWrite)
		}
	}
	check(true, "first report")
	for range 3 {
		check(false, "idle node")
	}
	if err := ta.cp.put(Endpoint{ContainerID: "c1", PodNS: "default", PodName: "a", Ready: true}); err != nil {
		t.Fatal(err)
	}
	check(true, "new endpoint")
	check(false, "idle again")
}

// countingDP serves fixed counters and map sizes.
type countingDP struct{ *fakeDP }

func (countingDP) Forwarded() (map[string]uint64, error) {
	return map[string]uint64{"local": 5, "encapsulated": 2}, nil
}
func (countingDP) Drops() (map[string]uint64, error) { return map[string]uint64{"isolated": 3}, nil }
func (countingDP) MapSizes() (map[string]int, error) { return map[string]int{"endpoints": 4}, nil }
func (countingDP) SNATExhaustedCounts() (map[string]uint64, error) {
	return map[string]uint64{"udp/203.0.113.53:53": 9}, nil
}

func TestCollectorExposesCounters(t *testing.T) {
	reg := prometheus.NewPedanticRegistry()
	if err := registerCollector(reg, newDPCollector(countingDP{newFakeDP()}, func() int { return 2 })); err != nil {
		t.Fatal(err)
	}
	want := `
# HELP lace_agent_endpoints Pod attachments on the node (the agent's checkpoint).
# TYPE lace_agent_endpoints gauge
lace_agent_endpoints 2
# HELP lace_datapath_dropped_packets_total Packets the eBPF data plane dropped, by reason.
# TYPE lace_datapath_dropped_packets_total counter
lace_datapath_dropped_packets_total{reason="isolated"} 3
# HELP lace_datapath_map_entries Entries in each eBPF data plane map.
# TYPE lace_datapath_map_entries gauge
lace_datapath_map_entries{map="endpoints"} 4
# HELP lace_datapath_snat_exhausted_total New flows that found no free SNAT port, by outside destination (proto/address:port): the node's ports toward it were all held by live flows. The data plane keeps the last 1024 destinations.
# TYPE lace_datapath_snat_exhausted_total counter
lace_datapath_snat_exhausted_total{destination="udp/203.0.113.53:53"} 9
`
	if err := promtestutil.GatherAndCompare(reg, strings.NewReader(want),
		"lace_agent_endpoints", "lace_datapath_dropped_packets_total", "lace_datapath_map_entries", "lace_datapath_snat_exhausted_total"); err != nil {
		t.Error(err)
	}
	if n := promtestutil.CollectAndCount(newDPCollector(countingDP{newFakeDP()}, func() int { return 0 }),
		"lace_datapath_forwarded_packets_total"); n != 2 {
		t.Errorf("%d forwarded series, want 2", n)
	}
	// A second agent in the process (tests) leaves the first registered.
	if err := registerCollector(reg, newDPCollector(countingDP{newFakeDP()}, func() int { return 0 })); err != nil {
		t.Errorf("second registration: %v", err)
	}
}

package status

import (
	"context"
	"fmt"
	"net/netip"
	"strings"
	"testing"

	"github.com/cilium/ebpf"
	"github.com/prometheus/client_golang/prometheus"
	promtestutil "github.com/prometheus/client_golang/prometheus/testutil"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	lacev1 "github.com/lace-cni/lace/api/v1alpha1"
	"github.com/lace-cni/lace/internal/model"
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
	ta := newTestReporter(t)
	c := ta.c
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
	ta.endpoints++
	check(true, "new endpoint")
	check(false, "idle again")
}

// countingDP serves fixed counters and map sizes.
type countingDP struct{}

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
	if err := RegisterCollector(reg, NewCollector(countingDP{}, func() int { return 2 })); err != nil {
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
	if n := promtestutil.CollectAndCount(NewCollector(countingDP{}, func() int { return 0 }),
		"lace_datapath_forwarded_packets_total"); n != 2 {
		t.Errorf("%d forwarded series, want 2", n)
	}
	// A second agent in the process (tests) leaves the first registered.
	if err := RegisterCollector(reg, NewCollector(countingDP{}, func() int { return 0 })); err != nil {
		t.Errorf("second registration: %v", err)
	}
}

// TestNodeThatCannotWorkSaysSo: no IPv6 underlay address, an unreachable
// locator, a missing kernel feature each make the Ready condition False
// with its reason, a Warning Event on the Node and CNI STATUS fail; the
// condition is written once per change and recovery is reported.
func TestNodeThatCannotWorkSaysSo(t *testing.T) {
	ta := newTestReporter(t)
	c := ta.c
	ctx := context.Background()
	ready := func() (*metav1.Condition, string) {
		t.Helper()
		var u lacev1.UnderlayEndpoint
		if err := c.Get(ctx, types.NamespacedName{Name: "n1"}, &u); err != nil {
			t.Fatal(err)
		}
		return meta.FindStatusCondition(u.Status.Conditions, lacev1.UnderlayReady), u.ResourceVersion
	}
	event := func() string {
		select {
		case ev := <-ta.rec.Events:
			return ev
		default:
			return ""
		}
	}
	expect := func(status metav1.ConditionStatus, reason, eventPrefix string) {
		t.Helper()
		if err := ta.publishStatus(ctx); err != nil {
			t.Fatal(err)
		}
		cond, rv := ready()
		if cond == nil || cond.Status != status || cond.Reason != reason {
			t.Fatalf("Ready %+v, want %s/%s", cond, status, reason)
		}
		if ev := event(); !strings.HasPrefix(ev, eventPrefix) || (eventPrefix == "" && ev != "") {
			t.Errorf("event %q, want %q...", ev, eventPrefix)
		}
		// What CNI STATUS reports (cni.Server.cmdStatus).
		got, msg := ta.Problem()
		if status == metav1.ConditionTrue && got != "" {
			t.Errorf("health of a working node: %s: %s", got, msg)
		}
		if status == metav1.ConditionFalse && got != reason {
			t.Errorf("health: %s: %s, want %s", got, msg, reason)
		}
		// Nothing changed: nothing is written, no event.
		if err := ta.publishStatus(ctx); err != nil {
			t.Fatal(err)
		}
		if _, rv2 := ready(); rv2 != rv {
			t.Errorf("%s: an unchanged condition was written again", reason)
		}
		if ev := event(); ev != "" {
			t.Errorf("%s: repeated event %q", reason, ev)
		}
	}
	expect(metav1.ConditionTrue, lacev1.ReasonUnderlayReady, "")

	v6 := ta.node.addrs
	ta.node.addrs = []netip.Addr{netip.MustParseAddr("172.30.0.11")}
	expect(metav1.ConditionFalse, lacev1.ReasonNoIPv6Underlay, "Warning NoIPv6Underlay")
	ta.node.addrs = v6
	expect(metav1.ConditionTrue, lacev1.ReasonUnderlayReady, "Normal UnderlayReady")

	via := netip.MustParseAddr("fd00:30::12")
	ta.sync.mu.Lock()
	ta.sync.state.LocatorRoutes = []model.LocatorRoute{{Node: "n2", Locator: netip.MustParsePrefix("fd1a:ce:0:1::/64"), Via: via}}
	ta.sync.mu.Unlock()
	ta.node.unreachable[via] = true
	expect(metav1.ConditionFalse, lacev1.ReasonLocatorUnreachable, "Warning LocatorUnreachable")
	delete(ta.node.unreachable, via)
	expect(metav1.ConditionTrue, lacev1.ReasonUnderlayReady, "Normal UnderlayReady")

	// A kernel without tcx: the first apply failed and said why
	// (nodesync's TestAttachFailureIsKept).
	ta.sync.mu.Lock()
	ta.sync.attachErr = fmt.Errorf("attach tcx ingress eth0: %w", ebpf.ErrNotSupported)
	ta.sync.mu.Unlock()
	expect(metav1.ConditionFalse, lacev1.ReasonKernelFeatureMissing, "Warning KernelFeatureMissing")
}

package lacectl

import (
	"bytes"
	"context"
	"errors"
	"strings"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"

	lacev1 "github.com/lace-cni/lace/api/v1alpha1"
	"github.com/lace-cni/lace/internal/dpmetrics"
	"github.com/lace-cni/lace/pkg/scheme"
)

// TestStatusShowsCountersFromMetrics: map sizes come from the API, counters
// from the agents' metrics; a node whose agent cannot be scraped says why.
func TestStatusShowsCountersFromMetrics(t *testing.T) {
	c := fake.NewClientBuilder().WithScheme(scheme.Scheme).WithObjects(
		&lacev1.UnderlayEndpoint{ObjectMeta: metav1.ObjectMeta{Name: "n1"}, Spec: lacev1.UnderlayEndpointSpec{Node: "n1"},
			Status: lacev1.UnderlayEndpointStatus{Datapath: &lacev1.DatapathStatus{Endpoints: 2, Maps: map[string]int64{"endpoints": 2}}}},
		&lacev1.UnderlayEndpoint{ObjectMeta: metav1.ObjectMeta{Name: "n2"}, Spec: lacev1.UnderlayEndpointSpec{Node: "n2"}},
	).Build()
	src := func(_ context.Context, node string) (dpmetrics.Snapshot, error) {
		if node == "n2" {
			return dpmetrics.Snapshot{}, errors.New("no running lace-agent")
		}
		return dpmetrics.Snapshot{Forwarded: map[string]uint64{"local": 5, "encapsulated": 0},
			Dropped:       map[string]uint64{"isolated": 3, "no-endpoint": 0, "snat-failed": 7},
			SNATExhausted: map[string]uint64{"tcp/203.0.113.5:443": 7}}, nil
	}
	var out bytes.Buffer
	if err := Status(context.Background(), c, src, &out); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{
		"data plane: 2 endpoints", "maps: endpoints=2", "forwarded: encapsulated=0 local=5", "dropped: isolated=3 snat-failed=7\n",
		"snat exhausted: tcp/203.0.113.5:443=7\n",
		"data plane: not reported", "counters: unavailable: no running lace-agent",
	} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("missing %q in\n%s", want, out.String())
		}
	}
}

// Package lacectl holds the read-only views of lacectl. It needs nothing
// but a kubeconfig: agents publish their data plane summaries (endpoints,
// map sizes) in the API, and their counters on their metrics endpoints,
// which lacectl reads through the API server's pod proxy.
package lacectl

import (
	"context"
	"fmt"
	"io"
	"sort"
	"strings"
	"text/tabwriter"

	"sigs.k8s.io/controller-runtime/pkg/client"

	lacev1 "github.com/lace-cni/lace/api/v1alpha1"
	"github.com/lace-cni/lace/internal/dpmetrics"
	"github.com/lace-cni/lace/internal/model"
)

// CounterSource returns a node's data plane metrics (its agent's metrics
// endpoint).
type CounterSource func(ctx context.Context, node string) (dpmetrics.Snapshot, error)

// Status prints, per node, its endpoints by network, map sizes, and
// forwarding and drop counters by reason (from counters).
func Status(ctx context.Context, c client.Client, counters CounterSource, out io.Writer) error {
	var nets lacev1.NetworkList
	var ueps lacev1.UnderlayEndpointList
	var neps lacev1.NetworkEndpointList
	for _, l := range []client.ObjectList{&nets, &ueps, &neps} {
		if err := c.List(ctx, l); err != nil {
			return fmt.Errorf("list %T: %w", l, err)
		}
	}
	tw := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "NETWORK\tTYPE\tID\tSUBNETS\tANONYMOUS\tREADY")
	sort.Slice(nets.Items, func(i, j int) bool { return nets.Items[i].Name < nets.Items[j].Name })
	for _, n := range nets.Items {
		var subnets []string
		for _, s := range []*lacev1.Subnet{n.Spec.IPv4Subnet, n.Spec.IPv6Subnet} {
			if s != nil {
				subnets = append(subnets, string(s.Prefix))
			}
		}
		for _, p := range n.Spec.ExternalPrefixes {
			subnets = append(subnets, string(p))
		}
		ready := "False"
		for _, cond := range n.Status.Conditions {
			if cond.Type == lacev1.ConditionReady {
				ready = string(cond.Status)
			}
		}
		fmt.Fprintf(tw, "%s\t%s\t%d\t%s\t%v\t%s\n", n.Name, n.Spec.Type, n.Status.ID, strings.Join(subnets, ","), model.IsAnonymous(&n), ready)
	}
	tw.Flush()

	perNode := map[string]map[string]int{}
	for _, ne := range neps.Items {
		if perNode[ne.Spec.Node] == nil {
			perNode[ne.Spec.Node] = map[string]int{}
		}
		perNode[ne.Spec.Node][ne.Spec.Network]++
	}
	sort.Slice(ueps.Items, func(i, j int) bool { return ueps.Items[i].Name < ueps.Items[j].Name })
	for _, u := range ueps.Items {
		fmt.Fprintf(out, "\nnode %s  zone %s  locator %s  underlay %v\n", u.Name, u.Spec.Zone, u.Spec.Locator, u.Spec.Addresses)
		fmt.Fprintf(out, "  endpoints by network: %s\n", counts(perNode[u.Name]))
		if d := u.Status.Datapath; d != nil {
			fmt.Fprintf(out, "  data plane: %d endpoints\n", d.Endpoints)
			fmt.Fprintf(out, "  maps: %s\n", counts64(d.Maps, false))
		} else {
			fmt.Fprintln(out, "  data plane: not reported (is lace-agent running?)")
		}
		snap, err := counters(ctx, u.Name)
		if err != nil {
			fmt.Fprintf(out, "  counters: unavailable: %v\n", err)
			continue
		}
		fmt.Fprintf(out, "  forwarded: %s\n", countsU64(snap.Forwarded, false))
		fmt.Fprintf(out, "  dropped: %s\n", countsU64(snap.Dropped, true))
		// Which outside destinations ran out of SNAT ports (the maps line
		// above says how many mappings the node holds).
		fmt.Fprintf(out, "  snat exhausted: %s\n", countsU64(snap.SNATExhausted, true))
	}
	return nil
}

func counts(m map[string]int) string {
	m64 := map[string]int64{}
	for k, v := range m {
		m64[k] = int64(v)
	}
	return counts64(m64, false)
}

func countsU64(m map[string]uint64, skipZero bool) string {
	m64 := make(map[string]int64, len(m))
	for k, v := range m {
		m64[k] = int64(v)
	}
	return counts64(m64, skipZero)
}

// counts64 renders k=v pairs sorted by key; skipZero hides zero counters.
func counts64(m map[string]int64, skipZero bool) string {
	keys := make([]string, 0, len(m))
	for k, v := range m {
		if !skipZero || v != 0 {
			keys = append(keys, k)
		}
	}
	if len(keys) == 0 {
		return "none"
	}
	sort.Strings(keys)
	parts := make([]string, 0, len(keys))
	for _, k := range keys {
		parts = append(parts, fmt.Sprintf("%s=%d", k, m[k]))
	}
	return strings.Join(parts, " ")
}

package chaos

import (
	"fmt"
	"path/filepath"
	"slices"
	"strings"

	"github.com/cilium/ebpf"

	"github.com/lace-cni/lace/internal/datapath"
	"github.com/lace-cni/lace/lab"
)

// The harness reads the nodes' pinned maps raw, by key: loading the data
// plane (datapath.Load) would run the verifier on every program at each
// check, and a key set is what "nothing withdrawn" and "nothing left
// behind" are about.

// stateMaps are the maps the agent programs from the cluster's objects,
// not from its pods' lives: during a control plane outage, none may lose
// an entry.
var stateMaps = []string{"lace_routes", "lace_networks", "lace_nodes", "lace_node_locs", "lace_host_addrs",
	"lace_classify", "lace_inside", "lace_services", "lace_backends", "lace_endpoints", "lace_ports"}

// nodeState is every node's keys of stateMaps.
type nodeState map[string]map[string]map[string]bool

func (h *harness) nodeState() (nodeState, error) {
	out := nodeState{}
	for i := 1; i <= h.cfg.Nodes; i++ {
		node := h.cfg.NodeName(i)
		out[node] = map[string]map[string]bool{}
		for _, m := range stateMaps {
			keys, err := lab.MapKeys(h.cfg.PinDir(node), m)
			if err != nil {
				return nil, fmt.Errorf("node %s: %w", node, err)
			}
			out[node][m] = keys
		}
	}
	return out, nil
}

// diff describes the entries of s that now lacks ("" when none).
func (s nodeState) diff(now nodeState) string {
	var out []string
	for node, maps := range s {
		for m, keys := range maps {
			gone := 0
			for k := range keys {
				if !now[node][m][k] {
					gone++
				}
			}
			if gone > 0 {
				out = append(out, fmt.Sprintf("%s lost %d of %d entries of %s", node, gone, len(keys), m))
			}
		}
	}
	slices.Sort(out)
	return strings.Join(out, ", ")
}

// drops sums a drop reason's per-CPU counter on node.
func drops(c lab.Config, node, reason string) (uint64, error) {
	idx := slices.Index(datapath.DropReasons, reason)
	if idx < 0 {
		return 0, fmt.Errorf("no drop reason %q", reason)
	}
	m, err := ebpf.LoadPinnedMap(filepath.Join(c.PinDir(node), "lace_drops"), &ebpf.LoadPinOptions{ReadOnly: true})
	if err != nil {
		return 0, fmt.Errorf("node %s: open lace_drops: %w", node, err)
	}
	defer m.Close()
	var per []uint64
	if err := m.Lookup(uint32(idx), &per); err != nil {
		return 0, fmt.Errorf("node %s: read lace_drops: %w", node, err)
	}
	var sum uint64
	for _, v := range per {
		sum += v
	}
	return sum, nil
}

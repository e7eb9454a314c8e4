package chaos

import (
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/cilium/ebpf"

	"github.com/lace-cni/lace/internal/datapath"
	"github.com/lace-cni/lace/internal/netutil"
	"github.com/lace-cni/lace/lab"
)

// The harness reads the nodes' pinned maps raw, by key: loading the data
// plane (datapath.Load) would run the verifier on every program at each
// check, and a key set is what "nothing withdrawn" and "nothing left
// behind" are about.

func pinDir(c lab.Config, node string) string {
	return filepath.Join(c.NodeRoot(node), "sys/fs/bpf/lace")
}

// stateMaps are the maps the agent programs from the cluster's objects,
// not from its pods' lives: during a control plane outage, none may lose
// an entry.
var stateMaps = []string{"lace_routes", "lace_networks", "lace_nodes", "lace_node_locs", "lace_host_addrs",
	"lace_classify", "lace_inside", "lace_services", "lace_backends", "lace_endpoints", "lace_ports"}

// mapKeys returns the keys of a pinned map, hex-encoded.
func mapKeys(dir, name string) (map[string]bool, error) {
	m, err := ebpf.LoadPinnedMap(filepath.Join(dir, name), &ebpf.LoadPinOptions{ReadOnly: true})
	if err != nil {
		return nil, fmt.Errorf("open %s: %w", name, err)
	}
	defer m.Close()
	// Keys only: a key deleted while walking restarts the walk from the
	// first key (the kernel's get_next_key), which a set absorbs.
	out := map[string]bool{}
	var prev any
	for {
		next, err := m.NextKeyBytes(prev)
		if err != nil {
			return nil, fmt.Errorf("read %s: %w", name, err)
		}
		if next == nil {
			return out, nil
		}
		k := hex.EncodeToString(next)
		if out[k] {
			return out, nil
		}
		out[k] = true
		prev = next
	}
}

// nodeState is every node's keys of stateMaps.
type nodeState map[string]map[string]map[string]bool

func (h *harness) nodeState() (nodeState, error) {
	out := nodeState{}
	for i := 1; i <= h.cfg.Nodes; i++ {
		node := h.cfg.NodeName(i)
		out[node] = map[string]map[string]bool{}
		for _, m := range stateMaps {
			keys, err := mapKeys(pinDir(h.cfg, node), m)
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
	m, err := ebpf.LoadPinnedMap(filepath.Join(pinDir(c, node), "lace_drops"), &ebpf.LoadPinOptions{ReadOnly: true})
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

// residue is what a node holds for its pods: veths, endpoint and port
// entries, and checkpointed endpoints.
type residue struct {
	Veths, Endpoints, Ports, Checkpointed int
}

func nodeResidue(c lab.Config, node string) (residue, error) {
	var r residue
	links, err := netutil.ListLinks(netutil.Path(c.NetNS(node)))
	if err != nil {
		return r, err
	}
	for _, l := range links {
		if strings.HasPrefix(l, datapath.PodIfPrefix) {
			r.Veths++
		}
	}
	eps, err1 := mapKeys(pinDir(c, node), "lace_endpoints")
	ports, err2 := mapKeys(pinDir(c, node), "lace_ports")
	if err := errors.Join(err1, err2); err != nil {
		return r, err
	}
	r.Endpoints, r.Ports = len(eps), len(ports)
	b, err := os.ReadFile(filepath.Join(c.NodeRoot(node), "var/lib/lace/endpoints.json"))
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return r, err
	}
	if err == nil {
		var list []json.RawMessage
		if err := json.Unmarshal(b, &list); err != nil {
			return r, fmt.Errorf("node %s checkpoint: %w", node, err)
		}
		r.Checkpointed = len(list)
	}
	return r, nil
}

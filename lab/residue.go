package lab

import (
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/cilium/ebpf"
	corev1 "k8s.io/api/core/v1"

	"github.com/lace-cni/lace/internal/datapath"
	"github.com/lace-cni/lace/internal/netutil"
)

// Residue is what a node holds for its pods: veths, the data plane's
// endpoint and port entries, and the agent's checkpointed endpoints. A
// node whose residue is what its pods need (PodsResidue) leaked nothing.
type Residue struct {
	Veths, Endpoints, Ports, Checkpointed int
}

// PinDir is where node's agent pins the data plane's maps, as the
// machine sees it.
func (c Config) PinDir(node string) string {
	return filepath.Join(c.NodeRoot(node), "sys/fs/bpf/lace")
}

// NodeResidue reads what node holds. The maps are read raw, by key:
// loading the data plane would run the verifier on every program.
func NodeResidue(c Config, node string) (Residue, error) {
	var r Residue
	links, err := netutil.ListLinks(netutil.Path(c.NetNS(node)))
	if err != nil {
		return r, err
	}
	for _, l := range links {
		if strings.HasPrefix(l, datapath.PodIfPrefix) {
			r.Veths++
		}
	}
	eps, err1 := MapKeys(c.PinDir(node), "lace_endpoints")
	ports, err2 := MapKeys(c.PinDir(node), "lace_ports")
	if err := errors.Join(err1, err2); err != nil {
		return r, fmt.Errorf("node %s: %w", node, err)
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

// PodsResidue is what each node must hold for pods: a veth, a port and a
// checkpointed endpoint per pod with addresses, an endpoint entry per
// address (host-network pods hold none).
func PodsResidue(pods []corev1.Pod) map[string]Residue {
	want := map[string]Residue{}
	for _, p := range pods {
		if p.Spec.HostNetwork || p.Spec.NodeName == "" || len(p.Status.PodIPs) == 0 {
			continue
		}
		r := want[p.Spec.NodeName]
		r.Veths++
		r.Ports++
		r.Checkpointed++
		r.Endpoints += len(p.Status.PodIPs)
		want[p.Spec.NodeName] = r
	}
	return want
}

// MapKeys returns the keys of a map pinned in dir, hex-encoded, read
// only.
func MapKeys(dir, name string) (map[string]bool, error) {
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

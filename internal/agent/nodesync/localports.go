package nodesync

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"

	"github.com/lace-cni/lace/internal/model"
)

// localPorts keeps the node's net.ipv4.ip_local_reserved_ports (which
// covers IPv6 and both protocols) holding the ports whose traffic the
// data plane takes from the node's own sockets: the hostPorts it serves
// and the SNAT range. The kernel then never gives a node socket one of
// them as its ephemeral port, so a node client's answers are never taken
// for a hostPort's or a pod's SNAT flow (the operator may have widened
// ip_local_port_range into the SNAT range), and a node client never holds
// a port a pod's hostPort was given. An explicit bind still works: a node
// server on such a port is a listener, and the next sync refuses the
// hostPort (nodeListeners). Cilium reserves its proxy ports the same way.
//
// The operator's own reservations are kept: the value found at the
// agent's first sync of a boot is the baseline (remembered in the state
// directory with the boot's ID, so that a restarted agent does not take
// its own ports for the operator's), and the agent writes the baseline
// and its ports.
type localPorts struct {
	sysctl string // the sysctl's file; empty: leave it alone
	state  string // where the boot's baseline is kept
	bootID string // file holding the boot's ID

	mu       sync.Mutex
	baseline *string
	written  string
}

func newLocalPorts(sysctl, stateDir string) *localPorts {
	return &localPorts{sysctl: sysctl, state: filepath.Join(stateDir, "local-reserved-ports"),
		bootID: "/proc/sys/kernel/random/boot_id"}
}

// reserve makes the sysctl the baseline and the SNAT range and ports.
func (l *localPorts) reserve(ports []uint16) error {
	if l == nil || l.sysctl == "" {
		return nil
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.baseline == nil {
		b, err := l.loadBaseline()
		if err != nil {
			return err
		}
		l.baseline = &b
	}
	want := joinPortList(*l.baseline, portRanges(ports))
	if want == l.written {
		return nil
	}
	if err := os.WriteFile(l.sysctl, []byte(want+"\n"), 0o644); err != nil {
		return fmt.Errorf("write %s: %w", l.sysctl, err)
	}
	l.written = want
	return nil
}

// loadBaseline returns the operator's reservations of this boot: the
// remembered ones when the state file is of this boot, else the
// sysctl's value now (remembered for the agents after this one).
func (l *localPorts) loadBaseline() (string, error) {
	id, err := os.ReadFile(l.bootID)
	if err != nil {
		return "", fmt.Errorf("boot id: %w", err)
	}
	id = bytes.TrimSpace(id)
	if b, err := os.ReadFile(l.state); err == nil {
		if first, rest, ok := bytes.Cut(b, []byte("\n")); ok && bytes.Equal(first, id) {
			return strings.TrimSpace(string(rest)), nil
		}
	}
	cur, err := os.ReadFile(l.sysctl)
	if err != nil {
		return "", fmt.Errorf("read %s: %w", l.sysctl, err)
	}
	base := strings.TrimSpace(string(cur))
	if err := os.MkdirAll(filepath.Dir(l.state), 0o700); err != nil {
		return "", fmt.Errorf("state dir: %w", err)
	}
	if err := os.WriteFile(l.state, []byte(string(id)+"\n"+base+"\n"), 0o600); err != nil {
		return "", fmt.Errorf("remember the reserved ports baseline: %w", err)
	}
	return base, nil
}

// portRanges is ports and the SNAT range as the sysctl's list: sorted,
// adjacent ports joined into ranges.
func portRanges(ports []uint16) string {
	ps := make([]int, 0, len(ports))
	for _, p := range ports {
		if p > 0 && int(p) < model.SNATPortMin {
			ps = append(ps, int(p))
		}
	}
	slices.Sort(ps)
	ps = slices.Compact(ps)
	var b strings.Builder
	add := func(lo, hi int) {
		if b.Len() > 0 {
			b.WriteByte(',')
		}
		b.WriteString(strconv.Itoa(lo))
		if hi > lo {
			b.WriteString("-" + strconv.Itoa(hi))
		}
	}
	for i := 0; i < len(ps); {
		j := i
		for j+1 < len(ps) && ps[j+1] == ps[j]+1 {
			j++
		}
		add(ps[i], ps[j])
		i = j + 1
	}
	add(model.SNATPortMin, 65535)
	return b.String()
}

func joinPortList(a, b string) string {
	switch {
	case a == "":
		return b
	case b == "":
		return a
	}
	return a + "," + b
}

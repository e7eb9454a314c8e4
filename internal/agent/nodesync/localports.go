package nodesync

import (
	"bytes"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"

	"github.com/lace-cni/lace/internal/fsutil"
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
// Everyone else's reservations are kept, whenever they were made: each
// sync reads the sysctl, takes every port the agent did not add as
// someone else's, and writes that and the agent's ports back (only when
// they differ). So a reservation an operator or a tuning daemon adds
// later survives the agent's next write, and a rewrite by another writer
// (`sysctl --system`) is repaired at the next sync. What the agent added
// is remembered in the state directory with the boot's ID, written before
// the sysctl, so that a restarted agent does not take its predecessor's
// ports for someone else's. The list stays under one page: the kernel
// parses a longer value in several writes, and the reservations after the
// first page would be missing in between.
type localPorts struct {
	sysctl string // the sysctl's file; empty: leave it alone
	state  string // where the boot's record is kept
	bootID string // file holding the boot's ID

	mu     sync.Mutex
	loaded bool
	others portSet // ports someone else reserved
	own    portSet // ports the agent added
	// settled is the sysctl's value as a sync found it right for the
	// ports settledFor: the same value and ports again need no
	// computation (each sync asks).
	settled    string
	settledFor []uint16
}

func newLocalPorts(sysctl, stateDir string) *localPorts {
	return &localPorts{sysctl: sysctl, state: filepath.Join(stateDir, "local-reserved-ports"),
		bootID: "/proc/sys/kernel/random/boot_id"}
}

// maxPortList keeps the sysctl's value within one write(2): the kernel's
// proc_do_large_bitmap parses at most PAGE_SIZE-1 bytes of it at a time.
const maxPortList = 4000

// reserve makes the sysctl everyone else's reservations, the SNAT range
// and ports.
func (l *localPorts) reserve(ports []uint16) error {
	if l == nil || l.sysctl == "" {
		return nil
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	raw, err := os.ReadFile(l.sysctl)
	if err != nil {
		return fmt.Errorf("read %s: %w", l.sysctl, err)
	}
	if l.loaded && string(raw) == l.settled && slices.Equal(ports, l.settledFor) {
		return nil
	}
	cur, err := parsePortList(string(raw))
	if err != nil {
		return fmt.Errorf("read %s: %w", l.sysctl, err)
	}
	id, err := os.ReadFile(l.bootID)
	if err != nil {
		return fmt.Errorf("boot id: %w", err)
	}
	id = bytes.TrimSpace(id)
	if !l.loaded {
		l.others, l.own = cur, portSet{}
		if others, own, ok := l.load(id); ok {
			l.others, l.own = others, own
		}
		l.loaded = true
	}
	// Someone else's: what the sysctl holds that the agent did not add,
	// and what both reserved while it still holds it.
	others := cur.minus(l.own).union(l.others.intersect(l.own).intersect(cur))
	var ours portSet
	for _, p := range ports {
		if p > 0 && int(p) < model.SNATPortMin {
			ours.add(int(p))
		}
	}
	for p := model.SNATPortMin; p <= 65535; p++ {
		ours.add(p)
	}
	want := others.union(ours).fitList(maxPortList)
	own := want.minus(others)
	if want == cur && own == l.own && others == l.others {
		l.settled, l.settledFor = string(raw), slices.Clone(ports)
		return nil
	}
	// The record first: an agent that dies between the two writes leaves
	// ports its successor knows as its own, never ports taken for
	// someone else's for the rest of the boot.
	if err := l.save(id, others, own); err != nil {
		return err
	}
	l.others, l.own = others, own
	if want != cur {
		if err := os.WriteFile(l.sysctl, []byte(want.String()+"\n"), 0o644); err != nil {
			return fmt.Errorf("write %s: %w", l.sysctl, err)
		}
	}
	return nil
}

// load reads the record of boot id.
func (l *localPorts) load(id []byte) (others, own portSet, ok bool) {
	b, err := os.ReadFile(l.state)
	if err != nil {
		return others, own, false
	}
	lines := strings.Split(string(b), "\n")
	if len(lines) < 3 || lines[0] != string(id) {
		return others, own, false
	}
	others, err1 := parsePortList(lines[1])
	own, err2 := parsePortList(lines[2])
	return others, own, err1 == nil && err2 == nil
}

func (l *localPorts) save(id []byte, others, own portSet) error {
	if err := os.MkdirAll(filepath.Dir(l.state), 0o700); err != nil {
		return fmt.Errorf("state dir: %w", err)
	}
	data := string(id) + "\n" + others.String() + "\n" + own.String() + "\n"
	if err := fsutil.WriteAtomic(l.state, 0o600, func(w io.Writer) error {
		_, err := io.WriteString(w, data)
		return err
	}); err != nil {
		return fmt.Errorf("remember the agent's reserved ports: %w", err)
	}
	return nil
}

// portSet is a set of ports, 0-65535.
type portSet [65536 / 64]uint64

func (s *portSet) add(p int)      { s[p/64] |= 1 << (p % 64) }
func (s *portSet) has(p int) bool { return s[p/64]&(1<<(p%64)) != 0 }
func (s portSet) minus(o portSet) portSet {
	for i := range s {
		s[i] &^= o[i]
	}
	return s
}
func (s portSet) union(o portSet) portSet {
	for i := range s {
		s[i] |= o[i]
	}
	return s
}
func (s portSet) intersect(o portSet) portSet {
	for i := range s {
		s[i] &= o[i]
	}
	return s
}

type portRange struct{ lo, hi int }

func (s *portSet) ranges() []portRange {
	var rs []portRange
	for p := 0; p < 65536; p++ {
		if !s.has(p) {
			continue
		}
		lo := p
		for p+1 < 65536 && s.has(p+1) {
			p++
		}
		rs = append(rs, portRange{lo, p})
	}
	return rs
}

// String is the sysctl's list, as the kernel prints it: sorted, adjacent
// ports joined into ranges.
func (s portSet) String() string {
	return formatRanges(s.ranges())
}

func formatRanges(rs []portRange) string {
	var b strings.Builder
	for i, r := range rs {
		if i > 0 {
			b.WriteByte(',')
		}
		b.WriteString(strconv.Itoa(r.lo))
		if r.hi > r.lo {
			b.WriteString("-" + strconv.Itoa(r.hi))
		}
	}
	return b.String()
}

// fitList fills the narrowest gaps between reserved ranges until the list
// is at most max bytes long. Reserving a few more ports only keeps them
// from being chosen as ephemeral ports; an explicit bind still works.
func (s portSet) fitList(max int) portSet {
	rs := s.ranges()
	for len(rs) > 1 && len(formatRanges(rs)) > max {
		best := 1
		for i := 2; i < len(rs); i++ {
			if rs[i].lo-rs[i-1].hi < rs[best].lo-rs[best-1].hi {
				best = i
			}
		}
		for p := rs[best-1].hi + 1; p < rs[best].lo; p++ {
			s.add(p)
		}
		rs[best-1].hi = rs[best].hi
		rs = append(rs[:best], rs[best+1:]...)
	}
	return s
}

// parsePortList reads the sysctl's format: comma-separated ports and
// lo-hi ranges.
func parsePortList(v string) (portSet, error) {
	var s portSet
	for _, f := range strings.Split(strings.TrimSpace(v), ",") {
		f = strings.TrimSpace(f)
		if f == "" {
			continue
		}
		loS, hiS, isRange := strings.Cut(f, "-")
		lo, err := strconv.Atoi(loS)
		hi := lo
		if err == nil && isRange {
			hi, err = strconv.Atoi(hiS)
		}
		if err != nil || lo < 0 || hi > 65535 || lo > hi {
			return s, fmt.Errorf("bad port list entry %q", f)
		}
		for p := lo; p <= hi; p++ {
			s.add(p)
		}
	}
	return s, nil
}

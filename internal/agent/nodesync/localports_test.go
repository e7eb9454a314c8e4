package nodesync

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestLocalPorts: the node's reserved ports become the operator's (as the
// first agent of the boot found them) and the served hostPorts and the
// SNAT range; a restarted agent of the same boot keeps the operator's
// baseline, not its predecessor's ports; a new boot takes the value then
// as the baseline.
func TestLocalPorts(t *testing.T) {
	dir := t.TempDir()
	sysctl, boot, state := filepath.Join(dir, "ip_local_reserved_ports"), filepath.Join(dir, "boot_id"), filepath.Join(dir, "state")
	write := func(path, s string) {
		t.Helper()
		if err := os.WriteFile(path, []byte(s), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	read := func() string {
		t.Helper()
		b, err := os.ReadFile(sysctl)
		if err != nil {
			t.Fatal(err)
		}
		return strings.TrimSpace(string(b))
	}
	agent := func() *localPorts {
		l := newLocalPorts(sysctl, state)
		l.bootID = boot
		return l
	}
	write(sysctl, "3260,9000-9001\n")
	write(boot, "boot-1\n")

	a := agent()
	if err := a.reserve([]uint16{8080, 8081, 8082, 443, 8080, 62000}); err != nil {
		t.Fatal(err)
	}
	if got, want := read(), "443,3260,8080-8082,9000-9001,61000-65535"; got != want {
		t.Errorf("first agent wrote %q, want %q", got, want)
	}
	// A restart of the same boot: 8080-8082 are no longer served.
	b := agent()
	if err := b.reserve([]uint16{443}); err != nil {
		t.Fatal(err)
	}
	if got, want := read(), "443,3260,9000-9001,61000-65535"; got != want {
		t.Errorf("restarted agent wrote %q, want %q (its predecessor's ports are not the operator's)", got, want)
	}
	// A new boot: the sysctl holds what the operator configured.
	write(boot, "boot-2\n")
	write(sysctl, "5000\n")
	c := agent()
	if err := c.reserve(nil); err != nil {
		t.Fatal(err)
	}
	if got, want := read(), "5000,61000-65535"; got != want {
		t.Errorf("new boot's agent wrote %q, want %q", got, want)
	}
	// No file: nothing is touched.
	if err := newLocalPorts("", state).reserve([]uint16{1}); err != nil {
		t.Errorf("disabled: %v", err)
	}
}

// localPortsLab is a sysctl file, a boot ID and an agent's state dir.
type localPortsLab struct {
	t                   *testing.T
	sysctl, boot, state string
}

func newLocalPortsLab(t *testing.T, sysctl string) *localPortsLab {
	dir := t.TempDir()
	l := &localPortsLab{t, filepath.Join(dir, "ip_local_reserved_ports"), filepath.Join(dir, "boot_id"), filepath.Join(dir, "state")}
	l.write(l.boot, "boot-1\n")
	l.write(l.sysctl, sysctl+"\n")
	return l
}

func (l *localPortsLab) write(path, s string) {
	l.t.Helper()
	if err := os.WriteFile(path, []byte(s), 0o644); err != nil {
		l.t.Fatal(err)
	}
}

func (l *localPortsLab) read() string {
	l.t.Helper()
	b, err := os.ReadFile(l.sysctl)
	if err != nil {
		l.t.Fatal(err)
	}
	return strings.TrimSpace(string(b))
}

func (l *localPortsLab) agent() *localPorts {
	a := newLocalPorts(l.sysctl, l.state)
	a.bootID = l.boot
	return a
}

func (l *localPortsLab) reserve(a *localPorts, ports ...uint16) {
	l.t.Helper()
	if err := a.reserve(ports); err != nil {
		l.t.Fatal(err)
	}
}

// TestLocalPortsKeepLaterReservations: a reservation someone else makes
// after the agent's first sync (an operator, a tuning daemon) survives the
// agent's next write, which a tenant triggers at will with a hostPort pod;
// one they drop stays dropped; a restarted agent knows its own ports.
func TestLocalPortsKeepLaterReservations(t *testing.T) {
	l := newLocalPortsLab(t, "3260")
	a := l.agent()
	l.reserve(a, 8080)
	l.write(l.sysctl, l.read()+",2049\n") // nfsd, reserved later
	l.reserve(a, 8080, 40000)
	if got, want := l.read(), "2049,3260,8080,40000,61000-65535"; got != want {
		t.Errorf("after a later reservation: %q, want %q", got, want)
	}
	l.write(l.sysctl, strings.Replace(l.read(), "3260,", "", 1)+"\n") // the operator drops 3260
	b := l.agent()                                                    // and the agent restarts
	l.reserve(b, 40000)
	if got, want := l.read(), "2049,40000,61000-65535"; got != want {
		t.Errorf("after a drop and a restart: %q, want %q", got, want)
	}
}

// TestLocalPortsRepairOutsideRewrite: another writer replacing the whole
// value (`sysctl --system`) loses the served hostPorts and the SNAT range
// only until the agent's next sync, even when its hostPorts did not
// change.
func TestLocalPortsRepairOutsideRewrite(t *testing.T) {
	l := newLocalPortsLab(t, "")
	a := l.agent()
	l.reserve(a, 8080)
	l.write(l.sysctl, "5000\n")
	l.reserve(a, 8080)
	if got, want := l.read(), "5000,8080,61000-65535"; got != want {
		t.Errorf("after an outside rewrite: %q, want %q", got, want)
	}
}

// TestLocalPortsFitOnePage: the kernel parses at most a page of the list
// per write(2), so a longer one leaves its tail unreserved between writes.
// A node's 1,024 hostPorts on scattered ports would need 6 KB; the list is
// kept under a page by reserving the narrowest gaps too, and every served
// port, the SNAT range and the operator's ports stay in it.
func TestLocalPortsFitOnePage(t *testing.T) {
	l := newLocalPortsLab(t, "1024")
	var ports []uint16
	for p := 30001; len(ports) < 1024; p += 2 {
		ports = append(ports, uint16(p))
	}
	l.reserve(l.agent(), ports...)
	got := l.read()
	if len(got) > maxPortList {
		t.Errorf("list is %d bytes, want at most %d", len(got), maxPortList)
	}
	s, err := parsePortList(got)
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range append(ports, 1024, 61000, 65535) {
		if !s.has(int(p)) {
			t.Errorf("port %d not reserved", p)
		}
	}
}

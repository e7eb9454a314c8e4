package agent

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// Hostile review rev18 (PoC, failing on purpose).
//
// TestRev18LocalPortsLaterOperatorReservationDropped: the baseline is
// frozen at the first sync of the boot. A reservation the operator (or a
// node daemon, a tuning DaemonSet that ran after the CNI agent) adds later
// is wiped by the agent's next write, and a tenant triggers that write at
// will by creating or deleting a hostPort pod on the node.
func TestRev18LocalPortsLaterOperatorReservationDropped(t *testing.T) {
	dir := t.TempDir()
	sysctl, boot := filepath.Join(dir, "ip_local_reserved_ports"), filepath.Join(dir, "boot_id")
	must(t, os.WriteFile(sysctl, []byte("3260\n"), 0o644))
	must(t, os.WriteFile(boot, []byte("boot-1\n"), 0o644))
	l := newLocalPorts(sysctl, filepath.Join(dir, "state"))
	l.bootID = boot
	must(t, l.reserve([]uint16{8080}))
	// The operator reserves 2049 (nfsd) after the agent started.
	cur, _ := os.ReadFile(sysctl)
	must(t, os.WriteFile(sysctl, []byte(strings.TrimSpace(string(cur))+",2049\n"), 0o644))
	// A tenant creates a hostPort pod: the agent rewrites the sysctl.
	must(t, l.reserve([]uint16{8080, 40000}))
	got, _ := os.ReadFile(sysctl)
	if !strings.Contains(string(got), "2049") {
		t.Errorf("operator's later reservation 2049 dropped by a tenant-triggered rewrite: sysctl now %q", strings.TrimSpace(string(got)))
	}
}

// TestRev18LocalPortsOverwriteNotRestored: the agent compares with what it
// wrote last, never with the sysctl: when something else rewrites the
// sysctl (a tuning daemon applying its profile, `sysctl --system`), the
// served hostPorts and the SNAT range stay unreserved until the hostPort
// set changes, however many syncs pass.
func TestRev18LocalPortsOverwriteNotRestored(t *testing.T) {
	dir := t.TempDir()
	sysctl, boot := filepath.Join(dir, "ip_local_reserved_ports"), filepath.Join(dir, "boot_id")
	must(t, os.WriteFile(sysctl, []byte("\n"), 0o644))
	must(t, os.WriteFile(boot, []byte("boot-1\n"), 0o644))
	l := newLocalPorts(sysctl, filepath.Join(dir, "state"))
	l.bootID = boot
	must(t, l.reserve([]uint16{8080}))
	must(t, os.WriteFile(sysctl, []byte("\n"), 0o644)) // sysctl --system
	for i := 0; i < 3; i++ {                           // later syncs, same hostPorts
		must(t, l.reserve([]uint16{8080}))
	}
	got, _ := os.ReadFile(sysctl)
	if !strings.Contains(string(got), "8080") || !strings.Contains(string(got), "61000-65535") {
		t.Errorf("served hostPort 8080 and the SNAT range not restored after an outside rewrite: sysctl %q", strings.TrimSpace(string(got)))
	}
}

// TestRev18LocalPortsOnePage: proc_do_large_bitmap parses at most
// PAGE_SIZE-1 bytes per write(2); a longer value is applied in several
// writes (the first replaces the bitmap, the next ones OR into it), so
// between them the node runs without the tail of the list: the SNAT
// range, written last. A node's 1024 hostPort entries (four namespaces at
// their share, one entry each with a specific hostIP) on non-adjacent
// ports make the list longer than a page.
func TestRev18LocalPortsOnePage(t *testing.T) {
	var ports []uint16
	for p := 30001; len(ports) < 1024; p += 2 {
		ports = append(ports, uint16(p))
	}
	if s := portRanges(ports); len(s) >= 4095 {
		t.Errorf("reserved list is %d bytes: written in %d write(2)s, the SNAT range (last) unreserved in between", len(s), (len(s)+4094)/4095)
	}
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

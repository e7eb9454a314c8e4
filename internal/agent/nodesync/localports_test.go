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
	if got, want := read(), "3260,9000-9001,443,8080-8082,61000-65535"; got != want {
		t.Errorf("first agent wrote %q, want %q", got, want)
	}
	// A restart of the same boot: 8080-8082 are no longer served.
	b := agent()
	if err := b.reserve([]uint16{443}); err != nil {
		t.Fatal(err)
	}
	if got, want := read(), "3260,9000-9001,443,61000-65535"; got != want {
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

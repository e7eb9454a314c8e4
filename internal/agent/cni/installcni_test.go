package cni

import (
	"bytes"
	"encoding/json"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/lace-cni/lace/internal/fsutil"
)

func TestInstallCNIWritesPluginAndConfig(t *testing.T) {
	dir := t.TempDir()
	bin := filepath.Join(dir, "lace-cni")
	if err := os.WriteFile(bin, []byte("plugin v1"), 0o600); err != nil {
		t.Fatal(err)
	}
	o := InstallCNIOptions{Binary: bin, BinDir: filepath.Join(dir, "host/opt/cni/bin"),
		ConfDir: filepath.Join(dir, "host/etc/cni/net.d"), AgentSocket: "/run/lace/cni.sock"}
	if err := InstallCNI(o); err != nil {
		t.Fatal(err)
	}

	plugin := filepath.Join(o.BinDir, "lace")
	assertFile(t, plugin, "plugin v1", 0o755)
	b, err := os.ReadFile(filepath.Join(o.ConfDir, "10-lace.conflist"))
	if err != nil {
		t.Fatal(err)
	}
	var conf map[string]any
	if err := json.Unmarshal(b, &conf); err != nil {
		t.Fatalf("conflist is not JSON: %v\n%s", err, b)
	}
	var want map[string]any
	_ = json.Unmarshal([]byte(`{"cniVersion":"1.0.0","cniVersions":["1.0.0","1.1.0"],"name":"lace","plugins":[{"type":"lace","agentSocket":"/run/lace/cni.sock"}]}`), &want)
	if g, w := mustJSON(t, conf), mustJSON(t, want); g != w {
		t.Errorf("conflist\n got %s\nwant %s", g, w)
	}
	if fi, err := os.Stat(filepath.Join(o.ConfDir, "10-lace.conflist")); err != nil || fi.Mode().Perm() != 0o644 {
		t.Errorf("conflist mode: %v %v, want 0644", fi.Mode().Perm(), err)
	}

	// A new image overwrites both; nothing else is left in the directories.
	if err := os.WriteFile(bin, []byte("plugin v2"), 0o600); err != nil {
		t.Fatal(err)
	}
	o.AgentSocket = "/var/run/other.sock"
	if err := InstallCNI(o); err != nil {
		t.Fatalf("second install: %v", err)
	}
	assertFile(t, plugin, "plugin v2", 0o755)
	b, _ = os.ReadFile(filepath.Join(o.ConfDir, "10-lace.conflist"))
	if !bytes.Contains(b, []byte(`"/var/run/other.sock"`)) {
		t.Errorf("conflist not rewritten: %s", b)
	}
	for _, d := range []string{o.BinDir, o.ConfDir} {
		ents, _ := os.ReadDir(d)
		if len(ents) != 1 {
			var names []string
			for _, e := range ents {
				names = append(names, e.Name())
			}
			t.Errorf("%s holds %v, want exactly one file (temp files left behind?)", d, names)
		}
	}
}

func TestInstallCNIMissingBinaryLeavesNodeUntouched(t *testing.T) {
	dir := t.TempDir()
	binDir := filepath.Join(dir, "bin")
	if err := os.MkdirAll(binDir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(binDir, "lace"), []byte("old"), 0o755); err != nil {
		t.Fatal(err)
	}
	err := InstallCNI(InstallCNIOptions{Binary: filepath.Join(dir, "nope"), BinDir: binDir,
		ConfDir: filepath.Join(dir, "net.d"), AgentSocket: "/run/lace/cni.sock"})
	if err == nil || !strings.Contains(err.Error(), "cni binary") {
		t.Fatalf("err = %v, want an error naming the cni binary", err)
	}
	assertFile(t, filepath.Join(binDir, "lace"), "old", 0o755)
	if _, err := os.Stat(filepath.Join(dir, "net.d", "10-lace.conflist")); !os.IsNotExist(err) {
		t.Errorf("config written although the plugin was not installed: %v", err)
	}
}

func TestWriteAtomicFailureKeepsOldFile(t *testing.T) {
	dir := t.TempDir()
	p := filepath.Join(dir, "f")
	if err := os.WriteFile(p, []byte("old"), 0o644); err != nil {
		t.Fatal(err)
	}
	err := fsutil.WriteAtomic(p, 0o644, func(w io.Writer) error {
		_, _ = w.Write([]byte("partial"))
		return os.ErrClosed
	})
	if err == nil {
		t.Fatal("writeAtomic returned nil although fill failed")
	}
	assertFile(t, p, "old", 0o644)
	if ents, _ := os.ReadDir(dir); len(ents) != 1 {
		t.Errorf("temp file left behind: %d entries", len(ents))
	}
}

func assertFile(t *testing.T, path, content string, mode os.FileMode) {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if string(b) != content {
		t.Errorf("%s = %q, want %q", path, b, content)
	}
	fi, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	if fi.Mode().Perm() != mode {
		t.Errorf("%s mode %v, want %v", path, fi.Mode().Perm(), mode)
	}
}

func mustJSON(t *testing.T, v any) string {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

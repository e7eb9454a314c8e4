package images

import (
	"archive/tar"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/lace-cni/lace/internal/testutil"
)

func TestE2EAgnhostImage(t *testing.T) {
	tools := []File{
		E2EShell,
		{Path: "usr/bin/dash", Mode: 0o755, Data: []byte("dash")},
		{Path: "usr/bin/nc", Mode: 0o755, Data: []byte("openbsd nc")},
		{Path: "usr/bin/curl", Mode: 0o755, Data: []byte("curl")},
		{Path: "lib64/ld-linux-x86-64.so.2", Mode: 0o755, Data: []byte("ld")},
		{Path: "lib/x86_64-linux-gnu/libc.so.6", Mode: 0o644, Data: []byte("libc")},
		// A second tool's copy of a shared library is dropped.
		{Path: "/lib/x86_64-linux-gnu/libc.so.6", Mode: 0o644, Data: []byte("libc")},
	}
	img, err := E2EAgnhostImage([]byte("fake agnhost"), []byte("fake busybox"), []string{"bin/sh", "usr/bin/nc", "usr/bin/wget"}, tools)
	if err != nil {
		t.Fatal(err)
	}
	p := filepath.Join(t.TempDir(), E2EAgnhostTar)
	if err := WriteTarball(p, E2EAgnhostRef, img); err != nil {
		t.Fatal(err)
	}
	_, files := readBack(t, p, E2EAgnhostRef)
	// busybox's nc applet gives way to the tool.
	if e := files["usr/bin/nc"]; e.typ != tar.TypeReg || e.data != "openbsd nc" {
		t.Errorf("usr/bin/nc: %+v, want the tool", e)
	}
	if e := files["usr/bin/wget"]; e.typ != tar.TypeSymlink || e.link != "/bin/busybox" {
		t.Errorf("usr/bin/wget: %+v, want busybox", e)
	}
	// /bin/sh is dash, not busybox (which would prefer its own applets).
	if e := files["bin/sh"]; e.typ != tar.TypeSymlink || e.link != "/usr/bin/dash" {
		t.Errorf("bin/sh: %+v, want dash", e)
	}
	for f, want := range map[string]string{
		"agnhost": "fake agnhost", "bin/busybox": "fake busybox", "usr/bin/curl": "curl",
		"lib/x86_64-linux-gnu/libc.so.6": "libc", "etc/nsswitch.conf": "hosts: files dns\n",
	} {
		if e := files[f]; e.typ != tar.TypeReg || e.data != want {
			t.Errorf("%s: %+v, want %q", f, e, want)
		}
	}
	if _, ok := files["agnhost-2"]; !ok {
		t.Error("agnhost-2 missing")
	}
	cf, err := img.ConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	if c := cf.Config; !reflect.DeepEqual(c.Entrypoint, []string{"/agnhost"}) || !reflect.DeepEqual(c.Cmd, []string{"pause"}) {
		t.Errorf("config: entrypoint %q cmd %q", c.Entrypoint, c.Cmd)
	}
}

func TestHostProgram(t *testing.T) {
	// Debian's /bin/sh (dash) is dynamically linked against libc.
	files, err := HostProgram("/bin/sh", "dash")
	if err != nil {
		t.Fatal(err)
	}
	paths := map[string]bool{}
	for _, f := range files {
		paths[f.Path] = true
	}
	if !paths["usr/bin/dash"] {
		t.Errorf("no usr/bin/dash in %v", paths)
	}
	hasLibc, hasLoader := false, false
	for p := range paths {
		hasLibc = hasLibc || strings.HasSuffix(p, "/libc.so.6")
		hasLoader = hasLoader || strings.Contains(p, "ld-linux")
	}
	if !hasLibc || !hasLoader {
		t.Errorf("files %v lack libc or the loader", paths)
	}
	// A static program is itself alone.
	if err := CheckStatic("/bin/busybox"); err == nil {
		files, err := HostProgram("/bin/busybox", "busybox")
		if err != nil {
			t.Fatal(err)
		}
		if len(files) != 1 {
			t.Errorf("static busybox: %d files, want 1", len(files))
		}
	}
	if _, err := HostProgram(filepath.Join(t.TempDir(), "missing"), "x"); err == nil {
		t.Error("HostProgram of a missing program succeeded")
	}
}

// TestHostProgramRuns runs the files HostProgram gives for bash in a
// chroot that holds nothing else: the libraries are all there and the
// loader finds them.
func TestHostProgramRuns(t *testing.T) {
	testutil.SkipUnit(t, "root (chroot)")
	if os.Getuid() != 0 {
		t.Skip("chroot needs root")
	}
	needTool(t, "chroot")
	files, err := HostProgram("/bin/bash", "bash")
	if err != nil {
		t.Fatal(err)
	}
	root := t.TempDir()
	for _, f := range files {
		p := filepath.Join(root, f.Path)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, f.Data, os.FileMode(f.Mode)); err != nil {
			t.Fatal(err)
		}
	}
	out, err := exec.Command("chroot", root, "/usr/bin/bash", "-c", "echo ok").CombinedOutput()
	if err != nil || strings.TrimSpace(string(out)) != "ok" {
		t.Fatalf("bash in a chroot: %v: %s", err, out)
	}
}

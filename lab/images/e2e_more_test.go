package images

import (
	"archive/tar"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	v1 "github.com/google/go-containerregistry/pkg/v1"
)

// TestE2EMoreImages: every further image e2e.test asks for is built, under
// its own tarball, with upstream's command and the files that command
// needs.
func TestE2EMoreImages(t *testing.T) {
	in := e2eMoreInputs{
		agnhost: []byte("agnhost"), busybox: []byte("busybox"), shell: []byte("bash"),
		applets:         []string{"bin/sh", "usr/sbin/httpd", "usr/bin/nslookup", "bin/sleep", "sbin/sysctl"},
		dnsTools:        []File{{Path: "usr/bin/dig", Mode: 0o755, Data: []byte("dig")}, {Path: "usr/bin/nslookup", Mode: 0o755, Data: []byte("bind nslookup")}, {Path: "usr/bin/dash", Mode: 0o755, Data: []byte("dash")}},
		pause:           []byte("pause"),
		regression74839: []byte("r74839"),
		nnp:             []byte("nnp"),
		kitten:          []File{{Path: "kitten.jpg", Mode: 0o644, Data: []byte("jpg")}},
		nautilus:        []File{{Path: "nautilus.jpg", Mode: 0o644, Data: []byte("jpg")}},
	}
	imgs, err := e2eMoreImages(in)
	if err != nil {
		t.Fatal(err)
	}
	if len(imgs) != len(E2EMoreTars) {
		t.Errorf("%d images, %d tarball names", len(imgs), len(E2EMoreTars))
	}
	type want struct {
		cmd   []string
		user  string
		files map[string]string // path: content ("" = any regular file or link)
	}
	cases := map[string]want{
		E2EBusyboxRef:      {cmd: []string{"sh"}, files: map[string]string{"bin/busybox": "busybox", "bin/sleep": "", "bin/sysctl": "", "sbin/sysctl": "", "bin/bash": "bash"}},
		E2EDnsutilsRef:     {cmd: []string{"sh"}, files: map[string]string{"usr/bin/dig": "dig", "usr/bin/nslookup": "bind nslookup", "bin/sh": ""}},
		E2ENginxRef:        {cmd: []string{"httpd", "-f", "-v", "-p", "80", "-h", "/usr/share/nginx/html"}, files: map[string]string{"usr/share/nginx/html/index.html": ""}},
		E2EHttpdRef:        {cmd: []string{"httpd-foreground"}, files: map[string]string{"usr/local/apache2/htdocs/index.html": "", "usr/local/bin/httpd-foreground": ""}},
		E2EKittenRef:       {cmd: []string{"test-webserver"}, files: map[string]string{"kitten.jpg": "jpg", "agnhost": "agnhost"}},
		E2ENonRootRef:      {cmd: []string{"sh"}, user: "1234"},
		E2ENonewprivsRef:   {cmd: []string{"nnp"}, files: map[string]string{"usr/local/bin/nnp": "nnp"}},
		E2ERegression74839: {files: map[string]string{"regression-issue-74839": "r74839"}},
		E2EPauseRef:        {user: "65535:65535", files: map[string]string{"pause": "pause"}},
	}
	for ref, w := range cases {
		img := imgs[ref]
		if img == nil {
			t.Errorf("%s not built", ref)
			continue
		}
		p := filepath.Join(t.TempDir(), E2EMoreTars[ref])
		if err := WriteTarball(p, ref, img); err != nil {
			t.Fatal(err)
		}
		_, files := readBack(t, p, ref)
		cf, err := img.ConfigFile()
		if err != nil {
			t.Fatal(err)
		}
		if w.cmd != nil && !reflect.DeepEqual(cf.Config.Cmd, w.cmd) {
			t.Errorf("%s: cmd %q, want %q", ref, cf.Config.Cmd, w.cmd)
		}
		if cf.Config.User != w.user {
			t.Errorf("%s: user %q, want %q", ref, cf.Config.User, w.user)
		}
		for f, data := range w.files {
			e, ok := files[f]
			if !ok || (data != "" && (e.typ != tar.TypeReg || e.data != data)) {
				t.Errorf("%s: %s is %+v, want %q", ref, f, e, data)
			}
		}
	}
	// jessie-dnsutils: bind's nslookup, not busybox's applet; dash as sh.
	_, files := readBack(t, writeTmp(t, imgs[E2EDnsutilsRef], E2EDnsutilsRef), E2EDnsutilsRef)
	if e := files["bin/sh"]; e.link != "/usr/bin/dash" {
		t.Errorf("jessie-dnsutils /bin/sh -> %q, want dash", e.link)
	}
	// nnp is setuid, as upstream's chmod +s makes it.
	_, files = readBack(t, writeTmp(t, imgs[E2ENonewprivsRef], E2ENonewprivsRef), E2ENonewprivsRef)
	if e := files["usr/local/bin/nnp"]; e.mode&0o4000 == 0 {
		t.Errorf("nnp mode %o, want setuid", e.mode)
	}
}

func writeTmp(t *testing.T, img v1.Image, ref string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "x.tar")
	if err := WriteTarball(p, ref, img); err != nil {
		t.Fatal(err)
	}
	return p
}

// TestCheckBusybox: only the pinned busybox goes into the images.
func TestCheckBusybox(t *testing.T) {
	if err := checkBusybox([]byte("another busybox")); err == nil || !strings.Contains(err.Error(), BusyboxDebVersion) {
		t.Errorf("checkBusybox of another binary: %v, want an error naming %s", err, BusyboxDebVersion)
	}
}

package images

import (
	"cmp"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"os"
	"path/filepath"
	"sort"

	v1 "github.com/google/go-containerregistry/pkg/v1"
)

// The busybox every image of this file (and the lab's agnhost) is built on:
// Debian bookworm's busybox-static, pinned by package version and by the
// checksum of its /bin/busybox, so that the images are the same bytes on
// every machine that builds them (lab/conformance/deps.sh installs that
// version; BuildE2E refuses any other binary).
const (
	BusyboxDebVersion = "1:1.35.0-4+deb12u1+b1"
	BusyboxSHA256     = "3d9f2889d6782537624a4e1a10e68a2ddd53e0ee8bac02676f27308f42ec6bf6"
)

// E2EImage is one more image e2e.test of the pinned release asks for
// (test/utils/image/manifest.go at v1.34.4), built from local files.
type E2EImage struct {
	Ref string
	Tar string // inside Options.Out; the conformance runner loads e2e-*.tar
	// What it really holds, where upstream's differs (docs/conformance.md).
	Holds string
}

// The references (manifest.go's names and tags).
const (
	E2EBusyboxRef      = "registry.k8s.io/e2e-test-images/busybox:1.37.0-1"
	E2EDnsutilsRef     = "registry.k8s.io/e2e-test-images/jessie-dnsutils:1.7"
	E2ENginxRef        = "registry.k8s.io/e2e-test-images/nginx:1.14-4"
	E2ENginxNewRef     = "registry.k8s.io/e2e-test-images/nginx:1.15-4"
	E2EHttpdRef        = "registry.k8s.io/e2e-test-images/httpd:2.4.38-4"
	E2EHttpdNewRef     = "registry.k8s.io/e2e-test-images/httpd:2.4.39-4"
	E2EKittenRef       = "registry.k8s.io/e2e-test-images/kitten:1.7"
	E2ENautilusRef     = "registry.k8s.io/e2e-test-images/nautilus:1.7"
	E2ENonRootRef      = "registry.k8s.io/e2e-test-images/nonroot:1.4"
	E2ENonewprivsRef   = "registry.k8s.io/e2e-test-images/nonewprivs:1.3"
	E2ERegression74839 = "registry.k8s.io/e2e-test-images/regression-issue-74839:1.2"
	E2EPauseRef        = "registry.k8s.io/pause:3.10.1"
)

// E2EDnsTools are the programs jessie-dnsutils carries beyond busybox: the
// DNS specs' probes run `dig +notcp|+tcp +noall +answer +search NAME TYPE`
// and `getent hosts NAME` (Debian: bind9-dnsutils, libc-bin).
var E2EDnsTools = []E2ETool{
	{Name: "dig", Host: "/usr/bin/dig"},
	{Name: "host", Host: "/usr/bin/host"},
	{Name: "nslookup", Host: "/usr/bin/nslookup"},
	{Name: "getent", Host: "/usr/bin/getent"},
	{Name: "dash", Host: "/bin/dash"},
}

// e2eMoreInputs are the files the images below are made of.
type e2eMoreInputs struct {
	agnhost, busybox []byte
	applets          []string
	shell            []byte // a static bash
	dnsTools         []File
	pause            []byte
	regression74839  []byte
	nnp              []byte
	kitten, nautilus []File
}

// busyboxFiles is a minimal busybox root: the binary, its applets as links,
// root and nobody, /tmp. Upstream's busybox image (Docker's) installs every
// applet into /bin, and specs exec them there ("/bin/sysctl" in the Sysctls
// specs), while Debian's busybox lists some under /sbin and /usr: each
// applet is linked into /bin as well.
func busyboxFiles(busybox []byte, applets []string) []File {
	files := agnhostFiles(nil, busybox, applets)
	var out []File
	inBin := map[string]bool{}
	for _, f := range files {
		if f.Path == "agnhost" || f.Path == "agnhost-2" || f.Path == "uploads" {
			continue
		}
		if filepath.Dir(f.Path) == "bin" {
			inBin[f.Path] = true
		}
		out = append(out, f)
	}
	for _, f := range files {
		if f.Link != "/bin/busybox" {
			continue
		}
		if p := "bin/" + filepath.Base(f.Path); !inBin[p] {
			inBin[p] = true
			out = append(out, File{Path: p, Link: "/bin/busybox"})
		}
	}
	return out
}

// webFiles is a busybox root whose httpd applet serves index under dir.
func webFiles(busybox []byte, applets []string, dir, index string) []File {
	return append(busyboxFiles(busybox, applets),
		File{Path: dir + "/index.html", Mode: 0o644, Data: []byte(index)})
}

// E2EMoreImages builds every image of this file from in, keyed by reference.
func e2eMoreImages(in e2eMoreInputs) (map[string]v1.Image, error) {
	env := []string{defaultPath}
	bb := busyboxFiles(in.busybox, in.applets)
	imgs := map[string]v1.Image{}
	add := func(ref string, files []File, cfg v1.Config) error {
		if cfg.Env == nil {
			cfg.Env = env
		}
		img, err := NewImage(dedupe(files), cfg, Arch)
		if err != nil {
			return fmt.Errorf("%s: %w", ref, err)
		}
		imgs[ref] = img
		return nil
	}
	nginxIndex := "<!DOCTYPE html>\n<html><head><title>Welcome to nginx!</title></head><body><h1>Welcome to nginx!</h1></body></html>\n"
	httpdIndex := "<html><body><h1>It works!</h1></body></html>\n"
	httpdFG := File{Path: "usr/local/bin/httpd-foreground", Mode: 0o755,
		Data: []byte("#!/bin/sh\n# busybox httpd standing in for Apache (docs/conformance.md).\nexec httpd -f -v -p 80 -h /usr/local/apache2/htdocs\n")}
	steps := []func() error{
		// Upstream: busybox on its own base, CMD ["sh"]. Here /bin/sh is
		// a static bash: Debian's busybox 1.35 ash drops environment
		// variables whose names are no shell identifiers before it runs
		// a command, and the ConfigMap and Secret "consumable via the
		// environment" specs run `sh -c env` to find "data-1=value-1"
		// (upstream's busybox 1.37 passes them on, as bash does).
		func() error {
			sh := []File{{Path: "bin/bash", Mode: 0o755, Data: in.shell}, {Path: "bin/sh", Link: "/bin/bash"}}
			return add(E2EBusyboxRef, append(sh, bb...), v1.Config{Cmd: []string{"sh"}})
		},
		// Upstream: Debian jessie with dnsutils. Here: busybox, dig, host,
		// nslookup, getent (the machine's Debian builds with their
		// libraries) and dash as /bin/sh (busybox's sh would run its own
		// nslookup applet whatever PATH says).
		func() error {
			tools := append([]File{E2EShell}, in.dnsTools...)
			dns := append(busyboxFilesWithout(in.busybox, in.applets, tools), tools...)
			dns = append(dns, File{Path: "etc/nsswitch.conf", Mode: 0o644, Data: []byte("hosts: files dns\n")})
			return add(E2EDnsutilsRef, dns, v1.Config{Cmd: []string{"sh"}})
		},
		// Upstream: nginx on alpine, serving /usr/share/nginx/html on :80.
		// Here busybox's httpd serves the same directory on the same port.
		func() error {
			return add(E2ENginxRef, webFiles(in.busybox, in.applets, "usr/share/nginx/html", nginxIndex),
				v1.Config{Cmd: []string{"httpd", "-f", "-v", "-p", "80", "-h", "/usr/share/nginx/html"}, ExposedPorts: map[string]struct{}{"80/tcp": {}}})
		},
		func() error {
			return add(E2ENginxNewRef, webFiles(in.busybox, in.applets, "usr/share/nginx/html", nginxIndex),
				v1.Config{Cmd: []string{"httpd", "-f", "-v", "-p", "80", "-h", "/usr/share/nginx/html"}, ExposedPorts: map[string]struct{}{"80/tcp": {}}})
		},
		// Upstream: Apache httpd (CMD ["httpd-foreground"]), htdocs under
		// /usr/local/apache2. Here httpd-foreground runs busybox's httpd.
		func() error {
			return add(E2EHttpdRef, append(webFiles(in.busybox, in.applets, "usr/local/apache2/htdocs", httpdIndex), httpdFG),
				v1.Config{Cmd: []string{"httpd-foreground"}, ExposedPorts: map[string]struct{}{"80/tcp": {}}})
		},
		func() error {
			return add(E2EHttpdNewRef, append(webFiles(in.busybox, in.applets, "usr/local/apache2/htdocs", httpdIndex), httpdFG),
				v1.Config{Cmd: []string{"httpd-foreground"}, ExposedPorts: map[string]struct{}{"80/tcp": {}}})
		},
		// Upstream: agnhost with html/ copied to / and CMD ["test-webserver"].
		func() error {
			return add(E2EKittenRef, append(agnhostFiles(in.agnhost, in.busybox, in.applets), in.kitten...),
				v1.Config{Entrypoint: []string{"/agnhost"}, Cmd: []string{"test-webserver"}})
		},
		func() error {
			return add(E2ENautilusRef, append(agnhostFiles(in.agnhost, in.busybox, in.applets), in.nautilus...),
				v1.Config{Entrypoint: []string{"/agnhost"}, Cmd: []string{"test-webserver"}})
		},
		// Upstream: a Debian base run as USER 1234.
		func() error { return add(E2ENonRootRef, bb, v1.Config{Cmd: []string{"sh"}, User: "1234"}) },
		// Upstream: alpine with the setuid nnp program (CMD ["nnp"]).
		func() error {
			return add(E2ENonewprivsRef, append(bb, File{Path: "usr/local/bin/nnp", Mode: 0o4755, Data: in.nnp}),
				v1.Config{Cmd: []string{"nnp"}})
		},
		// Upstream: the program on a Debian base.
		func() error {
			return add(E2ERegression74839, append(bb, File{Path: "regression-issue-74839", Mode: 0o755, Data: in.regression74839}),
				v1.Config{Entrypoint: []string{"/regression-issue-74839"}})
		},
		// The pause of the lab's sandboxes, compiled as v3.10.1.
		func() error {
			img, err := PauseImage(in.pause)
			imgs[E2EPauseRef] = img
			return err
		},
	}
	for _, s := range steps {
		if err := s(); err != nil {
			return nil, err
		}
	}
	return imgs, nil
}

// busyboxFilesWithout is busyboxFiles less the applets whose names tools
// take.
func busyboxFilesWithout(busybox []byte, applets []string, tools []File) []File {
	taken := map[string]bool{}
	for _, f := range tools {
		taken[filepath.Base(f.Path)] = true
	}
	var keep []string
	for _, a := range applets {
		if !taken[filepath.Base(a)] {
			keep = append(keep, a)
		}
	}
	return busyboxFiles(busybox, keep)
}

// E2EMoreTars maps each reference of e2eMoreImages to its tarball.
var E2EMoreTars = map[string]string{
	E2EBusyboxRef:      "e2e-busybox.tar",
	E2EDnsutilsRef:     "e2e-jessie-dnsutils.tar",
	E2ENginxRef:        "e2e-nginx-1.14.tar",
	E2ENginxNewRef:     "e2e-nginx-1.15.tar",
	E2EHttpdRef:        "e2e-httpd-2.4.38.tar",
	E2EHttpdNewRef:     "e2e-httpd-2.4.39.tar",
	E2EKittenRef:       "e2e-kitten.tar",
	E2ENautilusRef:     "e2e-nautilus.tar",
	E2ENonRootRef:      "e2e-nonroot.tar",
	E2ENonewprivsRef:   "e2e-nonewprivs.tar",
	E2ERegression74839: "e2e-regression-issue-74839.tar",
	E2EPauseRef:        "e2e-pause-3.10.1.tar",
}

// checkBusybox fails unless the busybox is the pinned one.
func checkBusybox(data []byte) error {
	sum := sha256.Sum256(data)
	if got := hex.EncodeToString(sum[:]); got != BusyboxSHA256 {
		return fmt.Errorf("busybox sha256 %s, want %s (Debian busybox-static %s; lab/conformance/deps.sh installs it)", got, BusyboxSHA256, BusyboxDebVersion)
	}
	return nil
}

// buildE2EMore writes every image of e2eMoreImages into o.Out.
func buildE2EMore(ctx context.Context, o Options, agnhost, busybox []byte, applets []string) ([]Built, error) {
	in := e2eMoreInputs{agnhost: agnhost, busybox: busybox, applets: applets}
	var err error
	if in.shell, err = readStatic(cmp.Or(o.BashStatic, "/bin/bash-static")); err != nil {
		return nil, fmt.Errorf("%w (Debian bash-static; lab/conformance/deps.sh installs it)", err)
	}
	for _, t := range E2EDnsTools {
		fs, err := HostProgram(t.Host, t.Name)
		if err != nil {
			return nil, fmt.Errorf("%s (install Debian's package providing %s): %w", t.Name, t.Host, err)
		}
		in.dnsTools = append(in.dnsTools, fs...)
	}
	for _, b := range []struct {
		name string
		dst  *[]byte
	}{{"regression-issue-74839", &in.regression74839}, {"nonewprivs", &in.nnp}} {
		if *b.dst, err = readStatic(filepath.Join(o.E2EBin, b.name)); err != nil {
			return nil, fmt.Errorf("%w (make e2e-image-bins builds it)", err)
		}
	}
	for _, h := range []struct {
		dir string
		dst *[]File
	}{{"kitten", &in.kitten}, {"nautilus", &in.nautilus}} {
		for _, f := range []string{"data.json", h.dir + ".jpg"} {
			data, err := os.ReadFile(filepath.Join(o.K8sSrc, "test", "images", h.dir, "html", f))
			if err != nil {
				return nil, err
			}
			*h.dst = append(*h.dst, File{Path: f, Mode: 0o644, Data: data})
		}
	}
	pauseBin := filepath.Join(o.Out, ".pause-3.10.1")
	defer os.Remove(pauseBin)
	if err := CompilePauseVersion(ctx, filepath.Join(o.K8sSrc, "build", "pause", "linux"), pauseBin, "v3.10.1"); err != nil {
		return nil, err
	}
	if in.pause, err = os.ReadFile(pauseBin); err != nil {
		return nil, err
	}
	imgs, err := e2eMoreImages(in)
	if err != nil {
		return nil, err
	}
	refs := make([]string, 0, len(imgs))
	for ref := range imgs {
		refs = append(refs, ref)
	}
	sort.Strings(refs)
	var built []Built
	for _, ref := range refs {
		img := imgs[ref]
		b, err := writeBuilt(o.Out, E2EMoreTars[ref], ref, img)
		if err != nil {
			return nil, err
		}
		built = append(built, b...)
	}
	return built, nil
}

// Package images owns the lab's container images: it builds agnhost, pause
// and Lace's own image from local files (no registry is reachable) as
// reproducible single-layer OCI images, writes each as an image tarball that
// containerd imports under its full reference, reads the references back out
// of a tarball, and imports tarballs into a containerd with ctr.
//
// It does not run containers or talk to the CRI: the lab's nodes pick the
// images up from their containerd by name.
package images

import (
	"bytes"
	"context"
	"debug/elf"
	_ "embed"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"

	v1 "github.com/google/go-containerregistry/pkg/v1"
)

// The references the lab's kubelets ask for. agnhost and pause carry the
// upstream names so that unmodified e2e manifests and the kubelet's default
// sandbox image find them.
const (
	AgnhostRef = "registry.k8s.io/e2e-test-images/agnhost:2.53"
	PauseRef   = "registry.k8s.io/pause:3.10"
	LaceRepo   = "ghcr.io/lace-cni/lace"
)

// LaceRef is the reference of Lace's image with the given tag.
func LaceRef(tag string) string { return LaceRepo + ":" + tag }

// LaceBinaries are the static binaries Lace's image holds in /usr/bin.
var LaceBinaries = []string{"lace-agent", "lace-controller", "lace-cni", "lacectl"}

// defaultPath is the PATH of every image, as in Docker's default.
const defaultPath = "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

// Arch is the architecture the images are built for: the machine's own, as
// the binaries in them are built by the same toolchain.
var Arch = runtime.GOARCH

// AgnhostImage is agnhost as upstream runs it (ENTRYPOINT ["/agnhost"],
// CMD ["pause"]) on a static busybox instead of alpine: e2e specs exec
// shell tools in it. applets are busybox --list-full paths (bin/sh,
// usr/bin/wget, ...): each becomes a symlink to /bin/busybox, as busybox
// --install -s makes them.
func AgnhostImage(agnhost, busybox []byte, applets []string) (v1.Image, error) {
	return NewImage(agnhostFiles(agnhost, busybox, applets), v1.Config{
		Entrypoint: []string{"/agnhost"},
		Cmd:        []string{"pause"},
		Env:        []string{defaultPath},
	}, Arch)
}

// agnhostFiles are the files of AgnhostImage.
// porterCert and porterKey are upstream's test certificate of agnhost's
// porter (k8s.io/kubernetes v1.34.4 test/images/agnhost/porter, SAN
// 127.0.0.1 and ::1, valid until 2084, a public test key), which upstream's
// agnhost image carries at /localhost.crt and /localhost.key: without them
// porter's SERVE_TLS_PORT_* listeners never start, and the Proxy spec's
// https paths (pods/https:NAME:443/proxy, services/https:NAME:tlsportname1)
// get "proxy error ... 502" from the lab's egress proxy, a 503 from the API
// server.
var (
	//go:embed porter/localhost.crt
	porterCert []byte
	//go:embed porter/localhost.key
	porterKey []byte
)

func agnhostFiles(agnhost, busybox []byte, applets []string) []File {
	files := []File{
		{Path: "agnhost", Mode: 0o755, Data: agnhost},
		// porter's TLS ports read these, relative to / (its working
		// directory), as upstream's Dockerfile adds them.
		{Path: "localhost.crt", Mode: 0o644, Data: porterCert},
		{Path: "localhost.key", Mode: 0o644, Data: porterKey},
		// Upstream links agnhost-2 for specs that need a second binary name.
		{Path: "agnhost-2", Link: "agnhost"},
		{Path: "bin/busybox", Mode: 0o755, Data: busybox},
		// Upstream's image has these, netexec's /upload writes to /uploads.
		{Path: "uploads", Dir: true, Mode: 0o755},
		{Path: "tmp", Dir: true, Mode: 0o1777},
		// root and nobody as in any base image; the two -defined-in-image
		// entries as upstream adds them (specs on image-defined users and
		// supplemental groups look them up).
		{Path: "etc/passwd", Mode: 0o644, Data: []byte("root:x:0:0:root:/root:/bin/sh\n" +
			"nobody:x:65534:65534:nobody:/nonexistent:/bin/false\n" +
			"user-defined-in-image:x:1000:1000::/home/user-defined-in-image:/bin/sh\n")},
		{Path: "etc/group", Mode: 0o644, Data: []byte("root:x:0:\n" +
			"nogroup:x:65534:\n" +
			"user-defined-in-image:x:1000:\n" +
			"group-defined-in-image:x:50000:user-defined-in-image\n")},
		{Path: "root", Dir: true, Mode: 0o700},
	}
	seen := map[string]bool{}
	for _, a := range applets {
		a = strings.Trim(filepath.Clean("/"+a), "/")
		dir := filepath.Dir(a)
		if a == "bin/busybox" || seen[a] {
			continue
		}
		// --list-full also names /linuxrc (an initrd's init); only the
		// directories on PATH matter in a container.
		if dir != "bin" && dir != "sbin" && dir != "usr/bin" && dir != "usr/sbin" {
			continue
		}
		seen[a] = true
		files = append(files, File{Path: a, Link: "/bin/busybox"})
	}
	return files
}

// PauseImage is the upstream pause image: the static pause binary at /pause,
// run as 65535:65535, nothing else.
func PauseImage(pause []byte) (v1.Image, error) {
	return NewImage([]File{{Path: "pause", Mode: 0o755, Data: pause}}, v1.Config{
		Entrypoint: []string{"/pause"},
		User:       "65535:65535",
		Env:        []string{defaultPath},
	}, Arch)
}

// LaceImage holds Lace's static binaries in /usr/bin and no shell. It has no
// entrypoint: the agent and the controller share the image and the chart
// names the command of each.
func LaceImage(bins map[string][]byte) (v1.Image, error) {
	files := []File{{Path: "tmp", Dir: true, Mode: 0o1777}}
	for _, b := range LaceBinaries {
		data, ok := bins[b]
		if !ok {
			return nil, fmt.Errorf("lace image: binary %s missing", b)
		}
		files = append(files, File{Path: "usr/bin/" + b, Mode: 0o755, Data: data})
	}
	return NewImage(files, v1.Config{Env: []string{defaultPath}}, Arch)
}

// BusyboxApplets runs busybox --list-full: the applets a busybox binary
// provides, as paths relative to / (bin/sh, usr/bin/wget, ...).
func BusyboxApplets(ctx context.Context, busybox string) ([]string, error) {
	out, err := exec.CommandContext(ctx, busybox, "--list-full").Output()
	if err != nil {
		return nil, fmt.Errorf("%s --list-full: %w", busybox, err)
	}
	return strings.Fields(string(out)), nil
}

// CompilePause compiles srcDir/pause.c statically into out and strips it, as
// upstream's build/pause/Makefile does (CFLAGS -Os -Wall -Werror -static
// -DVERSION=...), with VERSION v3.10 to match PauseRef.
func CompilePause(ctx context.Context, srcDir, out string) error {
	return CompilePauseVersion(ctx, srcDir, out, "v3.10")
}

// CompilePauseVersion is CompilePause stamping another version (e2e.test
// asks for pause:3.10.1 by name).
func CompilePauseVersion(ctx context.Context, srcDir, out, version string) error {
	src := filepath.Join(srcDir, "pause.c")
	if _, err := os.Stat(src); err != nil {
		return fmt.Errorf("pause source: %w", err)
	}
	for _, args := range [][]string{
		{"gcc", "-Os", "-Wall", "-Werror", "-static", "-DVERSION=" + version, "-o", out, src},
		{"strip", out},
	} {
		cmd := exec.CommandContext(ctx, args[0], args[1:]...)
		var stderr bytes.Buffer
		cmd.Stderr = &stderr
		if err := cmd.Run(); err != nil {
			return fmt.Errorf("%s: %w: %s", strings.Join(args, " "), err, strings.TrimSpace(stderr.String()))
		}
	}
	return nil
}

// CheckStatic fails unless path is an ELF executable without an interpreter:
// a dynamically linked binary in these images has no libc to load and dies
// with a misleading "no such file or directory".
func CheckStatic(path string) error {
	f, err := elf.Open(path)
	if err != nil {
		return fmt.Errorf("%s: %w", path, err)
	}
	defer f.Close()
	for _, p := range f.Progs {
		if p.Type == elf.PT_INTERP {
			return fmt.Errorf("%s is dynamically linked: build it with CGO_ENABLED=0 (or -static)", path)
		}
	}
	return nil
}

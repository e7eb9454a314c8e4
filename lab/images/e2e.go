package images

import (
	"context"
	"debug/elf"
	"fmt"
	"os"
	"path"
	"path/filepath"
	"strings"

	v1 "github.com/google/go-containerregistry/pkg/v1"
)

// The images the upstream e2e.test of the pinned release asks for
// (test/utils/image/manifest.go at v1.34.4) that `make conformance` needs:
// its specs run agnhost under its own tag, 2.56 (which is also the version
// of the agnhost the tools module builds), and exec curl, nc and ss in it.
const (
	E2EAgnhostRef = "registry.k8s.io/e2e-test-images/agnhost:2.56"
	// E2EAgnhostTar is the tarball of E2EAgnhostRef inside Options.Out.
	// The lab does not import it at up; `lace-lab load` does.
	E2EAgnhostTar = "e2e-agnhost.tar"
)

// E2ETool is one program of the machine that the e2e agnhost image carries
// at /usr/bin/Name, as upstream's image (alpine with curl, netcat-openbsd,
// iproute2 and bash) does.
type E2ETool struct {
	Name string // in the image: /usr/bin/Name
	Host string // the machine's program
}

// E2ETools are the programs the [sig-network] specs exec in agnhost pods
// beyond busybox: curl (HTTP checks, with -w %{http_code}, --interface,
// --connect-timeout), OpenBSD nc (`nc -v -t -w 2` and `nc -u`: busybox's
// nc has neither -v nor -u), ss (`ss -ant46` in a hostNetwork pod), bash,
// and GNU wget: Debian bookworm's busybox-static (1.35) wget segfaults
// whenever -T is given, and the serve-hostname checks run
// `wget -q -O - -T 1`. Debian: curl, netcat-openbsd, iproute2, bash, wget.
var E2ETools = []E2ETool{
	{Name: "curl", Host: "/usr/bin/curl"},
	{Name: "wget", Host: "/usr/bin/wget"},
	{Name: "nc", Host: "/bin/nc.openbsd"},
	{Name: "ss", Host: "/bin/ss"},
	{Name: "bash", Host: "/bin/bash"},
	{Name: "dash", Host: "/bin/dash"},
	// Upstream's alpine adds bind-tools, and musl's getent: the DNS specs'
	// probes run `dig ... +search NAME` and `getent hosts NAME` in agnhost
	// as in jessie-dnsutils. Debian: bind9-dnsutils, libc-bin.
	{Name: "dig", Host: "/usr/bin/dig"},
	{Name: "host", Host: "/usr/bin/host"},
	{Name: "nslookup", Host: "/usr/bin/nslookup"},
	{Name: "getent", Host: "/usr/bin/getent"},
}

// E2EShell makes /bin/sh Debian's dash. The specs exec everything through
// `/bin/sh -x -c`, and Debian's static busybox is built to prefer its own
// applets: as /bin/sh it would run its nc and wget whatever PATH says,
// never the tools above. (Upstream's /bin/sh is alpine's busybox, which
// does look PATH up.)
var E2EShell = File{Path: "bin/sh", Link: "/usr/bin/dash"}

// E2EAgnhostImage is AgnhostImage plus tools (HostProgram's files, and
// E2EShell): the busybox applets whose names a tool takes are left out, so
// that nc is OpenBSD's wherever PATH finds it and /bin/sh is the tools'
// shell. Entrypoint and command are agnhost's.
func E2EAgnhostImage(agnhost, busybox []byte, applets []string, tools []File) (v1.Image, error) {
	taken := map[string]bool{}
	for _, f := range tools {
		p := strings.Trim(path.Clean("/"+f.Path), "/")
		if d := path.Dir(p); d == "usr/bin" || d == "bin" || d == "sbin" || d == "usr/sbin" {
			taken[path.Base(p)] = true
		}
	}
	var keep []string
	for _, a := range applets {
		if !taken[path.Base(a)] {
			keep = append(keep, a)
		}
	}
	files := append(agnhostFiles(agnhost, busybox, keep), tools...)
	// glibc's resolver as alpine's musl behaves: /etc/hosts (the kubelet's)
	// first, then the pod's resolv.conf.
	files = append(files, File{Path: "etc/nsswitch.conf", Mode: 0o644, Data: []byte("hosts: files dns\n")})
	return NewImage(dedupe(files), v1.Config{
		Entrypoint: []string{"/agnhost"},
		Cmd:        []string{"pause"},
		Env:        []string{defaultPath},
	}, Arch)
}

// dedupe drops later entries for a path already listed (two tools share
// libc, the loader and most of their libraries).
func dedupe(files []File) []File {
	seen := map[string]bool{}
	var out []File
	for _, f := range files {
		p := strings.Trim(path.Clean("/"+f.Path), "/")
		if seen[p] {
			continue
		}
		seen[p] = true
		out = append(out, f)
	}
	return out
}

// HostProgram returns the files that run the machine's program host as
// /usr/bin/name in an image: the program, and when it is dynamically linked
// its ELF interpreter (at the path the program names) and every shared
// library it needs, transitively (DT_NEEDED), found in the machine's
// library directories and placed in /lib/<multiarch triplet>, where
// glibc's loader looks without an ld.so.cache. The image then runs the
// machine's own builds (Debian's packages), no registry needed.
func HostProgram(host, name string) ([]File, error) {
	data, err := os.ReadFile(host)
	if err != nil {
		return nil, err
	}
	files := []File{{Path: "usr/bin/" + name, Mode: 0o755, Data: data}}
	f, err := elf.Open(host)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", host, err)
	}
	defer f.Close()
	interp := ""
	for _, p := range f.Progs {
		if p.Type == elf.PT_INTERP {
			b := make([]byte, p.Filesz)
			if _, err := p.ReadAt(b, 0); err != nil {
				return nil, fmt.Errorf("%s: interpreter: %w", host, err)
			}
			interp = strings.TrimRight(string(b), "\x00")
		}
	}
	if interp == "" {
		return files, nil // static
	}
	ld, err := os.ReadFile(interp)
	if err != nil {
		return nil, fmt.Errorf("%s: interpreter: %w", host, err)
	}
	files = append(files, File{Path: interp, Mode: 0o755, Data: ld})
	dirs := libDirs()
	libDir := dirs[0]
	seen := map[string]bool{path.Base(interp): true}
	queue, err := f.ImportedLibraries()
	if err != nil {
		return nil, fmt.Errorf("%s: %w", host, err)
	}
	for len(queue) > 0 {
		lib := queue[0]
		queue = queue[1:]
		if seen[lib] {
			continue
		}
		seen[lib] = true
		p, err := findLib(lib, dirs)
		if err != nil {
			return nil, fmt.Errorf("%s needs %s: %w", host, lib, err)
		}
		data, err := os.ReadFile(p) // follows the soname link
		if err != nil {
			return nil, err
		}
		files = append(files, File{Path: path.Join(libDir, lib), Mode: 0o644, Data: data})
		lf, err := elf.Open(p)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", p, err)
		}
		needed, err := lf.ImportedLibraries()
		lf.Close()
		if err != nil {
			return nil, fmt.Errorf("%s: %w", p, err)
		}
		queue = append(queue, needed...)
	}
	return files, nil
}

// multiarch maps GOARCH to Debian's multiarch triplet.
var multiarch = map[string]string{
	"amd64": "x86_64-linux-gnu", "arm64": "aarch64-linux-gnu", "arm": "arm-linux-gnueabihf",
	"386": "i386-linux-gnu", "ppc64le": "powerpc64le-linux-gnu", "s390x": "s390x-linux-gnu",
	"riscv64": "riscv64-linux-gnu",
}

// libDirs are the machine's library directories, most specific first; the
// first is where HostProgram puts libraries in the image.
func libDirs() []string {
	var dirs []string
	if t, ok := multiarch[Arch]; ok {
		dirs = append(dirs, "/lib/"+t, "/usr/lib/"+t)
	}
	return append(dirs, "/lib64", "/usr/lib64", "/lib", "/usr/lib")
}

func findLib(lib string, dirs []string) (string, error) {
	for _, d := range dirs {
		p := filepath.Join(d, lib)
		if st, err := os.Stat(p); err == nil && st.Mode().IsRegular() {
			return p, nil
		}
	}
	return "", fmt.Errorf("not found in %s", strings.Join(dirs, ", "))
}

// BuildE2E writes the images e2e.test asks for beyond the lab's own
// (E2EAgnhostTar) into o.Out; it needs o.Agnhost and o.Busybox only, and the
// machine's E2ETools.
func BuildE2E(ctx context.Context, o Options) ([]Built, error) {
	if err := os.MkdirAll(o.Out, 0o755); err != nil {
		return nil, err
	}
	agnhost, err := readStatic(o.Agnhost)
	if err != nil {
		return nil, err
	}
	busybox, err := readStatic(o.Busybox)
	if err != nil {
		return nil, err
	}
	if err := checkBusybox(busybox); err != nil {
		return nil, err
	}
	applets, err := BusyboxApplets(ctx, o.Busybox)
	if err != nil {
		return nil, err
	}
	tools := []File{E2EShell}
	for _, t := range E2ETools {
		fs, err := HostProgram(t.Host, t.Name)
		if err != nil {
			return nil, fmt.Errorf("%s (install Debian's package providing %s): %w", t.Name, t.Host, err)
		}
		tools = append(tools, fs...)
	}
	if o.CoreDNS != "" {
		// Upstream's agnhost carries CoreDNS at /coredns: the DNS specs
		// run it in an agnhost pod as a test name server.
		bin, err := readStatic(o.CoreDNS)
		if err != nil {
			return nil, err
		}
		tools = append(tools, File{Path: "coredns", Mode: 0o755, Data: bin})
	}
	// porter's TLS pair, which upstream's image carries at /, comes with
	// every agnhost image (agnhostFiles).
	img, err := E2EAgnhostImage(agnhost, busybox, applets, tools)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", E2EAgnhostRef, err)
	}
	built, err := writeBuilt(o.Out, E2EAgnhostTar, E2EAgnhostRef, img)
	if err != nil || o.K8sSrc == "" {
		return built, err
	}
	more, err := buildE2EMore(ctx, o, agnhost, busybox, applets)
	return append(built, more...), err
}

func writeBuilt(dir, name, ref string, img v1.Image) ([]Built, error) {
	p := filepath.Join(dir, name)
	if err := WriteTarball(p, ref, img); err != nil {
		return nil, fmt.Errorf("write %s: %w", p, err)
	}
	d, err := img.Digest()
	if err != nil {
		return nil, err
	}
	st, err := os.Stat(p)
	if err != nil {
		return nil, err
	}
	return []Built{{Ref: ref, Path: p, Digest: d, Size: st.Size()}}, nil
}

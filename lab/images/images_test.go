package images

import (
	"archive/tar"
	"bytes"
	"context"
	"crypto/sha256"
	"crypto/tls"
	"errors"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"sort"
	"strings"
	"testing"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
)

// entry is what a test sees of one file in a layer.
type entry struct {
	typ  byte
	mode int64
	link string
	data string
}

// readBack reads the tarball at p the two ways consumers do: as a Docker
// archive (manifest.json, go-containerregistry's tarball reader) and as an
// OCI layout (index.json, what containerd reads), checks that both give the
// same image named ref, and returns it with its files.
func readBack(t *testing.T, p, ref string) (v1.Image, map[string]entry) {
	t.Helper()
	tag, err := name.NewTag(ref, name.StrictValidation)
	if err != nil {
		t.Fatal(err)
	}
	img, err := tarball.ImageFromPath(p, &tag)
	if err != nil {
		t.Fatalf("read %s as a docker archive: %v", p, err)
	}
	config, err := img.ConfigName()
	if err != nil {
		t.Fatal(err)
	}

	dir := t.TempDir()
	untar(t, p, dir)
	idx, err := layout.ImageIndexFromPath(dir)
	if err != nil {
		t.Fatalf("read %s as an OCI layout: %v", p, err)
	}
	im, err := idx.IndexManifest()
	if err != nil {
		t.Fatal(err)
	}
	if len(im.Manifests) != 1 {
		t.Fatalf("index.json has %d manifests, want 1", len(im.Manifests))
	}
	m := im.Manifests[0]
	// The Docker archive reader synthesizes its own manifest: compare the
	// configs, which name the layers by digest.
	oci, err := idx.Image(m.Digest)
	if err != nil {
		t.Fatalf("index.json manifest %s: %v", m.Digest, err)
	}
	if c, err := oci.ConfigName(); err != nil || c != config {
		t.Errorf("index.json's image has config %s (%v), manifest.json's %s", c, err, config)
	}
	for _, k := range []string{AnnotationImageName, AnnotationRefName} {
		if m.Annotations[k] != ref {
			t.Errorf("annotation %s = %q, want %q", k, m.Annotations[k], ref)
		}
	}
	if m.Platform == nil || m.Platform.OS != "linux" || m.Platform.Architecture != Arch {
		t.Errorf("index platform %+v, want linux/%s", m.Platform, Arch)
	}
	refs, err := ImageRefs(p)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(refs, []string{ref}) {
		t.Errorf("ImageRefs = %q, want [%s]", refs, ref)
	}

	cf, err := img.ConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	if cf.OS != "linux" || cf.Architecture != Arch || !cf.Created.Time.Equal(Epoch) {
		t.Errorf("config os/arch/created = %s/%s/%s, want linux/%s/%s", cf.OS, cf.Architecture, cf.Created, Arch, Epoch)
	}
	layers, err := img.Layers()
	if err != nil {
		t.Fatal(err)
	}
	if len(layers) != 1 {
		t.Fatalf("%d layers, want 1", len(layers))
	}
	rc, err := layers[0].Uncompressed()
	if err != nil {
		t.Fatal(err)
	}
	defer rc.Close()
	files := map[string]entry{}
	var order []string
	tr := tar.NewReader(rc)
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		if h.Uid != 0 || h.Gid != 0 || !h.ModTime.Equal(Epoch) {
			t.Errorf("%s: uid %d gid %d mtime %s, want 0 0 %s", h.Name, h.Uid, h.Gid, h.ModTime, Epoch)
		}
		data, err := io.ReadAll(tr)
		if err != nil {
			t.Fatal(err)
		}
		n := strings.TrimSuffix(h.Name, "/")
		order = append(order, n)
		files[n] = entry{typ: h.Typeflag, mode: h.Mode, link: h.Linkname, data: string(data)}
	}
	if !sort.StringsAreSorted(order) {
		t.Errorf("layer entries not sorted: %q", order)
	}
	return img, files
}

func untar(t *testing.T, p, dir string) {
	t.Helper()
	f, err := os.Open(p)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	tr := tar.NewReader(f)
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return
		}
		if err != nil {
			t.Fatal(err)
		}
		dst := filepath.Join(dir, filepath.Clean("/"+h.Name))
		switch h.Typeflag {
		case tar.TypeDir:
			err = os.MkdirAll(dst, 0o755)
		case tar.TypeReg:
			var b []byte
			if b, err = io.ReadAll(tr); err == nil {
				err = os.WriteFile(dst, b, 0o644)
			}
		default:
			t.Fatalf("%s: unexpected type %c in an image tarball", h.Name, h.Typeflag)
		}
		if err != nil {
			t.Fatal(err)
		}
	}
}

func names(files map[string]entry) []string {
	var n []string
	for k := range files {
		n = append(n, k)
	}
	sort.Strings(n)
	return n
}

var applets = []string{"bin/sh", "bin/busybox", "usr/bin/wget", "sbin/ip", "usr/sbin/chroot", "linuxrc", "bin/sh"}

func writeAgnhost(t *testing.T, p string) v1.Image {
	t.Helper()
	img, err := AgnhostImage([]byte("fake agnhost"), []byte("fake busybox"), applets)
	if err != nil {
		t.Fatal(err)
	}
	if err := WriteTarball(p, AgnhostRef, img); err != nil {
		t.Fatal(err)
	}
	return img
}

func TestAgnhostImage(t *testing.T) {
	p := filepath.Join(t.TempDir(), AgnhostTar)
	writeAgnhost(t, p)
	img, files := readBack(t, p, AgnhostRef)

	want := []string{"agnhost", "agnhost-2", "bin", "bin/busybox", "bin/sh", "etc", "etc/group", "etc/passwd",
		"localhost.crt", "localhost.key", "root", "sbin", "sbin/ip", "tmp", "uploads", "usr", "usr/bin", "usr/bin/wget", "usr/sbin", "usr/sbin/chroot"}
	if got := names(files); !reflect.DeepEqual(got, want) {
		t.Errorf("files:\n got %q\nwant %q", got, want)
	}
	for _, a := range []string{"bin/sh", "usr/bin/wget", "sbin/ip", "usr/sbin/chroot"} {
		if e := files[a]; e.typ != tar.TypeSymlink || e.link != "/bin/busybox" || e.mode != 0o777 {
			t.Errorf("%s: %+v, want a symlink to /bin/busybox", a, e)
		}
	}
	if e := files["agnhost"]; e.typ != tar.TypeReg || e.mode != 0o755 || e.data != "fake agnhost" {
		t.Errorf("agnhost: %+v", e)
	}
	if e := files["bin/busybox"]; e.typ != tar.TypeReg || e.mode != 0o755 || e.data != "fake busybox" {
		t.Errorf("bin/busybox: %+v", e)
	}
	if e := files["tmp"]; e.typ != tar.TypeDir || e.mode != 0o1777 {
		t.Errorf("tmp: %+v, want a 1777 directory", e)
	}
	for _, l := range []string{"root:x:0:0:", "nobody:x:65534:65534:"} {
		if !strings.Contains(files["etc/passwd"].data, l) {
			t.Errorf("/etc/passwd lacks %q:\n%s", l, files["etc/passwd"].data)
		}
	}
	for _, l := range []string{"root:x:0:", "nogroup:x:65534:"} {
		if !strings.Contains(files["etc/group"].data, l) {
			t.Errorf("/etc/group lacks %q:\n%s", l, files["etc/group"].data)
		}
	}

	cf, err := img.ConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	c := cf.Config
	if !reflect.DeepEqual(c.Entrypoint, []string{"/agnhost"}) || !reflect.DeepEqual(c.Cmd, []string{"pause"}) ||
		c.User != "" || !reflect.DeepEqual(c.Env, []string{defaultPath}) {
		t.Errorf("config: entrypoint %q cmd %q user %q env %q", c.Entrypoint, c.Cmd, c.User, c.Env)
	}
}

func TestDeterministic(t *testing.T) {
	dir := t.TempDir()
	a, b := filepath.Join(dir, "a.tar"), filepath.Join(dir, "b.tar")
	da, err := writeAgnhost(t, a).Digest()
	if err != nil {
		t.Fatal(err)
	}
	db, err := writeAgnhost(t, b).Digest()
	if err != nil {
		t.Fatal(err)
	}
	if da != db {
		t.Errorf("two builds: digests %s and %s", da, db)
	}
	if ha, hb := fileHash(t, a), fileHash(t, b); ha != hb {
		t.Errorf("two builds: tarballs differ (%x, %x)", ha, hb)
	}
	// and a change in any input changes the digest
	img, err := AgnhostImage([]byte("fake agnhost 2"), []byte("fake busybox"), applets)
	if err != nil {
		t.Fatal(err)
	}
	if dc, _ := img.Digest(); dc == da {
		t.Errorf("different agnhost, same digest %s", dc)
	}
}

func fileHash(t *testing.T, p string) [32]byte {
	t.Helper()
	b, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	return sha256.Sum256(b)
}

func needTool(t *testing.T, tool string) {
	t.Helper()
	if _, err := exec.LookPath(tool); err != nil {
		if os.Getenv("CI") != "" {
			t.Fatalf("%s not found", tool)
		}
		t.Skipf("%s not found", tool)
	}
}

func TestPauseImage(t *testing.T) {
	needTool(t, "gcc")
	dir := t.TempDir()
	// A stand-in for upstream's pause.c that only compiles with the VERSION
	// upstream's Makefile passes.
	src := "#include <stdio.h>\n#ifndef VERSION\n#error VERSION unset\n#endif\n" +
		"#define STR(x) #x\n#define XSTR(x) STR(x)\nint main(void) { puts(XSTR(VERSION)); return 0; }\n"
	if err := os.WriteFile(filepath.Join(dir, "pause.c"), []byte(src), 0o644); err != nil {
		t.Fatal(err)
	}
	bin := filepath.Join(dir, "pause")
	if err := CompilePause(context.Background(), dir, bin); err != nil {
		t.Fatal(err)
	}
	if err := CheckStatic(bin); err != nil {
		t.Errorf("compiled pause: %v", err)
	}
	if out, err := exec.Command(bin).Output(); err != nil || string(out) != "v3.10\n" {
		t.Errorf("pause prints %q (%v), want v3.10", out, err)
	}
	data, err := os.ReadFile(bin)
	if err != nil {
		t.Fatal(err)
	}
	img, err := PauseImage(data)
	if err != nil {
		t.Fatal(err)
	}
	p := filepath.Join(dir, PauseTar)
	if err := WriteTarball(p, PauseRef, img); err != nil {
		t.Fatal(err)
	}
	img, files := readBack(t, p, PauseRef)
	if got := names(files); !reflect.DeepEqual(got, []string{"pause"}) {
		t.Errorf("files %q, want [pause]", got)
	}
	if e := files["pause"]; e.mode != 0o755 || e.data != string(data) {
		t.Errorf("pause: mode %o, %d bytes, want 755, %d bytes", e.mode, len(e.data), len(data))
	}
	cf, err := img.ConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	if c := cf.Config; !reflect.DeepEqual(c.Entrypoint, []string{"/pause"}) || c.Cmd != nil || c.User != "65535:65535" {
		t.Errorf("config: entrypoint %q cmd %q user %q", c.Entrypoint, c.Cmd, c.User)
	}

	if err := CompilePause(context.Background(), t.TempDir(), bin); err == nil {
		t.Error("CompilePause without pause.c succeeded")
	}
}

func fakeLaceBins() map[string][]byte {
	bins := map[string][]byte{}
	for _, b := range LaceBinaries {
		bins[b] = []byte("fake " + b)
	}
	return bins
}

func TestLaceImage(t *testing.T) {
	img, err := LaceImage(fakeLaceBins())
	if err != nil {
		t.Fatal(err)
	}
	ref := LaceRef("t1")
	if ref != "ghcr.io/lace-cni/lace:t1" {
		t.Errorf("LaceRef = %s", ref)
	}
	p := filepath.Join(t.TempDir(), LaceTar)
	if err := WriteTarball(p, ref, img); err != nil {
		t.Fatal(err)
	}
	img, files := readBack(t, p, ref)
	want := []string{"tmp", "usr", "usr/bin", "usr/bin/lace-agent", "usr/bin/lace-cni", "usr/bin/lace-controller", "usr/bin/lacectl"}
	if got := names(files); !reflect.DeepEqual(got, want) {
		t.Errorf("files:\n got %q\nwant %q", got, want)
	}
	for _, b := range LaceBinaries {
		if e := files["usr/bin/"+b]; e.typ != tar.TypeReg || e.mode != 0o755 || e.data != "fake "+b {
			t.Errorf("%s: %+v", b, e)
		}
	}
	cf, err := img.ConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	if c := cf.Config; c.Entrypoint != nil || c.Cmd != nil || c.User != "" {
		t.Errorf("config: entrypoint %q cmd %q user %q, want none", c.Entrypoint, c.Cmd, c.User)
	}

	bins := fakeLaceBins()
	delete(bins, "lace-cni")
	if _, err := LaceImage(bins); err == nil {
		t.Error("LaceImage without lace-cni succeeded")
	}
}

func TestNewImageRejects(t *testing.T) {
	for _, files := range [][]File{
		{{Path: "a", Data: nil}, {Path: "/a/", Data: nil}},
		{{Path: "a", Data: nil}, {Path: "a/b", Data: nil}},
		{{Path: "/", Dir: true}},
	} {
		if _, err := NewImage(files, v1.Config{}, Arch); err == nil {
			t.Errorf("NewImage(%+v) succeeded", files)
		}
	}
}

func TestBusyboxApplets(t *testing.T) {
	fake := filepath.Join(t.TempDir(), "busybox")
	script := "#!/bin/sh\n[ \"$1\" = --list-full ] || exit 1\nprintf 'bin/sh\\nusr/bin/wget\\n'\n"
	if err := os.WriteFile(fake, []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	got, err := BusyboxApplets(context.Background(), fake)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(got, []string{"bin/sh", "usr/bin/wget"}) {
		t.Errorf("applets %q", got)
	}
	if _, err := BusyboxApplets(context.Background(), filepath.Join(t.TempDir(), "missing")); err == nil {
		t.Error("BusyboxApplets of a missing binary succeeded")
	}
}

func TestCheckStatic(t *testing.T) {
	// Debian's /bin/sh (dash) is dynamically linked.
	if err := CheckStatic("/bin/sh"); err == nil {
		t.Error("CheckStatic(/bin/sh) succeeded")
	}
	notELF := filepath.Join(t.TempDir(), "script")
	if err := os.WriteFile(notELF, []byte("#!/bin/sh\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := CheckStatic(notELF); err == nil {
		t.Error("CheckStatic(script) succeeded")
	}
}

func TestImageRefsDockerArchive(t *testing.T) {
	img, err := LaceImage(fakeLaceBins())
	if err != nil {
		t.Fatal(err)
	}
	a, _ := name.NewTag("example.com/a:1")
	b, _ := name.NewTag("example.com/b:2")
	p := filepath.Join(t.TempDir(), "docker.tar")
	// go-containerregistry's own writer: manifest.json only, no index.json.
	if err := tarball.MultiRefWriteToFile(p, map[name.Reference]v1.Image{a: img, b: img}); err != nil {
		t.Fatal(err)
	}
	refs, err := ImageRefs(p)
	if err != nil {
		t.Fatal(err)
	}
	sort.Strings(refs)
	if !reflect.DeepEqual(refs, []string{"example.com/a:1", "example.com/b:2"}) {
		t.Errorf("ImageRefs = %q", refs)
	}
	if _, err := ImageRefs(writeFile(t, "x.tar", tarOf(t, "hello", "world"))); err == nil {
		t.Error("ImageRefs of a tarball without index.json or manifest.json succeeded")
	}
}

func tarOf(t *testing.T, name, data string) []byte {
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	if err := tw.WriteHeader(&tar.Header{Name: name, Mode: 0o644, Size: int64(len(data))}); err != nil {
		t.Fatal(err)
	}
	tw.Write([]byte(data))
	tw.Close()
	return buf.Bytes()
}

func writeFile(t *testing.T, name string, data []byte) string {
	p := filepath.Join(t.TempDir(), name)
	if err := os.WriteFile(p, data, 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

func TestCoreDNSImage(t *testing.T) {
	bin := writeFile(t, "coredns", []byte("fake coredns"))
	out := t.TempDir()
	if _, err := BuildCoreDNS(context.Background(), Options{Out: out, CoreDNS: bin}); err == nil {
		t.Error("BuildCoreDNS took a binary that is not ELF")
	}
	img, err := CoreDNSImage([]byte("fake coredns"))
	if err != nil {
		t.Fatal(err)
	}
	p := filepath.Join(out, CoreDNSTar)
	if err := WriteTarball(p, CoreDNSRef, img); err != nil {
		t.Fatal(err)
	}
	img, files := readBack(t, p, CoreDNSRef)
	if got := names(files); !reflect.DeepEqual(got, []string{"coredns"}) {
		t.Errorf("files %q, want only coredns", got)
	}
	if e := files["coredns"]; e.typ != tar.TypeReg || e.mode != 0o755 || e.data != "fake coredns" {
		t.Errorf("coredns: %+v", e)
	}
	cf, err := img.ConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	// kubeadm's manifest passes only args (-conf ...): the entrypoint must
	// be the binary, as upstream's is.
	if c := cf.Config; !reflect.DeepEqual(c.Entrypoint, []string{"/coredns"}) || c.Cmd != nil || c.User != "" {
		t.Errorf("config: entrypoint %q cmd %q user %q, want [/coredns], none, root", c.Entrypoint, c.Cmd, c.User)
	}
}

// TestPorterCertificate: the agnhost images carry a key pair porter's TLS
// ports can serve with (upstream's test certificate).
func TestPorterCertificate(t *testing.T) {
	if _, err := tls.X509KeyPair(porterCert, porterKey); err != nil {
		t.Fatalf("porter's localhost.crt and localhost.key: %v", err)
	}
}

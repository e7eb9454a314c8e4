package images

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"sort"
	"strings"
	"syscall"
	"testing"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"golang.org/x/sys/unix"

	"github.com/lace-cni/lace/internal/testutil"
)

// containerd is a throwaway containerd: its own root, state and socket under
// a temporary directory, the CRI plugin disabled (it would set up CNI and
// reach for the network). Import needs no more than the content store, the
// image store and the overlayfs snapshotter.
type containerd struct {
	dir, socket string
}

func startContainerd(t *testing.T) *containerd {
	t.Helper()
	testutil.SkipUnit(t, "root (containerd, overlay mounts)")
	if os.Geteuid() != 0 {
		if os.Getenv("CI") != "" {
			t.Fatal("the containerd import test needs root")
		}
		t.Skip("the containerd import test needs root (containerd, overlay mounts)")
	}
	needTool(t, "containerd")
	needTool(t, "ctr")

	// Short: the socket path must fit a sockaddr_un (108 bytes).
	dir, err := os.MkdirTemp("", "lace-ctrd-")
	if err != nil {
		t.Fatal(err)
	}
	c := &containerd{dir: dir, socket: filepath.Join(dir, "containerd.sock")}
	config := fmt.Sprintf(`version = 2
root = %[1]q
state = %[2]q
disabled_plugins = ["io.containerd.grpc.v1.cri"]

[grpc]
  address = %[3]q

[ttrpc]
  address = %[4]q

[plugins."io.containerd.internal.v1.opt"]
  path = %[5]q
`, filepath.Join(dir, "root"), filepath.Join(dir, "state"), c.socket, c.socket+".ttrpc", filepath.Join(dir, "opt"))
	cfgPath := filepath.Join(dir, "config.toml")
	if err := os.WriteFile(cfgPath, []byte(config), 0o644); err != nil {
		t.Fatal(err)
	}
	logf, err := os.Create(filepath.Join(dir, "containerd.log"))
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command("containerd", "--config", cfgPath)
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()

	t.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-exited:
		case <-time.After(10 * time.Second):
			_ = cmd.Process.Kill()
			<-exited
		}
		logf.Close()
		if t.Failed() {
			if b, err := os.ReadFile(logf.Name()); err == nil {
				t.Logf("containerd log:\n%s", b)
			}
		}
		unmountUnder(t, dir)
		if err := os.RemoveAll(dir); err != nil {
			t.Errorf("remove %s: %v", dir, err)
		}
	})

	testutil.Eventually(t, 20*time.Second, 100*time.Millisecond, "containerd serving", func() error {
		select {
		case err := <-exited:
			exited <- err
			return fmt.Errorf("containerd exited: %v", err)
		default:
		}
		_, err := c.ctr("version")
		return err
	})
	return c
}

// unmountUnder detaches every mount at or below dir, deepest first: overlay
// snapshots and the snapshotter's own bind mounts may outlive containerd.
func unmountUnder(t *testing.T, dir string) {
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		t.Errorf("mountinfo: %v", err)
		return
	}
	defer f.Close()
	var mounts []string
	s := bufio.NewScanner(f)
	for s.Scan() {
		fields := strings.Fields(s.Text())
		if len(fields) < 5 {
			continue
		}
		if mp := fields[4]; mp == dir || strings.HasPrefix(mp, dir+"/") {
			mounts = append(mounts, mp)
		}
	}
	sort.Sort(sort.Reverse(sort.StringSlice(mounts)))
	for _, mp := range mounts {
		if err := unix.Unmount(mp, unix.MNT_DETACH); err != nil {
			t.Errorf("unmount %s: %v", mp, err)
		}
	}
}

func (c *containerd) ctr(args ...string) (string, error) {
	args = append([]string{"--address", c.socket}, args...)
	out, err := exec.Command("ctr", args...).CombinedOutput()
	if err != nil {
		return "", fmt.Errorf("ctr %s: %w: %s", strings.Join(args, " "), err, out)
	}
	return string(out), nil
}

func (c *containerd) refs(t *testing.T, ns string) []string {
	t.Helper()
	out, err := c.ctr("-n", ns, "images", "ls", "-q")
	if err != nil {
		t.Fatal(err)
	}
	refs := strings.Fields(out)
	sort.Strings(refs)
	return refs
}

// TestImportContainerd imports each kind of image into a real containerd
// and checks it is there by its exact name, unpacked, and takes a second
// name.
func TestImportContainerd(t *testing.T) {
	c := startContainerd(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	dir := t.TempDir()

	busybox := []byte("fake busybox")
	var busyboxApplets []string
	if CheckStatic("/bin/busybox") == nil {
		// The real one, so that unpacking sees the real applet set.
		var err error
		if busybox, err = os.ReadFile("/bin/busybox"); err != nil {
			t.Fatal(err)
		}
		if busyboxApplets, err = BusyboxApplets(ctx, "/bin/busybox"); err != nil {
			t.Fatal(err)
		}
	} else {
		busyboxApplets = applets
	}
	agnhost, err := AgnhostImage([]byte("fake agnhost"), busybox, busyboxApplets)
	if err != nil {
		t.Fatal(err)
	}
	pause, err := PauseImage([]byte("fake pause"))
	if err != nil {
		t.Fatal(err)
	}
	lace, err := LaceImage(fakeLaceBins())
	if err != nil {
		t.Fatal(err)
	}
	dev, upgrade := LaceRef("dev"), LaceRef("upgrade")
	for _, tc := range []struct {
		tar, ref string
		img      v1.Image
		retag    map[string]string
	}{
		{AgnhostTar, AgnhostRef, agnhost, nil},
		{PauseTar, PauseRef, pause, nil},
		{LaceTar, dev, lace, map[string]string{dev: upgrade}},
	} {
		p := filepath.Join(dir, tc.tar)
		if err := WriteTarball(p, tc.ref, tc.img); err != nil {
			t.Fatal(err)
		}
		// Twice: a second import of the same tarball (a node restart, a
		// repeated `lace-lab load`) succeeds and changes nothing.
		for i := 0; i < 2; i++ {
			if err := Import(ctx, "", c.socket, "k8s.io", p, tc.retag); err != nil {
				t.Fatalf("import #%d: %v", i+1, err)
			}
		}
	}
	want := []string{AgnhostRef, upgrade, dev, PauseRef}
	sort.Strings(want)
	if got := c.refs(t, "k8s.io"); !reflect.DeepEqual(got, want) {
		t.Errorf("ctr images ls -q:\n got %q\nwant %q", got, want)
	}
	if got := c.refs(t, "default"); len(got) != 0 {
		t.Errorf("namespace default has %q, want nothing", got)
	}

	// Unpacked: a one-layer image's chain ID is its layer's diff ID, the key
	// of its committed overlayfs snapshot.
	out, err := c.ctr("-n", "k8s.io", "snapshots", "--snapshotter", "overlayfs", "ls")
	if err != nil {
		t.Fatal(err)
	}
	for _, img := range []v1.Image{agnhost, pause, lace} {
		cf, err := img.ConfigFile()
		if err != nil {
			t.Fatal(err)
		}
		if id := cf.RootFS.DiffIDs[0].String(); !strings.Contains(out, id) {
			t.Errorf("no snapshot %s (image not unpacked):\n%s", id, out)
		}
	}

	// Retagging to a name that exists moves the name: roll "upgrade" back
	// onto another image.
	if err := Import(ctx, "ctr", c.socket, "k8s.io", filepath.Join(dir, PauseTar), map[string]string{PauseRef: upgrade}); err != nil {
		t.Fatal(err)
	}
	out, err = c.ctr("-n", "k8s.io", "images", "ls")
	if err != nil {
		t.Fatal(err)
	}
	pd, err := pause.Digest()
	if err != nil {
		t.Fatal(err)
	}
	if !hasLine(out, upgrade, pd.String()) {
		t.Errorf("%s does not point at pause (%s):\n%s", upgrade, pd, out)
	}

	if err := Import(ctx, "", c.socket, "k8s.io", filepath.Join(dir, "missing.tar"), nil); err == nil {
		t.Error("import of a missing tarball succeeded")
	}
	if err := Import(ctx, "", c.socket, "k8s.io", filepath.Join(dir, PauseTar), map[string]string{"example.com/none:1": "example.com/x:1"}); err == nil {
		t.Error("retag of a missing image succeeded")
	}
}

func hasLine(out string, fields ...string) bool {
	for _, l := range strings.Split(out, "\n") {
		f := strings.Fields(l)
		ok := len(f) > 0 && f[0] == fields[0]
		for _, want := range fields[1:] {
			ok = ok && strings.Contains(l, want)
		}
		if ok {
			return true
		}
	}
	return false
}

// TestImportBuilt imports the tarballs `make images` wrote (LACE_IMAGES,
// exported by the Makefile) and checks every name they carry arrives.
func TestImportBuilt(t *testing.T) {
	dir := os.Getenv("LACE_IMAGES")
	if dir == "" {
		t.Skip("LACE_IMAGES unset: run through `make test`, which builds the images first")
	}
	c := startContainerd(t)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	var want []string
	for _, n := range []string{AgnhostTar, PauseTar, LaceTar} {
		p := filepath.Join(dir, n)
		refs, err := ImageRefs(p)
		if err != nil {
			t.Fatal(err)
		}
		if len(refs) != 1 {
			t.Errorf("%s names %q, want one image", p, refs)
		}
		want = append(want, refs...)
		if err := Import(ctx, "", c.socket, "k8s.io", p, nil); err != nil {
			t.Fatal(err)
		}
	}
	sort.Strings(want)
	if got := c.refs(t, "k8s.io"); !reflect.DeepEqual(got, want) {
		t.Errorf("ctr images ls -q:\n got %q\nwant %q", got, want)
	}
	for _, r := range []string{AgnhostRef, PauseRef} {
		if !contains(want, r) {
			t.Errorf("%s is not among the built images %q", r, want)
		}
	}
}

func contains(s []string, v string) bool {
	for _, x := range s {
		if x == v {
			return true
		}
	}
	return false
}

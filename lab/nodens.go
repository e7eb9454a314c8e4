package lab

import (
	"errors"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"
)

// A node's mount namespace is what makes one machine hold several kubelets
// and containerds: each sees the machine's files, but its own /etc, /opt
// and /var (overlays whose upper layers live in the node's state directory),
// its own /run, bpffs and kubelet directories, and the kernel tunables the
// kubelet insists on writing as plain files. Nothing done here is visible
// outside the namespace: Go's exec makes / private in a child that
// unshares its mount namespace, so no mount propagates back to the
// machine, and the namespace with all its mounts disappears with the last
// process in it.

// overlayDirs are the machine's directories a node sees through an overlay,
// so that what the node writes there (CNI config and binaries, kubelet and
// containerd files) stays the node's.
var overlayDirs = []string{"/etc", "/opt", "/var"}

// privateDirs are bound from real directories of the node (overlayfs cannot
// hold containerd's overlay snapshots, and the kubelet mounts volumes under
// its root dir).
var privateDirs = []string{"/var/lib/containerd", "/var/lib/kubelet"}

// kubeletTunables are the sysctls the kubelet sets at start. They are not
// per network namespace, so each node gets a private file in their place.
var kubeletTunables = []string{
	"vm/overcommit_memory", "vm/panic_on_oom", "kernel/panic", "kernel/panic_on_oops",
	"kernel/keys/root_maxkeys", "kernel/keys/root_maxbytes",
}

// nodeFS lays out a node's state directory as the holder mounts it.
type nodeFS string

func (d nodeFS) upper(dir string) string { return filepath.Join(string(d), "fs", dir, "upper") }
func (d nodeFS) work(dir string) string  { return filepath.Join(string(d), "fs", dir, "work") }
func (d nodeFS) private(dir string) string {
	return filepath.Join(string(d), "private", strings.ReplaceAll(strings.TrimPrefix(dir, "/"), "/", "_"))
}
func (d nodeFS) tunable(name string) string {
	return filepath.Join(string(d), "sysctl", strings.ReplaceAll(name, "/", "_"))
}

// path is where a file the node sees at p is written before the node's
// mount namespace exists (into the upper layer of its overlay).
func (d nodeFS) path(p string) string {
	for _, o := range overlayDirs {
		if rest, ok := strings.CutPrefix(p, o+"/"); ok {
			return filepath.Join(d.upper(o), rest)
		}
	}
	panic(fmt.Sprintf("lab: %s is not under a node overlay", p))
}

// prepare creates the directories the holder mounts from.
func (d nodeFS) prepare() error {
	for _, o := range overlayDirs {
		for _, p := range []string{d.upper(o), d.work(o)} {
			if err := os.MkdirAll(p, 0o755); err != nil {
				return err
			}
		}
	}
	for _, p := range privateDirs {
		if err := os.MkdirAll(d.private(p), 0o755); err != nil {
			return err
		}
	}
	if err := os.MkdirAll(filepath.Join(string(d), "sysctl"), 0o755); err != nil {
		return err
	}
	for _, t := range kubeletTunables {
		b, err := os.ReadFile(filepath.Join("/proc/sys", t))
		if err != nil {
			continue // a tunable this kernel lacks is one the kubelet skips too
		}
		if err := os.WriteFile(d.tunable(t), b, 0o644); err != nil {
			return err
		}
	}
	return nil
}

// RunNodeNS is the holder of a node's mount namespace (`lace-lab nodens`),
// started by the lab daemon in a fresh mount, UTS and PID namespace: it
// mounts the node's view, says "ready" on stdout and waits to be killed.
//
// The holder is PID 1 of the node's PID namespace, where its containerd,
// kubelet and every container of the node run: a hostPID pod sees the
// node's processes as on a real node, and none of the machine's (the
// other nodes, the API server, etcd, the lab itself). As PID 1 it reaps
// the orphans the namespace's processes leave (the runtime's shims,
// processes whose nsenter is gone), and when it ends the kernel kills
// everything left in the namespace, so a node never outlives its holder.
func RunNodeNS(dir, hostname string) error {
	// Subscribed before anything can be orphaned to this process.
	sig := make(chan os.Signal, 16)
	signal.Notify(sig, syscall.SIGTERM, syscall.SIGINT, syscall.SIGCHLD)
	if err := mountNode(nodeFS(dir)); err != nil {
		return err
	}
	// hostNetwork pods share the node's UTS namespace, as on a real node.
	if err := unix.Sethostname([]byte(hostname)); err != nil {
		return fmt.Errorf("set hostname: %w", err)
	}
	fmt.Println("ready")
	for s := range sig {
		if s != syscall.SIGCHLD {
			return nil
		}
		reapChildren()
	}
	return nil
}

// reapChildren collects every child that has ended: as its namespace's
// PID 1 the holder inherits the node's orphans, which would otherwise
// stay zombies.
func reapChildren() {
	for {
		var ws unix.WaitStatus
		pid, err := unix.Wait4(-1, &ws, unix.WNOHANG, nil)
		if pid <= 0 || err != nil {
			return
		}
	}
}

// parentPID is the parent's PID as the machine numbers it. In its own PID
// namespace the holder's getppid is 0 (its parent is outside), but until
// the node's /proc is mounted /proc is the machine's, which tells.
func parentPID() (int, error) {
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return 0, err
	}
	for _, l := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(l, "PPid:"); ok {
			return strconv.Atoi(strings.TrimSpace(v))
		}
	}
	return 0, errors.New("no PPid in /proc/self/status")
}

func mountNode(d nodeFS) error {
	// Mounts made below must not reach the machine, nor the node's /proc
	// show the machine's processes: check rather than trust that the
	// parent made the namespaces.
	ppid, err := parentPID()
	if err != nil {
		return fmt.Errorf("parent of nodens: %w", err)
	}
	for _, ns := range []string{"mnt", "uts", "pid"} {
		self, err1 := os.Readlink("/proc/self/ns/" + ns)
		parent, err2 := os.Readlink(fmt.Sprintf("/proc/%d/ns/%s", ppid, ns))
		if err := errors.Join(err1, err2); err != nil {
			return fmt.Errorf("read %s namespaces: %w", ns, err)
		}
		if self == parent {
			return fmt.Errorf("nodens must run in its own %s namespace", ns)
		}
	}
	if os.Getpid() != 1 {
		return fmt.Errorf("nodens must be PID 1 of its PID namespace, is %d", os.Getpid())
	}
	for _, o := range overlayDirs {
		opts := fmt.Sprintf("lowerdir=%s,upperdir=%s,workdir=%s", o, d.upper(o), d.work(o))
		if err := unix.Mount("overlay", o, "overlay", 0, opts); err != nil {
			return fmt.Errorf("overlay %s: %w", o, err)
		}
	}
	for _, p := range privateDirs {
		if err := bind(d.private(p), p); err != nil {
			return err
		}
	}
	if err := unix.Mount("tmpfs", "/run", "tmpfs", unix.MS_NOSUID|unix.MS_NODEV, "mode=0755"); err != nil {
		return fmt.Errorf("tmpfs /run: %w", err)
	}
	if err := unix.Mount("bpffs", "/sys/fs/bpf", "bpf", 0, "mode=0700"); err != nil {
		return fmt.Errorf("bpffs /sys/fs/bpf: %w", err)
	}
	// The node's own /proc: its processes only, as its kubelet, runc and
	// containers resolve the PIDs they are given (runc opens
	// /proc/<pid>/ns/* of the PIDs it forks, numbered in this namespace).
	if err := unix.Mount("proc", "/proc", "proc", unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, ""); err != nil {
		return fmt.Errorf("proc /proc: %w", err)
	}
	for _, t := range kubeletTunables {
		if _, err := os.Stat(d.tunable(t)); err != nil {
			continue
		}
		if err := unix.Mount(d.tunable(t), filepath.Join("/proc/sys", t), "", unix.MS_BIND, ""); err != nil {
			return fmt.Errorf("bind sysctl %s: %w", t, err)
		}
	}
	// Like a host booted by systemd: containers may ask for HostToContainer
	// or Bidirectional propagation of the node's mounts.
	if err := unix.Mount("", "/", "", unix.MS_SHARED|unix.MS_REC, ""); err != nil {
		return fmt.Errorf("make / shared: %w", err)
	}
	return nil
}

func bind(src, dst string) error {
	if err := os.MkdirAll(dst, 0o755); err != nil {
		return err
	}
	if err := unix.Mount(src, dst, "", unix.MS_BIND|unix.MS_REC, ""); err != nil {
		return fmt.Errorf("bind %s on %s: %w", src, dst, err)
	}
	return nil
}

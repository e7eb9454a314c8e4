package lab

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/lace-cni/lace/internal/netutil"
	"github.com/lace-cni/lace/lab/controlplane"
	"github.com/lace-cni/lace/lab/images"
)

// controlClient talks to a lab daemon over its unix socket.
func controlClient(c Config) *http.Client {
	return &http.Client{
		Timeout: 10 * time.Second,
		Transport: &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, "unix", c.Socket())
		}},
	}
}

// GetStatus asks the lab's daemon for its status; it fails when no daemon
// answers.
func GetStatus(c Config) (*Status, error) {
	resp, err := controlClient(c).Get("http://lab/status")
	if err != nil {
		return nil, fmt.Errorf("lab %s is not running: %w", c.Name, err)
	}
	defer resp.Body.Close()
	var st Status
	if err := json.NewDecoder(resp.Body).Decode(&st); err != nil {
		return nil, fmt.Errorf("read status of lab %s: %w", c.Name, err)
	}
	return &st, nil
}

// Up starts lab c in the background and waits until it is ready. Starting
// a lab that is already running is a no-op.
func Up(ctx context.Context, c Config, out io.Writer) (*Status, error) {
	if err := c.Validate(); err != nil {
		return nil, err
	}
	if st, err := GetStatus(c); err == nil && st.Error == "" {
		if c.DNS && !st.DNS {
			return nil, fmt.Errorf("lab %s runs without cluster DNS: take it down first (lace-lab down --name %s)", c.Name, c.Name)
		}
		fmt.Fprintf(out, "lab %s is already running\n", c.Name)
		return waitUp(ctx, c, st.PID)
	}
	if err := checkBinaries(c); err != nil {
		return nil, err
	}
	// Whatever a crashed run of this lab left goes first.
	if err := Cleanup(c); err != nil {
		return nil, err
	}
	if err := os.MkdirAll(filepath.Join(c.StateDir(), "logs"), 0o755); err != nil {
		return nil, fmt.Errorf("create lab state dir: %w", err)
	}
	self, err := os.Executable()
	if err != nil {
		return nil, err
	}
	logPath := filepath.Join(c.StateDir(), "logs", "lab.log")
	logf, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, err
	}
	defer logf.Close()
	cmd := exec.Command(self, "daemon",
		"--name", c.Name, "--nodes", strconv.Itoa(c.Nodes), "--zones", strconv.Itoa(c.Zones),
		"--state-root", c.StateRoot, "--k8s-bin", c.K8sBinDir, "--cni-bin", c.CNIBinDir,
		"--cni", c.CNI, "--flannel", c.Flannel, "--images", c.ImageDir, "--helm", c.Helm,
		"--lace-tag", c.LaceTag, "--dns="+strconv.FormatBool(c.DNS), "--set", c.HelmSet)
	cmd.Env = append(os.Environ(), EnvLab+"="+c.Name)
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start lab daemon: %w", err)
	}
	pid := cmd.Process.Pid
	_ = cmd.Process.Release()
	fmt.Fprintf(out, "starting lab %s (%d nodes, %d zones); logs in %s\n", c.Name, c.Nodes, c.Zones, filepath.Dir(logPath))
	st, err := waitUp(ctx, c, pid)
	if err != nil {
		tail := tailFile(logPath, 3000)
		_ = Cleanup(c)
		return nil, fmt.Errorf("%w\n--- lab log ---\n%s", err, tail)
	}
	return st, nil
}

func waitUp(ctx context.Context, c Config, pid int) (*Status, error) {
	deadline := time.Now().Add(5 * time.Minute)
	for time.Now().Before(deadline) {
		st, err := GetStatus(c)
		if err == nil {
			if st.Error != "" {
				return nil, fmt.Errorf("lab %s failed: %s", c.Name, st.Error)
			}
			if st.Ready {
				return st, nil
			}
		}
		if syscall.Kill(pid, 0) != nil {
			return nil, fmt.Errorf("lab daemon (pid %d) exited", pid)
		}
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(200 * time.Millisecond):
		}
	}
	return nil, fmt.Errorf("lab %s not ready after 5 minutes", c.Name)
}

func checkBinaries(c Config) error {
	if m := controlplane.MissingBinaries(c.K8sBinDir, "etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler", "kubelet", "kubectl"); len(m) > 0 {
		return fmt.Errorf("missing %s in %s: run 'make k8s-bins'", strings.Join(m, ", "), c.K8sBinDir)
	}
	plugins := []string{"loopback"}
	if c.CNI == CNIBridge || c.CNI == CNIFlannel {
		plugins = append(plugins, "bridge", "host-local")
	}
	if c.CNI == CNIFlannel {
		if _, err := os.Stat(c.Flannel); err != nil {
			return fmt.Errorf("missing flanneld at %s: run 'make flannel'", c.Flannel)
		}
		if m := controlplane.MissingBinaries(c.K8sBinDir, "kube-proxy"); len(m) > 0 {
			return fmt.Errorf("missing kube-proxy in %s: run 'make k8s-bins'", c.K8sBinDir)
		}
	}
	if m := controlplane.MissingBinaries(c.CNIBinDir, plugins...); len(m) > 0 {
		return fmt.Errorf("missing CNI plugins %s in %s: run 'make cni-bins'", strings.Join(m, ", "), c.CNIBinDir)
	}
	for _, img := range c.Images() {
		if _, err := os.Stat(img); err != nil {
			if filepath.Base(img) == images.CoreDNSTar {
				return fmt.Errorf("missing image %s (cluster DNS): run 'make coredns'", img)
			}
			return fmt.Errorf("missing image %s: run 'make images'", img)
		}
	}
	if c.CNI == CNILace {
		if _, err := os.Stat(c.Helm); err != nil {
			return fmt.Errorf("missing helm at %s: run 'make helm'", c.Helm)
		}
	}
	for _, tool := range []string{"ip", "nsenter", "containerd", "ctr", "runc"} {
		if _, err := exec.LookPath(tool); err != nil {
			return fmt.Errorf("the lab needs %s (packages iproute2, util-linux, containerd, runc: 'make deps' installs them)", tool)
		}
	}
	return nil
}

// Down stops lab c and removes everything it made. Stopping a lab that does
// not exist is a no-op; it reports whether there was anything to remove.
func Down(ctx context.Context, c Config) (bool, error) {
	if err := c.Validate(); err != nil {
		return false, err
	}
	found := false
	if st, err := GetStatus(c); err == nil {
		found = true
		resp, err := controlClient(c).Post("http://lab/shutdown", "", nil)
		if err == nil {
			resp.Body.Close()
		}
		deadline := time.Now().Add(3 * time.Minute)
		for time.Now().Before(deadline) && syscall.Kill(st.PID, 0) == nil {
			select {
			case <-ctx.Done():
				return found, ctx.Err()
			case <-time.After(200 * time.Millisecond):
			}
		}
	}
	if leftover(c) {
		found = true
	}
	return found, Cleanup(c)
}

func leftover(c Config) bool {
	if _, err := os.Stat(c.StateDir()); err == nil {
		return true
	}
	nss, _ := labNamespaces(c.Name)
	return len(nss) > 0 || len(labProcesses(c.Name)) > 0 || len(labCgroupRoots(c.Name)) > 0
}

// Cleanup removes whatever lab c left: processes (those of its nodes'
// cgroups included), namespaces and state, without asking a daemon. Use it
// after a crash. The nodes' mounts live in their own mount namespaces and
// go with their last process.
func Cleanup(c Config) error {
	for _, pid := range labProcesses(c.Name) {
		_ = syscall.Kill(pid, syscall.SIGKILL)
	}
	var errs []error
	for _, cg := range labCgroupRoots(c.Name) {
		errs = append(errs, removeCgroupRoot(cg))
	}
	// Killed processes may hold a namespace a moment longer; deleting the
	// name is enough, the kernel frees it with the last process.
	if err := teardownNetwork(c.Name); err != nil {
		errs = append(errs, err)
	}
	if err := os.RemoveAll(c.StateDir()); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// labProcesses lists the processes started by lab name (or by any lab when
// name is empty), found by the EnvLab variable every lab process carries.
func labProcesses(name string) []int {
	ents, err := os.ReadDir("/proc")
	if err != nil {
		return nil
	}
	self := os.Getpid()
	var out []int
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || pid == self {
			continue
		}
		env, err := os.ReadFile(filepath.Join("/proc", e.Name(), "environ"))
		if err != nil {
			continue
		}
		for _, kv := range bytes.Split(env, []byte{0}) {
			v, ok := bytes.CutPrefix(kv, []byte(EnvLab+"="))
			if ok && (name == "" || string(v) == name) {
				out = append(out, pid)
				break
			}
		}
	}
	return out
}

var labNSRE = regexp.MustCompile(`^([a-z][a-z0-9]{0,9})-(fabric|external|n[0-9]+)$`)

// AllLabs lists the names of every lab that left anything on the machine.
func AllLabs(root string) []string {
	names := map[string]bool{}
	if ents, err := os.ReadDir(root); err == nil {
		for _, e := range ents {
			if e.IsDir() && nameRE.MatchString(e.Name()) {
				names[e.Name()] = true
			}
		}
	}
	if nss, err := os.ReadDir("/run/netns"); err == nil {
		for _, e := range nss {
			if m := labNSRE.FindStringSubmatch(e.Name()); m != nil {
				names[m[1]] = true
			}
		}
	}
	for _, cg := range labCgroupRoots("") {
		// lace-lab-<lab>-<node>
		if lab, _, ok := strings.Cut(strings.TrimPrefix(cg, "/lace-lab-"), "-"); ok && nameRE.MatchString(lab) {
			names[lab] = true
		}
	}
	for _, pid := range labProcesses("") {
		env, _ := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "environ"))
		for _, kv := range bytes.Split(env, []byte{0}) {
			if v, ok := bytes.CutPrefix(kv, []byte(EnvLab+"=")); ok && nameRE.Match(v) {
				names[string(v)] = true
			}
		}
	}
	out := make([]string, 0, len(names))
	for n := range names {
		out = append(out, n)
	}
	sort.Strings(out)
	return out
}

// Target is where `lace-lab exec` runs a command: a network namespace and,
// for a node, the node's other namespaces (mount, UTS, PID) and cgroups.
type Target struct {
	// NetNS is the path of the network namespace.
	NetNS string
	// Holder is the machine's PID of the node's namespace holder; 0 for a
	// pod or external.
	Holder int
	// Cgroup is the node's exec cgroup (below its cgroup root, in every
	// hierarchy), "" for a pod or external.
	Cgroup string
}

// ExecTarget resolves an exec target: NAMESPACE/POD (found through the
// pod's node's runtime), node/NODE or external. A node target gets the
// node's exec cgroup, made here if it is missing.
func ExecTarget(ctx context.Context, c Config, target string) (Target, error) {
	switch {
	case target == "external":
		return Target{NetNS: netutil.Path(c.NetNS("external"))}, nil
	case strings.HasPrefix(target, "node/"):
		node := strings.TrimPrefix(target, "node/")
		if !netutil.Exists(c.NetNS(node)) {
			return Target{}, fmt.Errorf("lab %s has no node %q", c.Name, node)
		}
		h, err := holderPID(c, node)
		if err != nil {
			return Target{}, err
		}
		cg := nodeExecCgroup(c, node)
		if err := createCgroup(cg); err != nil {
			return Target{}, err
		}
		return Target{NetNS: netutil.Path(c.NetNS(node)), Holder: h, Cgroup: cg}, nil
	}
	ns, name, ok := strings.Cut(target, "/")
	if !ok || ns == "" || name == "" {
		return Target{}, fmt.Errorf("target %q: want NAMESPACE/POD, node/NODE or external", target)
	}
	netns, err := PodNetNS(ctx, c, ns, name)
	return Target{NetNS: netns}, err
}

// ExecCommand returns a command running argv, a program of the machine, at
// t. A node's command runs as its kubelet does (node.enter), and in the
// node's cgroups, as a process a user starts on a real node: the agent's
// socket hooks, attached to the node's cgroup root, see its connections
// (a ClusterIP answers it as it answers a host-network pod).
//
// A shell moves itself into the cgroups, then becomes nsenter: the caller
// (a test, the lab itself) stays where it is, and nsenter and argv inherit
// the cgroups from the start.
func ExecCommand(t Target, argv []string) (*exec.Cmd, error) {
	ns := []string{"--net=" + t.NetNS}
	if t.Holder != 0 {
		h := t.Holder
		ns = append(ns, fmt.Sprintf("--mount=/proc/%d/ns/mnt", h), fmt.Sprintf("--uts=/proc/%d/ns/uts", h),
			fmt.Sprintf("--pid=/proc/%d/ns/pid", h))
	}
	enter := append(append([]string{"nsenter"}, ns...), "--")
	enter = append(enter, argv...)
	if t.Cgroup == "" {
		return exec.Command(enter[0], enter[1:]...), nil
	}
	procs, err := cgroupProcsFiles(t.Cgroup)
	if err != nil {
		return nil, err
	}
	args := []string{"-c", `while [ "$1" != -- ]; do echo $$ >"$1" || exit 126; shift; done; shift; exec "$@"`, "lace-lab-exec"}
	args = append(append(append(args, procs...), "--"), enter...)
	return exec.Command("sh", args...), nil
}

// Load imports an image tarball into every node's runtime, as `kind load`
// does; with as, the image also gets that reference.
func Load(ctx context.Context, c Config, tarPath, as string) error {
	st, err := GetStatus(c)
	if err != nil {
		return err
	}
	for _, n := range st.Nodes {
		if err := importImage(ctx, c.ContainerdSocket(n.Name), tarPath, as); err != nil {
			return fmt.Errorf("load into %s: %w", n.Name, err)
		}
	}
	return nil
}

// importImage imports tarPath into the containerd at socket, in the CRI
// plugin's namespace; with as, its (single) image also gets that name.
func importImage(ctx context.Context, socket, tarPath, as string) error {
	var retag map[string]string
	if as != "" {
		refs, err := images.ImageRefs(tarPath)
		if err != nil {
			return err
		}
		if len(refs) != 1 {
			return fmt.Errorf("%s holds %d images; --as needs exactly one", tarPath, len(refs))
		}
		retag = map[string]string{refs[0]: as}
	}
	return images.Import(ctx, "ctr", socket, "k8s.io", tarPath, retag)
}

func tailFile(path string, n int) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return ""
	}
	if len(b) > n {
		b = b[len(b)-n:]
	}
	return string(b)
}

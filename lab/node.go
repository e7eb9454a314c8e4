package lab

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/lace-cni/lace/internal/netutil"
	"github.com/lace-cni/lace/lab/controlplane"
)

// Paths inside a node, as its kubelet and containerd see them.
const (
	nodeKubeDir         = "/etc/kubernetes"
	nodeContainerdConf  = "/etc/containerd/config.toml"
	nodeContainerdSock  = "/run/containerd/containerd.sock"
	nodeCNIBinDir       = "/opt/cni/bin"
	nodeCNIConfDir      = "/etc/cni/net.d"
	kubeletPort         = 10250
	kubeletHealthzPort  = 10248
	sandboxImage        = "registry.k8s.io/pause:3.10"
	kubeletReadyTimeout = 2 * time.Minute
)

// node is one lab node: a network namespace on the fabric (made by
// setupNetwork), a mount, UTS and PID namespace held by a holder process, a
// cgroup root, and a real containerd and kubelet running inside them.
type node struct {
	cfg   Config
	index int
	name  string
	zone  string
	fs    nodeFS
	log   *slog.Logger

	holder, containerd, kubelet *controlplane.Process
	// flanneld and kubeProxy run on the nodes of a flannel lab only.
	flanneld, kubeProxy *controlplane.Process
}

func newNode(cfg Config, i int, log *slog.Logger) *node {
	name := cfg.NodeName(i)
	return &node{cfg: cfg, index: i, name: name, zone: cfg.Zone(i),
		fs: nodeFS(cfg.NodeDir(name)), log: log.With("node", name)}
}

func (n *node) netns() string      { return netutil.Path(n.cfg.NetNS(n.name)) }
func (n *node) cgroupRoot() string { return "/" + cgroupPrefix(n.cfg.Name) + n.name }
func (n *node) logPath(component string) string {
	return filepath.Join(n.cfg.StateDir(), "logs", component+"-"+n.name+".log")
}

// processes are the node's long-running processes started so far.
func (n *node) processes() []*controlplane.Process {
	var out []*controlplane.Process
	for _, p := range []*controlplane.Process{n.holder, n.containerd, n.kubelet, n.flanneld, n.kubeProxy} {
		if p != nil {
			out = append(out, p)
		}
	}
	return out
}

// start brings the node up to a running containerd with the lab's images;
// startKubelet then registers it. apiServer is the API server's URL on the
// fabric.
func (n *node) start(ctx context.Context, pki *controlplane.PKI, apiServer string, images []string) error {
	if err := n.fs.prepare(); err != nil {
		return fmt.Errorf("prepare node dir: %w", err)
	}
	if err := n.writeFiles(pki, apiServer); err != nil {
		return err
	}
	return n.boot(ctx, images)
}

// boot starts the node from its disk: routes the reference bridge plugin
// needs, its mount namespace, containerd, and images imported into it.
// A first boot and a reboot (reboot.go) both go through here.
func (n *node) boot(ctx context.Context, images []string) error {
	if err := createCgroupRoot(n.cgroupRoot()); err != nil {
		return err
	}
	if n.cfg.CNI == CNIBridge {
		if err := n.routeBridgePods(); err != nil {
			return err
		}
	}
	if err := n.startHolder(); err != nil {
		return err
	}
	p, err := controlplane.StartCommand("containerd/"+n.name,
		n.enter("containerd", "--config", nodeContainerdConf), n.logPath("containerd"))
	if err != nil {
		return err
	}
	n.containerd = p
	if err := n.waitSocket(ctx, n.cfg.ContainerdSocket(n.name), p); err != nil {
		return fmt.Errorf("containerd of %s: %w", n.name, err)
	}
	for _, img := range images {
		if err := importImage(ctx, n.cfg.ContainerdSocket(n.name), img, ""); err != nil {
			return fmt.Errorf("import %s into %s: %w", filepath.Base(img), n.name, err)
		}
	}
	return nil
}

func (n *node) startKubelet() error {
	v4, v6 := NodeUnderlay(n.index)
	p, err := controlplane.StartCommand("kubelet/"+n.name, n.enter(filepath.Join(n.cfg.K8sBinDir, "kubelet"),
		"--config="+nodeKubeDir+"/kubelet-config.yaml",
		"--kubeconfig="+nodeKubeDir+"/kubelet.conf",
		"--hostname-override="+n.name,
		"--node-ip="+v4.String()+","+v6.String(),
		"--node-labels=topology.kubernetes.io/zone="+n.zone,
		"--v=1",
	), n.logPath("kubelet"))
	if err != nil {
		return err
	}
	n.kubelet = p
	return nil
}

// enter returns a command that runs argv inside the node: its network,
// mount, UTS and PID namespaces. nsenter, not `ip netns exec`, which would
// remount /sys and hide the cgroup tree from the kubelet. Entering a PID
// namespace, nsenter forks argv as its child and waits for it; both share
// the process group that controlplane.Process signals and waits for.
func (n *node) enter(argv ...string) *exec.Cmd {
	h := n.holder.PID()
	args := append([]string{
		fmt.Sprintf("--mount=/proc/%d/ns/mnt", h), fmt.Sprintf("--uts=/proc/%d/ns/uts", h),
		fmt.Sprintf("--pid=/proc/%d/ns/pid", h), "--net=" + n.netns(), "--",
	}, argv...)
	cmd := exec.Command("nsenter", args...)
	cmd.Env = append(os.Environ(), "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin")
	return cmd
}

// startHolder starts the process that owns the node's mount and UTS
// namespaces and waits until it has mounted the node's view.
func (n *node) startHolder() error {
	self, err := os.Executable()
	if err != nil {
		return err
	}
	r, w, err := os.Pipe()
	if err != nil {
		return err
	}
	defer r.Close()
	cmd := exec.Command(self, "nodens", "--dir", string(n.fs), "--hostname", n.name)
	cmd.Stdout = w
	// A PID namespace is entered at clone, not unshare: the holder is its
	// PID 1.
	cmd.SysProcAttr = &syscall.SysProcAttr{Unshareflags: syscall.CLONE_NEWNS | syscall.CLONE_NEWUTS,
		Cloneflags: syscall.CLONE_NEWPID}
	p, err := controlplane.StartCommand("nodens/"+n.name, cmd, n.logPath("nodens"))
	w.Close()
	if err != nil {
		return err
	}
	n.holder = p
	line := make(chan string, 1)
	go func() {
		s, _ := bufio.NewReader(r).ReadString('\n')
		line <- s
	}()
	select {
	case s := <-line:
		if strings.TrimSpace(s) != "ready" {
			return fmt.Errorf("mount namespace of %s: %s", n.name, p.LogTail(1000))
		}
	case <-time.After(10 * time.Second):
		return fmt.Errorf("mount namespace of %s not ready after 10s: %s", n.name, p.LogTail(1000))
	}
	// The node's filesystem, as the node sees it, from the machine's side.
	root := n.cfg.NodeRoot(n.name)
	_ = os.Remove(root)
	return os.Symlink(fmt.Sprintf("/proc/%d/root", p.PID()), root)
}

func (n *node) waitSocket(ctx context.Context, sock string, p *controlplane.Process) error {
	deadline := time.Now().Add(30 * time.Second)
	for time.Now().Before(deadline) {
		if p.Exited() {
			return fmt.Errorf("%v: %s", p.ExitError(), p.LogTail(1500))
		}
		if c, err := net.DialTimeout("unix", sock, time.Second); err == nil {
			c.Close()
			return nil
		}
		if !sleepCtx(ctx, 100*time.Millisecond) {
			return ctx.Err()
		}
	}
	return fmt.Errorf("no socket %s after 30s: %s", sock, p.LogTail(1500))
}

// writeFiles writes the node's certificates, kubeconfig, kubelet and
// containerd configuration and the CNI plugins every node has, into the
// upper layers of its overlays.
func (n *node) writeFiles(pki *controlplane.PKI, apiServer string) error {
	v4, v6 := NodeUnderlay(n.index)
	pkiDir := n.fs.path(nodeKubeDir + "/pki")
	if err := os.MkdirAll(pkiDir, 0o700); err != nil {
		return err
	}
	if err := copyFile(pki.CACert, filepath.Join(pkiDir, "ca.crt")); err != nil {
		return err
	}
	// Serving certificate for the API server's connections (exec, logs,
	// port-forward), verified against the lab CA.
	if err := pki.Issue(filepath.Join(pkiDir, "kubelet.crt"), filepath.Join(pkiDir, "kubelet.key"), n.name, nil,
		[]string{n.name}, []net.IP{v4.AsSlice(), v6.AsSlice()}, true); err != nil {
		return err
	}
	// Client certificate: the Node authorizer and NodeRestriction know the
	// kubelet by this name and group.
	if err := pki.Issue(filepath.Join(pkiDir, "kubelet-client.crt"), filepath.Join(pkiDir, "kubelet-client.key"),
		"system:node:"+n.name, []string{"system:nodes"}, nil, nil, false); err != nil {
		return err
	}
	files := map[string]string{
		nodeKubeDir + "/kubelet.conf":        nodeKubeconfig(apiServer, "system:node:"+n.name, "kubelet-client"),
		nodeKubeDir + "/kubelet-config.yaml": kubeletConfig(n.cgroupRoot(), n.cfg.DNS),
		nodeContainerdConf:                   containerdConfig,
	}
	for p, content := range files {
		if err := writeFile(n.fs.path(p), content, 0o600); err != nil {
			return err
		}
	}
	// Every node ships the loopback plugin (the runtime sets up pods' lo
	// with it), as distributions' CNI plugin packages do; the pod network's
	// plugin is installed by the network's own DaemonSet.
	plugins := []string{"loopback"}
	switch n.cfg.CNI {
	case CNIBridge:
		plugins = append(plugins, "bridge", "host-local")
		if err := WriteBridgeConfig(n.index, n.fs.path(nodeCNIConfDir), "/var/lib/cni/networks"); err != nil {
			return err
		}
	case CNIFlannel:
		plugins = append(plugins, "bridge", "host-local")
		if err := n.writeFlannelFiles(pki, apiServer); err != nil {
			return err
		}
	}
	for _, pl := range plugins {
		dst := filepath.Join(n.fs.path(nodeCNIBinDir), pl)
		if err := copyExecutable(filepath.Join(n.cfg.CNIBinDir, pl), dst); err != nil {
			return err
		}
	}
	return nil
}

// routeBridgePods routes the other nodes' pod ranges over the underlay,
// which the reference bridge plugin leaves to the cluster.
func (n *node) routeBridgePods() error {
	for j := 1; j <= n.cfg.Nodes; j++ {
		if j == n.index {
			continue
		}
		pv4, pv6 := BridgePodCIDRs(j)
		gv4, gv6 := NodeUnderlay(j)
		if err := netutil.EnsureRoute(n.netns(), pv4, gv4, "eth0"); err != nil {
			return err
		}
		if err := netutil.EnsureRoute(n.netns(), pv6, gv6, "eth0"); err != nil {
			return err
		}
	}
	return nil
}

// nodeKubeconfig is the kubeconfig of a node's component that signs in as
// user with the certificate pki/<cert>.crt of the node's kubernetes dir.
func nodeKubeconfig(server, user, cert string) string {
	return fmt.Sprintf(`apiVersion: v1
kind: Config
clusters:
- name: lab
  cluster:
    server: %s
    certificate-authority: %[2]s/pki/ca.crt
users:
- name: %[3]q
  user:
    client-certificate: %[2]s/pki/%[4]s.crt
    client-key: %[2]s/pki/%[4]s.key
contexts:
- name: lab
  context: {cluster: lab, user: %[3]q}
current-context: lab
`, server, nodeKubeDir, user, cert)
}

// kubeletConfig is a kubeadm-like kubelet configuration for a node of a
// machine with cgroup v1 and no systemd as PID 1: the cgroupfs driver, a
// cgroup root of its own, no swap check, and eviction and image GC
// thresholds that a shared lab disk cannot trip (images cannot be pulled
// again here). With dns, pods (dnsPolicy ClusterFirst) resolve through the
// lab's kube-dns Service; kubeadm names its first address only, and so does
// the lab: a second nameserver is asked only when the first times out.
// Without it, pods get the machine's resolv.conf (and the kubelet warns
// MissingClusterDNS). maxPods is above the kubelet's 110 so a burst of 300
// pods over three nodes (make chaos) fits beside the workload.
func kubeletConfig(cgroupRoot string, dns bool) string {
	clusterDNS := ""
	if dns {
		clusterDNS = "clusterDNS: [" + DNSAddrs()[0].String() + "]\n"
	}
	return fmt.Sprintf(`apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
address: 0.0.0.0
port: %d
healthzBindAddress: 127.0.0.1
healthzPort: %d
readOnlyPort: 0
authentication:
  anonymous: {enabled: false}
  webhook: {enabled: true}
  x509: {clientCAFile: %[3]s/pki/ca.crt}
authorization: {mode: Webhook}
tlsCertFile: %[3]s/pki/kubelet.crt
tlsPrivateKeyFile: %[3]s/pki/kubelet.key
containerRuntimeEndpoint: unix://%[4]s
cgroupDriver: cgroupfs
cgroupRoot: %[5]s
cgroupsPerQOS: true
failSwapOn: false
failCgroupV1: false
clusterDomain: cluster.local
%[6]sresolvConf: /etc/resolv.conf
serializeImagePulls: false
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
evictionHard:
  memory.available: 100Mi
  nodefs.available: 1%%
  nodefs.inodesFree: 1%%
  imagefs.available: 1%%
nodeStatusReportFrequency: 1m
shutdownGracePeriod: 0s
maxPods: 250
`, kubeletPort, kubeletHealthzPort, nodeKubeDir, nodeContainerdSock, cgroupRoot, clusterDNS)
}

// containerdConfig: everything per node (root, state and socket are the
// node's own through its mount namespace); no AppArmor and no OOM score
// below the runtime's own, for a lab process lacks CAP_SYS_RESOURCE; pod
// network namespaces under the state dir; the pause image the lab imports.
var containerdConfig = fmt.Sprintf(`version = 2
root = "/var/lib/containerd"
state = "/run/containerd"
disabled_plugins = ["io.containerd.snapshotter.v1.aufs", "io.containerd.snapshotter.v1.btrfs",
  "io.containerd.snapshotter.v1.zfs", "io.containerd.snapshotter.v1.devmapper",
  "io.containerd.tracing.processor.v1.otlp"]

[grpc]
  address = %q

[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = %q
  disable_apparmor = true
  restrict_oom_score_adj = true
  netns_mounts_under_state_dir = true
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        SystemdCgroup = false
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = %q
    conf_dir = %q
`, nodeContainerdSock, sandboxImage, nodeCNIBinDir, nodeCNIConfDir)

// stop stops a flannel lab's kube-proxy and flanneld, the kubelet, then
// containerd, then kills whatever ran in the node's cgroups (containers and
// their shims outlive containerd), then the holder, which takes the node's
// mounts with it.
func (n *node) stop() error {
	for _, p := range []*controlplane.Process{n.kubeProxy, n.flanneld, n.kubelet, n.containerd} {
		if p != nil {
			p.Stop(10 * time.Second)
		}
	}
	err := removeCgroupRoot(n.cgroupRoot())
	if n.holder != nil {
		n.holder.Stop(5 * time.Second)
	}
	return err
}

func writeFile(path, content string, mode os.FileMode) error {
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return err
	}
	if err := os.WriteFile(path, []byte(content), mode); err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	return nil
}

func copyExecutable(src, dst string) error {
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
		return err
	}
	out, err := os.OpenFile(dst, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, 0o755)
	if err != nil {
		return err
	}
	if _, err := io.Copy(out, in); err != nil {
		out.Close()
		return fmt.Errorf("copy %s: %w", src, err)
	}
	return out.Close()
}

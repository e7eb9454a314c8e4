package lab

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"

	"github.com/containernetworking/cni/libcni"
	"github.com/containernetworking/cni/pkg/invoke"
	"github.com/containernetworking/cni/pkg/types"
	types100 "github.com/containernetworking/cni/pkg/types/100"
	"github.com/containernetworking/cni/pkg/version"

	"github.com/lace-cni/lace/internal/netutil"
)

// nodeExec runs CNI plugins the way a container runtime on the node
// would: as processes in the node's network namespace (and, for a lab
// node, its mount namespace, where the plugins, their config and the
// agent's socket are, and its PID namespace, where the agent resolves the
// plugin's PID), with the CNI environment and config on stdin.
type nodeExec struct {
	version.PluginDecoder
	netns string
	// root is the node's filesystem seen from the machine, mntns and pidns
	// its mount and PID namespaces; all empty for a plain network
	// namespace.
	root, mntns, pidns string
}

func (e *nodeExec) ExecPlugin(ctx context.Context, pluginPath string, stdin []byte, environ []string) ([]byte, error) {
	var stdout, stderr bytes.Buffer
	var c *exec.Cmd
	if e.mntns != "" {
		c = exec.CommandContext(ctx, "nsenter", "--mount="+e.mntns, "--pid="+e.pidns, "--net="+netutil.Path(e.netns), "--", pluginPath)
	} else {
		// `ip netns exec` gives the plugin the namespace's own /sys.
		c = exec.CommandContext(ctx, "ip", "netns", "exec", e.netns, pluginPath)
	}
	c.Env, c.Stdin, c.Stdout, c.Stderr = environ, bytes.NewReader(stdin), &stdout, &stderr
	if err := c.Run(); err != nil {
		// A plugin reports failure as a CNI error object on stdout.
		var cniErr types.Error
		if json.Unmarshal(stdout.Bytes(), &cniErr) == nil && cniErr.Msg != "" {
			return nil, &cniErr
		}
		return nil, fmt.Errorf("%s: %w: %s", filepath.Base(pluginPath), err, strings.TrimSpace(stderr.String()))
	}
	return stdout.Bytes(), nil
}

// FindInPath looks plugins up in the node's filesystem and returns their
// paths as the node sees them.
func (e *nodeExec) FindInPath(plugin string, paths []string) (string, error) {
	if e.root == "" {
		return invoke.FindInPath(plugin, paths)
	}
	for _, dir := range paths {
		if _, err := os.Stat(filepath.Join(e.root, dir, plugin)); err == nil {
			return filepath.Join(dir, plugin), nil
		}
	}
	return "", fmt.Errorf("failed to find plugin %q in node paths %v", plugin, paths)
}

// NodeCNI is one node's CNI runtime side: its config directory, plugin
// path and result cache. Tests and the benchmarks invoke plugins through
// it exactly as a container runtime would.
type NodeCNI struct {
	confDir string
	cni     *libcni.CNIConfig
}

// NewNodeCNI invokes the CNI plugins of lab node as its runtime does, with
// the node's config (the first in /etc/cni/net.d) and plugins
// (/opt/cni/bin). Network namespace paths given to it must resolve in the
// node's mount namespace: see CreateNodeNetNS.
func NewNodeCNI(c Config, node, cacheDir string) (*NodeCNI, error) {
	root := c.NodeRoot(node)
	target, err := os.Readlink(root)
	if err != nil {
		return nil, fmt.Errorf("node %s is not running: %w", node, err)
	}
	proc := filepath.Dir(target) // /proc/<holder>
	e := &nodeExec{netns: c.NetNS(node), root: root, mntns: filepath.Join(proc, "ns", "mnt"), pidns: filepath.Join(proc, "ns", "pid")}
	return &NodeCNI{
		confDir: filepath.Join(root, nodeCNIConfDir),
		cni:     libcni.NewCNIConfigWithCacheDir([]string{nodeCNIBinDir}, cacheDir, e),
	}, nil
}

// NewNetNSCNI runs plugins from binDirs in the named network namespace
// netns with the first config of confDir, without a mount namespace of
// its own (a peer plugin measured beside Lace).
func NewNetNSCNI(netns, confDir, cacheDir string, binDirs []string) *NodeCNI {
	return &NodeCNI{
		confDir: confDir,
		cni:     libcni.NewCNIConfigWithCacheDir(binDirs, cacheDir, &nodeExec{netns: netns}),
	}
}

// CreateNodeNetNS creates the named network namespace inside node, in its
// /run/netns as its runtime makes pods' namespaces, and returns its path
// as the node sees it (for the CNI plugins) and as the machine reaches
// it. The node's /proc shows only the node's processes, so the machine's
// own namespace files cannot be named from inside a node.
func CreateNodeNetNS(c Config, node, name string) (nodePath, machinePath string, err error) {
	if err := nodeIP(c, node, "netns", "add", name); err != nil {
		return "", "", err
	}
	nodePath = filepath.Join("/run/netns", name)
	return nodePath, filepath.Join(c.NodeRoot(node), nodePath), nil
}

// DeleteNodeNetNS removes a namespace CreateNodeNetNS made.
func DeleteNodeNetNS(c Config, node, name string) error {
	return nodeIP(c, node, "netns", "delete", name)
}

func nodeIP(c Config, node string, args ...string) error {
	h, err := holderPID(c, node)
	if err != nil {
		return err
	}
	// The node's PID namespace too: ip reads /proc/self, and the node's
	// /proc shows only the node's processes.
	out, err := exec.Command("nsenter", append([]string{fmt.Sprintf("--mount=/proc/%d/ns/mnt", h),
		fmt.Sprintf("--pid=/proc/%d/ns/pid", h), "--", "ip"}, args...)...).CombinedOutput()
	if err != nil {
		return fmt.Errorf("ip %s in node %s: %w: %s", strings.Join(args, " "), node, err, bytes.TrimSpace(out))
	}
	return nil
}

// confList loads the first config of the node's CNI directory in lexical
// order, as kubelet runtimes do.
func (n *NodeCNI) confList() (*libcni.NetworkConfigList, error) {
	files, err := libcni.ConfFiles(n.confDir, []string{".conflist"})
	if err != nil {
		return nil, fmt.Errorf("read CNI config dir %s: %w", n.confDir, err)
	}
	if len(files) == 0 {
		return nil, fmt.Errorf("no CNI config in %s", n.confDir)
	}
	return libcni.ConfListFromFile(files[0])
}

// PodRuntimeConf is what a runtime passes for a pod: container ID, netns,
// eth0, and the Kubernetes CNI_ARGS.
func PodRuntimeConf(containerID, netnsPath, ns, name, uid string) *libcni.RuntimeConf {
	return &libcni.RuntimeConf{
		ContainerID: containerID,
		NetNS:       netnsPath,
		IfName:      "eth0",
		Args: [][2]string{
			{"IgnoreUnknown", "1"},
			{"K8S_POD_NAMESPACE", ns},
			{"K8S_POD_NAME", name},
			{"K8S_POD_INFRA_CONTAINER_ID", containerID},
			{"K8S_POD_UID", uid},
		},
	}
}

// Add runs CNI ADD and returns the pod's addresses, IPv4 first.
func (n *NodeCNI) Add(ctx context.Context, rt *libcni.RuntimeConf) ([]netip.Addr, error) {
	list, err := n.confList()
	if err != nil {
		return nil, err
	}
	res, err := n.cni.AddNetworkList(ctx, list, rt)
	if err != nil {
		return nil, err
	}
	cur, err := types100.NewResultFromResult(res)
	if err != nil {
		return nil, fmt.Errorf("convert CNI result: %w", err)
	}
	var v4, v6 []netip.Addr
	for _, ip := range cur.IPs {
		a, ok := netip.AddrFromSlice(ip.Address.IP)
		if !ok {
			continue
		}
		if a = a.Unmap(); a.Is4() {
			v4 = append(v4, a)
		} else {
			v6 = append(v6, a)
		}
	}
	if len(v4)+len(v6) == 0 {
		return nil, errors.New("CNI result has no IP address")
	}
	out := append(v4[:min(len(v4), 1)], v6[:min(len(v6), 1)]...)
	return out, nil
}

// Del runs CNI DEL; it succeeds when nothing is left to delete.
func (n *NodeCNI) Del(ctx context.Context, rt *libcni.RuntimeConf) error {
	list, err := n.confList()
	if err != nil {
		return err
	}
	return n.cni.DelNetworkList(ctx, list, rt)
}

// Status runs CNI STATUS, as a CNI 1.1 runtime asks before it starts
// pods: nil when the plugin can set up pods now, else its reason.
func (n *NodeCNI) Status(ctx context.Context) error {
	list, err := n.confList()
	if err != nil {
		return err
	}
	return n.cni.GetStatusNetworkList(ctx, list)
}

// GC runs CNI GC: every attachment not in valid (container IDs, eth0) is
// removed.
func (n *NodeCNI) GC(ctx context.Context, valid []string) error {
	list, err := n.confList()
	if err != nil {
		return err
	}
	args := &libcni.GCArgs{}
	for _, id := range valid {
		args.ValidAttachments = append(args.ValidAttachments, types.GCAttachment{ContainerID: id, IfName: "eth0"})
	}
	return n.cni.GCNetworkList(ctx, list, args)
}

// WriteBridgeConfig writes the reference bridge config with node i's pod
// ranges (and nothing else: no routes).
func WriteBridgeConfig(i int, confDir, ipamDir string) error {
	v4, v6 := BridgePodCIDRs(i)
	conf := map[string]any{
		// As the agent's config: 1.1 for runtimes that read cniVersions,
		// 1.0 for containerd 1.6, which does not.
		"cniVersion":  "1.0.0",
		"cniVersions": []string{"1.0.0", "1.1.0"},
		"name":        "lab-bridge",
		"plugins": []any{
			map[string]any{
				"type": "bridge", "bridge": "cni0", "isGateway": true, "ipMasq": false, "hairpinMode": true,
				"ipam": map[string]any{
					"type":    "host-local",
					"dataDir": ipamDir,
					"ranges":  []any{[]any{map[string]any{"subnet": v4.String()}}, []any{map[string]any{"subnet": v6.String()}}},
					"routes":  []any{map[string]any{"dst": "0.0.0.0/0"}, map[string]any{"dst": "::/0"}},
				},
			},
		},
	}
	b, err := json.MarshalIndent(conf, "", "  ")
	if err != nil {
		return err
	}
	if err := os.MkdirAll(confDir, 0o755); err != nil {
		return fmt.Errorf("create %s: %w", confDir, err)
	}
	if err := os.WriteFile(filepath.Join(confDir, "10-bridge.conflist"), b, 0o644); err != nil {
		return fmt.Errorf("write bridge CNI config: %w", err)
	}
	return nil
}

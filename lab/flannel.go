package lab

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/lace-cni/lace/lab/controlplane"
)

// A flannel lab (--cni flannel) is the peer cluster of the benchmarks, the
// setup k3s ships and many clusters run: flanneld with its vxlan backend
// and the Kubernetes subnet manager (each node's pod range is the one the
// controller manager allocates), and kube-proxy in nftables mode. Both run
// on every node as processes beside its kubelet, as a cluster runs them in
// host-network DaemonSet pods (the lab has no registry for their images).
//
// Pods are wired by the bridge and host-local plugins with the config
// flannel's CNI plugin would hand them: that plugin only reads flanneld's
// subnet file and delegates to bridge, and the Go module proxy does not
// serve it, so the lab writes the delegate's config itself once the subnet
// file is there.
const (
	// FlannelNetwork is the cluster's pod range; every node gets a /24.
	FlannelNetwork    = "10.244.0.0/16"
	flannelNetConf    = "/etc/kube-flannel/net-conf.json"
	flannelSubnetFile = "/run/flannel/subnet.env"
	flannelStartup    = 2 * time.Minute
)

// flannelControllerManagerArgs make the controller manager allocate node
// pod ranges, which flannel's Kubernetes subnet manager leases.
func flannelControllerManagerArgs() []string {
	return []string{"--allocate-node-cidrs=true", "--cluster-cidr=" + FlannelNetwork, "--node-cidr-mask-size=24"}
}

// flannelUser is flanneld's user: flannel's own manifest grants its
// service account what flannelRBAC grants this user.
const flannelUser = "lab:flannel"

// flannelRBAC grants flanneld what flannel's manifest grants it: every
// node read (the Node authorizer lets a kubelet read its own only), and
// its node's status patched (the lease annotations).
func flannelRBAC(ctx context.Context, client kubernetes.Interface) error {
	role := &rbacv1.ClusterRole{ObjectMeta: metav1.ObjectMeta{Name: flannelUser}, Rules: []rbacv1.PolicyRule{
		{APIGroups: []string{""}, Resources: []string{"nodes"}, Verbs: []string{"get", "list", "watch"}},
		{APIGroups: []string{""}, Resources: []string{"nodes/status"}, Verbs: []string{"patch"}},
	}}
	binding := &rbacv1.ClusterRoleBinding{ObjectMeta: metav1.ObjectMeta{Name: flannelUser},
		RoleRef:  rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: flannelUser},
		Subjects: []rbacv1.Subject{{APIGroup: rbacv1.GroupName, Kind: rbacv1.UserKind, Name: flannelUser}}}
	if _, err := client.RbacV1().ClusterRoles().Create(ctx, role, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("flannel's cluster role: %w", err)
	}
	if _, err := client.RbacV1().ClusterRoleBindings().Create(ctx, binding, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("flannel's cluster role binding: %w", err)
	}
	return nil
}

// writeFlannelFiles writes flannel's network config (flannel's own
// defaults for vxlan, with its nftables rules instead of iptables), its
// credentials, and kube-proxy's: the user the built-in
// system:node-proxier binding grants what kube-proxy reads.
func (n *node) writeFlannelFiles(pki *controlplane.PKI, apiServer string) error {
	conf, err := json.Marshal(map[string]any{
		"Network": FlannelNetwork, "EnableNFTables": true, "Backend": map[string]any{"Type": "vxlan"},
	})
	if err != nil {
		return err
	}
	if err := writeFile(n.fs.path(flannelNetConf), string(conf), 0o644); err != nil {
		return err
	}
	pkiDir := n.fs.path(nodeKubeDir + "/pki")
	for component, user := range map[string]string{"flannel": flannelUser, "kube-proxy": "system:kube-proxy"} {
		if err := pki.Issue(filepath.Join(pkiDir, component+".crt"), filepath.Join(pkiDir, component+".key"),
			user, nil, nil, nil, false); err != nil {
			return err
		}
		if err := writeFile(n.fs.path(nodeKubeDir+"/"+component+".conf"), nodeKubeconfig(apiServer, user, component), 0o600); err != nil {
			return err
		}
	}
	return nil
}

// startFlannel brings a registered node's network up: flanneld once the
// node has its pod range, the CNI config once flanneld has written its
// subnet file, then kube-proxy. The kubelet turns the node Ready when it
// sees the CNI config.
func (n *node) startFlannel(ctx context.Context, client kubernetes.Interface) error {
	deadline := time.Now().Add(flannelStartup)
	for {
		node, err := client.CoreV1().Nodes().Get(ctx, n.name, metav1.GetOptions{})
		if err == nil && node.Spec.PodCIDR != "" {
			break
		}
		if n.kubelet.Exited() {
			return fmt.Errorf("kubelet of %s: %v: %s", n.name, n.kubelet.ExitError(), n.kubelet.LogTail(1500))
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("node %s has no pod range after %s (get: %v)", n.name, flannelStartup, err)
		}
		if !sleepCtx(ctx, 200*time.Millisecond) {
			return ctx.Err()
		}
	}
	cmd := n.enter(n.cfg.Flannel, "--kube-subnet-mgr", "--kubeconfig-file="+nodeKubeDir+"/flannel.conf",
		"--iface=eth0", "--ip-masq", "--net-config-path="+flannelNetConf, "--subnet-file="+flannelSubnetFile)
	cmd.Env = append(cmd.Env, "NODE_NAME="+n.name)
	p, err := controlplane.StartCommand("flanneld/"+n.name, cmd, n.logPath("flanneld"))
	if err != nil {
		return err
	}
	n.flanneld = p
	subnetFile := filepath.Join(n.cfg.NodeRoot(n.name), flannelSubnetFile)
	var env []byte
	for {
		if env, err = os.ReadFile(subnetFile); err == nil {
			break
		}
		if p.Exited() {
			return fmt.Errorf("flanneld of %s: %v: %s", n.name, p.ExitError(), p.LogTail(1500))
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("flanneld of %s wrote no %s after %s: %s", n.name, flannelSubnetFile, flannelStartup, p.LogTail(1500))
		}
		if !sleepCtx(ctx, 100*time.Millisecond) {
			return ctx.Err()
		}
	}
	conf, err := flannelCNIConfig(env)
	if err != nil {
		return fmt.Errorf("flannel on %s: %w", n.name, err)
	}
	if err := writeFile(filepath.Join(n.cfg.NodeRoot(n.name), nodeCNIConfDir, "10-flannel.conflist"), string(conf), 0o644); err != nil {
		return err
	}
	// As the bench's own kube-proxy (lab/bench): nf_conntrack_max and the
	// conntrack timeouts are the machine's, so kube-proxy leaves them.
	kp, err := controlplane.StartCommand("kube-proxy/"+n.name, n.enter(filepath.Join(n.cfg.K8sBinDir, "kube-proxy"),
		"--proxy-mode=nftables", "--kubeconfig="+nodeKubeDir+"/kube-proxy.conf", "--hostname-override="+n.name,
		"--cluster-cidr="+FlannelNetwork, "--conntrack-max-per-core=0", "--conntrack-tcp-timeout-established=0",
		"--conntrack-tcp-timeout-close-wait=0", "--oom-score-adj=0", "--v=1"), n.logPath("kube-proxy"))
	if err != nil {
		return err
	}
	n.kubeProxy = kp
	return nil
}

// flannelCNIConfig is the bridge config flannel's CNI plugin delegates to
// for the subnet file env: its node's range on bridge cni0 (gateway and
// default route), the MTU the vxlan backend leaves, no masquerade by the
// plugin when flanneld masquerades, and a route to the cluster's range.
func flannelCNIConfig(env []byte) ([]byte, error) {
	vars := map[string]string{}
	sc := bufio.NewScanner(bytes.NewReader(env))
	for sc.Scan() {
		if k, v, ok := strings.Cut(strings.TrimSpace(sc.Text()), "="); ok {
			vars[k] = v
		}
	}
	network, err := netip.ParsePrefix(vars["FLANNEL_NETWORK"])
	if err != nil {
		return nil, fmt.Errorf("subnet file: FLANNEL_NETWORK: %w", err)
	}
	subnet, err := netip.ParsePrefix(vars["FLANNEL_SUBNET"])
	if err != nil {
		return nil, fmt.Errorf("subnet file: FLANNEL_SUBNET: %w", err)
	}
	mtu, err := strconv.Atoi(vars["FLANNEL_MTU"])
	if err != nil {
		return nil, fmt.Errorf("subnet file: FLANNEL_MTU: %w", err)
	}
	masq := vars["FLANNEL_IPMASQ"] == "true"
	return json.MarshalIndent(map[string]any{
		"cniVersion": "1.0.0",
		"name":       "cbr0",
		"plugins": []any{map[string]any{
			"type": "bridge", "bridge": "cni0", "isGateway": true, "isDefaultGateway": true,
			"hairpinMode": true, "ipMasq": !masq, "mtu": mtu,
			"ipam": map[string]any{
				"type":   "host-local",
				"ranges": []any{[]any{map[string]any{"subnet": subnet.Masked().String()}}},
				"routes": []any{map[string]any{"dst": network.Masked().String()}},
			},
		}},
	}, "", "  ")
}

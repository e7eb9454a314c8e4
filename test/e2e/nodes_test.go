package e2e

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/lace-cni/lace/internal/netutil"
	"github.com/lace-cni/lace/lab"
	"github.com/lace-cni/lace/lab/images"
)

// TestNodesAreRealKubelets: every node is a kubelet of the pinned release
// on containerd, as `kubectl get nodes -o wide` shows it.
func TestNodesAreRealKubelets(t *testing.T) {
	needLab(t)
	out, err := kubectl(context.Background(), "get", "nodes", "-o", "wide")
	if err != nil {
		t.Fatalf("kubectl get nodes: %v\n%s", err, out)
	}
	t.Logf("\n%s", out)
	nodes, err := client.CoreV1().Nodes().List(context.Background(), metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range nodes.Items {
		info := n.Status.NodeInfo
		if info.KubeletVersion != "v1.34.4" {
			t.Errorf("node %s kubelet %q, want v1.34.4", n.Name, info.KubeletVersion)
		}
		if !strings.HasPrefix(info.ContainerRuntimeVersion, "containerd://") {
			t.Errorf("node %s runtime %q, want containerd://", n.Name, info.ContainerRuntimeVersion)
		}
		if !strings.Contains(out, n.Name) || !strings.Contains(out, info.ContainerRuntimeVersion) {
			t.Errorf("kubectl get nodes -o wide does not show %s on %s", info.ContainerRuntimeVersion, n.Name)
		}
	}
}

// TestLaceInstalledByChart: Lace runs as the chart installs it, a Helm
// release with the agent DaemonSet on every node and the controller.
func TestLaceInstalledByChart(t *testing.T) {
	needLab(t)
	ctx := context.Background()
	c := labConfig()
	cmd := exec.Command(c.Helm, "list", "--namespace", lab.ReleaseNamespace, "--kubeconfig", kubeconfig, "-o", "json")
	cmd.Env = append(os.Environ(), "HELM_CACHE_HOME="+t.TempDir(), "HELM_CONFIG_HOME="+t.TempDir())
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("helm list: %v\n%s", err, out)
	}
	if !strings.Contains(string(out), `"name":"lace"`) || !strings.Contains(string(out), `"status":"deployed"`) {
		t.Errorf("helm list shows no deployed lace release: %s", out)
	}
	ds, err := client.AppsV1().DaemonSets(lab.ReleaseNamespace).Get(ctx, lab.AgentDaemonSet, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if ds.Status.DesiredNumberScheduled != 3 || ds.Status.NumberReady != 3 {
		t.Errorf("agent DaemonSet %d/%d ready, want 3/3", ds.Status.NumberReady, ds.Status.DesiredNumberScheduled)
	}
	if !ds.Spec.Template.Spec.HostNetwork {
		t.Error("agent pods are not hostNetwork")
	}
	dep, err := client.AppsV1().Deployments(lab.ReleaseNamespace).Get(ctx, lab.ControllerDeployment, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if dep.Status.ReadyReplicas < 1 {
		t.Errorf("controller %d ready replicas", dep.Status.ReadyReplicas)
	}
	// Least privilege must still be enough: no component was refused by
	// RBAC (a missing rule shows only as "forbidden" in its log).
	for _, sel := range []string{"app.kubernetes.io/name=lace-controller", "app.kubernetes.io/name=lace-agent"} {
		out, err := kubectl(ctx, "logs", "-n", lab.ReleaseNamespace, "-l", sel, "--tail=-1", "--all-containers")
		if err != nil {
			t.Fatalf("logs of %s: %v\n%s", sel, err, out)
		}
		if strings.Contains(out, "forbidden") {
			t.Errorf("%s was refused by RBAC:\n%s", sel, grepLines(out, "forbidden"))
		}
	}
	// The agent's init container installed the plugin and its config into
	// each node's CNI directories.
	for _, node := range []string{"n1", "n2", "n3"} {
		root := c.NodeRoot(node)
		for _, f := range []string{"opt/cni/bin/lace", "etc/cni/net.d/10-lace.conflist"} {
			if _, err := os.Stat(filepath.Join(root, f)); err != nil {
				t.Errorf("node %s: %v", node, err)
			}
		}
	}
}

// TestHostNetworkPod: a hostNetwork pod runs in its node's network
// namespace, with the node's addresses and hostname.
func TestHostNetworkPod(t *testing.T) {
	needLab(t)
	ctx := context.Background()
	p := netexecPod("hostnet", "n2")
	p.Spec.HostNetwork = true
	p.Spec.Containers[0].Args = []string{"netexec", "--http-port=18080", "--udp-port=18081"}
	p.Spec.Containers[0].Ports = []corev1.ContainerPort{{Name: "http", ContainerPort: 18080}}
	if _, err := client.CoreV1().Pods("default").Create(ctx, p, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	defer client.CoreV1().Pods("default").Delete(context.Background(), p.Name, metav1.DeleteOptions{})
	got := waitPodReady(t, "default", p.Name)
	if got.Status.PodIP != "172.30.0.12" {
		t.Errorf("hostNetwork pod IP %s, want n2's 172.30.0.12", got.Status.PodIP)
	}
	// Served from the node's own namespace: reachable on the node address.
	body, err := getFromNode(ctx, "n1", "http://172.30.0.12:18080/hostname")
	if err != nil {
		t.Fatalf("reach the hostNetwork pod on n2's address from n1: %v", err)
	}
	if strings.TrimSpace(string(body)) != "n2" {
		t.Errorf("hostNetwork pod's hostname %q, want the node's (n2)", body)
	}
	out, err := kubectl(ctx, "exec", "hostnet", "--", "ip", "-o", "addr", "show", "eth0")
	if err != nil || !strings.Contains(out, "172.30.0.12/24") {
		t.Errorf("exec ip addr in the hostNetwork pod: %v\n%s", err, out)
	}
}

// TestInitContainerAndVolume: an init container fills an emptyDir that the
// app container then serves from; a projected service account token is
// mounted as every pod's.
func TestInitContainerAndVolume(t *testing.T) {
	needLab(t)
	ctx := context.Background()
	p := netexecPod("withinit", "n1")
	p.Spec.Volumes = []corev1.Volume{{Name: "data", VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{}}}}
	p.Spec.InitContainers = []corev1.Container{{Name: "fill", Image: agnhost, Command: []string{"sh", "-c", "echo filled-by-init > /data/msg"},
		VolumeMounts: []corev1.VolumeMount{{Name: "data", MountPath: "/data"}}}}
	p.Spec.Containers[0].VolumeMounts = []corev1.VolumeMount{{Name: "data", MountPath: "/data"}}
	if _, err := client.CoreV1().Pods("default").Create(ctx, p, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	defer client.CoreV1().Pods("default").Delete(context.Background(), p.Name, metav1.DeleteOptions{})
	got := waitPodReady(t, "default", p.Name)
	if s := got.Status.InitContainerStatuses; len(s) != 1 || s[0].State.Terminated == nil || s[0].State.Terminated.ExitCode != 0 {
		t.Errorf("init container status %+v", s)
	}
	out, err := kubectl(ctx, "exec", p.Name, "-c", "netexec", "--", "cat", "/data/msg", "/var/run/secrets/kubernetes.io/serviceaccount/namespace")
	if err != nil || out != "filled-by-init\ndefault" {
		t.Errorf("exec cat: %v %q, want the init container's file and the service account namespace", err, out)
	}
}

// TestLabExecEntersPodThroughRuntime: `lace-lab exec NS/POD` runs a tool
// of the machine in the pod's network namespace, found through the node's
// container runtime.
func TestLabExecEntersPodThroughRuntime(t *testing.T) {
	needLab(t)
	ctx := context.Background()
	if _, err := client.CoreV1().Pods("default").Create(ctx, netexecPod("execme", "n3"), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	defer client.CoreV1().Pods("default").Delete(context.Background(), "execme", metav1.DeleteOptions{})
	p := waitPodReady(t, "default", "execme")
	out, err := labCmd("exec", "default/execme", "--", "ip", "-o", "addr", "show", "eth0").CombinedOutput()
	if err != nil || !strings.Contains(string(out), p.Status.PodIP+"/32") {
		t.Errorf("lace-lab exec ip addr: %v\n%s\nwant the pod's %s", err, out, p.Status.PodIP)
	}
	out, err = labCmd("exec", "node/n3", "--", "ip", "-o", "addr", "show", "eth0").CombinedOutput()
	if err != nil || !strings.Contains(string(out), "172.30.0.13/24") {
		t.Errorf("lace-lab exec node/n3: %v\n%s", err, out)
	}
}

// TestRollingUpgradeKeepsStream upgrades the release to a new image tag,
// as `helm upgrade` does in a cluster: the agent DaemonSet rolls node by
// node while one TCP connection between pods on two nodes keeps working.
func TestRollingUpgradeKeepsStream(t *testing.T) {
	needLab(t)
	c := labConfig()
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	a := netPod(t, "upgrade-a", "default", "n1", true)
	b := netPod(t, "upgrade-b", "default", "n3", true)
	b4, _ := podAddrs(b)
	conn, err := netutil.DialContext(ctx, podNetNS(t, a), "tcp", net.JoinHostPort(b4.String(), "8080"))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ask := echoer(t, conn)
	ask("before")

	const tag = "e2e-upgrade"
	tarball := filepath.Join(c.ImageDir, "lace.tar")
	if out, err := labCmd("load", "--as", images.LaceRef(tag), tarball).CombinedOutput(); err != nil {
		t.Fatalf("lace-lab load: %v\n%s", err, out)
	}
	old := daemonSetGeneration(t)
	if err := lab.HelmInstall(ctx, c, "image.tag="+tag); err != nil {
		t.Fatal(err)
	}
	defer func() {
		if err := lab.HelmInstall(context.Background(), c, "image.tag="+c.LaceTag); err != nil {
			t.Errorf("roll back: %v", err)
		}
		waitRollout(t)
	}()
	// Ask on the held connection while the DaemonSet rolls.
	i := 0
	eventually(t, 3*time.Minute, "agent DaemonSet rolled to "+tag, func() error {
		i++
		ask(fmt.Sprintf("during-%d", i))
		return rolledOut(old, tag)
	})
	ask("after")
}

func daemonSetGeneration(t *testing.T) int64 {
	t.Helper()
	ds, err := client.AppsV1().DaemonSets(lab.ReleaseNamespace).Get(context.Background(), lab.AgentDaemonSet, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return ds.Generation
}

// rolledOut tells whether the agent DaemonSet, beyond generation old, runs
// image tag on every node.
func rolledOut(old int64, tag string) error {
	ds, err := client.AppsV1().DaemonSets(lab.ReleaseNamespace).Get(context.Background(), lab.AgentDaemonSet, metav1.GetOptions{})
	if err != nil {
		return err
	}
	if !strings.HasSuffix(ds.Spec.Template.Spec.Containers[0].Image, ":"+tag) {
		return fmt.Errorf("template image %s", ds.Spec.Template.Spec.Containers[0].Image)
	}
	return dsDone(ds, old)
}

func dsDone(ds *appsv1.DaemonSet, old int64) error {
	st := ds.Status
	if ds.Generation <= old || st.ObservedGeneration < ds.Generation || st.UpdatedNumberScheduled != st.DesiredNumberScheduled ||
		st.NumberAvailable != st.DesiredNumberScheduled {
		return fmt.Errorf("generation %d observed %d, %d/%d updated, %d available", ds.Generation, st.ObservedGeneration,
			st.UpdatedNumberScheduled, st.DesiredNumberScheduled, st.NumberAvailable)
	}
	return nil
}

// waitRollout waits until the agent DaemonSet runs its current template on
// every node.
func waitRollout(t *testing.T) {
	t.Helper()
	eventually(t, 3*time.Minute, "agent DaemonSet rolled out", func() error {
		ds, err := client.AppsV1().DaemonSets(lab.ReleaseNamespace).Get(context.Background(), lab.AgentDaemonSet, metav1.GetOptions{})
		if err != nil {
			return err
		}
		return dsDone(ds, 0)
	})
}

// echoer returns a function that sends one agnhost netexec /echo request on
// conn and fails the test unless the same message comes back.
func echoer(t *testing.T, conn net.Conn) func(string) {
	r := bufio.NewReader(conn)
	return func(msg string) {
		t.Helper()
		_ = conn.SetDeadline(time.Now().Add(5 * time.Second))
		fmt.Fprintf(conn, "GET /echo?msg=%s HTTP/1.1\r\nHost: e2e\r\n\r\n", msg)
		var length int
		for {
			line, err := r.ReadString('\n')
			if err != nil {
				t.Fatalf("request %q on the held connection: %v", msg, err)
			}
			if v, ok := strings.CutPrefix(strings.ToLower(line), "content-length:"); ok {
				fmt.Sscanf(strings.TrimSpace(v), "%d", &length)
			}
			if line == "\r\n" {
				break
			}
		}
		body := make([]byte, length)
		if _, err := io.ReadFull(r, body); err != nil || string(body) != msg {
			t.Fatalf("echo %q: got %q, %v", msg, body, err)
		}
	}
}

// grepLines returns the lines of s that contain sub.
func grepLines(s, sub string) string {
	var out []string
	for _, l := range strings.Split(s, "\n") {
		if strings.Contains(l, sub) {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}

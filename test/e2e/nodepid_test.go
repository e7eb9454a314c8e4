package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/lace-cni/lace/pkg/cniapi"
)

// TestHostPIDSeesOnlyItsNode runs a hostPID pod on n1 and lists the
// processes it sees: its node's kubelet and containerd, and nothing of
// the machine's: no other node's kubelet, no API server, etcd, controller
// manager or scheduler.
func TestHostPIDSeesOnlyItsNode(t *testing.T) {
	needLab(t)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	const name = "hostpid"
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: corev1.PodSpec{
			NodeName: "n1", HostPID: true, TerminationGracePeriodSeconds: ptr.To[int64](1),
			Containers: []corev1.Container{{Name: "ps", Image: agnhost, Args: []string{"pause"}}},
		},
	}
	if _, err := client.CoreV1().Pods("default").Create(ctx, pod, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { deletePodAndWait(t, name) })
	waitPodReady(t, "default", name)

	// Each process's name (comm, at most 15 characters) as the pod reads
	// /proc; processes ending meanwhile are skipped.
	out, err := kubectl(ctx, "exec", name, "--", "sh", "-c", "cat /proc/[0-9]*/comm 2>/dev/null; true")
	if err != nil {
		t.Fatalf("list processes: %v\n%s", err, out)
	}
	seen := map[string]int{}
	for _, l := range strings.Split(out, "\n") {
		if l = strings.TrimSpace(l); l != "" {
			seen[l]++
		}
	}
	t.Logf("the hostPID pod on n1 sees %d processes: %v", len(strings.Fields(out)), seen)
	// Its own node: one kubelet (n1's), its containerd, the node's agent.
	for comm, want := range map[string]int{"kubelet": 1, "containerd": 1, "lace-agent": 1} {
		if seen[comm] != want {
			t.Errorf("the pod sees %d %s processes, want %d (its node's)", seen[comm], comm, want)
		}
	}
	// The machine's: the control plane runs outside every node.
	for _, comm := range []string{"kube-apiserver", "etcd", "kube-controller", "kube-scheduler"} {
		if seen[comm] > 0 {
			t.Errorf("the pod on n1 sees the machine's %s", comm)
		}
	}
}

// TestCNISocketIsRootOnly checks each node's agent socket as the node
// has it: 0600 in a 0700 directory (the kubelet made the hostPath 0755),
// and a request past the agent's limit is refused, naming the limit,
// by the running agent.
func TestCNISocketIsRootOnly(t *testing.T) {
	needLab(t)
	for _, node := range []string{"n1", "n2", "n3"} {
		sock := filepath.Join(labConfig().NodeRoot(node), cniapi.DefaultSocket)
		for path, want := range map[string]os.FileMode{filepath.Dir(sock): 0o700, sock: 0o600} {
			fi, err := os.Stat(path)
			if err != nil {
				t.Fatal(err)
			}
			if got := fi.Mode().Perm(); got != want {
				t.Errorf("%s: %s has mode %#o, want %#o", node, strings.TrimPrefix(path, labConfig().NodeRoot(node)), got, want)
			}
		}
	}
	sock := filepath.Join(labConfig().NodeRoot("n1"), cniapi.DefaultSocket)
	c := &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, "unix", sock)
		}}}
	body, _ := json.Marshal(cniapi.Request{Command: "CHECK", ContainerID: "oversized",
		Args: map[string]string{"PAD": strings.Repeat("x", 2*cniapi.MaxRequestBytes)}})
	resp, err := c.Post("http://lace-agent/cni", "application/json", bytes.NewReader(body))
	if err != nil {
		t.Fatalf("post to n1's agent: %v", err)
	}
	defer resp.Body.Close()
	var out cniapi.Response
	if err := json.NewDecoder(resp.Body).Decode(&out); err != nil {
		t.Fatal(err)
	}
	if out.Error == nil || !strings.Contains(out.Error.Msg, "larger than the limit") {
		t.Errorf("a %d-byte request answered %+v, want a refusal naming the limit", len(body), out.Error)
	}
}

package e2e

import (
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
	"sort"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"

	"github.com/lace-cni/lace/internal/netutil"
	"github.com/lace-cni/lace/lab"
	"github.com/lace-cni/lace/lab/controlplane"
)

const agnhost = "registry.k8s.io/e2e-test-images/agnhost:2.53"

func netexecPod(name, node string) *corev1.Pod {
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{"app": name}},
		Spec: corev1.PodSpec{
			NodeName:                      node,
			TerminationGracePeriodSeconds: ptr.To[int64](5),
			Containers: []corev1.Container{{
				Name: "netexec", Image: agnhost,
				Args:  []string{"netexec", "--http-port=8080", "--udp-port=8081"},
				Ports: []corev1.ContainerPort{{Name: "http", ContainerPort: 8080}},
				ReadinessProbe: &corev1.Probe{
					ProbeHandler:  corev1.ProbeHandler{HTTPGet: &corev1.HTTPGetAction{Path: "/healthz", Port: intstr.FromString("http")}},
					PeriodSeconds: 1,
				},
			}},
		},
	}
}

func waitPodReady(t *testing.T, ns, name string) *corev1.Pod {
	t.Helper()
	var pod *corev1.Pod
	eventually(t, 90*time.Second, "pod "+name+" ready", func() error {
		p, err := client.CoreV1().Pods(ns).Get(context.Background(), name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		for _, c := range p.Status.Conditions {
			if c.Type == corev1.PodReady && c.Status == corev1.ConditionTrue {
				pod = p
				return nil
			}
		}
		return fmt.Errorf("phase %s, statuses %+v", p.Status.Phase, p.Status.ContainerStatuses)
	})
	return pod
}

func TestNodesReadyInZones(t *testing.T) {
	needLab(t)
	t.Logf("lab up took %.1fs", upTime.Seconds())
	nodes, err := client.CoreV1().Nodes().List(context.Background(), metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if len(nodes.Items) != 3 {
		t.Fatalf("%d nodes, want 3", len(nodes.Items))
	}
	zones := map[string]int{}
	for _, n := range nodes.Items {
		ready := false
		for _, c := range n.Status.Conditions {
			ready = ready || (c.Type == corev1.NodeReady && c.Status == corev1.ConditionTrue)
		}
		if !ready {
			t.Errorf("node %s not Ready", n.Name)
		}
		zones[n.Labels[corev1.LabelTopologyZone]]++
		var internal []string
		for _, a := range n.Status.Addresses {
			if a.Type == corev1.NodeInternalIP {
				internal = append(internal, a.Address)
			}
		}
		if len(internal) != 2 {
			t.Errorf("node %s internal addresses %v, want one IPv4 and one IPv6", n.Name, internal)
		}
	}
	if len(zones) != 2 {
		t.Errorf("zones %v, want 2", zones)
	}
}

func TestDeploymentEndpointSliceExecLogs(t *testing.T) {
	needLab(t)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	labels := map[string]string{"app": "web"}
	tmpl := netexecPod("web", "")
	tmpl.Labels = labels
	dep := &appsv1.Deployment{
		ObjectMeta: metav1.ObjectMeta{Name: "web"},
		Spec: appsv1.DeploymentSpec{
			Replicas: ptr.To[int32](3),
			Selector: &metav1.LabelSelector{MatchLabels: labels},
			Template: corev1.PodTemplateSpec{ObjectMeta: tmpl.ObjectMeta, Spec: tmpl.Spec},
		},
	}
	if _, err := client.AppsV1().Deployments("default").Create(ctx, dep, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	svc := &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: "web"},
		Spec:       corev1.ServiceSpec{Selector: labels, Ports: []corev1.ServicePort{{Port: 80, TargetPort: intstr.FromInt32(8080)}}},
	}
	if _, err := client.CoreV1().Services("default").Create(ctx, svc, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	defer func() {
		_ = client.AppsV1().Deployments("default").Delete(context.Background(), "web", metav1.DeleteOptions{})
		_ = client.CoreV1().Services("default").Delete(context.Background(), "web", metav1.DeleteOptions{})
	}()

	var podIPs []string
	var pods *corev1.PodList
	eventually(t, 2*time.Minute, "3 ready replicas", func() error {
		d, err := client.AppsV1().Deployments("default").Get(ctx, "web", metav1.GetOptions{})
		if err != nil {
			return err
		}
		if d.Status.ReadyReplicas != 3 {
			return fmt.Errorf("%d ready", d.Status.ReadyReplicas)
		}
		pods, err = client.CoreV1().Pods("default").List(ctx, metav1.ListOptions{LabelSelector: "app=web"})
		return err
	})
	for _, p := range pods.Items {
		podIPs = append(podIPs, p.Status.PodIP)
	}
	sort.Strings(podIPs)

	// The real endpointslice controller lists exactly the three pods.
	eventually(t, time.Minute, "endpoint slice with the 3 pod addresses", func() error {
		slices, err := client.DiscoveryV1().EndpointSlices("default").List(ctx, metav1.ListOptions{LabelSelector: discoveryv1.LabelServiceName + "=web"})
		if err != nil {
			return err
		}
		var got []string
		for _, s := range slices.Items {
			for _, e := range s.Endpoints {
				if e.Conditions.Ready != nil && *e.Conditions.Ready {
					got = append(got, e.Addresses...)
				}
			}
		}
		sort.Strings(got)
		if strings.Join(got, ",") != strings.Join(podIPs, ",") {
			return fmt.Errorf("slice lists %v, pods are %v", got, podIPs)
		}
		return nil
	})

	// kubectl exec runs in the pod's namespace and reports exit codes.
	name := pods.Items[0].Name
	out, err := kubectl(ctx, "exec", name, "--", "ip", "-o", "addr", "show", "dev", "eth0")
	if err != nil || !strings.Contains(out, pods.Items[0].Status.PodIP+"/") {
		t.Errorf("kubectl exec ip addr: %v\n%s", err, out)
	}
	if out, err := kubectl(ctx, "exec", name, "--", "sh", "-c", "exit 3"); err == nil || !strings.Contains(out, "exit code 3") {
		t.Errorf("kubectl exec of a failing command: err %v, output %q; want exit code 3", err, out)
	}
	// kubectl logs shows what the container wrote (netexec logs each probe).
	eventually(t, 30*time.Second, "kubectl logs", func() error {
		out, err := kubectl(ctx, "logs", name, "--tail=5")
		if err != nil {
			return fmt.Errorf("%v: %s", err, out)
		}
		if !strings.Contains(out, "/healthz") {
			return fmt.Errorf("logs %q lack the probe requests", out)
		}
		return nil
	})
}

// TestPodsOnOneNodeReachEachOther sends a real HTTP request from the node
// to pod a, which dials pod b on the same node and reports who answered.
func TestPodsOnOneNodeReachEachOther(t *testing.T) {
	needLab(t)
	ctx := context.Background()
	for _, n := range []string{"same-a", "same-b"} {
		if _, err := client.CoreV1().Pods("default").Create(ctx, netexecPod(n, "n1"), metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		defer client.CoreV1().Pods("default").Delete(ctx, n, metav1.DeleteOptions{})
	}
	a := waitPodReady(t, "default", "same-a")
	b := waitPodReady(t, "default", "same-b")
	for _, proto := range []string{"http", "udp"} {
		port := 8080
		if proto == "udp" {
			port = 8081
		}
		url := fmt.Sprintf("http://%s/dial?request=hostname&protocol=%s&host=%s&port=%d&tries=1",
			net.JoinHostPort(a.Status.PodIP, "8080"), proto, b.Status.PodIP, port)
		var resp struct {
			Responses []string `json:"responses"`
			Errors    []string `json:"errors"`
		}
		eventually(t, 30*time.Second, proto+" dial from same-a to same-b", func() error {
			body, err := getFromNode(ctx, "n1", url)
			if err != nil {
				return err
			}
			if err := json.Unmarshal(body, &resp); err != nil {
				return fmt.Errorf("%v: %s", err, body)
			}
			if len(resp.Responses) != 1 || resp.Responses[0] != "same-b" {
				return fmt.Errorf("responses %v errors %v", resp.Responses, resp.Errors)
			}
			return nil
		})
	}
}

// getFromNode sends an HTTP GET from inside a lab node's namespace.
func getFromNode(ctx context.Context, node, url string) ([]byte, error) {
	_, body, err := getInNS(ctx, netutil.Path(lab.Config{Name: labName}.NetNS(node)), url)
	return body, err
}

// getInNS GETs url from inside the network namespace at nsPath.
func getInNS(ctx context.Context, nsPath, url string) (int, []byte, error) {
	c := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{
		DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
			return netutil.DialContext(ctx, nsPath, network, addr)
		},
	}}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return 0, nil, err
	}
	resp, err := c.Do(req)
	if err != nil {
		return 0, nil, err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	return resp.StatusCode, body, err
}

func TestUnknownImageFailsClearly(t *testing.T) {
	needLab(t)
	ctx := context.Background()
	p := netexecPod("bad-image", "")
	p.Spec.Containers[0].Image = "docker.io/library/nginx:1.27"
	if _, err := client.CoreV1().Pods("default").Create(ctx, p, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	defer client.CoreV1().Pods("default").Delete(ctx, p.Name, metav1.DeleteOptions{})
	eventually(t, time.Minute, "ErrImagePull with a clear message", func() error {
		got, err := client.CoreV1().Pods("default").Get(ctx, p.Name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		for _, s := range got.Status.ContainerStatuses {
			// No registry is reachable from the lab: the runtime's pull
			// fails at once and the kubelet says so, naming the image.
			if w := s.State.Waiting; w != nil && (w.Reason == "ErrImagePull" || w.Reason == "ImagePullBackOff") && strings.Contains(w.Message, "nginx") {
				if got.Status.Phase != corev1.PodPending {
					return fmt.Errorf("phase %s, want Pending", got.Status.Phase)
				}
				return nil
			}
		}
		return fmt.Errorf("statuses %+v", got.Status.ContainerStatuses)
	})
}

func TestPodDeletionCompletes(t *testing.T) {
	needLab(t)
	ctx := context.Background()
	if _, err := client.CoreV1().Pods("default").Create(ctx, netexecPod("doomed", "n2"), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	p := waitPodReady(t, "default", "doomed")
	pid, err := lab.SandboxPID(ctx, labConfig(), "n2", string(p.UID))
	if err != nil {
		t.Fatalf("the runtime knows no sandbox of the running pod: %v", err)
	}
	netns := fmt.Sprintf("/proc/%d/ns/net", pid)
	if _, err := os.Stat(netns); err != nil {
		t.Fatalf("pod namespace %s does not exist while the pod runs: %v", netns, err)
	}
	start := time.Now()
	if err := client.CoreV1().Pods("default").Delete(ctx, "doomed", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	eventually(t, 30*time.Second, "pod gone", func() error {
		_, err := client.CoreV1().Pods("default").Get(ctx, "doomed", metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			return nil
		}
		return fmt.Errorf("still there (%v)", err)
	})
	t.Logf("deletion took %s", time.Since(start).Round(time.Millisecond))
	eventually(t, 10*time.Second, "sandbox gone from the runtime", func() error {
		if _, err := lab.SandboxPID(ctx, labConfig(), "n2", string(p.UID)); err == nil {
			return errors.New("the runtime still has a ready sandbox")
		}
		if _, err := os.Stat(netns); err == nil {
			return fmt.Errorf("sandbox process %d (and its namespace) still there", pid)
		}
		return nil
	})
}

// TestPortForward forwards a loopback port of the test machine to a pod
// with kubectl port-forward, through the API server and the lab kubelet.
func TestPortForward(t *testing.T) {
	needLab(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if _, err := client.CoreV1().Pods("default").Create(ctx, netexecPod("fwd", "n3"), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	defer client.CoreV1().Pods("default").Delete(context.Background(), "fwd", metav1.DeleteOptions{})
	waitPodReady(t, "default", "fwd")
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := ln.Addr().(*net.TCPAddr).Port
	ln.Close()
	cmd := exec.CommandContext(ctx, filepath.Join(controlplane.DefaultBinDir(), "kubectl"), "port-forward", "--address=127.0.0.1",
		"pod/fwd", fmt.Sprintf("%d:8080", port))
	cmd.Env = append(os.Environ(), "KUBECONFIG="+kubeconfig)
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = cmd.Process.Kill(); _ = cmd.Wait() }()
	eventually(t, 30*time.Second, "GET /hostname through port-forward", func() error {
		resp, err := http.Get(fmt.Sprintf("http://127.0.0.1:%d/hostname", port))
		if err != nil {
			return err
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		if strings.TrimSpace(string(b)) != "fwd" {
			return fmt.Errorf("answered %q", b)
		}
		return nil
	})
}

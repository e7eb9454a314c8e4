package lab

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	cri "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/lace-cni/lace/internal/netutil"
)

// PodNetNS returns a path to the network namespace of pod NS/NAME that
// works from the machine: the node's namespace for a hostNetwork pod,
// otherwise /proc/<pid>/ns/net of the pod's sandbox, found by asking the
// node's container runtime over CRI, as crictl would.
func PodNetNS(ctx context.Context, c Config, ns, name string) (string, error) {
	cs, err := clientset(c)
	if err != nil {
		return "", err
	}
	pod, err := cs.CoreV1().Pods(ns).Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		return "", err
	}
	if pod.Spec.NodeName == "" {
		return "", fmt.Errorf("pod %s/%s is not scheduled", ns, name)
	}
	if pod.Spec.HostNetwork {
		return netutil.Path(c.NetNS(pod.Spec.NodeName)), nil
	}
	pid, err := SandboxPID(ctx, c, pod.Spec.NodeName, string(pod.UID))
	if err != nil {
		return "", fmt.Errorf("pod %s/%s: %w", ns, name, err)
	}
	return fmt.Sprintf("/proc/%d/ns/net", pid), nil
}

// SandboxPID returns the PID of the ready sandbox of the pod with uid on
// node, from the node's runtime, as the machine numbers it.
func SandboxPID(ctx context.Context, c Config, node, uid string) (int, error) {
	pid, err := sandboxNodePID(ctx, c, node, uid)
	if err != nil {
		return 0, err
	}
	return machinePID(c, node, pid)
}

// sandboxNodePID is the sandbox's PID as its node's runtime numbers it, in
// the node's PID namespace.
func sandboxNodePID(ctx context.Context, c Config, node, uid string) (int, error) {
	rt, closeConn, err := criClient(c, node)
	if err != nil {
		return 0, err
	}
	defer closeConn()
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	list, err := rt.ListPodSandbox(ctx, &cri.ListPodSandboxRequest{Filter: &cri.PodSandboxFilter{
		State:         &cri.PodSandboxStateValue{State: cri.PodSandboxState_SANDBOX_READY},
		LabelSelector: map[string]string{"io.kubernetes.pod.uid": uid},
	}})
	if err != nil {
		return 0, fmt.Errorf("list sandboxes on %s: %w", node, err)
	}
	if len(list.Items) == 0 {
		return 0, fmt.Errorf("no ready sandbox on %s", node)
	}
	st, err := rt.PodSandboxStatus(ctx, &cri.PodSandboxStatusRequest{PodSandboxId: list.Items[0].Id, Verbose: true})
	if err != nil {
		return 0, fmt.Errorf("sandbox status on %s: %w", node, err)
	}
	var info struct {
		PID int `json:"pid"`
	}
	if err := json.Unmarshal([]byte(st.Info["info"]), &info); err != nil || info.PID == 0 {
		return 0, fmt.Errorf("sandbox %s on %s reports no pid (%v)", list.Items[0].Id, node, err)
	}
	return info.PID, nil
}

// SandboxIDs lists the IDs of the pod sandboxes node's runtime has (ready
// or not), which are the container IDs it gives CNI plugins.
func SandboxIDs(ctx context.Context, c Config, node string) ([]string, error) {
	rt, closeConn, err := criClient(c, node)
	if err != nil {
		return nil, err
	}
	defer closeConn()
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	list, err := rt.ListPodSandbox(ctx, &cri.ListPodSandboxRequest{})
	if err != nil {
		return nil, fmt.Errorf("list sandboxes on %s: %w", node, err)
	}
	var out []string
	for _, s := range list.Items {
		out = append(out, s.Id)
	}
	return out, nil
}

// criClient connects to node's runtime over CRI, from the machine.
func criClient(c Config, node string) (cri.RuntimeServiceClient, func(), error) {
	conn, err := grpc.NewClient("unix://"+c.ContainerdSocket(node), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return nil, nil, fmt.Errorf("CRI of %s: %w", node, err)
	}
	return cri.NewRuntimeServiceClient(conn), func() { conn.Close() }, nil
}

package lab

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"syscall"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/utils/ptr"

	lacev1 "github.com/lace-cni/lace/api/v1alpha1"
	"github.com/lace-cni/lace/lab/controlplane"
)

// Lace runs in the lab as it runs anywhere, as pods, so controlling it is
// what an operator would do: delete a pod to restart it (its DaemonSet or
// Deployment brings it back), keep the agent DaemonSet off a node with a
// label to stop it, and scale the controller.

// agentPodLabels select the agent DaemonSet's pods.
const agentPodLabels = "app.kubernetes.io/name=lace-agent"

// controllerPodLabels select the controller's pods.
const controllerPodLabels = "app.kubernetes.io/name=lace-controller"

// Control restarts, stops, starts or kills (SIGKILL, as a crash does)
// agent/NODE or the controller, or stops or starts the API server or
// etcd, and waits until the change has taken effect (a kill, until the
// process is gone: its pod restarts the container). Stopping a stopped
// component, or starting a running one, is a no-op.
func Control(ctx context.Context, c Config, action, target string) error {
	if target == controlplane.ComponentAPIServer || target == controlplane.ComponentEtcd {
		return controlControlPlane(ctx, c, action, target)
	}
	cs, err := clientset(c)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, 3*time.Minute)
	defer cancel()
	if node, ok := strings.CutPrefix(target, "agent/"); ok {
		if _, err := cs.CoreV1().Nodes().Get(ctx, node, metav1.GetOptions{}); err != nil {
			return fmt.Errorf("no node %q in lab %s: %w", node, c.Name, err)
		}
		if action == "kill" {
			return killPod(ctx, cs, agentPodLabels, node, "lace-agent")
		}
		return controlAgent(ctx, cs, action, node)
	}
	if target == "controller" {
		if action == "kill" {
			return killPod(ctx, cs, controllerPodLabels, "", "lace-controller")
		}
		return controlController(ctx, cs, action)
	}
	return fmt.Errorf("no component %q in lab %s (agent/NODE, controller, apiserver or etcd)", target, c.Name)
}

func controlAgent(ctx context.Context, cs kubernetes.Interface, action, node string) error {
	switch action {
	case "restart":
		old, err := runningPod(ctx, cs, agentPodLabels, node)
		if err != nil {
			return err
		}
		if old != nil {
			if err := cs.CoreV1().Pods(ReleaseNamespace).Delete(ctx, old.Name, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
				return fmt.Errorf("delete agent pod %s: %w", old.Name, err)
			}
		}
		return waitPod(ctx, cs, agentPodLabels, node, old, true)
	case "stop":
		if err := labelNode(ctx, cs, node, ptr.To("stopped")); err != nil {
			return err
		}
		return waitPod(ctx, cs, agentPodLabels, node, nil, false)
	case "start":
		if err := labelNode(ctx, cs, node, nil); err != nil {
			return err
		}
		return waitPod(ctx, cs, agentPodLabels, node, nil, true)
	}
	return fmt.Errorf("unknown action %q (restart, stop or start)", action)
}

func controlController(ctx context.Context, cs kubernetes.Interface, action string) error {
	deps := cs.AppsV1().Deployments(ReleaseNamespace)
	scale := func(n int32) error {
		s, err := deps.GetScale(ctx, ControllerDeployment, metav1.GetOptions{})
		if err != nil {
			return fmt.Errorf("controller scale: %w", err)
		}
		s.Spec.Replicas = n
		_, err = deps.UpdateScale(ctx, ControllerDeployment, s, metav1.UpdateOptions{})
		return err
	}
	switch action {
	case "restart":
		old, err := runningPod(ctx, cs, controllerPodLabels, "")
		if err != nil {
			return err
		}
		if old != nil {
			if err := cs.CoreV1().Pods(ReleaseNamespace).Delete(ctx, old.Name, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
				return err
			}
		}
		return waitPod(ctx, cs, controllerPodLabels, "", old, true)
	case "stop":
		if err := scale(0); err != nil {
			return err
		}
		return waitPod(ctx, cs, controllerPodLabels, "", nil, false)
	case "start":
		if err := scale(1); err != nil {
			return err
		}
		return waitPod(ctx, cs, controllerPodLabels, "", nil, true)
	}
	return fmt.Errorf("unknown action %q (restart, stop or start)", action)
}

// controlControlPlane asks the lab's daemon, which runs them, to stop or
// start the API server or etcd.
func controlControlPlane(ctx context.Context, c Config, action, target string) error {
	if action != "stop" && action != "start" {
		return fmt.Errorf("%s can be stopped or started, not %q", target, action)
	}
	// Starting waits for the component to serve.
	return daemonPost(ctx, c, "/components/"+target+"/"+action, 2*time.Minute)
}

// killPod sends SIGKILL to the main process (comm) of the running pod
// matching selector (on node, when given), found by the pod's cgroup on
// the machine, and waits until it is gone: a crash, which the kubelet
// answers by restarting the container in the same pod.
func killPod(ctx context.Context, cs kubernetes.Interface, selector, node, comm string) error {
	p, err := runningPod(ctx, cs, selector, node)
	if err != nil {
		return err
	}
	if p == nil {
		return fmt.Errorf("no running pod %s on %q", selector, node)
	}
	return KillProcess(ctx, p, comm)
}

// KillProcess sends SIGKILL to the processes named comm in pod p (on
// this machine's lab), found by the pod's cgroup, and waits until they
// are gone.
func KillProcess(ctx context.Context, p *corev1.Pod, comm string) error {
	pids, err := podProcesses(string(p.UID), comm)
	if err != nil {
		return err
	}
	if len(pids) == 0 {
		return fmt.Errorf("no %s process in pod %s", comm, p.Name)
	}
	for _, pid := range pids {
		if err := syscall.Kill(pid, syscall.SIGKILL); err != nil && !errors.Is(err, syscall.ESRCH) {
			return fmt.Errorf("kill %s (pid %d) of %s: %w", comm, pid, p.Name, err)
		}
	}
	for _, pid := range pids {
		for syscall.Kill(pid, 0) == nil {
			if !sleepCtx(ctx, 20*time.Millisecond) {
				return ctx.Err()
			}
		}
	}
	return nil
}

// labelNode sets (or, with nil, removes) the agent-stopped label.
func labelNode(ctx context.Context, cs kubernetes.Interface, node string, value *string) error {
	patch, _ := json.Marshal(map[string]any{"metadata": map[string]any{"labels": map[string]any{lacev1.LabelAgentStopped: value}}})
	if _, err := cs.CoreV1().Nodes().Patch(ctx, node, types.MergePatchType, patch, metav1.PatchOptions{}); err != nil {
		return fmt.Errorf("label node %s: %w", node, err)
	}
	return nil
}

// runningPod returns the pod matching selector (on node, when given) that
// is not being deleted, or nil.
func runningPod(ctx context.Context, cs kubernetes.Interface, selector, node string) (*corev1.Pod, error) {
	opts := metav1.ListOptions{LabelSelector: selector}
	if node != "" {
		opts.FieldSelector = "spec.nodeName=" + node
	}
	pods, err := cs.CoreV1().Pods(ReleaseNamespace).List(ctx, opts)
	if err != nil {
		return nil, err
	}
	for i := range pods.Items {
		if pods.Items[i].DeletionTimestamp == nil {
			return &pods.Items[i], nil
		}
	}
	return nil, nil
}

// waitPod waits until a pod matching selector (on node) other than old is
// Ready (ready) or until no pod matches at all (!ready).
func waitPod(ctx context.Context, cs kubernetes.Interface, selector, node string, old *corev1.Pod, ready bool) error {
	opts := metav1.ListOptions{LabelSelector: selector}
	if node != "" {
		opts.FieldSelector = "spec.nodeName=" + node
	}
	last := ""
	for {
		pods, err := cs.CoreV1().Pods(ReleaseNamespace).List(ctx, opts)
		if err == nil {
			done := false
			if !ready {
				done = len(pods.Items) == 0
				last = fmt.Sprintf("%d pods left", len(pods.Items))
			}
			for _, p := range pods.Items {
				if ready && (old == nil || p.UID != old.UID) && p.DeletionTimestamp == nil && PodReady(&p) {
					done = true
				}
			}
			if ready && !done {
				last = "no new ready pod"
			}
			if done {
				return nil
			}
		} else {
			last = err.Error()
		}
		if !sleepCtx(ctx, 200*time.Millisecond) {
			return fmt.Errorf("wait for %s on %q: %w (%s)", selector, node, ctx.Err(), last)
		}
	}
}

// PodReady tells that p's Ready condition is true.
func PodReady(p *corev1.Pod) bool {
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

func clientset(c Config) (kubernetes.Interface, error) {
	cfg, err := clientcmd.BuildConfigFromFlags("", c.Kubeconfig())
	if err != nil {
		return nil, fmt.Errorf("lab %s kubeconfig: %w", c.Name, err)
	}
	return kubernetes.NewForConfig(cfg)
}

func sleepCtx(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}

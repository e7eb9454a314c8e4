package chaos

import (
	"context"
	"fmt"
	"slices"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/lace-cni/lace/lab"
)

// nodeReboot power-cycles a node (lab.Reboot): its processes die at once,
// its network namespace, eBPF pins and /run are made again from nothing,
// its disk stays. Its agent must rebuild the node's data plane from the
// API and its checkpoint, the kubelet makes every pod's sandbox again,
// and the invariants then say whether the old sandboxes' addresses,
// NetworkEndpoints and map entries were freed or given back to the same
// pods, never held twice.
func nodeReboot(ctx context.Context, h *harness, w *workload) error {
	node := h.randomNode()
	w.mayFailOver(node)
	w.rebooted = node
	// Every container of the node dies with it; the kubelet counts one
	// restart for each when the node is back.
	var back []*corev1.Pod
	for _, ns := range []string{lab.ReleaseNamespace, Namespace} {
		pods, err := h.cs.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{FieldSelector: "spec.nodeName=" + node})
		if err != nil {
			return err
		}
		for i := range pods.Items {
			p := &pods.Items[i]
			switch {
			case p.DeletionTimestamp != nil:
			case ns == lab.ReleaseNamespace && (p.Labels["app.kubernetes.io/name"] == "lace-agent" || p.Labels["app.kubernetes.io/name"] == "lace-controller"):
				h.killed(string(p.UID))
				back = append(back, p)
			case ns == Namespace && (p.Labels[labelRole] == roleServer || p.Labels[labelRole] == roleClient):
				back = append(back, p)
			}
		}
	}
	before := map[string][]string{}
	for _, p := range back {
		if p.Namespace == Namespace {
			before[p.Name] = podIPs(p)
		}
	}
	if err := lab.Reboot(ctx, h.cfg, node); err != nil {
		return err
	}
	h.printf("  %s rebooted", node)
	for _, p := range back {
		if err := h.awaitRestart(ctx, p); err != nil {
			return err
		}
	}
	if err := h.converge(ctx); err != nil {
		return err
	}
	if err := w.follow(ctx, node); err != nil {
		return err
	}
	w.rebootedUntil = time.Now()
	kept := 0
	for name, ips := range before {
		if slices.Equal(ips, podIPs(w.pods[name])) {
			kept++
		}
	}
	h.printf("  %d of its %d workload pods came back at the addresses they had", kept, len(before))
	return nil
}

func podIPs(p *corev1.Pod) []string {
	var out []string
	for _, ip := range p.Status.PodIPs {
		out = append(out, ip.IP)
	}
	return out
}

// follow re-reads the workload's pods and points every stream and
// prober through node at where its pods are now (a new sandbox, maybe a
// new address), dropping the connections held through it so that they
// break inside the fault's window, where they are excused; then it waits
// until each has been answered on its new connection.
func (w *workload) follow(ctx context.Context, node string) error {
	for name := range w.pods {
		p, err := w.h.cs.CoreV1().Pods(Namespace).Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		w.pods[name] = p
	}
	asked := map[*stream]int{}
	for _, tcp := range []bool{true, false} {
		paths, err := w.paths(ctx, tcp)
		if err != nil {
			return err
		}
		for _, p := range paths {
			if !p.through(node) {
				continue
			}
			if tcp {
				for _, s := range w.streams {
					if s.name == p.name {
						s.mu.Lock()
						asked[s] = s.asked
						s.mu.Unlock()
						s.follow(p)
					}
				}
				continue
			}
			for _, pr := range w.probers {
				if pr.name == p.name {
					pr.follow(p)
				}
			}
		}
	}
	return until(ctx, 2*time.Minute, "the streams through "+node+" answered again", func() error {
		for s, n := range asked {
			s.mu.Lock()
			now := s.asked
			s.mu.Unlock()
			if now <= n {
				return fmt.Errorf("stream %s not answered since", s.name)
			}
		}
		return nil
	})
}

package lacectl

import (
	"bytes"
	"context"
	"fmt"
	"strconv"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/client-go/kubernetes"

	"github.com/lace-cni/lace/internal/dpmetrics"
)

// AgentSelector selects lace-agent pods (the chart's selector label).
var AgentSelector = labels.SelectorFromSet(labels.Set{"app.kubernetes.io/name": "lace-agent"})

// AgentMetrics reads a node's counters from its lace-agent's metrics
// endpoint through the API server's pod proxy
// (/api/v1/namespaces/NS/pods/POD:PORT/proxy/metrics): the agent listens
// on the node's network, which an operator's machine may not reach, while
// the API server does (it reaches kubelets the same way). It needs
// get on pods/proxy.
func AgentMetrics(cs kubernetes.Interface) CounterSource {
	return func(ctx context.Context, node string) (dpmetrics.Snapshot, error) {
		pods, err := cs.CoreV1().Pods(metav1.NamespaceAll).List(ctx, metav1.ListOptions{
			LabelSelector: AgentSelector.String(),
			FieldSelector: fields.OneTermEqualSelector("spec.nodeName", node).String(),
		})
		if err != nil {
			return dpmetrics.Snapshot{}, fmt.Errorf("find lace-agent on %s: %w", node, err)
		}
		for _, p := range pods.Items {
			if p.Status.Phase != corev1.PodRunning || p.DeletionTimestamp != nil {
				continue
			}
			port := metricsPort(&p)
			if port == 0 {
				continue
			}
			body, err := cs.CoreV1().Pods(p.Namespace).ProxyGet("http", p.Name, strconv.Itoa(int(port)), "metrics", nil).DoRaw(ctx)
			if err != nil {
				return dpmetrics.Snapshot{}, fmt.Errorf("scrape %s/%s: %w", p.Namespace, p.Name, err)
			}
			return dpmetrics.Parse(bytes.NewReader(body))
		}
		return dpmetrics.Snapshot{}, fmt.Errorf("no running lace-agent with a metrics port on %s", node)
	}
}

// metricsPort is the agent container's port named "metrics" (the chart's).
func metricsPort(p *corev1.Pod) int32 {
	for _, c := range p.Spec.Containers {
		for _, cp := range c.Ports {
			if cp.Name == "metrics" {
				return cp.ContainerPort
			}
		}
	}
	return 0
}

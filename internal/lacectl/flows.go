package lacectl

// lacectl flows: the nodes' recent flow events (new flows forwarded,
// packets a network policy refused), as each lace-agent keeps them
// (internal/agent/flows), read through the API server's pod proxy as the
// metrics are. Asking turns a node's events on for a minute.

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"sort"
	"strconv"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/lace-cni/lace/internal/agent/flows"
)

// FlowsInput is what lacectl flows shows.
type FlowsInput struct {
	Node      string // one node's only
	Namespace string // flows with a pod of this namespace on either side
	Verdict   string // forwarded or dropped
	Follow    bool
	Limit     int
}

// FlowSource reads a node's events after seq.
type FlowSource func(ctx context.Context, node string, since uint64) ([]flows.Flow, error)

// AgentFlows reads the events of a node's lace-agent through the API
// server's pod proxy (get on pods/proxy), as AgentMetrics does.
func AgentFlows(cs kubernetes.Interface) FlowSource {
	return func(ctx context.Context, node string, since uint64) ([]flows.Flow, error) {
		p, port, err := agentPod(ctx, cs, node)
		if err != nil {
			return nil, err
		}
		body, err := cs.CoreV1().Pods(p.Namespace).ProxyGet("http", p.Name, strconv.Itoa(int(port)), "flows",
			map[string]string{"since": strconv.FormatUint(since, 10)}).DoRaw(ctx)
		if err != nil {
			return nil, fmt.Errorf("flows of %s/%s: %w", p.Namespace, p.Name, err)
		}
		var out []flows.Flow
		if err := json.NewDecoder(bytes.NewReader(body)).Decode(&out); err != nil {
			return nil, fmt.Errorf("flows of %s/%s: %w", p.Namespace, p.Name, err)
		}
		return out, nil
	}
}

// agentPod is node's running lace-agent and its metrics port.
func agentPod(ctx context.Context, cs kubernetes.Interface, node string) (*corev1.Pod, int32, error) {
	pods, err := cs.CoreV1().Pods(metav1.NamespaceAll).List(ctx, metav1.ListOptions{LabelSelector: AgentSelector.String()})
	if err != nil {
		return nil, 0, fmt.Errorf("find lace-agent on %s: %w", node, err)
	}
	for i := range pods.Items {
		p := &pods.Items[i]
		if p.Spec.NodeName != node || p.Status.Phase != corev1.PodRunning || p.DeletionTimestamp != nil {
			continue
		}
		if port := metricsPort(p); port != 0 {
			return p, port, nil
		}
	}
	return nil, 0, fmt.Errorf("no running lace-agent with a metrics port on %s", node)
}

// Flows prints the nodes' recent events, oldest first, and with Follow
// keeps printing new ones until ctx ends.
func Flows(ctx context.Context, nodes []string, src FlowSource, in FlowsInput, out io.Writer) error {
	if in.Node != "" {
		nodes = []string{in.Node}
	}
	since := map[string]uint64{}
	first := true
	for {
		var batch []flows.Flow
		for _, n := range nodes {
			fs, err := src(ctx, n, since[n])
			if err != nil {
				if in.Node != "" || !in.Follow {
					return err
				}
				fmt.Fprintf(out, "# %s: %v\n", n, err)
				continue
			}
			for _, f := range fs {
				since[n] = max(since[n], f.Seq)
				if in.matches(f) {
					batch = append(batch, f)
				}
			}
		}
		sort.SliceStable(batch, func(i, j int) bool { return batch[i].Time.Before(batch[j].Time) })
		if first && in.Limit > 0 && len(batch) > in.Limit {
			batch = batch[len(batch)-in.Limit:]
		}
		first = false
		for _, f := range batch {
			fmt.Fprintln(out, FlowLine(f))
		}
		if !in.Follow {
			return nil
		}
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(time.Second):
		}
	}
}

func (in FlowsInput) matches(f flows.Flow) bool {
	if in.Verdict != "" && f.Verdict != in.Verdict {
		return false
	}
	if ns := in.Namespace + "/"; in.Namespace != "" && !strings.HasPrefix(f.Src.Pod, ns) && !strings.HasPrefix(f.Dst.Pod, ns) &&
		!strings.HasPrefix(f.Service, ns) {
		return false
	}
	return true
}

// FlowLine is one event for people: time, node, verdict, protocol, source
// and destination (pod and network, or address), the Service the source
// addressed, and the reason and policy of a drop.
func FlowLine(f flows.Flow) string {
	side := func(e flows.Endpoint) string {
		s := e.Addr.String()
		if e.Pod != "" {
			s = e.Pod + " (" + s + ")"
		}
		if e.Network != "" {
			s += " [" + e.Network + "]"
		}
		return s
	}
	line := fmt.Sprintf("%s  %-8s %-9s %-5s %s -> %s", f.Time.Format("15:04:05.000"), f.Node, strings.ToUpper(f.Verdict), f.Proto,
		side(f.Src), side(f.Dst))
	if f.Service != "" {
		line += fmt.Sprintf("  service %s (%s)", f.Service, f.Frontend)
	}
	if f.Verdict == "dropped" {
		line += "  reason " + f.Reason
		if f.Policy != "" {
			line += fmt.Sprintf(" (%s, %s)", f.Policy, f.Direction)
		}
	}
	return line
}

package chaos

import (
	"context"
	"errors"
	"fmt"
	"os/exec"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/vishvananda/netlink"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/lace-cni/lace/internal/netutil"
	"github.com/lace-cni/lace/lab"
	"github.com/lace-cni/lace/lab/controlplane"
	"github.com/lace-cni/lace/lab/images"
)

// fault is one kind of failure the harness injects. run injects it,
// undoes it and waits for the lab to converge; the invariants are checked
// after.
type fault struct {
	name string
	// lossBound is the share of UDP questions that may go unanswered in
	// the fault's window: faults of the control plane and of Lace's own
	// processes must lose (almost) none, a fabric fault is bounded by the
	// fault itself and only reported.
	lossBound float64
	// losesAPI: the fault takes the API server from a controller (an
	// outage, its node cut off), which exits if it led (checkRestarts).
	losesAPI bool
	run      func(ctx context.Context, h *harness, w *workload) error
}

// A little loss is the machine's, not the fault's: probes time out after
// two seconds on a two-core machine that also runs the lab.
const quietLoss = 0.02

var baseline = &fault{name: "baseline", lossBound: quietLoss}

// faults are every kind the harness knows, by name.
var faults = []*fault{
	{name: "agent-kill", lossBound: quietLoss, run: agentKill},
	{name: "agent-rolling-restart", lossBound: quietLoss, run: agentRolling},
	{name: "controller-kill", lossBound: quietLoss, run: controllerKill},
	{name: "controller-failover", lossBound: quietLoss, run: controllerFailover},
	{name: "apiserver-down", lossBound: quietLoss, losesAPI: true, run: func(ctx context.Context, h *harness, w *workload) error {
		return controlPlaneDown(ctx, h, w, controlplane.ComponentAPIServer)
	}},
	{name: "etcd-down", lossBound: quietLoss, losesAPI: true, run: func(ctx context.Context, h *harness, w *workload) error {
		return controlPlaneDown(ctx, h, w, controlplane.ComponentEtcd)
	}},
	{name: "fabric-link-down", lossBound: 1, losesAPI: true, run: fabricDown},
	{name: "fabric-loss", lossBound: 1, run: fabricLoss},
	{name: "fabric-delay", lossBound: quietLoss, run: fabricDelay},
	{name: "pod-burst-agent-kill", lossBound: quietLoss, run: burst},
	{name: "node-reboot", lossBound: quietLoss, run: nodeReboot},
	{name: downgradeFault, lossBound: quietLoss, run: downgrade},
}

// downgradeFault needs an earlier release built before the run.
const downgradeFault = "downgrade-upgrade"

func selectFaults(names []string) ([]*fault, error) {
	if len(names) == 0 {
		return faults, nil
	}
	var out []*fault
	for _, n := range names {
		i := slices.IndexFunc(faults, func(f *fault) bool { return f.name == n })
		if i < 0 {
			var all []string
			for _, f := range faults {
				all = append(all, f.name)
			}
			return nil, fmt.Errorf("no fault %q (%s)", n, strings.Join(all, ", "))
		}
		out = append(out, faults[i])
	}
	return out, nil
}

// mayFailOver notes that the fault hits node: when it announces the VIP,
// the VIP fails over (as for a dead node) and the connections held
// through it break, which Lace does not prevent (docs/load-balancers.md,
// "Moving established connections"): the checks excuse exactly those.
func (w *workload) mayFailOver(node string) {
	if w.vipHolder() == node {
		w.failover = node
		w.vipMoves.failedOver(node)
		w.h.printf("  %s announces the VIP: it fails over", node)
	}
}

// vipHolder is the node whose MAC the external host holds for the VIP.
func (w *workload) vipHolder() string {
	mac := lab.ExternalNeighbour(w.h.cfg, w.vip)
	for _, node := range w.nodes {
		if m, err := lab.NodeMAC(w.h.cfg, node); err == nil && m == mac {
			return node
		}
	}
	return ""
}

func (h *harness) randomNode() string { return h.cfg.NodeName(1 + h.rng.IntN(h.cfg.Nodes)) }

// lacePod returns the running (not deleted) pod of selector on node
// (any node when empty).
func (h *harness) lacePod(ctx context.Context, selector, node string) (*corev1.Pod, error) {
	opts := metav1.ListOptions{LabelSelector: selector}
	if node != "" {
		opts.FieldSelector = "spec.nodeName=" + node
	}
	pods, err := h.cs.CoreV1().Pods(lab.ReleaseNamespace).List(ctx, opts)
	if err != nil {
		return nil, err
	}
	for i := range pods.Items {
		if pods.Items[i].DeletionTimestamp == nil && pods.Items[i].Status.Phase == corev1.PodRunning {
			return &pods.Items[i], nil
		}
	}
	return nil, fmt.Errorf("no running pod %s on %q", selector, node)
}

// kill sends SIGKILL to a Lace pod's process (comm), records it, and
// waits until the kubelet has restarted it and it is ready.
func (h *harness) kill(ctx context.Context, p *corev1.Pod, comm string) error {
	if err := lab.KillProcess(ctx, p, comm); err != nil {
		return err
	}
	h.killed(string(p.UID))
	h.printf("  killed %s (%s on %s)", comm, p.Name, p.Spec.NodeName)
	return h.awaitRestart(ctx, p)
}

// awaitRestart waits until the kubelet has restarted p's containers (p
// as it was before they died) and p is ready again: until the kubelet
// sees them die, p looks ready.
func (h *harness) awaitRestart(ctx context.Context, p *corev1.Pod) error {
	before := restartCount(p)
	return until(ctx, 2*time.Minute, p.Name+" restarted and ready", func() error {
		now, err := h.cs.CoreV1().Pods(p.Namespace).Get(ctx, p.Name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		if restarts := restartCount(now); restarts <= before || !podReady(now) {
			return fmt.Errorf("%d restarts, ready %v", restarts, podReady(now))
		}
		return nil
	})
}

func restartCount(p *corev1.Pod) int {
	n := 0
	for _, c := range p.Status.ContainerStatuses {
		n += int(c.RestartCount)
	}
	return n
}

func agentKill(ctx context.Context, h *harness, w *workload) error {
	node := h.randomNode()
	p, err := h.lacePod(ctx, agentSelector, node)
	if err != nil {
		return err
	}
	w.mayFailOver(node)
	if err := h.kill(ctx, p, "lace-agent"); err != nil {
		return err
	}
	return h.converge(ctx)
}

func agentRolling(ctx context.Context, h *harness, _ *workload) error {
	for i := 1; i <= h.cfg.Nodes; i++ {
		if err := lab.Control(ctx, h.cfg, "restart", "agent/"+h.cfg.NodeName(i)); err != nil {
			return err
		}
	}
	return h.converge(ctx)
}

// leader returns the controller pod holding the leader Lease (its
// holder is the pod's hostname: the node's, as the pod runs in the
// host's network).
func (h *harness) leader(ctx context.Context) (*corev1.Pod, error) {
	lease, err := h.cs.CoordinationV1().Leases(lab.ReleaseNamespace).Get(ctx, "lace-controller", metav1.GetOptions{})
	if err != nil {
		return nil, err
	}
	holder := ptr.Deref(lease.Spec.HolderIdentity, "")
	node, _, _ := strings.Cut(holder, "_")
	if node == "" {
		return nil, fmt.Errorf("the controller Lease has no holder")
	}
	return h.lacePod(ctx, controllerSelector, node)
}

// controllerKill kills the leading controller while pods are being
// created (each needs its NetworkEndpoint and, on a new network, its
// node's block), then waits for every pod to run with its addresses.
func controllerKill(ctx context.Context, h *harness, w *workload) error {
	leader, err := h.leader(ctx)
	if err != nil {
		return err
	}
	return w.podBatch(ctx, "alloc", 20, 5, func() error { return h.kill(ctx, leader, "lace-controller") })
}

// controllerFailover deletes the leading controller's pod: the standby
// must take the Lease over, and pods created after keep getting their
// addresses.
func controllerFailover(ctx context.Context, h *harness, w *workload) error {
	leader, err := h.leader(ctx)
	if err != nil {
		return err
	}
	if err := h.cs.CoreV1().Pods(lab.ReleaseNamespace).Delete(ctx, leader.Name, metav1.DeleteOptions{}); err != nil {
		return err
	}
	h.printf("  deleted the leading controller %s on %s", leader.Name, leader.Spec.NodeName)
	if err := until(ctx, 2*time.Minute, "another controller leading", func() error {
		p, err := h.leader(ctx)
		if err != nil {
			return err
		}
		if p.UID == leader.UID {
			return fmt.Errorf("%s still leads", p.Name)
		}
		return nil
	}); err != nil {
		return err
	}
	if err := w.podBatch(ctx, "failover", 6, 0, nil); err != nil {
		return err
	}
	return h.converge(ctx)
}

// controlPlaneDown takes the API server or etcd down for the outage.
// Meanwhile every node's data plane must keep what it had (no agent
// withdraws state when it cannot read the API): the streams and probers
// measure that the traffic flows, and the nodes' maps are compared with
// what they held before.
func controlPlaneDown(ctx context.Context, h *harness, _ *workload, component string) error {
	if err := lab.Control(ctx, h.cfg, "stop", component); err != nil {
		return err
	}
	h.printf("  %s down for %s", component, h.opts.Outage)
	// What the nodes hold once the last writes have been applied: a
	// stopping API server takes its own address out of the kubernetes
	// Service first, through the API, as it should.
	sleep(ctx, outageSettle)
	before, err := h.nodeState()
	if err != nil {
		return err
	}
	var problems []error
	end := time.Now().Add(h.opts.Outage - outageSettle)
	for time.Now().Before(end) && ctx.Err() == nil {
		sleep(ctx, min(15*time.Second, time.Until(end)))
		now, err := h.nodeState()
		if err != nil {
			problems = append(problems, err)
			break
		}
		if d := before.diff(now); d != "" {
			problems = append(problems, fmt.Errorf("with %s down, a node's data plane changed: %s", component, d))
			break
		}
	}
	// Back, whatever happened meanwhile.
	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 3*time.Minute)
	defer cancel()
	if err := lab.Control(sctx, h.cfg, "start", component); err != nil {
		return errors.Join(append(problems, err)...)
	}
	h.printf("  %s back", component)
	if err := h.converge(ctx); err != nil {
		problems = append(problems, err)
	}
	return errors.Join(problems...)
}

// outageSettle is how long after a component stops the nodes' state is
// taken as what they must keep through the outage.
const outageSettle = 5 * time.Second

// fabricDown takes a node's port on the fabric down for 30 seconds: the
// node is cut off, and its held streams must resume when it is back.
func fabricDown(ctx context.Context, h *harness, w *workload) error {
	node := h.randomNode()
	w.mayFailOver(node)
	fabric := netutil.Path(h.cfg.NetNS("fabric"))
	if err := linkSet(fabric, node, false); err != nil {
		return err
	}
	h.printf("  %s cut off the fabric for 30s", node)
	sleep(ctx, 30*time.Second)
	if err := linkSet(fabric, node, true); err != nil {
		return err
	}
	return h.converge(ctx)
}

func linkSet(nsPath, name string, up bool) error {
	return onLink(nsPath, name, func(hd *netlink.Handle, l netlink.Link) error {
		if up {
			return hd.LinkSetUp(l)
		}
		return hd.LinkSetDown(l)
	})
}

// onLink runs f on link name of the namespace at nsPath.
func onLink(nsPath, name string, f func(*netlink.Handle, netlink.Link) error) error {
	hd, err := netutil.Handle(nsPath)
	if err != nil {
		return err
	}
	defer hd.Close()
	l, err := hd.LinkByName(name)
	if err != nil {
		return fmt.Errorf("link %s: %w", name, err)
	}
	if err := f(hd, l); err != nil {
		return fmt.Errorf("link %s: %w", name, err)
	}
	return nil
}

// fabricLossPercent is the share of frames the lossy fabric drops, each
// way: a question and its answer are both at risk.
const fabricLossPercent = 10

// fabricLoss drops frames at random on the fabric bridge for a minute.
// This kernel has no netem, so loss is injected by nftables in the
// fabric's namespace (and delay by a relay, delay.go).
func fabricLoss(ctx context.Context, h *harness, _ *workload) error {
	table := "chaos_loss"
	rules := fmt.Sprintf("table bridge %s {\n chain forward {\n  type filter hook forward priority 0; policy accept;\n  numgen random mod 100 < %d counter drop\n }\n}\n", table, fabricLossPercent)
	ns := h.cfg.NetNS("fabric")
	if err := nft(ns, rules, "-f", "-"); err != nil {
		return err
	}
	h.printf("  the fabric drops %d%% of frames for 60s", fabricLossPercent)
	sleep(ctx, time.Minute)
	if err := nft(ns, "", "delete", "table", "bridge", table); err != nil {
		return err
	}
	return h.converge(ctx)
}

func nft(netns, stdin string, args ...string) error {
	cmd := exec.Command("ip", append([]string{"netns", "exec", netns, "nft"}, args...)...)
	cmd.Stdin = strings.NewReader(stdin)
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("nft %v in %s: %v: %s", args, netns, err, out)
	}
	return nil
}

// burst creates opts.Burst pods at once, killing an agent when a third
// are created, waits until all run with their addresses (none given
// twice), then deletes them all.
func burst(ctx context.Context, h *harness, w *workload) error {
	node := h.randomNode()
	p, err := h.lacePod(ctx, agentSelector, node)
	if err != nil {
		return err
	}
	w.mayFailOver(node)
	return w.podBatch(ctx, "burst", h.opts.Burst, h.opts.Burst/3, func() error { return h.kill(ctx, p, "lace-agent") })
}

// podBatch creates n pause pods named prefix-N over the nodes, calls
// during (when not nil) once at of them are created, waits until all run
// with two addresses, then deletes them, some holding a connection to the
// outside (holdOutside), and waits until they are gone.
func (w *workload) podBatch(ctx context.Context, prefix string, n, at int, during func() error) error {
	h := w.h
	names := make([]string, n)
	for i := range names {
		names[i] = fmt.Sprintf("%s-%d", prefix, i)
	}
	created := make(chan struct{}, n)
	var duringErr error
	var dwg sync.WaitGroup
	if during != nil {
		dwg.Add(1)
		go func() {
			defer dwg.Done()
			for range at {
				<-created
			}
			duringErr = during()
		}()
	}
	sem := make(chan struct{}, 8)
	var cwg sync.WaitGroup
	var mu sync.Mutex
	var errs []error
	for i, name := range names {
		sem <- struct{}{}
		cwg.Add(1)
		go func() {
			defer func() { <-sem; cwg.Done() }()
			p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: Namespace, Labels: map[string]string{labelRole: roleBurst}},
				Spec: corev1.PodSpec{NodeName: w.nodes[i%len(w.nodes)], TerminationGracePeriodSeconds: ptr.To[int64](0),
					Containers: []corev1.Container{{Name: "pause", Image: images.PauseRef}}}}
			if _, err := h.cs.CoreV1().Pods(Namespace).Create(ctx, p, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
				mu.Lock()
				errs = append(errs, err)
				mu.Unlock()
			}
			created <- struct{}{}
		}()
	}
	cwg.Wait()
	dwg.Wait()
	if err := errors.Join(append(errs, duringErr)...); err != nil {
		return err
	}
	sel := metav1.ListOptions{LabelSelector: labelRole + "=" + roleBurst}
	err := until(ctx, 6*time.Minute, fmt.Sprintf("%d %s pods running", n, prefix), func() error {
		pods, err := h.cs.CoreV1().Pods(Namespace).List(ctx, sel)
		if err != nil {
			return err
		}
		running := 0
		for _, p := range pods.Items {
			if p.Status.Phase == corev1.PodRunning && len(p.Status.PodIPs) == 2 {
				running++
			}
		}
		if running < n {
			return fmt.Errorf("%d of %d running with two addresses", running, n)
		}
		return nil
	})
	if err != nil {
		return err
	}
	h.printf("  %d %s pods ran", n, prefix)
	if err := checkAddresses(ctx, h); err != nil {
		return err
	}
	pods, err := h.cs.CoreV1().Pods(Namespace).List(ctx, sel)
	if err != nil {
		return err
	}
	// Closed once the pods are gone: checkSNAT finds their flows if the
	// nodes kept them.
	conns, err := w.holdOutside(ctx, pods.Items)
	defer closeAll(conns)
	if err != nil {
		return err
	}
	if err := h.deletePods(ctx, sel); err != nil {
		return err
	}
	if err := until(ctx, 4*time.Minute, prefix+" pods gone", func() error {
		pods, err := h.cs.CoreV1().Pods(Namespace).List(ctx, sel)
		if err != nil {
			return err
		}
		if len(pods.Items) > 0 {
			return fmt.Errorf("%d left", len(pods.Items))
		}
		return nil
	}); err != nil {
		return err
	}
	return h.converge(ctx)
}

// deletePods deletes the workload's pods sel selects, eight at a time:
// one request each stays within the client's timeout, which a collection
// of a hundred on a loaded machine does not.
func (h *harness) deletePods(ctx context.Context, sel metav1.ListOptions) error {
	pods, err := h.cs.CoreV1().Pods(Namespace).List(ctx, sel)
	if err != nil {
		return err
	}
	sem := make(chan struct{}, 8)
	var wg sync.WaitGroup
	var mu sync.Mutex
	var errs []error
	for _, p := range pods.Items {
		sem <- struct{}{}
		wg.Add(1)
		go func() {
			defer func() { <-sem; wg.Done() }()
			err := h.cs.CoreV1().Pods(Namespace).Delete(ctx, p.Name, metav1.DeleteOptions{GracePeriodSeconds: ptr.To[int64](0)})
			if err != nil && !apierrors.IsNotFound(err) {
				mu.Lock()
				errs = append(errs, err)
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	return errors.Join(errs...)
}

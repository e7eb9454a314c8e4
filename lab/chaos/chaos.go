// Package chaos runs a lab under a steady workload and injects faults
// into it at random from a seed (agents and the controller killed, the
// API server and etcd down, the fabric cut and lossy, pod bursts), then
// checks after each fault that nothing was lost: no held TCP stream
// broken, UDP loss within the fault's bound, no address given twice, no
// NetworkEndpoint, veth or map entry left behind, nothing crash-looping,
// no panic logged, the networks' reachability as their policies say.
// Every failure prints the seed and the fault sequence, so that
// `make chaos SEED=...` replays it. It drives a lab through the lab
// package and the API; it owns the objects of its namespace and the
// faults it injects, and undoes each fault before checking.
package chaos

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"maps"
	"math/rand/v2"
	"os"
	"slices"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/tools/clientcmd"
	crclient "sigs.k8s.io/controller-runtime/pkg/client"

	lacev1 "github.com/lace-cni/lace/api/v1alpha1"
	"github.com/lace-cni/lace/lab"
)

// Options of a chaos run.
type Options struct {
	// Lab is a running lab's configuration (lace CNI, three nodes or more).
	Lab lab.Config
	// Seed draws the fault sequence and everything random in the run.
	Seed uint64
	// Duration is how long faults are injected; the fault running when it
	// ends finishes, and is checked. Every kind runs at least once,
	// whatever the duration.
	Duration time.Duration
	// Outage is how long the API server, and etcd, stay down.
	Outage time.Duration
	// Burst is how many pods the burst fault creates and deletes.
	Burst int
	// Faults limits the run to these kinds (all when empty).
	Faults []string
	// From is the earlier revision of Repo the downgrade fault rolls
	// back to (DefaultFrom when empty).
	From, Repo string
	// Out receives the run's report.
	Out io.Writer
}

// harness is one run: the lab's clients, the seed's randomness and what
// the faults did that the invariants must excuse.
type harness struct {
	opts Options
	cfg  lab.Config
	seed uint64
	rng  *rand.Rand
	cs   kubernetes.Interface
	c    crclient.Client
	out  io.Writer

	mu sync.Mutex
	// restarts counts, by pod UID, the restarts of a Lace pod's container
	// the harness caused: the SIGKILLs it sent, and a controller's exit on
	// losing its leader Lease while the control plane was down (which
	// controller-runtime does by design: another replica may lead). Any
	// other restart is a crash.
	restarts map[string]int
	// excused lists the restarts of the second kind, for the report.
	excused []string
	// old is the earlier release the downgrade fault rolls back to.
	old *release
	// apiLoss are the windows of the faults that took the API server
	// from the controllers (fault.losesAPI).
	apiLoss []window
}

// Run runs the chaos of opts on its lab and returns an error naming the
// seed and fault sequence when an invariant did not hold.
func Run(ctx context.Context, opts Options) error {
	restCfg, err := clientcmd.BuildConfigFromFlags("", opts.Lab.Kubeconfig())
	if err != nil {
		return fmt.Errorf("lab %s kubeconfig: %w", opts.Lab.Name, err)
	}
	// Requests must fail fast while the API server is down.
	restCfg.Timeout = 15 * time.Second
	restCfg.QPS, restCfg.Burst = 100, 200
	cs, err := kubernetes.NewForConfig(restCfg)
	if err != nil {
		return err
	}
	scheme := runtime.NewScheme()
	if err := errors.Join(clientgoscheme.AddToScheme(scheme), lacev1.AddToScheme(scheme)); err != nil {
		return err
	}
	c, err := crclient.New(restCfg, crclient.Options{Scheme: scheme})
	if err != nil {
		return err
	}
	h := &harness{opts: opts, cfg: opts.Lab, seed: opts.Seed, rng: rand.New(rand.NewPCG(opts.Seed, 0x1ace)),
		cs: cs, c: c, out: opts.Out, restarts: map[string]int{}}
	return h.run(ctx)
}

func (h *harness) printf(format string, args ...any) {
	fmt.Fprintf(h.out, "%s "+format+"\n", append([]any{time.Now().Format("15:04:05")}, args...)...)
}

func (h *harness) run(ctx context.Context) error {
	kinds, err := selectFaults(h.opts.Faults)
	if err != nil {
		return err
	}
	seq := h.sequence(kinds)
	var names []string
	for _, f := range seq[:3*len(kinds)] {
		names = append(names, f.name)
	}
	h.printf("chaos on lab %s: seed %d, %s of faults, outage %s, burst %d", h.cfg.Name, h.seed, h.opts.Duration, h.opts.Outage, h.opts.Burst)
	h.printf("fault sequence (as far as the time allows): %s, ...", strings.Join(names, ", "))
	replay := fmt.Sprintf("replay: make chaos SEED=%d DURATION=%s OUTAGE=%s BURST=%d", h.seed, h.opts.Duration, h.opts.Outage, h.opts.Burst)
	if len(h.opts.Faults) > 0 {
		replay += " FAULTS=" + strings.Join(h.opts.Faults, ",")
	}
	if h.opts.From != "" && h.opts.From != DefaultFrom {
		replay += " FROM=" + h.opts.From
	}

	if err := h.prepare(ctx); err != nil {
		return fmt.Errorf("prepare the lab: %w", err)
	}
	lctx, stopLogs := context.WithCancel(ctx)
	var lwg sync.WaitGroup
	defer func() { stopLogs(); lwg.Wait() }()
	logs, err := h.copyLogs(lctx, &lwg)
	if err != nil {
		return err
	}
	if slices.ContainsFunc(kinds, func(f *fault) bool { return f.name == downgradeFault }) {
		tmp, err := os.MkdirTemp("", "lace-chaos-")
		if err != nil {
			return err
		}
		defer os.RemoveAll(tmp)
		from := cmp.Or(h.opts.From, DefaultFrom)
		h.printf("building the earlier release %s for %s", from, downgradeFault)
		if h.old, err = h.buildRelease(ctx, cmp.Or(h.opts.Repo, "."), from, tmp); err != nil {
			return fmt.Errorf("build the earlier release: %w", err)
		}
	}
	w, err := h.setup(ctx)
	if err != nil {
		return fmt.Errorf("set up the workload: %w", err)
	}
	wctx, stop := context.WithCancel(ctx)
	var wg sync.WaitGroup
	defer func() { stop(); wg.Wait() }()
	if err := w.start(wctx, &wg); err != nil {
		return fmt.Errorf("start the workload: %w", err)
	}
	if err := w.warm(ctx); err != nil {
		return err
	}

	var report []row
	fail := func(r row) error {
		report = append(report, r)
		h.printReport(report)
		from := time.Now().Add(-r.took - 30*time.Second)
		lines := logs.vipLines(from, time.Now())
		h.printf("the agents on the VIPs and their Leases since %s, 30s before %s: %d lines (all of Lace's logs: %s)",
			from.Format("15:04:05"), r.fault, len(lines), logs.dir)
		for _, l := range lines {
			fmt.Fprintln(h.out, "  "+l)
		}
		h.printf("the workload's Service now:")
		for _, l := range h.serviceDump(ctx) {
			fmt.Fprintln(h.out, "  "+l)
		}
		// What the agents said as the VIP moved, last: a failure's tail
		// is often all that is read of it (CI).
		for _, m := range r.moves {
			near := logs.vipLines(m.since.Add(-vipMoveWindow), m.at.Add(time.Second))
			h.printf("the agents on the VIPs and their Leases around %s: %d lines", m, len(near))
			for _, l := range near[max(0, len(near)-maxMoveLines):] {
				fmt.Fprintln(h.out, "  "+l)
			}
		}
		return fmt.Errorf("%s: %s\n%s", r.fault, strings.Join(r.problems, "; "), replay)
	}
	// The baseline: the workload measured for a while before any fault.
	baseStart := time.Now()
	sleep(ctx, baselineWindow)
	base := h.check(ctx, w, baseline, baseStart)
	if len(base.problems) > 0 {
		return fail(base)
	}
	report = append(report, base)
	// Every kind runs once (the first round), then more as long as the
	// duration lasts.
	deadline := time.Now().Add(h.opts.Duration)
	for i := 0; i < len(seq) && (i < len(kinds) || time.Now().Before(deadline)); i++ {
		f := seq[i]
		h.printf("fault %d: %s", i+1, f.name)
		start := time.Now()
		w.windows() // the fault's loss window starts now
		w.failover, w.rebooted = "", ""
		ferr := f.run(ctx, h, w)
		if f.losesAPI {
			h.mu.Lock()
			h.apiLoss = append(h.apiLoss, window{start, time.Now()})
			h.mu.Unlock()
		}
		r := h.check(ctx, w, f, start)
		if ferr != nil {
			r.problems = append([]string{"fault: " + ferr.Error()}, r.problems...)
		}
		if len(r.problems) > 0 {
			return fail(r)
		}
		report = append(report, r)
		h.printf("fault %d: %s held (%s)", i+1, f.name, r.took.Round(time.Second))
	}
	stop()
	wg.Wait()
	end := h.teardown(ctx, w)
	if len(end.problems) > 0 {
		return fail(end)
	}
	report = append(report, end)
	h.printReport(report)
	for _, e := range h.excused {
		h.printf("restart by design: %s exited on its lost Lease", e)
	}
	h.printf("chaos held: %d faults, seed %d", len(report)-2, h.seed)
	return nil
}

// teardown deletes the workload and checks that nothing of it is left:
// no NetworkEndpoint, veth, map entry, checkpointed endpoint or SNAT port
// held, and that no Lace process crashed or panicked over the whole run.
func (h *harness) teardown(ctx context.Context, w *workload) row {
	start := time.Now()
	r := row{fault: "teardown"}
	var errs []error
	errs = append(errs, h.deletePods(ctx, metav1.ListOptions{}))
	errs = append(errs, h.cs.CoreV1().Services(Namespace).Delete(ctx, svcName, metav1.DeleteOptions{}))
	for _, o := range w.objects {
		errs = append(errs, crclient.IgnoreNotFound(h.c.Delete(ctx, o)))
	}
	if err := errors.Join(errs...); err != nil {
		r.problems = append(r.problems, "delete the workload: "+err.Error())
	}
	if err := until(ctx, 3*time.Minute, "the workload's pods gone", func() error {
		pods, err := h.cs.CoreV1().Pods(Namespace).List(ctx, metav1.ListOptions{})
		if err != nil {
			return err
		}
		if len(pods.Items) > 0 {
			return fmt.Errorf("%d pods left", len(pods.Items))
		}
		return nil
	}); err != nil {
		r.problems = append(r.problems, err.Error())
	}
	for _, c := range []func(context.Context, *harness) error{checkNetworkEndpoints, checkResidue, checkMaps, checkSNAT, checkLogs, checkRepairs} {
		if err := c(ctx, h); err != nil {
			r.problems = append(r.problems, err.Error())
		}
	}
	if err := checkRestarts(ctx, h); err != nil {
		r.problems = append(r.problems, err.Error())
	}
	r.took = time.Since(start)
	return r
}

// sequence draws the order of the faults from the seed: every kind once
// in a random order, then again in another, as long as the run lasts.
func (h *harness) sequence(kinds []*fault) []*fault {
	var seq []*fault
	for len(seq) < 200 {
		round := append([]*fault(nil), kinds...)
		h.rng.Shuffle(len(round), func(i, j int) { round[i], round[j] = round[j], round[i] })
		seq = append(seq, round...)
	}
	return seq
}

// prepare runs two controller replicas (one leads, one stands by), so a
// leader's loss is a failover.
func (h *harness) prepare(ctx context.Context) error {
	if err := lab.HelmInstall(ctx, h.cfg, "controller.replicas=2"); err != nil {
		return err
	}
	if err := h.converge(ctx); err != nil {
		return err
	}
	// On a lab that ran before, restarts before this run are not its.
	before, err := h.laceRestarts(ctx)
	if err != nil {
		return err
	}
	h.mu.Lock()
	maps.Copy(h.restarts, before)
	h.mu.Unlock()
	return nil
}

// converge waits until every node is Ready with a Ready agent, both
// controllers are Ready, and the workload's pods are Ready.
func (h *harness) converge(ctx context.Context) error {
	return until(ctx, 4*time.Minute, "the lab converged", func() error {
		nodes, err := h.cs.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
		if err != nil {
			return err
		}
		for _, n := range nodes.Items {
			ready := false
			for _, c := range n.Status.Conditions {
				ready = ready || (c.Type == corev1.NodeReady && c.Status == corev1.ConditionTrue)
			}
			if !ready {
				return fmt.Errorf("node %s not ready", n.Name)
			}
		}
		for _, sel := range []struct {
			labels string
			want   int
		}{{agentSelector, len(nodes.Items)}, {controllerSelector, 2}} {
			pods, err := h.cs.CoreV1().Pods(lab.ReleaseNamespace).List(ctx, metav1.ListOptions{LabelSelector: sel.labels})
			if err != nil {
				return err
			}
			ready := 0
			for i := range pods.Items {
				if podReady(&pods.Items[i]) {
					ready++
				}
			}
			if ready != sel.want {
				return fmt.Errorf("%d of %d pods %s ready", ready, sel.want, sel.labels)
			}
		}
		pods, err := h.cs.CoreV1().Pods(Namespace).List(ctx, metav1.ListOptions{LabelSelector: labelRole + " in (" + roleServer + "," + roleClient + ")"})
		if err != nil {
			return err
		}
		for i := range pods.Items {
			if !podReady(&pods.Items[i]) {
				return fmt.Errorf("workload pod %s not ready", pods.Items[i].Name)
			}
		}
		return nil
	})
}

// baselineWindow is how long the workload is measured before the first fault.
const baselineWindow = 20 * time.Second

const (
	agentSelector      = "app.kubernetes.io/name=lace-agent"
	controllerSelector = "app.kubernetes.io/name=lace-controller"
)

// warm waits until every stream and prober has had answers, so the
// baseline measures a working workload.
func (w *workload) warm(ctx context.Context) error {
	err := until(ctx, 2*time.Minute, "the workload answering", func() error {
		for _, s := range w.streams {
			s.mu.Lock()
			asked := s.asked
			s.mu.Unlock()
			if asked < 3 {
				return fmt.Errorf("stream %s: %d answers", s.name, asked)
			}
		}
		for _, p := range w.probers {
			p.mu.Lock()
			answered := p.answered
			p.mu.Unlock()
			if answered < 3 {
				return fmt.Errorf("prober %s: %d answers", p.name, answered)
			}
		}
		return nil
	})
	if err != nil {
		return err
	}
	// Streams that failed while the workload came up (a Service not yet
	// programmed) are not the faults'.
	for _, s := range w.streams {
		s.mu.Lock()
		s.failures = nil
		s.mu.Unlock()
	}
	w.windows()
	return nil
}

// windows starts a new loss window on every prober and returns the last.
func (w *workload) windows() map[string][2]int {
	out := map[string][2]int{}
	for _, p := range w.probers {
		sent, lost := p.window()
		out[p.name] = [2]int{sent, lost}
	}
	return out
}

// row is one line of the report: a fault and what the checks after it found.
type row struct {
	fault      string
	took       time.Duration
	sent, lost int
	worst      string
	problems   []string
	// excused are breaks the fault explains and Lace does not promise
	// to survive (a VIP's failover).
	excused []string
	// moves are the VIP's moves no fault explains, behind a break.
	moves []vipMove
}

func (h *harness) printReport(rows []row) {
	fmt.Fprintf(h.out, "\n%-22s %9s %8s %7s  %s\n", "FAULT", "TOOK", "UDP", "LOST", "RESULT")
	for _, r := range rows {
		res := "held"
		if len(r.problems) > 0 {
			res = "FAILED: " + strings.Join(r.problems, "; ")
		}
		loss := "-"
		if r.sent > 0 {
			loss = fmt.Sprintf("%.1f%%", 100*float64(r.lost)/float64(r.sent))
		}
		fmt.Fprintf(h.out, "%-22s %9s %8d %7s  %s", r.fault, r.took.Round(time.Second), r.sent, loss, res)
		if r.worst != "" {
			fmt.Fprintf(h.out, " (worst path: %s)", r.worst)
		}
		fmt.Fprintln(h.out)
		for _, e := range r.excused {
			fmt.Fprintf(h.out, "%22s excused: %s\n", "", e)
		}
	}
	fmt.Fprintln(h.out)
}

// killed records a SIGKILL sent to a Lace pod.
func (h *harness) killed(uid string) {
	h.mu.Lock()
	h.restarts[uid]++
	h.mu.Unlock()
}

package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"slices"
	"sync"
	"text/tabwriter"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"
	"k8s.io/utils/ptr"

	"github.com/lace-cni/lace/lab/images"
)

// runningRounds is how many bursts each cluster runs, alternating: one
// round says little, as the CNI ADD rows showed (bridge's p99 moved by a
// fifth between runs).
const runningRounds = 2

// benchRunning creates n pause pods at once over the nodes of the Lace
// lab and of the flannel lab (flannel's CNI is bridge + host-local, the
// peer of the CNI ADD rows), in turns, and times each pod from its create
// to the first sight of it Running: the whole path a user waits on
// (kubelet, containerd, runc, the CNI), where the CNI ADD rows time the
// plugin alone. The pods are placed on the nodes round robin, as the
// scheduler's cost is not the CNI's.
func benchRunning(ctx context.Context, name, peerLab string, n int) error {
	type cluster struct {
		label string
		cs    kubernetes.Interface
		nodes []string
		runs  []runningRun
	}
	var clusters []*cluster
	for _, c := range []struct{ label, lab string }{{"Lace", name}, {"flannel (bridge + host-local)", peerLab}} {
		cs, err := burstClient(c.lab)
		if err != nil {
			return err
		}
		nodes, err := cs.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
		if err != nil {
			return fmt.Errorf("nodes of lab %s: %w", c.lab, err)
		}
		cl := &cluster{label: c.label, cs: cs}
		for _, node := range nodes.Items {
			cl.nodes = append(cl.nodes, node.Name)
		}
		slices.Sort(cl.nodes)
		clusters = append(clusters, cl)
	}
	for round := range runningRounds {
		for _, cl := range clusters {
			r, err := runningBurst(ctx, cl.cs, cl.nodes, n)
			if err != nil {
				return fmt.Errorf("%s, round %d: %w", cl.label, round+1, err)
			}
			cl.runs = append(cl.runs, r)
		}
	}
	lace, peer := clusters[0], clusters[1]
	fmt.Printf("%d pause pods created at once (8 creates in flight) over %d nodes, to Running, %d rounds each, alternating\n", n, len(lace.nodes), runningRounds)
	tw := tabwriter.NewWriter(os.Stdout, 0, 4, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintf(tw, "\t%s\t%s\tratio\t\n", lace.label, peer.label)
	for i := range runningRounds {
		l, p := lace.runs[i], peer.runs[i]
		fmt.Fprintf(tw, "round %d: pods/s to Running\t%.1f\t%.1f\t%.2f\t\n", i+1, l.perSecond(), p.perSecond(), p.perSecond()/l.perSecond())
		for _, q := range []int{50, 99} {
			fmt.Fprintf(tw, "round %d: create to Running, p%d\t%s\t%s\t%.2f\t\n", i+1, q,
				l.quantile(q).Round(time.Millisecond), p.quantile(q).Round(time.Millisecond), float64(l.quantile(q))/float64(p.quantile(q)))
		}
	}
	tw.Flush()
	fmt.Println("ratio = Lace / peer for latency, peer / Lace for pods/s (lower is better)")
	fmt.Println()
	return nil
}

// burstClient is a client of lab name that creates a burst at the API
// server's pace: client-go's default of 5 requests a second made the first
// runs time the client's own throttle (300 creates took a minute).
func burstClient(name string) (kubernetes.Interface, error) {
	cfg, _, err := labRESTConfig(name)
	if err != nil {
		return nil, err
	}
	cfg.QPS, cfg.Burst = 500, 1000
	return kubernetes.NewForConfig(cfg)
}

// runningRun is one burst: each pod's time from its create to Running,
// and the time from the first create to the last pod Running.
type runningRun struct {
	lat  []time.Duration
	wall time.Duration
}

func (r runningRun) perSecond() float64 { return float64(len(r.lat)) / r.wall.Seconds() }

func (r runningRun) quantile(p int) time.Duration { return r.lat[min(len(r.lat)-1, len(r.lat)*p/100)] }

// runningBurst creates n pods in a namespace of its own, waits until each
// is Running, and deletes the namespace, waiting until its pods are gone
// (the next round starts on clean nodes).
func runningBurst(ctx context.Context, cs kubernetes.Interface, nodes []string, n int) (runningRun, error) {
	suffix := make([]byte, 3)
	_, _ = rand.Read(suffix)
	ns := "bench-run-" + hex.EncodeToString(suffix)
	if _, err := cs.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil {
		return runningRun{}, err
	}
	defer func() {
		if err := deleteNamespaceAndWait(cs, ns); err != nil {
			fmt.Fprintf(os.Stderr, "bench: %v\n", err)
		}
	}()
	// The default ServiceAccount must exist before a pod may be created.
	if err := waitFor(ctx, time.Minute, "default ServiceAccount of "+ns, func() error {
		_, err := cs.CoreV1().ServiceAccounts(ns).Get(ctx, "default", metav1.GetOptions{})
		return err
	}); err != nil {
		return runningRun{}, err
	}
	w, err := cs.CoreV1().Pods(ns).Watch(ctx, metav1.ListOptions{})
	if err != nil {
		return runningRun{}, err
	}
	defer w.Stop()

	var mu sync.Mutex
	created := map[string]time.Time{}
	sem := make(chan struct{}, 8)
	var wg sync.WaitGroup
	errs := make([]error, n)
	create := func(i int) {
		defer func() { <-sem }()
		name := fmt.Sprintf("run-%03d", i)
		p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns},
			Spec: corev1.PodSpec{NodeName: nodes[i%len(nodes)], TerminationGracePeriodSeconds: ptr.To[int64](0),
				Containers: []corev1.Container{{Name: "pause", Image: images.PauseRef}}}}
		t := time.Now()
		if _, err := cs.CoreV1().Pods(ns).Create(ctx, p, metav1.CreateOptions{}); err != nil {
			errs[i] = fmt.Errorf("create %s: %w", name, err)
			return
		}
		mu.Lock()
		created[name] = t
		mu.Unlock()
	}
	start := time.Now()
	// Created from a goroutine of their own, so that the watch below is
	// read from the start: a pod Running before the last create is timed
	// when it is seen, not after.
	var dispatch sync.WaitGroup
	dispatch.Go(func() {
		for i := range n {
			sem <- struct{}{}
			wg.Go(func() { create(i) })
		}
	})
	// On an early return too, no create runs into the namespace's
	// deletion (deferred above, so run after this).
	defer func() { dispatch.Wait(); wg.Wait() }()

	running := map[string]time.Time{}
	timeout := time.After(5 * time.Minute)
	for len(running) < n {
		select {
		case ev, ok := <-w.ResultChan():
			if !ok {
				return runningRun{}, fmt.Errorf("the watch of %s ended with %d of %d pods running", ns, len(running), n)
			}
			if ev.Type == watch.Error {
				return runningRun{}, fmt.Errorf("watch %s: %v", ns, apierrors.FromObject(ev.Object))
			}
			p, ok := ev.Object.(*corev1.Pod)
			if !ok || p.Status.Phase != corev1.PodRunning || p.Status.PodIP == "" {
				continue
			}
			if _, seen := running[p.Name]; !seen {
				running[p.Name] = time.Now()
			}
		case <-timeout:
			return runningRun{}, fmt.Errorf("%d of %d pods running in %s after 5 minutes", len(running), n, ns)
		case <-ctx.Done():
			return runningRun{}, ctx.Err()
		}
	}
	dispatch.Wait()
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return runningRun{}, err
	}
	var r runningRun
	for name, at := range running {
		r.lat = append(r.lat, at.Sub(created[name]))
		r.wall = max(r.wall, at.Sub(start))
	}
	slices.Sort(r.lat)
	return r, nil
}

// deleteNamespaceAndWait deletes ns and waits until its pods are gone.
func deleteNamespaceAndWait(cs kubernetes.Interface, ns string) error {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	// Not forced: a pod leaves the API once its kubelet has stopped its
	// sandbox (the CNI DEL included), so the next round starts on a
	// machine that is done with this one. Forced, the pods left at once
	// and their teardown ran into the other cluster's round.
	if err := cs.CoreV1().Namespaces().Delete(ctx, ns, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("delete namespace %s: %w", ns, err)
	}
	return waitFor(ctx, 5*time.Minute, "pods of namespace "+ns+" gone", func() error {
		pods, err := cs.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{})
		if err != nil {
			return err
		}
		if len(pods.Items) > 0 {
			return fmt.Errorf("%d pods of namespace %s left", len(pods.Items), ns)
		}
		return nil
	})
}

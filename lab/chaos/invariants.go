package chaos

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	lacev1 "github.com/lace-cni/lace/api/v1alpha1"
	"github.com/lace-cni/lace/internal/dpmetrics"
	"github.com/lace-cni/lace/internal/netutil"
	"github.com/lace-cni/lace/lab"
)

// check runs every invariant after fault f (started at start) and
// returns its report row; problems lists what did not hold.
func (h *harness) check(ctx context.Context, w *workload, f *fault, start time.Time) row {
	r := row{fault: f.name, took: time.Since(start)}
	worst := 0.0
	// A rebooted node's paths lose what it could not answer: reported,
	// but the bound holds for every other path.
	through := map[string]bool{}
	for _, p := range w.probers {
		through[p.name] = w.rebooted != "" && p.through(w.rebooted)
	}
	boundSent, boundLost := 0, 0
	// lossy are the paths that lost anything: a failure names them all
	// (which paths lost together tells a black-holed node from a
	// Service's bad backend).
	var lossy []string
	for name, sl := range w.windows() {
		r.sent += sl[0]
		r.lost += sl[1]
		if sl[1] > 0 {
			l := fmt.Sprintf("%s %d/%d", name, sl[1], sl[0])
			if through[name] {
				l += " (through the rebooted node, not counted)"
			}
			lossy = append(lossy, l)
		}
		if !through[name] {
			boundSent += sl[0]
			boundLost += sl[1]
		}
		if sl[0] > 0 && float64(sl[1])/float64(sl[0]) > worst {
			worst = float64(sl[1]) / float64(sl[0])
			r.worst = fmt.Sprintf("%s %d/%d lost", name, sl[1], sl[0])
		}
	}
	if r.sent == 0 || boundSent == 0 {
		r.problems = append(r.problems, "no UDP question was asked: the probers stopped")
	} else if loss := float64(boundLost) / float64(boundSent); loss > f.lossBound {
		slices.Sort(lossy)
		r.problems = append(r.problems, fmt.Sprintf("UDP loss %.1f%% over the bound %.0f%% (lost: %s)", 100*loss, 100*f.lossBound,
			strings.Join(lossy, ", ")))
	}
	for _, s := range w.streams {
		for _, fl := range s.failuresSince(start) {
			msg := fmt.Sprintf("stream %s broke at %s: %s", s.name, fl.at.Format("15:04:05"), fl.err)
			if s.viaVIP && w.failover != "" {
				r.excused = append(r.excused, msg+" (the VIP failed over from "+w.failover+")")
				continue
			}
			// Until the node is back and the stream answered again.
			if w.rebooted != "" && s.through(w.rebooted) && !fl.at.After(w.rebootedUntil) {
				r.excused = append(r.excused, msg+" ("+w.rebooted+" rebooted)")
				continue
			}
			if s.viaVIP {
				// A node the VIP failed over from is its rendezvous
				// choice again once back (docs/load-balancers.md): the
				// VIP returns, as late as that node's agent and its
				// peers agree, and what was held through the other
				// node breaks.
				if moves, back := w.vipMoves.cause(fl.at); back {
					r.excused = append(r.excused, msg+" ("+movesString(moves)+", back to where it had failed over from)")
					continue
				} else if len(moves) > 0 {
					msg += " (" + movesString(moves) + ")"
					for _, m := range moves {
						if !slices.Contains(r.moves, m) {
							r.moves = append(r.moves, m)
						}
					}
				}
			}
			r.problems = append(r.problems, msg)
		}
	}
	for _, c := range []func(context.Context, *harness) error{checkAddresses, checkNetworkEndpoints, checkResidue, checkMaps, checkSNAT, checkLogs, checkRepairs} {
		if err := c(ctx, h); err != nil {
			r.problems = append(r.problems, err.Error())
		}
	}
	if err := checkRestarts(ctx, h); err != nil {
		r.problems = append(r.problems, err.Error())
	}
	if err := w.checkMatrix(ctx); err != nil {
		r.problems = append(r.problems, err.Error())
	}
	return r
}

// checkAddresses fails when an address is held by two pods, cluster-wide.
func checkAddresses(ctx context.Context, h *harness) error {
	pods, err := h.cs.CoreV1().Pods("").List(ctx, metav1.ListOptions{})
	if err != nil {
		return err
	}
	holder := map[string]string{}
	var dup []string
	for _, p := range pods.Items {
		if p.Spec.HostNetwork {
			continue
		}
		for _, ip := range p.Status.PodIPs {
			if other, ok := holder[ip.IP]; ok {
				dup = append(dup, fmt.Sprintf("%s held by %s and %s/%s", ip.IP, other, p.Namespace, p.Name))
			}
			holder[ip.IP] = p.Namespace + "/" + p.Name
		}
	}
	if len(dup) > 0 {
		return fmt.Errorf("duplicate addresses: %s", strings.Join(dup, ", "))
	}
	return nil
}

// checkNetworkEndpoints fails when a NetworkEndpoint outlives its pod, a
// running pod with addresses has none, or one names other addresses
// than its pod's (after a minute to settle).
func checkNetworkEndpoints(ctx context.Context, h *harness) error {
	return until(ctx, time.Minute, "NetworkEndpoints matching the pods", func() error {
		pods, err := h.cs.CoreV1().Pods("").List(ctx, metav1.ListOptions{})
		if err != nil {
			return err
		}
		var neps lacev1.NetworkEndpointList
		if err := h.c.List(ctx, &neps); err != nil {
			return err
		}
		live := map[string]*corev1.Pod{}
		for i, p := range pods.Items {
			if !p.Spec.HostNetwork && len(p.Status.PodIPs) > 0 && p.DeletionTimestamp == nil {
				live[p.Namespace+"/"+p.Name] = &pods.Items[i]
			}
		}
		var leaked, missing, moved []string
		have := map[string]bool{}
		for _, ne := range neps.Items {
			key := ne.Namespace + "/" + ne.Name
			have[key] = true
			p, ok := live[key]
			if !ok || ne.Labels[lacev1.LabelPodUID] != string(p.UID) {
				leaked = append(leaked, key)
				continue
			}
			var addrs []string
			for _, a := range ne.Spec.Addresses {
				addrs = append(addrs, string(a))
			}
			ips := podIPs(p)
			slices.Sort(addrs)
			slices.Sort(ips)
			if !slices.Equal(addrs, ips) {
				moved = append(moved, fmt.Sprintf("%s names %v, its pod has %v", key, addrs, ips))
			}
		}
		for key := range live {
			if !have[key] {
				missing = append(missing, key)
			}
		}
		if len(leaked)+len(missing)+len(moved) > 0 {
			slices.Sort(leaked)
			slices.Sort(missing)
			return fmt.Errorf("NetworkEndpoints leaked %v, missing %v, other addresses %v", leaked, missing, moved)
		}
		return nil
	})
}

// settleWindow is how long the checks of what pods leave behind wait for
// it to go: the kubelet sends a deleted pod's CNI DEL when it gets to it,
// and on a loaded machine (the test tiers beside the chaos, or two labs)
// a burst's last DELs came 90 s after its pods were gone from the API. A
// leak stays; waiting longer costs time only when one is found.
const settleWindow = 3 * time.Minute

// checkResidue fails when a node holds veths, endpoint or port entries or
// checkpointed endpoints that its pods do not account for (or lacks
// some), once settleWindow has passed.
func checkResidue(ctx context.Context, h *harness) error {
	return until(ctx, settleWindow, "every node's state matching its pods", func() error {
		pods, err := h.cs.CoreV1().Pods("").List(ctx, metav1.ListOptions{})
		if err != nil {
			return err
		}
		want := lab.PodsResidue(pods.Items)
		for i := 1; i <= h.cfg.Nodes; i++ {
			node := h.cfg.NodeName(i)
			got, err := lab.NodeResidue(h.cfg, node)
			if err != nil {
				return err
			}
			if got != want[node] {
				return fmt.Errorf("node %s holds %+v, its pods need %+v", node, got, want[node])
			}
		}
		return nil
	})
}

// checkRestarts fails when a Lace container restarted more often than
// the faults made it. Besides the harness's kills, a controller exits
// when it loses its leader Lease (controller-runtime's design: another
// replica may lead), so one restart whose last words are that, ended
// while a fault took the API server from it (h.apiLoss), is the fault's;
// a second is a crash loop. The kubelet reports a restart made during an
// outage only once the API server is back, sometimes after the fault's
// own check: the count is awaited for a minute, and the excuse holds in
// whichever window it is seen.
func checkRestarts(ctx context.Context, h *harness) error {
	var excused map[string]string
	err := until(ctx, time.Minute, "Lace's restarts all caused by the faults", func() error {
		excused = map[string]string{}
		var problems []string
		for _, sel := range []string{agentSelector, controllerSelector} {
			pods, err := h.cs.CoreV1().Pods(lab.ReleaseNamespace).List(ctx, metav1.ListOptions{LabelSelector: sel})
			if err != nil {
				return err
			}
			for _, p := range pods.Items {
				restarts, last, why := 0, "", ""
				var ended time.Time
				for _, c := range p.Status.ContainerStatuses {
					restarts += int(c.RestartCount)
					if t := c.LastTerminationState.Terminated; t != nil {
						last, ended = strings.TrimSpace(t.Message), t.FinishedAt.Time
						lines := strings.Split(last, "\n")
						why = fmt.Sprintf(" (last exit %d, %s, at %s: %q)", t.ExitCode, t.Reason, ended.Format("15:04:05"), lines[len(lines)-1])
					}
				}
				uid := string(p.UID)
				h.mu.Lock()
				caused := h.restarts[uid]
				h.mu.Unlock()
				if sel == controllerSelector && restarts == caused+1 && strings.HasSuffix(last, leaseLost) && h.lostAPIAt(ended) {
					excused[uid] = fmt.Sprintf("%s on %s at %s", p.Name, p.Spec.NodeName, ended.Format("15:04:05"))
					continue
				}
				if restarts != caused {
					problems = append(problems, fmt.Sprintf("%s restarted %d times, %d by the faults%s", p.Name, restarts, caused, why))
				}
			}
		}
		if len(problems) > 0 {
			return fmt.Errorf("unexpected restarts: %s", strings.Join(problems, ", "))
		}
		return nil
	})
	h.mu.Lock()
	for uid, who := range excused {
		h.restarts[uid]++
		h.excused = append(h.excused, who)
	}
	h.mu.Unlock()
	return err
}

// leaseLost is the controller's last word when it exits on a lost Lease.
const leaseLost = "leader election lost"

// apiLossSlack is how long after a fault gave the API server back a
// controller may still exit on the Lease it lost then: its last renewal
// attempt times out after the outage ended.
const apiLossSlack = time.Minute

// window is a span of time a fault lasted.
type window struct{ from, to time.Time }

// lostAPIAt says whether t fell in a fault that took the API server from
// the controllers, or just after it.
func (h *harness) lostAPIAt(t time.Time) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	for _, w := range h.apiLoss {
		if !t.Before(w.from) && !t.After(w.to.Add(apiLossSlack)) {
			return true
		}
	}
	return false
}

// laceRestarts is every agent and controller pod's restart count, by UID.
func (h *harness) laceRestarts(ctx context.Context) (map[string]int, error) {
	out := map[string]int{}
	for _, sel := range []string{agentSelector, controllerSelector} {
		pods, err := h.cs.CoreV1().Pods(lab.ReleaseNamespace).List(ctx, metav1.ListOptions{LabelSelector: sel})
		if err != nil {
			return nil, err
		}
		for _, p := range pods.Items {
			for _, c := range p.Status.ContainerStatuses {
				out[string(p.UID)] += int(c.RestartCount)
			}
		}
	}
	return out, nil
}

// panicLine is how a Go program's crash begins.
var panicLine = regexp.MustCompile(`(^|[^a-z])(panic: |fatal error: |goroutine \d+ \[running\])`)

// checkLogs fails when a Lace container's log (every instance a node
// kept, crashed ones included) holds a panic.
func checkLogs(_ context.Context, h *harness) error {
	var found []string
	files := 0
	for i := 1; i <= h.cfg.Nodes; i++ {
		logs, _ := filepath.Glob(filepath.Join(h.cfg.NodeRoot(h.cfg.NodeName(i)), "var/log/pods", lab.ReleaseNamespace+"_lace-*", "*", "*.log"))
		for _, l := range logs {
			files++
			if line, err := grepFile(l, panicLine); err != nil {
				return err
			} else if line != "" {
				found = append(found, fmt.Sprintf("%s: %s", strings.TrimPrefix(l, h.cfg.StateDir()), line))
			}
		}
	}
	if files == 0 {
		return errors.New("no log of a Lace container found on any node")
	}
	if len(found) > 0 {
		return fmt.Errorf("panics logged: %s", strings.Join(found, "; "))
	}
	return nil
}

func grepFile(path string, re *regexp.Regexp) (string, error) {
	f, err := os.Open(path)
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return "", nil // rotated away meanwhile
		}
		return "", err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		if re.MatchString(sc.Text()) {
			return sc.Text(), nil
		}
	}
	return "", sc.Err()
}

// agentMetricsPort is the chart's agent.metricsPort.
const agentMetricsPort = 9962

// checkRepairs fails when an agent repaired a map entry that differed
// from what it wrote from the model: only the harness's faults ran, and
// none of them writes a map.
func checkRepairs(ctx context.Context, h *harness) error {
	fabric := netutil.Path(h.cfg.NetNS("fabric"))
	hc := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{
		DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
			return netutil.DialContext(ctx, fabric, network, addr)
		}}}
	var problems []string
	for i := 1; i <= h.cfg.Nodes; i++ {
		v4, _ := lab.NodeUnderlay(i)
		var n float64
		err := until(ctx, 30*time.Second, "metrics of "+h.cfg.NodeName(i), func() (err error) {
			n, err = metricSum(ctx, hc, "http://"+netip.AddrPortFrom(v4, agentMetricsPort).String()+"/metrics", dpmetrics.TableRepairs)
			return err
		})
		if err != nil {
			return err
		}
		if n > 0 {
			problems = append(problems, fmt.Sprintf("%s repaired %g entries", h.cfg.NodeName(i), n))
		}
	}
	if len(problems) > 0 {
		return fmt.Errorf("maps differed from what the agents wrote: %s", strings.Join(problems, ", "))
	}
	return nil
}

func metricSum(ctx context.Context, hc *http.Client, url, name string) (float64, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return 0, err
	}
	resp, err := hc.Do(req)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return 0, fmt.Errorf("%s: %s", url, resp.Status)
	}
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return 0, err
	}
	var sum float64
	for _, l := range strings.Split(string(b), "\n") {
		if !strings.HasPrefix(l, name) || (len(l) > len(name) && l[len(name)] != '{' && l[len(name)] != ' ') {
			continue
		}
		v, err := strconv.ParseFloat(l[strings.LastIndexByte(l, ' ')+1:], 64)
		if err != nil {
			return 0, fmt.Errorf("metric line %q: %w", l, err)
		}
		sum += v
	}
	return sum, nil
}

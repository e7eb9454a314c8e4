package main

import (
	"bufio"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/base32"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"text/tabwriter"
	"time"

	"github.com/cilium/ebpf"
	"golang.org/x/sys/unix"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/utils/ptr"

	lacev1 "github.com/lace-cni/lace/api/v1alpha1"
	"github.com/lace-cni/lace/internal/netutil"
	"github.com/lace-cni/lace/lab"
)

// svcOptions sizes the services benchmark.
type svcOptions struct {
	// sizes are the service counts, each programmed from nothing.
	sizes []int
	// endpoints per service (one EndpointSlice each).
	endpoints int
	// changes is how many single-endpoint changes are timed per size.
	changes int
	// changeTime bounds the time spent on changes per size.
	changeTime time.Duration
	// conns is how many new TCP connections are timed per path and size.
	conns int
	// loadedChanges is how many changes are timed back to back, Lace's
	// alone, while kube-proxy syncs every one.
	loadedChanges int
	// rest is how long the CPU and allocation at rest are measured for,
	// after the changes, per size.
	rest time.Duration
	// dur is the length of each request/response round.
	dur time.Duration
	// kubeProxy is the kube-proxy binary of the peer; "" runs no peer.
	kubeProxy string
	// namespaces the services are spread over (round robin).
	namespaces int
}

// workNS is the namespace of the run's i-th service: the chart's
// per-namespace share of the service maps (a quarter, services.md) would
// refuse one namespace's 10,000 Services x 10 endpoints, and a cluster
// that size has many namespaces. kube-proxy has no such bound.
func (o svcOptions) workNS(i int) string { return fmt.Sprintf("%s-%d", svcNS, i%max(o.namespaces, 1)) }

// allNS are the run's namespaces: the latency paths' pods, then the
// services'.
func (o svcOptions) allNS() []string {
	out := []string{svcNS}
	for i := range max(o.namespaces, 1) {
		out = append(out, o.workNS(i))
	}
	return out
}

// The nodes of the run: Lace serves alone on laceNode; kube-proxy runs on
// peerNode beside Lace's agent, whose service path cannot be turned off
// there (the peer's traffic comes from the node's own sockets, which Lace
// only translates for processes of the node's cgroup: see benchServices).
const (
	laceNode = "n1"
	peerNode = "n2"
	svcNS    = "lace-bench-svc"
	// kube-proxy's metrics and healthz ports inside the peer node.
	kpMetrics = "127.0.0.1:10349"
	kpHealthz = "127.0.0.1:10356"
)

// benchServices measures ClusterIP services at scale on a lab beside
// kube-proxy in nftables mode run in a node's namespaces against the same
// API server, in the same run:
//
//   - programming: N selector-less services with an EndpointSlice of E ready
//     endpoints each, written straight to the API (no pods, as upstream's
//     scale tests do), from nothing to every one served, on the node's data
//     plane itself (Lace: its pinned BPF maps; kube-proxy: its nftables
//     chains); then one endpoint change to the data plane serving it,
//     p50/p99; the CPU time each process spent on both;
//   - agent RSS at each size;
//   - first-packet RTT through a VIP (a new TCP connection: connect() from
//     SYN to SYN-ACK) at each size;
//   - request/response latency pod -> VIP -> pod on another node beside
//     pod -> pod direct.
//
// The peer's client is a socket of peerNode's own network namespace: Lace's
// agent keeps translating pod traffic on every node (its service path has no
// off switch), and a pod's packets are translated on its veth before
// netfilter sees them, while a socket of the node's namespace opened by a
// process outside the node's cgroup is translated by nftables alone. For
// that socket's DNAT, the peer node gets a route to the service range (see
// startKubeProxy).
func benchServices(ctx context.Context, name string, o svcOptions) error {
	cs, c, err := fastClient(name)
	if err != nil {
		return err
	}
	// A namespace left by an earlier run on the same lab is gone first.
	for _, ns := range o.allNS() {
		if err := freshNamespace(ctx, cs, ns); err != nil {
			return err
		}
	}
	defer func() {
		for _, ns := range o.allNS() {
			_ = cs.CoreV1().Namespaces().Delete(context.Background(), ns, metav1.DeleteOptions{})
		}
	}()

	var kp *kubeProxy
	if o.kubeProxy != "" {
		if kp, err = startKubeProxy(ctx, c, peerNode, o.kubeProxy); err != nil {
			return fmt.Errorf("kube-proxy: %w", err)
		}
		defer kp.stop()
	}
	laceMaps := map[string]*svcMaps{}
	for _, n := range []string{laceNode, peerNode} {
		m, err := openSvcMaps(c, n)
		if err != nil {
			return err
		}
		defer m.close()
		laceMaps[n] = m
	}

	// The pods the latency paths run between, and the service in front of
	// the server (port 80 for request/response, 81 for new connections).
	pp, err := startSvcPods(ctx, cs, c)
	if err != nil {
		return err
	}
	vip, err := rrService(ctx, cs)
	if err != nil {
		return err
	}
	if err := waitVIP(ctx, laceMaps[peerNode], kp, vip, pp); err != nil {
		return err
	}
	peerNS := netutil.Path(c.NetNS(peerNode))
	stopSrv, err := acceptAndClose(pp.srvNS, ":5202")
	if err != nil {
		return err
	}
	defer stopSrv()

	var progs []progResult
	var rtts []rttResult
	for _, n := range o.sizes {
		p, err := measureProgramming(ctx, cs, c, laceMaps, kp, n, o)
		progs = append(progs, p)
		if err != nil {
			printProgramming(progs, o)
			return err
		}
		r := rttResult{n: n}
		paths := []connPath{
			{"Lace: pod -> VIP", pp.cliNS, netip.AddrPortFrom(vip, 81)},
			{"pod -> pod direct", pp.cliNS, netip.AddrPortFrom(pp.srvIP, 5202)},
		}
		if kp != nil {
			paths = append(paths,
				connPath{"kube-proxy: node -> VIP", peerNS, netip.AddrPortFrom(vip, 81)},
				connPath{"node -> pod direct", peerNS, netip.AddrPortFrom(pp.srvIP, 5202)})
		}
		if r.lat, err = connectLatency(ctx, paths, o.conns); err != nil {
			printProgramming(progs, o)
			return fmt.Errorf("first packet at %d services: %w", n, err)
		}
		rtts = append(rtts, r)
		// Each size starts from nothing; the last one's services stay for
		// the request/response run.
		if n != o.sizes[len(o.sizes)-1] {
			if err := deleteServices(ctx, cs, laceMaps, kp, p.vips, o); err != nil {
				return err
			}
		}
	}
	printProgramming(progs, o)
	printRTT(rtts, kp != nil, o.conns)

	rr := []rrPath{
		{"Lace: pod -> VIP -> pod", pp.cliNS, netip.AddrPortFrom(vip, 80)},
		{"pod -> pod direct", pp.cliNS, netip.AddrPortFrom(pp.srvIP, 5201)},
	}
	if kp != nil {
		rr = append(rr,
			rrPath{"kube-proxy: node -> VIP -> pod", peerNS, netip.AddrPortFrom(vip, 80)},
			rrPath{"node -> pod direct", peerNS, netip.AddrPortFrom(pp.srvIP, 5201)})
	}
	return requestResponseVIP(ctx, pp.srvNS, rr, o.dur, o.sizes[len(o.sizes)-1])
}

// fastClient is a client of the lab without client-side throttling: the
// scale runs write tens of thousands of objects.
func fastClient(name string) (kubernetes.Interface, lab.Config, error) {
	c := lab.DefaultConfig()
	c.Name = name
	cfg, err := clientcmd.BuildConfigFromFlags("", c.Kubeconfig())
	if err != nil {
		return nil, c, err
	}
	cfg.QPS, cfg.Burst = 5000, 10000
	cfg.ContentType = "application/vnd.kubernetes.protobuf"
	cfg.AcceptContentTypes = "application/vnd.kubernetes.protobuf,application/json"
	cs, err := kubernetes.NewForConfig(cfg)
	return cs, c, err
}

// svcPods are the client (peerNode) and server (laceNode) pods of the
// latency paths.
type svcPods struct {
	cliNS, srvNS string
	srvIP        netip.Addr
}

func startSvcPods(ctx context.Context, cs kubernetes.Interface, c lab.Config) (svcPods, error) {
	pods, err := runPods(ctx, cs, c, svcNS, map[string]string{"svc-srv": laceNode, "svc-cli": peerNode})
	if err != nil {
		return svcPods{}, err
	}
	return svcPods{cliNS: pods["svc-cli"].ns, srvNS: pods["svc-srv"].ns, srvIP: pods["svc-srv"].ip}, nil
}

// rrService is the Service in front of the server pod; it returns its VIP.
func rrService(ctx context.Context, cs kubernetes.Interface) (netip.Addr, error) {
	svc := &corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: "svc-srv"}, Spec: corev1.ServiceSpec{
		Selector: map[string]string{"app": "svc-srv"},
		Ports: []corev1.ServicePort{
			{Name: "rr", Port: 80, TargetPort: intstr.FromInt32(5201)},
			{Name: "syn", Port: 81, TargetPort: intstr.FromInt32(5202)},
		}}}
	got, err := cs.CoreV1().Services(svcNS).Create(ctx, svc, metav1.CreateOptions{})
	if err != nil {
		return netip.Addr{}, err
	}
	return netip.ParseAddr(got.Spec.ClusterIP)
}

// waitVIP waits until the client's node serves the server's VIP, in both
// data planes.
func waitVIP(ctx context.Context, m *svcMaps, kp *kubeProxy, vip netip.Addr, pp svcPods) error {
	deadline := time.Now().Add(time.Minute)
	for time.Now().Before(deadline) {
		ok := true
		for _, port := range []uint16{80, 81} {
			bs, err := m.backends(vip, port)
			if err != nil || len(bs) != 1 || bs[0].Addr() != pp.srvIP {
				ok = false
			}
		}
		if ok && kp != nil {
			els, err := kp.serviceIPs(ctx)
			ok = err == nil && els[netip.AddrPortFrom(vip, 80)] && els[netip.AddrPortFrom(vip, 81)]
		}
		if ok {
			return nil
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
	}
	return fmt.Errorf("the VIP %s of svc-srv is not served after a minute", vip)
}

// progResult is one size's programming figures.
type progResult struct {
	n       int
	vips    map[netip.Addr]bool
	create  time.Duration // first object written to the last
	objects int
	// From the last (and first) object written to the data plane serving
	// them all, per data plane; negative: not reached.
	lace, laceFirst, lace2, lace2First, kp, kpFirst time.Duration
	// From the last object written to the controller's binding annotation
	// on every service (waited for before the changes are timed: each is
	// a write of the Service); negative: not reached.
	bound time.Duration
	// One endpoint change to the data plane serving it.
	laceChange, kpChange []time.Duration
	// Lace's changes timed back to back while kube-proxy syncs each, how
	// long that took and the CPU kube-proxy spent meanwhile.
	laceLoaded             []time.Duration
	loadedFor, loadedKPCPU time.Duration
	// At rest after the changes: CPU per process, for how long, and what
	// the agent on laceNode allocated.
	restCPU   map[string]time.Duration
	restFor   time.Duration
	restAlloc float64
	// RSS after programming and after the rest, and the part of each
	// that maps files (the binary), bytes.
	rss, rssFile, restRSS, restRSSFile map[string]int64
	// CPU time used by each process from the first object written to
	// every service served, and over the changes.
	progCPU, changeCPU map[string]time.Duration
	// Time to read every service and backend back from laceNode's maps,
	// and how many backends that was.
	readBack  time.Duration
	readBackN int
	// changes is how many changes were made.
	changes int
	// The agent's (laceNode) Go heap in use after programming, and what it
	// allocated per change (go_memstats).
	heap, allocPerChange float64
	// Mean sync durations during the changes (the agent's whole-node
	// sync, kube-proxy's sync of its rules).
	laceSync, laceReconcile, kpSync time.Duration
	notes                           []string
}

// measureProgramming writes n services and their slices and times every
// data plane to serve them, then times single endpoint changes.
func measureProgramming(ctx context.Context, cs kubernetes.Interface, c lab.Config, maps map[string]*svcMaps,
	kp *kubeProxy, n int, o svcOptions) (progResult, error) {
	r := progResult{n: n, lace: -1, laceFirst: -1, lace2: -1, lace2First: -1, kp: -1, kpFirst: -1,
		vips: map[netip.Addr]bool{}}
	prefix := fmt.Sprintf("s%d", n)
	type made struct {
		ns, svc string
		vip     netip.Addr
		slice   *discoveryv1.EndpointSlice
	}
	all := make([]made, n)
	work := make(chan int)
	errc := make(chan error, 1)
	var mu sync.Mutex
	var first, last time.Time
	procs := benchProcs(c, kp)
	cpu0 := cpuOf(procs)
	var wg sync.WaitGroup
	for range 64 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range work {
				name := fmt.Sprintf("%s-%05d", prefix, i)
				t := time.Now()
				mu.Lock()
				if first.IsZero() || t.Before(first) {
					first = t
				}
				mu.Unlock()
				ns := o.workNS(i)
				svc, err := cs.CoreV1().Services(ns).Create(ctx, &corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: name},
					Spec: corev1.ServiceSpec{Ports: []corev1.ServicePort{{Name: "http", Port: 80, TargetPort: intstr.FromInt32(8080)}}}},
					metav1.CreateOptions{})
				var sl *discoveryv1.EndpointSlice
				if err == nil {
					sl, err = cs.DiscoveryV1().EndpointSlices(ns).Create(ctx, benchSlice(name, i, o.endpoints), metav1.CreateOptions{})
				}
				if err != nil {
					select {
					case errc <- err:
					default:
					}
					continue
				}
				done := time.Now()
				mu.Lock()
				if done.After(last) {
					last = done
				}
				mu.Unlock()
				all[i] = made{ns: ns, svc: name, vip: netip.MustParseAddr(svc.Spec.ClusterIP), slice: sl}
			}
		}()
	}
	fmt.Fprintf(os.Stderr, "services: writing %d services and %d EndpointSlices (%d endpoints each)\n", n, n, o.endpoints)
feed:
	for i := range n {
		select {
		case work <- i:
		case err := <-errc:
			close(work)
			wg.Wait()
			return r, fmt.Errorf("write services: %w", err)
		case <-ctx.Done():
			break feed
		}
	}
	close(work)
	wg.Wait()
	select {
	case err := <-errc:
		return r, fmt.Errorf("write services: %w", err)
	default:
	}
	if err := ctx.Err(); err != nil {
		return r, err
	}
	r.create, r.objects = last.Sub(first), 2*n
	for _, m := range all {
		r.vips[m.vip] = true
	}
	fmt.Fprintf(os.Stderr, "services: %d objects written in %s; waiting for the data planes\n", 2*n, r.create.Round(time.Millisecond))

	// Every data plane is watched from here on at once.
	timeout := max(2*time.Minute, time.Duration(n)*20*time.Millisecond)
	var pw sync.WaitGroup
	watch := func(done func() (bool, error), at *time.Duration, atFirst *time.Duration, what string) {
		pw.Add(1)
		go func() {
			defer pw.Done()
			deadline := time.Now().Add(timeout)
			for time.Now().Before(deadline) && ctx.Err() == nil {
				ok, err := done()
				if err == nil && ok {
					now := time.Now()
					*at, *atFirst = now.Sub(last), now.Sub(first)
					return
				}
				time.Sleep(20 * time.Millisecond)
			}
			mu.Lock()
			r.notes = append(r.notes, fmt.Sprintf("%s: not every service served after %s", what, timeout))
			mu.Unlock()
		}()
	}
	// Each watcher keeps the services its data plane does not serve yet
	// and asks about them in turn, up to the first one still missing: a
	// poll costs what got done since the last one, plus one question (the
	// watchers must not take the CPU the data planes need).
	laceDone := func(m *svcMaps) func() (bool, error) {
		pending := make([]netip.Addr, 0, n)
		for _, a := range all {
			pending = append(pending, a.vip)
		}
		return func() (bool, error) {
			for len(pending) > 0 {
				if got, err := m.count(pending[0], 80); err != nil || got != o.endpoints {
					return false, nil
				}
				pending = pending[1:]
			}
			return true, nil
		}
	}
	watch(laceDone(maps[laceNode]), &r.lace, &r.laceFirst, "Lace "+laceNode)
	watch(laceDone(maps[peerNode]), &r.lace2, &r.lace2First, "Lace "+peerNode)
	if kp != nil {
		// kube-proxy makes a service's chain when it has endpoints, in the
		// transaction that fills it and maps the VIP to it.
		pending := make([]string, 0, n)
		for _, m := range all {
			pending = append(pending, kpServiceChain(m.ns, m.svc, "tcp", "http"))
		}
		watch(func() (bool, error) {
			for len(pending) > 0 {
				if ok, err := kp.chains.exists(pending[0]); err != nil || !ok {
					return false, err
				}
				pending = pending[1:]
			}
			return true, nil
		}, &r.kp, &r.kpFirst, "kube-proxy "+peerNode)
	}
	pw.Wait()
	r.bound = waitBound(ctx, cs, prefix+"-", n, last, timeout)
	r.progCPU = cpuDelta(cpu0, cpuOf(procs))
	r.rss, r.rssFile = rssOf(procs), fileRSSOf(procs)
	laceNS, peerNS := netutil.Path(c.NetNS(laceNode)), netutil.Path(c.NetNS(peerNode))
	r.heap, _ = promValue(ctx, laceNS, "127.0.0.1:9962", "go_memstats_heap_inuse_bytes")
	// What every sync of the agent reads back from the maps before
	// writing (ApplyServices: every service, then each backend by itself).
	t := time.Now()
	if nb, err := maps[laceNode].readAll(); err == nil {
		r.readBack, r.readBackN = time.Since(t), nb
	}

	// Single endpoint changes: the first endpoint of one service moves to
	// a new address; both data planes are watched for that service. They
	// start at least 1.1 s apart so kube-proxy's rate limit (min sync
	// period 1 s, burst 2) never delays one.
	const (
		laceSyncM      = "lace_agent_sync_duration_seconds"
		laceReconcileM = `controller_runtime_reconcile_time_seconds{controller="node-dataplane"}`
		kpSyncM        = `kubeproxy_sync_proxy_rules_duration_seconds{ip_family="IPv4"}`
	)
	laceSync0, _ := promSum(ctx, laceNS, "127.0.0.1:9962", laceSyncM)
	laceRec0, _ := promSum(ctx, laceNS, "127.0.0.1:9962", laceReconcileM)
	var kpSync0 [2]float64
	if kp != nil {
		kpSync0, _ = promSum(ctx, peerNS, kpMetrics, kpSyncM)
	}
	fmt.Fprintf(os.Stderr, "services: timing %d endpoint changes\n", o.changes)
	phase := time.Now()
	cpuC := cpuOf(procs)
	alloc0, _ := promValue(ctx, laceNS, "127.0.0.1:9962", "go_memstats_alloc_bytes_total")
	// change makes the k-th change and times Lace on it, and kube-proxy too
	// when timeKP; it returns Lace's time (negative: not served).
	change := func(k int, timeKP bool) (time.Duration, error) {
		start := time.Now()
		i := (k*7919 + 13) % n
		m := all[i]
		old := m.slice.Endpoints[0].Addresses[0]
		now := netip.AddrFrom4([4]byte{10, 170 + byte(k>>16), byte(k >> 8), byte(k)}).String()
		oldAP, nowAP := netip.MustParseAddrPort(old+":8080"), netip.MustParseAddrPort(now+":8080")
		var lt, kt time.Duration = -1, -1
		var cw sync.WaitGroup
		cw.Add(1)
		go func() {
			defer cw.Done()
			lt = waitUntil(ctx, start, 30*time.Second, time.Millisecond, func() bool {
				bs, err := maps[laceNode].backends(m.vip, 80)
				return err == nil && contains(bs, nowAP) && !contains(bs, oldAP)
			})
		}()
		if timeKP {
			cw.Add(1)
			go func() {
				defer cw.Done()
				// The new endpoint's chain is made in the transaction that
				// points the service's chain to it.
				ep := kpEndpointChain(m.ns, m.svc, "tcp", "http", nowAP)
				kt = waitUntil(ctx, start, 30*time.Second, time.Millisecond, func() bool {
					ok, err := kp.chains.exists(ep)
					return err == nil && ok
				})
			}()
		}
		patch := fmt.Sprintf(`[{"op":"replace","path":"/endpoints/0/addresses/0","value":%q},`+
			`{"op":"add","path":"/metadata/annotations","value":{%q:%q}}]`,
			now, corev1.EndpointsLastChangeTriggerTime, start.UTC().Format(time.RFC3339Nano))
		sl, err := cs.DiscoveryV1().EndpointSlices(m.ns).Patch(ctx, m.slice.Name, types.JSONPatchType, []byte(patch), metav1.PatchOptions{})
		if err != nil {
			return -1, fmt.Errorf("change endpoint: %w", err)
		}
		all[i].slice = sl
		cw.Wait()
		if lt < 0 {
			r.notes = append(r.notes, fmt.Sprintf("Lace: change %d not served after 30s", k))
		} else if lt > 50*time.Millisecond {
			// The slow ones, to line up with the agent's log.
			fmt.Fprintf(os.Stderr, "services: change %d at %s (%s into the phase) took %s\n", k,
				start.UTC().Format("15:04:05.000"), start.Sub(phase).Round(time.Millisecond), lt.Round(100*time.Microsecond))
		}
		if timeKP {
			if kt < 0 {
				r.notes = append(r.notes, fmt.Sprintf("kube-proxy: change %d not served after 30s", k))
			} else {
				r.kpChange = append(r.kpChange, kt)
			}
		}
		return lt, nil
	}
	for k := range o.changes {
		if time.Since(phase) > o.changeTime {
			r.notes = append(r.notes, fmt.Sprintf("%d of %d changes timed: the phase is limited to %s", k, o.changes, o.changeTime))
			break
		}
		start := time.Now()
		r.changes++
		lt, err := change(k, kp != nil)
		if err != nil {
			return r, err
		}
		if lt >= 0 {
			r.laceChange = append(r.laceChange, lt)
		}
		if rest := 1100*time.Millisecond - time.Since(start); rest > 0 && kp != nil {
			time.Sleep(rest)
		}
	}
	r.changeCPU = cpuDelta(cpuC, cpuOf(procs))
	if a, err := promValue(ctx, laceNS, "127.0.0.1:9962", "go_memstats_alloc_bytes_total"); err == nil && alloc0 > 0 && r.changes > 0 {
		r.allocPerChange = (a - alloc0) / float64(r.changes)
	}
	mean := func(nsPath, addr, name string, before [2]float64) time.Duration {
		s, err := promSum(ctx, nsPath, addr, name)
		if err != nil || s[1] <= before[1] {
			return 0
		}
		return time.Duration((s[0] - before[0]) / (s[1] - before[1]) * 1e9)
	}
	r.laceSync = mean(laceNS, "127.0.0.1:9962", laceSyncM, laceSync0)
	r.laceReconcile = mean(laceNS, "127.0.0.1:9962", laceReconcileM, laceRec0)
	if kp != nil {
		r.kpSync = mean(peerNS, kpMetrics, kpSyncM, kpSync0)
	}
	if kp != nil && o.loadedChanges > 0 {
		if err := timeLoaded(ctx, &r, procs, change, o); err != nil {
			return r, err
		}
	}
	if o.rest > 0 {
		fmt.Fprintf(os.Stderr, "services: at rest for %s\n", o.rest)
		cpu0, t := cpuOf(procs), time.Now()
		a0, _ := promValue(ctx, laceNS, "127.0.0.1:9962", "go_memstats_alloc_bytes_total")
		select {
		case <-time.After(o.rest):
		case <-ctx.Done():
			return r, ctx.Err()
		}
		r.restCPU, r.restFor = cpuDelta(cpu0, cpuOf(procs)), time.Since(t)
		r.restRSS, r.restRSSFile = rssOf(procs), fileRSSOf(procs)
		if a1, err := promValue(ctx, laceNS, "127.0.0.1:9962", "go_memstats_alloc_bytes_total"); err == nil && a0 > 0 {
			r.restAlloc = a1 - a0
		}
	}
	return r, nil
}

// timeLoaded times the same changes back to back, Lace's alone, while
// kube-proxy syncs every one of them on the same two CPUs: the spaced
// changes leave the machine idle between kube-proxy's syncs, and its own
// figures come from those (a change behind a stream waits for the sync
// under way, which is not kube-proxy's latency).
func timeLoaded(ctx context.Context, r *progResult, procs map[string]int, change func(int, bool) (time.Duration, error), o svcOptions) error {
	fmt.Fprintf(os.Stderr, "services: timing %d endpoint changes back to back beside kube-proxy\n", o.loadedChanges)
	cpuL, loaded := cpuOf(procs), time.Now()
	for k := range o.loadedChanges {
		if time.Since(loaded) > o.changeTime {
			r.notes = append(r.notes, fmt.Sprintf("%d of %d back-to-back changes timed: the phase is limited to %s", k, o.loadedChanges, o.changeTime))
			break
		}
		lt, err := change(o.changes+k, false)
		if err != nil {
			return err
		}
		if lt >= 0 {
			r.laceLoaded = append(r.laceLoaded, lt)
		}
	}
	r.loadedFor = time.Since(loaded)
	r.loadedKPCPU = cpuDelta(cpuL, cpuOf(procs))["kube-proxy"]
	return nil
}

// waitBound waits until the controller has annotated each of the run's n
// services (named prefix...) with its network, and returns how long after
// last that was (negative: not within timeout). The changes are timed
// after it: each annotation is a write of a Service, which every data
// plane watches.
func waitBound(ctx context.Context, cs kubernetes.Interface, prefix string, n int, last time.Time, timeout time.Duration) time.Duration {
	for deadline := time.Now().Add(timeout); time.Now().Before(deadline) && ctx.Err() == nil; {
		// From the API server's watch cache (resourceVersion 0): a poll
		// must not cost the CPU the others need.
		l, err := cs.CoreV1().Services("").List(ctx, metav1.ListOptions{ResourceVersion: "0"})
		if err == nil {
			bound := 0
			for _, s := range l.Items {
				if strings.HasPrefix(s.Name, prefix) && s.Annotations[lacev1.AnnotationServiceNetwork] != "" {
					bound++
				}
			}
			if bound >= n {
				return time.Since(last)
			}
		}
		time.Sleep(time.Second)
	}
	return -1
}

// benchSlice is the EndpointSlice of service name (the i-th of its run):
// e ready endpoints with addresses of their own, port 8080.
func benchSlice(name string, i, e int) *discoveryv1.EndpointSlice {
	sl := &discoveryv1.EndpointSlice{
		ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{
			discoveryv1.LabelServiceName: name, discoveryv1.LabelManagedBy: "bench.lace-cni.io"}},
		AddressType: discoveryv1.AddressTypeIPv4,
		Ports:       []discoveryv1.EndpointPort{{Name: ptr.To("http"), Port: ptr.To[int32](8080), Protocol: ptr.To(corev1.ProtocolTCP)}},
	}
	for j := range e {
		idx := i*e + j + 1
		a := netip.AddrFrom4([4]byte{10, 160 + byte(idx>>16), byte(idx >> 8), byte(idx)})
		sl.Endpoints = append(sl.Endpoints, discoveryv1.Endpoint{Addresses: []string{a.String()},
			Conditions: discoveryv1.EndpointConditions{Ready: ptr.To(true), Serving: ptr.To(true), Terminating: ptr.To(false)}})
	}
	return sl
}

// deleteServices removes the run's services and slices and waits until no
// data plane serves them any more.
func deleteServices(ctx context.Context, cs kubernetes.Interface, maps map[string]*svcMaps, kp *kubeProxy, vips map[netip.Addr]bool,
	o svcOptions) error {
	fmt.Fprintf(os.Stderr, "services: deleting %d services\n", len(vips))
	sel := metav1.ListOptions{LabelSelector: discoveryv1.LabelManagedBy + "=bench.lace-cni.io"}
	type svcName struct{ ns, name string }
	work := make(chan svcName)
	var wg sync.WaitGroup
	for range 64 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for n := range work {
				_ = cs.CoreV1().Services(n.ns).Delete(ctx, n.name, metav1.DeleteOptions{})
			}
		}()
	}
	var err error
	for _, ns := range o.allNS()[1:] {
		if err = cs.DiscoveryV1().EndpointSlices(ns).DeleteCollection(ctx, metav1.DeleteOptions{}, sel); err != nil {
			break
		}
		var svcs *corev1.ServiceList
		if svcs, err = cs.CoreV1().Services(ns).List(ctx, metav1.ListOptions{}); err != nil {
			break
		}
		for _, s := range svcs.Items {
			work <- svcName{ns, s.Name}
		}
	}
	close(work)
	wg.Wait()
	if err != nil {
		return err
	}
	deadline := time.Now().Add(5 * time.Minute)
	for time.Now().Before(deadline) {
		left := 0
		for _, m := range maps {
			n, err := m.countServed(vips, -1)
			if err != nil {
				return err
			}
			left += n
		}
		if kp != nil {
			els, err := kp.serviceIPs(ctx)
			if err != nil {
				return err
			}
			for ap := range els {
				if vips[ap.Addr()] {
					left++
				}
			}
		}
		if left == 0 {
			return nil
		}
		time.Sleep(time.Second)
	}
	return errors.New("deleted services still served after 5 minutes")
}

// waitUntil polls ok every step until it holds, and returns the time from
// start; -1 if it did not within timeout.
func waitUntil(ctx context.Context, start time.Time, timeout, step time.Duration, ok func() bool) time.Duration {
	for time.Since(start) < timeout && ctx.Err() == nil {
		if ok() {
			return time.Since(start)
		}
		time.Sleep(step)
	}
	return -1
}

func contains(bs []netip.AddrPort, b netip.AddrPort) bool {
	for _, x := range bs {
		if x == b {
			return true
		}
	}
	return false
}

// svcMaps reads a node's service maps (lace_services, lace_backends)
// straight from their pins: polling through the datapath package would read
// every backend of every service each time.
type svcMaps struct{ svcs, bes *ebpf.Map }

func openSvcMaps(c lab.Config, node string) (*svcMaps, error) {
	dir := filepath.Join(c.NodeRoot(node), "sys/fs/bpf/lace")
	s, err := ebpf.LoadPinnedMap(filepath.Join(dir, "lace_services"), &ebpf.LoadPinOptions{ReadOnly: true})
	if err != nil {
		return nil, fmt.Errorf("services map of %s: %w", node, err)
	}
	b, err := ebpf.LoadPinnedMap(filepath.Join(dir, "lace_backends"), &ebpf.LoadPinOptions{ReadOnly: true})
	if err != nil {
		s.Close()
		return nil, fmt.Errorf("backends map of %s: %w", node, err)
	}
	return &svcMaps{s, b}, nil
}

func (m *svcMaps) close() { m.svcs.Close(); m.bes.Close() }

// The layouts of lace.h's svc_key, svc_val, backend_key, backend_val.
type (
	svcKey struct {
		Family, Proto uint8
		Port          uint16 // network order
		VIP           [16]byte
	}
	svcVal struct {
		ID, NetID    uint32
		Count, Flags uint16
		Affinity     uint32
	}
	backendKey struct{ ID, Index uint32 }
	backendVal struct {
		Addr      [16]byte
		Port, Pad uint16 // network order
	}
)

func htons(v uint16) uint16 { return v<<8 | v>>8 }

func v4Key(vip netip.Addr, port uint16) svcKey {
	k := svcKey{Family: 4, Proto: 6, Port: htons(port)}
	a := vip.As4()
	copy(k.VIP[:], a[:])
	return k
}

// countServed counts the TCP port-80 services of vips that have want
// backends (want < 0: any entry at all).
func (m *svcMaps) countServed(vips map[netip.Addr]bool, want int) (int, error) {
	var k svcKey
	var v svcVal
	n := 0
	it := m.svcs.Iterate()
	for it.Next(&k, &v) {
		if k.Family != 4 || htons(k.Port) != 80 || !vips[netip.AddrFrom4([4]byte(k.VIP[:4]))] {
			continue
		}
		if want < 0 || int(v.Count) == want {
			n++
		}
	}
	return n, it.Err()
}

// readAll reads every service and each of its backends, one lookup each,
// as datapath.Services does; it returns how many backends it read.
func (m *svcMaps) readAll() (int, error) {
	var k svcKey
	var v svcVal
	var b backendVal
	n := 0
	it := m.svcs.Iterate()
	for it.Next(&k, &v) {
		for i := range uint32(v.Count) {
			if err := m.bes.Lookup(backendKey{v.ID, i}, &b); err != nil {
				return n, err
			}
			n++
		}
	}
	return n, it.Err()
}

// count returns the backend count of the TCP service vip:port.
func (m *svcMaps) count(vip netip.Addr, port uint16) (int, error) {
	var v svcVal
	if err := m.svcs.Lookup(v4Key(vip, port), &v); err != nil {
		return 0, err
	}
	return int(v.Count), nil
}

// backends returns the backends of the TCP service vip:port.
func (m *svcMaps) backends(vip netip.Addr, port uint16) ([]netip.AddrPort, error) {
	var v svcVal
	if err := m.svcs.Lookup(v4Key(vip, port), &v); err != nil {
		return nil, err
	}
	out := make([]netip.AddrPort, 0, v.Count)
	for i := range uint32(v.Count) {
		var b backendVal
		if err := m.bes.Lookup(backendKey{v.ID, i}, &b); err != nil {
			return nil, err
		}
		out = append(out, netip.AddrPortFrom(netip.AddrFrom4([4]byte(b.Addr[:4])), htons(b.Port)))
	}
	return out, nil
}

// kubeProxy is the peer: kube-proxy in nftables mode inside a lab node's
// network, mount and UTS namespaces (the node's own /run, so its
// xtables lock is the node's), with a directory of its own.
type kubeProxy struct {
	chains           *nftChains
	node, netns, dir string
	cmd              *exec.Cmd
	done             chan error
	svcRange         netip.Prefix
}

// startKubeProxy runs kube-proxy in node's namespaces; extra are more of
// its flags.
func startKubeProxy(ctx context.Context, c lab.Config, node, bin string, extra ...string) (*kubeProxy, error) {
	// The node's kubelet reaches the API server through the lab's relay
	// in the node's network namespace: kube-proxy uses the same address,
	// with the lab's admin credentials.
	kubelet, err := os.ReadFile(filepath.Join(c.NodeRoot(node), "etc/kubernetes/kubelet.conf"))
	if err != nil {
		return nil, err
	}
	var server string
	for _, l := range strings.Split(string(kubelet), "\n") {
		if s, ok := strings.CutPrefix(strings.TrimSpace(l), "server:"); ok {
			server = strings.TrimSpace(s)
		}
	}
	if server == "" {
		return nil, errors.New("no API server address in the node's kubelet.conf")
	}
	holder, err := os.Readlink(c.NodeRoot(node)) // /proc/<holder pid>/root
	if err != nil {
		return nil, err
	}
	holder = filepath.Dir(holder)
	// /tmp is the machine's in the node's mount namespace too.
	dir, err := os.MkdirTemp("", "lace-bench-kube-proxy-")
	if err != nil {
		return nil, err
	}
	pki := filepath.Join(c.StateDir(), "pki")
	for _, f := range []string{"ca.crt", "lace-admin.crt", "lace-admin.key"} {
		b, err := os.ReadFile(filepath.Join(pki, f))
		if err == nil {
			err = os.WriteFile(filepath.Join(dir, f), b, 0o600)
		}
		if err != nil {
			os.RemoveAll(dir)
			return nil, err
		}
	}
	kc := fmt.Sprintf(`apiVersion: v1
kind: Config
clusters:
- name: lab
  cluster: {server: %q, certificate-authority: %q}
users:
- name: admin
  user: {client-certificate: %q, client-key: %q}
contexts:
- name: lab
  context: {cluster: lab, user: admin}
current-context: lab
`, server, filepath.Join(dir, "ca.crt"), filepath.Join(dir, "lace-admin.crt"), filepath.Join(dir, "lace-admin.key"))
	if err := os.WriteFile(filepath.Join(dir, "kubeconfig"), []byte(kc), 0o600); err != nil {
		os.RemoveAll(dir)
		return nil, err
	}
	log, err := os.Create(filepath.Join(dir, "kube-proxy.log"))
	if err != nil {
		os.RemoveAll(dir)
		return nil, err
	}
	defer log.Close()
	netns := netutil.Path(c.NetNS(node))
	// nf_conntrack_max is the machine's: --conntrack-max-per-core=0 leaves
	// it alone, and the per-namespace conntrack timeouts are left as they
	// are too. The default sync periods (min 1 s) are upstream's.
	args := append([]string{"--mount=" + holder + "/ns/mnt", "--uts=" + holder + "/ns/uts", "--net=" + netns, "--",
		bin, "--proxy-mode=nftables", "--kubeconfig=" + filepath.Join(dir, "kubeconfig"), "--hostname-override=" + node,
		"--conntrack-max-per-core=0", "--conntrack-tcp-timeout-established=0", "--conntrack-tcp-timeout-close-wait=0",
		"--metrics-bind-address=" + kpMetrics, "--healthz-bind-address=" + kpHealthz, "--oom-score-adj=0", "--v=2"}, extra...)
	cmd := exec.Command("nsenter", args...)
	cmd.Stdout, cmd.Stderr = log, log
	if err := cmd.Start(); err != nil {
		os.RemoveAll(dir)
		return nil, err
	}
	kp := &kubeProxy{node: node, netns: netns, dir: dir, cmd: cmd, done: make(chan error, 1)}
	go func() { kp.done <- cmd.Wait() }()
	if kp.chains, err = openNFTChains(netns); err != nil {
		kp.stop()
		return nil, err
	}
	// A node's own sockets need a route covering the service range for
	// nftables' DNAT to act (the output hook comes after routing); nodes
	// under kube-proxy have a default route, a lab node has none. Lace's
	// agent only manages routes of its own protocol.
	kp.svcRange = netip.MustParsePrefix(strings.Split(lab.ServiceCIDRs, ",")[0])
	if err := netutil.EnsureRoute(netns, kp.svcRange, netip.Addr{}, "eth0"); err != nil {
		kp.stop()
		return nil, err
	}
	deadline := time.Now().Add(time.Minute)
	for {
		if _, err := kp.nft(ctx, "list", "map", "ip", "kube-proxy", "service-ips"); err == nil {
			return kp, nil
		}
		select {
		case err := <-kp.done:
			kp.done <- err
			kp.stop()
			return nil, fmt.Errorf("exited (%v): %s", err, tail(filepath.Join(dir, "kube-proxy.log")))
		case <-time.After(200 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			kp.stop()
			return nil, errors.New("no nftables table after a minute")
		}
	}
}

// stop ends kube-proxy and removes its tables and files.
func (kp *kubeProxy) stop() {
	if kp.cmd.Process != nil {
		_ = kp.cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-kp.done:
		case <-time.After(10 * time.Second):
			_ = kp.cmd.Process.Kill()
			<-kp.done
		}
	}
	for _, fam := range []string{"ip", "ip6"} {
		_, _ = kp.nft(context.Background(), "delete", "table", fam, "kube-proxy")
	}
	if kp.svcRange.IsValid() {
		_ = netutil.DeleteRoute(kp.netns, kp.svcRange, "eth0")
	}
	if kp.chains != nil {
		kp.chains.close()
	}
	_ = os.RemoveAll(kp.dir)
}

func (kp *kubeProxy) pid() int { return kp.cmd.Process.Pid }

// nft runs nft in kube-proxy's node.
func (kp *kubeProxy) nft(ctx context.Context, args ...string) (string, error) {
	var out, errb bytes.Buffer
	cmd := inNS(ctx, kp.netns, append([]string{"nft"}, args...)...)
	cmd.Stdout, cmd.Stderr = &out, &errb
	if err := cmd.Run(); err != nil {
		return "", fmt.Errorf("nft %s: %v: %s", strings.Join(args, " "), err, strings.TrimSpace(errb.String()))
	}
	return out.String(), nil
}

// serviceIPs are the keys (TCP only) of kube-proxy's service-ips map: the
// service ports it forwards to endpoints.
func (kp *kubeProxy) serviceIPs(ctx context.Context) (map[netip.AddrPort]bool, error) {
	out, err := kp.nft(ctx, "list", "map", "ip", "kube-proxy", "service-ips")
	if err != nil {
		return nil, err
	}
	els := map[netip.AddrPort]bool{}
	// elements = { 10.96.0.1 . tcp . 443 : goto service-..., ... }
	for _, f := range strings.FieldsFunc(out, func(r rune) bool { return r == '{' || r == ',' || r == '}' }) {
		parts := strings.Fields(f)
		if len(parts) < 5 || parts[1] != "." || parts[2] != "tcp" || parts[3] != "." {
			continue
		}
		a, err1 := netip.ParseAddr(parts[0])
		p, err2 := strconv.ParseUint(parts[4], 10, 16)
		if err1 == nil && err2 == nil {
			els[netip.AddrPortFrom(a, uint16(p))] = true
		}
	}
	return els, nil
}

// kube-proxy's nftables chain names (pkg/proxy/nftables: hashAndTruncate).
func kpHash(name string) string {
	h := sha256.Sum256([]byte(name))
	return base32.StdEncoding.EncodeToString(h[:])[:8] + "-" + name
}

func kpServiceChain(ns, svc, proto, port string) string {
	return "service-" + kpHash(ns+"/"+svc+"/"+proto+"/"+port)
}

func kpEndpointChain(ns, svc, proto, port string, ep netip.AddrPort) string {
	return "endpoint-" + kpHash(fmt.Sprintf("%s/%s/%s/%s__%s/%d", ns, svc, proto, port, ep.Addr(), ep.Port()))
}

func tail(path string) string {
	b, _ := os.ReadFile(path)
	if len(b) > 2000 {
		b = b[len(b)-2000:]
	}
	return string(b)
}

// promSum reads the _sum and _count of histogram name from a metrics
// endpoint inside the network namespace at nsPath.
func promSum(ctx context.Context, nsPath, addr, name string) ([2]float64, error) {
	// name may carry labels: metric{label="value"}.
	base, labels, _ := strings.Cut(name, "{")
	if labels != "" {
		labels = "{" + labels
	}
	var out [2]float64
	hc := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{
		DialContext: func(ctx context.Context, network, a string) (net.Conn, error) {
			return netutil.DialContext(ctx, nsPath, network, a)
		}}}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+addr+"/metrics", nil)
	if err != nil {
		return out, err
	}
	resp, err := hc.Do(req)
	if err != nil {
		return out, err
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	found := 0
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) != 2 {
			continue
		}
		for i, suffix := range []string{"_sum", "_count"} {
			if f[0] == base+suffix+labels {
				out[i], _ = strconv.ParseFloat(f[1], 64)
				found++
			}
		}
	}
	if found != 2 {
		return out, fmt.Errorf("%s not in the metrics of %s", name, addr)
	}
	return out, sc.Err()
}

// promValue reads the value of the unlabelled series name.
func promValue(ctx context.Context, nsPath, addr, name string) (float64, error) {
	hc := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{
		DialContext: func(ctx context.Context, network, a string) (net.Conn, error) {
			return netutil.DialContext(ctx, nsPath, network, a)
		}}}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+addr+"/metrics", nil)
	if err != nil {
		return 0, err
	}
	resp, err := hc.Do(req)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		if f := strings.Fields(sc.Text()); len(f) == 2 && f[0] == name {
			return strconv.ParseFloat(f[1], 64)
		}
	}
	return 0, fmt.Errorf("%s not in the metrics of %s", name, addr)
}

// benchProcs finds the lab's Lace agents (by node) and controller, and the
// peer kube-proxy: processes of this machine, found by name and network
// namespace.
func benchProcs(c lab.Config, kp *kubeProxy) map[string]int {
	out := map[string]int{}
	nsNode := map[uint64]string{}
	for _, n := range []string{laceNode, peerNode} {
		var st unix.Stat_t
		if unix.Stat(netutil.Path(c.NetNS(n)), &st) == nil {
			nsNode[st.Ino] = n
		}
	}
	procs, _ := os.ReadDir("/proc")
	for _, p := range procs {
		pid, err := strconv.Atoi(p.Name())
		if err != nil {
			continue
		}
		cmdline, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
		if err != nil {
			continue
		}
		argv0 := filepath.Base(string(bytes.SplitN(cmdline, []byte{0}, 2)[0]))
		var st unix.Stat_t
		if unix.Stat(fmt.Sprintf("/proc/%d/ns/net", pid), &st) != nil {
			continue
		}
		node, ok := nsNode[st.Ino]
		if !ok {
			continue
		}
		switch argv0 {
		case "lace-agent":
			out["agent "+node] = pid
		case "lace-controller":
			out["controller"] = pid
		}
	}
	if kp != nil {
		out["kube-proxy"] = kp.pid()
	}
	return out
}

// rssOf returns the resident memory of each process.
func rssOf(procs map[string]int) map[string]int64 {
	out := map[string]int64{}
	for k, pid := range procs {
		out[k] = vmRSS(pid)
	}
	return out
}

// cpuOf returns the CPU time each process used so far, with that of its
// waited-for children (kube-proxy runs nft).
func cpuOf(procs map[string]int) map[string]time.Duration {
	out := map[string]time.Duration{}
	for k, pid := range procs {
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
		if err != nil {
			continue
		}
		// Fields after the command (which may hold spaces): state is
		// field 3, utime..cstime fields 14..17, in clock ticks (100/s).
		f := strings.Fields(string(b[bytes.LastIndexByte(b, ')')+1:]))
		if len(f) < 15 {
			continue
		}
		var ticks int64
		for _, x := range f[11:15] {
			v, _ := strconv.ParseInt(x, 10, 64)
			ticks += v
		}
		out[k] = time.Duration(ticks) * 10 * time.Millisecond
	}
	return out
}

func cpuDelta(a, b map[string]time.Duration) map[string]time.Duration {
	out := map[string]time.Duration{}
	for k, v := range b {
		if u, ok := a[k]; ok {
			out[k] = v - u
		}
	}
	return out
}

// fileRSSOf returns the resident pages of each process that map files
// (RssFile): mostly the pages of its binary, which the kernel can drop
// and read again, shared with any other process of the same binary.
func fileRSSOf(procs map[string]int) map[string]int64 {
	out := map[string]int64{}
	for k, pid := range procs {
		out[k] = statusBytes(pid, "RssFile:")
	}
	return out
}

func vmRSS(pid int) int64 { return statusBytes(pid, "VmRSS:") }

// statusBytes is the field of /proc/pid/status named key, in bytes.
func statusBytes(pid int, key string) int64 {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0
	}
	for _, l := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(l, key); ok {
			kb, _ := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
			return kb << 10
		}
	}
	return 0
}

// rrPath is a request/response path: a client namespace and where it dials.
type rrPath struct {
	name string
	ns   string
	dst  netip.AddrPort
}

// requestResponseVIP runs bench/forwarding.go's one-byte ping-pong on each
// path (the server in the server pod on every address, the client dialing
// the VIP or the pod), five interleaved rounds, medians.
func requestResponseVIP(ctx context.Context, srvNS string, paths []rrPath, dur time.Duration, services int) error {
	type res struct{ p50, p99 time.Duration }
	samples := make([][]res, len(paths))
	for _, p := range paths {
		if _, _, err := pingPong(ctx, srvNS, p, 200*time.Millisecond); err != nil {
			return fmt.Errorf("%s: warm-up: %w", p.name, err)
		}
	}
	for round := range rounds {
		for k := range paths {
			i := (k + round) % len(paths)
			p50, p99, err := pingPong(ctx, srvNS, paths[i], dur)
			if err != nil {
				return fmt.Errorf("%s: %w", paths[i].name, err)
			}
			samples[i] = append(samples[i], res{p50, p99})
		}
	}
	med := func(rs []res, f func(res) time.Duration) time.Duration {
		v := make([]time.Duration, len(rs))
		for i, r := range rs {
			v[i] = f(r)
		}
		sort.Slice(v, func(a, b int) bool { return v[a] < v[b] })
		return v[len(v)/2]
	}
	m := make([]res, len(paths))
	for i := range paths {
		m[i] = res{med(samples[i], func(r res) time.Duration { return r.p50 }), med(samples[i], func(r res) time.Duration { return r.p99 })}
	}
	fmt.Printf("Request/response through a ClusterIP (1-byte ping-pong on one connection, %s; median of %d interleaved rounds; client on %s, server pod on %s; %d other services present)\n",
		dur, rounds, peerNode, laceNode, services)
	tw := tabwriter.NewWriter(os.Stdout, 0, 4, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "path\tpeer\tp50\tpeer p50\tratio\tp99\tpeer p99\tratio\t")
	for i := 0; i+1 < len(paths); i += 2 {
		a, b := m[i], m[i+1]
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%.2f\t%s\t%s\t%.2f\t\n", paths[i].name, paths[i+1].name,
			us(a.p50), us(b.p50), float64(a.p50)/float64(b.p50), us(a.p99), us(b.p99), float64(a.p99)/float64(b.p99))
	}
	tw.Flush()
	fmt.Println("ratio = through the VIP / direct to the pod (lower is better); target for Lace: p50 ratio <= 1.05")
	fmt.Println()
	return nil
}

// pingPong is requestResponse (forwarding.go) with the server on every
// address of srvNS and the client dialing p.dst.
func pingPong(ctx context.Context, srvNS string, p rrPath, dur time.Duration) (p50, p99 time.Duration, err error) {
	p50, p99, _, err = pingPongRTT(ctx, srvNS, ":5201", p.ns, p.dst.String(), dur)
	return p50, p99, err
}

func quantile(l []time.Duration, p int) time.Duration {
	if len(l) == 0 {
		return -1
	}
	s := append([]time.Duration(nil), l...)
	sort.Slice(s, func(i, j int) bool { return s[i] < s[j] })
	return s[min(len(s)-1, len(s)*p/100)]
}

func ms(d time.Duration) string {
	if d < 0 {
		return "-"
	}
	return strconv.FormatFloat(float64(d)/1e6, 'f', 1, 64) + "ms"
}

func ratio(a, b time.Duration) string {
	if a < 0 || b <= 0 {
		return "-"
	}
	return strconv.FormatFloat(float64(a)/float64(b), 'f', 3, 64)
}

func mib(b int64) string {
	if b <= 0 {
		return "-"
	}
	return strconv.FormatFloat(float64(b)/(1<<20), 'f', 1, 64) + " MiB"
}

func printProgramming(rs []progResult, o svcOptions) {
	fmt.Printf("Service programming (ClusterIP, TCP; %d endpoints per service in one EndpointSlice, written straight to the API by %d clients; Lace on %s alone and on %s beside kube-proxy nftables)\n",
		o.endpoints, 64, laceNode, peerNode)
	fmt.Println("full = from the last object written (and from the first) to the node's data plane serving every service with all its endpoints")
	tw := tabwriter.NewWriter(os.Stdout, 0, 4, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "services\tendpoints\twrite time\tLace "+laceNode+"\tLace "+peerNode+"\tkube-proxy "+peerNode+"\tratio\tLace from first\tkube-proxy from first\tratio\t")
	for _, r := range rs {
		fmt.Fprintf(tw, "%d\t%d\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t\n", r.n, r.n*o.endpoints, ms(r.create),
			ms(r.lace), ms(r.lace2), ms(r.kp), ratio(r.lace, r.kp), ms(r.laceFirst), ms(r.kpFirst), ratio(r.laceFirst, r.kpFirst))
	}
	tw.Flush()
	for _, r := range rs {
		fmt.Printf("%d services: every one annotated with its network by the controller %s after the last write\n", r.n, msOr(r.bound))
	}
	fmt.Printf("one endpoint change (a slice's first address replaced; from the PATCH sent to the data plane serving it; %d changes, >= 1.1 s apart)\n", o.changes)
	tw = tabwriter.NewWriter(os.Stdout, 0, 4, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "services\tchanges\tLace p50\tkube-proxy p50\tratio\tLace p99\tkube-proxy p99\tratio\tLace reconcile\tLace sync\tkube-proxy sync\t")
	for _, r := range rs {
		l50, l99, k50, k99 := quantile(r.laceChange, 50), quantile(r.laceChange, 99), quantile(r.kpChange, 50), quantile(r.kpChange, 99)
		fmt.Fprintf(tw, "%d\t%d\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t\n", r.n, len(r.laceChange), ms(l50), ms(k50), ratio(l50, k50), ms(l99), ms(k99), ratio(l99, k99),
			msOr(r.laceReconcile), msOr(r.laceSync), msOr(r.kpSync))
	}
	tw.Flush()
	fmt.Println("ratio = Lace / kube-proxy (lower is better); targets: full <= 1 s, change p99 <= 50 ms, both ratios <= 0.1")
	for _, r := range rs {
		if len(r.laceLoaded) > 0 {
			fmt.Printf("%d services: %d changes back to back while kube-proxy synced each (it used %s of CPU in the %s, of 2 CPUs): Lace p50 / p99 %s / %s\n",
				r.n, len(r.laceLoaded), r.loadedKPCPU.Round(10*time.Millisecond), r.loadedFor.Round(10*time.Millisecond),
				ms(quantile(r.laceLoaded, 50)), ms(quantile(r.laceLoaded, 99)))
		}
	}

	fmt.Println("means over the changes (sum/count): Lace reconcile = controller_runtime_reconcile_time_seconds of the agent's node-dataplane controller")
	fmt.Println("(lists every object, recomputes the node, applies), Lace sync = lace_agent_sync_duration_seconds (the apply),")
	fmt.Println("kube-proxy sync = kubeproxy_sync_proxy_rules_duration_seconds (IPv4)")
	fmt.Println("CPU time used (user + system, kube-proxy's nft children included): to program every service (from the first object written), and per endpoint change")
	tw = tabwriter.NewWriter(os.Stdout, 0, 4, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "services\tLace agent "+laceNode+"\tLace agent "+peerNode+"\tLace controller\tkube-proxy "+peerNode+"\tper change: Lace agent "+laceNode+"\tLace agent "+peerNode+"\tkube-proxy "+peerNode+"\t")
	for _, r := range rs {
		per := func(k string) string {
			if r.changes == 0 {
				return "-"
			}
			return msOr(r.changeCPU[k] / time.Duration(r.changes))
		}
		fmt.Fprintf(tw, "%d\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t\n", r.n, msOr(r.progCPU["agent "+laceNode]), msOr(r.progCPU["agent "+peerNode]),
			msOr(r.progCPU["controller"]), msOr(r.progCPU["kube-proxy"]), per("agent "+laceNode), per("agent "+peerNode), per("kube-proxy"))
	}
	tw.Flush()
	for _, r := range rs {
		if r.restFor <= 0 {
			continue
		}
		perMin := func(k string) string {
			d, ok := r.restCPU[k]
			if !ok {
				return "-"
			}
			return time.Duration(float64(d) * float64(time.Minute) / float64(r.restFor)).Round(10 * time.Millisecond).String()
		}
		fmt.Printf("%d services at rest (%s with no change): CPU per minute: Lace agent %s %s, %s %s, controller %s, kube-proxy %s; agent %s allocated %s per minute\n",
			r.n, r.restFor.Round(time.Second), laceNode, perMin("agent "+laceNode), peerNode, perMin("agent "+peerNode), perMin("controller"),
			perMin("kube-proxy"), laceNode, mib(int64(r.restAlloc*float64(time.Minute)/float64(r.restFor))))
	}
	for _, r := range rs {
		if r.readBackN > 0 {
			fmt.Printf("reading %d services' %d backends back from %s's maps one lookup each (what each sync cost before the tables kept mirrors of their writes; none reads back now) took %s\n",
				r.n, r.readBackN, laceNode, ms(r.readBack))
		}
	}
	for _, r := range rs {
		if r.heap > 0 {
			fmt.Printf("%d services: the agent on %s had %s of Go heap in use after programming, and allocated %s per endpoint change (go_memstats)\n",
				r.n, laceNode, mib(int64(r.heap)), mib(int64(r.allocPerChange)))
		}
	}
	fmt.Println("memory (VmRSS; in brackets RssFile, the part that maps the binary's pages)")
	tw = tabwriter.NewWriter(os.Stdout, 0, 4, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "services\tendpoints\twhen\tLace agent "+laceNode+"\tLace agent "+peerNode+"\tLace controller\tkube-proxy "+peerNode+"\t")
	mem := func(rss, file map[string]int64, k string) string {
		if rss[k] == 0 {
			return "-"
		}
		return fmt.Sprintf("%s (%s)", mib(rss[k]), mib(file[k]))
	}
	for _, r := range rs {
		row := func(when string, rss, file map[string]int64) {
			fmt.Fprintf(tw, "%d\t%d\t%s\t%s\t%s\t%s\t%s\t\n", r.n, r.n*o.endpoints, when, mem(rss, file, "agent "+laceNode),
				mem(rss, file, "agent "+peerNode), mem(rss, file, "controller"), mem(rss, file, "kube-proxy"))
		}
		row("after programming", r.rss, r.rssFile)
		if r.restRSS != nil {
			row("after the rest", r.restRSS, r.restRSSFile)
		}
	}
	tw.Flush()
	fmt.Println("target: agent <= 100 MiB with 10,000 services and 100,000 endpoints")
	for _, r := range rs {
		for _, n := range r.notes {
			fmt.Printf("note (%d services): %s\n", r.n, n)
		}
	}
	fmt.Println()
}

func msOr(d time.Duration) string {
	if d <= 0 {
		return "-"
	}
	return ms(d)
}

// nftChains asks the kernel whether chains of kube-proxy's table exist,
// one netlink request each: nft would fetch the whole ruleset (tenths of
// a second at 10,000 services, and CPU the data planes under test need).
// kube-proxy writes a sync as one transaction, so a chain it creates in a
// sync exists exactly when the rest of that sync does.
type nftChains struct {
	fd  int
	seq uint32
	buf []byte
}

func openNFTChains(nsPath string) (*nftChains, error) {
	var fd int
	err := netutil.Do(nsPath, func() error {
		var err error
		fd, err = unix.Socket(unix.AF_NETLINK, unix.SOCK_RAW|unix.SOCK_CLOEXEC, unix.NETLINK_NETFILTER)
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("netfilter netlink socket: %w", err)
	}
	if err := unix.Bind(fd, &unix.SockaddrNetlink{Family: unix.AF_NETLINK}); err != nil {
		unix.Close(fd)
		return nil, err
	}
	return &nftChains{fd: fd, buf: make([]byte, 1<<16)}, nil
}

func (n *nftChains) close() { unix.Close(n.fd) }

// exists says whether chain is in the ip table kube-proxy.
func (n *nftChains) exists(chain string) (bool, error) {
	n.seq++
	attr := func(typ uint16, s string) []byte {
		l := unix.SizeofNlAttr + len(s) + 1
		b := make([]byte, (l+3)&^3)
		binary.NativeEndian.PutUint16(b[0:], uint16(l))
		binary.NativeEndian.PutUint16(b[2:], typ)
		copy(b[unix.SizeofNlAttr:], s)
		return b
	}
	body := append([]byte{unix.NFPROTO_IPV4, unix.NFNETLINK_V0, 0, 0}, attr(unix.NFTA_CHAIN_TABLE, "kube-proxy")...)
	body = append(body, attr(unix.NFTA_CHAIN_NAME, chain)...)
	msg := make([]byte, unix.SizeofNlMsghdr, unix.SizeofNlMsghdr+len(body))
	binary.NativeEndian.PutUint32(msg[0:], uint32(unix.SizeofNlMsghdr+len(body)))
	binary.NativeEndian.PutUint16(msg[4:], unix.NFNL_SUBSYS_NFTABLES<<8|unix.NFT_MSG_GETCHAIN)
	binary.NativeEndian.PutUint16(msg[6:], unix.NLM_F_REQUEST)
	binary.NativeEndian.PutUint32(msg[8:], n.seq)
	msg = append(msg, body...)
	if err := unix.Sendto(n.fd, msg, 0, &unix.SockaddrNetlink{Family: unix.AF_NETLINK}); err != nil {
		return false, err
	}
	for {
		k, _, err := unix.Recvfrom(n.fd, n.buf, 0)
		if err != nil {
			return false, err
		}
		msgs, err := syscall.ParseNetlinkMessage(n.buf[:k])
		if err != nil {
			return false, err
		}
		for _, m := range msgs {
			if m.Header.Seq != n.seq {
				continue // a late answer to an earlier request
			}
			switch m.Header.Type {
			case unix.NFNL_SUBSYS_NFTABLES<<8 | unix.NFT_MSG_NEWCHAIN:
				return true, nil
			case unix.NLMSG_ERROR:
				if len(m.Data) < 4 {
					return false, errors.New("short netlink error")
				}
				switch e := -int32(binary.NativeEndian.Uint32(m.Data)); syscall.Errno(e) {
				case 0:
					continue
				case unix.ENOENT:
					return false, nil
				default:
					return false, syscall.Errno(e)
				}
			}
		}
	}
}

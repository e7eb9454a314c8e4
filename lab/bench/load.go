package main

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"text/tabwriter"
	"time"

	"github.com/cilium/ebpf"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/kubernetes"
	"k8s.io/utils/ptr"

	"github.com/lace-cni/lace/internal/netutil"
	"github.com/lace-cni/lace/lab"
)

// The data path under load: many short connections and request/response
// from the external host through a NodePort, and from a pod (Lace) or the
// node (kube-proxy) through a ClusterIP, with kube-proxy nftables serving
// the same Services in the same lab; then Lace's paths again with its
// conntrack map holding a million flows.
//
// Both proxies serve the same NodePort on the same node (peerNode) with
// the same endpoint pod on it: Lace at the node's underlay address, which
// its underlay program translates before netfilter sees the packet, and
// kube-proxy (--nodeport-addresses) at an address of a second port of the
// node on the fabric, which Lace does not serve (kpNodePortAddress).

// loadOptions sizes the load benchmark.
type loadOptions struct {
	// workers are the concurrent connections of the load generator.
	workers int
	// dur is the length of each round; rounds are interleaved.
	dur time.Duration
	// ctFill is how many flows the conntrack maps are filled with for the
	// second pass; 0 skips it.
	ctFill int
	// kubeProxy is the kube-proxy binary; "" runs no peer.
	kubeProxy string
}

const (
	loadNS = "lace-bench-load"
	// kpNodePortAddr is kube-proxy's NodePort address on peerNode (on a
	// port of its own: kpNodePortAddress; TEST-NET-1, which nothing in
	// the lab uses).
	kpNodePortAddr = "192.0.2.12"
	// The servers' ports in the endpoint pods: one request and its answer
	// per connection, and the request/response echo (pingPong's).
	loadConnPort = 5203
	loadRRPort   = 5201
	// loadCTHeadroom is what the chart's conntrack map must hold beyond
	// the fill: the run's own flows (a closed flow is held 10 s).
	loadCTHeadroom = 131072
)

// loadPath is where a load path's client runs and what it dials.
type loadPath struct {
	name string
	ns   string
	dst  netip.AddrPort
	// lace: the path goes through Lace's data plane (repeated with a full
	// conntrack map).
	lace bool
	// ref is the index of the path this one is compared with (the same
	// client straight to the endpoint pod); -1: none.
	ref int
	// srv is the network namespace of the endpoint pod that answers.
	srv string
}

// connRound is one round of the connection load on one path.
type connRound struct {
	done, failed int
	perS         float64
	lat          []time.Duration
}

func benchLoad(ctx context.Context, name, peerLab string, o loadOptions) error {
	w, cleanup, err := setupLoadWorld(ctx, name)
	defer cleanup()
	if err != nil {
		return err
	}
	c, ext, srv1, srv2, cli := w.c, w.ext, w.srv1, w.srv2, w.cli
	peerNS := netutil.Path(c.NetNS(peerNode))
	laceV4, _ := lab.NodeUnderlay(1)
	var kp *kubeProxy
	if o.kubeProxy != "" {
		undo, err := kpNodePortAddress(c, ext, peerNS)
		defer undo()
		if err != nil {
			return err
		}
		if kp, err = startKubeProxy(ctx, c, peerNode, o.kubeProxy, "--nodeport-addresses="+kpNodePortAddr+"/32"); err != nil {
			return fmt.Errorf("kube-proxy: %w", err)
		}
		defer kp.stop()
	}

	// The peer cluster's paths are compared with these two (its shapes,
	// in the same order).
	paths := w.shapes("Lace: ", "", true)
	laceShapes := []int{0, 2}
	if kp != nil {
		directExt, directPod := at(srv2.ip, loadConnPort), at(srv1.ip, loadConnPort)
		paths = pairPaths(paths, "kube-proxy: external -> "+peerNode+" NodePort -> pod on "+peerNode, ext, at(netip.MustParseAddr(kpNodePortAddr), w.np2), false,
			"external -> pod on "+peerNode+" direct", directExt, srv2.ns)
		paths = pairPaths(paths, "kube-proxy: "+peerNode+" -> ClusterIP -> pod on "+laceNode, peerNS, at(w.vip1, 81), false,
			peerNode+" -> pod on "+laceNode+" direct", directPod, srv1.ns)
	}
	// Lace only: a NodePort whose endpoint is on another node leaves the
	// node from a port of its own (SNAT), 4,536 per endpoint.
	paths = append(paths, loadPath{"Lace: external -> " + laceNode + " NodePort -> pod on " + peerNode + " (SNAT)", ext, at(laceV4, w.np2), true, 1, srv2.ns})
	// The same two Services on the peer cluster: its pods and Services,
	// its external host, through its kube-proxy and vxlan.
	var versus [][2]int
	if peerLab != "" {
		pw, cleanupPeer, err := setupLoadWorld(ctx, peerLab)
		defer cleanupPeer()
		if err != nil {
			return fmt.Errorf("flannel lab %s: %w", peerLab, err)
		}
		peer := pw.shapes("flannel: ", "flannel: ", false)
		for i, p := range peer {
			if p.ref >= 0 {
				p.ref += len(paths)
				versus = append(versus, [2]int{laceShapes[len(versus)], len(paths) + i})
			}
			peer[i] = p
		}
		paths = append(paths, peer...)
	}
	for _, p := range paths {
		if err := waitExchange(ctx, p); err != nil {
			return err
		}
	}

	fmt.Printf("Connections per second (each: connect, 1-byte request, 1-byte answer, close with a reset; %d clients at once, %s rounds, %d interleaved; NodePort and ClusterIP with externalTrafficPolicy Cluster)\n",
		o.workers, o.dur, rounds)
	conns, err := connRounds(ctx, paths, o)
	if err != nil {
		return err
	}
	printConns(paths, conns, nil, "against direct")
	rr, err := rrRounds(ctx, paths, o)
	if err != nil {
		return err
	}
	printRR(paths, rr, nil, "direct", o)
	if len(versus) > 0 {
		printVersus(paths, versus, conns, rr, peerLab)
	}
	if o.ctFill == 0 {
		return nil
	}

	// Again on Lace's paths, with a million flows in every node's map.
	var lace []loadPath
	for _, p := range paths {
		if p.lace {
			p.ref = -1
			lace = append(lace, p)
		}
	}
	// A connection kept open through the ClusterIP gives each node's map
	// an established IPv4 TCP flow to copy.
	keep, err := netutil.DialContext(ctx, cli.ns, "tcp", netip.AddrPortFrom(w.vip1, 81).String())
	if err == nil {
		defer keep.Close()
		b := []byte{1}
		if _, err = keep.Write(b); err == nil {
			_, err = io.ReadFull(keep, b)
		}
	}
	if err != nil {
		return fmt.Errorf("a flow to copy: %w", err)
	}
	var filled [2]int
	for i, node := range []string{laceNode, peerNode} {
		n, undo, err := fillConntrack(c, node, o.ctFill)
		defer undo()
		if err != nil {
			return fmt.Errorf("fill %s's conntrack: %w", node, err)
		}
		filled[i] = n
	}
	fmt.Printf("Lace with %d / %d flows in %s's / %s's conntrack map (fake flows of pods that do not exist, established, expiring in an hour)\n",
		filled[0], filled[1], laceNode, peerNode)
	full, err := connRounds(ctx, lace, o)
	if err != nil {
		return err
	}
	fullRR, err := rrRounds(ctx, lace, o)
	if err != nil {
		return err
	}
	var before [][]connRound
	var beforeRR []rrRun
	for i, p := range paths {
		if p.lace {
			before = append(before, conns[i])
			beforeRR = append(beforeRR, rr[i])
		}
	}
	printConns(lace, full, before, "before the fill")
	printRR(lace, fullRR, beforeRR, "before the fill", o)
	fmt.Println("target: the same cost per packet with a million flows as with the run's own")
	return nil
}

// rrPortOf is the request/response port of a path whose connection load
// goes to port: the Services' port 80 and the pods' 5201.
func rrPortOf(port uint16) uint16 {
	switch port {
	case 81:
		return 80
	case loadConnPort:
		return loadRRPort
	}
	return port + 1 // NodePort: the rr port is the next one (loadService)
}

// freshNamespace creates ns, deleting first one left by an earlier run.
func freshNamespace(ctx context.Context, cs kubernetes.Interface, ns string) error {
	for deadline := time.Now().Add(3 * time.Minute); ; {
		_, err := cs.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{})
		if err == nil {
			return nil
		}
		if !apierrors.IsAlreadyExists(err) && !apierrors.IsConflict(err) && !apierrors.IsForbidden(err) || time.Now().After(deadline) {
			return fmt.Errorf("namespace %s: %w", ns, err)
		}
		_ = cs.CoreV1().Namespaces().Delete(ctx, ns, metav1.DeleteOptions{})
		time.Sleep(time.Second)
	}
}

// kpNodePortAddress gives peerNode a second port on the fabric, kp0,
// holding the address kube-proxy serves NodePorts at, and the external
// host a route to it. Not on the node's underlay interface: Lace's
// underlay program drops plain IP to any address but the node's own
// there (not-for-this-node), and an address on it would be the node's,
// served by Lace first. kp0 runs no program of Lace's, which spares
// kube-proxy's packets a cost Lace's pay. Static neighbours both ways,
// and the answers leave by kp0 (a rule for its address), so no ARP is
// needed on a segment where eth0 would answer for kp0's address too.
func kpNodePortAddress(c lab.Config, ext, peerNS string) (func(), error) {
	const (
		fabricEnd = "kpbench"
		port      = "kp0"
		table     = 212
	)
	fabric := netutil.Path(c.NetNS("fabric"))
	a := netip.MustParseAddr(kpNodePortAddr)
	extV4, _ := lab.ExternalUnderlay()
	one := func(a netip.Addr) *net.IPNet { return &net.IPNet{IP: a.AsSlice(), Mask: net.CIDRMask(32, 32)} }
	rule := netlink.NewRule()
	rule.Src, rule.Table, rule.Priority = one(a), table, 2120
	undo := func() {
		if h, err := netutil.Handle(fabric); err == nil {
			if l, err := h.LinkByName(fabricEnd); err == nil {
				_ = h.LinkDel(l) // and its peer kp0 with its address, neighbour and routes
			}
			h.Close()
		}
		if h, err := netutil.Handle(peerNS); err == nil {
			_ = h.RuleDel(rule)
			h.Close()
		}
		_ = netutil.DeleteRoute(ext, netip.PrefixFrom(a, 32), "eth0")
		if h, err := netutil.Handle(ext); err == nil {
			if l, err := h.LinkByName("eth0"); err == nil {
				_ = h.NeighDel(&netlink.Neigh{LinkIndex: l.Attrs().Index, IP: a.AsSlice()})
			}
			h.Close()
		}
	}
	err := func() error {
		if err := netutil.EnsureVeth(netutil.VethSpec{NSPath: fabric, Name: fabricEnd, Master: "br0", PeerNSPath: peerNS, PeerName: port}); err != nil {
			return err
		}
		hp, err := netutil.Handle(peerNS)
		if err != nil {
			return err
		}
		defer hp.Close()
		he, err := netutil.Handle(ext)
		if err != nil {
			return err
		}
		defer he.Close()
		kp0, err := hp.LinkByName(port)
		if err != nil {
			return err
		}
		eth0, err := he.LinkByName("eth0")
		if err != nil {
			return err
		}
		if err := hp.AddrReplace(kp0, &netlink.Addr{IPNet: one(a)}); err != nil {
			return fmt.Errorf("address: %w", err)
		}
		if err := hp.NeighSet(&netlink.Neigh{LinkIndex: kp0.Attrs().Index, IP: extV4.AsSlice(), HardwareAddr: eth0.Attrs().HardwareAddr,
			State: netlink.NUD_PERMANENT}); err != nil {
			return fmt.Errorf("neighbour: %w", err)
		}
		if err := hp.RouteReplace(&netlink.Route{LinkIndex: kp0.Attrs().Index, Dst: one(extV4), Table: table, Scope: netlink.SCOPE_LINK}); err != nil {
			return fmt.Errorf("route: %w", err)
		}
		if err := hp.RuleAdd(rule); err != nil {
			return fmt.Errorf("rule: %w", err)
		}
		if err := he.NeighSet(&netlink.Neigh{LinkIndex: eth0.Attrs().Index, IP: a.AsSlice(), HardwareAddr: kp0.Attrs().HardwareAddr,
			State: netlink.NUD_PERMANENT}); err != nil {
			return fmt.Errorf("external host: neighbour: %w", err)
		}
		return he.RouteReplace(&netlink.Route{LinkIndex: eth0.Attrs().Index, Dst: one(a), Scope: netlink.SCOPE_LINK})
	}()
	if err != nil {
		return undo, fmt.Errorf("kube-proxy's NodePort address on %s: %w", peerNode, err)
	}
	return undo, nil
}

// benchPod is a running pod's network namespace and address.
type benchPod struct {
	ns string
	ip netip.Addr
}

// runPods starts a pause pod per name on its node (labelled app=name) and
// waits until each runs.
func runPods(ctx context.Context, cs kubernetes.Interface, c lab.Config, ns string, nodes map[string]string) (map[string]benchPod, error) {
	for name, node := range nodes {
		pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{"app": name}},
			Spec: corev1.PodSpec{NodeName: node, TerminationGracePeriodSeconds: ptr.To[int64](1),
				Containers: []corev1.Container{{Name: "pause", Image: "registry.k8s.io/pause:3.10"}}}}
		// The API server's namespace admission may still take a namespace
		// that an earlier run deleted and this one created again for the
		// old one, terminating, for a few seconds.
		for deadline := time.Now().Add(time.Minute); ; time.Sleep(time.Second) {
			_, err := cs.CoreV1().Pods(ns).Create(ctx, pod, metav1.CreateOptions{})
			if err == nil {
				break
			}
			if !apierrors.HasStatusCause(err, corev1.NamespaceTerminatingCause) || time.Now().After(deadline) {
				return nil, fmt.Errorf("pod %s: %w", name, err)
			}
		}
	}
	out := map[string]benchPod{}
	for deadline := time.Now().Add(time.Minute); len(out) < len(nodes); {
		if time.Now().After(deadline) {
			return nil, fmt.Errorf("%d of %d benchmark pods running after a minute", len(out), len(nodes))
		}
		time.Sleep(200 * time.Millisecond)
		for name := range nodes {
			if _, ok := out[name]; ok {
				continue
			}
			p, err := cs.CoreV1().Pods(ns).Get(ctx, name, metav1.GetOptions{})
			if err != nil || p.Status.Phase != corev1.PodRunning || p.Status.PodIP == "" {
				continue
			}
			netNS, err := lab.PodNetNS(ctx, c, ns, name)
			if err != nil {
				return nil, err
			}
			out[name] = benchPod{netNS, netip.MustParseAddr(p.Status.PodIP)}
		}
	}
	return out, nil
}

// loadService is a NodePort Service in front of the pod app=app: port 80
// to the echo (loadRRPort), 81 to the one-exchange server (loadConnPort);
// it returns its ClusterIP and the NodePort of port 81 (port 80's is the
// next one: rrPortOf).
func loadService(ctx context.Context, cs kubernetes.Interface, name, app string) (netip.Addr, int32, error) {
	for try := range 50 {
		np := int32(31000 + try*2 + len(name)%2*100)
		svc := &corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: name}, Spec: corev1.ServiceSpec{
			Type:     corev1.ServiceTypeNodePort,
			Selector: map[string]string{"app": app},
			Ports: []corev1.ServicePort{
				{Name: "rr", Port: 80, TargetPort: intstr.FromInt32(loadRRPort), NodePort: np + 1},
				{Name: "conn", Port: 81, TargetPort: intstr.FromInt32(loadConnPort), NodePort: np},
			}}}
		got, err := cs.CoreV1().Services(loadNS).Create(ctx, svc, metav1.CreateOptions{})
		if apierrors.IsInvalid(err) {
			continue // a port taken: the next pair
		}
		if err != nil {
			return netip.Addr{}, 0, fmt.Errorf("service %s: %w", name, err)
		}
		vip, err := netip.ParseAddr(got.Spec.ClusterIP)
		return vip, np, err
	}
	return netip.Addr{}, 0, fmt.Errorf("service %s: no free NodePort pair", name)
}

// serveOneExchange serves addr in the namespace at nsPath: each connection
// gets one byte back for its first and is closed after the client closes
// (so the server side keeps no TIME_WAIT).
func serveOneExchange(nsPath, addr string) (func(), error) {
	return serveTCP(nsPath, addr, func(c net.Conn) {
		go func() {
			defer c.Close()
			b := make([]byte, 1)
			if _, err := io.ReadFull(c, b); err != nil {
				return
			}
			if _, err := c.Write(b); err != nil {
				return
			}
			_, _ = io.Copy(io.Discard, c)
		}()
	})
}

// waitExchange waits until one exchange on p succeeds (the Services are
// programmed), up to a minute.
func waitExchange(ctx context.Context, p loadPath) error {
	var last error
	for deadline := time.Now().Add(time.Minute); time.Now().Before(deadline); {
		r, err := connLoad(ctx, p, 1, 0)
		if err == nil && r.done == 1 {
			return nil
		}
		last = err
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(200 * time.Millisecond):
		}
	}
	return fmt.Errorf("%s: no exchange with %s after a minute (%v)", p.name, p.dst, last)
}

// connRounds runs the connection load on every path, rounds times,
// interleaved (each round starts on another path), so that drift on a
// busy machine hits each path alike.
func connRounds(ctx context.Context, paths []loadPath, o loadOptions) ([][]connRound, error) {
	out := make([][]connRound, len(paths))
	for round := range rounds {
		for k := range paths {
			i := (k + round) % len(paths)
			r, err := connLoad(ctx, paths[i], o.workers, o.dur)
			if err != nil {
				return nil, fmt.Errorf("%s: %w", paths[i].name, err)
			}
			out[i] = append(out[i], r)
		}
	}
	return out, nil
}

// connLoad opens connections on p from workers threads in p's namespace,
// each one after the other, for dur (dur 0: one connection each): connect,
// write a byte, read it back, close with a reset (SO_LINGER 0), so the
// client keeps no TIME_WAIT, which would cap one address at about 470
// connections a second to one server port. An exchange that takes over a
// second fails.
func connLoad(ctx context.Context, p loadPath, workers int, dur time.Duration) (connRound, error) {
	var (
		mu  sync.Mutex
		out connRound
		wg  sync.WaitGroup
	)
	errc := make(chan error, workers)
	start := time.Now()
	deadline := start.Add(dur)
	for range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var lat []time.Duration
			failed := 0
			err := netutil.Do(p.ns, func() error {
				for first := true; first || time.Now().Before(deadline); first = false {
					if ctx.Err() != nil {
						return ctx.Err()
					}
					d, err := oneExchange(p.dst)
					if err != nil {
						if errors.Is(err, errSetup) {
							return err
						}
						failed++
						continue
					}
					lat = append(lat, d)
				}
				return nil
			})
			if err != nil {
				errc <- err
				return
			}
			mu.Lock()
			out.done += len(lat)
			out.failed += failed
			out.lat = append(out.lat, lat...)
			mu.Unlock()
		}()
	}
	wg.Wait()
	select {
	case err := <-errc:
		return out, err
	default:
	}
	out.perS = float64(out.done) / time.Since(start).Seconds()
	slices.Sort(out.lat)
	return out, nil
}

var errSetup = errors.New("socket setup")

// oneExchange is one connection of connLoad, timed from connect() to the
// answer.
func oneExchange(dst netip.AddrPort) (time.Duration, error) {
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return 0, fmt.Errorf("%w: %w", errSetup, err)
	}
	defer unix.Close(fd)
	tv := unix.Timeval{Sec: 1}
	for _, opt := range []int{unix.SO_SNDTIMEO, unix.SO_RCVTIMEO} {
		if err := unix.SetsockoptTimeval(fd, unix.SOL_SOCKET, opt, &tv); err != nil {
			return 0, fmt.Errorf("%w: %w", errSetup, err)
		}
	}
	if err := unix.SetsockoptLinger(fd, unix.SOL_SOCKET, unix.SO_LINGER, &unix.Linger{Onoff: 1, Linger: 0}); err != nil {
		return 0, fmt.Errorf("%w: %w", errSetup, err)
	}
	b := []byte{1}
	t := time.Now()
	if err := unix.Connect(fd, &unix.SockaddrInet4{Port: int(dst.Port()), Addr: dst.Addr().As4()}); err != nil {
		return 0, err
	}
	if _, err := unix.Write(fd, b); err != nil {
		return 0, err
	}
	if n, err := unix.Read(fd, b); err != nil || n != 1 {
		return 0, fmt.Errorf("read: %d, %v", n, err)
	}
	return time.Since(t), nil
}

// printConns prints each path's connections per second (median of its
// rounds) and latency (over every round's connections), beside its
// reference (loadPath.ref) or, with base, the same path's rounds in base.
func printConns(paths []loadPath, rs [][]connRound, base [][]connRound, baseName string) {
	summary := func(rounds []connRound) (perS float64, p50, p99 time.Duration, failed int, lat []time.Duration) {
		for _, r := range rounds {
			lat = append(lat, r.lat...)
			failed += r.failed
		}
		slices.Sort(lat)
		return medianPerS(rounds), quantile(lat, 50), quantile(lat, 99), failed, lat
	}
	tw := tabwriter.NewWriter(os.Stdout, 0, 4, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "path\tconns/s\tp50\tp99\tfailed\t"+baseName+": conns/s\tp50\tratio of p50s (95% CI)\t")
	for i, p := range paths {
		perS, p50, p99, failed, lat := summary(rs[i])
		var ref []connRound
		switch {
		case base != nil:
			ref = base[i]
		case p.ref >= 0:
			ref = rs[p.ref]
		}
		if ref == nil {
			fmt.Fprintf(tw, "%s\t%.0f\t%s\t%s\t%d\t-\t-\t-\t\n", p.name, perS, us(p50), us(p99), failed)
			continue
		}
		rPerS, rP50, _, _, rLat := summary(ref)
		fmt.Fprintf(tw, "%s\t%.0f\t%s\t%s\t%d\t%.0f\t%s\t%.3f (%s)\t\n", p.name, perS, us(p50), us(p99), failed, rPerS, us(rP50),
			float64(p50)/float64(rP50), ciString(medianRatioCI(sample(lat), sample(rLat))))
	}
	tw.Flush()
	fmt.Println("conns/s: the median round's; p50 / p99: of every connection of every round, connect() to the answer; failed: exchanges over 1 s or refused")
	fmt.Println()
}

// medianPerS is the median round's connections per second.
func medianPerS(rounds []connRound) float64 {
	rates := make([]float64, len(rounds))
	for i, r := range rounds {
		rates[i] = r.perS
	}
	slices.Sort(rates)
	return rates[len(rates)/2]
}

// sample is at most 20,000 of l, evenly spaced (l is sorted): the
// bootstrap's cost grows with the samples.
func sample(l []time.Duration) []time.Duration {
	const most = 20000
	if len(l) <= most {
		return l
	}
	out := make([]time.Duration, most)
	for i := range out {
		out[i] = l[i*len(l)/most]
	}
	return out
}

// pairPaths appends a path through a proxy and its reference, both
// answered in srv.
func pairPaths(paths []loadPath, name, ns string, dst netip.AddrPort, lace bool, refName string, ref netip.AddrPort, srv string) []loadPath {
	return append(paths, loadPath{name, ns, dst, lace, len(paths) + 1, srv}, loadPath{refName, ns, ref, false, -1, srv})
}

// rrRun is one path's request/response: a sample of every round's round
// trips (sample), sorted.
type rrRun struct{ all []time.Duration }

func (r rrRun) median() time.Duration { return r.all[len(r.all)/2] }

// rrRounds runs the one-connection request/response on every path
// (pingPong's echo, listening on loadRRPort in the path's pod, srv),
// rounds times, interleaved.
func rrRounds(ctx context.Context, paths []loadPath, o loadOptions) ([]rrRun, error) {
	out := make([]rrRun, len(paths))
	for round := range rounds {
		for k := range paths {
			i := (k + round) % len(paths)
			p := paths[i]
			dst := netip.AddrPortFrom(p.dst.Addr(), rrPortOf(p.dst.Port()))
			lat, _, err := pingPongSamples(ctx, p.srv, fmt.Sprintf(":%d", loadRRPort), p.ns, dst.String(), o.dur)
			if err != nil {
				return nil, fmt.Errorf("%s: request/response: %w", p.name, err)
			}
			out[i].all = append(out[i].all, sample(lat)...)
		}
	}
	for i := range out {
		slices.Sort(out[i].all)
	}
	return out, nil
}

// printRR prints each path's request/response p50 beside its reference
// (loadPath.ref) or, with base, the same path's in base.
func printRR(paths []loadPath, rs, base []rrRun, baseName string, o loadOptions) {
	fmt.Printf("Request/response on one connection (1-byte ping-pong, %s rounds, %d interleaved; p50 over the rounds)\n", o.dur, rounds)
	tw := tabwriter.NewWriter(os.Stdout, 0, 4, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "path\tp50\t"+baseName+" p50\tratio\t95% CI\t")
	for i, p := range paths {
		var ref *rrRun
		switch {
		case base != nil:
			ref = &base[i]
		case p.ref >= 0:
			ref = &rs[p.ref]
		}
		if ref == nil {
			fmt.Fprintf(tw, "%s\t%s\t-\t-\t-\t\n", p.name, us(rs[i].median()))
			continue
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%.3f\t%s\t\n", p.name, us(rs[i].median()), us(ref.median()),
			float64(rs[i].median())/float64(ref.median()), ciString(medianRatioCI(sample(rs[i].all), sample(ref.all))))
	}
	tw.Flush()
	fmt.Println("p50 of at most 20,000 round trips of each round; 95% CI: of the ratio of the p50s (bootstrap, 2,000 resamples of at most 20,000 of each)")
	fmt.Println()
}

// ctKeySize and ctValSize are struct ct_key's and struct ct_val's sizes
// (bpf/include/ct.h).
const (
	ctKeySize = 44
	ctValSize = 40
)

type (
	ctKeyRaw [ctKeySize]byte
	ctValRaw [ctValSize]byte
)

// fillConntrack adds n established flows of pods that do not exist to
// node's lace_ct, copied from one of its IPv4 entries with other
// addresses (100.64.0.0/10, which no lab pod has) and an hour to live; it
// returns how many entries the map then holds and what removes them.
func fillConntrack(c lab.Config, node string, n int) (int, func(), error) {
	m, err := ebpf.LoadPinnedMap(filepath.Join(c.NodeRoot(node), "sys/fs/bpf/lace/lace_ct"), nil)
	if err != nil {
		return 0, func() {}, err
	}
	if m.KeySize() != ctKeySize || m.ValueSize() != ctValSize {
		m.Close()
		return 0, func() {}, fmt.Errorf("lace_ct: key %d, value %d bytes; the benchmark knows %d and %d", m.KeySize(), m.ValueSize(), ctKeySize, ctValSize)
	}
	if n > 1<<22 {
		m.Close()
		return 0, func() {}, fmt.Errorf("%d flows: the fill's addresses (100.64.0.0/10) hold 4,194,304", n)
	}
	if int(m.MaxEntries()) < n+loadCTHeadroom {
		m.Close()
		return 0, func() {}, fmt.Errorf("lace_ct holds %d flows, %d needed: set the chart's agent.maps.conntrack to %[2]d", m.MaxEntries(), n+loadCTHeadroom)
	}
	var k ctKeyRaw
	var v ctValRaw
	var tmpl ctKeyRaw
	var tmplV ctValRaw
	found := false
	it := m.Iterate()
	for it.Next(&k, &v) {
		// family (offset 4) IPv4 (LACE_FAMILY_V4), proto (5) TCP
		if k[4] == 4 && k[5] == unix.IPPROTO_TCP {
			tmpl, tmplV, found = k, v, true
			break
		}
	}
	if !found {
		m.Close()
		return 0, func() {}, errors.New("lace_ct has no IPv4 TCP flow to copy")
	}
	var ts unix.Timespec
	if err := unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts); err != nil {
		m.Close()
		return 0, func() {}, err
	}
	binary.LittleEndian.PutUint64(tmplV[0:8], uint64(ts.Nano())+uint64(time.Hour))
	keys := make([]ctKeyRaw, 0, n)
	for i := range n {
		key := tmpl
		// laddr (offset 12) and raddr (28): 100.64.0.0/10 in the first
		// four bytes of each, as IPv4 is held.
		a := 100<<24 | 64<<16 | uint32(i)
		binary.BigEndian.PutUint32(key[12:16], a)
		binary.BigEndian.PutUint32(key[28:32], a^0x003fffff)
		keys = append(keys, key)
	}
	// One by one: a batch stops at the first key the LRU evicted.
	undo := func() {
		for i := range keys {
			_ = m.Delete(&keys[i])
		}
		m.Close()
	}
	vals := make([]ctValRaw, 10000)
	for i := range vals {
		vals[i] = tmplV
	}
	for i := 0; i < len(keys); i += 10000 {
		j := min(i+10000, len(keys))
		if _, err := m.BatchUpdate(keys[i:j], vals[:j-i], nil); err != nil {
			return 0, undo, fmt.Errorf("lace_ct: add flows: %w", err)
		}
	}
	count := 0
	it = m.Iterate()
	for it.Next(&k, &v) {
		count++
	}
	return count, undo, it.Err()
}

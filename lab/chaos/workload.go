package chaos

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"
	crclient "sigs.k8s.io/controller-runtime/pkg/client"

	lacev1 "github.com/lace-cni/lace/api/v1alpha1"
	"github.com/lace-cni/lace/internal/model"
	"github.com/lace-cni/lace/internal/netutil"
	"github.com/lace-cni/lace/lab"
	"github.com/lace-cni/lace/lab/images"
)

// The workload is what a cluster carries while faults hit it: two l3
// networks, one allowed to open flows into the other (and not back),
// servers on every node in both and in the default network behind one
// LoadBalancer Service, and clients that hold TCP streams and ask UDP
// questions across nodes, across networks, through the Service's
// ClusterIP, and from the external host through a NodePort and the VIP.
// Pods churn beside them at a fixed rate.

// Namespace holds every object of the workload.
const Namespace = "chaos"

const (
	netA, netB  = "chaos-a", "chaos-b"
	lbClass     = "chaos"
	svcName     = "chaos-web"
	httpPort    = 8080
	udpPort     = 8081
	svcTCP      = 80
	svcUDP      = 81
	labelNet    = "net"
	labelApp    = "app"
	labelRole   = "chaos-role"
	roleServer  = "server"
	roleClient  = "client"
	roleChurn   = "churn"
	roleBurst   = "burst"
	netLabelKey = "chaos"
)

// lbRange is the LoadBalancerClass's pool: fabric addresses, so the
// external host reaches the VIP through L2 announcement.
const lbRange = "172.30.0.240-172.30.0.243"

// workload is what Setup made: the pods by name and where to reach them.
type workload struct {
	h       *harness
	pods    map[string]*corev1.Pod
	nodes   []string
	web     *corev1.Service
	vip     netip.Addr
	streams []*stream
	probers []*prober
	// objects are the cluster-scoped objects setup made.
	objects []crObject
	// failover is the node the current fault took the VIP from, if any.
	failover string
	// rebooted is the node the current fault power-cycled, if any, and
	// rebootedUntil when every stream through it answered again.
	rebooted      string
	rebootedUntil time.Time
	// vipMoves is the VIP's holder over the run.
	vipMoves vipWatch

	churnMu sync.Mutex
	churned []string
	churnN  int
}

func serverPod(name, node, net, app string) *corev1.Pod {
	labels := map[string]string{labelRole: roleServer, labelApp: app}
	if net != "" {
		labels[labelNet] = net
	}
	return netexec(name, node, labels)
}

func netexec(name, node string, labels map[string]string) *corev1.Pod {
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: Namespace, Labels: labels},
		Spec: corev1.PodSpec{
			NodeName:                      node,
			TerminationGracePeriodSeconds: ptr.To[int64](1),
			Containers: []corev1.Container{{
				Name: "netexec", Image: images.AgnhostRef,
				Args:  []string{"netexec", fmt.Sprintf("--http-port=%d", httpPort), fmt.Sprintf("--udp-port=%d", udpPort)},
				Ports: []corev1.ContainerPort{{Name: "http", ContainerPort: httpPort}},
				ReadinessProbe: &corev1.Probe{
					ProbeHandler:  corev1.ProbeHandler{HTTPGet: &corev1.HTTPGetAction{Path: "/healthz", Port: intstr.FromString("http")}},
					PeriodSeconds: 2,
				},
			}},
		},
	}
}

// setup creates the workload's objects and waits until every pod runs
// and the Service answers from inside and outside.
func (h *harness) setup(ctx context.Context) (*workload, error) {
	w := &workload{h: h, pods: map[string]*corev1.Pod{}}
	for i := 1; i <= h.cfg.Nodes; i++ {
		w.nodes = append(w.nodes, h.cfg.NodeName(i))
	}
	if _, err := h.cs.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: Namespace}}, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		return nil, fmt.Errorf("create namespace %s: %w", Namespace, err)
	}
	for _, n := range []struct{ name, v4, v6, label string }{
		{netA, "10.151.0.0/16", "fd00:151::/48", "a"},
		{netB, "10.152.0.0/16", "fd00:152::/48", "b"},
	} {
		objs := []crObject{
			&lacev1.Network{ObjectMeta: metav1.ObjectMeta{Name: n.name, Labels: map[string]string{netLabelKey: n.label}}, Spec: lacev1.NetworkSpec{
				Type:       lacev1.NetworkTypeL3,
				IPv4Subnet: &lacev1.Subnet{Prefix: lacev1.CIDR(n.v4), HostLocalPrefixLength: ptr.To[int32](24)},
				IPv6Subnet: &lacev1.Subnet{Prefix: lacev1.CIDR(n.v6), HostLocalPrefixLength: ptr.To[int32](64)},
			}},
			&lacev1.NetworkBindingPolicy{ObjectMeta: metav1.ObjectMeta{Name: n.name}, Spec: lacev1.NetworkBindingPolicySpec{
				Network: n.name, Priority: 10, MatchKind: lacev1.MatchKindPod,
				Selector: &metav1.LabelSelector{MatchLabels: map[string]string{labelNet: n.name}},
			}},
		}
		for _, o := range objs {
			if err := h.c.Create(ctx, o); err != nil && !apierrors.IsAlreadyExists(err) {
				return nil, fmt.Errorf("create %s: %w", o.GetName(), err)
			}
			w.objects = append(w.objects, o)
		}
	}
	// a opens flows into b; b cannot open flows into a.
	pol := &lacev1.NetworkRoutingPolicy{ObjectMeta: metav1.ObjectMeta{Name: "chaos-a-to-b"}, Spec: lacev1.NetworkRoutingPolicySpec{
		SrcSelector:  &metav1.LabelSelector{MatchLabels: map[string]string{netLabelKey: "a"}},
		DestSelector: &metav1.LabelSelector{MatchLabels: map[string]string{netLabelKey: "b"}}}}
	class := &lacev1.LoadBalancerClass{ObjectMeta: metav1.ObjectMeta{Name: lbClass}, Spec: lacev1.LoadBalancerClassSpec{Addresses: []lacev1.AddressRange{lbRange}}}
	for _, o := range []crObject{pol, class} {
		if err := h.c.Create(ctx, o); err != nil && !apierrors.IsAlreadyExists(err) {
			return nil, fmt.Errorf("create %s: %w", o.GetName(), err)
		}
		w.objects = append(w.objects, o)
	}
	var pods []*corev1.Pod
	for _, node := range w.nodes {
		pods = append(pods,
			serverPod("srv-a-"+node, node, netA, "srv-a"),
			serverPod("srv-b-"+node, node, netB, "srv-b"),
			serverPod("web-"+node, node, "", svcName),
			netexec("cli-a-"+node, node, map[string]string{labelRole: roleClient, labelNet: netA}),
			netexec("cli-d-"+node, node, map[string]string{labelRole: roleClient}),
		)
	}
	for _, p := range pods {
		if _, err := h.cs.CoreV1().Pods(Namespace).Create(ctx, p, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
			return nil, fmt.Errorf("create pod %s: %w", p.Name, err)
		}
	}
	web := &corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: svcName, Namespace: Namespace}, Spec: corev1.ServiceSpec{
		Type: corev1.ServiceTypeLoadBalancer, LoadBalancerClass: ptr.To(lacev1.LoadBalancerClassPrefix + lbClass),
		Selector: map[string]string{labelApp: svcName},
		Ports: []corev1.ServicePort{
			{Name: "http", Port: svcTCP, TargetPort: intstr.FromInt32(httpPort), Protocol: corev1.ProtocolTCP},
			{Name: "udp", Port: svcUDP, TargetPort: intstr.FromInt32(udpPort), Protocol: corev1.ProtocolUDP},
		}}}
	if _, err := h.cs.CoreV1().Services(Namespace).Create(ctx, web, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		return nil, fmt.Errorf("create service: %w", err)
	}
	if err := until(ctx, 4*time.Minute, "workload pods ready", func() error {
		for _, p := range pods {
			got, err := h.cs.CoreV1().Pods(Namespace).Get(ctx, p.Name, metav1.GetOptions{})
			if err != nil {
				return err
			}
			if !podReady(got) {
				return fmt.Errorf("pod %s not ready", p.Name)
			}
			w.pods[p.Name] = got
		}
		return nil
	}); err != nil {
		return nil, err
	}
	if err := until(ctx, 2*time.Minute, "service addresses", func() error {
		s, err := h.cs.CoreV1().Services(Namespace).Get(ctx, svcName, metav1.GetOptions{})
		if err != nil {
			return err
		}
		vips := model.IngressAddrs(s)
		if len(vips) == 0 || s.Spec.ClusterIP == "" || s.Spec.Ports[0].NodePort == 0 || s.Spec.Ports[1].NodePort == 0 {
			return fmt.Errorf("service %s has no VIP, ClusterIP or node ports yet", svcName)
		}
		w.web, w.vip = s, vips[0]
		return nil
	}); err != nil {
		return nil, err
	}
	return w, nil
}

type crObject = crclient.Object

// podReady: ready, and not being deleted.
func podReady(p *corev1.Pod) bool { return p.DeletionTimestamp == nil && lab.PodReady(p) }

func podAddr(p *corev1.Pod, v6 bool) netip.Addr {
	for _, ip := range p.Status.PodIPs {
		if a, err := netip.ParseAddr(ip.IP); err == nil && a.Is6() == v6 {
			return a
		}
	}
	return netip.Addr{}
}

// path is where a stream or a prober sends from and to.
type path struct {
	name  string
	netns string
	dst   netip.AddrPort
	// viaVIP: the path enters through the LoadBalancer VIP.
	viaVIP bool
	// nodes are the nodes the path's pods run on (for a Service's paths,
	// every node: its endpoints are everywhere).
	nodes []string
}

// through says whether the path depends on node.
func (p path) through(node string) bool { return slices.Contains(p.nodes, node) }

// paths lists the workload's paths for protocol port (the TCP or UDP
// port of the pods, and of the Service).
func (w *workload) paths(ctx context.Context, tcp bool) ([]path, error) {
	podPort, svcPort, nodePort := uint16(udpPort), uint16(svcUDP), uint16(w.web.Spec.Ports[1].NodePort)
	if tcp {
		podPort, svcPort, nodePort = httpPort, svcTCP, uint16(w.web.Spec.Ports[0].NodePort)
	}
	var out []path
	n := len(w.nodes)
	for i, node := range w.nodes {
		next := w.nodes[(i+1)%n]
		cliA, cliD := "cli-a-"+node, "cli-d-"+node
		nsA, err := lab.PodNetNS(ctx, w.h.cfg, Namespace, cliA)
		if err != nil {
			return nil, err
		}
		nsD, err := lab.PodNetNS(ctx, w.h.cfg, Namespace, cliD)
		if err != nil {
			return nil, err
		}
		srvB, srvA := w.pods["srv-b-"+next], w.pods["srv-a-"+next]
		clusterIP := netip.MustParseAddr(w.web.Spec.ClusterIP)
		pair := []string{node, next}
		// The outside through this node's SNAT, over each family in turn.
		extV4, extV6 := lab.ExternalUnderlay()
		outPort, ext := uint16(outsideUDPPort), extV4
		if tcp {
			outPort = outsideHTTPPort
		}
		if i%2 == 1 {
			ext = extV6
		}
		out = append(out,
			path{name: cliD + "->outside", netns: nsD, dst: netip.AddrPortFrom(ext, outPort), nodes: []string{node}},
			path{name: cliA + "->" + srvB.Name, netns: nsA, dst: netip.AddrPortFrom(podAddr(srvB, false), podPort), nodes: pair},
			path{name: cliA + "->" + srvA.Name + "(v6)", netns: nsA, dst: netip.AddrPortFrom(podAddr(srvA, true), podPort), nodes: pair},
			path{name: cliD + "->service", netns: nsD, dst: netip.AddrPortFrom(clusterIP, svcPort), nodes: w.nodes},
		)
	}
	ext := netutil.Path(w.h.cfg.NetNS("external"))
	n1, _ := lab.NodeUnderlay(1)
	out = append(out,
		path{name: "external->nodeport(n1)", netns: ext, dst: netip.AddrPortFrom(n1, nodePort), nodes: w.nodes},
		path{name: "external->vip", netns: ext, dst: netip.AddrPortFrom(w.vip, svcPort), viaVIP: true, nodes: w.nodes},
	)
	return out, nil
}

// stream holds one TCP connection and asks on it every second; an error
// (a reset, or no answer within streamTimeout) is recorded, and the
// stream dials again so that it keeps measuring.
type stream struct {
	path
	mu       sync.Mutex
	asked    int
	failures []failure
	// next replaces path at the next dial (a pod of the path came back
	// in a new sandbox); conn is the connection held, closed by follow.
	next *path
	conn net.Conn
	// cancelDial ends the dial in flight.
	cancelDial context.CancelFunc
}

// follow makes the stream dial p from now on, dropping the connection it
// holds: a pod of the path came back in a new sandbox, maybe at a new
// address.
func (s *stream) follow(p path) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.next = &p
	if s.conn != nil {
		s.conn.Close()
	}
	if s.cancelDial != nil {
		s.cancelDial()
	}
}

// dialPath is the path the stream dials now.
func (s *stream) dialPath() path {
	s.mu.Lock()
	defer s.mu.Unlock()
	// Only where it goes changes: the checks read the rest unlocked.
	if s.next != nil {
		s.netns, s.dst, s.next = s.next.netns, s.next.dst, nil
	}
	return s.path
}

type failure struct {
	at  time.Time
	err string
}

// streamTimeout is how long a request on a held stream may wait: longer
// than a 30-second fabric outage plus TCP's retransmission backoff after it.
const streamTimeout = 150 * time.Second

func (s *stream) run(ctx context.Context) {
	for ctx.Err() == nil {
		p := s.dialPath()
		// follow cancels a dial to a path that moved (a SYN retried to
		// an address gone with a reboot retries for two minutes).
		dctx, cancel := context.WithCancel(ctx)
		s.mu.Lock()
		s.cancelDial = cancel
		s.mu.Unlock()
		conn, err := netutil.DialContext(dctx, p.netns, "tcp", p.dst.String())
		moved := dctx.Err() != nil && ctx.Err() == nil
		cancel()
		if moved {
			if err == nil {
				conn.Close()
			}
			continue
		}
		if err != nil {
			s.fail(ctx, "dial: "+err.Error())
			sleep(ctx, time.Second)
			continue
		}
		s.mu.Lock()
		if s.next != nil {
			// The path moved while the dial waited (a SYN retried
			// through a reboot): the old address may be another pod's
			// by now, so the connection made to it is not the path's.
			s.mu.Unlock()
			conn.Close()
			continue
		}
		s.conn = conn
		s.mu.Unlock()
		r := bufio.NewReader(conn)
		for seq := 0; ctx.Err() == nil; seq++ {
			msg := fmt.Sprintf("s%d", seq)
			if err := askHTTP(conn, r, msg); err != nil {
				if ctx.Err() == nil {
					s.fail(ctx, err.Error())
				}
				break
			}
			s.mu.Lock()
			s.asked++
			s.mu.Unlock()
			sleep(ctx, time.Second)
		}
		conn.Close()
	}
}

func (s *stream) fail(ctx context.Context, err string) {
	if ctx.Err() != nil {
		return
	}
	s.mu.Lock()
	s.failures = append(s.failures, failure{at: time.Now(), err: err})
	s.mu.Unlock()
}

// failuresSince returns the stream's failures after t.
func (s *stream) failuresSince(t time.Time) []failure {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []failure
	for _, f := range s.failures {
		if f.at.After(t) {
			out = append(out, f)
		}
	}
	return out
}

// askHTTP sends one keep-alive request to netexec's /echo and checks the
// body it answers.
func askHTTP(conn net.Conn, r *bufio.Reader, msg string) error {
	_ = conn.SetDeadline(time.Now().Add(streamTimeout))
	if _, err := fmt.Fprintf(conn, "GET /echo?msg=%s HTTP/1.1\r\nHost: chaos\r\n\r\n", msg); err != nil {
		return fmt.Errorf("send %s: %w", msg, err)
	}
	length := -1
	for {
		line, err := r.ReadString('\n')
		if err != nil {
			return fmt.Errorf("answer to %s: %w", msg, err)
		}
		if v, ok := strings.CutPrefix(strings.ToLower(line), "content-length:"); ok {
			fmt.Sscanf(strings.TrimSpace(v), "%d", &length)
		}
		if line == "\r\n" {
			break
		}
	}
	if length < 0 {
		return fmt.Errorf("answer to %s without a length", msg)
	}
	body := make([]byte, length)
	if _, err := io.ReadFull(r, body); err != nil || string(body) != msg {
		return fmt.Errorf("echo %s: got %q (%v)", msg, body, err)
	}
	return nil
}

// prober asks a UDP question every probeEvery on one connected socket
// (one conntrack flow for the run) and counts the answers.
type prober struct {
	path
	mu               sync.Mutex
	sent, answered   int
	winSent, winLost int
	// next replaces path at the next question, on a new socket.
	next *path
}

func (p *prober) follow(np path) {
	p.mu.Lock()
	p.next = &np
	p.mu.Unlock()
}

// moved takes the path to follow, if any.
func (p *prober) moved() (path, bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.next == nil {
		return path{}, false
	}
	p.netns, p.dst, p.next = p.next.netns, p.next.dst, nil
	return p.path, true
}

const (
	probeEvery   = 500 * time.Millisecond
	probeTimeout = 2 * time.Second
)

func (p *prober) run(ctx context.Context) {
	var conn net.Conn
	defer func() {
		if conn != nil {
			conn.Close()
		}
	}()
	buf := make([]byte, 256)
	cur := p.path
	for seq := 0; ctx.Err() == nil; seq++ {
		if np, ok := p.moved(); ok {
			cur = np
			if conn != nil {
				conn.Close()
				conn = nil
			}
		}
		if conn == nil {
			var err error
			if conn, err = netutil.DialContext(ctx, cur.netns, "udp", cur.dst.String()); err != nil {
				p.count(false)
				sleep(ctx, probeEvery)
				continue
			}
		}
		start := time.Now()
		msg := fmt.Sprintf("q%d", seq)
		_ = conn.SetDeadline(start.Add(probeTimeout))
		ok := false
		if _, err := fmt.Fprintf(conn, "echo %s", msg); err == nil {
			// Late answers to earlier questions are skipped.
			for {
				n, err := conn.Read(buf)
				if err != nil {
					break
				}
				if string(buf[:n]) == msg {
					ok = true
					break
				}
			}
		}
		p.count(ok)
		sleep(ctx, probeEvery-time.Since(start))
	}
}

func (p *prober) count(ok bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.sent++
	p.winSent++
	if ok {
		p.answered++
	} else {
		p.winLost++
	}
}

// window returns what was sent and lost since the last call, and starts
// a new window.
func (p *prober) window() (sent, lost int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	sent, lost = p.winSent, p.winLost
	p.winSent, p.winLost = 0, 0
	return sent, lost
}

// start runs the streams and probers until ctx ends.
func (w *workload) start(ctx context.Context, wg *sync.WaitGroup) error {
	if err := serveOutside(ctx, netutil.Path(w.h.cfg.NetNS("external")), wg); err != nil {
		return err
	}
	tcp, err := w.paths(ctx, true)
	if err != nil {
		return err
	}
	udp, err := w.paths(ctx, false)
	if err != nil {
		return err
	}
	for _, p := range tcp {
		s := &stream{path: p}
		w.streams = append(w.streams, s)
		wg.Add(1)
		go func() { defer wg.Done(); s.run(ctx) }()
	}
	for _, p := range udp {
		pr := &prober{path: p}
		w.probers = append(w.probers, pr)
		wg.Add(1)
		go func() { defer wg.Done(); pr.run(ctx) }()
	}
	wg.Add(2)
	go func() { defer wg.Done(); w.churn(ctx) }()
	go func() { defer wg.Done(); w.vipMoves.run(ctx, w) }()
	return nil
}

// churnEvery is the fixed rate of pod churn: one pod created every
// period, the oldest deleted once churnKeep exist.
const (
	churnEvery = 3 * time.Second
	churnKeep  = 6
)

// churn creates and deletes pods at a fixed rate on random nodes, in the
// default network and in chaos-a. API errors (an outage) skip a beat.
func (w *workload) churn(ctx context.Context) {
	rng := rand.New(rand.NewPCG(w.h.seed, 0xc4a05))
	t := time.NewTicker(churnEvery)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		w.churnMu.Lock()
		w.churnN++
		name := fmt.Sprintf("churn-%d", w.churnN)
		w.churnMu.Unlock()
		labels := map[string]string{labelRole: roleChurn}
		if rng.IntN(2) == 0 {
			labels[labelNet] = netA
		}
		p := netexec(name, w.nodes[rng.IntN(len(w.nodes))], labels)
		p.Spec.Containers[0].ReadinessProbe = nil
		cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		_, err := w.h.cs.CoreV1().Pods(Namespace).Create(cctx, p, metav1.CreateOptions{})
		cancel()
		if err != nil {
			continue
		}
		w.churnMu.Lock()
		w.churned = append(w.churned, name)
		var old string
		if len(w.churned) > churnKeep {
			old, w.churned = w.churned[0], w.churned[1:]
		}
		w.churnMu.Unlock()
		if old != "" {
			cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
			if err := w.h.cs.CoreV1().Pods(Namespace).Delete(cctx, old, metav1.DeleteOptions{GracePeriodSeconds: ptr.To[int64](0)}); err != nil && !apierrors.IsNotFound(err) {
				// Deleted at the next beat instead.
				w.churnMu.Lock()
				w.churned = append([]string{old}, w.churned...)
				w.churnMu.Unlock()
			}
			cancel()
		}
	}
}

func sleep(ctx context.Context, d time.Duration) {
	if d <= 0 {
		return
	}
	select {
	case <-ctx.Done():
	case <-time.After(d):
	}
}

// until polls f every 500 ms until it succeeds or within ends.
func until(ctx context.Context, within time.Duration, what string, f func() error) error {
	deadline := time.Now().Add(within)
	for {
		err := f()
		if err == nil {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%s not reached within %s: %w", what, within, err)
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%s: %w (last: %v)", what, ctx.Err(), err)
		case <-time.After(500 * time.Millisecond):
		}
	}
}

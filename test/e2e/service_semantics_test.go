package e2e

// One lab test per kube-proxy (v1.34, nftables mode) semantic that Lace's
// service data plane must reproduce, in both families where it applies.
// Each test waits for convergence on real observables (EndpointSlice
// contents, then the client node's service table), then asserts traffic
// strictly: a fixed number of requests, none of which may go astray.
// "Unreachable" is a timeout plus the expected drop counter moving.

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/util/retry"
	"k8s.io/utils/ptr"

	"github.com/lace-cni/lace/internal/datapath"
	"github.com/lace-cni/lace/internal/netutil"
	"github.com/lace-cni/lace/internal/tables"
)

const (
	semTCP uint8 = 6
	semUDP uint8 = 17
)

// semPod is a netexec pod (HTTP 8080, UDP 8081, ready while /healthz
// answers) in the default network, labelled app=<app>, on node.
func semPod(name, app, node string) *corev1.Pod {
	p := netexecPod(name, node)
	p.Labels["net"], p.Labels["app"] = "default", app
	return p
}

// semDelayedShutdown makes p keep serving for 60 s after SIGTERM, within a
// longer grace period: deleted, it is a terminating endpoint that still
// serves (its /healthz readiness keeps answering).
func semDelayedShutdown(p *corev1.Pod) *corev1.Pod {
	p.Spec.TerminationGracePeriodSeconds = ptr.To[int64](90)
	p.Spec.Containers[0].Args = append(p.Spec.Containers[0].Args, "--delay-shutdown=60")
	return p
}

// semSecondPort adds a second netexec to p on HTTP 8090 (answering
// "<pod>:8090" to any request) and UDP 8091.
func semSecondPort(p *corev1.Pod) *corev1.Pod {
	p.Spec.Containers = append(p.Spec.Containers, corev1.Container{
		Name: "alt", Image: agnhost,
		Args: []string{"netexec", "--http-port=8090", "--udp-port=8091", "--http-override=/echo?msg=" + p.Name + ":8090"},
	})
	return p
}

// semStart creates the pods all at once, deletes them when the test ends,
// and waits until each is Ready.
func semStart(t *testing.T, pods ...*corev1.Pod) map[string]*corev1.Pod {
	t.Helper()
	for _, p := range pods {
		if _, err := client.CoreV1().Pods("default").Create(context.Background(), p, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		name := p.Name
		t.Cleanup(func() { semDelete(name, ptr.To[int64](0)) })
	}
	out := map[string]*corev1.Pod{}
	for _, p := range pods {
		out[p.Name] = waitPodReady(t, "default", p.Name)
	}
	return out
}

// semDelete deletes a pod, with its own grace period when grace is nil.
func semDelete(name string, grace *int64) {
	_ = client.CoreV1().Pods("default").Delete(context.Background(), name, metav1.DeleteOptions{GracePeriodSeconds: grace})
}

// semService creates a RequireDualStack ClusterIP service selecting
// app=<app> (port 80 -> 8080/TCP "http", 81 -> 8081/UDP "udp"), changed by
// edit before it is created, and deletes it when the test ends.
func semService(t *testing.T, name, app string, edit func(*corev1.Service)) *corev1.Service {
	t.Helper()
	svc := &corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: name}, Spec: corev1.ServiceSpec{
		Selector:       map[string]string{"app": app},
		IPFamilyPolicy: ptr.To(corev1.IPFamilyPolicyRequireDualStack),
		Ports: []corev1.ServicePort{
			{Name: "http", Port: 80, TargetPort: intstr.FromInt32(8080), Protocol: corev1.ProtocolTCP},
			{Name: "udp", Port: 81, TargetPort: intstr.FromInt32(8081), Protocol: corev1.ProtocolUDP},
		},
	}}
	if edit != nil {
		edit(svc)
	}
	created, err := client.CoreV1().Services("default").Create(context.Background(), svc, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = client.CoreV1().Services("default").Delete(context.Background(), name, metav1.DeleteOptions{})
	})
	if created.Spec.Type == corev1.ServiceTypeClusterIP && created.Spec.ClusterIP != corev1.ClusterIPNone && len(created.Spec.ClusterIPs) != 2 {
		t.Fatalf("service %s got ClusterIPs %v, want one per family", name, created.Spec.ClusterIPs)
	}
	return created
}

// semUpdateService applies edit to the current service, retrying on
// conflicts, and returns the result.
func semUpdateService(t *testing.T, name string, edit func(*corev1.Service)) *corev1.Service {
	t.Helper()
	var out *corev1.Service
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		svc, err := client.CoreV1().Services("default").Get(context.Background(), name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		edit(svc)
		out, err = client.CoreV1().Services("default").Update(context.Background(), svc, metav1.UpdateOptions{})
		return err
	})
	if err != nil {
		t.Fatalf("update service %s: %v", name, err)
	}
	return out
}

// semEndpoints returns the endpoints of service name's EndpointSlices per
// address family, by the pod they point to.
func semEndpoints(name string) (map[discoveryv1.AddressType]map[string]discoveryv1.Endpoint, error) {
	l, err := client.DiscoveryV1().EndpointSlices("default").List(context.Background(),
		metav1.ListOptions{LabelSelector: discoveryv1.LabelServiceName + "=" + name})
	if err != nil {
		return nil, err
	}
	out := map[discoveryv1.AddressType]map[string]discoveryv1.Endpoint{
		discoveryv1.AddressTypeIPv4: {}, discoveryv1.AddressTypeIPv6: {}}
	for _, s := range l.Items {
		if out[s.AddressType] == nil {
			continue
		}
		for _, e := range s.Endpoints {
			key := strings.Join(e.Addresses, ",")
			if e.TargetRef != nil {
				key = e.TargetRef.Name
			}
			out[s.AddressType][key] = e
		}
	}
	return out, nil
}

// semCond describes an endpoint's conditions and hints, for messages and
// comparisons.
func semCond(e discoveryv1.Endpoint) string {
	b := func(p *bool) string {
		if p == nil {
			return "nil"
		}
		return fmt.Sprint(*p)
	}
	s := fmt.Sprintf("ready=%s serving=%s terminating=%s", b(e.Conditions.Ready), b(e.Conditions.Serving), b(e.Conditions.Terminating))
	if h := e.Hints; h != nil {
		var z, n []string
		for _, x := range h.ForZones {
			z = append(z, x.Name)
		}
		for _, x := range h.ForNodes {
			n = append(n, x.Name)
		}
		s += fmt.Sprintf(" forZones=%v forNodes=%v", z, n)
	}
	return s
}

// waitSlices waits until, in both families, service name's endpoints are
// exactly the pods of want, each with the conditions (and hints) want
// gives it (as semCond writes them).
func waitSlices(t *testing.T, name string, want map[string]string) {
	t.Helper()
	eventually(t, 30*time.Second, "EndpointSlices of "+name, func() error {
		eps, err := semEndpoints(name)
		if err != nil {
			return err
		}
		for fam, byPod := range eps {
			got := map[string]string{}
			for pod, e := range byPod {
				got[pod] = semCond(e)
			}
			if fmt.Sprint(got) != fmt.Sprint(want) {
				return fmt.Errorf("%s endpoints %v, want %v", fam, got, want)
			}
		}
		return nil
	})
}

// semTable reads the service table of node's data plane.
func semTable(node string) ([]datapath.Service, error) {
	dp, err := datapath.Load(filepath.Join(labConfig().NodeRoot(node), "sys/fs/bpf/lace"))
	if err != nil {
		return nil, fmt.Errorf("open the data plane of %s: %w", node, err)
	}
	defer dp.Close()
	return dp.Services()
}

func semEntry(table []datapath.Service, vip netip.Addr, proto uint8, port uint16) *datapath.Service {
	for i := range table {
		if s := &table[i]; s.VIP == vip && s.Proto == proto && s.Port == port {
			return s
		}
	}
	return nil
}

func semDescribe(s *datapath.Service) string {
	if s == nil {
		return "no entry"
	}
	var bs []string
	for _, b := range s.Backends {
		bs = append(bs, netip.AddrPortFrom(b.Addr, b.Port).String())
	}
	return fmt.Sprintf("backends %v drop=%v affinity=%ds", bs, s.Drop, s.AffinitySeconds)
}

// waitServing waits until node's data plane serves proto/port on every VIP
// of svc with exactly the given pods as backends, on port bport; with no
// pods, with no backend and the drop flag as given (drop: internal traffic
// policy Local without a local endpoint; else rejected).
func waitServing(t *testing.T, node string, svc *corev1.Service, proto uint8, port, bport uint16, drop bool, pods ...*corev1.Pod) {
	t.Helper()
	var names []string
	for _, p := range pods {
		names = append(names, p.Name)
	}
	eventually(t, 30*time.Second, fmt.Sprintf("%s serving %s %d/%d with backends %v", node, svc.Name, port, proto, names), func() error {
		table, err := semTable(node)
		if err != nil {
			return err
		}
		for _, vip := range clusterIPs(svc) {
			var want []string
			for _, p := range pods {
				v4, v6 := podAddrs(p)
				a := v4
				if vip.Is6() {
					a = v6
				}
				want = append(want, netip.AddrPortFrom(a, bport).String())
			}
			e := semEntry(table, vip, proto, port)
			if e == nil {
				return fmt.Errorf("%s:%d: no entry", vip, port)
			}
			var got []string
			for _, b := range e.Backends {
				got = append(got, netip.AddrPortFrom(b.Addr, b.Port).String())
			}
			sort.Strings(got)
			sort.Strings(want)
			if !slices.Equal(got, want) || e.Drop != (drop && len(pods) == 0) {
				return fmt.Errorf("%s:%d: %s, want backends %v (%v) drop=%v", vip, port, semDescribe(e), want, names, drop)
			}
		}
		return nil
	})
}

// waitNotServing waits until node's data plane has no entry for proto/port
// on any VIP of svc.
func waitNotServing(t *testing.T, node string, svc *corev1.Service, proto uint8, port uint16) {
	t.Helper()
	eventually(t, 30*time.Second, fmt.Sprintf("%s no longer serving %s %d/%d", node, svc.Name, port, proto), func() error {
		table, err := semTable(node)
		if err != nil {
			return err
		}
		for _, vip := range clusterIPs(svc) {
			if e := semEntry(table, vip, proto, port); e != nil {
				return fmt.Errorf("%s:%d: %s", vip, port, semDescribe(e))
			}
		}
		return nil
	})
}

// semClient is a pod sending requests from its own network namespace.
type semClient struct {
	name, ns string
	pod      *corev1.Pod
}

func semClientOf(t *testing.T, p *corev1.Pod) semClient {
	return semClient{name: p.Name, ns: podNetNS(t, p), pod: p}
}

// semViewEntry describes, for a failure message, the entry of c's network's
// view on node that decides a new flow to dst (longest prefix).
func semViewEntry(node string, c semClient, dst netip.Addr) string {
	dp, err := datapath.Load(filepath.Join(labConfig().NodeRoot(node), "sys/fs/bpf/lace"))
	if err != nil {
		return err.Error()
	}
	defer dp.Close()
	v4, v6 := podAddrs(c.pod)
	src := v4
	if dst.Is6() {
		src = v6
	}
	eps, err := dp.Endpoints()
	if err != nil {
		return err.Error()
	}
	var netID uint32
	for _, e := range eps {
		if e.Addr == src {
			netID = e.NetID
		}
	}
	routes, err := dp.Routes()
	if err != nil {
		return err.Error()
	}
	var best *tables.Route
	for i, r := range routes {
		if r.NetID == netID && r.Prefix.Contains(dst) && (best == nil || r.Prefix.Bits() > best.Prefix.Bits()) {
			best = &routes[i]
		}
	}
	if best == nil {
		return fmt.Sprintf("no entry for %s in the view of network %d on %s", dst, netID, node)
	}
	kinds := map[tables.RouteKind]string{tables.RouteRemote: "remote", tables.RouteLocal: "local", tables.RouteSubnet: "subnet",
		tables.RouteExternal: "external", tables.RouteDeny: "deny", tables.RouteService: "service"}
	return fmt.Sprintf("%s in the view of network %d on %s: %s %s (to network %d)", dst, netID, node, kinds[best.Kind], best.Prefix, best.DstNet)
}

// semMoved lists the drop counters that moved between two readings.
func semMoved(before, after map[string]uint64) map[string]uint64 {
	out := map[string]uint64{}
	for k, v := range after {
		if v != before[k] {
			out[k] = v - before[k]
		}
	}
	return out
}

// semAsk sends one request from namespace ns to ap, on a new connection
// or socket: an HTTP GET of path req over TCP, or datagram req over UDP
// (three tries); it returns the answer's body.
func semAsk(ns, proto string, ap netip.AddrPort, req string) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	conn, err := netutil.DialContext(ctx, ns, proto, ap.String())
	if err != nil {
		return "", err
	}
	defer conn.Close()
	if proto == "udp" {
		buf := make([]byte, 256)
		for range 3 {
			_ = conn.SetDeadline(time.Now().Add(600 * time.Millisecond))
			if _, err := conn.Write([]byte(req)); err != nil {
				return "", err
			}
			if n, err := conn.Read(buf); err == nil {
				return strings.TrimSpace(string(buf[:n])), nil
			} else if !isTimeout(err) {
				return "", err
			}
		}
		return "", fmt.Errorf("no UDP answer from %s", ap)
	}
	_ = conn.SetDeadline(time.Now().Add(2 * time.Second))
	fmt.Fprintf(conn, "GET %s HTTP/1.0\r\nHost: e2e\r\n\r\n", req)
	b, err := io.ReadAll(conn)
	if err != nil {
		return "", err
	}
	head, body, _ := strings.Cut(string(b), "\r\n\r\n")
	if !strings.HasPrefix(head, "HTTP/1.1 200") && !strings.HasPrefix(head, "HTTP/1.0 200") {
		return "", fmt.Errorf("HTTP answer %q", strings.SplitN(head, "\r\n", 2)[0])
	}
	return strings.TrimSpace(body), nil
}

// semReq is the request netexec answers with its hostname.
func semReq(proto string) string {
	if proto == "udp" {
		return "hostname"
	}
	return "/hostname"
}

// expectAnswers waits until c's first request to ap is answered by one of
// want, then sends n more requests: every one must be answered by one of
// want, and (with all) every one of want must answer. It returns how
// often each answered.
func expectAnswers(t *testing.T, c semClient, proto string, ap netip.AddrPort, req string, n int, all bool, want ...string) map[string]int {
	t.Helper()
	what := fmt.Sprintf("%s %s -> %s (%q)", proto, c.name, ap, req)
	eventually(t, 15*time.Second, what+" answered by one of "+fmt.Sprint(want), func() error {
		got, err := semAsk(c.ns, proto, ap, req)
		if err != nil {
			return err
		}
		if !slices.Contains(want, got) {
			return fmt.Errorf("answered by %q", got)
		}
		return nil
	})
	seen := map[string]int{}
	var errs []string
	for range n {
		got, err := semAsk(c.ns, proto, ap, req)
		switch {
		case err != nil:
			errs = append(errs, err.Error())
		default:
			seen[got]++
		}
	}
	bad := len(errs) > 0
	for k := range seen {
		bad = bad || !slices.Contains(want, k)
	}
	if all {
		for _, w := range want {
			bad = bad || seen[w] == 0
		}
	}
	if bad {
		t.Errorf("%s: over %d requests answered %v (errors %v), want only %v%s", what, n, seen, errs, want,
			map[bool]string{true: ", each of them", false: ""}[all])
	}
	return seen
}

// semProbe is one request: a protocol to a VIP and port.
type semProbe struct {
	proto string
	ap    netip.AddrPort
}

func (p semProbe) String() string { return p.proto + " " + p.ap.String() }

// semProbes returns a probe per VIP of svc: TCP to tcpPort and UDP to
// udpPort (0 leaves the protocol out).
func semProbes(svc *corev1.Service, tcpPort, udpPort uint16) []semProbe {
	var out []semProbe
	for _, vip := range clusterIPs(svc) {
		if tcpPort != 0 {
			out = append(out, semProbe{"tcp", netip.AddrPortFrom(vip, tcpPort)})
		}
		if udpPort != 0 {
			out = append(out, semProbe{"udp", netip.AddrPortFrom(vip, udpPort)})
		}
	}
	return out
}

// semSilent sends one request (a TCP connect, or a UDP datagram) and
// returns nil only when nothing at all comes back before the deadline.
func semSilent(ns string, p semProbe) error { return silent(context.Background(), ns, p.proto, p.ap) }

// expectVerdict runs the probes from c at once, each checked by check, and
// then wants node's drop counter reason to have grown by at least one per
// probe.
func expectVerdict(t *testing.T, c semClient, node, reason, want string, check func(semProbe) error, probes []semProbe) {
	t.Helper()
	before := nodeDrops(t, node)
	if _, ok := before[reason]; !ok {
		t.Fatalf("node %s has no drop counter %q (it has %v)", node, reason, before)
	}
	var wg sync.WaitGroup
	errs := make([]error, len(probes))
	for i, p := range probes {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[i] = check(p)
		}()
	}
	wg.Wait()
	for i, p := range probes {
		if errs[i] != nil {
			t.Errorf("%s %s -> %s: %v; want %s", p.proto, c.name, p.ap, errs[i], want)
		}
	}
	after := nodeDrops(t, node)
	if after[reason] < before[reason]+uint64(len(probes)) {
		var views []string
		for _, p := range probes {
			views = append(views, semViewEntry(node, c, p.ap.Addr()))
		}
		slices.Sort(views)
		t.Errorf("%s -> %v: drop counter %q on %s moved %d -> %d, want at least +%d; the counters that moved: %v; %v",
			c.name, probes, reason, node, before[reason], after[reason], len(probes), semMoved(before, after), slices.Compact(views))
	}
}

// expectSilent: every probe times out and node counts it under reason.
func expectSilent(t *testing.T, c semClient, node, reason string, probes ...semProbe) {
	t.Helper()
	expectVerdict(t, c, node, reason, "no answer (a timeout)", func(p semProbe) error { return semSilent(c.ns, p) }, probes)
}

// expectRefused: every probe is refused (TCP connection refused, UDP ICMP
// port unreachable) and node counts it under reason.
func expectRefused(t *testing.T, c semClient, node, reason string, probes ...semProbe) {
	t.Helper()
	expectVerdict(t, c, node, reason, "connection refused", func(p semProbe) error {
		got, err := semAsk(c.ns, p.proto, p.ap, semReq(p.proto))
		if errors.Is(err, syscall.ECONNREFUSED) {
			return nil
		}
		if err == nil {
			return fmt.Errorf("answered by %q", got)
		}
		return err
	}, probes)
}

// expectOnly checks, for every VIP of svc over TCP tcpPort and UDP udpPort,
// that c's requests are answered only by want and by each of them.
func expectOnly(t *testing.T, c semClient, svc *corev1.Service, tcpPort, udpPort uint16, want ...string) {
	t.Helper()
	for _, p := range semProbes(svc, tcpPort, udpPort) {
		expectAnswers(t, c, p.proto, p.ap, semReq(p.proto), 8*len(want), true, want...)
	}
}

// semZones returns each node's zone, checking the lab's premise: n1 and n3
// share a zone, n2 is in another.
func semZones(t *testing.T) map[string]string {
	t.Helper()
	nodes, err := client.CoreV1().Nodes().List(context.Background(), metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	z := map[string]string{}
	for _, n := range nodes.Items {
		z[n.Name] = n.Labels[corev1.LabelTopologyZone]
	}
	if z["n1"] == "" || z["n1"] != z["n3"] || z["n2"] == z["n1"] {
		t.Fatalf("node zones %v: want n1 and n3 in one zone, n2 in another", z)
	}
	return z
}

// TestServiceInternalTrafficPolicyLocal: internalTrafficPolicy Local with
// its only endpoint on n2 is served to a client on n2 (TCP and UDP, both
// families); a client on n1 gets nothing (dropped, not rejected: kube-proxy
// drops when the endpoints are all elsewhere) and n1 counts it under
// no-local-endpoints.
func TestServiceInternalTrafficPolicyLocal(t *testing.T) {
	needLab(t)
	pods := semStart(t, semPod("sem-itp-be", "sem-itp", "n2"), semPod("sem-itp-c1", "sem-itp-c1", "n1"),
		semPod("sem-itp-c2", "sem-itp-c2", "n2"))
	svc := semService(t, "sem-itp", "sem-itp", func(s *corev1.Service) {
		s.Spec.InternalTrafficPolicy = ptr.To(corev1.ServiceInternalTrafficPolicyLocal)
	})
	waitSlices(t, svc.Name, map[string]string{"sem-itp-be": "ready=true serving=true terminating=false"})
	be := pods["sem-itp-be"]
	waitServing(t, "n2", svc, semTCP, 80, 8080, false, be)
	waitServing(t, "n2", svc, semUDP, 81, 8081, false, be)
	waitServing(t, "n1", svc, semTCP, 80, 8080, true)
	waitServing(t, "n1", svc, semUDP, 81, 8081, true)

	expectOnly(t, semClientOf(t, pods["sem-itp-c2"]), svc, 80, 81, "sem-itp-be")
	expectSilent(t, semClientOf(t, pods["sem-itp-c1"]), "n1", "no-local-endpoints", semProbes(svc, 80, 81)...)
}

// TestServiceTerminatingEndpoints: of two endpoints A and B, B is deleted
// and keeps serving while it terminates: only the ready A is used. Then A
// is deleted too: with no ready endpoint left, the serving terminating
// ones (both) are used, as kube-proxy does.
func TestServiceTerminatingEndpoints(t *testing.T) {
	needLab(t)
	pods := semStart(t, semDelayedShutdown(semPod("sem-term-a", "sem-term", "n1")),
		semDelayedShutdown(semPod("sem-term-b", "sem-term", "n2")), semPod("sem-term-c", "sem-term-c", "n3"))
	a, b := pods["sem-term-a"], pods["sem-term-b"]
	c := semClientOf(t, pods["sem-term-c"])
	svc := semService(t, "sem-term", "sem-term", nil)
	const ready, terminating = "ready=true serving=true terminating=false", "ready=false serving=true terminating=true"
	waitSlices(t, svc.Name, map[string]string{"sem-term-a": ready, "sem-term-b": ready})
	waitServing(t, "n3", svc, semTCP, 80, 8080, false, a, b)
	waitServing(t, "n3", svc, semUDP, 81, 8081, false, a, b)
	expectOnly(t, c, svc, 80, 81, "sem-term-a", "sem-term-b")

	semDelete("sem-term-b", nil)
	waitSlices(t, svc.Name, map[string]string{"sem-term-a": ready, "sem-term-b": terminating})
	waitServing(t, "n3", svc, semTCP, 80, 8080, false, a)
	waitServing(t, "n3", svc, semUDP, 81, 8081, false, a)
	expectOnly(t, c, svc, 80, 81, "sem-term-a")

	semDelete("sem-term-a", nil)
	waitSlices(t, svc.Name, map[string]string{"sem-term-a": terminating, "sem-term-b": terminating})
	waitServing(t, "n3", svc, semTCP, 80, 8080, false, a, b)
	waitServing(t, "n3", svc, semUDP, 81, 8081, false, a, b)
	expectOnly(t, c, svc, 80, 81, "sem-term-a", "sem-term-b")
}

// TestServiceTrafficDistribution: spec.trafficDistribution, through the
// hints the EndpointSlice controller writes. PreferClose (zone hints): a
// client in zone-a (n1) reaches only the zone-a endpoints (n1, n3), a
// client in zone-b (n2) only n2's. PreferSameNode (node and zone hints):
// each client reaches only its own node's endpoint; once n1's endpoint is
// gone no endpoint is hinted for n1, and n1 falls back to the zone hints
// (n3's endpoint).
func TestServiceTrafficDistribution(t *testing.T) {
	needLab(t)
	zone := semZones(t)
	pods := semStart(t, semPod("sem-td-n1", "sem-td", "n1"), semPod("sem-td-n2", "sem-td", "n2"),
		semPod("sem-td-n3", "sem-td", "n3"), semPod("sem-td-c1", "sem-td-c1", "n1"), semPod("sem-td-c2", "sem-td-c2", "n2"))
	c1, c2 := semClientOf(t, pods["sem-td-c1"]), semClientOf(t, pods["sem-td-c2"])
	svc := semService(t, "sem-td", "sem-td", func(s *corev1.Service) {
		s.Spec.TrafficDistribution = ptr.To(corev1.ServiceTrafficDistributionPreferClose)
	})
	hinted := func(nodeHints bool, nodes ...string) map[string]string {
		out := map[string]string{}
		for _, n := range nodes {
			out["sem-td-"+n] = fmt.Sprintf("ready=true serving=true terminating=false forZones=[%s] forNodes=[]", zone[n])
			if nodeHints {
				out["sem-td-"+n] = fmt.Sprintf("ready=true serving=true terminating=false forZones=[%s] forNodes=[%s]", zone[n], n)
			}
		}
		return out
	}
	waitSlices(t, svc.Name, hinted(false, "n1", "n2", "n3"))
	check := func(node string, c semClient, backends ...string) {
		t.Helper()
		var ps []*corev1.Pod
		for _, b := range backends {
			ps = append(ps, pods[b])
		}
		waitServing(t, node, svc, semTCP, 80, 8080, false, ps...)
		waitServing(t, node, svc, semUDP, 81, 8081, false, ps...)
		expectOnly(t, c, svc, 80, 81, backends...)
	}
	check("n1", c1, "sem-td-n1", "sem-td-n3")
	check("n2", c2, "sem-td-n2")

	semUpdateService(t, svc.Name, func(s *corev1.Service) {
		s.Spec.TrafficDistribution = ptr.To(corev1.ServiceTrafficDistributionPreferSameNode)
	})
	waitSlices(t, svc.Name, hinted(true, "n1", "n2", "n3"))
	check("n1", c1, "sem-td-n1")
	check("n2", c2, "sem-td-n2")

	semDelete("sem-td-n1", ptr.To[int64](0))
	waitSlices(t, svc.Name, hinted(true, "n2", "n3"))
	check("n1", c1, "sem-td-n3")
}

// TestServicePreferClosest: the lace-cni.io/traffic-distribution:
// PreferClosest annotation, for a client on n1: its node's endpoint only;
// once that is gone, its zone's (n3); once that is gone, the rest of the
// cluster (n2).
func TestServicePreferClosest(t *testing.T) {
	needLab(t)
	semZones(t)
	pods := semStart(t, semPod("sem-pc-n1", "sem-pc", "n1"), semPod("sem-pc-n2", "sem-pc", "n2"),
		semPod("sem-pc-n3", "sem-pc", "n3"), semPod("sem-pc-c", "sem-pc-c", "n1"))
	c := semClientOf(t, pods["sem-pc-c"])
	svc := semService(t, "sem-pc", "sem-pc", func(s *corev1.Service) {
		s.Annotations = map[string]string{"lace-cni.io/traffic-distribution": "PreferClosest"}
	})
	const ready = "ready=true serving=true terminating=false"
	waitSlices(t, svc.Name, map[string]string{"sem-pc-n1": ready, "sem-pc-n2": ready, "sem-pc-n3": ready})
	for _, step := range []struct {
		deleted, tier string
	}{{"", "sem-pc-n1"}, {"sem-pc-n1", "sem-pc-n3"}, {"sem-pc-n3", "sem-pc-n2"}} {
		if step.deleted != "" {
			semDelete(step.deleted, ptr.To[int64](0))
			eventually(t, 30*time.Second, step.deleted+" out of the EndpointSlices", func() error {
				eps, err := semEndpoints(svc.Name)
				if err != nil {
					return err
				}
				for fam, byPod := range eps {
					if _, ok := byPod[step.deleted]; ok {
						return fmt.Errorf("still an %s endpoint", fam)
					}
				}
				return nil
			})
		}
		waitServing(t, "n1", svc, semTCP, 80, 8080, false, pods[step.tier])
		waitServing(t, "n1", svc, semUDP, 81, 8081, false, pods[step.tier])
		expectOnly(t, c, svc, 80, 81, step.tier)
	}
}

// TestServiceSessionAffinity: sessionAffinity ClientIP (30 s): every new
// connection and socket of one client reaches one endpoint per service
// port and family; once the endpoint a client sticks to is deleted, that
// client moves to another and sticks to it, and the others stay where they
// were.
func TestServiceSessionAffinity(t *testing.T) {
	needLab(t)
	pods := semStart(t, semPod("sem-sa-n1", "sem-sa", "n1"), semPod("sem-sa-n2", "sem-sa", "n2"),
		semPod("sem-sa-n3", "sem-sa", "n3"), semPod("sem-sa-c", "sem-sa-c", "n1"))
	c := semClientOf(t, pods["sem-sa-c"])
	svc := semService(t, "sem-sa", "sem-sa", func(s *corev1.Service) {
		s.Spec.SessionAffinity = corev1.ServiceAffinityClientIP
		s.Spec.SessionAffinityConfig = &corev1.SessionAffinityConfig{ClientIP: &corev1.ClientIPConfig{TimeoutSeconds: ptr.To[int32](30)}}
	})
	backends := []string{"sem-sa-n1", "sem-sa-n2", "sem-sa-n3"}
	waitServingAffinity := func(ps ...*corev1.Pod) {
		t.Helper()
		waitServing(t, "n1", svc, semTCP, 80, 8080, false, ps...)
		waitServing(t, "n1", svc, semUDP, 81, 8081, false, ps...)
		table, err := semTable("n1")
		if err != nil {
			t.Fatal(err)
		}
		for _, p := range semProbes(svc, 80, 81) {
			proto := map[string]uint8{"tcp": semTCP, "udp": semUDP}[p.proto]
			if e := semEntry(table, p.ap.Addr(), proto, p.ap.Port()); e == nil || e.AffinitySeconds != 30 {
				t.Fatalf("%s %s on n1: %s, want affinity 30 s", p.proto, p.ap, semDescribe(e))
			}
		}
	}
	waitServingAffinity(pods["sem-sa-n1"], pods["sem-sa-n2"], pods["sem-sa-n3"])
	sticky := func(p semProbe, want []string) string {
		t.Helper()
		seen := expectAnswers(t, c, p.proto, p.ap, semReq(p.proto), 20, false, want...)
		if len(seen) != 1 {
			t.Errorf("%s %s: answered by %v over 20 new flows, want one endpoint (ClientIP affinity)", p.proto, p.ap, seen)
		}
		for k := range seen {
			return k
		}
		return ""
	}
	stuck := map[semProbe]string{}
	for _, p := range semProbes(svc, 80, 81) {
		stuck[p] = sticky(p, backends)
	}
	first := semProbes(svc, 80, 81)[0]
	gone := stuck[first]
	if gone == "" {
		t.Fatal("no endpoint to delete")
	}
	semDelete(gone, ptr.To[int64](0))
	var left []*corev1.Pod
	var leftNames []string
	for _, b := range backends {
		if b != gone {
			left, leftNames = append(left, pods[b]), append(leftNames, b)
		}
	}
	waitServingAffinity(left...)
	for _, p := range semProbes(svc, 80, 81) {
		now := sticky(p, leftNames)
		if stuck[p] != gone && now != stuck[p] {
			t.Errorf("%s %s: moved from %s to %s though %s stayed", p.proto, p.ap, stuck[p], now, stuck[p])
		}
		t.Logf("%s %s: %s, then %s after %s left", p.proto, p.ap, stuck[p], now, gone)
	}
}

// semUDPAsk sends "hostname" on a connected UDP socket and reads one
// answer within wait.
func semUDPAsk(conn net.Conn, wait time.Duration) (string, error) {
	_ = conn.SetDeadline(time.Now().Add(wait))
	if _, err := conn.Write([]byte("hostname")); err != nil {
		return "", err
	}
	buf := make([]byte, 256)
	n, err := conn.Read(buf)
	if err != nil {
		return "", err
	}
	return strings.TrimSpace(string(buf[:n])), nil
}

// TestServiceNoStaleUDP holds one connected UDP socket per family from a
// client on n1 to the service and keeps using it: when its endpoint X is
// deleted, the same socket is answered by the remaining one within a
// bounded time (no black hole); with no endpoint left it is refused (ICMP
// port unreachable); when a new endpoint appears it is answered by it;
// when the service is deleted its VIP is in no view: the socket's
// datagrams time out and n1 counts them as isolated.
func TestServiceNoStaleUDP(t *testing.T) {
	needLab(t)
	pods := semStart(t, semPod("sem-su-x", "sem-su", "n2"), semPod("sem-su-y", "sem-su", "n3"), semPod("sem-su-c", "sem-su-c", "n1"))
	c := semClientOf(t, pods["sem-su-c"])
	svc := semService(t, "sem-su", "sem-su", nil)
	waitServing(t, "n1", svc, semUDP, 81, 8081, false, pods["sem-su-x"], pods["sem-su-y"])
	const bound = 10 * time.Second

	// One socket per family, both on the same endpoint (new sockets until
	// they are).
	var conns []net.Conn
	var on string
	for try := 0; try < 20 && conns == nil; try++ {
		var cs []net.Conn
		got := map[string]bool{}
		for _, vip := range clusterIPs(svc) {
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
			conn, err := netutil.DialContext(ctx, c.ns, "udp", netip.AddrPortFrom(vip, 81).String())
			cancel()
			if err != nil {
				t.Fatal(err)
			}
			cs = append(cs, conn)
			who, err := semUDPAsk(conn, 2*time.Second)
			if err != nil {
				t.Fatalf("udp %s -> %s:81: %v", c.name, vip, err)
			}
			got[who] = true
			on = who
		}
		if len(got) == 1 {
			conns = cs
			continue
		}
		for _, conn := range cs {
			conn.Close()
		}
	}
	if conns == nil {
		t.Fatal("20 pairs of sockets never landed on one endpoint: is the choice random?")
	}
	defer func() {
		for _, conn := range conns {
			conn.Close()
		}
	}()
	other := map[string]string{"sem-su-x": "sem-su-y", "sem-su-y": "sem-su-x"}[on]
	t.Logf("both sockets answered by %s", on)
	// Answered again and again by the same endpoint (the flow keeps it).
	for _, conn := range conns {
		for range 5 {
			if who, err := semUDPAsk(conn, 2*time.Second); err != nil || who != on {
				t.Fatalf("udp %s -> %s: %q %v, want %s again on the same socket", c.name, conn.RemoteAddr(), who, err, on)
			}
		}
	}

	// Its endpoint goes: the same socket reaches the other one.
	sameSocket := func(what string, deadline time.Duration, want func(string, error) error) {
		t.Helper()
		for _, conn := range conns {
			start := time.Now()
			var last error
			for {
				last = want(semUDPAsk(conn, 500*time.Millisecond))
				if last == nil || time.Since(start) > deadline {
					break
				}
				// A refusal comes back at once: pace the retries.
				time.Sleep(20 * time.Millisecond)
			}
			if last != nil {
				t.Fatalf("udp %s -> %s (same socket): %s not within %s: %v", c.name, conn.RemoteAddr(), what, deadline, last)
			}
			t.Logf("udp %s -> %s (same socket): %s after %s", c.name, conn.RemoteAddr(), what, time.Since(start).Round(time.Millisecond))
		}
	}
	answeredBy := func(name string) func(string, error) error {
		return func(who string, err error) error {
			if err != nil {
				return err
			}
			if who != name {
				return fmt.Errorf("answered by %s", who)
			}
			return nil
		}
	}
	semDelete(on, ptr.To[int64](0))
	sameSocket("answered by "+other, bound, answeredBy(other))
	for _, conn := range conns {
		for range 5 {
			if who, err := semUDPAsk(conn, 2*time.Second); err != nil || who != other {
				t.Errorf("udp %s -> %s (same socket): %q %v, want %s again", c.name, conn.RemoteAddr(), who, err, other)
			}
		}
	}

	// Scale to zero: refused.
	before := nodeDrops(t, "n1")
	semDelete(other, ptr.To[int64](0))
	refused := func(who string, err error) error {
		if errors.Is(err, syscall.ECONNREFUSED) {
			return nil
		}
		if err == nil {
			return fmt.Errorf("answered by %s", who)
		}
		return err
	}
	sameSocket("refused (ICMP port unreachable)", bound, refused)
	waitServing(t, "n1", svc, semUDP, 81, 8081, false)
	sameSocket("refused again", time.Second, refused)
	if after := nodeDrops(t, "n1"); after["no-endpoints"] < before["no-endpoints"]+uint64(2*len(conns)) {
		t.Errorf("no endpoint: n1's no-endpoints counter %d -> %d, want at least +%d", before["no-endpoints"], after["no-endpoints"], 2*len(conns))
	}

	// Back from zero: the same socket reaches the new endpoint.
	z := semStart(t, semPod("sem-su-z", "sem-su", "n2"))["sem-su-z"]
	sameSocket("answered by sem-su-z", bound, func(who string, err error) error {
		if errors.Is(err, syscall.ECONNREFUSED) {
			return fmt.Errorf("refused")
		}
		return answeredBy("sem-su-z")(who, err)
	})
	waitServing(t, "n1", svc, semUDP, 81, 8081, false, z)

	// The service goes: its VIP is nobody; nothing answers, n1 counts
	// isolated drops.
	if err := client.CoreV1().Services("default").Delete(context.Background(), svc.Name, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	waitNotServing(t, "n1", svc, semUDP, 81)
	before = nodeDrops(t, "n1")
	for _, conn := range conns {
		who, err := semUDPAsk(conn, 1500*time.Millisecond)
		if !isTimeout(err) {
			t.Errorf("udp %s -> %s (same socket) after the service was deleted: %q %v, want a timeout", c.name, conn.RemoteAddr(), who, err)
		}
	}
	if after := nodeDrops(t, "n1"); after["isolated"] < before["isolated"]+uint64(len(conns)) {
		var views []string
		for _, vip := range clusterIPs(svc) {
			views = append(views, semViewEntry("n1", c, vip))
		}
		t.Errorf("deleted service: n1's isolated counter %d -> %d, want at least +%d; the counters that moved: %v; %v",
			before["isolated"], after["isolated"], len(conns), semMoved(before, after), views)
	}
}

// TestServicesLeftAlone: a Service labelled
// service.kubernetes.io/service-proxy-name belongs to another proxy: Lace
// serves none of its VIPs (they are in no view: timeouts counted as
// isolated), though its EndpointSlices list a ready endpoint. Headless and
// ExternalName Services have no VIP and program nothing on any node. A
// plain Service created after them all is served (the agents saw them).
func TestServicesLeftAlone(t *testing.T) {
	needLab(t)
	pods := semStart(t, semPod("sem-la-be", "sem-la", "n2"), semPod("sem-la-c", "sem-la-c", "n1"))
	c := semClientOf(t, pods["sem-la-c"])
	other := semService(t, "sem-la-other", "sem-la", func(s *corev1.Service) {
		s.Labels = map[string]string{"service.kubernetes.io/service-proxy-name": "other"}
	})
	headless := semService(t, "sem-la-headless", "sem-la", func(s *corev1.Service) {
		s.Spec.ClusterIP = corev1.ClusterIPNone
		s.Spec.Ports = []corev1.ServicePort{{Name: "http", Port: 7701, TargetPort: intstr.FromInt32(8080)}}
	})
	extName := semService(t, "sem-la-extname", "", func(s *corev1.Service) {
		s.Spec = corev1.ServiceSpec{Type: corev1.ServiceTypeExternalName, ExternalName: "example.com",
			Ports: []corev1.ServicePort{{Name: "http", Port: 7702}}}
	})
	if len(headless.Spec.ClusterIPs) != 1 || headless.Spec.ClusterIPs[0] != corev1.ClusterIPNone || extName.Spec.ClusterIP != "" {
		t.Fatalf("headless ClusterIPs %v, ExternalName ClusterIP %q: want None and none", headless.Spec.ClusterIPs, extName.Spec.ClusterIP)
	}
	control := semService(t, "sem-la-control", "sem-la", nil)
	waitSlices(t, other.Name, map[string]string{"sem-la-be": "ready=true serving=true terminating=false"})
	waitSlices(t, headless.Name, map[string]string{"sem-la-be": "ready=true serving=true terminating=false"})
	for _, node := range []string{"n1", "n2", "n3"} {
		waitServing(t, node, control, semTCP, 80, 8080, false, pods["sem-la-be"])
		table, err := semTable(node)
		if err != nil {
			t.Fatal(err)
		}
		for _, s := range table {
			if slices.Contains(clusterIPs(other), s.VIP) {
				t.Errorf("%s serves %s:%d/%d of %s (service-proxy-name other): %s", node, s.VIP, s.Port, s.Proto, other.Name, semDescribe(&s))
			}
			if s.Port == 7701 || s.Port == 7702 {
				t.Errorf("%s serves %s:%d/%d, a port only the headless and ExternalName services have: %s", node, s.VIP, s.Port, s.Proto, semDescribe(&s))
			}
		}
	}
	expectOnly(t, c, control, 80, 81, "sem-la-be")
	expectSilent(t, c, "n1", "isolated", semProbes(other, 80, 81)...)
}

// TestServiceMultiplePortsAndProtocols: one service with two TCP ports
// (80 -> 8080, 90 -> 8090) and port 53 on both TCP (-> 8080) and UDP
// (-> 8081): each reaches the right port of its endpoints, in both
// families.
func TestServiceMultiplePortsAndProtocols(t *testing.T) {
	needLab(t)
	pods := semStart(t, semSecondPort(semPod("sem-mp-a", "sem-mp", "n2")), semSecondPort(semPod("sem-mp-b", "sem-mp", "n3")),
		semPod("sem-mp-c", "sem-mp-c", "n1"))
	c := semClientOf(t, pods["sem-mp-c"])
	a, b := pods["sem-mp-a"], pods["sem-mp-b"]
	svc := semService(t, "sem-mp", "sem-mp", func(s *corev1.Service) {
		s.Spec.Ports = []corev1.ServicePort{
			{Name: "http", Port: 80, TargetPort: intstr.FromInt32(8080), Protocol: corev1.ProtocolTCP},
			{Name: "alt", Port: 90, TargetPort: intstr.FromInt32(8090), Protocol: corev1.ProtocolTCP},
			{Name: "dns-tcp", Port: 53, TargetPort: intstr.FromInt32(8080), Protocol: corev1.ProtocolTCP},
			{Name: "dns-udp", Port: 53, TargetPort: intstr.FromInt32(8081), Protocol: corev1.ProtocolUDP},
		}
	})
	waitServing(t, "n1", svc, semTCP, 80, 8080, false, a, b)
	waitServing(t, "n1", svc, semTCP, 90, 8090, false, a, b)
	waitServing(t, "n1", svc, semTCP, 53, 8080, false, a, b)
	waitServing(t, "n1", svc, semUDP, 53, 8081, false, a, b)
	for _, vip := range clusterIPs(svc) {
		expectAnswers(t, c, "tcp", netip.AddrPortFrom(vip, 80), "/hostname", 16, true, "sem-mp-a", "sem-mp-b")
		expectAnswers(t, c, "tcp", netip.AddrPortFrom(vip, 90), "/hostname", 16, true, "sem-mp-a:8090", "sem-mp-b:8090")
		expectAnswers(t, c, "tcp", netip.AddrPortFrom(vip, 53), "/hostname", 16, true, "sem-mp-a", "sem-mp-b")
		expectAnswers(t, c, "udp", netip.AddrPortFrom(vip, 53), "hostname", 16, true, "sem-mp-a", "sem-mp-b")
	}
}

// TestServicePortChange: a service's ports change in place (80/TCP -> 8080
// becomes 8000 -> 8090; 81/UDP -> 8081 becomes 8001 -> 8091): the new
// ports are served at the new target ports, the old ones are refused and
// counted under no-service-port.
func TestServicePortChange(t *testing.T) {
	needLab(t)
	pods := semStart(t, semSecondPort(semPod("sem-port-be", "sem-port", "n2")), semPod("sem-port-c", "sem-port-c", "n1"))
	c := semClientOf(t, pods["sem-port-c"])
	be := pods["sem-port-be"]
	svc := semService(t, "sem-port", "sem-port", nil)
	waitServing(t, "n1", svc, semTCP, 80, 8080, false, be)
	waitServing(t, "n1", svc, semUDP, 81, 8081, false, be)
	expectOnly(t, c, svc, 80, 81, "sem-port-be")

	semUpdateService(t, svc.Name, func(s *corev1.Service) {
		for i := range s.Spec.Ports {
			switch s.Spec.Ports[i].Name {
			case "http":
				s.Spec.Ports[i].Port, s.Spec.Ports[i].TargetPort = 8000, intstr.FromInt32(8090)
			case "udp":
				s.Spec.Ports[i].Port, s.Spec.Ports[i].TargetPort = 8001, intstr.FromInt32(8091)
			}
		}
	})
	waitServing(t, "n1", svc, semTCP, 8000, 8090, false, be)
	waitServing(t, "n1", svc, semUDP, 8001, 8091, false, be)
	waitNotServing(t, "n1", svc, semTCP, 80)
	waitNotServing(t, "n1", svc, semUDP, 81)
	for _, vip := range clusterIPs(svc) {
		expectAnswers(t, c, "tcp", netip.AddrPortFrom(vip, 8000), "/hostname", 8, true, "sem-port-be:8090")
		expectAnswers(t, c, "udp", netip.AddrPortFrom(vip, 8001), "hostname", 8, true, "sem-port-be")
	}
	expectRefused(t, c, "n1", "no-service-port", semProbes(svc, 80, 81)...)
}

// TestServiceHairpin: a pod reaching itself through its own service (it is
// the only endpoint) is answered, by itself, over TCP and UDP in both
// families, and sees its own address as the client's.
func TestServiceHairpin(t *testing.T) {
	needLab(t)
	pods := semStart(t, semPod("sem-hp", "sem-hp", "n1"))
	svc := semService(t, "sem-hp", "sem-hp", nil)
	waitServing(t, "n1", svc, semTCP, 80, 8080, false, pods["sem-hp"])
	waitServing(t, "n1", svc, semUDP, 81, 8081, false, pods["sem-hp"])
	c := semClientOf(t, pods["sem-hp"])
	expectOnly(t, c, svc, 80, 81, "sem-hp")
	// The pod sees its own address as the client's (its sockets pass the
	// node's socket hooks, which point the connection at itself).
	own := map[bool]string{}
	for _, ip := range pods["sem-hp"].Status.PodIPs {
		a := netip.MustParseAddr(ip.IP)
		own[a.Is4()] = a.String()
	}
	// Asked from inside the pod (kubectl exec): the test's own sockets,
	// outside the node's cgroup, hairpin per packet.
	for _, vip := range clusterIPs(svc) {
		url := "http://" + netip.AddrPortFrom(vip, 80).String() + "/clientip"
		src, err := kubectl(context.Background(), "exec", "sem-hp", "--", "wget", "-q", "-O", "-", url)
		if err != nil {
			t.Errorf("wget %s in %s: %v\n%s", url, c.name, err, src)
			continue
		}
		ap, err := netip.ParseAddrPort(strings.TrimSpace(src))
		if err != nil || ap.Addr().String() != own[vip.Is4()] {
			t.Errorf("hairpin through %s: the pod saw its own connection come from %q, want its own address %s", vip, src, own[vip.Is4()])
		}
	}
}

// TestServiceHostNetworkEndpoint: a Service whose endpoint is a
// hostNetwork pod (the node's own addresses) answers from its VIPs, both
// families, TCP and UDP, to a pod on that node (the node's stack answers
// through the veth, where to_pod restores the VIP) and to a pod on
// another node (SNAT over the underlay), as kube-proxy serves it.
func TestServiceHostNetworkEndpoint(t *testing.T) {
	needLab(t)
	be := semPod("sem-hostnet-be", "sem-hostnet", "n1")
	be.Spec.HostNetwork = true
	be.Spec.Containers[0].Args = []string{"netexec", "--http-port=18090", "--udp-port=18091"}
	be.Spec.Containers[0].Ports = nil
	be.Spec.Containers[0].ReadinessProbe = nil
	pods := semStart(t, be, semPod("sem-hostnet-c1", "sem-hostnet-c1", "n1"), semPod("sem-hostnet-c2", "sem-hostnet-c2", "n2"))
	if len(pods[be.Name].Status.PodIPs) != 2 {
		t.Fatalf("hostNetwork pod IPs %v, want n1's address of each family", pods[be.Name].Status.PodIPs)
	}
	svc := semService(t, "sem-hostnet", "sem-hostnet", func(s *corev1.Service) {
		s.Spec.Ports[0].TargetPort = intstr.FromInt32(18090)
		s.Spec.Ports[1].TargetPort = intstr.FromInt32(18091)
	})
	for _, n := range []string{"n1", "n2"} {
		waitServing(t, n, svc, semTCP, 80, 18090, false, pods[be.Name])
		waitServing(t, n, svc, semUDP, 81, 18091, false, pods[be.Name])
	}
	for _, c := range []string{"sem-hostnet-c1", "sem-hostnet-c2"} {
		expectOnly(t, semClientOf(t, pods[c]), svc, 80, 81, "n1")
	}
}

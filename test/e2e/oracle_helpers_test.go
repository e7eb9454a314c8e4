package e2e

// The pool TestOracleAgreesWithPackets draws its topologies from (networks,
// pods, the external host's listeners, opened once per test because they
// are slow to make) and the probes it sends: TCP, UDP and ICMP from inside
// a pod's network namespace or from the external host with an explicit
// source address, each classified as answered (by whom), unanswered (a
// timeout) or failed otherwise (a refusal, an ICMP error).

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"net/netip"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	crclient "sigs.k8s.io/controller-runtime/pkg/client"

	lacev1 "github.com/lace-cni/lace/api/v1alpha1"
	"github.com/lace-cni/lace/internal/datapath"
	"github.com/lace-cni/lace/internal/model"
	"github.com/lace-cni/lace/internal/netutil"
	"github.com/lace-cni/lace/lab"
)

const (
	// oracleNetLabel names a network (the chart's default and world carry
	// it; the pool's networks get it too), so a policy can select one
	// network by name.
	oracleNetLabel = "lace-cni.io/network"
	// oracleGroupLabel is the label the topologies draw on pool networks
	// for label selectors (meshes, group to group).
	oracleGroupLabel = "oracle.lace-cni.io/group"
	// oracleRunLabel marks the routing policies of one test run.
	oracleRunLabel = "oracle.lace-cni.io/run"
	// oracleExternalName is what the external host's listeners answer.
	oracleExternalName = "external"
)

// probeTiming is how long a probe waits for its answer, and after how long
// without one UDP and ICMP probes send a second datagram (TCP retransmits
// its SYN by itself after the initial RTO, 1 s); 0: no second one.
type probeTiming struct{ timeout, resend time.Duration }

var (
	// oracleTiming is the probes': each unanswered one sends two packets.
	oracleTiming = probeTiming{timeout: 1500 * time.Millisecond, resend: 750 * time.Millisecond}
	// quickTiming sends exactly one packet per unanswered probe (its
	// deadline comes before TCP's first retransmission): for the
	// diagnosis, which reads only drop counters (a drop is counted well
	// within it).
	quickTiming = probeTiming{timeout: 300 * time.Millisecond}
)

// oracleNets are the pool's pod networks: a and c have the same subnets, e
// lies inside b, d is anonymous, f is an l2 network (switched between its
// pods, on one node and across nodes; routed through its gateway to the
// others). Their pods sit on the nodes given, so that every node holds
// pods of overlapping networks.
var oracleNets = []struct {
	suffix, v4, v6 string
	anonymous, l2  bool
	nodes          []string
}{
	{"a", "10.61.0.0/16", "fd00:61::/48", false, false, []string{"n1", "n2"}},
	{"b", "10.62.0.0/16", "fd00:62::/48", false, false, []string{"n2", "n3"}},
	{"c", "10.61.0.0/16", "fd00:61::/48", false, false, []string{"n1", "n3"}},
	{"d", "10.64.0.0/16", "fd00:64::/48", true, false, []string{"n3", "n1"}},
	{"e", "10.62.128.0/17", "fd00:62:0:8000::/49", false, false, []string{"n2", "n1"}},
	{"f", "10.63.0.0/24", "fd00:63::/64", false, true, []string{"n1", "n3", "n1"}},
}

// oPod is a netexec pod of the pool.
type oPod struct {
	name, network, node string
	labels              map[string]string
	v4, v6              netip.Addr
	ns                  string // network namespace path
}

func (p *oPod) addr(v6 bool) netip.Addr {
	if v6 {
		return p.v6
	}
	return p.v4
}

func (p *oPod) endpoint(v6 bool) model.Endpoint {
	return model.Endpoint{Kind: model.EndpointPod, Network: p.network, Addr: p.addr(v6), NodeName: p.node}
}

// oraclePool is what every topology of one run shares.
type oraclePool struct {
	prefix string
	c      crclient.Client
	// nets are the pool's pod networks (in oracleNets order), anon the
	// anonymous one, ext the pool's external network (the external host's
	// served prefixes).
	nets []string
	anon string
	ext  string
	pods []*oPod // pool pods, then the default network's pod
	// nodes of the lab, and their pinned data plane maps (opened once).
	nodes []string
	mu    sync.Mutex
	dps   map[string]*datapath.Datapath
	// The external host: its namespace and addresses on the fabric (world)
	// and in the served site (ext), IPv4 then IPv6.
	extNS               string
	extFabric, extSited [2]netip.Addr
	// stuck is set while a seed waits for the data plane to converge: a
	// data plane that never does stops the run rather than failing every
	// seed a minute each.
	stuck bool
	// diagnosed is set once a seed's counters have been diagnosed (it
	// takes a while; once per run).
	diagnosed bool
}

func newOraclePool(t *testing.T) *oraclePool {
	t.Helper()
	suffix := make([]byte, 2)
	for i := range suffix {
		suffix[i] = byte(rand.IntN(256))
	}
	cfg := labConfig()
	p := &oraclePool{prefix: fmt.Sprintf("o%x", suffix), c: laceClient(t), dps: map[string]*datapath.Datapath{},
		extNS: netutil.Path(cfg.NetNS("external"))}
	for i := 1; i <= cfg.Nodes; i++ {
		p.nodes = append(p.nodes, cfg.NodeName(i))
	}
	t.Cleanup(func() {
		p.mu.Lock()
		defer p.mu.Unlock()
		for _, dp := range p.dps {
			_ = dp.Close()
		}
	})
	f4, f6 := lab.ExternalUnderlay()
	s4, s6 := lab.ExternalServedAddrs()
	p.extFabric, p.extSited = [2]netip.Addr{f4, f6}, [2]netip.Addr{s4, s6}
	ctx := context.Background()
	// The routing policies of this run go away even when a seed fails
	// half-way (deleted before the networks they select, as the cleanups
	// run in reverse order).
	for _, n := range oracleNets {
		name := p.prefix + "-" + n.suffix
		if n.l2 {
			l2Network(t, p.c, name, n.v4, n.v6)
		} else {
			network(t, p.c, name, n.v4, n.v6, n.anonymous)
		}
		p.nets = append(p.nets, name)
		if n.anonymous {
			p.anon = name
		}
	}
	p.ext = p.prefix + "-x"
	x := &lacev1.Network{ObjectMeta: metav1.ObjectMeta{Name: p.ext, Labels: map[string]string{oracleNetLabel: p.ext}},
		Spec: lacev1.NetworkSpec{Type: lacev1.NetworkTypeExternal,
			ExternalPrefixes: []lacev1.CIDR{lacev1.CIDR(lab.ExternalServedV4.String()), lacev1.CIDR(lab.ExternalServedV6.String())}}}
	if err := p.c.Create(ctx, x); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = p.c.Delete(context.Background(), x) })
	t.Cleanup(func() { p.deletePolicies(t) })
	eventually(t, time.Minute, "pool networks with IDs", func() error {
		for _, name := range append(append([]string(nil), p.nets...), p.ext) {
			var nw lacev1.Network
			if err := p.c.Get(ctx, crKey(name), &nw); err != nil {
				return err
			}
			if nw.Status.ID <= 0 {
				return fmt.Errorf("network %s has no ID yet", name)
			}
		}
		return nil
	})

	// Pods: two per pool network on different nodes, one in default.
	type spec struct{ name, net, node string }
	var specs []spec
	for i, n := range oracleNets {
		for j, node := range n.nodes {
			specs = append(specs, spec{fmt.Sprintf("%s-%s%d", p.prefix, n.suffix, j+1), p.nets[i], node})
		}
	}
	specs = append(specs, spec{p.prefix + "-def", "default", "n2"})
	t.Cleanup(func() { p.deleteNetpols(t) })
	for i, s := range specs {
		pod := netexecPod(s.name, s.node)
		labels := p.netpolLabels(i, s.net)
		for k, v := range labels {
			pod.Labels[k] = v
		}
		pod.Spec.Containers[0].ReadinessProbe = nil
		pod.Spec.TerminationGracePeriodSeconds = ptr.To[int64](0)
		if _, err := client.CoreV1().Pods("default").Create(ctx, pod, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			_ = client.CoreV1().Pods("default").Delete(context.Background(), s.name, metav1.DeleteOptions{GracePeriodSeconds: ptr.To[int64](0)})
		})
		p.pods = append(p.pods, &oPod{name: s.name, network: s.net, node: s.node, labels: pod.Labels})
	}
	eventually(t, 2*time.Minute, "pool pods running with both addresses", func() error {
		for _, op := range p.pods {
			if op.v4.IsValid() && op.v6.IsValid() {
				continue
			}
			pod, err := client.CoreV1().Pods("default").Get(ctx, op.name, metav1.GetOptions{})
			if err != nil {
				return err
			}
			if pod.Status.Phase != corev1.PodRunning || !podIsReady(pod) {
				return fmt.Errorf("pod %s: phase %s, statuses %+v", op.name, pod.Status.Phase, pod.Status.ContainerStatuses)
			}
			v4, v6 := podAddrs(pod)
			if !v4.IsValid() || !v6.IsValid() {
				return fmt.Errorf("pod %s has addresses %v", op.name, pod.Status.PodIPs)
			}
			ns, err := lab.PodNetNS(ctx, labConfig(), "default", op.name)
			if err != nil {
				return err
			}
			op.v4, op.v6, op.ns = v4, v6, ns
		}
		return nil
	})
	// netexec is listening: asked over each pod's own loopback, which no
	// policy and no data plane is involved in.
	eventually(t, time.Minute, "netexec answering in every pool pod", func() error {
		for _, op := range p.pods {
			src := oSource{ns: op.ns}
			for _, proto := range []string{"tcp", "udp"} {
				if o := probeOnce(src, proto, netip.MustParseAddr("127.0.0.1"), oracleTiming); !o.answered || o.from != op.name {
					return fmt.Errorf("%s over loopback in %s: %s", proto, op.name, o)
				}
			}
		}
		return nil
	})
	ensureExternalSite(t)
	p.listenExternal(t)
	return p
}

// deletePolicies removes every routing policy of this run.
func (p *oraclePool) deletePolicies(t *testing.T) {
	ctx := context.Background()
	var list lacev1.NetworkRoutingPolicyList
	if err := p.c.List(ctx, &list, crclient.MatchingLabels{oracleRunLabel: p.prefix}); err != nil {
		t.Errorf("list the routing policies of run %s: %v", p.prefix, err)
		return
	}
	for i := range list.Items {
		if err := p.c.Delete(ctx, &list.Items[i]); err != nil && !strings.Contains(err.Error(), "not found") {
			t.Errorf("delete routing policy %s: %v", list.Items[i].Name, err)
		}
	}
}

// datapath returns node's pinned maps, opened once.
func (p *oraclePool) datapath(node string) (*datapath.Datapath, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if dp := p.dps[node]; dp != nil {
		return dp, nil
	}
	dp, err := datapath.Load(filepath.Join(labConfig().NodeRoot(node), "sys/fs/bpf/lace"))
	if err != nil {
		return nil, fmt.Errorf("open the data plane of %s: %w", node, err)
	}
	p.dps[node] = dp
	return dp, nil
}

// forget drops node's maps after an error, so the next use opens them anew
// (an agent restart may have replaced them).
func (p *oraclePool) forget(node string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if dp := p.dps[node]; dp != nil {
		_ = dp.Close()
		delete(p.dps, node)
	}
}

// drops reads every node's drop counters.
func (p *oraclePool) drops(t *testing.T) map[string]map[string]uint64 {
	t.Helper()
	out := map[string]map[string]uint64{}
	for _, node := range p.nodes {
		dp, err := p.datapath(node)
		if err != nil {
			t.Fatal(err)
		}
		d, err := dp.Drops()
		if err != nil {
			p.forget(node)
			t.Fatalf("drop counters of %s: %v", node, err)
		}
		out[node] = d
	}
	return out
}

// ensureExternalSite makes sure the external host serves the site the
// pool's external network names and routes the pod prefixes via the
// nodes, and that the nodes route the site via the external host. The lab
// does this itself; a lace-lab binary from before it did gets the same
// from the test, removed again at the end.
func ensureExternalSite(t *testing.T) {
	t.Helper()
	cfg := labConfig()
	ext := netutil.Path(cfg.NetNS("external"))
	have, err := netutil.GlobalAddrs(ext, "eth0")
	if err != nil {
		t.Fatal(err)
	}
	s4, s6 := lab.ExternalServedAddrs()
	found := 0
	for _, a := range have {
		if a == s4 || a == s6 {
			found++
		}
	}
	if found == 2 {
		return
	}
	t.Logf("the lab's external host does not hold %s and %s (lace-lab predates the served site): the test adds the site and its routes", s4, s6)
	for _, a := range []netip.Prefix{netip.PrefixFrom(s4, 32), netip.PrefixFrom(s6, 128)} {
		if err := netutil.EnsureAddr(ext, "eth0", a); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			h, err := netutil.Handle(ext)
			if err != nil {
				return
			}
			defer h.Close()
			if l, err := h.LinkByName("eth0"); err == nil {
				_ = h.AddrDel(l, &netlink.Addr{IPNet: &net.IPNet{IP: a.Addr().AsSlice(), Mask: net.CIDRMask(a.Bits(), a.Addr().BitLen())}})
			}
		})
	}
	n4, n6 := lab.NodeUnderlay(1)
	for _, dst := range lab.PodRoutesViaNodes {
		via := n4
		if dst.Addr().Is6() {
			via = n6
		}
		if err := netutil.EnsureRoute(ext, dst, via, "eth0"); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = netutil.DeleteRoute(ext, dst, "eth0") })
	}
	e4, e6 := lab.ExternalUnderlay()
	for i := 1; i <= cfg.Nodes; i++ {
		ns := netutil.Path(cfg.NetNS(cfg.NodeName(i)))
		for _, r := range []struct {
			dst netip.Prefix
			via netip.Addr
		}{{lab.ExternalServedV4, e4}, {lab.ExternalServedV6, e6}} {
			if err := netutil.EnsureRoute(ns, r.dst, r.via, "eth0"); err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = netutil.DeleteRoute(ns, r.dst, "eth0") })
		}
	}
}

// listenExternal serves netexec's two questions on the external host:
// HTTP GET /hostname on TCP 8080 and "hostname" on UDP 8081, answered with
// oracleExternalName. UDP listens on each address on its own, so that every
// answer leaves from the address it was asked at.
func (p *oraclePool) listenExternal(t *testing.T) {
	t.Helper()
	ln, err := netutil.Listen(p.extNS, "tcp", ":8080")
	if err != nil {
		t.Fatalf("listen on the external host: %v", err)
	}
	mux := http.NewServeMux()
	mux.HandleFunc("/hostname", func(w http.ResponseWriter, _ *http.Request) { fmt.Fprint(w, oracleExternalName) })
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(func() { _ = srv.Close() })
	for _, a := range append(p.extFabric[:], p.extSited[:]...) {
		var pc net.PacketConn
		eventually(t, 10*time.Second, "UDP socket on the external host at "+a.String(), func() error {
			return netutil.Do(p.extNS, func() error {
				c, err := net.ListenPacket("udp", net.JoinHostPort(a.String(), "8081"))
				pc = c
				return err
			})
		})
		go func() {
			buf := make([]byte, 512)
			for {
				n, from, err := pc.ReadFrom(buf)
				if err != nil {
					return
				}
				answer := "unknown request"
				if strings.TrimSpace(string(buf[:n])) == "hostname" {
					answer = oracleExternalName
				}
				_, _ = pc.WriteTo([]byte(answer), from)
			}
		}()
		t.Cleanup(func() { _ = pc.Close() })
	}
}

// oSource is where a probe leaves from: a pod's namespace, or the external
// host's with an explicit source address.
type oSource struct {
	ns    string
	local netip.Addr // invalid: the kernel chooses (pods)
}

// outcome is what came of one probe.
type outcome struct {
	answered bool
	// from is who answered: netexec's hostname (TCP, UDP) or the address
	// an ICMP echo reply came from.
	from    string
	timeout bool
	err     error
}

func (o outcome) String() string {
	switch {
	case o.answered:
		return fmt.Sprintf("answered by %q", o.from)
	case o.timeout:
		return "no answer (timeout)"
	}
	return fmt.Sprintf("failed: %v", o.err)
}

func (o outcome) kind() string {
	switch {
	case o.answered:
		return "answered"
	case o.timeout:
		return "timeout"
	}
	return "error"
}

// Source ports and ICMP identifiers: every probe of a run opens a new flow,
// so a flow admitted under one topology is never reused under the next
// (conntrack would carry it). The starts are random so that two runs in a
// row do not reuse each other's flows either.
var (
	oraclePort   atomic.Uint32
	oracleICMPID atomic.Uint32
)

func init() {
	oraclePort.Store(uint32(rand.IntN(40000)))
	oracleICMPID.Store(uint32(rand.IntN(65536)))
}

func nextPort() int { return 20000 + int(oraclePort.Add(1)%40000) }

// probeOnce sends one probe to dst: proto tcp (HTTP GET /hostname on 8080),
// udp ("hostname" to 8081) or icmp (an echo request).
func probeOnce(src oSource, proto string, dst netip.Addr, tm probeTiming) outcome {
	switch proto {
	case "tcp":
		return probeTCP(src, dst, tm)
	case "udp":
		return probeUDP(src, dst, tm)
	}
	return probeICMP(src, dst, tm)
}

func localIP(a netip.Addr) net.IP {
	if a.IsValid() {
		return a.AsSlice()
	}
	return nil
}

func probeTCP(src oSource, dst netip.Addr, tm probeTiming) outcome {
	ctx, cancel := context.WithTimeout(context.Background(), tm.timeout)
	defer cancel()
	var conn net.Conn
	var err error
	for range 3 { // another port when this one is still taken
		d := net.Dialer{LocalAddr: &net.TCPAddr{IP: localIP(src.local), Port: nextPort()}}
		err = netutil.Do(src.ns, func() error {
			c, err := d.DialContext(ctx, "tcp", net.JoinHostPort(dst.String(), "8080"))
			conn = c
			return err
		})
		if !errors.Is(err, syscall.EADDRINUSE) {
			break
		}
	}
	if err != nil {
		if isTimeout(err) || errors.Is(err, context.DeadlineExceeded) {
			return outcome{timeout: true}
		}
		return outcome{err: err}
	}
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(tm.timeout))
	fmt.Fprintf(conn, "GET /hostname HTTP/1.0\r\nHost: oracle\r\n\r\n")
	b, err := io.ReadAll(conn)
	if err != nil {
		return outcome{err: fmt.Errorf("connected, then %w", err)}
	}
	_, body, ok := strings.Cut(string(b), "\r\n\r\n")
	if !ok {
		return outcome{err: fmt.Errorf("connected, then an answer without HTTP headers: %q", b)}
	}
	return outcome{answered: true, from: strings.TrimSpace(body)}
}

func probeUDP(src oSource, dst netip.Addr, tm probeTiming) outcome {
	var conn net.Conn
	var err error
	for range 3 {
		d := net.Dialer{LocalAddr: &net.UDPAddr{IP: localIP(src.local), Port: nextPort()}}
		err = netutil.Do(src.ns, func() error {
			c, err := d.Dial("udp", net.JoinHostPort(dst.String(), "8081"))
			conn = c
			return err
		})
		if !errors.Is(err, syscall.EADDRINUSE) {
			break
		}
	}
	if err != nil {
		return outcome{err: fmt.Errorf("open a UDP socket: %w", err)}
	}
	defer conn.Close()
	end := time.Now().Add(tm.timeout)
	buf := make([]byte, 512)
	for attempt := 0; ; attempt++ {
		if _, err := conn.Write([]byte("hostname")); err != nil {
			return outcome{err: fmt.Errorf("send: %w", err)}
		}
		deadline := end
		if attempt == 0 && tm.resend > 0 {
			deadline = time.Now().Add(tm.resend)
		}
		_ = conn.SetReadDeadline(deadline)
		n, err := conn.Read(buf)
		switch {
		case err == nil:
			return outcome{answered: true, from: strings.TrimSpace(string(buf[:n]))}
		case !isTimeout(err):
			return outcome{err: err}
		case attempt > 0 || tm.resend == 0 || time.Now().After(end):
			return outcome{timeout: true}
		}
	}
}

// probeICMP sends an echo request from a raw socket in the source's
// namespace (bound to the source address when given) and waits for the
// reply from dst, or an ICMP error about this very request. Every raw
// socket of a namespace sees every ICMP message, so the identifier sorts
// out whose is whose.
func probeICMP(src oSource, dst netip.Addr, tm probeTiming) outcome {
	network, reqType, replyType := "ip4:icmp", byte(8), byte(0)
	if dst.Is6() {
		network, reqType, replyType = "ip6:ipv6-icmp", 128, 129
	}
	laddr := ""
	if src.local.IsValid() {
		laddr = src.local.String()
	}
	var pc net.PacketConn
	err := netutil.Do(src.ns, func() error {
		c, err := net.ListenPacket(network, laddr)
		pc = c
		return err
	})
	if err != nil {
		return outcome{err: fmt.Errorf("open a raw ICMP socket: %w", err)}
	}
	defer pc.Close()
	id := uint16(oracleICMPID.Add(1))
	msg := make([]byte, 8+16)
	msg[0] = reqType
	binary.BigEndian.PutUint16(msg[4:], id)
	binary.BigEndian.PutUint16(msg[6:], 1)
	copy(msg[8:], "lace-oracle-echo")
	if dst.Is4() {
		binary.BigEndian.PutUint16(msg[2:], icmpChecksum(msg))
	} // the kernel computes ICMPv6 checksums on raw sockets
	to := &net.IPAddr{IP: dst.AsSlice()}
	end := time.Now().Add(tm.timeout)
	buf := make([]byte, 1500)
	attempts := 1
	if tm.resend > 0 {
		attempts = 2
	}
	for attempt := 0; attempt < attempts; attempt++ {
		if _, err := pc.WriteTo(msg, to); err != nil {
			return outcome{err: fmt.Errorf("send an echo request: %w", err)}
		}
		deadline := end
		if attempt == 0 && attempts > 1 {
			deadline = time.Now().Add(tm.resend)
		}
		_ = pc.SetReadDeadline(deadline)
		for {
			n, from, err := pc.ReadFrom(buf)
			if err != nil {
				if isTimeout(err) {
					break
				}
				return outcome{err: err}
			}
			if n < 8 {
				continue
			}
			fromAddr, _ := netip.AddrFromSlice(from.(*net.IPAddr).IP)
			fromAddr = fromAddr.Unmap()
			typ, code := buf[0], buf[1]
			if typ == replyType && binary.BigEndian.Uint16(buf[4:]) == id {
				if fromAddr != dst {
					return outcome{err: fmt.Errorf("echo reply from %s, not from %s", fromAddr, dst)}
				}
				return outcome{answered: true, from: fromAddr.String()}
			}
			if icmpErrorAbout(dst.Is6(), buf[:n], reqType, id) {
				return outcome{err: fmt.Errorf("ICMP error type %d code %d from %s", typ, code, fromAddr)}
			}
		}
	}
	return outcome{timeout: true}
}

// icmpErrorAbout says whether msg is an ICMP error quoting our echo
// request with identifier id.
func icmpErrorAbout(v6 bool, msg []byte, reqType byte, id uint16) bool {
	if v6 {
		// Destination unreachable, packet too big, time exceeded,
		// parameter problem; the quote is the IPv6 header and ours.
		if msg[0] < 1 || msg[0] > 4 || len(msg) < 8+40+8 {
			return false
		}
		q := msg[8+40:]
		return q[0] == reqType && binary.BigEndian.Uint16(q[4:]) == id
	}
	// Destination unreachable, time exceeded, parameter problem.
	if (msg[0] != 3 && msg[0] != 11 && msg[0] != 12) || len(msg) < 8+20+8 {
		return false
	}
	ihl := int(msg[8]&0x0f) * 4
	if len(msg) < 8+ihl+8 {
		return false
	}
	q := msg[8+ihl:]
	return q[0] == reqType && binary.BigEndian.Uint16(q[4:]) == id
}

func icmpChecksum(b []byte) uint16 {
	var sum uint32
	for i := 0; i+1 < len(b); i += 2 {
		sum += uint32(binary.BigEndian.Uint16(b[i:]))
	}
	if len(b)%2 == 1 {
		sum += uint32(b[len(b)-1]) << 8
	}
	for sum>>16 != 0 {
		sum = sum&0xffff + sum>>16
	}
	return ^uint16(sum)
}

// oracleSeeds returns the first seed and how many: 1 and 10, or
// $LACE_SOAK_SEED and $LACE_SOAK_N (make soak).
func oracleSeeds(t *testing.T) (first uint64, n int) {
	t.Helper()
	first, n = 1, 10
	if s := strings.TrimSpace(os.Getenv("LACE_SOAK_SEED")); s != "" {
		v, err := strconv.ParseUint(s, 10, 64)
		if err != nil {
			t.Fatalf("LACE_SOAK_SEED=%q: %v", s, err)
		}
		first = v
	}
	if s := strings.TrimSpace(os.Getenv("LACE_SOAK_N")); s != "" {
		v, err := strconv.Atoi(s)
		if err != nil || v < 1 {
			t.Fatalf("LACE_SOAK_N=%q: want a positive number", s)
		}
		n = v
	}
	return first, n
}

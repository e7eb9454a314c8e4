package lab

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"net/netip"
	"strings"
	"sync"
	"text/tabwriter"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	lacev1 "github.com/lace-cni/lace/api/v1alpha1"
	"github.com/lace-cni/lace/internal/lacectl"
	"github.com/lace-cni/lace/internal/model"
	"github.com/lace-cni/lace/internal/netutil"
	"github.com/lace-cni/lace/pkg/scheme"
)

// The demo topology (docs/topology.md) on top of what the chart
// ships (the default network, the external network world, and the
// policies default -> world and world -> default):
//
//	frontend --> backend          one way: backend cannot open connections
//	frontend, backend <--> shared a shared-services network, both ways
//	frontend --> partner          an external site (the external host's
//	                              served prefixes)
//	sandbox                       anonymous, no self policy: reaches nothing
const (
	// demoTierLabel groups the demo's pod networks for its policies.
	demoTierLabel = "tier"
	// demoPort is where every demo destination listens: agnhost netexec in
	// the pods, the lab's own listener on the external host.
	demoPort = 8080
	// demoTimeout bounds one request: a destination that does not answer
	// in time is unreachable.
	demoTimeout = 2 * time.Second
	// The chart's default networks (values.yaml, defaults).
	demoDefaultNetwork = "default"
	demoWorldNetwork   = "world"
	demoPartnerNetwork = "partner"
	demoSandboxNetwork = "sandbox"
)

// demoPodNetworks are the demo's l3 networks, all dual-stack. shared is
// fd00:31::/48 because fd00:30::/64 is the lab's fabric.
var demoPodNetworks = []struct {
	name, v4, v6 string
	anonymous    bool
}{
	{"frontend", "10.10.0.0/16", "fd00:10::/48", false},
	{"backend", "10.20.0.0/16", "fd00:20::/48", false},
	{"shared", "10.30.0.0/16", "fd00:31::/48", false},
	{demoSandboxNetwork, "10.40.0.0/16", "fd00:40::/48", true},
}

// demoTopology returns the demo's networks, binding policies and routing
// policies, in the order they are created.
func demoTopology() ([]*lacev1.Network, []*lacev1.NetworkBindingPolicy, []*lacev1.NetworkRoutingPolicy) {
	labels := func(name, tier string) map[string]string {
		l := map[string]string{"demo": "lace", lacev1.LabelNetwork: name}
		if tier != "" {
			l[demoTierLabel] = tier
		}
		return l
	}
	var nets []*lacev1.Network
	var nbps []*lacev1.NetworkBindingPolicy
	for _, n := range demoPodNetworks {
		nets = append(nets, &lacev1.Network{ObjectMeta: metav1.ObjectMeta{Name: n.name, Labels: labels(n.name, n.name)},
			Spec: lacev1.NetworkSpec{
				Type:       lacev1.NetworkTypeL3,
				IPv4Subnet: &lacev1.Subnet{Prefix: lacev1.CIDR(n.v4), HostLocalPrefixLength: ptr.To[int32](24)},
				IPv6Subnet: &lacev1.Subnet{Prefix: lacev1.CIDR(n.v6), HostLocalPrefixLength: ptr.To[int32](64)},
				Anonymous:  n.anonymous,
			}})
		nbps = append(nbps, &lacev1.NetworkBindingPolicy{ObjectMeta: metav1.ObjectMeta{Name: "demo-" + n.name, Labels: map[string]string{"demo": "lace"}},
			Spec: lacev1.NetworkBindingPolicySpec{
				Network: n.name, Priority: 10, MatchKind: lacev1.MatchKindPod,
				Selector: &metav1.LabelSelector{MatchLabels: map[string]string{"net": n.name}},
			}})
	}
	nets = append(nets, &lacev1.Network{ObjectMeta: metav1.ObjectMeta{Name: demoPartnerNetwork, Labels: labels(demoPartnerNetwork, "")},
		Spec: lacev1.NetworkSpec{
			Type:             lacev1.NetworkTypeExternal,
			ExternalPrefixes: []lacev1.CIDR{lacev1.CIDR(ExternalServedV4.String()), lacev1.CIDR(ExternalServedV6.String())},
		}})

	tier := func(tiers ...string) *metav1.LabelSelector {
		if len(tiers) == 1 {
			return &metav1.LabelSelector{MatchLabels: map[string]string{demoTierLabel: tiers[0]}}
		}
		return &metav1.LabelSelector{MatchExpressions: []metav1.LabelSelectorRequirement{
			{Key: demoTierLabel, Operator: metav1.LabelSelectorOpIn, Values: tiers}}}
	}
	nrp := func(name string, src, dst *metav1.LabelSelector) *lacev1.NetworkRoutingPolicy {
		return &lacev1.NetworkRoutingPolicy{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{"demo": "lace"}},
			Spec: lacev1.NetworkRoutingPolicySpec{SrcSelector: src, DestSelector: dst}}
	}
	// The shared-services peering is two policies, not one selecting the
	// same label on both sides: that one would also open frontend and
	// backend to each other both ways, and backend must not reach
	// frontend.
	nrps := []*lacev1.NetworkRoutingPolicy{
		nrp("frontend-to-backend", tier("frontend"), tier("backend")),
		nrp("all-to-shared", tier("frontend", "backend"), tier("shared")),
		nrp("shared-to-all", tier("shared"), tier("frontend", "backend")),
		nrp("frontend-to-partner", tier("frontend"),
			&metav1.LabelSelector{MatchLabels: map[string]string{lacev1.LabelNetwork: demoPartnerNetwork}}),
	}
	return nets, nbps, nrps
}

// demoPodSpec is one netexec pod of the demo: its name, the network it
// should land in, and its node.
type demoPodSpec struct{ name, network, node string }

// demoPods places one pod per network (the chart's default network
// included, through its catch-all binding) and two in sandbox, on
// consecutive nodes round robin, so that the two sandbox pods are on
// different nodes and most pairs cross nodes.
func demoPods(c Config) []demoPodSpec {
	nets := []string{demoDefaultNetwork}
	for _, n := range demoPodNetworks {
		nets = append(nets, n.name)
	}
	nets = append(nets, demoSandboxNetwork)
	var out []demoPodSpec
	seen := map[string]int{}
	for k, n := range nets {
		node := c.NodeName(k%c.Nodes + 1)
		seen[n]++
		name := n + "-" + node
		if n == demoSandboxNetwork {
			name = fmt.Sprintf("%s%d-%s", n, seen[n], node)
		}
		out = append(out, demoPodSpec{name: name, network: n, node: node})
	}
	return out
}

// Demo applies the demo topology to a running lab and prints a
// reachability matrix measured by real requests (from inside each pod, and
// from the external host), each cell beside the oracle's expectation
// (model.Reach). Running it again on the same lab reuses what exists.
func Demo(ctx context.Context, c Config, out io.Writer) error {
	start := time.Now()
	cfg, err := clientcmd.BuildConfigFromFlags("", c.Kubeconfig())
	if err != nil {
		return fmt.Errorf("lab %s kubeconfig: %w", c.Name, err)
	}
	cl, err := client.New(cfg, client.Options{Scheme: scheme.Scheme})
	if err != nil {
		return fmt.Errorf("lab %s API client: %w", c.Name, err)
	}
	nets, nbps, nrps := demoTopology()
	var objs []client.Object
	for _, o := range nets {
		objs = append(objs, o)
	}
	for _, o := range nbps {
		objs = append(objs, o)
	}
	for _, o := range nrps {
		objs = append(objs, o)
	}
	if err := createAll(ctx, cl, objs); err != nil {
		return err
	}
	fmt.Fprintf(out, "demo: networks frontend, backend, shared, sandbox (anonymous) and partner (external, %s %s)\n",
		ExternalServedV4, ExternalServedV6)

	// Pods are created only once their networks have IDs and blocks and
	// their binding policies are in effect: a pod created earlier could
	// bind to the catch-all default network instead.
	netNames := []string{demoDefaultNetwork, demoWorldNetwork}
	for _, n := range nets {
		netNames = append(netNames, n.Name)
	}
	if err := waitFor(ctx, 30*time.Second, "demo networks ready", func(ctx context.Context) (string, error) {
		return pendingNetworks(ctx, cl, netNames)
	}); err != nil {
		return err
	}
	if err := waitFor(ctx, 30*time.Second, "demo binding policies ready", func(ctx context.Context) (string, error) {
		var pending []string
		for _, p := range nbps {
			var got lacev1.NetworkBindingPolicy
			if err := cl.Get(ctx, client.ObjectKeyFromObject(p), &got); err != nil {
				return "", fmt.Errorf("get NetworkBindingPolicy %s: %w", p.Name, err)
			}
			if !conditionTrue(got.Status.Conditions, got.Generation) {
				pending = append(pending, p.Name)
			}
		}
		return strings.Join(pending, ", "), nil
	}); err != nil {
		return err
	}
	// A routing policy that is not accepted (a peering conflict, say) is
	// part of what the demo shows, not a reason to stop: report it and go
	// on once every policy's status describes its current spec.
	var refused []string
	if err := waitFor(ctx, 30*time.Second, "demo routing policies observed", func(ctx context.Context) (string, error) {
		var pending []string
		refused = refused[:0]
		for _, p := range nrps {
			var got lacev1.NetworkRoutingPolicy
			if err := cl.Get(ctx, client.ObjectKeyFromObject(p), &got); err != nil {
				return "", fmt.Errorf("get NetworkRoutingPolicy %s: %w", p.Name, err)
			}
			cond := meta.FindStatusCondition(got.Status.Conditions, lacev1.ConditionReady)
			switch {
			case cond == nil || cond.ObservedGeneration != got.Generation:
				pending = append(pending, p.Name)
			case cond.Status != metav1.ConditionTrue:
				refused = append(refused, fmt.Sprintf("warning: NetworkRoutingPolicy %s is not accepted: %s: %s", p.Name, cond.Reason, cond.Message))
			}
		}
		return strings.Join(pending, ", "), nil
	}); err != nil {
		return err
	}
	for _, w := range refused {
		fmt.Fprintln(out, w)
	}

	specs := demoPods(c)
	objs = objs[:0]
	for _, s := range specs {
		objs = append(objs, demoPod(s))
	}
	if err := createAll(ctx, cl, objs); err != nil {
		return err
	}
	pods := map[string]*corev1.Pod{}
	if err := waitFor(ctx, 2*time.Minute, "demo pods ready", func(ctx context.Context) (string, error) {
		var pending []string
		for _, s := range specs {
			if pods[s.name] != nil {
				continue
			}
			var p corev1.Pod
			if err := cl.Get(ctx, client.ObjectKey{Namespace: "default", Name: s.name}, &p); err != nil {
				return "", fmt.Errorf("get pod %s: %w", s.name, err)
			}
			if PodReady(&p) {
				pods[s.name] = &p
			} else {
				pending = append(pending, s.name)
			}
		}
		return strings.Join(pending, ", "), nil
	}); err != nil {
		return err
	}
	fmt.Fprintf(out, "demo: %d netexec pods ready after %.1fs\n", len(specs), time.Since(start).Seconds())

	// The network each pod landed in, as its agent recorded it: a pod in
	// the wrong network is a binding bug the matrix alone would hide
	// behind mismatches.
	for _, s := range specs {
		var ne lacev1.NetworkEndpoint
		err := cl.Get(ctx, client.ObjectKey{Namespace: "default", Name: s.name}, &ne)
		switch {
		case err != nil:
			fmt.Fprintf(out, "warning: pod %s: no NetworkEndpoint: %v\n", s.name, err)
		case ne.Spec.Network != s.network:
			fmt.Fprintf(out, "warning: pod %s is in network %s, want %s\n", s.name, ne.Spec.Network, s.network)
		}
	}

	topo, err := lacectl.ReadTopology(ctx, cl)
	if err != nil {
		return err
	}
	extNS := netutil.Path(c.NetNS("external"))
	stop, err := serveExternal(extNS)
	if err != nil {
		return err
	}
	defer stop()

	// Sources and destinations.
	var srcs, dsts []demoEndpoint
	for _, s := range specs {
		p := pods[s.name]
		ns, err := PodNetNS(ctx, c, p.Namespace, p.Name)
		if err != nil {
			return fmt.Errorf("demo pod %s: network namespace: %w", p.Name, err)
		}
		e := demoEndpoint{name: s.name, netns: ns, kind: model.EndpointPod, network: s.network, node: s.node}
		for _, ip := range p.Status.PodIPs {
			if a, err := netip.ParseAddr(ip.IP); err == nil {
				e.addrs = append(e.addrs, a)
			}
		}
		srcs, dsts = append(srcs, e), append(dsts, e)
	}
	worldV4, worldV6 := ExternalUnderlay()
	partnerV4, partnerV6 := ExternalServedAddrs()
	world := demoEndpoint{name: demoWorldNetwork, netns: extNS, kind: model.EndpointOutside, addrs: []netip.Addr{worldV4, worldV6}}
	partner := demoEndpoint{name: demoPartnerNetwork, netns: extNS, kind: model.EndpointOutside, addrs: []netip.Addr{partnerV4, partnerV6}}
	dsts = append(dsts, world, partner)
	world.name, partner.name = "external(world)", "external(partner)"
	srcs = append(srcs, world, partner)

	m := measure(ctx, topo, srcs, dsts)
	printMatrix(out, m, srcs, dsts)
	for _, s := range specs {
		if s.network == demoDefaultNetwork {
			if err := demoServices(ctx, cl, c, s.name, out); err != nil {
				return err
			}
			break
		}
	}
	fmt.Fprintf(out, "\ndemo done in %.1fs\n", time.Since(start).Seconds())
	return nil
}

// createAll creates objs, leaving alone those that already exist so that
// the demo can run again on the same lab.
func createAll(ctx context.Context, cl client.Client, objs []client.Object) error {
	for _, o := range objs {
		if err := cl.Create(ctx, o); err != nil && !apierrors.IsAlreadyExists(err) {
			return fmt.Errorf("create %T %s: %w", o, o.GetName(), err)
		}
	}
	return nil
}

// waitFor polls check until it reports nothing pending, for at most
// timeout. check returns what is still pending (for the error), or an error
// that ends the wait.
func waitFor(ctx context.Context, timeout time.Duration, what string, check func(context.Context) (string, error)) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	tick := time.NewTicker(250 * time.Millisecond)
	defer tick.Stop()
	for {
		pending, err := check(ctx)
		if err != nil && ctx.Err() == nil {
			return fmt.Errorf("%s: %w", what, err)
		}
		if err == nil && pending == "" {
			return nil
		}
		select {
		case <-ctx.Done():
			if err != nil {
				pending = err.Error()
			}
			return fmt.Errorf("%s: still waiting after %s for %s", what, timeout, pending)
		case <-tick.C:
		}
	}
}

// pendingNetworks lists the networks among names that have no ID yet or
// are not Ready at their current generation (l3: blocks allocated).
func pendingNetworks(ctx context.Context, cl client.Client, names []string) (string, error) {
	var pending []string
	for _, name := range names {
		var n lacev1.Network
		if err := cl.Get(ctx, client.ObjectKey{Name: name}, &n); err != nil {
			if apierrors.IsNotFound(err) {
				pending = append(pending, name+" (missing)")
				continue
			}
			return "", fmt.Errorf("get Network %s: %w", name, err)
		}
		if n.Status.ID <= 0 || !conditionTrue(n.Status.Conditions, n.Generation) {
			pending = append(pending, name)
		}
	}
	return strings.Join(pending, ", "), nil
}

func conditionTrue(conds []metav1.Condition, generation int64) bool {
	c := meta.FindStatusCondition(conds, lacev1.ConditionReady)
	return c != nil && c.Status == metav1.ConditionTrue && c.ObservedGeneration == generation
}

func demoPod(s demoPodSpec) *corev1.Pod {
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: s.name, Namespace: "default", Labels: map[string]string{"net": s.network, "demo": "lace"}},
		Spec: corev1.PodSpec{
			NodeName: s.node, TerminationGracePeriodSeconds: ptr.To[int64](2),
			Containers: []corev1.Container{{
				Name: "netexec", Image: "registry.k8s.io/e2e-test-images/agnhost:2.53",
				Args:  []string{"netexec", fmt.Sprintf("--http-port=%d", demoPort), "--udp-port=8081"},
				Ports: []corev1.ContainerPort{{Name: "http", ContainerPort: demoPort}},
				ReadinessProbe: &corev1.Probe{ProbeHandler: corev1.ProbeHandler{HTTPGet: &corev1.HTTPGetAction{
					Path: "/healthz", Port: intstr.FromString("http")}}, PeriodSeconds: 1},
			}},
		},
	}
}

// serveExternal answers demo requests on the external host: an HTTP/1.0
// server on demoPort, in the external namespace, whose body names the
// address it was reached at (partner for a served address, world for the
// fabric address), so that a yes means the right address answered. stop
// closes it.
func serveExternal(nsPath string) (stop func(), err error) {
	ln, err := netutil.Listen(nsPath, "tcp", fmt.Sprintf(":%d", demoPort))
	if err != nil {
		return nil, fmt.Errorf("external host: listen on port %d: %w", demoPort, err)
	}
	served4, served6 := ExternalServedAddrs()
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			conn, err := ln.Accept()
			if err != nil {
				return
			}
			wg.Add(1)
			go func() {
				defer wg.Done()
				defer conn.Close()
				_ = conn.SetDeadline(time.Now().Add(demoTimeout))
				name := demoWorldNetwork
				if ap, err := netip.ParseAddrPort(conn.LocalAddr().String()); err == nil {
					if a := ap.Addr().Unmap(); a == served4 || a == served6 {
						name = demoPartnerNetwork
					}
				}
				// Read the request head, then answer.
				r := bufio.NewReader(conn)
				for {
					line, err := r.ReadString('\n')
					if err != nil {
						return
					}
					if strings.TrimSpace(line) == "" {
						break
					}
				}
				fmt.Fprintf(conn, "HTTP/1.0 200 OK\r\nContent-Type: text/plain\r\n\r\n%s", name)
			}()
		}
	}()
	return func() { ln.Close(); wg.Wait() }, nil
}

// demoEndpoint is a row or a column of the matrix.
type demoEndpoint struct {
	name  string
	netns string
	kind  model.EndpointKind
	// network and node are a pod's.
	network, node string
	// addrs are the endpoint's addresses, at most one per family.
	addrs []netip.Addr
}

func (e demoEndpoint) addr(v4 bool) (netip.Addr, bool) {
	for _, a := range e.addrs {
		if a.Is4() == v4 {
			return a, true
		}
	}
	return netip.Addr{}, false
}

func (e demoEndpoint) model(a netip.Addr) model.Endpoint {
	return model.Endpoint{Kind: e.kind, Network: e.network, Addr: a, NodeName: e.node}
}

// demoCell is one pair of the matrix, per family (IPv4, IPv6).
type demoCell struct {
	skip     bool
	measured [2]bool
	expected [2]model.Verdict
}

type demoMatrix map[[2]string]*demoCell

// measure sends a real request for every pair and family, all at once (an
// isolated pair waits out demoTimeout), and asks the oracle about each.
// A pod is not asked about itself (its own address never leaves it), nor
// the external host about itself.
func measure(ctx context.Context, topo model.Topology, srcs, dsts []demoEndpoint) demoMatrix {
	m := demoMatrix{}
	var mu sync.Mutex
	var wg sync.WaitGroup
	for _, src := range srcs {
		for _, dst := range dsts {
			cell := &demoCell{}
			m[[2]string{src.name, dst.name}] = cell
			if src.netns == dst.netns {
				cell.skip = true
				continue
			}
			for f, v4 := range []bool{true, false} {
				sa, ok1 := src.addr(v4)
				da, ok2 := dst.addr(v4)
				if !ok1 || !ok2 {
					cell.expected[f] = model.Verdict{Rule: "no address of this family"}
					continue
				}
				cell.expected[f] = model.Reach(topo, src.model(sa), dst.model(da), "TCP", demoPort)
				// Outside sources speak from a chosen address: the served
				// one for partner; pods from their own.
				var local netip.Addr
				if src.kind == model.EndpointOutside {
					local = sa
				}
				wg.Add(1)
				go func() {
					defer wg.Done()
					ok := demoRequest(ctx, src.netns, local, netip.AddrPortFrom(da, demoPort), dst.name)
					mu.Lock()
					cell.measured[f] = ok
					mu.Unlock()
				}()
			}
		}
	}
	wg.Wait()
	return m
}

// demoRequest sends GET /hostname from inside the network namespace at
// nsPath (from local when valid) to dst and reports whether want answered
// within demoTimeout.
func demoRequest(ctx context.Context, nsPath string, local netip.Addr, dst netip.AddrPort, want string) bool {
	ctx, cancel := context.WithTimeout(ctx, demoTimeout)
	defer cancel()
	var conn net.Conn
	err := netutil.Do(nsPath, func() error {
		var d net.Dialer
		if local.IsValid() {
			d.LocalAddr = &net.TCPAddr{IP: local.AsSlice()}
		}
		c, err := d.DialContext(ctx, "tcp", dst.String())
		conn = c
		return err
	})
	if err != nil {
		return false
	}
	defer conn.Close()
	if dl, ok := ctx.Deadline(); ok {
		_ = conn.SetDeadline(dl)
	}
	fmt.Fprintf(conn, "GET /hostname HTTP/1.0\r\nHost: demo\r\n\r\n")
	b, err := io.ReadAll(conn)
	if err != nil {
		return false
	}
	_, body, _ := strings.Cut(string(b), "\r\n\r\n")
	return strings.TrimSpace(body) == want
}

// demoWord says in which families a pair reaches: yes, no, v4 only, v6
// only.
func demoWord(v [2]bool) string {
	switch {
	case v[0] && v[1]:
		return "yes"
	case v[0]:
		return "v4 only"
	case v[1]:
		return "v6 only"
	}
	return "no"
}

// text is the cell as printed: measured (oracle), and ! when they differ.
func (c *demoCell) text() string {
	if c.skip {
		return "-"
	}
	exp := [2]bool{c.expected[0].Allowed, c.expected[1].Allowed}
	s := fmt.Sprintf("%s (%s)", demoWord(c.measured), demoWord(exp))
	if exp != c.measured {
		s += " !"
	}
	return s
}

func printMatrix(out io.Writer, m demoMatrix, srcs, dsts []demoEndpoint) {
	worldV4, worldV6 := ExternalUnderlay()
	partnerV4, partnerV6 := ExternalServedAddrs()
	fmt.Fprintf(out, `
Expected (docs/topology.md, model.Reach):
  frontend reaches backend; backend cannot open connections to frontend (replies
    of frontend's flows come back through conntrack)
  shared is reachable both ways from frontend and backend (all-to-shared, shared-to-all)
  sandbox is anonymous without a self policy: its pods reach nothing, not even each other
  partner (%s, %s, the external host's served site) is reachable from frontend only
  world (%s, %s, the external host's fabric address) is reachable from default only
  the external host reaches default pods only, from world (world -> default); from its
    partner address it reaches nothing (no policy from partner)
Each cell: measured (oracle) for a TCP request to port %d over IPv4 and IPv6:
  yes, no, v4 only, v6 only; ! where the measurement differs from the oracle.
`, partnerV4, partnerV6, worldV4, worldV6, demoPort)

	tw := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
	fmt.Fprintf(tw, "\nFROM \\ TO")
	for _, dst := range dsts {
		fmt.Fprintf(tw, "\t%s", dst.name)
	}
	fmt.Fprintln(tw)
	var mismatches []string
	for _, src := range srcs {
		fmt.Fprintf(tw, "%s", src.name)
		for _, dst := range dsts {
			c := m[[2]string{src.name, dst.name}]
			fmt.Fprintf(tw, "\t%s", c.text())
			if c.skip {
				continue
			}
			for f, fam := range []string{"IPv4", "IPv6"} {
				if c.measured[f] != c.expected[f].Allowed {
					mismatches = append(mismatches, fmt.Sprintf("  %s -> %s %s: measured %s, oracle %s: %s",
						src.name, dst.name, fam, yesNo(c.measured[f]), yesNo(c.expected[f].Allowed), c.expected[f].Rule))
				}
			}
		}
		fmt.Fprintln(tw)
	}
	tw.Flush()
	if len(mismatches) == 0 {
		fmt.Fprintln(out, "\nEvery cell agrees with the oracle.")
		return
	}
	fmt.Fprintf(out, "\n%d measurements differ from the oracle:\n%s\n", len(mismatches), strings.Join(mismatches, "\n"))
}

func yesNo(b bool) string {
	if b {
		return "yes"
	}
	return "no"
}

package e2e

import (
	"bufio"
	"context"
	"fmt"
	"net"
	"net/netip"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	crclient "sigs.k8s.io/controller-runtime/pkg/client"

	lacev1 "github.com/lace-cni/lace/api/v1alpha1"
	"github.com/lace-cni/lace/internal/netutil"
	"github.com/lace-cni/lace/lab"
)

// labelNetwork sets labels on a network (policies select networks by
// label).
func labelNetwork(t *testing.T, c crclient.Client, name string, kv map[string]string) {
	t.Helper()
	var nw lacev1.Network
	if err := c.Get(context.Background(), crKey(name), &nw); err != nil {
		t.Fatal(err)
	}
	patch := crclient.MergeFrom(nw.DeepCopy())
	if nw.Labels == nil {
		nw.Labels = map[string]string{}
	}
	for k, v := range kv {
		nw.Labels[k] = v
	}
	if err := c.Patch(context.Background(), &nw, patch); err != nil {
		t.Fatal(err)
	}
}

// routingPolicy creates a NetworkRoutingPolicy from src to dst labels,
// removed when the test ends.
func routingPolicy(t *testing.T, c crclient.Client, name string, src, dst map[string]string) {
	t.Helper()
	p := &lacev1.NetworkRoutingPolicy{ObjectMeta: metav1.ObjectMeta{Name: name}, Spec: lacev1.NetworkRoutingPolicySpec{
		SrcSelector: &metav1.LabelSelector{MatchLabels: src}, DestSelector: &metav1.LabelSelector{MatchLabels: dst}}}
	if err := c.Create(context.Background(), p); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Delete(context.Background(), p) })
}

// TestSpecRoutingPolicies applies the two NetworkRoutingPolicies of
// docs/topology.md as written. frontend -> backend is directional: the
// frontend pod reaches the backend pod (TCP, UDP, ICMP, both families, on
// another node) and the replies come back through conntrack, while the
// backend pod opening anything toward the frontend is dropped and counted
// as isolated on its node. The vrf: prod policy peers every prod network
// both ways; a network outside the label stays isolated from them.
func TestSpecRoutingPolicies(t *testing.T) {
	needLab(t)
	c := laceClient(t)
	network(t, c, "spec-fe", "10.111.0.0/16", "fd00:111::/48", false)
	network(t, c, "spec-be", "10.112.0.0/16", "fd00:112::/48", false)
	network(t, c, "spec-p1", "10.113.0.0/16", "fd00:113::/48", false)
	network(t, c, "spec-p2", "10.114.0.0/16", "fd00:114::/48", false)
	network(t, c, "spec-dev", "10.115.0.0/16", "fd00:115::/48", false)
	labelNetwork(t, c, "spec-fe", map[string]string{"tier": "frontend"})
	labelNetwork(t, c, "spec-be", map[string]string{"tier": "backend"})
	labelNetwork(t, c, "spec-p1", map[string]string{"vrf": "prod"})
	labelNetwork(t, c, "spec-p2", map[string]string{"vrf": "prod"})
	labelNetwork(t, c, "spec-dev", map[string]string{"vrf": "dev"})
	fe := netPod(t, "spec-fe-a", "spec-fe", "n1", true)
	be := netPod(t, "spec-be-a", "spec-be", "n2", true)
	p1 := netPod(t, "spec-p1-a", "spec-p1", "n1", true)
	p2 := netPod(t, "spec-p2-a", "spec-p2", "n3", true)
	dev := netPod(t, "spec-dev-a", "spec-dev", "n3", true)
	be4, _ := podAddrs(be)
	fe4, fe6 := podAddrs(fe)

	// Isolated until a policy opens them.
	expectNoReach(t, fe, be4, "n1", "isolated")

	routingPolicy(t, c, "spec-frontend-to-backend", map[string]string{"tier": "frontend"}, map[string]string{"tier": "backend"})
	expectReach(t, fe, be)
	expectNoReach(t, be, fe4, "n2", "isolated")
	expectNoReach(t, be, fe6, "n2", "isolated")
	expectPolicyStatus(t, c, "spec-frontend-to-backend", []string{"spec-fe"}, []string{"spec-be"})

	routingPolicy(t, c, "spec-prod-mesh", map[string]string{"vrf": "prod"}, map[string]string{"vrf": "prod"})
	expectReach(t, p1, p2)
	expectReach(t, p2, p1)
	p1v4, _ := podAddrs(p1)
	expectNoReach(t, dev, p1v4, "n3", "isolated")
	expectPolicyStatus(t, c, "spec-prod-mesh", []string{"spec-p1", "spec-p2"}, []string{"spec-p1", "spec-p2"})
}

// expectPolicyStatus waits for a policy's status to list the matched
// networks and report Ready.
func expectPolicyStatus(t *testing.T, c crclient.Client, name string, src, dst []string) {
	t.Helper()
	eventually(t, 30*time.Second, "status of "+name, func() error {
		var p lacev1.NetworkRoutingPolicy
		if err := c.Get(context.Background(), crKey(name), &p); err != nil {
			return err
		}
		if fmt.Sprint(p.Status.MatchedSources) != fmt.Sprint(src) || fmt.Sprint(p.Status.MatchedDestinations) != fmt.Sprint(dst) {
			return fmt.Errorf("matched %v -> %v, want %v -> %v", p.Status.MatchedSources, p.Status.MatchedDestinations, src, dst)
		}
		for _, cond := range p.Status.Conditions {
			if cond.Type == "Ready" && cond.Status == metav1.ConditionTrue {
				return nil
			}
		}
		return fmt.Errorf("not Ready: %+v", p.Status.Conditions)
	})
}

// TestPodsReachOutsideWithTheNodeAddress: the shipped default -> world
// policy lets a default pod reach the lab's external host, which sees the
// pod's node address (SNAT, both families); a pod of an isolated network
// does not get out (timeout, counted isolated).
func TestPodsReachOutsideWithTheNodeAddress(t *testing.T) {
	needLab(t)
	c := laceClient(t)
	network(t, c, "walled", "10.116.0.0/16", "fd00:116::/48", false)
	out := netPod(t, "out-default", "default", "n2", true)
	walled := netPod(t, "out-walled", "walled", "n2", true)
	ext := netutil.Path(labConfig().NetNS("external"))
	extV4, extV6 := lab.ExternalUnderlay()
	n2v4, n2v6 := lab.NodeUnderlay(2)
	for _, a := range []netip.Addr{extV4, extV6} {
		whoami(t, ext, netip.AddrPortFrom(a, 9090))
	}
	for _, tc := range []struct{ dst, want netip.Addr }{{extV4, n2v4}, {extV6, n2v6}} {
		eventually(t, 20*time.Second, fmt.Sprintf("default pod -> external %s", tc.dst), func() error {
			got, err := lineFrom(context.Background(), podNetNS(t, out), netip.AddrPortFrom(tc.dst, 9090))
			if err != nil {
				return err
			}
			if got != tc.want.String() {
				return fmt.Errorf("the external host saw %s, want the node's %s", got, tc.want)
			}
			return nil
		})
	}
	for _, dst := range []netip.Addr{extV4, extV6} {
		before := nodeDrops(t, "n2")
		_, err := lineFrom(context.Background(), podNetNS(t, walled), netip.AddrPortFrom(dst, 9090))
		if !isTimeout(err) {
			t.Errorf("isolated pod -> external %s: %v, want a timeout", dst, err)
		}
		if after := nodeDrops(t, "n2"); after["isolated"] <= before["isolated"] {
			t.Errorf("isolated pod -> external %s: n2's isolated counter did not move", dst)
		}
	}
}

// whoami serves TCP on addr inside the namespace at nsPath, answering each
// connection with the address it comes from.
func whoami(t *testing.T, nsPath string, addr netip.AddrPort) {
	t.Helper()
	ln, err := netutil.Listen(nsPath, "tcp", addr.String())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			conn, err := ln.Accept()
			if err != nil {
				return
			}
			fmt.Fprintf(conn, "%s\n", conn.RemoteAddr().(*net.TCPAddr).AddrPort().Addr().Unmap())
			conn.Close()
		}
	}()
}

// lineFrom connects from the namespace at nsPath to dst and reads a line.
func lineFrom(ctx context.Context, nsPath string, dst netip.AddrPort) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	conn, err := netutil.DialContext(ctx, nsPath, "tcp", dst.String())
	if err != nil {
		return "", err
	}
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(2 * time.Second))
	line, err := bufio.NewReader(conn).ReadString('\n')
	return strings.TrimSpace(line), err
}

// TestCrossNetworkStreamSurvivesAgentRestart holds one TCP connection from
// a pod of one network to a pod of another (one-way policy) on another
// node, and keeps using it while both agents restart: conntrack is pinned,
// so the replies keep coming back without a reverse policy.
func TestCrossNetworkStreamSurvivesAgentRestart(t *testing.T) {
	needLab(t)
	c := laceClient(t)
	network(t, c, "xs-client", "10.117.0.0/16", "fd00:117::/48", false)
	network(t, c, "xs-server", "10.118.0.0/16", "fd00:118::/48", false)
	labelNetwork(t, c, "xs-client", map[string]string{"xs": "client"})
	labelNetwork(t, c, "xs-server", map[string]string{"xs": "server"})
	routingPolicy(t, c, "xs-client-to-server", map[string]string{"xs": "client"}, map[string]string{"xs": "server"})
	a := netPod(t, "xs-a", "xs-client", "n1", true)
	b := netPod(t, "xs-b", "xs-server", "n2", true)
	b4, _ := podAddrs(b)
	a4, _ := podAddrs(a)
	var conn net.Conn
	eventually(t, 20*time.Second, "xs-a -> xs-b", func() error {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		var err error
		conn, err = netutil.DialContext(ctx, podNetNS(t, a), "tcp", net.JoinHostPort(b4.String(), "8080"))
		return err
	})
	defer conn.Close()
	ask := echoer(t, conn)
	ask("before")
	restartAgentsAsking(t, ask, func(string) error { return nil }, "n1", "n2")
	ask("after")
	// The reverse direction still opens nothing.
	expectNoReach(t, b, a4, "n2", "isolated")
}

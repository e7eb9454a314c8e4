package e2e

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"os/exec"
	"strings"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	crclient "sigs.k8s.io/controller-runtime/pkg/client"

	lacev1 "github.com/lace-cni/lace/api/v1alpha1"
	"github.com/lace-cni/lace/internal/model"
	"github.com/lace-cni/lace/internal/netutil"
	"github.com/lace-cni/lace/lab"
)

// lbClass creates a LoadBalancerClass with the given pool, deleted when
// the test ends.
func lbClass(t *testing.T, name string, addrs ...string) {
	t.Helper()
	c := laceClient(t)
	cl := &lacev1.LoadBalancerClass{ObjectMeta: metav1.ObjectMeta{Name: name}}
	for _, a := range addrs {
		cl.Spec.Addresses = append(cl.Spec.Addresses, lacev1.AddressRange(a))
	}
	if err := c.Create(context.Background(), cl); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Delete(context.Background(), cl) })
}

// waitIngress waits until service name holds n load balancer addresses
// and returns them.
func waitIngress(t *testing.T, name string, n int) []netip.Addr {
	t.Helper()
	var out []netip.Addr
	eventually(t, 30*time.Second, fmt.Sprintf("%d load balancer addresses on %s", n, name), func() error {
		svc, err := client.CoreV1().Services("default").Get(context.Background(), name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		out = model.IngressAddrs(svc)
		if len(out) != n {
			return fmt.Errorf("ingress %v", out)
		}
		return nil
	})
	return out
}

// announcers reads which nodes' data planes answer ARP/NDP for vip now.
func announcers(t *testing.T, vip netip.Addr) []string {
	t.Helper()
	who, err := lab.Announcers(labConfig(), vip)
	if err != nil {
		t.Fatal(err)
	}
	return who
}

// nodeMAC is the MAC of lab node's underlay interface.
func nodeMAC(t *testing.T, node string) string {
	t.Helper()
	mac, err := lab.NodeMAC(labConfig(), node)
	if err != nil {
		t.Fatal(err)
	}
	return mac
}

// externalNeighbour is the MAC the external host holds for addr.
func externalNeighbour(addr netip.Addr) string { return lab.ExternalNeighbour(labConfig(), addr) }

// healthCheck GETs a healthCheckNodePort from the external host (every
// connection dialled inside its namespace).
func healthCheck(addr netip.Addr, port int32) (int, string, error) {
	c := http.Client{Timeout: 2 * time.Second, Transport: &http.Transport{DisableKeepAlives: true,
		DialContext: func(ctx context.Context, network, a string) (net.Conn, error) {
			return netutil.DialContext(ctx, externalNS(), network, a)
		}}}
	resp, err := c.Get("http://" + net.JoinHostPort(addr.String(), fmt.Sprint(port)) + "/healthz")
	if err != nil {
		return 0, "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b), err
}

// TestLoadBalancerL2 drives LoadBalancer Services from the lab's external
// host: two classes, one dual-stack and one IPv4-only, give the families
// their pools hold; each VIP answers over TCP and UDP, announced by exactly
// one node whose MAC the external host learnt from its ARP/NDP answers;
// after the announcer's agent stops another node takes over (gratuitous
// ARP) within 3 s of the dead agent's last heartbeat, with traffic
// answered through it; externalTrafficPolicy Local moves the announcement
// to a node with an endpoint and the health check port answers 200/503 as
// endpoints come and go; an exhausted pool is an Event on the Service.
func TestLoadBalancerL2(t *testing.T) {
	needLab(t)
	ctx := context.Background()
	lbClass(t, "e2e-dual", "172.30.0.240/30", "fd00:30::f0/126")
	lbClass(t, "e2e-v4", "172.30.0.236/31")
	semStart(t, semPod("lb-a", "lb", "n1"), semPod("lb-b", "lb", "n2"))
	withClass := func(class string) func(*corev1.Service) {
		return func(s *corev1.Service) {
			s.Spec.Type = corev1.ServiceTypeLoadBalancer
			s.Spec.LoadBalancerClass = ptr.To(lacev1.LoadBalancerClassPrefix + class)
		}
	}
	semService(t, "lb", "lb", withClass("e2e-dual"))
	semService(t, "lb4", "lb", withClass("e2e-v4"))
	dual := waitIngress(t, "lb", 2)
	v4only := waitIngress(t, "lb4", 1)
	if !dual[0].Is4() || !dual[1].Is6() || !v4only[0].Is4() {
		t.Fatalf("addresses: dual-stack class %v, IPv4-only class %v", dual, v4only)
	}

	eventually(t, 30*time.Second, "an UnsupportedFamily Event on lb4 (IPv6 asked of an IPv4-only pool)", func() error {
		evs, err := client.CoreV1().Events("default").List(ctx, metav1.ListOptions{FieldSelector: "involvedObject.name=lb4"})
		if err != nil {
			return err
		}
		for _, e := range evs.Items {
			if e.Reason == model.LBReasonUnsupportedFamily {
				return nil
			}
		}
		return fmt.Errorf("%d events, none %s", len(evs.Items), model.LBReasonUnsupportedFamily)
	})

	ext := externalNS()
	for _, vip := range append(dual, v4only...) {
		askAll(t, ext, "tcp", netip.AddrPortFrom(vip, 80), "/hostname", "lb-a", "lb-b")
		askAll(t, ext, "udp", netip.AddrPortFrom(vip, 81), "hostname", "lb-a", "lb-b")
		var who []string
		eventually(t, 10*time.Second, "one announcer of "+vip.String(), func() error {
			if who = announcers(t, vip); len(who) != 1 {
				return fmt.Errorf("announced by %v", who)
			}
			return nil
		})
		if got, want := externalNeighbour(vip), nodeMAC(t, who[0]); got != want {
			t.Errorf("the external host holds %s for %s, want %s's %s", got, vip, who[0], want)
		}
		if vip.Is6() {
			group := netutil.SolicitedNode(vip).String()
			out, err := exec.Command("ip", "netns", "exec", labConfig().NetNS(who[0]), "ip", "-6", "maddr", "show", "dev", "eth0").Output()
			if err != nil || !strings.Contains(string(out), group) {
				t.Errorf("%s's underlay has not joined %s, the solicited-node group of %s (%v):\n%s", who[0], group, vip, err, out)
			}
		}
	}

	// Failover: the announcer's agent stops.
	vip := dual[0]
	old := announcers(t, vip)[0]
	if out, err := labCmd("stop", "agent/"+old).CombinedOutput(); err != nil {
		t.Fatalf("stop the agent of %s: %v\n%s", old, err, out)
	}
	t.Cleanup(func() {
		_ = labCmd("start", "agent/"+old).Run()
	})
	var lease coordinationv1.Lease
	if err := laceClient(t).Get(ctx, crclient.ObjectKey{Namespace: lab.HeartbeatNamespace, Name: "lace-agent-" + old}, &lease); err != nil || lease.Spec.RenewTime == nil {
		t.Fatalf("the lease of %s: %v", old, err)
	}
	lastBeat := lease.Spec.RenewTime.Time
	var took string
	var recovered time.Time
	deadline := time.Now().Add(15 * time.Second)
	for time.Now().Before(deadline) {
		mac := externalNeighbour(vip)
		for _, n := range []string{"n1", "n2", "n3"} {
			if n != old && mac == nodeMAC(t, n) {
				if got, err := semAsk(ext, "udp", netip.AddrPortFrom(vip, 81), "hostname"); err == nil && (got == "lb-a" || got == "lb-b") {
					took, recovered = n, time.Now()
				}
			}
		}
		if took != "" {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	if took == "" {
		t.Fatalf("no node took %s over from %s within 15 s (announcers now %v, the external host holds %s)",
			vip, old, announcers(t, vip), externalNeighbour(vip))
	}
	gap := recovered.Sub(lastBeat)
	t.Logf("L2 failover of %s: %s -> %s, traffic answered through %s %.2f s after %s's agent's last heartbeat", vip, old, took, took, gap.Seconds(), old)
	if gap > 3*time.Second {
		t.Errorf("failover took %.2f s from the dead agent's last heartbeat, want <= 3 s", gap.Seconds())
	}
	if who := announcers(t, vip); len(who) != 1 || who[0] != took {
		t.Errorf("after the failover %s is announced by %v, want %s alone (the dead agent's entry lapses)", vip, who, took)
	}
	// The agent comes back (it serves its node's health check port below).
	if out, err := labCmd("start", "agent/"+old).CombinedOutput(); err != nil {
		t.Fatalf("start the agent of %s again: %v\n%s", old, err, out)
	}

	// externalTrafficPolicy Local: announced where an endpoint is; the
	// health check port follows the endpoints.
	svc := semUpdateService(t, "lb", func(s *corev1.Service) {
		s.Spec.ExternalTrafficPolicy = corev1.ServiceExternalTrafficPolicyLocal
	})
	hc := svc.Spec.HealthCheckNodePort
	if hc == 0 {
		t.Fatal("no healthCheckNodePort allocated")
	}
	for _, tc := range []struct {
		node string
		code int
	}{{"n2", 200}, {"n3", 503}} {
		i := map[string]int{"n1": 1, "n2": 2, "n3": 3}[tc.node]
		eventually(t, 20*time.Second, fmt.Sprintf("health check %s:%d answers %d", tc.node, hc, tc.code), func() error {
			code, body, err := healthCheck(nodeAddr(i, true), hc)
			if err != nil {
				return err
			}
			if code != tc.code || (tc.code == 200 && !strings.Contains(body, `"localEndpoints":1`)) {
				return fmt.Errorf("%d %s", code, body)
			}
			return nil
		})
	}
	eventually(t, 20*time.Second, "the Local VIP announced by a node with an endpoint", func() error {
		who := announcers(t, vip)
		if len(who) != 1 || (who[0] != "n1" && who[0] != "n2") {
			return fmt.Errorf("announced by %v", who)
		}
		return nil
	})
	semDelete("lb-b", ptr.To[int64](0))
	eventually(t, 30*time.Second, "n2's health check at 503 once its endpoint left", func() error {
		code, body, err := healthCheck(nodeAddr(2, true), hc)
		if err != nil {
			return err
		}
		if code != 503 {
			return fmt.Errorf("%d %s", code, body)
		}
		return nil
	})

	// The IPv4-only pool holds two addresses: a third Service finds it
	// exhausted.
	v4Only := func(s *corev1.Service) {
		withClass("e2e-v4")(s)
		s.Spec.IPFamilyPolicy = ptr.To(corev1.IPFamilyPolicySingleStack)
		s.Spec.IPFamilies = []corev1.IPFamily{corev1.IPv4Protocol}
	}
	semService(t, "lb4b", "lb", v4Only)
	waitIngress(t, "lb4b", 1)
	semService(t, "lb4c", "lb", v4Only)
	eventually(t, 30*time.Second, "a PoolExhausted Event on lb4c", func() error {
		evs, err := client.CoreV1().Events("default").List(ctx, metav1.ListOptions{FieldSelector: "involvedObject.name=lb4c"})
		if err != nil {
			return err
		}
		for _, e := range evs.Items {
			if e.Reason == model.LBReasonPoolExhausted {
				return nil
			}
		}
		return fmt.Errorf("%d events, none %s", len(evs.Items), model.LBReasonPoolExhausted)
	})
}

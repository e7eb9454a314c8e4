package e2e

import (
	"context"
	"fmt"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"

	"github.com/lace-cni/lace/internal/dpmetrics"
	"github.com/lace-cni/lace/lab"
)

// policyPod starts a netexec pod (HTTP 8080 named "http", UDP 8081) with
// labels on node, in the default network.
func policyPod(t *testing.T, name, node string, labels map[string]string) *corev1.Pod {
	t.Helper()
	p := netexecPod(name, node)
	for k, v := range labels {
		p.Labels[k] = v
	}
	if _, err := client.CoreV1().Pods("default").Create(context.Background(), p, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = client.CoreV1().Pods("default").Delete(context.Background(), name, metav1.DeleteOptions{GracePeriodSeconds: ptr.To[int64](0)})
	})
	return waitPodReady(t, "default", name)
}

func applyPolicy(t *testing.T, np *networkingv1.NetworkPolicy) {
	t.Helper()
	ctx := context.Background()
	if _, err := client.NetworkingV1().NetworkPolicies("default").Create(ctx, np, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = client.NetworkingV1().NetworkPolicies("default").Delete(context.Background(), np.Name, metav1.DeleteOptions{})
	})
}

// answers waits until from reaches dst over proto ("http" on 8080, "udp"
// on 8081), answered by want.
func answers(t *testing.T, from *corev1.Pod, proto string, dst netip.Addr, want string) {
	t.Helper()
	eventually(t, 20*time.Second, fmt.Sprintf("%s %s -> %s", proto, from.Name, dst), func() error {
		got, err := dial(context.Background(), from, proto, dst)
		if err != nil {
			return err
		}
		if len(got) != 1 || got[0] != want {
			return fmt.Errorf("answered by %v", got)
		}
		return nil
	})
}

// refused waits until from's requests over proto ("tcp" or "udp") to dst
// go unanswered (a timeout: the policy drops, it does not reject), and
// checks that node's policy drop counter and the policy's own metric
// moved with the last one.
func refused(t *testing.T, from *corev1.Pod, proto string, dst netip.Addr, node, policy string) {
	t.Helper()
	eventually(t, 20*time.Second, fmt.Sprintf("%s %s -> %s refused", proto, from.Name, dst), func() error {
		before, metric := nodeDrops(t, node)["policy"], policyDropMetric(t, node, policy)
		if err := noAnswer(context.Background(), from, proto, dst); err != nil {
			return err
		}
		if after := nodeDrops(t, node)["policy"]; after <= before {
			return fmt.Errorf("no answer, but the policy drop counter on %s did not move (%d)", node, after)
		}
		if m := policyDropMetric(t, node, policy); m <= metric {
			return fmt.Errorf("%s{name=%q} on %s did not move (%v)", dpmetrics.PolicyDrops, policy, node, m)
		}
		return nil
	})
}

// policyDropMetric reads the agent's drop count of default/policy on node.
func policyDropMetric(t *testing.T, node, policy string) float64 {
	t.Helper()
	body, err := getFromNode(context.Background(), node, "http://127.0.0.1:9962/metrics")
	if err != nil {
		t.Fatalf("scrape %s: %v", node, err)
	}
	var n float64
	want := fmt.Sprintf(`%s{kind="NetworkPolicy",name=%q,namespace="default"} `, dpmetrics.PolicyDrops, policy)
	for _, line := range strings.Split(string(body), "\n") {
		if v, ok := strings.CutPrefix(line, want); ok {
			_, _ = fmt.Sscanf(v, "%g", &n)
		}
	}
	return n
}

// TestNetworkPolicy: a NetworkPolicy isolates the pods it selects, in both
// families, on one node and across nodes, directly and through a
// Service: what its rules allow passes (by pod labels, named port), the
// rest times out and is counted on the policy; a label change, and the
// policy's deletion, take effect without restarting anything.
func TestNetworkPolicy(t *testing.T) {
	needLab(t)
	ctx := context.Background()
	srv := policyPod(t, "np-srv", "n1", map[string]string{"np": "srv"})
	far := policyPod(t, "np-far", "n2", map[string]string{"np": "client", "role": "allowed"})
	near := policyPod(t, "np-near", "n1", map[string]string{"np": "client"})
	svc := dualStackService(t, "np-svc", srv.Labels["app"], nil)
	waitEndpoints(t, svc, 1)
	v4, v6 := podAddrs(srv)
	srvAddrs := []netip.Addr{v4, v6}
	for _, dst := range srvAddrs {
		answers(t, near, "http", dst, srv.Name)
		answers(t, near, "udp", dst, srv.Name)
	}
	// Asking for flows turns n1's events on.
	lacectlFlows(t, "--node", "n1")
	// A pod reaches the agent's metrics on its node's address, but not
	// the node's flows.
	eventually(t, 20*time.Second, "np-near refused /flows on n1's address", func() error {
		base := "http://" + netip.AddrPortFrom(nodeAddr(1, true), 9962).String()
		if code, _, err := getFromPod(ctx, near, base+"/metrics"); err != nil || code != http.StatusOK {
			return fmt.Errorf("/metrics from np-near: %d (%v)", code, err)
		}
		code, body, err := getFromPod(ctx, near, base+"/flows")
		if err != nil || code != http.StatusForbidden || !strings.Contains(body, "not served to pods") {
			return fmt.Errorf("/flows from np-near: %d %q (%v), want 403", code, body, err)
		}
		return nil
	})

	// Ingress to np-srv: TCP to its port named http, from role=allowed.
	applyPolicy(t, &networkingv1.NetworkPolicy{
		ObjectMeta: metav1.ObjectMeta{Name: "np-srv-in"},
		Spec: networkingv1.NetworkPolicySpec{
			PodSelector: metav1.LabelSelector{MatchLabels: map[string]string{"np": "srv"}},
			Ingress: []networkingv1.NetworkPolicyIngressRule{{
				From:  []networkingv1.NetworkPolicyPeer{{PodSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"role": "allowed"}}}},
				Ports: []networkingv1.NetworkPolicyPort{{Port: ptr.To(intstr.FromString("http"))}},
			}},
		},
	})
	for _, dst := range srvAddrs {
		refused(t, near, "tcp", dst, "n1", "np-srv-in")
		refused(t, near, "udp", dst, "n1", "np-srv-in")
		answers(t, far, "http", dst, srv.Name)
		refused(t, far, "udp", dst, "n1", "np-srv-in")
	}
	// lacectl flows names the refusal: pods, network, policy, direction;
	// and np-near's new flow as it left n1.
	out := lacectlFlows(t, "--node", "n1", "--verdict", "dropped", "-n", "default")
	want := fmt.Sprintf("default/np-near (%s) [default] -> default/np-srv (%s) [default]  reason policy (NetworkPolicy default/np-srv-in, ingress)",
		netip.AddrPortFrom(near4(near), 0).Addr(), v4)
	if !strings.Contains(out, "DROPPED") || !strings.Contains(out, "default/np-srv-in, ingress") || !strings.Contains(out, "default/np-near (") {
		t.Errorf("lacectl flows --verdict dropped lacks np-near's refusal (like %q):\n%s", want, out)
	}
	if all := lacectlFlows(t, "--node", "n1", "--verdict", "forwarded"); !strings.Contains(all, "FORWARDED") || !strings.Contains(all, "default/np-near (") {
		t.Errorf("lacectl flows --verdict forwarded lacks np-near's new flows:\n%s", all)
	}
	// Through the Service: decided on the endpoint, after translation.
	for _, vip := range clusterIPs(svc) {
		eventually(t, 20*time.Second, "allowed through the service "+vip.String(), func() error {
			got, err := askVIP(ctx, far, "http", vip)
			if err == nil && got != srv.Name {
				err = fmt.Errorf("answered by %q", got)
			}
			return err
		})
		if got, err := askVIP(ctx, near, "http", vip); err == nil {
			t.Errorf("np-near reached np-srv through %s (answered by %q) past the policy", vip, got)
		}
	}
	// lacectl flows names the Service np-near addressed, beside the
	// endpoint; and a Service without endpoints rejecting np-near, with
	// the Service and the reason.
	empty := dualStackService(t, "np-empty", "np-nobody", nil)
	emptyVIP := clusterIPs(empty)[0]
	eventually(t, 30*time.Second, "np-near's Service flows told", func() error {
		if _, err := askVIP(ctx, near, "http", emptyVIP); err == nil {
			return fmt.Errorf("%s answered without endpoints", emptyVIP)
		}
		out := lacectlFlows(t, "--node", "n1", "-n", "default")
		for _, want := range []string{
			fmt.Sprintf("-> default/np-srv (%s) [default]  service default/np-svc (", netip.AddrPortFrom(v4, 8080)),
			fmt.Sprintf("-> %s [default]  service default/np-empty (%[1]s)  reason no-endpoints", netip.AddrPortFrom(emptyVIP, 80)),
		} {
			if !strings.Contains(out, want) {
				return fmt.Errorf("lacectl flows lacks %q:\n%s", want, out)
			}
		}
		return nil
	})

	// A label change admits np-near; its removal shuts it out again.
	setLabel := func(v *string) {
		t.Helper()
		patch := `{"metadata":{"labels":{"role":null}}}`
		if v != nil {
			patch = fmt.Sprintf(`{"metadata":{"labels":{"role":%q}}}`, *v)
		}
		if _, err := client.CoreV1().Pods("default").Patch(ctx, near.Name, "application/merge-patch+json", []byte(patch), metav1.PatchOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	setLabel(ptr.To("allowed"))
	for _, dst := range srvAddrs {
		answers(t, near, "http", dst, srv.Name)
	}
	setLabel(nil)
	refused(t, near, "tcp", v4, "n1", "np-srv-in")

	// Egress of np-far: only to np-srv's http; nothing else it opens
	// leaves its node, and its own ingress stays open.
	applyPolicy(t, &networkingv1.NetworkPolicy{
		ObjectMeta: metav1.ObjectMeta{Name: "np-far-out"},
		Spec: networkingv1.NetworkPolicySpec{
			PodSelector: metav1.LabelSelector{MatchLabels: map[string]string{"role": "allowed"}},
			PolicyTypes: []networkingv1.PolicyType{networkingv1.PolicyTypeEgress},
			Egress: []networkingv1.NetworkPolicyEgressRule{{
				To:    []networkingv1.NetworkPolicyPeer{{PodSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"np": "srv"}}}},
				Ports: []networkingv1.NetworkPolicyPort{{Protocol: ptr.To(corev1.ProtocolTCP), Port: ptr.To(intstr.FromInt32(8080))}},
			}},
		},
	})
	nv4, nv6 := podAddrs(near)
	for _, dst := range []netip.Addr{nv4, nv6} {
		refused(t, far, "tcp", dst, "n2", "np-far-out")
		refused(t, far, "udp", dst, "n2", "np-far-out")
		answers(t, near, "http", addrOfFamily(far, dst.Is6()), far.Name)
	}
	for _, dst := range srvAddrs {
		answers(t, far, "http", dst, srv.Name)
	}

	// Both deleted: everything is open again.
	for _, name := range []string{"np-srv-in", "np-far-out"} {
		if err := client.NetworkingV1().NetworkPolicies("default").Delete(ctx, name, metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	for _, dst := range srvAddrs {
		answers(t, near, "udp", dst, srv.Name)
		answers(t, far, "udp", dst, srv.Name)
	}
	answers(t, far, "udp", nv4, near.Name)
}

func addrOfFamily(p *corev1.Pod, v6 bool) netip.Addr {
	v4, a6 := podAddrs(p)
	if v6 {
		return a6
	}
	return v4
}

// lacectlFlows runs lacectl flows with args (through the API server's pod
// proxy to the agents) and returns what it printed.
func lacectlFlows(t *testing.T, args ...string) string {
	t.Helper()
	cmd := exec.Command(filepath.Join(binDir, "lacectl"), append([]string{"flows"}, args...)...)
	cmd.Env = append(os.Environ(), "KUBECONFIG="+kubeconfig)
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("lacectl flows %v: %v\n%s", args, err, out)
	}
	return string(out)
}

func near4(p *corev1.Pod) netip.Addr {
	v4, _ := podAddrs(p)
	return v4
}

// getFromPod GETs url from inside pod's network namespace.
func getFromPod(ctx context.Context, pod *corev1.Pod, url string) (int, string, error) {
	ns, err := lab.PodNetNS(ctx, labConfig(), pod.Namespace, pod.Name)
	if err != nil {
		return 0, "", err
	}
	code, body, err := getInNS(ctx, ns, url)
	return code, string(body), err
}

package e2e

import (
	"context"
	"fmt"
	"net/netip"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"

	"github.com/lace-cni/lace/internal/lab"
)

// TestServiceBudget: one tenant's Service whose addresses times ports
// (2 ClusterIPs and the lab's 10 allowed external IPs x 5,600 ports =
// 67,200 frontends) exceed the whole of lace_services (65,536) is refused
// whole on every node, with a Warning Event and the
// lace_agent_services_refused metric; another tenant's Service created
// afterwards is served, its endpoint changes are programmed, and an
// agent restarted meanwhile makes its node ready again. Before the
// budget the hog filled the map, every later sync failed with E2BIG, and
// the later Service was never served.
func TestServiceBudget(t *testing.T) {
	needLab(t)
	ctx := context.Background()
	hog := &corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: "budget-hog"}, Spec: corev1.ServiceSpec{
		Selector:       map[string]string{"app": "budget-nothing"},
		IPFamilyPolicy: ptr.To(corev1.IPFamilyPolicyRequireDualStack),
	}}
	for _, r := range lab.ExternalIPRanges() {
		p := netip.MustParsePrefix(r)
		for a := p.Addr(); p.Contains(a); a = a.Next() {
			hog.Spec.ExternalIPs = append(hog.Spec.ExternalIPs, a.String())
		}
	}
	for p := range 5600 {
		hog.Spec.Ports = append(hog.Spec.Ports, corev1.ServicePort{Name: fmt.Sprintf("p%d", p), Protocol: corev1.ProtocolTCP,
			Port: int32(10000 + p), TargetPort: intstr.FromInt32(8080)})
	}
	if n := (2 + len(hog.Spec.ExternalIPs)) * len(hog.Spec.Ports); n <= 65536 {
		t.Fatalf("the hog has %d frontends: not more than lace_services holds", n)
	}
	if _, err := client.CoreV1().Services("default").Create(ctx, hog, metav1.CreateOptions{}); err != nil {
		t.Fatalf("create the hog: %v", err)
	}
	t.Cleanup(func() {
		_ = client.CoreV1().Services("default").Delete(context.Background(), hog.Name, metav1.DeleteOptions{})
	})
	eventually(t, 60*time.Second, "ServiceOverBudget Events on the hog from every agent", func() error {
		evs, err := client.CoreV1().Events("default").List(ctx, metav1.ListOptions{FieldSelector: "involvedObject.name=" + hog.Name})
		if err != nil {
			return err
		}
		from := map[string]bool{}
		for _, e := range evs.Items {
			if e.Type == corev1.EventTypeWarning && e.Reason == "ServiceOverBudget" && strings.HasPrefix(e.Source.Component, "lace-agent/") {
				from[e.Source.Component] = true
			}
		}
		if len(from) != 3 {
			return fmt.Errorf("Events from %v, want the 3 agents", from)
		}
		return nil
	})
	eventually(t, 30*time.Second, "lace_agent_services_refused on n1", func() error {
		body, err := getFromNode(ctx, "n1", "http://127.0.0.1:9962/metrics")
		if err != nil {
			return err
		}
		if !strings.Contains(string(body), `lace_agent_services_refused{reason="ServiceOverBudget"} 1`) {
			return fmt.Errorf("no refused service in the metrics")
		}
		return nil
	})

	// Another tenant, afterwards: served, and its endpoints follow.
	client1 := netPod(t, "budget-client", "default", "n1", true)
	appPod(t, "budget-web-a", "default", "budget-web", "n2")
	web := dualStackService(t, "budget-web", "budget-web", nil)
	waitEndpoints(t, web, 1)
	expectServed(t, client1, web, "budget-web-a")
	appPod(t, "budget-web-b", "default", "budget-web", "n3")
	waitEndpoints(t, web, 2)
	expectServed(t, client1, web, "budget-web-a", "budget-web-b")

	// An agent restarted beside the hog becomes ready (the restart waits
	// for its pod's readiness: the data plane programmed) and serves.
	if out, err := labCmd("restart", "agent/n1").CombinedOutput(); err != nil {
		t.Fatalf("restart n1's agent: %v\n%s", err, out)
	}
	if err := cniStatus(t, "n1"); err != nil {
		t.Errorf("CNI STATUS on n1 after the restart: %v", err)
	}
	expectServed(t, client1, web, "budget-web-a", "budget-web-b")
}

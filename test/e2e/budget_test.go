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

	"github.com/lace-cni/lace/lab"
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

	budgetVerdictsSurviveRestart(t, client1)
}

// budgetVerdictsSurviveRestart: in a tenant's share of the maps, an old
// Service refused for its growth stays refused when n1's agent restarts,
// and the newer Service it would push out stays served: the restarted
// agent starts its budget from what the one before programmed. Before, a
// restarted agent judged by age alone: the grown Service was admitted
// and the newer one, served until then, dropped.
func budgetVerdictsSurviveRestart(t *testing.T, client1 *corev1.Pod) {
	ctx := context.Background()
	const ns = "budget-tenant"
	// The chart's defaults in the lab: one Service may take 8,192
	// frontends, a namespace a quarter of lace_services' 65,536.
	const perService, share, webFrontends = 8192, 65536 / 4, 4
	if 1+perService+webFrontends > share || 2*perService > share || 2*perService+webFrontends <= share {
		t.Fatal("the sizes below no longer make the case")
	}
	tenantNamespace(t, ns, nil)
	svcs := client.CoreV1().Services(ns)
	ports := func(n int) []corev1.ServicePort {
		out := make([]corev1.ServicePort, n)
		for i := range out {
			out[i] = corev1.ServicePort{Name: fmt.Sprintf("p%d", i), Protocol: corev1.ProtocolTCP, Port: int32(10000 + i),
				TargetPort: intstr.FromInt32(8080)}
		}
		return out
	}
	// Each Service is created in a later second than the one before:
	// creation times order them (within a second the random UID would).
	var last metav1.Time
	create := func(svc *corev1.Service) *corev1.Service {
		t.Helper()
		var created *corev1.Service
		eventually(t, 20*time.Second, "create "+svc.Name+" after the Service before it", func() error {
			c, err := svcs.Create(ctx, svc.DeepCopy(), metav1.CreateOptions{})
			if err != nil {
				return err
			}
			if !c.CreationTimestamp.After(last.Time) {
				_ = svcs.Delete(ctx, c.Name, metav1.DeleteOptions{})
				return fmt.Errorf("created in the same second as the Service before it")
			}
			created = c
			return nil
		})
		t.Cleanup(func() { _ = svcs.Delete(context.Background(), svc.Name, metav1.DeleteOptions{}) })
		last = created.CreationTimestamp
		return created
	}
	nothing := map[string]string{"app": "budget-nothing"}
	grow := create(&corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: "budget-grow"},
		Spec: corev1.ServiceSpec{Selector: nothing, Ports: ports(1)}})
	fill := create(&corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: "budget-fill"},
		Spec: corev1.ServiceSpec{Selector: nothing, Ports: ports(perService)}})
	tenantPod(t, ns, "budget-tweb-a", "budget-tweb", "n2")
	web := create(&corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: "budget-tweb"}, Spec: corev1.ServiceSpec{
		Selector:       map[string]string{"app": "budget-tweb"},
		IPFamilyPolicy: ptr.To(corev1.IPFamilyPolicyRequireDualStack),
		Ports: []corev1.ServicePort{
			{Name: "http", Port: 80, TargetPort: intstr.FromInt32(8080), Protocol: corev1.ProtocolTCP},
			{Name: "udp", Port: 81, TargetPort: intstr.FromInt32(8081), Protocol: corev1.ProtocolUDP},
		},
	}})
	growVIP, fillVIP := netip.MustParseAddr(grow.Spec.ClusterIP), netip.MustParseAddr(fill.Spec.ClusterIP)
	// programmed says whether n1 serves grow's first port and fill's
	// last one.
	programmed := func() (growOn, fillOn bool, err error) {
		table, err := semTable("n1")
		if err != nil {
			return false, false, err
		}
		return semEntry(table, growVIP, semTCP, 10000) != nil, semEntry(table, fillVIP, semTCP, 10000+perService-1) != nil, nil
	}
	eventually(t, 60*time.Second, "n1 serves budget-grow and budget-fill", func() error {
		g, f, err := programmed()
		if err == nil && (!g || !f) {
			err = fmt.Errorf("budget-grow served %v, budget-fill %v", g, f)
		}
		return err
	})
	expectServed(t, client1, web, "budget-tweb-a")

	// budget-grow grows to the per-Service bound: with budget-fill it
	// would fill the share, and budget-tweb, newer, would not fit.
	eventually(t, 30*time.Second, "grow budget-grow", func() error {
		g, err := svcs.Get(ctx, grow.Name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		g.Spec.Ports = ports(perService)
		_, err = svcs.Update(ctx, g, metav1.UpdateOptions{})
		return err
	})
	// refusedAfter waits for a Warning Event on budget-grow from n1's
	// agent later than since, and n1 no longer serving it; it returns
	// the Event's time.
	refusedAfter := func(since time.Time) (at time.Time) {
		t.Helper()
		eventually(t, 60*time.Second, "n1 refuses budget-grow for its growth", func() error {
			evs, err := client.CoreV1().Events(ns).List(ctx, metav1.ListOptions{FieldSelector: "involvedObject.name=" + grow.Name})
			if err != nil {
				return err
			}
			for _, e := range evs.Items {
				if e.Type == corev1.EventTypeWarning && e.Reason == "ServiceNamespaceShareFull" &&
					e.Source.Component == "lace-agent/n1" && e.LastTimestamp.Time.After(since) {
					at = e.LastTimestamp.Time
				}
			}
			if at.IsZero() {
				return fmt.Errorf("no ServiceNamespaceShareFull Event from n1 after %s", since.Format(time.RFC3339))
			}
			g, f, err := programmed()
			if err == nil && (g || !f) {
				err = fmt.Errorf("budget-grow served %v, budget-fill %v", g, f)
			}
			return err
		})
		return at
	}
	before := refusedAfter(time.Time{})
	expectServed(t, client1, web, "budget-tweb-a")

	// n1's agent restarts with the same Services: the same verdicts.
	if out, err := labCmd("restart", "agent/n1").CombinedOutput(); err != nil {
		t.Fatalf("restart n1's agent: %v\n%s", err, out)
	}
	refusedAfter(before)
	expectServed(t, client1, web, "budget-tweb-a")
	body, err := getFromNode(ctx, "n1", "http://127.0.0.1:9962/metrics")
	if err != nil || !strings.Contains(string(body), `lace_agent_services_refused{reason="ServiceNamespaceShareFull"} 1`) {
		t.Errorf("n1's metrics after the restart do not count one Service refused for its namespace's share (%v)", err)
	}
}

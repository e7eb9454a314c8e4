package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"net/netip"
	"net/url"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"

	lacev1 "github.com/lace-cni/lace/api/v1alpha1"
	"github.com/lace-cni/lace/internal/datapath"
	"github.com/lace-cni/lace/internal/model"
	"github.com/lace-cni/lace/internal/netutil"
	"github.com/lace-cni/lace/lab"
)

// tenantNamespace creates a namespace with labels, deleted when the test
// ends.
func tenantNamespace(t *testing.T, name string, labels map[string]string) {
	t.Helper()
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: labels}}
	if _, err := client.CoreV1().Namespaces().Create(context.Background(), ns, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = client.CoreV1().Namespaces().Delete(context.Background(), name, metav1.DeleteOptions{})
	})
}

// tenantPod starts a netexec pod labelled app=<app> in namespace ns on
// node and waits until it is Ready.
func tenantPod(t *testing.T, ns, name, app, node string) {
	t.Helper()
	p := netexecPod(name, node)
	p.Namespace, p.Labels["app"] = ns, app
	if _, err := client.CoreV1().Pods(ns).Create(context.Background(), p, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = client.CoreV1().Pods(ns).Delete(context.Background(), name, metav1.DeleteOptions{GracePeriodSeconds: ptr.To[int64](0)})
	})
	waitPodReady(t, ns, name)
}

// tenantService creates service name in ns selecting app=<app>, each port
// to netexec's HTTP 8080, changed by edit.
func tenantService(t *testing.T, ns, name, app string, ports []int32, edit func(*corev1.Service)) *corev1.Service {
	t.Helper()
	svc := &corev1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Spec: corev1.ServiceSpec{Selector: map[string]string{"app": app}}}
	for _, p := range ports {
		svc.Spec.Ports = append(svc.Spec.Ports, corev1.ServicePort{Name: fmt.Sprint("p", p), Port: p,
			TargetPort: intstr.FromInt32(8080), Protocol: corev1.ProtocolTCP})
	}
	if edit != nil {
		edit(svc)
	}
	created, err := client.CoreV1().Services(ns).Create(context.Background(), svc, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = client.CoreV1().Services(ns).Delete(context.Background(), name, metav1.DeleteOptions{}) })
	return created
}

// waitServiceEvent waits for a Warning Event of reason on ns/name whose
// message contains every one of want, and for the Service's annotation
// key to start with reason.
func waitServiceEvent(t *testing.T, ns, name, annotation, reason string, want ...string) {
	t.Helper()
	ctx := context.Background()
	eventually(t, 30*time.Second, fmt.Sprintf("a %s Event and annotation on %s/%s", reason, ns, name), func() error {
		svc, err := client.CoreV1().Services(ns).Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		if a := svc.Annotations[annotation]; !strings.HasPrefix(a, reason) {
			return fmt.Errorf("annotation %s = %q", annotation, a)
		}
		evs, err := client.CoreV1().Events(ns).List(ctx, metav1.ListOptions{FieldSelector: "involvedObject.name=" + name})
		if err != nil {
			return err
		}
		for _, e := range evs.Items {
			if e.Type != corev1.EventTypeWarning || e.Reason != reason {
				continue
			}
			missing := ""
			for _, w := range want {
				if !strings.Contains(e.Message, w) {
					missing = w
				}
			}
			if missing == "" {
				return nil
			}
		}
		return fmt.Errorf("%d events, none %s naming %v", len(evs.Items), reason, want)
	})
}

// TestHostileExternalIPs: a tenant names the lab API server's address,
// an outside resolver and the external host's address as external IPs of
// its Service (CVE-2020-8554). None is in the lab's allow-list, so none is
// served: a Warning Event and the annotation say why, no node's data plane
// holds them, and a default-network pod and a node process (a
// host-network pod: the kubelet's position) still reach the real API
// server at 172.30.0.1 and its port (it answers an HTTP request on its TLS port
// with "Client sent an HTTP request to an HTTPS server"), the pod the real
// external host. Of two Services naming one allowed address, the older
// keeps it although the newer sorts first by name, on every port: a newer
// Service naming it on another port is refused and not served.
func TestHostileExternalIPs(t *testing.T) {
	needLab(t)
	ctx := context.Background()
	const tenant = "e2e-tenant-xip"
	tenantNamespace(t, tenant, nil)
	tenantPod(t, tenant, "xip-thief", "thief", "n1")
	api, _ := lab.APIServerAddrs()
	// The API server's port on the fabric is the lab's own (the kubernetes
	// Service's endpoint).
	sls, err := client.DiscoveryV1().EndpointSlices("default").List(ctx, metav1.ListOptions{LabelSelector: "kubernetes.io/service-name=kubernetes"})
	if err != nil || len(sls.Items) == 0 || len(sls.Items[0].Ports) == 0 || sls.Items[0].Ports[0].Port == nil {
		t.Fatalf("the kubernetes Service's endpoint slices: %v %v", sls, err)
	}
	apiPort := *sls.Items[0].Ports[0].Port
	extHost, _ := lab.ExternalUnderlay()
	const extPort = 9443
	whoami(t, externalNS(), netip.AddrPortFrom(extHost, extPort))
	hostile := tenantService(t, tenant, "hostile", "thief", []int32{apiPort, extPort, 53}, func(s *corev1.Service) {
		s.Spec.ExternalIPs = []string{api.String(), "8.8.8.8", extHost.String()}
	})
	// Once every node serves the Service's ClusterIP (and would serve its
	// external IPs, computed in the same pass), none holds an external IP.
	cip := netip.MustParseAddr(hostile.Spec.ClusterIP)
	for _, node := range []string{"n1", "n2", "n3"} {
		var table []datapath.Service
		eventually(t, 30*time.Second, node+" serves the hostile Service's ClusterIP", func() error {
			var err error
			if table, err = semTable(node); err != nil {
				return err
			}
			if e := semEntry(table, cip, semTCP, uint16(apiPort)); e == nil || len(e.Backends) == 0 {
				return fmt.Errorf("the ClusterIP %s:%d is %s", cip, apiPort, semDescribe(e))
			}
			return nil
		})
		for _, a := range []string{api.String(), "8.8.8.8", extHost.String()} {
			for _, port := range []uint16{uint16(apiPort), extPort, 53} {
				if e := semEntry(table, netip.MustParseAddr(a), semTCP, port); e != nil {
					t.Errorf("%s serves the tenant's external IP %s:%d: %s", node, a, port, semDescribe(e))
				}
			}
		}
	}

	// A default-network pod reaches the real API server and external host.
	pods := semStart(t, semPod("xip-client", "xip-client", "n1"))
	podNS := podNetNS(t, pods["xip-client"])
	apiAnswer := func(nsPath string) (string, error) {
		c, err := netutil.DialContext(ctx, nsPath, "tcp", netip.AddrPortFrom(api, uint16(apiPort)).String())
		if err != nil {
			return "", err
		}
		defer c.Close()
		_ = c.SetDeadline(time.Now().Add(3 * time.Second))
		fmt.Fprintf(c, "GET /hostname HTTP/1.0\r\nHost: e2e\r\n\r\n")
		b := make([]byte, 512)
		n, _ := c.Read(b)
		return string(b[:n]), nil
	}
	for range 5 {
		got, err := apiAnswer(podNS)
		if err != nil || !strings.Contains(got, "HTTPS server") || strings.Contains(got, "xip-thief") {
			t.Fatalf("default pod -> %s:%d answered %q (%v), want the real API server", api, apiPort, got, err)
		}
		if line, err := lineFrom(ctx, podNS, netip.AddrPortFrom(extHost, extPort)); err != nil || func() bool {
			_, perr := netip.ParseAddr(line)
			return perr != nil
		}() {
			t.Fatalf("default pod -> %s:%d answered %q (%v), want the external host's whoami", extHost, extPort, line, err)
		}
	}

	// A node process: a host-network pod on n1 (in the node's cgroup and
	// network namespace, where the kubelet and the agent live) asks the
	// API server's address through netexec's /dial.
	hp := netexecPod("xip-hostnet", "n1")
	hp.Spec.HostNetwork = true
	hp.Spec.Containers[0].Args = []string{"netexec", "--http-port=18190", "--udp-port=18191"}
	hp.Spec.Containers[0].Ports = []corev1.ContainerPort{{Name: "http", ContainerPort: 18190}}
	if _, err := client.CoreV1().Pods("default").Create(ctx, hp, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { semDelete(hp.Name, ptr.To[int64](0)) })
	waitPodReady(t, "default", hp.Name)
	n1, _ := lab.NodeUnderlay(1)
	for range 5 {
		q := url.Values{"host": {api.String()}, "port": {fmt.Sprint(apiPort)}, "request": {"hostname"}, "protocol": {"http"}, "tries": {"1"}}
		body, err := getFromNode(ctx, "n2", fmt.Sprintf("http://%s:18190/dial?%s", n1, q.Encode()))
		if err != nil {
			t.Fatalf("ask the host-network pod: %v", err)
		}
		var r struct {
			Responses []string `json:"responses"`
			Errors    []string `json:"errors"`
		}
		if err := json.Unmarshal(body, &r); err != nil || len(r.Responses) != 1 || !strings.Contains(r.Responses[0], "HTTPS server") {
			t.Fatalf("node process -> %s:%d answered %s (%v), want the real API server", api, apiPort, body, err)
		}
	}

	// The API server's address is reserved (the kubernetes Service's
	// endpoint), whatever the allow-list; the others are not allowed.
	waitServiceEvent(t, tenant, "hostile", lacev1.AnnotationExternalIPProblem, model.ExternalIPReasonReserved,
		api.String()+" ("+model.ExternalIPReasonReserved, "8.8.8.8 ("+model.ExternalIPReasonNotAllowed, extHost.String())

	// Two Services name one allowed address: the older keeps it, though
	// the newer sorts first by name; the newer is told.
	allowed := netip.MustParsePrefix(lab.ExternalIPRanges()[0]).Addr()
	tenantPod(t, tenant, "xip-old", "old", "n2")
	tenantPod(t, tenant, "xip-new", "new", "n3")
	older := tenantService(t, tenant, "zz-older", "old", []int32{80}, func(s *corev1.Service) { s.Spec.ExternalIPs = []string{allowed.String()} })
	// Creation times have a resolution of one second: the newer is
	// created in a later second than the older (the API server's clock is
	// this machine's).
	for time.Now().Unix() <= older.CreationTimestamp.Unix()+1 {
		time.Sleep(100 * time.Millisecond)
	}
	tenantService(t, tenant, "aa-newer", "new", []int32{80}, func(s *corev1.Service) { s.Spec.ExternalIPs = []string{allowed.String()} })
	waitServiceEvent(t, tenant, "aa-newer", lacev1.AnnotationExternalIPProblem, model.ExternalIPReasonContested,
		allowed.String(), tenant+"/zz-older")
	for _, node := range []string{"n1", "n2", "n3"} {
		eventually(t, 30*time.Second, fmt.Sprintf("%s serves %s:80 for zz-older", node, allowed), func() error {
			table, err := semTable(node)
			if err != nil {
				return err
			}
			e := semEntry(table, allowed, semTCP, 80)
			if e == nil || e.ClusterIP != netip.MustParseAddr(older.Spec.ClusterIP) {
				return fmt.Errorf("%s:80 is %s, want zz-older's (ClusterIP %s)", allowed, semDescribe(e), older.Spec.ClusterIP)
			}
			return nil
		})
	}
	for range 8 {
		got, err := semAsk(podNS, "tcp", netip.AddrPortFrom(allowed, 80), "/hostname")
		if err != nil || got != "xip-old" {
			t.Fatalf("default pod -> %s:80 answered %q (%v), want xip-old (the older Service's)", allowed, got, err)
		}
	}
	svc, err := client.CoreV1().Services(tenant).Get(ctx, "zz-older", metav1.GetOptions{})
	if err != nil || svc.Annotations[lacev1.AnnotationExternalIPProblem] != "" {
		t.Errorf("the older Service is reported: %v %v", svc.Annotations, err)
	}

	// An address has one owner across ports: a newer Service naming the
	// older one's external IP on a port the older does not use is refused
	// too (reported, not served), and the older one's port still works.
	tenantService(t, tenant, "aa-otherport", "new", []int32{81}, func(s *corev1.Service) { s.Spec.ExternalIPs = []string{allowed.String()} })
	waitServiceEvent(t, tenant, "aa-otherport", lacev1.AnnotationExternalIPProblem, model.ExternalIPReasonContested,
		allowed.String(), tenant+"/zz-older")
	for _, node := range []string{"n1", "n2", "n3"} {
		table, err := semTable(node)
		if err != nil {
			t.Fatal(err)
		}
		if e := semEntry(table, allowed, semTCP, 81); e != nil {
			t.Errorf("%s serves the newer Service on the older one's address %s:81: %s", node, allowed, semDescribe(e))
		}
	}
	for range 3 {
		if got, err := semAsk(podNS, "tcp", netip.AddrPortFrom(allowed, 81), "/hostname"); err == nil || got == "xip-new" {
			t.Fatalf("default pod -> %s:81 answered %q (%v), want no answer (the address is zz-older's)", allowed, got, err)
		}
		if got, err := semAsk(podNS, "tcp", netip.AddrPortFrom(allowed, 80), "/hostname"); err != nil || got != "xip-old" {
			t.Fatalf("default pod -> %s:80 answered %q (%v), want xip-old", allowed, got, err)
		}
	}
}

// TestLoadBalancerClassNamespaces: a LoadBalancerClass serves only the
// namespaces its namespaceSelector selects, and lets only those its
// addressRequestNamespaceSelector selects ask for a specific address. A
// Service of another namespace gets no VIP and a NamespaceNotAllowed
// Event; one asking without leave gets none and an
// AddressRequestNotAllowed Event; an allowed request is honoured; a
// namespace losing the class's selection gives its VIP back.
func TestLoadBalancerClassNamespaces(t *testing.T) {
	needLab(t)
	ctx := context.Background()
	c := laceClient(t)
	const cls = "e2e-tenants"
	pool := []string{"172.30.0.232", "172.30.0.233"}
	lc := &lacev1.LoadBalancerClass{ObjectMeta: metav1.ObjectMeta{Name: cls}, Spec: lacev1.LoadBalancerClassSpec{
		Addresses:                       []lacev1.AddressRange{lacev1.AddressRange(pool[0] + "/31")},
		NamespaceSelector:               &metav1.LabelSelector{MatchLabels: map[string]string{"e2e-lb": "yes"}},
		AddressRequestNamespaceSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"e2e-lb-request": "yes"}},
	}}
	if err := c.Create(ctx, lc); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Delete(context.Background(), lc) })
	tenantNamespace(t, "e2e-lb-denied", nil)
	tenantNamespace(t, "e2e-lb-plain", map[string]string{"e2e-lb": "yes"})
	tenantNamespace(t, "e2e-lb-asks", map[string]string{"e2e-lb": "yes", "e2e-lb-request": "yes"})
	lb := func(ask string) func(*corev1.Service) {
		return func(s *corev1.Service) {
			s.Spec.Type = corev1.ServiceTypeLoadBalancer
			s.Spec.LoadBalancerClass = ptr.To(lacev1.LoadBalancerClassPrefix + cls)
			if ask != "" {
				s.Annotations = map[string]string{lacev1.AnnotationLoadBalancerIPs: ask}
			}
		}
	}
	tenantService(t, "e2e-lb-denied", "lb", "none", []int32{80}, lb(""))
	tenantService(t, "e2e-lb-plain", "asks", "none", []int32{80}, lb(pool[1]))
	tenantService(t, "e2e-lb-asks", "asks", "none", []int32{80}, lb(pool[1]))
	tenantService(t, "e2e-lb-plain", "lb", "none", []int32{80}, lb(""))

	ingress := func(ns, name string) []netip.Addr {
		svc, err := client.CoreV1().Services(ns).Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		return model.IngressAddrs(svc)
	}
	waitIngressIn := func(ns, name string, want ...string) {
		eventually(t, 30*time.Second, fmt.Sprintf("%s/%s holding %v", ns, name, want), func() error {
			var got []string
			for _, a := range ingress(ns, name) {
				got = append(got, a.String())
			}
			if !slices.Equal(got, want) {
				return fmt.Errorf("holds %v", got)
			}
			return nil
		})
	}
	waitIngressIn("e2e-lb-asks", "asks", pool[1])
	waitIngressIn("e2e-lb-plain", "lb", pool[0])
	waitServiceEvent(t, "e2e-lb-denied", "lb", lacev1.AnnotationLoadBalancerProblem, model.LBReasonNamespaceNotAllowed, "e2e-lb-denied")
	waitServiceEvent(t, "e2e-lb-plain", "asks", lacev1.AnnotationLoadBalancerProblem, model.LBReasonAddressRequestNotAllowed, "e2e-lb-plain")
	for _, s := range [][2]string{{"e2e-lb-denied", "lb"}, {"e2e-lb-plain", "asks"}} {
		if got := ingress(s[0], s[1]); len(got) != 0 {
			t.Errorf("%s/%s holds %v, want nothing", s[0], s[1], got)
		}
	}

	// The namespace leaves the class's selection: its VIP goes back.
	ns, err := client.CoreV1().Namespaces().Get(ctx, "e2e-lb-plain", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	ns.Labels = map[string]string{"e2e-lb": "no"}
	if _, err := client.CoreV1().Namespaces().Update(ctx, ns, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitIngressIn("e2e-lb-plain", "lb")
	waitServiceEvent(t, "e2e-lb-plain", "lb", lacev1.AnnotationLoadBalancerProblem, model.LBReasonNamespaceNotAllowed, "e2e-lb-plain")
}

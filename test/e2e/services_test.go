package e2e

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"net/url"
	"strings"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"

	lacev1 "github.com/lace-cni/lace/api/v1alpha1"
	"github.com/lace-cni/lace/internal/netutil"
	"github.com/lace-cni/lace/lab"
)

// appPod starts a netexec pod (HTTP 8080, UDP 8081) labelled app=<app> in
// network net (label net=<net>) on node.
func appPod(t *testing.T, name, net, app, node string) *corev1.Pod {
	t.Helper()
	p := netexecPod(name, node)
	p.Labels["net"], p.Labels["app"] = net, app
	if _, err := client.CoreV1().Pods("default").Create(context.Background(), p, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = client.CoreV1().Pods("default").Delete(context.Background(), name, metav1.DeleteOptions{GracePeriodSeconds: ptr.To[int64](0)})
	})
	return waitPodReady(t, "default", name)
}

// dualStackService creates a RequireDualStack ClusterIP service selecting
// app=<app>: port 80 -> 8080/TCP (http), 81 -> 8081/UDP (udp).
func dualStackService(t *testing.T, name, app string, labels map[string]string) *corev1.Service {
	t.Helper()
	svc := &corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: labels}, Spec: corev1.ServiceSpec{
		Selector:       map[string]string{"app": app},
		IPFamilyPolicy: ptr.To(corev1.IPFamilyPolicyRequireDualStack),
		Ports: []corev1.ServicePort{
			{Name: "http", Port: 80, TargetPort: intstr.FromInt32(8080), Protocol: corev1.ProtocolTCP},
			{Name: "udp", Port: 81, TargetPort: intstr.FromInt32(8081), Protocol: corev1.ProtocolUDP},
		},
	}}
	created, err := client.CoreV1().Services("default").Create(context.Background(), svc, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = client.CoreV1().Services("default").Delete(context.Background(), name, metav1.DeleteOptions{})
	})
	if len(created.Spec.ClusterIPs) != 2 {
		t.Fatalf("service %s got ClusterIPs %v, want one per family", name, created.Spec.ClusterIPs)
	}
	return created
}

func clusterIPs(svc *corev1.Service) []netip.Addr {
	var out []netip.Addr
	for _, ip := range svc.Spec.ClusterIPs {
		out = append(out, netip.MustParseAddr(ip))
	}
	return out
}

// askVIP sends one request from pod from to vip (HTTP GET /hostname on
// port 80, or "hostname" over UDP on 81) and returns who answered.
func askVIP(ctx context.Context, from *corev1.Pod, proto string, vip netip.Addr) (string, error) {
	ns, err := lab.PodNetNS(ctx, labConfig(), from.Namespace, from.Name)
	if err != nil {
		return "", err
	}
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	if proto == "udp" {
		conn, err := netutil.DialContext(ctx, ns, "udp", net.JoinHostPort(vip.String(), "81"))
		if err != nil {
			return "", err
		}
		defer conn.Close()
		buf := make([]byte, 256)
		for range 3 {
			_ = conn.SetDeadline(time.Now().Add(600 * time.Millisecond))
			if _, err := conn.Write([]byte("hostname")); err != nil {
				return "", err
			}
			if n, err := conn.Read(buf); err == nil {
				return strings.TrimSpace(string(buf[:n])), nil
			} else if !isTimeout(err) {
				return "", err
			}
		}
		return "", fmt.Errorf("no UDP answer from %s:81", vip)
	}
	conn, err := netutil.DialContext(ctx, ns, "tcp", net.JoinHostPort(vip.String(), "80"))
	if err != nil {
		return "", err
	}
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(2 * time.Second))
	fmt.Fprintf(conn, "GET /hostname HTTP/1.0\r\nHost: e2e\r\n\r\n")
	b, err := io.ReadAll(conn)
	if err != nil {
		return "", err
	}
	_, body, _ := strings.Cut(string(b), "\r\n\r\n")
	return strings.TrimSpace(body), nil
}

// expectServed waits until pod from reaches the service at every VIP over
// TCP and UDP, and checks that over several requests only the wanted
// backends answer and each of them does.
func expectServed(t *testing.T, from *corev1.Pod, svc *corev1.Service, backends ...string) {
	t.Helper()
	want := map[string]bool{}
	for _, b := range backends {
		want[b] = true
	}
	for _, vip := range clusterIPs(svc) {
		for _, proto := range []string{"tcp", "udp"} {
			eventually(t, 30*time.Second, fmt.Sprintf("%s %s -> %s/%s", proto, from.Name, svc.Name, vip), func() error {
				seen := map[string]int{}
				for range 4 * len(backends) {
					got, err := askVIP(context.Background(), from, proto, vip)
					if err != nil {
						return err
					}
					if !want[got] {
						return fmt.Errorf("answered by %q, want one of %v", got, backends)
					}
					seen[got]++
				}
				if len(seen) != len(backends) {
					return fmt.Errorf("over %d requests only %v answered, want all of %v", 4*len(backends), seen, backends)
				}
				return nil
			})
		}
	}
}

// waitEndpoints waits until the service's EndpointSlices list n ready
// endpoints per family.
func waitEndpoints(t *testing.T, svc *corev1.Service, n int) {
	t.Helper()
	eventually(t, 30*time.Second, "endpoints of "+svc.Name, func() error {
		l, err := client.DiscoveryV1().EndpointSlices("default").List(context.Background(), metav1.ListOptions{LabelSelector: discoveryv1.LabelServiceName + "=" + svc.Name})
		if err != nil {
			return err
		}
		per := map[discoveryv1.AddressType]int{}
		for _, s := range l.Items {
			for _, e := range s.Endpoints {
				if e.Conditions.Ready == nil || *e.Conditions.Ready {
					per[s.AddressType]++
				}
			}
		}
		if per[discoveryv1.AddressTypeIPv4] != n || per[discoveryv1.AddressTypeIPv6] != n {
			return fmt.Errorf("ready endpoints %v, want %d per family", per, n)
		}
		return nil
	})
}

// TestClusterIPServices: a dual-stack service in the default network is
// served by Lace with no kube-proxy: TCP and UDP through each family's VIP
// reach every ready backend (on other nodes and the client's own), answers
// come from the VIP; a service without endpoints refuses at once (TCP
// connection refused, UDP ICMP port unreachable); the kubernetes Service
// reaches the API server.
func TestClusterIPServices(t *testing.T) {
	needLab(t)
	client1 := netPod(t, "svc-client", "default", "n1", true)
	appPod(t, "svc-web-a", "default", "svc-web", "n2")
	appPod(t, "svc-web-b", "default", "svc-web", "n1")
	web := dualStackService(t, "svc-web", "svc-web", nil)
	waitEndpoints(t, web, 2)
	expectServed(t, client1, web, "svc-web-a", "svc-web-b")

	// No endpoints: refused at once.
	empty := dualStackService(t, "svc-empty", "nothing-has-this-label", nil)
	for _, vip := range clusterIPs(empty) {
		eventually(t, 30*time.Second, "connection refused by "+vip.String(), func() error {
			_, err := askVIP(context.Background(), client1, "tcp", vip)
			if !errors.Is(err, syscall.ECONNREFUSED) {
				return fmt.Errorf("TCP: %v, want connection refused", err)
			}
			_, err = askVIP(context.Background(), client1, "udp", vip)
			if !errors.Is(err, syscall.ECONNREFUSED) {
				return fmt.Errorf("UDP: %v, want connection refused", err)
			}
			return nil
		})
	}

	// In-cluster clients reach the API server through the kubernetes
	// Service (its endpoint is outside the cluster, on the fabric).
	k, err := client.CoreV1().Services("default").Get(context.Background(), "kubernetes", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	vip := netip.MustParseAddr(k.Spec.ClusterIP)
	eventually(t, 30*time.Second, "kubernetes Service from a pod", func() error {
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
		defer cancel()
		conn, err := netutil.DialContext(ctx, podNetNS(t, client1), "tcp", net.JoinHostPort(vip.String(), "443"))
		if err != nil {
			return err
		}
		defer conn.Close()
		tc := tls.Client(conn, &tls.Config{InsecureSkipVerify: true}) //nolint:gosec // only that TLS is spoken
		_ = tc.SetDeadline(time.Now().Add(3 * time.Second))
		if err := tc.Handshake(); err != nil {
			return fmt.Errorf("TLS with the API server: %w", err)
		}
		return nil
	})
}

// TestServiceReachFollowsTopology: a service of the default network is
// unreachable from another network without a policy (timeout, counted),
// reachable with a ServiceRoutingPolicy, whose source still cannot reach
// the backends directly. A service bound to one of two overlapping
// networks is served only by the pods of its own network, even where the
// other network's pods hold the same addresses.
func TestServiceReachFollowsTopology(t *testing.T) {
	needLab(t)
	c := laceClient(t)
	network(t, c, "svc-b", "10.121.0.0/16", "fd00:121::/48", false)
	labelNetwork(t, c, "svc-b", map[string]string{"svc-test": "b"})
	outsider := netPod(t, "svc-outsider", "svc-b", "n1", true)
	backend := appPod(t, "svc-topo-a", "default", "svc-topo", "n2")
	svc := dualStackService(t, "svc-topo", "svc-topo", nil)
	waitEndpoints(t, svc, 1)
	v4 := clusterIPs(svc)[0]
	if !v4.Is4() {
		v4 = clusterIPs(svc)[1]
	}
	before := nodeDrops(t, "n1")
	if _, err := askVIP(context.Background(), outsider, "tcp", v4); !isTimeout(err) {
		t.Errorf("another network -> VIP without a policy: %v, want a timeout", err)
	}
	if after := nodeDrops(t, "n1"); after["isolated"] <= before["isolated"] {
		t.Errorf("another network -> VIP: n1's isolated counter did not move")
	}
	srp := &lacev1.ServiceRoutingPolicy{ObjectMeta: metav1.ObjectMeta{Name: "svc-b-to-default"}, Spec: lacev1.ServiceRoutingPolicySpec{
		SrcSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"svc-test": "b"}}, DestSelector: lacev1.ServiceSelector{Name: "default"}}}
	if err := c.Create(context.Background(), srp); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Delete(context.Background(), srp) })
	expectServed(t, outsider, svc, "svc-topo-a")
	b4, _ := podAddrs(backend)
	expectNoReach(t, outsider, b4, "n1", "isolated")

	// Overlapping networks: the service is bound to ov-a (a binding
	// policy for services labelled svc-net=ov-a); both networks have pods
	// labelled app=svc-ov, so its EndpointSlice lists both.
	network(t, c, "ov-a", "10.122.0.0/16", "fd00:122::/48", false)
	network(t, c, "ov-b", "10.122.0.0/16", "fd00:122::/48", false)
	nbp := &lacev1.NetworkBindingPolicy{ObjectMeta: metav1.ObjectMeta{Name: "e2e-svc-ov-a"}, Spec: lacev1.NetworkBindingPolicySpec{
		Network: "ov-a", Priority: 10, MatchKind: lacev1.MatchKindService,
		Selector: &metav1.LabelSelector{MatchLabels: map[string]string{"svc-net": "ov-a"}}}}
	if err := c.Create(context.Background(), nbp); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Delete(context.Background(), nbp) })
	ovClient := netPod(t, "ov-client", "ov-a", "n1", true)
	appPod(t, "ov-a-1", "ov-a", "svc-ov", "n2")
	appPod(t, "ov-b-1", "ov-b", "svc-ov", "n3")
	appPod(t, "ov-b-2", "ov-b", "svc-ov", "n2")
	ov := dualStackService(t, "svc-ov", "svc-ov", map[string]string{"svc-net": "ov-a"})
	waitEndpoints(t, ov, 3)
	expectServed(t, ovClient, ov, "ov-a-1")
	// The endpoints of ov-b's pods are reported on the Service.
	eventually(t, 30*time.Second, "an Event on svc-ov naming ov-b", func() error {
		evs, err := client.CoreV1().Events("default").List(context.Background(), metav1.ListOptions{FieldSelector: "involvedObject.name=svc-ov"})
		if err != nil {
			return err
		}
		for _, e := range evs.Items {
			if strings.Contains(e.Message, "ov-b") {
				return nil
			}
		}
		return fmt.Errorf("%d events, none names ov-b", len(evs.Items))
	})
}

// TestNodeProcessesReachClusterIP: a host-network pod (the node's own
// network namespace) reaches a ClusterIP in both families, with endpoints
// on its own node and on others, through connect-time translation; the
// HTTP answer names every backend over several requests.
func TestNodeProcessesReachClusterIP(t *testing.T) {
	needLab(t)
	ctx := context.Background()
	appPod(t, "svc-host-a", "default", "svc-host", "n1")
	appPod(t, "svc-host-b", "default", "svc-host", "n2")
	svc := dualStackService(t, "svc-host", "svc-host", nil)
	waitEndpoints(t, svc, 2)
	p := netexecPod("svc-hostnet", "n1")
	p.Spec.HostNetwork = true
	p.Spec.Containers[0].Args = []string{"netexec", "--http-port=18090", "--udp-port=18091"}
	p.Spec.Containers[0].Ports = []corev1.ContainerPort{{Name: "http", ContainerPort: 18090}}
	if _, err := client.CoreV1().Pods("default").Create(ctx, p, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = client.CoreV1().Pods("default").Delete(context.Background(), p.Name, metav1.DeleteOptions{GracePeriodSeconds: ptr.To[int64](0)})
	})
	waitPodReady(t, "default", p.Name)
	for _, vip := range clusterIPs(svc) {
		eventually(t, 30*time.Second, "host-network pod -> "+vip.String(), func() error {
			seen := map[string]bool{}
			for range 8 {
				// netexec's /dial makes the request from the pod's process:
				// the node's network namespace and cgroup.
				q := url.Values{"host": {vip.String()}, "port": {"80"}, "request": {"hostname"}, "protocol": {"http"}, "tries": {"1"}}
				body, err := getFromNode(ctx, "n2", "http://172.30.0.11:18090/dial?"+q.Encode())
				if err != nil {
					return err
				}
				var r struct {
					Responses []string `json:"responses"`
					Errors    []string `json:"errors"`
				}
				if err := json.Unmarshal(body, &r); err != nil || len(r.Responses) != 1 {
					return fmt.Errorf("dial answered %s (%v)", body, err)
				}
				seen[r.Responses[0]] = true
			}
			if !seen["svc-host-a"] || !seen["svc-host-b"] || len(seen) != 2 {
				return fmt.Errorf("answered by %v, want svc-host-a and svc-host-b", seen)
			}
			return nil
		})
	}
}

package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/netip"
	"net/url"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"

	"github.com/lace-cni/lace/lab"
)

// hostnetPod is a hostNetwork netexec on node, HTTP on port and UDP on
// port+1, selected by app.
func hostnetPod(name, app, node string, port int32) *corev1.Pod {
	p := semPod(name, app, node)
	p.Spec.HostNetwork = true
	p.Spec.Containers[0].Args = []string{"netexec", fmt.Sprintf("--http-port=%d", port), fmt.Sprintf("--udp-port=%d", port+1)}
	p.Spec.Containers[0].Ports = []corev1.ContainerPort{{Name: "http", ContainerPort: port}}
	return p
}

// dialFromNode asks the hostNetwork netexec at node's address:port (a node
// process, in the node's cgroup, so the socket hooks see it) to reach
// host:port tries times over proto, and returns who answered.
func dialFromNode(t *testing.T, node string, netexec uint16, proto string, target netip.AddrPort, tries int) []string {
	t.Helper()
	i := int(node[1] - '0')
	q := url.Values{"host": {target.Addr().String()}, "port": {fmt.Sprint(target.Port())}, "request": {"hostname"},
		"protocol": {proto}, "tries": {fmt.Sprint(tries)}}
	body, err := getFromNode(context.Background(), node, fmt.Sprintf("http://%s/dial?%s",
		net.JoinHostPort(nodeAddr(i, true).String(), fmt.Sprint(netexec)), q.Encode()))
	if err != nil {
		t.Fatalf("ask the hostNetwork client on %s: %v", node, err)
	}
	var r struct {
		Responses []string `json:"responses"`
		Errors    []string `json:"errors"`
	}
	if err := json.Unmarshal(body, &r); err != nil {
		t.Fatalf("dial answer %s: %v", body, err)
	}
	return r.Responses
}

// TestHostNetworkEndpointsThroughFrontends: a NodePort Service whose
// endpoints are hostNetwork pods (on n1 and n2, at their nodes' addresses)
// is reached, both families: from the external host through every node's
// NodePort (the endpoint on the entry node through its stack, the other as
// plain IP from the entry node); from a node (a hostNetwork client on n3)
// through the ClusterIP and the NodePorts of n1 and of n3 itself; and from
// a pod. The upstream spec "should function for service endpoints using
// hostNetwork" in our lab's terms.
func TestHostNetworkEndpointsThroughFrontends(t *testing.T) {
	needLab(t)
	pods := semStart(t, hostnetPod("hnf-a", "hnf", "n1", 18290), hostnetPod("hnf-b", "hnf", "n2", 18290),
		hostnetPod("hnf-client", "hnf-client", "n3", 18390), semPod("hnf-pod", "hnf-pod", "n3"))
	svc := semService(t, "hnf", "hnf", func(s *corev1.Service) {
		s.Spec.Type = corev1.ServiceTypeNodePort
		s.Spec.Ports[0].TargetPort = intstr.FromInt32(18290)
		s.Spec.Ports[1].TargetPort = intstr.FromInt32(18291)
	})
	waitEndpoints(t, svc, 2)
	tcpPort, udpPort := nodePorts(t, svc)
	ext := externalNS()
	for _, v4 := range []bool{true, false} {
		for i := 1; i <= 3; i++ {
			a := nodeAddr(i, v4)
			askAll(t, ext, "tcp", netip.AddrPortFrom(a, tcpPort), "/hostname", "n1", "n2")
			askAll(t, ext, "udp", netip.AddrPortFrom(a, udpPort), "hostname", "n1", "n2")
		}
	}
	// A node: through the ClusterIPs and the NodePorts of another node
	// and of its own.
	for _, v4 := range []bool{true, false} {
		var targets []netip.AddrPort
		for _, ip := range svc.Spec.ClusterIPs {
			if a := netip.MustParseAddr(ip); a.Is4() == v4 {
				targets = append(targets, netip.AddrPortFrom(a, 80))
			}
		}
		targets = append(targets, netip.AddrPortFrom(nodeAddr(1, v4), tcpPort), netip.AddrPortFrom(nodeAddr(3, v4), tcpPort))
		for _, tg := range targets {
			eventually(t, 30*time.Second, "n3 -> "+tg.String()+" answered by n1 and n2", func() error {
				got := dialFromNode(t, "n3", 18390, "http", tg, 12)
				if !slices.Contains(got, "n1") || !slices.Contains(got, "n2") {
					return fmt.Errorf("answered by %v", got)
				}
				return nil
			})
		}
		udp := netip.AddrPortFrom(nodeAddr(1, v4), udpPort)
		eventually(t, 30*time.Second, "n3 -> "+udp.String()+"/udp answered", func() error {
			if got := dialFromNode(t, "n3", 18390, "udp", udp, 12); !slices.Contains(got, "n1") || !slices.Contains(got, "n2") {
				return fmt.Errorf("answered by %v", got)
			}
			return nil
		})
	}
	// A pod, through another node's NodePort and its own node's.
	cl := semClientOf(t, pods["hnf-pod"])
	for _, v4 := range []bool{true, false} {
		for _, i := range []int{1, 3} {
			askAll(t, cl.ns, "tcp", netip.AddrPortFrom(nodeAddr(i, v4), tcpPort), "/hostname", "n1", "n2")
		}
	}
}

// TestHostEndpointSliceForged: a selector-less Service whose hand-written
// EndpointSlice names a node's address (where a hostNetwork pod really
// listens, but naming no pod, or naming that pod from a slice saying it is
// on another node) or the API server's address is served with none of
// them: no frontend can be pointed at a node's stack or at the API server
// by writing a slice. The same slice naming the hostNetwork pod on its
// node is served (the gate is not a blanket refusal).
func TestHostEndpointSliceForged(t *testing.T) {
	needLab(t)
	pods := semStart(t, hostnetPod("hnx-b", "hnx", "n2", 18490))
	hb := pods["hnx-b"]
	n1v4, _ := lab.NodeUnderlay(1)
	n2v4, _ := lab.NodeUnderlay(2)
	api, _ := lab.APIServerAddrs()
	ctx := context.Background()
	mk := func(name string, eps ...discoveryv1.Endpoint) *corev1.Service {
		svc := &corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: name}, Spec: corev1.ServiceSpec{
			Type:  corev1.ServiceTypeNodePort,
			Ports: []corev1.ServicePort{{Name: "http", Port: 80, Protocol: corev1.ProtocolTCP}}}}
		created, err := client.CoreV1().Services("default").Create(ctx, svc, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = client.CoreV1().Services("default").Delete(ctx, name, metav1.DeleteOptions{}) })
		sl := &discoveryv1.EndpointSlice{ObjectMeta: metav1.ObjectMeta{Name: name + "-manual",
			Labels: map[string]string{discoveryv1.LabelServiceName: name}},
			AddressType: discoveryv1.AddressTypeIPv4, Endpoints: eps,
			Ports: []discoveryv1.EndpointPort{{Name: ptr.To("http"), Port: ptr.To[int32](18490), Protocol: ptr.To(corev1.ProtocolTCP)}}}
		if _, err := client.DiscoveryV1().EndpointSlices("default").Create(ctx, sl, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			_ = client.DiscoveryV1().EndpointSlices("default").Delete(ctx, sl.Name, metav1.DeleteOptions{})
		})
		return created
	}
	ep := func(addr netip.Addr, node string, pod *corev1.Pod) discoveryv1.Endpoint {
		e := discoveryv1.Endpoint{Addresses: []string{addr.String()}, Conditions: discoveryv1.EndpointConditions{Ready: ptr.To(true)}}
		if node != "" {
			e.NodeName = ptr.To(node)
		}
		if pod != nil {
			e.TargetRef = &corev1.ObjectReference{Kind: "Pod", Namespace: pod.Namespace, Name: pod.Name, UID: pod.UID}
		}
		return e
	}
	good := mk("hnx-good", ep(n2v4, "n2", hb))
	forged := mk("hnx-forged", ep(n2v4, "n2", nil), ep(n1v4, "n1", hb), ep(api, "", nil))
	goodIP, forgedIP := netip.MustParseAddr(good.Spec.ClusterIP), netip.MustParseAddr(forged.Spec.ClusterIP)
	for _, node := range []string{"n1", "n2", "n3"} {
		eventually(t, 30*time.Second, node+" serves hnx-good with hn-b and hnx-forged with nothing", func() error {
			table, err := semTable(node)
			if err != nil {
				return err
			}
			g, f := semEntry(table, goodIP, semTCP, 80), semEntry(table, forgedIP, semTCP, 80)
			if g == nil || len(g.Backends) != 1 || g.Backends[0].Addr != n2v4 {
				return fmt.Errorf("hnx-good is %s, want %s:18490", semDescribe(g), n2v4)
			}
			if f == nil || len(f.Backends) != 0 {
				return fmt.Errorf("hnx-forged is %s, want an entry without endpoints", semDescribe(f))
			}
			return nil
		})
	}
	// And so from outside: the forged Service's NodePort reaches nothing,
	// the good one's reaches the hostNetwork pod.
	ext := externalNS()
	askAll(t, ext, "tcp", netip.AddrPortFrom(n1v4, uint16(good.Spec.Ports[0].NodePort)), "/hostname", "n2")
	p := semProbe{"tcp", netip.AddrPortFrom(n1v4, uint16(forged.Spec.Ports[0].NodePort))}
	if got, err := semAsk(ext, p.proto, p.ap, "/hostname"); err == nil || strings.TrimSpace(got) != "" {
		t.Errorf("the forged Service's NodePort %s answered %q (%v); want nothing", p.ap, got, err)
	}
	// Its author is told: the refused addresses on the Service, and a
	// Warning Event saying why; the good one has neither.
	eventually(t, 60*time.Second, "hnx-forged's refused endpoints reported", func() error {
		s, err := client.CoreV1().Services("default").Get(ctx, "hnx-forged", metav1.GetOptions{})
		if err != nil {
			return err
		}
		want := strings.Join([]string{n1v4.String(), n2v4.String(), api.String()}, ",")
		got := strings.Split(s.Annotations["lace-cni.io/refused-endpoints"], ",")
		slices.Sort(got)
		ws := strings.Split(want, ",")
		slices.Sort(ws)
		if !slices.Equal(got, ws) {
			return fmt.Errorf("lace-cni.io/refused-endpoints %q, want %q", s.Annotations["lace-cni.io/refused-endpoints"], want)
		}
		evs, err := client.CoreV1().Events("default").List(ctx, metav1.ListOptions{FieldSelector: "involvedObject.name=hnx-forged"})
		if err != nil {
			return err
		}
		for _, e := range evs.Items {
			if e.Reason == "EndpointRefused" && e.Type == corev1.EventTypeWarning && strings.Contains(e.Message, "naming no hostNetwork pod") {
				return nil
			}
		}
		return fmt.Errorf("%d events, none EndpointRefused", len(evs.Items))
	})
	if s, err := client.CoreV1().Services("default").Get(ctx, "hnx-good", metav1.GetOptions{}); err != nil || s.Annotations["lace-cni.io/refused-endpoints"] != "" {
		t.Errorf("hnx-good: refused endpoints %q (%v), want none", s.Annotations["lace-cni.io/refused-endpoints"], err)
	}
}

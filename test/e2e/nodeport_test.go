package e2e

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	lacev1 "github.com/lace-cni/lace/api/v1alpha1"
	"github.com/lace-cni/lace/internal/netutil"
	"github.com/lace-cni/lace/lab"
)

// nodePorts returns svc's NodePort of TCP port "http" and UDP port "udp".
func nodePorts(t *testing.T, svc *corev1.Service) (tcp, udp uint16) {
	t.Helper()
	for _, p := range svc.Spec.Ports {
		switch p.Name {
		case "http":
			tcp = uint16(p.NodePort)
		case "udp":
			udp = uint16(p.NodePort)
		}
	}
	if tcp == 0 || udp == 0 {
		t.Fatalf("service %s has no NodePorts: %+v", svc.Name, svc.Spec.Ports)
	}
	return tcp, udp
}

// externalNS is the lab's external host's network namespace.
func externalNS() string { return netutil.Path(labConfig().NetNS("external")) }

// nodeAddr is lab node i's underlay address of a's family.
func nodeAddr(i int, v4 bool) netip.Addr {
	a4, a6 := lab.NodeUnderlay(i)
	if v4 {
		return a4
	}
	return a6
}

// askAll sends requests from ns to ap until every one of want has
// answered req (within 30 s), failing on any other answer.
func askAll(t *testing.T, ns, proto string, ap netip.AddrPort, req string, want ...string) {
	t.Helper()
	seen := map[string]bool{}
	eventually(t, 30*time.Second, fmt.Sprintf("%s %s answered %q by each of %v", proto, ap, req, want), func() error {
		got, err := semAsk(ns, proto, ap, req)
		if err != nil {
			return err
		}
		ok := false
		for _, w := range want {
			ok = ok || got == w
		}
		if !ok {
			t.Fatalf("%s %s (%q) answered by %q, want one of %v", proto, ap, req, got, want)
		}
		seen[got] = true
		if len(seen) < len(want) {
			return fmt.Errorf("answered by %v so far", seen)
		}
		return nil
	})
}

// expectDropsFromOutside checks that every probe from the external host
// times out and that node counted each under reason.
func expectDropsFromOutside(t *testing.T, node, reason string, probes ...semProbe) {
	t.Helper()
	before := nodeDrops(t, node)
	if _, ok := before[reason]; !ok {
		t.Fatalf("node %s has no drop counter %q", node, reason)
	}
	for _, p := range probes {
		if err := semSilent(externalNS(), p); err != nil {
			t.Errorf("external host -> %s: %v; want no answer", p, err)
		}
	}
	after := nodeDrops(t, node)
	if after[reason] < before[reason]+uint64(len(probes)) {
		t.Errorf("external host -> %v: %s's %q counter moved %d -> %d, want +%d; moved: %v",
			probes, node, reason, before[reason], after[reason], len(probes), semMoved(before, after))
	}
}

// TestNodePortFromOutside: the lab's external host reaches a dual-stack
// NodePort service on every node's address, both families, TCP and UDP,
// whether or not an endpoint runs there. externalTrafficPolicy Cluster:
// an endpoint on the entry node sees the client's address, one elsewhere
// the entry node's. Local: only the node's own endpoint answers, with the
// client's address kept; a node without one drops (no-local-endpoints),
// while pods still reach every endpoint through the same NodePort. A
// NodePort of a network that no policy opens to the node addresses'
// external network (world) is closed: dropped and counted.
func TestNodePortFromOutside(t *testing.T) {
	needLab(t)
	pods := semStart(t, semPod("np-a", "np", "n1"), semPod("np-b", "np", "n2"), semPod("np-client", "np-client", "n3"))
	svc := semService(t, "np", "np", func(s *corev1.Service) { s.Spec.Type = corev1.ServiceTypeNodePort })
	tcpPort, udpPort := nodePorts(t, svc)
	ext := externalNS()
	extV4, extV6 := lab.ExternalUnderlay()

	for i := 1; i <= 3; i++ {
		for _, v4 := range []bool{true, false} {
			a := nodeAddr(i, v4)
			askAll(t, ext, "tcp", netip.AddrPortFrom(a, tcpPort), "/hostname", "np-a", "np-b")
			askAll(t, ext, "udp", netip.AddrPortFrom(a, udpPort), "hostname", "np-a", "np-b")
		}
	}
	// Who the endpoints see, entering at n1: np-a (on n1) the external
	// host, np-b (on n2) n1.
	for _, v4 := range []bool{true, false} {
		client := map[bool]netip.Addr{true: extV4, false: extV6}[v4]
		ap := netip.AddrPortFrom(nodeAddr(1, v4), tcpPort)
		sources := map[string]bool{}
		eventually(t, 30*time.Second, "both endpoints' view of the client through "+ap.String(), func() error {
			got, err := semAsk(ext, "tcp", ap, "/clientip")
			if err != nil {
				return err
			}
			host, _, err := net.SplitHostPort(got)
			if err != nil {
				return err
			}
			sources[host] = true
			if !sources[client.String()] || !sources[nodeAddr(1, v4).String()] {
				return fmt.Errorf("sources seen %v, want %s (local endpoint) and %s (remote)", sources, client, nodeAddr(1, v4))
			}
			return nil
		})
		if len(sources) != 2 {
			t.Errorf("through %s the endpoints saw %v, want only the client and n1", ap, sources)
		}
	}

	// A pod reaches the NodePort of another node and of its own.
	cl := semClientOf(t, pods["np-client"])
	for _, i := range []int{1, 3} {
		askAll(t, cl.ns, "tcp", netip.AddrPortFrom(nodeAddr(i, true), tcpPort), "/hostname", "np-a", "np-b")
	}

	// Local.
	semUpdateService(t, "np", func(s *corev1.Service) {
		s.Spec.ExternalTrafficPolicy = corev1.ServiceExternalTrafficPolicyLocal
	})
	for _, v4 := range []bool{true, false} {
		ap := netip.AddrPortFrom(nodeAddr(1, v4), tcpPort)
		client := map[bool]netip.Addr{true: extV4, false: extV6}[v4]
		eventually(t, 30*time.Second, "Local through "+ap.String()+" answered by np-a only, seeing the client", func() error {
			for range 8 {
				got, err := semAsk(ext, "tcp", ap, "/clientip")
				if err != nil {
					return err
				}
				if host, _, _ := net.SplitHostPort(got); host != client.String() {
					return fmt.Errorf("the endpoint saw %s, want the client's %s", got, client)
				}
				if name, err := semAsk(ext, "tcp", ap, "/hostname"); err != nil || name != "np-a" {
					return fmt.Errorf("answered by %q (%v), want np-a only", name, err)
				}
			}
			return nil
		})
	}
	// n3 has no endpoint: dropped there, both families and protocols.
	var n3 []semProbe
	for _, v4 := range []bool{true, false} {
		n3 = append(n3, semProbe{"tcp", netip.AddrPortFrom(nodeAddr(3, v4), tcpPort)},
			semProbe{"udp", netip.AddrPortFrom(nodeAddr(3, v4), udpPort)})
	}
	eventually(t, 30*time.Second, "n3's NodePort silent under Local", func() error { return semSilent(ext, n3[0]) })
	expectDropsFromOutside(t, "n3", "no-local-endpoints", n3...)
	// A pod on n3 still reaches both endpoints through n3's NodePort.
	askAll(t, cl.ns, "tcp", netip.AddrPortFrom(nodeAddr(3, true), tcpPort), "/hostname", "np-a", "np-b")

	// A network the world does not reach: its NodePort is closed.
	c := laceClient(t)
	network(t, c, "np-iso", "10.123.0.0/16", "fd00:123::/48", false)
	nbp := &lacev1.NetworkBindingPolicy{ObjectMeta: metav1.ObjectMeta{Name: "e2e-np-iso-services"}, Spec: lacev1.NetworkBindingPolicySpec{
		Network: "np-iso", Priority: 10, MatchKind: lacev1.MatchKindService,
		Selector: &metav1.LabelSelector{MatchLabels: map[string]string{"svc-net": "np-iso"}}}}
	if err := c.Create(context.Background(), nbp); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Delete(context.Background(), nbp) })
	appPod(t, "np-iso-1", "np-iso", "np-iso", "n1")
	iso := semService(t, "np-iso", "np-iso", func(s *corev1.Service) {
		s.Spec.Type = corev1.ServiceTypeNodePort
		s.Labels = map[string]string{"svc-net": "np-iso"}
	})
	isoTCP, isoUDP := nodePorts(t, iso)
	waitEndpoints(t, iso, 1)
	eventually(t, 30*time.Second, "np-iso served on n1", func() error {
		table, err := semTable("n1")
		if err != nil {
			return err
		}
		if s := semEntry(table, nodeAddr(1, true), semTCP, isoTCP); s == nil || !s.Closed {
			return fmt.Errorf("n1's entry for its NodePort %d: %v, want it closed", isoTCP, s)
		}
		return nil
	})
	var closed []semProbe
	for _, v4 := range []bool{true, false} {
		closed = append(closed, semProbe{"tcp", netip.AddrPortFrom(nodeAddr(1, v4), isoTCP)},
			semProbe{"udp", netip.AddrPortFrom(nodeAddr(1, v4), isoUDP)})
	}
	expectDropsFromOutside(t, "n1", "frontend-closed", closed...)
}

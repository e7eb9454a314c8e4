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

	"github.com/lace-cni/lace/internal/tables"
)

// hostPortHostIPs (part of TestHostPort): the kubelet compares hostIPs
// as strings (only "" and "0.0.0.0" mean every address), so it runs a
// pod on hostIP "::", one on n1's IPv4 address and one on
// "::ffff:<n1's IPv4 address>" side by side on n1, same port. Lace
// serves the first on n1's IPv6 address only and the second on n1's
// IPv4 address (the "::" pod older: the old rule gave it both families
// and n1's IPv4 address, refusing the other), and refuses the v4-mapped
// one with a HostPortHostIP Warning Event, the IPv4 pod keeping its
// address.
func hostPortHostIPs(t *testing.T, ext string, n1v4, n1v6 netip.Addr) {
	ctx := context.Background()
	const port = 40085
	withPort := func(name, hostIP string) *corev1.Pod {
		p := semPod(name, name, "n1")
		p.Spec.Containers[0].Ports = append(p.Spec.Containers[0].Ports,
			corev1.ContainerPort{ContainerPort: 8080, HostPort: port, HostIP: hostIP, Protocol: corev1.ProtocolTCP})
		return p
	}
	any6 := semStart(t, withPort("hp-any6", "::"))["hp-any6"]
	// Creation times have a second's resolution: the "::" pod is the
	// older one, the one the old rule let win.
	eventually(t, 5*time.Second, "a second past hp-any6's creation", func() error {
		if time.Since(any6.CreationTimestamp.Time) < 1100*time.Millisecond {
			return fmt.Errorf("created %s", any6.CreationTimestamp)
		}
		return nil
	})
	mapped := "::ffff:" + n1v4.String()
	pods := semStart(t, withPort("hp-v4", n1v4.String()), withPort("hp-mapped", mapped))
	// The kubelet admitted all three on n1 (semStart waited for them
	// ready): to it they do not conflict.
	podIP := func(p *corev1.Pod, v4 bool) netip.Addr {
		for _, ip := range p.Status.PodIPs {
			if a, err := netip.ParseAddr(ip.IP); err == nil && a.Is4() == v4 {
				return a
			}
		}
		t.Fatalf("%s has no IPv4=%v address: %v", p.Name, v4, p.Status.PodIPs)
		return netip.Addr{}
	}
	want := map[netip.Addr]netip.Addr{n1v4: podIP(pods["hp-v4"], true), n1v6: podIP(any6, false)}
	eventually(t, 60*time.Second, fmt.Sprintf("n1 serving hostPort %d on %s for hp-v4 and on %s for hp-any6", port, n1v4, n1v6), func() error {
		table, err := semTable("n1")
		if err != nil {
			return err
		}
		for at, be := range want {
			s := semEntry(table, at, semTCP, port)
			if s == nil || s.Frontend != tables.FrontendHostPort || len(s.Backends) != 1 || s.Backends[0].Addr != be {
				return fmt.Errorf("n1's entry for %s: %v, want pod %s", netip.AddrPortFrom(at, port), semDescribe(s), be)
			}
		}
		// "::" is IPv6's: nothing on IPv4's loopback.
		if s := semEntry(table, netip.MustParseAddr("127.0.0.1"), semTCP, port); s != nil {
			return fmt.Errorf("n1's entry for 127.0.0.1:%d: %v, want none", port, semDescribe(s))
		}
		return nil
	})
	askAll(t, ext, "tcp", netip.AddrPortFrom(n1v4, port), "/hostname", "hp-v4")
	askAll(t, ext, "tcp", netip.AddrPortFrom(n1v6, port), "/hostname", "hp-any6")
	eventually(t, 60*time.Second, "a HostPortHostIP event on hp-mapped", func() error {
		evs, err := client.CoreV1().Events("default").List(ctx, metav1.ListOptions{FieldSelector: "involvedObject.name=hp-mapped"})
		if err != nil {
			return err
		}
		for _, e := range evs.Items {
			if e.Reason == "HostPortHostIP" && e.Type == corev1.EventTypeWarning && strings.Contains(e.Message, "v4-mapped") {
				t.Logf("hp-mapped (hostIP %q) running beside hp-v4, refused by Lace: %s", mapped, e.Message)
				return nil
			}
		}
		return fmt.Errorf("%d events, none HostPortHostIP about a v4-mapped address", len(evs.Items))
	})
}

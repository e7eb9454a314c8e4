package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/netip"
	"net/url"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/lace-cni/lace/internal/tables"
	"github.com/lace-cni/lace/lab"
)

// TestHostPort: a pod's hostPorts (ports[].hostPort with hostIP and
// protocol) are served by the data plane on its node, both families:
//   - hostIP empty: on the node's addresses, TCP and UDP, from the lab's
//     external host (the client's address kept), from a pod on the node,
//     one on another node and the pod itself (hairpin), and from the
//     node's own processes (node addresses and loopback, through the
//     socket hooks);
//   - hostIP a node address: on that address only; hostIP 127.0.0.1: from
//     the node itself only (as the upstream HostPort spec reaches it);
//   - never on another node's address;
//   - a hostIP that is not the node's, and a port a node socket listens
//     on, are refused with Warning Events (the node's socket keeps
//     answering);
//   - a pod of a network that reaches the outside but not the hostPort's
//     pod is refused: a timeout, and the node counts it isolated;
//   - hostIPs the kubelet tells apart never share an address
//     (hostPortHostIPs).
func TestHostPort(t *testing.T) {
	needLab(t)
	ctx := context.Background()
	n1v4, n1v6 := lab.NodeUnderlay(1)
	n2v4, n2v6 := lab.NodeUnderlay(2)
	extV4, extV6 := lab.ExternalUnderlay()
	ext := externalNS()

	srv := semPod("hp-a", "hp-a", "n1")
	srv.Spec.Containers[0].Ports = append(srv.Spec.Containers[0].Ports,
		corev1.ContainerPort{ContainerPort: 8080, HostPort: 40080, Protocol: corev1.ProtocolTCP},
		corev1.ContainerPort{ContainerPort: 8081, HostPort: 40080, Protocol: corev1.ProtocolUDP},
		corev1.ContainerPort{ContainerPort: 8080, HostPort: 40081, HostIP: n1v4.String(), Protocol: corev1.ProtocolTCP},
		corev1.ContainerPort{ContainerPort: 8080, HostPort: 40082, HostIP: "127.0.0.1", Protocol: corev1.ProtocolTCP},
		corev1.ContainerPort{ContainerPort: 8081, HostPort: 40083, HostIP: n1v6.String(), Protocol: corev1.ProtocolUDP},
		corev1.ContainerPort{ContainerPort: 8080, HostPort: 40084, HostIP: "192.0.2.1", Protocol: corev1.ProtocolTCP},
		// hp-node's own ports on n1: the node's sockets keep them, its
		// UDP server inside the ephemeral range too (WireGuard's port).
		corev1.ContainerPort{ContainerPort: 8080, HostPort: 18190, Protocol: corev1.ProtocolTCP},
		corev1.ContainerPort{ContainerPort: 8081, HostPort: 51820, Protocol: corev1.ProtocolUDP})
	hostNet := netexecPod("hp-node", "n1")
	hostNet.Spec.HostNetwork = true
	hostNet.Spec.Containers[0].Args = []string{"netexec", "--http-port=18190", "--udp-port=51820"}
	// No declared port: the kubelet would refuse hp-a or hp-node for
	// two hostPorts 18190; an undeclared node socket is what the agent
	// must notice by itself.
	hostNet.Spec.Containers[0].Ports = nil
	hostNet.Spec.Containers[0].ReadinessProbe.HTTPGet.Port = intstr.FromInt32(18190)
	pods := semStart(t, srv, semPod("hp-near", "hp-near", "n1"), semPod("hp-far", "hp-far", "n2"), hostNet)
	t.Run("hostIPs", func(t *testing.T) { hostPortHostIPs(t, ext, n1v4, n1v6) })

	eventually(t, 60*time.Second, "n1 serving hp-a's hostPorts", func() error {
		table, err := semTable("n1")
		if err != nil {
			return err
		}
		for _, e := range []struct {
			at    netip.Addr
			proto uint8
			port  uint16
		}{{n1v4, semTCP, 40080}, {n1v6, semUDP, 40080}, {netip.MustParseAddr("127.0.0.1"), semTCP, 40082}, {n1v6, semUDP, 40083}} {
			if s := semEntry(table, e.at, e.proto, e.port); s == nil || s.Frontend != tables.FrontendHostPort {
				return fmt.Errorf("n1's entry for %s/%d: %v", netip.AddrPortFrom(e.at, e.port), e.proto, semDescribe(s))
			}
		}
		return nil
	})

	// From outside, both families and protocols, the client's address
	// kept.
	for _, v4 := range []bool{true, false} {
		at := map[bool]netip.Addr{true: n1v4, false: n1v6}[v4]
		from := map[bool]netip.Addr{true: extV4, false: extV6}[v4]
		askAll(t, ext, "tcp", netip.AddrPortFrom(at, 40080), "/hostname", "hp-a")
		askAll(t, ext, "udp", netip.AddrPortFrom(at, 40080), "hostname", "hp-a")
		got, err := semAsk(ext, "tcp", netip.AddrPortFrom(at, 40080), "/clientip")
		if host, _, _ := net.SplitHostPort(got); err != nil || host != from.String() {
			t.Errorf("external host -> %s: hp-a saw %q (%v), want the client's %s", netip.AddrPortFrom(at, 40080), got, err, from)
		}
	}
	// A specific hostIP only on that address; nothing on another node.
	askAll(t, ext, "tcp", netip.AddrPortFrom(n1v4, 40081), "/hostname", "hp-a")
	askAll(t, ext, "udp", netip.AddrPortFrom(n1v6, 40083), "hostname", "hp-a")
	for _, p := range []semProbe{
		{"tcp", netip.AddrPortFrom(n1v6, 40081)}, {"udp", netip.AddrPortFrom(n1v4, 40083)},
		{"tcp", netip.AddrPortFrom(n1v4, 40082)}, {"tcp", netip.AddrPortFrom(n1v4, 40084)},
		{"tcp", netip.AddrPortFrom(n2v4, 40080)}, {"tcp", netip.AddrPortFrom(n2v6, 40080)}, {"udp", netip.AddrPortFrom(n2v4, 40080)},
	} {
		if got, err := semAsk(ext, p.proto, p.ap, semReq(p.proto)); err == nil {
			t.Errorf("external host -> %s answered by %q, want nothing there", p, got)
		}
	}

	// From pods: on the node, on another node, and the pod itself.
	near, far, self := semClientOf(t, pods["hp-near"]), semClientOf(t, pods["hp-far"]), semClientOf(t, pods["hp-a"])
	for _, ap := range []netip.AddrPort{netip.AddrPortFrom(n1v4, 40080), netip.AddrPortFrom(n1v6, 40080)} {
		askAll(t, near.ns, "tcp", ap, "/hostname", "hp-a")
		askAll(t, near.ns, "udp", ap, "hostname", "hp-a")
		askAll(t, far.ns, "tcp", ap, "/hostname", "hp-a")
		// hp-a through its own hostPort (hairpin).
		askAll(t, self.ns, "tcp", ap, "/hostname", "hp-a")
		askAll(t, self.ns, "udp", ap, "hostname", "hp-a")
	}

	// From the node's own processes (netexec's /dial runs in the node's
	// network namespace and cgroup).
	for _, d := range []struct {
		host     string
		port     int
		protocol string
	}{
		{"127.0.0.1", 40082, "http"}, {"127.0.0.1", 40080, "http"}, {"::1", 40080, "http"},
		{n1v4.String(), 40080, "http"}, {n1v6.String(), 40080, "http"}, {n1v4.String(), 40080, "udp"},
		{n1v4.String(), 40081, "http"}, {n1v6.String(), 40083, "udp"},
	} {
		eventually(t, 30*time.Second, fmt.Sprintf("n1 -> %s %s", d.protocol, net.JoinHostPort(d.host, strconv.Itoa(d.port))), func() error {
			q := url.Values{"host": {d.host}, "port": {strconv.Itoa(d.port)}, "request": {"hostname"}, "protocol": {d.protocol}, "tries": {"1"}}
			body, err := getFromNode(ctx, "n2", "http://"+net.JoinHostPort(n1v4.String(), "18190")+"/dial?"+q.Encode())
			if err != nil {
				return err
			}
			var r struct {
				Responses []string `json:"responses"`
			}
			if err := json.Unmarshal(body, &r); err != nil || len(r.Responses) != 1 || r.Responses[0] != "hp-a" {
				return fmt.Errorf("dial answered %s (%v), want hp-a", body, err)
			}
			return nil
		})
	}

	// A hostIP that is not the node's, a port a node socket listens on:
	// Warning Events on the pod, and the node's socket keeps its port.
	for _, reason := range []string{"HostPortHostIP", "HostPortReserved"} {
		eventually(t, 60*time.Second, "a "+reason+" event on hp-a", func() error {
			evs, err := client.CoreV1().Events("default").List(ctx, metav1.ListOptions{FieldSelector: "involvedObject.name=hp-a"})
			if err != nil {
				return err
			}
			for _, e := range evs.Items {
				if e.Reason == reason && e.Type == corev1.EventTypeWarning {
					return nil
				}
			}
			return fmt.Errorf("%d events, none %s", len(evs.Items), reason)
		})
	}
	eventually(t, 60*time.Second, "n1's own netexec answering on its ports 18190/TCP and 51820/UDP", func() error {
		for range 4 {
			for _, p := range []semProbe{{"tcp", netip.AddrPortFrom(n1v4, 18190)}, {"udp", netip.AddrPortFrom(n1v4, 51820)}} {
				if got, err := semAsk(ext, p.proto, p.ap, semReq(p.proto)); err != nil || got != "n1" {
					return fmt.Errorf("%s answered by %q (%v), want the node's own n1", p, got, err)
				}
			}
		}
		return nil
	})
	// The served hostPorts and the SNAT range are out of the node's
	// ephemeral ports: none of its clients draws one.
	out, err := exec.Command("ip", "netns", "exec", labConfig().NetNS("n1"), "cat", "/proc/sys/net/ipv4/ip_local_reserved_ports").CombinedOutput()
	reserved := map[int]bool{}
	for _, r := range strings.Split(strings.TrimSpace(string(out)), ",") {
		lo, hi, _ := strings.Cut(r, "-")
		l, _ := strconv.Atoi(lo)
		h, herr := strconv.Atoi(hi)
		if herr != nil {
			h = l
		}
		for p := l; p > 0 && p <= h; p++ {
			reserved[p] = true
		}
	}
	for _, p := range []int{40080, 40081, 40082, 40083, 61000, 63000, 65535} {
		if err != nil || !reserved[p] {
			t.Errorf("n1's ip_local_reserved_ports %q (%v) lacks %d; want the served hostPorts and the SNAT range 61000-65535", out, err, p)
		}
	}

	// A network that reaches the outside (so the node's address) but not
	// network default's pods: its pod's flows to the hostPort are
	// refused by the hostPort's admission, as a NodePort's would be.
	c := laceClient(t)
	network(t, c, "hp-iso", "10.124.0.0/16", "fd00:124::/48", false)
	labelNetwork(t, c, "hp-iso", map[string]string{"e2e-hp": "iso"})
	routingPolicy(t, c, "e2e-hp-iso-to-world", map[string]string{"e2e-hp": "iso"}, map[string]string{"lace-cni.io/network": "world"})
	iso := semClientOf(t, appPod(t, "hp-iso-client", "hp-iso", "hp-iso-client", "n1"))
	// It does reach the node's address as an outside one.
	eventually(t, 30*time.Second, "hp-iso's pod reaching the outside", func() error {
		_, err := semAsk(iso.ns, "tcp", netip.AddrPortFrom(n1v4, 18190), "/hostname")
		return err
	})
	expectSilent(t, iso, "n1", "isolated",
		semProbe{"tcp", netip.AddrPortFrom(n1v4, 40080)}, semProbe{"udp", netip.AddrPortFrom(n1v4, 40080)},
		semProbe{"tcp", netip.AddrPortFrom(n1v6, 40080)})
}

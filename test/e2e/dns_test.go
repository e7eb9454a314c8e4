package e2e

import (
	"context"
	"fmt"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/lace-cni/lace/internal/netutil"
	"github.com/lace-cni/lace/lab"
)

// TestClusterDNS (every lab runs cluster DNS unless LACE_E2E_DNS=0 / make
// test DNS=0): pods resolve through CoreDNS
// behind kube-system/kube-dns, which Lace serves like any Service: the
// kubelet writes the cluster's resolv.conf, the kubernetes Service's name
// resolves, a Service's short name resolves through the search path and
// answers through its VIP, and kube-dns answers over TCP on its IPv6
// address too (the Service is dual-stack, as the lab is): a Service's name
// resolves to its address of each family, from either VIP, UDP and TCP.
func TestClusterDNS(t *testing.T) {
	needLab(t)
	if !labDNS {
		t.Skip("the lab runs without cluster DNS (LACE_E2E_DNS=0, make test DNS=0)")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	web := netexecPod("dnsweb", "n1")
	startPod(t, web)
	svc := dualStackService(t, "dnsweb", "dnsweb", nil)
	waitEndpoints(t, svc, 1)
	clientPod := startPod(t, netexecPod("dnsclient", "n2"))

	dnsV4, dnsV6 := lab.DNSAddrs()[0], lab.DNSAddrs()[1]
	conf, err := kubectl(ctx, "exec", "dnsclient", "--", "cat", "/etc/resolv.conf")
	if err != nil {
		t.Fatalf("resolv.conf: %v\n%s", err, conf)
	}
	for _, want := range []string{"nameserver " + dnsV4.String(), "search default.svc.cluster.local svc.cluster.local cluster.local", "ndots:5"} {
		if !strings.Contains(conf, want) {
			t.Errorf("the pod's resolv.conf lacks %q:\n%s", want, conf)
		}
	}

	eventually(t, 30*time.Second, "kubernetes.default.svc.cluster.local resolves in a pod", func() error {
		out, err := kubectl(ctx, "exec", "dnsclient", "--", "nslookup", "kubernetes.default.svc.cluster.local")
		if err != nil || !strings.Contains(out, "10.96.0.1") {
			return fmt.Errorf("nslookup: %v\n%s", err, out)
		}
		return nil
	})
	eventually(t, 30*time.Second, "http://dnsweb/hostname from a pod", func() error {
		out, err := kubectl(ctx, "exec", "dnsclient", "--", "wget", "-q", "-O", "-", "http://dnsweb/hostname")
		if err != nil || strings.TrimSpace(out) != "dnsweb" {
			return fmt.Errorf("wget: %v: %q", err, out)
		}
		return nil
	})

	// The Go resolver in the client pod's network namespace, asking each of
	// kube-dns's VIPs over UDP and TCP for the Service's address of each
	// family: A is its IPv4 ClusterIP, AAAA its IPv6 one.
	ns := podNetNS(t, clientPod)
	for _, server := range []string{dnsV4.String(), dnsV6.String()} {
		for _, proto := range []string{"udp", "tcp"} {
			r := &net.Resolver{PreferGo: true, Dial: func(ctx context.Context, _, _ string) (net.Conn, error) {
				return netutil.DialContext(ctx, ns, proto, net.JoinHostPort(server, "53"))
			}}
			for i, family := range []string{"ip4", "ip6"} {
				want := svc.Spec.ClusterIPs[i]
				eventually(t, 30*time.Second, fmt.Sprintf("%s of dnsweb over %s to %s", family, proto, server), func() error {
					lctx, lcancel := context.WithTimeout(ctx, 3*time.Second)
					defer lcancel()
					ips, err := r.LookupIP(lctx, family, "dnsweb.default.svc.cluster.local.")
					if err != nil {
						return err
					}
					if len(ips) != 1 || ips[0].String() != want {
						return fmt.Errorf("%s %v, want [%s]", family, ips, want)
					}
					return nil
				})
			}
		}
	}
}

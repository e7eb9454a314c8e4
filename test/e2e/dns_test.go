package e2e

import (
	"context"
	"fmt"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/lace-cni/lace/internal/lab"
	"github.com/lace-cni/lace/internal/netutil"
)

// TestClusterDNS (a lab up with --dns): pods resolve through CoreDNS
// behind kube-system/kube-dns, which Lace serves like any Service: the
// kubelet writes the cluster's resolv.conf, the kubernetes Service's name
// resolves, a Service's short name resolves through the search path and
// answers through its VIP, and kube-dns answers over TCP on its IPv6
// address too (the Service is dual-stack, as the lab is).
func TestClusterDNS(t *testing.T) {
	needLab(t)
	if !labDNS {
		t.Skip("the lab runs without cluster DNS: `make test DNS=1` (which builds CoreDNS) or LACE_E2E_DNS=1 with bin/images/coredns.tar from `make coredns` brings it up with --dns")
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

	// The Go resolver in the client pod's network namespace, over TCP to
	// kube-dns's IPv6 VIP: the AAAA record is the Service's IPv6 address.
	ns := podNetNS(t, clientPod)
	r := &net.Resolver{PreferGo: true, Dial: func(ctx context.Context, _, _ string) (net.Conn, error) {
		return netutil.DialContext(ctx, ns, "tcp", net.JoinHostPort(dnsV6.String(), "53"))
	}}
	eventually(t, 30*time.Second, "AAAA of dnsweb over TCP to "+dnsV6.String(), func() error {
		lctx, lcancel := context.WithTimeout(ctx, 3*time.Second)
		defer lcancel()
		ips, err := r.LookupIP(lctx, "ip6", "dnsweb.default.svc.cluster.local.")
		if err != nil {
			return err
		}
		if len(ips) != 1 || ips[0].String() != svc.Spec.ClusterIPs[1] {
			return fmt.Errorf("AAAA %v, want [%s]", ips, svc.Spec.ClusterIPs[1])
		}
		return nil
	})
}

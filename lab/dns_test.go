package lab

import (
	"net/netip"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"

	"github.com/lace-cni/lace/lab/images"
)

func TestDNSAddrs(t *testing.T) {
	got := DNSAddrs()
	want := []netip.Addr{netip.MustParseAddr("10.96.0.10"), netip.MustParseAddr("fd00:96::a")}
	if len(got) != len(want) || got[0] != want[0] || got[1] != want[1] {
		t.Fatalf("DNSAddrs() = %v, want %v", got, want)
	}
}

// The kubelet points pods at kube-dns only when the lab runs it: a
// nameserver nobody serves would make every lookup wait for its timeout.
func TestKubeletConfigClusterDNS(t *testing.T) {
	if c := kubeletConfig("/x", false); strings.Contains(c, "clusterDNS") {
		t.Errorf("without DNS the kubelet config names a cluster DNS:\n%s", c)
	}
	c := kubeletConfig("/x", true)
	if !strings.Contains(c, "\nclusterDNS: [10.96.0.10]\n") || !strings.Contains(c, "\nclusterDomain: cluster.local\n") {
		t.Errorf("with DNS the kubelet config lacks clusterDNS: [10.96.0.10] or clusterDomain:\n%s", c)
	}
}

func TestDNSObjects(t *testing.T) {
	sa, role, binding, cm, dep, svc := dnsObjects()
	if svc.Namespace != "kube-system" || svc.Name != "kube-dns" {
		t.Errorf("Service %s/%s, want kube-system/kube-dns", svc.Namespace, svc.Name)
	}
	if strings.Join(svc.Spec.ClusterIPs, ",") != "10.96.0.10,fd00:96::a" || svc.Spec.ClusterIP != "10.96.0.10" {
		t.Errorf("Service cluster IPs %v (%s)", svc.Spec.ClusterIPs, svc.Spec.ClusterIP)
	}
	ports := map[string]bool{}
	for _, p := range svc.Spec.Ports {
		ports[string(p.Protocol)+"/"+p.TargetPort.String()] = true
	}
	for _, p := range []string{"UDP/53", "TCP/53", "TCP/9153"} {
		if !ports[p] {
			t.Errorf("Service lacks port %s: %v", p, svc.Spec.Ports)
		}
	}
	// The Service selects the Deployment's pods.
	for k, v := range svc.Spec.Selector {
		if dep.Spec.Template.Labels[k] != v {
			t.Errorf("Service selector %s=%s does not match the pods' labels %v", k, v, dep.Spec.Template.Labels)
		}
	}
	pod := dep.Spec.Template.Spec
	if pod.ServiceAccountName != sa.Name || binding.Subjects[0].Name != sa.Name || binding.RoleRef.Name != role.Name {
		t.Errorf("service account %q, binding %+v to role %q", pod.ServiceAccountName, binding, role.Name)
	}
	if pod.DNSPolicy != corev1.DNSDefault {
		t.Errorf("dnsPolicy %s, want Default: CoreDNS cannot resolve through itself", pod.DNSPolicy)
	}
	// What the kubernetes plugin lists and watches.
	granted := map[string]bool{}
	for _, r := range role.Rules {
		for _, res := range r.Resources {
			for _, v := range r.Verbs {
				granted[res+":"+v] = true
			}
		}
	}
	for _, res := range []string{"endpoints", "services", "pods", "namespaces", "endpointslices"} {
		if !granted[res+":list"] || !granted[res+":watch"] {
			t.Errorf("ClusterRole %s does not grant list and watch on %s", role.Name, res)
		}
	}
	ctr := pod.Containers[0]
	if ctr.Image != images.CoreDNSRef || strings.Join(ctr.Args, " ") != "-conf /etc/coredns/Corefile" {
		t.Errorf("container image %s args %q", ctr.Image, ctr.Args)
	}
	if p := ctr.ReadinessProbe.HTTPGet; p.Path != "/ready" || p.Port.IntValue() != 8181 {
		t.Errorf("readiness probe %+v, want :8181/ready (the ready plugin)", p)
	}
	if p := ctr.LivenessProbe.HTTPGet; p.Path != "/health" || p.Port.IntValue() != 8080 {
		t.Errorf("liveness probe %+v, want :8080/health (the health plugin)", p)
	}
	v := pod.Volumes[0].ConfigMap
	if v == nil || v.Name != cm.Name || cm.Data["Corefile"] != Corefile {
		t.Errorf("config volume %+v does not carry ConfigMap %s's Corefile", pod.Volumes[0], cm.Name)
	}
	for _, want := range []string{"kubernetes cluster.local in-addr.arpa ip6.arpa {", "pods insecure", "ready", "health", "cache 30", "loop"} {
		if !strings.Contains(Corefile, want) {
			t.Errorf("Corefile lacks %q", want)
		}
	}
	// Nothing outside the lab answers: a forward would only add timeouts.
	if strings.Contains(Corefile, "forward") {
		t.Error("Corefile forwards")
	}
}

func TestDNSNeedsLace(t *testing.T) {
	c := DefaultConfig()
	c.DNS = true
	if err := c.Validate(); err != nil {
		t.Errorf("lace lab with DNS: %v", err)
	}
	c.CNI = CNIBridge
	if err := c.Validate(); err == nil {
		t.Error("a bridge lab with DNS validated: nothing would serve kube-dns")
	}
	found := false
	for _, img := range c.Images() {
		found = found || strings.HasSuffix(img, "/"+images.CoreDNSTar)
	}
	if !found {
		t.Errorf("a DNS lab does not import %s: %v", images.CoreDNSTar, c.Images())
	}
}

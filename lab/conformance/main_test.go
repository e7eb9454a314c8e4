package main

import (
	"os"
	"regexp"
	"strings"
	"testing"
	"time"
)

func TestParseSkipList(t *testing.T) {
	in := "# comment\n\nNodePort service  # NodePort: next issue\n  ExternalIP # ExternalIPs \n"
	got, err := ParseSkipList(strings.NewReader(in))
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 2 || got[0].Re.String() != "NodePort service" || got[0].Reason != "NodePort: next issue" ||
		got[1].Re.String() != "ExternalIP" || got[1].Reason != "ExternalIPs" || got[1].Line != 4 {
		t.Fatalf("got %+v", got)
	}
	if re := SkipRegexp(got); re != "(?:NodePort service)|(?:ExternalIP)" {
		t.Errorf("skip regexp %q", re)
	}
	// Comments only: no entry, and no --ginkgo.skip.
	if got, err := ParseSkipList(strings.NewReader("# header\n#\n\n")); err != nil || len(got) != 0 || SkipRegexp(got) != "" {
		t.Errorf("comments only: %+v, %v, skip regexp %q", got, err, SkipRegexp(got))
	}
	for _, bad := range []string{"no reason\n", "x  # \n", "([  # unbalanced\n"} {
		if _, err := ParseSkipList(strings.NewReader(bad)); err == nil {
			t.Errorf("%q parsed", bad)
		}
	}
}

// The checked-in list parses and joins into one regexp (`--dry-run` shows
// what each entry matches); it may be empty (then no --ginkgo.skip).
func TestSkipFile(t *testing.T) {
	f, err := os.Open("skip.txt")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	skips, err := ParseSkipList(f)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := regexp.Compile(SkipRegexp(skips)); err != nil {
		t.Fatal(err)
	}
}

func TestClassify(t *testing.T) {
	spec := func(leaf, state, msg string) specReport {
		s := specReport{ContainerHierarchyTexts: []string{"[sig-network] Services"}, LeafNodeText: leaf, LeafNodeType: "It", State: state, RunTime: time.Second}
		s.Failure.Message = msg
		s.Failure.Location.FileName = "/root/go/pkg/mod/k8s.io/kubernetes@v1.34.4/test/e2e/network/service.go"
		s.Failure.Location.LineNumber = 10
		return s
	}
	other := spec("x", "passed", "")
	other.ContainerHierarchyTexts = []string{"[sig-apps] Deployment"}
	suite := specReport{LeafNodeType: "SynchronizedBeforeSuite", State: "failed"}
	suite.Failure.Message = "nodes not ready\nmore"
	rep := report{SpecReports: []specReport{
		spec("should serve", "passed", ""),
		spec("should curl", "failed", "curl: exit 7\ndetails"),
		spec("should use a NodePort service", "skipped", ""),
		spec("should restart kube-proxy", "skipped", "no kube-proxy pods"),
		other, suite,
	}}
	skips, _ := ParseSkipList(strings.NewReader("NodePort service  # next issue\n"))
	got := Classify(rep, regexp.MustCompile(DefaultFocus), skips)
	want := []Result{
		{Name: "[SynchronizedBeforeSuite]", Outcome: "failed", Detail: "nodes not ready"},
		{Name: "[sig-network] Services should curl", Outcome: "failed", Detail: "curl: exit 7 (test/e2e/network/service.go:10)", RunTime: time.Second},
		{Name: "[sig-network] Services should serve", Outcome: "passed", RunTime: time.Second},
		{Name: "[sig-network] Services should restart kube-proxy", Outcome: "skipped", Detail: "no kube-proxy pods", RunTime: time.Second},
		{Name: "[sig-network] Services should use a NodePort service", Outcome: "skipped", Detail: "skip list: next issue", RunTime: time.Second},
	}
	if len(got) != len(want) {
		t.Fatalf("got %d results %+v, want %d", len(got), got, len(want))
	}
	for i := range want {
		if got[i] != want[i] {
			t.Errorf("result %d:\n got %+v\nwant %+v", i, got[i], want[i])
		}
	}
}

// TestDefaultFocus: the focus takes every describe the issues name and
// leaves cloud load balancers and kube-proxy's own specs.
func TestDefaultFocus(t *testing.T) {
	re := regexp.MustCompile(DefaultFocus)
	for _, in := range []string{
		"[sig-network] Services should serve a basic endpoint from pods [Conformance]",
		"[sig-network] Conntrack should be able to preserve UDP traffic when server pod cycles for a NodePort service",
		"[sig-network] Networking Granular Checks: Services should be able to handle large requests: udp",
		"[sig-network] [Feature:IPv6DualStack] Granular Checks: Services Secondary IP Family [LinuxOnly] should function for service endpoints using hostNetwork",
		"[sig-network] Traffic Distribution should route traffic to an endpoint in the same zone when using PreferClose",
		"[sig-network] HostPort validates that there is no conflict between pods with same hostPort but different hostIP and protocol [LinuxOnly] [Conformance]",
		"[sig-network] Proxy version v1 should proxy through a service and a pod [Conformance]",
		"[sig-network] EndpointSlice should support creating EndpointSlice API operations [Conformance]",
		"[sig-network] DNS should provide DNS for services [Conformance]",
		"[sig-network] Service endpoints latency should not be very high [Conformance]",
		"[sig-network] Netpol NetworkPolicy between server and client should support a 'default-deny-ingress' policy [Feature:NetworkPolicy]",
		"[sig-network] Netpol API should support creating NetworkPolicy API operations",
	} {
		if !re.MatchString(in) {
			t.Errorf("focus misses %q", in)
		}
	}
	for _, out := range []string{
		"[sig-network] LoadBalancers [Feature:LoadBalancer] should be able to change the type and ports of a TCP service [Slow]",
		"[sig-network] KubeProxy should set TCP CLOSE_WAIT timeout [Privileged]",
		"[sig-network] [Feature:PerformanceDNS] [Serial] Should answer DNS query for maximum number of services per cluster",
		"[sig-node] Pods should be submitted and removed [NodeConformance] [Conformance]",
	} {
		if re.MatchString(out) {
			t.Errorf("focus takes %q", out)
		}
	}
}

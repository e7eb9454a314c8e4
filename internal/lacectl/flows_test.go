package lacectl

import (
	"bytes"
	"context"
	"fmt"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/lace-cni/lace/internal/agent/flows"
)

// TestFlows: the nodes' events merged by time, filtered by verdict and
// namespace (a pod's or the Service's), limited to the last N, one line
// each.
func TestFlows(t *testing.T) {
	t0 := time.Date(2026, 11, 27, 13, 0, 0, 0, time.UTC)
	dnsVIP := netip.MustParseAddrPort("10.96.0.10:53")
	ev := map[string][]flows.Flow{
		"n1": {{Seq: 1, Time: t0.Add(2 * time.Second), Node: "n1", Verdict: "dropped", Reason: "policy", Policy: "NetworkPolicy b/in",
			Direction: "ingress", Proto: "tcp", Src: flows.Endpoint{Addr: netip.MustParseAddrPort("10.0.0.2:4000"), Pod: "a/client", Network: "default"},
			Dst: flows.Endpoint{Addr: netip.MustParseAddrPort("10.0.0.3:80"), Pod: "b/server", Network: "default"}}},
		"n2": {{Seq: 5, Time: t0.Add(time.Second), Node: "n2", Verdict: "forwarded", Proto: "udp",
			Src: flows.Endpoint{Addr: netip.MustParseAddrPort("10.0.1.2:5000"), Pod: "c/x", Network: "default"},
			Dst: flows.Endpoint{Addr: netip.MustParseAddrPort("192.0.2.1:53")}, Service: "kube-system/dns", Frontend: &dnsVIP}},
	}
	src := func(_ context.Context, node string, since uint64) ([]flows.Flow, error) {
		if node == "n3" {
			return nil, fmt.Errorf("no agent")
		}
		return ev[node], nil
	}
	var b bytes.Buffer
	if err := Flows(context.Background(), []string{"n1", "n2"}, src, FlowsInput{}, &b); err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSpace(b.String()), "\n")
	if len(lines) != 2 || !strings.Contains(lines[0], "FORWARDED udp   c/x (10.0.1.2:5000) [default] -> 192.0.2.1:53  service kube-system/dns (10.96.0.10:53)") ||
		!strings.Contains(lines[1], "DROPPED   tcp   a/client (10.0.0.2:4000) [default] -> b/server (10.0.0.3:80) [default]  reason policy (NetworkPolicy b/in, ingress)") {
		t.Errorf("flows:\n%s", b.String())
	}
	for _, c := range []struct {
		in   FlowsInput
		want int
	}{
		{FlowsInput{Verdict: "dropped"}, 1}, {FlowsInput{Namespace: "c"}, 1}, {FlowsInput{Namespace: "b"}, 1},
		{FlowsInput{Namespace: "z"}, 0}, {FlowsInput{Namespace: "kube-system"}, 1}, {FlowsInput{Limit: 1}, 1}, {FlowsInput{Node: "n2"}, 1},
	} {
		b.Reset()
		if err := Flows(context.Background(), []string{"n1", "n2"}, src, c.in, &b); err != nil {
			t.Fatal(err)
		}
		if got := strings.Count(b.String(), "\n"); got != c.want {
			t.Errorf("%+v: %d lines, want %d:\n%s", c.in, got, c.want, b.String())
		}
	}
	if err := Flows(context.Background(), []string{"n3"}, src, FlowsInput{}, &b); err == nil {
		t.Error("a node without an agent: no error")
	}
}

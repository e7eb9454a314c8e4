package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/lace-cni/lace/internal/datapath"
	"github.com/lace-cni/lace/internal/dpmetrics"
	"github.com/lace-cni/lace/internal/netutil"
)

// laceUsers are the chart's service accounts (release namespace
// kube-system in the lab).
var laceUsers = []string{
	"system:serviceaccount:kube-system:lace-agent",
	"system:serviceaccount:kube-system:lace-controller",
}

// auditEvent is the part of an audit.k8s.io/v1 Event the tests read.
type auditEvent struct {
	Verb      string                    `json:"verb"`
	User      struct{ Username string } `json:"user"`
	ObjectRef *struct {
		Resource    string `json:"resource"`
		Subresource string `json:"subresource"`
		Namespace   string `json:"namespace"`
		Name        string `json:"name"`
		APIGroup    string `json:"apiGroup"`
	} `json:"objectRef"`
	ResponseStatus *struct {
		Code int `json:"code"`
	} `json:"responseStatus"`
	StageTimestamp time.Time `json:"stageTimestamp"`
}

func (e auditEvent) String() string {
	s := e.StageTimestamp.Format("15:04:05.000") + " " + strings.TrimPrefix(e.User.Username, "system:serviceaccount:") + " " + e.Verb
	if r := e.ObjectRef; r != nil {
		res := r.Resource
		if r.APIGroup != "" {
			res += "." + r.APIGroup
		}
		if r.Subresource != "" {
			res += "/" + r.Subresource
		}
		s += " " + res + " " + strings.TrimPrefix(r.Namespace+"/"+r.Name, "/")
	}
	if e.ResponseStatus != nil {
		s += fmt.Sprintf(" -> %d", e.ResponseStatus.Code)
	}
	return s
}

// leaderLease is lace-controller's leader election: renewing it every
// few seconds is how a second replica knows the first is alive, as
// kube-controller-manager's and the kubelets' leases are. It is liveness,
// not state, and is counted apart.
func (e auditEvent) leaderLease() bool {
	r := e.ObjectRef
	return r != nil && r.APIGroup == "coordination.k8s.io" && r.Resource == "leases" &&
		r.Namespace == "kube-system" && r.Name == "lace-controller"
}

// laceWrites returns the write requests Lace's service accounts made from
// since (exclusive): state writes, and leader election renewals apart.
func laceWrites(t *testing.T, since time.Time) (writes, lease []auditEvent) {
	t.Helper()
	f, err := os.Open(labConfig().AuditLog())
	if err != nil {
		t.Fatalf("audit log: %v", err)
	}
	defer f.Close()
	dec := json.NewDecoder(f)
	for {
		var e auditEvent
		if err := dec.Decode(&e); err != nil {
			if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
				break // a line being written
			}
			t.Fatalf("audit log: %v", err)
		}
		if !e.StageTimestamp.After(since) || !slices.Contains(laceUsers, e.User.Username) {
			continue
		}
		if e.leaderLease() {
			lease = append(lease, e)
		} else {
			writes = append(writes, e)
		}
	}
	return writes, lease
}

// TestIdleClusterMakesNoWrites: once nothing changes, Lace writes nothing
// to the API server in 60 s: no periodic status, no no-op updates, no
// repeated Events (the audit log of the lab's API server records every
// write).
func TestIdleClusterMakesNoWrites(t *testing.T) {
	needLab(t)
	// Settled: no Lace write for quiet seconds (the agents' first status
	// reports, the objects earlier tests left being collected).
	const quiet = 20 * time.Second
	settleStart := time.Now()
	eventually(t, 4*time.Minute, fmt.Sprintf("no Lace write for %s", quiet), func() error {
		writes, _ := laceWrites(t, time.Now().Add(-quiet))
		if len(writes) > 0 {
			return fmt.Errorf("last Lace write %s", writes[len(writes)-1])
		}
		return nil
	})
	t.Logf("settled after %s", time.Since(settleStart).Round(time.Second))

	const window = 60 * time.Second
	start := time.Now()
	time.Sleep(window)
	writes, lease := laceWrites(t, start)
	t.Logf("in %s: %d Lace writes, and %d leader election renewals of Lease kube-system/lace-controller (not counted)",
		window, len(writes), len(lease))
	if len(writes) > 0 {
		var b strings.Builder
		for _, e := range writes {
			b.WriteString("\n  " + e.String())
		}
		t.Errorf("an idle lab got %d write(s) from Lace in %s:%s", len(writes), window, b.String())
	}
}

// scrapeAgent reads node's agent metrics from inside the node's network
// namespace (the agent listens on the node's network only).
func scrapeAgent(ctx context.Context, node string) (dpmetrics.Snapshot, error) {
	body, err := getFromNode(ctx, node, "http://127.0.0.1:9962/metrics")
	if err != nil {
		return dpmetrics.Snapshot{}, err
	}
	return dpmetrics.Parse(bytes.NewReader(body))
}

// TestDataPlaneMetrics: the agent serves the data plane counters as
// Prometheus metrics, and lacectl status shows them.
func TestDataPlaneMetrics(t *testing.T) {
	needLab(t)
	ctx := context.Background()
	var pods [2]*corev1.Pod
	for i, node := range []string{"n1", "n2"} {
		p := netexecPod("metrics-"+node, node)
		if _, err := client.CoreV1().Pods("default").Create(ctx, p, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			_ = client.CoreV1().Pods("default").Delete(context.Background(), p.Name, metav1.DeleteOptions{GracePeriodSeconds: ptr.To[int64](0)})
		})
		pods[i] = p
	}
	a := waitPodReady(t, "default", pods[0].Name)
	b := waitPodReady(t, "default", pods[1].Name)
	bv4 := b.Status.PodIP
	// Cross-node pod to pod: encapsulated on n1, decapsulated on n2.
	ns := podNetNS(t, a)
	hc := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{DisableKeepAlives: true,
		DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
			return netutil.DialContext(ctx, ns, network, addr)
		}}}
	for range 5 {
		resp, err := hc.Get("http://" + net.JoinHostPort(bv4, "8080") + "/hostname")
		if err != nil {
			t.Fatalf("%s -> %s: %v", a.Name, b.Name, err)
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
	}

	for _, c := range []struct{ node, kind string }{{"n1", "encapsulated"}, {"n2", "decapsulated"}, {"n1", "to-host"}} {
		eventually(t, 30*time.Second, c.node+" "+c.kind+" counter", func() error {
			s, err := scrapeAgent(ctx, c.node)
			if err != nil {
				return err
			}
			if s.Forwarded[c.kind] == 0 {
				return fmt.Errorf("%s{kind=%q} is 0: %v", dpmetrics.Forwarded, c.kind, s.Forwarded)
			}
			return nil
		})
	}
	s, err := scrapeAgent(ctx, "n1")
	if err != nil {
		t.Fatal(err)
	}
	var reasons []string
	for r := range s.Dropped {
		reasons = append(reasons, r)
	}
	sort.Strings(reasons)
	want := slices.Clone(datapath.DropReasons)
	sort.Strings(want)
	if !slices.Equal(reasons, want) || !slices.Contains(reasons, "isolated") {
		t.Errorf("%s reasons %v, want every reason of the data plane %v", dpmetrics.Dropped, reasons, want)
	}
	if s.Endpoints < 1 || s.MapEntries["endpoints"] < 1 {
		t.Errorf("gauges: %d endpoints, map entries %v", s.Endpoints, s.MapEntries)
	}
	t.Logf("n1: forwarded %v, dropped (non-zero) %v", s.Forwarded, nonZero(s.Dropped))

	// lacectl reads the same counters through the API server's pod proxy.
	cmd := exec.CommandContext(ctx, filepath.Join(binDir, "lacectl"), "status")
	cmd.Env = append(os.Environ(), "KUBECONFIG="+kubeconfig)
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("lacectl status: %v\n%s", err, out)
	}
	n1 := string(out)
	if i := strings.Index(n1, "\nnode n1 "); i >= 0 {
		n1 = n1[i:]
		if j := strings.Index(n1[1:], "\nnode "); j >= 0 {
			n1 = n1[:j+1]
		}
	}
	if !strings.Contains(n1, "forwarded: ") || !strings.Contains(n1, "encapsulated=") || strings.Contains(n1, "encapsulated=0") ||
		!strings.Contains(n1, "maps: ") {
		t.Errorf("lacectl status does not show n1's counters:\n%s", out)
	}
}

func nonZero(m map[string]uint64) map[string]uint64 {
	out := map[string]uint64{}
	for k, v := range m {
		if v != 0 {
			out[k] = v
		}
	}
	return out
}

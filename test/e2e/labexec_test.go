package e2e

import (
	"fmt"
	"net"
	"strings"
	"testing"
	"time"
)

// TestLabExecNodeReachesClusterIP: a process started with `lace-lab exec
// node/N` is a process of the node, as one a user starts on a real node:
// it runs in the node's cgroups (every hierarchy, below the cgroup root
// the agent's socket hooks are attached to) and its UTS namespace, so
// curl to a ClusterIP of either family reaches every backend, as from a
// host-network pod. Outside the node's cgroup the connect-time
// translation never sees it and the VIP is "network is unreachable".
func TestLabExecNodeReachesClusterIP(t *testing.T) {
	needLab(t)
	appPod(t, "exec-web-a", "default", "exec-web", "n1")
	appPod(t, "exec-web-b", "default", "exec-web", "n2")
	svc := dualStackService(t, "exec-web", "exec-web", nil)
	waitEndpoints(t, svc, 2)

	out, err := labCmd("exec", "node/n1", "--", "sh", "-c", "hostname; cat /proc/self/cgroup").CombinedOutput()
	if err != nil {
		t.Fatalf("lace-lab exec node/n1: %v\n%s", err, out)
	}
	lines := strings.Split(strings.TrimSpace(string(out)), "\n")
	if lines[0] != "n1" {
		t.Errorf("hostname in node/n1 is %q, want n1 (the node's UTS namespace)", lines[0])
	}
	want := "/lace-lab-" + labName + "-n1/exec"
	for _, l := range lines[1:] {
		// id:controllers:path, one line per hierarchy.
		if f := strings.SplitN(l, ":", 3); len(f) != 3 || f[2] != want {
			t.Errorf("cgroup line %q, want every hierarchy at %s", l, want)
		}
	}

	for _, vip := range clusterIPs(svc) {
		url := "http://" + net.JoinHostPort(vip.String(), "80") + "/hostname"
		eventually(t, 30*time.Second, "lace-lab exec node/n1 -- curl "+url, func() error {
			seen := map[string]bool{}
			for range 8 {
				out, err := labCmd("exec", "node/n1", "--", "curl", "-sS", "--max-time", "3", url).CombinedOutput()
				if err != nil {
					return fmt.Errorf("curl: %v: %s", err, out)
				}
				seen[strings.TrimSpace(string(out))] = true
			}
			if !seen["exec-web-a"] || !seen["exec-web-b"] || len(seen) != 2 {
				return fmt.Errorf("answered by %v, want exec-web-a and exec-web-b", seen)
			}
			return nil
		})
	}
}

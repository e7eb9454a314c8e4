package e2e

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"path/filepath"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/lace-cni/lace/internal/netutil"
	"github.com/lace-cni/lace/lab"
	"github.com/lace-cni/lace/lab/images"
)

// TestUpgradeMigratesConntrack rolls the release to a build whose
// conntrack value has another layout (the lace_ctv2 build tag: expires
// moved after the flags, at the same size) while two TCP streams are held, pod to pod and
// through a ClusterIP: each agent migrates lace_ct (logged with the flows
// it converted), the pods' programs move to the new map, and both streams
// keep answering. Before layout versions the new agent would have read
// every pinned flow's fields from the wrong bytes (and one of another
// size could not be loaded at all: a crash loop).
func TestUpgradeMigratesConntrack(t *testing.T) {
	needLab(t)
	c := labConfig()
	ctx, cancel := context.WithTimeout(context.Background(), 8*time.Minute)
	defer cancel()

	// The other build: Lace's binaries with the lace_ctv2 tag, as an image.
	const tag = "e2e-ctv2"
	tarball := filepath.Join(t.TempDir(), "lace-ctv2.tar")
	if err := images.BuildLace(ctx, filepath.Join("..", ".."), []string{"lace_ctv2"}, tarball, images.LaceRef(tag)); err != nil {
		t.Fatal(err)
	}
	if out, err := labCmd("load", tarball).CombinedOutput(); err != nil {
		t.Fatalf("lace-lab load: %v\n%s", err, out)
	}

	// Two streams: pod to pod, and through a ClusterIP (translated both
	// ways by the conntrack entries of n1).
	a := netPod(t, "ctv2-a", "default", "n1", true)
	b := appPod(t, "ctv2-b", "default", "ctv2-web", "n3")
	b4, _ := podAddrs(b)
	web := dualStackService(t, "ctv2-web", "ctv2-web", nil)
	waitEndpoints(t, web, 1)
	expectServed(t, a, web, "ctv2-b")
	direct, err := netutil.DialContext(ctx, podNetNS(t, a), "tcp", net.JoinHostPort(b4.String(), "8080"))
	if err != nil {
		t.Fatal(err)
	}
	defer direct.Close()
	var vip4 netip.Addr
	for _, v := range clusterIPs(web) {
		if v.Is4() {
			vip4 = v
		}
	}
	viaVIP, err := netutil.DialContext(ctx, podNetNS(t, a), "tcp", net.JoinHostPort(vip4.String(), "80"))
	if err != nil {
		t.Fatal(err)
	}
	defer viaVIP.Close()
	askDirect, askSvc := echoer(t, direct), echoer(t, viaVIP)
	askDirect("before")
	askSvc("before")

	since := metav1.Now()
	old := daemonSetGeneration(t)
	if err := lab.HelmInstall(ctx, c, "image.tag="+tag); err != nil {
		t.Fatal(err)
	}
	defer func() {
		// Back to the release's layout: its agent finds lace_ct at a
		// version it has no way from and recreates it.
		if err := lab.HelmInstall(context.Background(), c, "image.tag="+c.LaceTag); err != nil {
			t.Errorf("roll back: %v", err)
		}
		waitRollout(t)
	}()
	i := 0
	eventually(t, 4*time.Minute, "agent DaemonSet rolled to "+tag, func() error {
		i++
		askDirect(fmt.Sprintf("during-%d", i))
		askSvc(fmt.Sprintf("during-%d", i))
		return rolledOut(old, tag)
	})
	askDirect("after")
	askSvc("after")

	// Every node's new agent says it migrated lace_ct; n1 and n3 had
	// the streams' flows.
	for _, node := range []string{"n1", "n2", "n3"} {
		pod := agentPod(t, node)
		out, err := kubectl(ctx, "logs", "-n", lab.ReleaseNamespace, pod.Name, "--since-time", since.Format(time.RFC3339))
		if err != nil {
			t.Fatalf("logs of %s: %v", pod.Name, err)
		}
		var line string
		for _, l := range strings.Split(out, "\n") {
			if strings.Contains(l, "migrated a pinned map") && (strings.Contains(l, `"map":"lace_ct",`) || strings.Contains(l, "map=lace_ct ")) {
				line = l
			}
		}
		switch {
		case line == "":
			t.Errorf("%s's agent did not log a migration of lace_ct:\n%s", node, out)
		case node != "n2" && (strings.Contains(line, "entries=0 ") || strings.Contains(line, `"entries":0,`)):
			t.Errorf("%s's agent migrated no flow: %s", node, line)
		default:
			t.Logf("%s: %s", node, line)
		}
	}
}

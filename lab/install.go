package lab

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"

	lacev1 "github.com/lace-cni/lace/api/v1alpha1"
	chart "github.com/lace-cni/lace/deploy/helm"
	"github.com/lace-cni/lace/lab/images"
	"github.com/lace-cni/lace/pkg/scheme"
)

// Lace is installed into the lab exactly as a user installs it: the chart,
// with helm, into kube-system. The only lab-specific values are the image
// tag, where the API server sits on the fabric (the agents need it before
// Services work), a short block release grace for the tests and the
// external IPs the lab allows (ExternalIPRanges).
const (
	// ReleaseName and ReleaseNamespace are the lab's Helm release.
	ReleaseName      = "lace"
	ReleaseNamespace = "kube-system"
	// HeartbeatNamespace holds the agents' heartbeat Leases (the chart's
	// agent.leaseNamespace).
	HeartbeatNamespace = "lace-heartbeats"
	// AgentDaemonSet and ControllerDeployment are the chart's workloads.
	AgentDaemonSet       = "lace-agent"
	ControllerDeployment = "lace-controller"
)

// HelmInstall runs `helm upgrade --install` of the chart with values (NAME=VALUE, as --set).
func HelmInstall(ctx context.Context, c Config, values ...string) error {
	dir := filepath.Join(c.StateDir(), "chart")
	if err := os.RemoveAll(dir); err != nil {
		return err
	}
	if err := chart.WriteChart(dir); err != nil {
		return fmt.Errorf("write chart: %w", err)
	}
	return HelmInstallChart(ctx, c, dir, values...)
}

// HelmInstallChart is HelmInstall of the chart in dir: another build's
// (an upgrade or a downgrade). The values set on the release are kept, as
// an operator's upgrade keeps them, over the chart's own defaults
// (--reset-then-reuse-values: --reuse-values would carry the previous
// chart's defaults too, which an older chart's schema refuses).
func HelmInstallChart(ctx context.Context, c Config, dir string, values ...string) error {
	args := []string{"upgrade", "--install", ReleaseName, dir, "--namespace", ReleaseNamespace,
		"--kubeconfig", c.Kubeconfig(), "--reset-then-reuse-values"}
	for _, v := range values {
		args = append(args, "--set", v)
	}
	cmd := exec.CommandContext(ctx, c.Helm, args...)
	// helm keeps its caches and config under $HOME by default; the lab's
	// stay in its state dir.
	cmd.Env = append(os.Environ(), "HELM_CACHE_HOME="+filepath.Join(c.StateDir(), "helm", "cache"),
		"HELM_CONFIG_HOME="+filepath.Join(c.StateDir(), "helm", "config"),
		"HELM_DATA_HOME="+filepath.Join(c.StateDir(), "helm", "data"))
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("helm %s: %w\n%s", strings.Join(args, " "), err, out)
	}
	return nil
}

// installLace installs the chart with the lab's values.
func installLace(ctx context.Context, c Config, apiPort int) error {
	v4, _ := APIServerAddrs()
	var set []string
	if c.HelmSet != "" {
		set = []string{c.HelmSet}
	}
	return HelmInstall(ctx, c, append([]string{
		"image.repository=" + images.LaceRepo,
		"image.tag=" + c.LaceTag,
		"apiServer.host=" + v4.String(),
		"apiServer.port=" + strconv.Itoa(apiPort),
		"controller.blockReleaseGrace=5s",
		// External IPs the lab allows: a slice of the fabric no one else
		// uses, and the addresses the upstream ExternalIP conformance spec
		// names. Everything else (the API server's address, the external
		// host's) is refused, as in any install.
		"services.externalIPs.allowedCIDRs={" + strings.Join(ExternalIPRanges(), ",") + "}",
		// The machine is cgroup v1 with a cgroup2 hierarchy beside it; each
		// node's processes and pods live below its own cgroup root there.
		"agent.hostCgroup=/sys/fs/cgroup/unified/" + cgroupPrefix(c.Name) + "$(NODE_NAME)",
	}, set...)...)
}

// waitLace waits until the agent DaemonSet and the controller are ready,
// every node has a block of the default network and every agent has
// published its UnderlayEndpoint with a locator.
func waitLace(ctx context.Context, cfg *rest.Config, nodes int, alive func() error) error {
	c, err := client.New(cfg, client.Options{Scheme: scheme.Scheme})
	if err != nil {
		return err
	}
	deadline := time.Now().Add(3 * time.Minute)
	var last string
	for time.Now().Before(deadline) {
		if err := alive(); err != nil {
			return err
		}
		last = laceProgress(ctx, c, nodes)
		if last == "" {
			return nil
		}
		if !sleepCtx(ctx, 250*time.Millisecond) {
			return ctx.Err()
		}
	}
	return fmt.Errorf("lace not ready after 3 minutes: %s", last)
}

// laceProgress says what Lace still lacks, or "" when it is ready.
func laceProgress(ctx context.Context, c client.Client, nodes int) string {
	var ds appsv1.DaemonSet
	if err := c.Get(ctx, client.ObjectKey{Namespace: ReleaseNamespace, Name: AgentDaemonSet}, &ds); err != nil {
		return err.Error()
	}
	if ds.Status.NumberReady < int32(nodes) || ds.Status.UpdatedNumberScheduled < int32(nodes) {
		return fmt.Sprintf("agent DaemonSet %d/%d ready", ds.Status.NumberReady, nodes)
	}
	var dep appsv1.Deployment
	if err := c.Get(ctx, client.ObjectKey{Namespace: ReleaseNamespace, Name: ControllerDeployment}, &dep); err != nil {
		return err.Error()
	}
	if dep.Status.ReadyReplicas < 1 {
		return "controller not ready"
	}
	var allocs lacev1.AllocationList
	var ueps lacev1.UnderlayEndpointList
	if err := c.List(ctx, &allocs); err != nil {
		return err.Error()
	}
	if err := c.List(ctx, &ueps); err != nil {
		return err.Error()
	}
	ready := 0
	for _, u := range ueps.Items {
		if u.Spec.Locator != "" && len(u.Spec.Addresses) > 0 {
			ready++
		}
	}
	if len(allocs.Items) < nodes || ready < nodes {
		return fmt.Sprintf("%d allocations, %d of %d underlay endpoints ready", len(allocs.Items), ready, nodes)
	}
	return ""
}

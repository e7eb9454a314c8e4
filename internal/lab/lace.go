package lab

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	lacev1 "github.com/lace-cni/lace/api/v1alpha1"
	"github.com/lace-cni/lace/internal/controlplane"
	"github.com/lace-cni/lace/internal/model"
	"github.com/lace-cni/lace/internal/netutil"
	"github.com/lace-cni/lace/pkg/scheme"
)

// component is a restartable Lace process of the lab.
type component struct {
	name, bin string
	args      []string
	log       string
	proc      *controlplane.Process
}

func (c *component) start() error {
	p, err := controlplane.StartProcess(c.name, c.bin, c.args, c.log)
	if err != nil {
		return err
	}
	c.proc = p
	return nil
}

func (d *daemon) bpffsDir() string { return filepath.Join(d.cfg.StateDir(), "bpffs") }

// startLace runs lace-controller and one lace-agent per node, and writes
// each node's CNI config for lace-cni.
func (d *daemon) startLace(cp *controlplane.ControlPlane) error {
	c := d.cfg
	kc := filepath.Join(c.StateDir(), "lace.kubeconfig")
	if err := cp.WriteKubeconfig(kc, "lace", []string{"system:masters"}); err != nil {
		return err
	}
	if err := netutil.EnsureBPFFS(d.bpffsDir()); err != nil {
		return err
	}
	logs := filepath.Join(c.StateDir(), "logs")
	comps := []*component{{
		name: "controller", bin: filepath.Join(c.LaceBinDir, "lace-controller"), log: filepath.Join(logs, "lace-controller.log"),
		args: []string{"--kubeconfig=" + kc, "--metrics-bind-address=0", "--health-probe-bind-address=0",
			"--leader-elect=false", "--block-release-grace=5s"},
	}}
	for i := 1; i <= c.Nodes; i++ {
		node := c.NodeName(i)
		nodeDir := filepath.Join(c.StateDir(), "nodes", node)
		sock := filepath.Join(nodeDir, "lace.sock")
		comps = append(comps, &component{
			name: "agent/" + node, bin: filepath.Join(c.LaceBinDir, "lace-agent"), log: filepath.Join(logs, "lace-agent-"+node+".log"),
			args: []string{"--kubeconfig=" + kc, "--node-name=" + node, "--netns=" + netutil.Path(c.NetNS(node)),
				"--cni-socket=" + sock, "--bpffs=" + filepath.Join(d.bpffsDir(), node),
				"--state-dir=" + filepath.Join(nodeDir, "agent")},
		})
		if err := writeLaceConfig(filepath.Join(nodeDir, "net.d"), sock); err != nil {
			return err
		}
	}
	for _, comp := range comps {
		if err := comp.start(); err != nil {
			return err
		}
		d.mu.Lock()
		d.components = append(d.components, comp)
		d.procs = append(d.procs, comp.proc)
		d.mu.Unlock()
	}
	return nil
}

func writeLaceConfig(confDir, sock string) error {
	conf := map[string]any{
		"cniVersion": "1.1.0",
		"name":       "lace",
		"plugins":    []any{map[string]any{"type": "lace", "agentSocket": sock}},
	}
	b, err := json.MarshalIndent(conf, "", "  ")
	if err != nil {
		return err
	}
	if err := os.MkdirAll(confDir, 0o755); err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(confDir, "10-lace.conflist"), b, 0o644)
}

// DefaultNetwork is the network the lab's catch-all binding policy binds
// every pod and service to.
const DefaultNetwork = "default"

// installDefaults creates the default Network and its catch-all binding
// policy, as an install of Lace ships them.
func installDefaults(ctx context.Context, cfg *rest.Config) error {
	c, err := client.New(cfg, client.Options{Scheme: scheme.Scheme})
	if err != nil {
		return err
	}
	nw := &lacev1.Network{ObjectMeta: metav1.ObjectMeta{Name: DefaultNetwork}, Spec: lacev1.NetworkSpec{
		Type:       lacev1.NetworkTypeL3,
		IPv4Subnet: &lacev1.Subnet{Prefix: "10.244.0.0/16", HostLocalPrefixLength: ptr.To[int32](24)},
		IPv6Subnet: &lacev1.Subnet{Prefix: "fd00:244::/56", HostLocalPrefixLength: ptr.To[int32](64)},
	}}
	pol := &lacev1.NetworkBindingPolicy{ObjectMeta: metav1.ObjectMeta{Name: "default"},
		Spec: lacev1.NetworkBindingPolicySpec{Network: DefaultNetwork, Priority: model.CatchAllPriority}}
	for _, o := range []client.Object{nw, pol} {
		if err := c.Create(ctx, o); err != nil && !apierrors.IsAlreadyExists(err) {
			return fmt.Errorf("create %T %s: %w", o, o.GetName(), err)
		}
	}
	return nil
}

// waitLace waits until every node has a block of the default network and
// every agent has published its UnderlayEndpoint with a locator.
func waitLace(ctx context.Context, cfg *rest.Config, nodes int, alive func() error) error {
	c, err := client.New(cfg, client.Options{Scheme: scheme.Scheme})
	if err != nil {
		return err
	}
	deadline := time.Now().Add(2 * time.Minute)
	var last string
	for time.Now().Before(deadline) {
		if err := alive(); err != nil {
			return err
		}
		var allocs lacev1.AllocationList
		var ueps lacev1.UnderlayEndpointList
		if err := c.List(ctx, &allocs); err != nil {
			last = err.Error()
		} else if err := c.List(ctx, &ueps); err != nil {
			last = err.Error()
		} else {
			ready := 0
			for _, u := range ueps.Items {
				if u.Spec.Locator != "" && len(u.Spec.Addresses) > 0 {
					ready++
				}
			}
			if len(allocs.Items) >= nodes && ready >= nodes {
				return nil
			}
			last = fmt.Sprintf("%d allocations, %d of %d underlay endpoints ready", len(allocs.Items), ready, nodes)
		}
		if !sleepCtx(ctx, 250*time.Millisecond) {
			return ctx.Err()
		}
	}
	return fmt.Errorf("lace not ready after 2 minutes: %s", last)
}

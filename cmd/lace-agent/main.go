// Command lace-agent runs Lace on one node: CNI requests, pod interfaces,
// the eBPF data plane and the node's UnderlayEndpoint.
package main

import (
	"context"
	"flag"
	"fmt"
	"log/slog"
	"os"

	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client/config"

	"github.com/lace-cni/lace/internal/agent"
	"github.com/lace-cni/lace/pkg/logging"
)

func main() {
	o := agent.DefaultOptions()
	var logLevel string
	// --kubeconfig is registered by controller-runtime's config package.
	flag.StringVar(&o.NodeName, "node-name", os.Getenv("NODE_NAME"), "name of this node")
	flag.StringVar(&o.NetNS, "netns", o.NetNS, "network namespace of the node (the lab points this at a node namespace)")
	flag.StringVar(&o.UnderlayInterface, "underlay-interface", o.UnderlayInterface, "interface towards the other nodes")
	flag.StringVar(&o.CNISocket, "cni-socket", o.CNISocket, "unix socket lace-cni connects to")
	flag.StringVar(&o.BPFFS, "bpffs", o.BPFFS, "bpffs directory for pinned maps and links")
	flag.StringVar(&o.StateDir, "state-dir", o.StateDir, "directory of the endpoint checkpoint")
	flag.IntVar(&o.MTU, "mtu", o.MTU, "pod interface MTU (underlay MTU - 40)")
	flag.StringVar(&o.MetricsAddr, "metrics-bind-address", o.MetricsAddr, "metrics endpoint (0 disables)")
	flag.StringVar(&o.HealthAddr, "health-probe-bind-address", o.HealthAddr, "health endpoint (0 disables)")
	flag.StringVar(&logLevel, "log-level", "info", "debug, info, warn or error")
	flag.Parse()
	if err := run(ctrl.SetupSignalHandler(), logLevel, o); err != nil {
		fmt.Fprintln(os.Stderr, "lace-agent:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, logLevel string, o agent.Options) error {
	if err := logging.Setup(logLevel); err != nil {
		return err
	}
	cfg, err := config.GetConfig()
	if err != nil {
		return fmt.Errorf("load kubeconfig: %w", err)
	}
	a, err := agent.New(cfg, o, slog.Default())
	if err != nil {
		return err
	}
	return a.Run(ctx)
}

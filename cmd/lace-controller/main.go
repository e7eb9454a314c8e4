// Command lace-controller makes Lace's cluster-wide decisions: network IDs,
// l3 node blocks and SRv6 locators.
package main

import (
	"context"
	"flag"
	"fmt"
	"log/slog"
	"net/netip"
	"os"
	"strings"

	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client/config"

	"github.com/lace-cni/lace/internal/controller"
	"github.com/lace-cni/lace/internal/model"
	"github.com/lace-cni/lace/pkg/logging"
)

func main() {
	o := controller.DefaultOptions()
	var logLevel string
	pool := o.LocatorPool.String()
	// --kubeconfig is registered by controller-runtime's config package.
	flag.StringVar(&o.MetricsAddr, "metrics-bind-address", o.MetricsAddr, "address of the metrics endpoint (0 disables)")
	flag.StringVar(&o.HealthAddr, "health-probe-bind-address", o.HealthAddr, "address of /healthz and /readyz (0 disables)")
	flag.BoolVar(&o.LeaderElection, "leader-elect", o.LeaderElection, "elect a leader so only one controller decides at a time")
	flag.StringVar(&o.LeaderElectionNamespace, "leader-election-namespace", o.LeaderElectionNamespace, "namespace of the leader election Lease")
	flag.StringVar(&pool, "srv6-locator-pool", pool, "IPv6 prefix cut into per-node SRv6 locators")
	flag.IntVar(&o.LocatorLength, "srv6-locator-length", o.LocatorLength, "prefix length of each node's locator")
	flag.DurationVar(&o.ReleaseGrace, "block-release-grace", o.ReleaseGrace, "how long a removed node's blocks stay reserved before reuse")
	var allowedXIPs string
	flag.StringVar(&allowedXIPs, "allowed-external-ips", "", "comma-separated CIDRs Services' externalIPs may name (empty refuses every external IP); give the agents the same list")
	flag.StringVar(&logLevel, "log-level", "info", "debug, info, warn or error")
	flag.Parse()
	var err error
	var warnings []string
	if o.AllowedExternalIPs, warnings, err = model.ParseAllowedExternalIPs(strings.Split(allowedXIPs, ",")); err != nil {
		fmt.Fprintln(os.Stderr, "lace-controller:", err)
		os.Exit(2)
	}
	for _, w := range warnings {
		fmt.Fprintln(os.Stderr, "lace-controller: warning:", w)
	}

	if err := run(ctrl.SetupSignalHandler(), pool, logLevel, o); err != nil {
		fmt.Fprintln(os.Stderr, "lace-controller:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, pool, logLevel string, o controller.Options) error {
	if err := logging.Setup(logLevel); err != nil {
		return err
	}
	p, err := netip.ParsePrefix(pool)
	if err != nil {
		return fmt.Errorf("parse --srv6-locator-pool: %w", err)
	}
	o.LocatorPool = p
	cfg, err := config.GetConfig()
	if err != nil {
		return fmt.Errorf("load kubeconfig: %w", err)
	}
	if err := controller.WaitForAPIServer(ctx, cfg, o.HealthAddr, slog.Default()); err != nil {
		return err
	}
	mgr, err := controller.NewManager(cfg, o)
	if err != nil {
		return err
	}
	return mgr.Start(ctx)
}

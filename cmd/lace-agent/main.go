// Command lace-agent runs Lace on one node: CNI requests, pod interfaces,
// the eBPF data plane and the node's UnderlayEndpoint.
package main

import (
	"context"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"strconv"
	"strings"
	"time"

	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client/config"

	"github.com/lace-cni/lace/internal/agent"
	"github.com/lace-cni/lace/internal/agent/cni"
	"github.com/lace-cni/lace/internal/model"
	"github.com/lace-cni/lace/pkg/logging"
)

func main() {
	if len(os.Args) > 1 && os.Args[1] == "install-cni" {
		installCNI(os.Args[2:])
		return
	}
	o := agent.DefaultOptions()
	var logLevel string
	// --kubeconfig is registered by controller-runtime's config package.
	flag.StringVar(&o.NodeName, "node-name", os.Getenv("NODE_NAME"), "name of this node")
	flag.StringVar(&o.NetNS, "netns", o.NetNS, "network namespace of the node (the lab points this at a node namespace)")
	flag.StringVar(&o.UnderlayInterface, "underlay-interface", o.UnderlayInterface, "interface towards the other nodes")
	flag.StringVar(&o.HostCgroup, "host-cgroup", o.HostCgroup, "cgroup v2 directory of the node's processes, where node sockets get ClusterIP translation (empty disables)")
	flag.StringVar(&o.CNISocket, "cni-socket", o.CNISocket, "unix socket lace-cni connects to")
	flag.StringVar(&o.BPFFS, "bpffs", o.BPFFS, "bpffs directory for pinned maps and links")
	flag.StringVar(&o.StateDir, "state-dir", o.StateDir, "directory of the endpoint checkpoint")
	flag.StringVar(&o.LocalReservedPorts, "local-reserved-ports", o.LocalReservedPorts, "the node's net.ipv4.ip_local_reserved_ports, where served hostPorts and the SNAT range are kept out of the node's ephemeral ports (empty leaves it alone)")
	flag.StringVar(&o.DelQueueDir, "del-queue-dir", o.DelQueueDir, "directory where lace-cni queues DELs the agent could not be reached for")
	flag.IntVar(&o.MTU, "mtu", o.MTU, "pod interface MTU; 0 derives it at each ADD from the underlay interface's MTU less the 40-byte SRv6 encapsulation")
	flag.StringVar(&o.MetricsAddr, "metrics-bind-address", o.MetricsAddr, "metrics endpoint (0 disables)")
	flag.StringVar(&o.HealthAddr, "health-probe-bind-address", o.HealthAddr, "health endpoint (0 disables)")
	flag.StringVar(&o.LeaseNamespace, "lease-namespace", os.Getenv("POD_NAMESPACE"), "namespace of the agents' heartbeat Leases (L2 announcement of LoadBalancer VIPs); empty disables announcing")
	flag.DurationVar(&o.AnnounceLeaseDuration, "announce-lease-duration", 2*time.Second, "how long an agent that stopped renewing its Lease still announces, and others wait before taking over its VIPs")
	flag.DurationVar(&o.AnnounceRestartGrace, "announce-restart-grace", 30*time.Second, "how long the others wait for the next agent before taking over this node's VIPs when this one stops (not on a cordoned node; at most 2m; 0: a stop fails over)")
	flag.Func("map-services", "entries of lace_services (VIP x protocol x port); 0 keeps the compiled size", uintFlag(&o.MapSizes.Services))
	flag.Func("map-backends", "entries of lace_backends (endpoints of every service port); 0 keeps the compiled size", uintFlag(&o.MapSizes.Backends))
	flag.Func("map-conntrack", "entries of lace_ct (flows of the node's pods); 0 keeps the compiled size", uintFlag(&o.MapSizes.Conntrack))
	flag.Func("map-fragments", "entries of lace_frags (large datagrams in flight through the node); 0 keeps the compiled size", uintFlag(&o.MapSizes.Fragments))
	flag.IntVar(&o.ServiceFrontends, "service-max-frontends", 0, "lace_services entries one Service may take; a Service over it is refused whole (0: the map's size)")
	flag.IntVar(&o.ServiceBackends, "service-max-backends", 0, "lace_backends entries one Service may take; a Service over it is refused whole (0: the map's size)")
	flag.IntVar(&o.NamespaceFrontends, "namespace-max-frontends", 0, "lace_services entries the Services of one namespace may take together (0: a quarter of the map; -1: no share)")
	flag.IntVar(&o.NamespaceBackends, "namespace-max-backends", 0, "lace_backends entries the Services of one namespace may take together (0: a quarter of the map; -1: no share)")
	var allowedXIPs string
	flag.StringVar(&allowedXIPs, "allowed-external-ips", "", "comma-separated CIDRs Services' externalIPs may name (empty refuses every external IP); give the controller the same list")
	flag.StringVar(&logLevel, "log-level", "info", "debug, info, warn or error")
	flag.Parse()
	var err error
	var warnings []string
	if o.AllowedExternalIPs, warnings, err = model.ParseAllowedExternalIPs(strings.Split(allowedXIPs, ",")); err != nil {
		fmt.Fprintln(os.Stderr, "lace-agent:", err)
		os.Exit(2)
	}
	for _, w := range warnings {
		fmt.Fprintln(os.Stderr, "lace-agent: warning:", w)
	}
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

// installCNI is `lace-agent install-cni`: the DaemonSet's init container
// puts the plugin binary and its configuration on the node, then exits.
func installCNI(args []string) {
	o := cni.DefaultInstallCNIOptions()
	fs := flag.NewFlagSet("install-cni", flag.ExitOnError)
	fs.StringVar(&o.Binary, "cni-binary", o.Binary, "lace-cni binary to install")
	fs.StringVar(&o.BinDir, "cni-bin-dir", o.BinDir, "CNI bin dir; the plugin is installed there as "+cni.CNIPluginName)
	fs.StringVar(&o.ConfDir, "cni-conf-dir", o.ConfDir, "CNI conf dir; the configuration is written there as "+cni.CNIConfName)
	fs.StringVar(&o.AgentSocket, "agent-socket", o.AgentSocket, "agent socket written into the configuration (as seen on the node)")
	_ = fs.Parse(args)
	if err := cni.InstallCNI(o); err != nil {
		fmt.Fprintln(os.Stderr, "lace-agent install-cni:", err)
		os.Exit(1)
	}
	fmt.Printf("installed %s/%s and %s/%s\n", o.BinDir, cni.CNIPluginName, o.ConfDir, cni.CNIConfName)
}

// uintFlag parses a uint32 flag into p.
func uintFlag(p *uint32) func(string) error {
	return func(s string) error {
		v, err := strconv.ParseUint(s, 10, 32)
		*p = uint32(v)
		return err
	}
}

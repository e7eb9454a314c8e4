// Command lace-lab runs a whole multi-node Kubernetes cluster on one Linux
// machine, from processes and network namespaces: lace-lab up|down|status|
// exec|kubeconfig|restart.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"os/signal"
	"strings"
	"syscall"
	"text/tabwriter"
	"time"

	"github.com/lace-cni/lace/lab"
)

const usage = `usage: lace-lab COMMAND [flags]

commands:
  up [--name N] [--nodes 3] [--zones 2] [--dns=false] [--cni lace|bridge|flannel]
                                          start a lab (a no-op when it runs) with cluster DNS
                                          (CoreDNS, kube-system/kube-dns) as kubeadm deploys it;
                                          --dns=false leaves DNS out (the default with another --cni);
                                          --cni flannel runs the peer cluster instead of Lace: flannel
                                          (vxlan) and kube-proxy (nftables) on every node
  down [--name N] [--all]                 stop a lab and remove all it made
  status [--name N]                       show nodes and processes
  kubeconfig [--name N]                   print the path of the lab's kubeconfig
  exec [--name N] TARGET -- CMD...        run CMD in NAMESPACE/POD, node/NODE (its namespaces and
                                          cgroups, as the kubelet) or external
  restart|stop|start|kill [--name N] agent/NODE|controller
                                          restart deletes the pod (its DaemonSet or Deployment brings
                                          it back); stop keeps the agent off NODE, or scales the
                                          controller to 0; kill sends SIGKILL to its process (a crash:
                                          the kubelet restarts the container); each waits for the
                                          change to take effect
  stop|start [--name N] apiserver|etcd    take the API server or etcd down, and bring it back (same
                                          address; start waits until it serves)
  reboot [--name N] node/NODE             power-cycle a node: its processes killed at once, its
                                          network namespace (links, routes, eBPF pins) and /run made
                                          again from nothing, its disk kept; returns once its kubelet runs
  load [--name N] [--as REF] IMAGE.tar    import an image into every node's containerd (like kind load)
  demo [--name N]                         a demo topology (one-way, shared, anonymous and external
                                          networks), and its reachability measured against the oracle
`

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code, err := run(ctx, os.Args[1:], os.Stdout)
	stop()
	if err != nil {
		fmt.Fprintln(os.Stderr, "lace-lab:", err)
		if code == 0 {
			code = 1
		}
	}
	os.Exit(code)
}

func run(ctx context.Context, args []string, out io.Writer) (int, error) {
	if len(args) == 0 || args[0] == "-h" || args[0] == "--help" || args[0] == "help" {
		fmt.Fprint(out, usage)
		return 0, nil
	}
	cmd, args := args[0], args[1:]
	cfg := lab.DefaultConfig()
	fs := flag.NewFlagSet("lace-lab "+cmd, flag.ContinueOnError)
	fs.StringVar(&cfg.Name, "name", cfg.Name, "lab name (prefixes every namespace and process)")
	fs.StringVar(&cfg.StateRoot, "state-root", cfg.StateRoot, "directory holding the labs' state")
	all := false
	hostname, nodeDir, as := "", "", ""
	switch cmd {
	case "nodens":
		fs.StringVar(&nodeDir, "dir", "", "state directory of the node")
		fs.StringVar(&hostname, "hostname", "", "hostname of the node")
	case "load":
		fs.StringVar(&as, "as", "", "also tag the image as this reference")
	case "up", "daemon":
		fs.IntVar(&cfg.Nodes, "nodes", cfg.Nodes, "number of nodes")
		fs.IntVar(&cfg.Zones, "zones", cfg.Zones, "number of zones")
		fs.StringVar(&cfg.K8sBinDir, "k8s-bin", cfg.K8sBinDir, "directory of etcd, the Kubernetes binaries and agnhost")
		fs.StringVar(&cfg.CNIBinDir, "cni-bin", cfg.CNIBinDir, "directory of the reference CNI plugins (bridge fallback)")
		fs.StringVar(&cfg.CNI, "cni", cfg.CNI, "pod network: lace, bridge (the reference plugins), or flannel (flannel vxlan and kube-proxy nftables, the benchmarks' peer cluster)")
		fs.StringVar(&cfg.Flannel, "flannel", cfg.Flannel, "flanneld binary of a flannel lab (make flannel)")
		fs.StringVar(&cfg.ImageDir, "images", cfg.ImageDir, "directory of the image tarballs every node imports (make images)")
		fs.StringVar(&cfg.Helm, "helm", cfg.Helm, "helm binary that installs Lace's chart")
		fs.StringVar(&cfg.LaceTag, "lace-tag", cfg.LaceTag, "tag of the Lace image the chart runs")
		fs.StringVar(&cfg.HelmSet, "set", "", "chart values to set at install, over the lab's own (helm --set syntax: a=1,b=2)")
		// Cluster DNS is on by default, as in kubeadm and kind; only Lace
		// serves kube-dns (no kube-proxy), so bridge and flannel labs go without.
		fs.BoolVar(&cfg.DNS, "dns", true, "run cluster DNS (CoreDNS behind kube-system/kube-dns; make coredns builds its image); --dns=false leaves it out")
	case "down":
		fs.BoolVar(&all, "all", false, "remove every lab, including what crashed runs left")
	}
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0, nil
		}
		return 2, err
	}
	rest := fs.Args()
	if (cmd == "up" || cmd == "daemon") && cfg.CNI != lab.CNILace && !flagSet(fs, "dns") {
		cfg.DNS = false
	}

	switch cmd {
	case "nodens":
		return 0, lab.RunNodeNS(nodeDir, hostname)
	case "load":
		if len(rest) != 1 {
			return 2, errors.New("usage: lace-lab load [--as REF] IMAGE.tar")
		}
		return 0, lab.Load(ctx, cfg, rest[0], as)
	case "daemon":
		h := slog.NewJSONHandler(os.Stderr, nil)
		return 0, lab.RunDaemon(ctx, cfg, slog.New(h))
	case "up":
		start := time.Now()
		st, err := lab.Up(ctx, cfg, out)
		if err != nil {
			return 1, err
		}
		dns := ""
		if cfg.DNS {
			dns = ", cluster DNS"
		}
		fmt.Fprintf(out, "lab %s is ready (%d nodes%s) in %.1fs\n\n", cfg.Name, len(st.Nodes), dns, time.Since(start).Seconds())
		fmt.Fprintf(out, "  export KUBECONFIG=%s\n  kubectl get nodes -L topology.kubernetes.io/zone\n", st.Kubeconfig)
		fmt.Fprintf(out, "  lace-lab exec --name %s node/%s -- ip addr\n  lace-lab down --name %s\n", cfg.Name, cfg.NodeName(1), cfg.Name)
		return 0, nil
	case "down":
		names := []string{cfg.Name}
		if all {
			names = lab.AllLabs(cfg.StateRoot)
		}
		removed := 0
		for _, n := range names {
			c := cfg
			c.Name = n
			found, err := lab.Down(ctx, c)
			if err != nil {
				return 1, fmt.Errorf("down %s: %w", n, err)
			}
			if found {
				removed++
				fmt.Fprintf(out, "lab %s removed\n", n)
			}
		}
		if removed == 0 {
			fmt.Fprintln(out, "nothing to remove")
		}
		return 0, nil
	case "status":
		st, err := lab.GetStatus(cfg)
		if err != nil {
			return 1, err
		}
		printStatus(out, st)
		return 0, nil
	case "kubeconfig":
		if _, err := os.Stat(cfg.Kubeconfig()); err != nil {
			return 1, fmt.Errorf("lab %s has no kubeconfig: is it up?", cfg.Name)
		}
		fmt.Fprintln(out, cfg.Kubeconfig())
		return 0, nil
	case "exec":
		if len(rest) < 2 {
			return 2, errors.New("usage: lace-lab exec TARGET -- CMD [ARG]")
		}
		target, argv := rest[0], rest[1:]
		if argv[0] == "--" {
			argv = argv[1:]
		}
		if len(argv) == 0 {
			return 2, errors.New("no command")
		}
		t, err := lab.ExecTarget(ctx, cfg, target)
		if err != nil {
			return 1, err
		}
		c, err := lab.ExecCommand(t, argv)
		if err != nil {
			return 1, err
		}
		c.Stdin, c.Stdout, c.Stderr = os.Stdin, out, os.Stderr
		if err := c.Run(); err != nil {
			var ee *exec.ExitError
			if errors.As(err, &ee) {
				return ee.ExitCode(), nil
			}
			return 1, err
		}
		return 0, nil
	case "demo":
		return 0, lab.Demo(ctx, cfg, out)
	case "reboot":
		if len(rest) != 1 || !strings.HasPrefix(rest[0], "node/") {
			return 2, errors.New("usage: lace-lab reboot node/NODE")
		}
		return 0, lab.Reboot(ctx, cfg, rest[0])
	case "restart", "stop", "start", "kill":
		if len(rest) != 1 {
			return 2, fmt.Errorf("usage: lace-lab %s agent/NODE|controller|apiserver|etcd", cmd)
		}
		return 0, lab.Control(ctx, cfg, cmd, rest[0])
	}
	return 2, fmt.Errorf("unknown command %q\n%s", cmd, usage)
}

func printStatus(out io.Writer, st *lab.Status) {
	state := "starting"
	switch {
	case st.Error != "":
		state = "failed: " + st.Error
	case st.Ready:
		state = "ready"
	}
	dns := "none (lace-lab up --dns runs CoreDNS)"
	if st.DNS {
		dns = "CoreDNS behind kube-system/kube-dns"
	}
	fmt.Fprintf(out, "lab %s: %s (pid %d, up since %s)\nkubeconfig: %s\napi server: %s (on the fabric: %s)\ncluster DNS: %s\n\n",
		st.Name, state, st.PID, st.StartedAt.Format(time.RFC3339), st.Kubeconfig, st.APIServer, st.FabricAPIServer, dns)
	tw := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "NODE\tZONE\tNETNS\tIPV4\tIPV6\tROOT")
	for _, n := range st.Nodes {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\n", n.Name, n.Zone, n.NetNS, n.IPv4, n.IPv6, n.Root)
	}
	tw.Flush()
	fmt.Fprintln(out)
	tw = tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "PROCESS\tSTATE\tLOG")
	for _, p := range st.Processes {
		s := "running"
		if !p.Alive {
			s = "exited"
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\n", p.Name, s, p.Log)
	}
	tw.Flush()
}

// flagSet tells whether the command line gave the flag name.
func flagSet(fs *flag.FlagSet, name string) bool {
	set := false
	fs.Visit(func(f *flag.Flag) { set = set || f.Name == name })
	return set
}

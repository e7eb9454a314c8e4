// Command lacectl shows what Lace is doing: lacectl status, lacectl
// topology, lacectl services, lacectl trace, lacectl flows.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/config"

	"github.com/lace-cni/lace/internal/lacectl"
	"github.com/lace-cni/lace/pkg/scheme"
)

const usage = `usage: lacectl [--kubeconfig PATH] COMMAND

commands:
  status             networks, and per node: endpoints, map sizes, forwarding and drop counters
  topology [--svg FILE]
                     networks and who may reach whom (refused peerings marked);
                     --svg also draws it to FILE
  services [-n NAMESPACE] [--node NODE] [--all]
                     per service port Lace serves: its network, VIPs, and per node
                     the endpoints a new flow may go to, and why the others not;
                     for NodePort, LoadBalancer and external IPs also how it is
                     reached from outside: each NodePort per node address, open
                     or closed and why, each LoadBalancer VIP with its class and
                     announcing node, externalTrafficPolicy, healthCheckNodePort,
                     loadBalancerSourceRanges;
                     --all also lists the services Lace leaves alone
  trace [-n NAMESPACE] [--ipv6] [--node NODE] SRC DST [PROTO/PORT]
                     what happens to a new flow from SRC to DST and to its replies:
                     verdict and rule, networks, path, drop counter; SRC and DST
                     are NAMESPACE/POD, POD (in -n, default "default") or an IP
                     address; DST may be a Service (NAMESPACE/NAME, NAME, or a
                     ClusterIP): the path is then the DNAT to the endpoints
                     eligible on SRC's node (pod:NAME, svc:NAME when both exist);
                     from an outside address, DST may be an external frontend: a
                     node address with a NodePort as PROTO/PORT, a LoadBalancer VIP
                     (entering at the node announcing it) or an external IP
                     (entering at --node, default the first node by name);
                     PROTO/PORT: tcp/80 (default; a service's first port), udp/53,
                     sctp/N, icmp; --ipv6 picks IPv6 addresses when no address is given;
                     then the network policies of each side: the rule that decides
  flows [--follow] [--node NODE] [-n NAMESPACE] [--verdict forwarded|dropped] [--limit N]
                     the nodes' recent flow events, oldest first: pods' new flows
                     and packets network policies refused (with the policy),
                     with pods and networks named; asking turns a node's events
                     on for a minute (off, they cost nothing); --follow keeps
                     printing new ones
`

func main() {
	// --kubeconfig is registered by controller-runtime's config package.
	flag.Usage = func() { fmt.Fprint(os.Stderr, usage) }
	flag.Parse()
	if err := run(context.Background(), flag.Args()); err != nil {
		fmt.Fprintln(os.Stderr, "lacectl:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, args []string) error {
	if len(args) == 0 {
		flag.Usage()
		return fmt.Errorf("no command")
	}
	switch args[0] {
	case "status":
		if len(args) != 1 {
			flag.Usage()
			return fmt.Errorf("status takes no arguments: %v", args[1:])
		}
	case "topology":
		return topology(ctx, args[1:])
	case "services":
		return services(ctx, args[1:])
	case "trace":
		return trace(ctx, args[1:])
	case "flows":
		return flowsCmd(ctx, args[1:])
	default:
		flag.Usage()
		return fmt.Errorf("unknown command %v", args)
	}
	cfg, err := config.GetConfig()
	if err != nil {
		return fmt.Errorf("load kubeconfig: %w", err)
	}
	c, err := client.New(cfg, client.Options{Scheme: scheme.Scheme})
	if err != nil {
		return err
	}
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return err
	}
	return lacectl.Status(ctx, c, lacectl.AgentMetrics(cs), os.Stdout)
}

// topology: lacectl topology [--svg FILE].
func topology(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("topology", flag.ContinueOnError)
	svgPath := fs.String("svg", "", "also draw the topology as SVG to `FILE`")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() != 0 {
		return fmt.Errorf("topology: unexpected arguments %v", fs.Args())
	}
	c, err := apiClient()
	if err != nil {
		return err
	}
	if *svgPath == "" {
		return lacectl.Topology(ctx, c, os.Stdout, nil)
	}
	f, err := os.Create(*svgPath)
	if err != nil {
		return err
	}
	if err := lacectl.Topology(ctx, c, os.Stdout, f); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

// services: lacectl services [-n NAMESPACE] [--node NODE] [--all].
func services(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("services", flag.ContinueOnError)
	var in lacectl.ServicesInput
	fs.StringVar(&in.Namespace, "namespace", "", "show the services of `NAMESPACE` only (default: every namespace)")
	fs.StringVar(&in.Namespace, "n", "", "shorthand for --namespace")
	fs.StringVar(&in.Node, "node", "", "show the choices of `NODE` only (default: every node)")
	fs.BoolVar(&in.All, "all", false, "also list the services Lace leaves alone (headless, ExternalName, another proxy's)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() != 0 {
		return fmt.Errorf("services: unexpected arguments %v", fs.Args())
	}
	c, err := apiClient()
	if err != nil {
		return err
	}
	return lacectl.ServicesCommand(ctx, c, in, os.Stdout)
}

// trace: lacectl trace [-n NAMESPACE] [--ipv6] [--node NODE] SRC DST
// [PROTO/PORT]; flags may come before, between or after the arguments.
func trace(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("trace", flag.ContinueOnError)
	var in lacectl.TraceInput
	fs.StringVar(&in.Namespace, "namespace", "default", "namespace of pods named without one")
	fs.StringVar(&in.Namespace, "n", "default", "shorthand for --namespace")
	fs.BoolVar(&in.IPv6, "ipv6", false, "use the pods' IPv6 addresses when both endpoints are pods")
	fs.StringVar(&in.Node, "node", "", "the `NODE` where a flow from outside to an external IP (or a VIP no Lace node announces) enters (default: the first by name)")
	var pos []string
	for {
		if err := fs.Parse(args); err != nil {
			return err
		}
		if fs.NArg() == 0 {
			break
		}
		pos = append(pos, fs.Arg(0))
		args = fs.Args()[1:]
	}
	if len(pos) < 2 || len(pos) > 3 {
		flag.Usage()
		return fmt.Errorf("trace: want SRC DST [PROTO/PORT], got %v", pos)
	}
	in.Src, in.Dst = pos[0], pos[1]
	if len(pos) == 3 {
		in.Proto = pos[2]
	}
	c, err := apiClient()
	if err != nil {
		return err
	}
	return lacectl.TraceCommand(ctx, c, in, os.Stdout)
}

func apiClient() (client.Client, error) {
	cfg, err := config.GetConfig()
	if err != nil {
		return nil, fmt.Errorf("load kubeconfig: %w", err)
	}
	return client.New(cfg, client.Options{Scheme: scheme.Scheme})
}

// flowsCmd: lacectl flows [--follow] [--node NODE] [-n NAMESPACE]
// [--verdict forwarded|dropped] [--limit N].
func flowsCmd(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("flows", flag.ContinueOnError)
	var in lacectl.FlowsInput
	fs.BoolVar(&in.Follow, "follow", false, "keep printing new events (Ctrl-C stops)")
	fs.StringVar(&in.Node, "node", "", "the events of `NODE` only (default: every node)")
	fs.StringVar(&in.Namespace, "namespace", "", "events with a pod of `NAMESPACE` on either side")
	fs.StringVar(&in.Namespace, "n", "", "shorthand for --namespace")
	fs.StringVar(&in.Verdict, "verdict", "", "forwarded or dropped (default: both)")
	fs.IntVar(&in.Limit, "limit", 200, "at most `N` events at first (0: all the nodes keep)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() != 0 {
		return fmt.Errorf("flows: unexpected arguments %v", fs.Args())
	}
	if in.Verdict != "" && in.Verdict != "forwarded" && in.Verdict != "dropped" {
		return fmt.Errorf("flows: --verdict %q: want forwarded or dropped", in.Verdict)
	}
	cfg, err := config.GetConfig()
	if err != nil {
		return fmt.Errorf("load kubeconfig: %w", err)
	}
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return err
	}
	nodes, err := cs.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
	if err != nil {
		return fmt.Errorf("list nodes: %w", err)
	}
	var names []string
	for _, n := range nodes.Items {
		names = append(names, n.Name)
	}
	ctx, stop := signal.NotifyContext(ctx, os.Interrupt)
	defer stop()
	return lacectl.Flows(ctx, names, lacectl.AgentFlows(cs), in, os.Stdout)
}

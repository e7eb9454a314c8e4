// Command lacectl shows what Lace is doing: lacectl status, lacectl
// topology.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"

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

func apiClient() (client.Client, error) {
	cfg, err := config.GetConfig()
	if err != nil {
		return nil, fmt.Errorf("load kubeconfig: %w", err)
	}
	return client.New(cfg, client.Options{Scheme: scheme.Scheme})
}

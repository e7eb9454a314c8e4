// Command lacectl shows what Lace is doing: lacectl status.
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
  status   networks, and per node: endpoints, map sizes, forwarding and drop counters
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
	if len(args) != 1 || args[0] != "status" {
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

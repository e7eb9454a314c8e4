// Command bench measures Lace on a real lab beside peers measured in the
// same run, and prints tables with ratios (make bench; needs root):
//
//   - pod-to-pod TCP throughput and request/response latency, same node and
//     across nodes, beside a twin of the same namespaces and links (pod,
//     node, fabric bridge, node, pod) routed by the kernel without
//     encapsulation;
//   - CNI ADD latency p50/p99 over 100 pods, beside the reference bridge +
//     host-local plugins invoked the same way;
//   - ClusterIP services at scale (programming time, endpoint change
//     latency, agent memory, first-packet RTT, request/response through a
//     VIP) beside kube-proxy in nftables mode run in a lab node's
//     namespaces (see services.go).
//
// It is not a test: it asserts nothing and its numbers vary with the machine.
package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/lace-cni/lace/lab"
)

func main() {
	dur := flag.Duration("duration", 3*time.Second, fmt.Sprintf("length of each throughput and latency run (each path runs %d rounds)", rounds))
	pods := flag.Int("pods", 100, "pods for the CNI ADD latency run")
	runningPods := flag.Int("running-pods", 300, "pods of each burst of the running benchmark (pods to Running, beside the flannel lab)")
	bin := flag.String("bin", "bin", "directory of the Lace binaries")
	only := flag.String("only", "forwarding,l2,migration,cni,running,netpol,failover,load,services,nodes", "benchmarks to run (comma separated)")
	var no nodeOptions
	flag.IntVar(&no.nodes, "sim-nodes", 1000, "simulated nodes of the nodes benchmark (a lab it brings up has room for 4,000)")
	flag.IntVar(&no.pods, "sim-pods", 30, "pods on each simulated node")
	migrationRounds := flag.Int("migration-rounds", 3, "live migrations each way (announced, announcement lost) of the migration benchmark")
	failoverRounds := flag.Int("failover-rounds", 3, "rounds of the L2 failover benchmark")
	labName := flag.String("lab", "", "run on this lab, which is up already (and stays up), instead of a new one")
	peerLab := flag.String("flannel-lab", "", "the peer cluster of the forwarding, load and running benchmarks: a flannel lab (lace-lab up --cni flannel) that is up already; \"\" brings one up for the run, \"none\" measures no peer cluster")
	var so svcOptions
	sizes := flag.String("services", "1000,10000", "service counts of the services benchmark, each programmed from nothing")
	flag.IntVar(&so.endpoints, "service-endpoints", 10, "endpoints per service")
	flag.IntVar(&so.namespaces, "service-namespaces", 10, "namespaces the services are spread over")
	flag.IntVar(&so.changes, "service-changes", 100, "single endpoint changes timed per service count")
	flag.IntVar(&so.loadedChanges, "service-loaded-changes", 300, "endpoint changes timed back to back, Lace's alone, while kube-proxy syncs each")
	flag.DurationVar(&so.rest, "service-rest", time.Minute, "time the CPU at rest is measured for after the changes, per service count")
	flag.DurationVar(&so.changeTime, "service-change-time", 2*time.Minute, "longest time spent timing endpoint changes per service count")
	flag.IntVar(&so.conns, "service-conns", 500, "new TCP connections timed per path and service count")
	var lo loadOptions
	flag.IntVar(&lo.workers, "load-workers", 8, "concurrent connections of the load benchmark's generator")
	flag.IntVar(&lo.ctFill, "load-ct-fill", 1_000_000, "flows the load benchmark fills each node's conntrack map with for its second pass (0: none)")
	flag.StringVar(&so.kubeProxy, "kube-proxy", filepath.Join(lab.DefaultConfig().K8sBinDir, "kube-proxy"),
		"kube-proxy binary of the services peer (\"\" for none)")
	flag.Parse()
	for _, f := range strings.Split(*sizes, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || n < 1 {
			fmt.Fprintf(os.Stderr, "bench: --services: %q is not a count\n", f)
			os.Exit(2)
		}
		so.sizes = append(so.sizes, n)
	}
	sort.Ints(so.sizes)
	if *runningPods < 1 || *pods < 1 {
		fmt.Fprintln(os.Stderr, "bench: --pods and --running-pods must be at least 1")
		os.Exit(2)
	}
	so.dur = *dur
	lo.dur, lo.kubeProxy = *dur, so.kubeProxy
	want := map[string]bool{}
	for _, b := range strings.Split(*only, ",") {
		b = strings.TrimSpace(b)
		if !slices.Contains([]string{"forwarding", "cni", "running", "services", "failover", "l2", "migration", "netpol", "load", "nodes"}, b) {
			fmt.Fprintf(os.Stderr, "bench: --only: %q is not forwarding, l2, migration, cni, running, netpol, failover, load, services or nodes\n", b)
			os.Exit(2)
		}
		want[b] = true
	}
	// An interrupt cancels the run, so that the deferred cleanups (lab,
	// peer namespaces) still happen.
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := run(ctx, *bin, *labName, *peerLab, want, *dur, *pods, *runningPods, *failoverRounds, *migrationRounds, so, lo, no)
	stop()
	if err != nil {
		fmt.Fprintln(os.Stderr, "bench:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, bin, name, peerLab string, want map[string]bool, dur time.Duration, pods, runningPods, failoverRounds, migrationRounds int, so svcOptions, lo loadOptions, no nodeOptions) error {
	if os.Geteuid() != 0 {
		return fmt.Errorf("the benchmark needs root (network namespaces, eBPF)")
	}
	bin, _ = filepath.Abs(bin)
	if name == "" {
		suffix := make([]byte, 2)
		_, _ = rand.Read(suffix)
		name = "bench" + hex.EncodeToString(suffix)
		// A live migration needs a third node: the VM's peer.
		nodes := "2"
		if want["migration"] {
			nodes = "3"
		}
		args := []string{"--nodes", nodes, "--zones", "1", "--dns=false"}
		var set []string
		if want["nodes"] {
			set = append(set, nodesHelmSet)
		}
		if want["load"] && lo.ctFill > 0 {
			// Room for a million flows and the run's own (load.go).
			set = append(set, fmt.Sprintf("agent.maps.conntrack=%d", lo.ctFill+loadCTHeadroom))
		}
		if len(set) > 0 {
			args = append(args, "--set", strings.Join(set, ","))
		}
		down, err := labUp(bin, name, args...)
		defer down()
		if err != nil {
			return err
		}
	}
	switch {
	case peerLab == "none" || !want["forwarding"] && !want["load"] && !want["running"]:
		peerLab = ""
	case peerLab == "":
		// A lab name has at most 10 characters.
		peerLab = name[:min(len(name), 9)] + "f"
		// One that is up is someone's: up would be a no-op, and the
		// deferred down would take it away.
		c := lab.DefaultConfig()
		c.Name = peerLab
		if _, err := lab.GetStatus(c); err == nil || peerLab == name {
			return fmt.Errorf("the flannel lab's name %s is taken: pass --flannel-lab NAME (a flannel lab that is up) or none", peerLab)
		}
		down, err := labUp(bin, peerLab, "--cni", lab.CNIFlannel, "--nodes", "2", "--zones", "1")
		defer down()
		if err != nil {
			return err
		}
	}
	fmt.Printf("Lace benchmark, %s, kernel %s, %d CPUs\n\n", time.Now().Format(time.RFC3339), kernel(), cpus())
	if want["forwarding"] {
		if err := benchForwarding(ctx, name, peerLab, dur); err != nil {
			return err
		}
	}
	if want["l2"] {
		if err := benchL2(ctx, name, dur); err != nil {
			return err
		}
	}
	if want["migration"] {
		if err := benchMigration(ctx, name, migrationRounds); err != nil {
			return err
		}
	}
	if want["cni"] {
		if err := benchCNIAdd(ctx, name, pods); err != nil {
			return err
		}
		fmt.Println()
	}
	if want["running"] {
		if peerLab == "" {
			fmt.Println("pods to Running: not measured (--flannel-lab none: no peer cluster)")
			fmt.Println()
		} else if err := benchRunning(ctx, name, peerLab, runningPods); err != nil {
			return err
		}
	}
	if want["netpol"] {
		if err := benchNetpol(ctx, name, dur); err != nil {
			return err
		}
	}
	if want["failover"] {
		if err := benchFailover(ctx, name, bin, failoverRounds); err != nil {
			return err
		}
	}
	if want["load"] {
		if err := benchLoad(ctx, name, peerLab, lo); err != nil {
			return err
		}
	}
	if want["services"] {
		if err := benchServices(ctx, name, so); err != nil {
			return err
		}
	}
	// Last: a thousand nodes' worth of state would weigh on the others'
	// figures.
	if want["nodes"] {
		return benchNodes(ctx, name, no)
	}
	return nil
}

// labUp brings up lab name with lace-lab up args; down takes it down
// again, even when up failed half-way (it removes what exists).
func labUp(bin, name string, args ...string) (down func(), err error) {
	labBin := filepath.Join(bin, "lace-lab")
	down = func() {
		cmd := exec.Command(labBin, "down", "--name", name)
		cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
		_ = cmd.Run()
	}
	up := exec.Command(labBin, append([]string{"up", "--name", name}, args...)...)
	up.Stdout, up.Stderr = os.Stderr, os.Stderr
	if err := up.Run(); err != nil {
		return down, fmt.Errorf("lace-lab up %s: %w", name, err)
	}
	return down, nil
}

func kernel() string {
	b, _ := os.ReadFile("/proc/sys/kernel/osrelease")
	return strings.TrimSpace(string(b))
}

func cpus() int {
	b, _ := os.ReadFile("/proc/cpuinfo")
	return strings.Count(string(b), "processor\t:")
}

// Command bench measures Lace on a real lab beside peers measured in the
// same run, and prints tables with ratios (make bench; needs root):
//
//   - pod-to-pod TCP throughput and request/response latency, same node and
//     across nodes, beside a twin of the same namespaces and links (pod,
//     node, fabric bridge, node, pod) routed by the kernel without
//     encapsulation;
//   - CNI ADD latency p50/p99 over 100 pods, beside the reference bridge +
//     host-local plugins invoked the same way.
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
	"strings"
	"syscall"
	"time"
)

func main() {
	dur := flag.Duration("duration", 3*time.Second, fmt.Sprintf("length of each throughput and latency run (each path runs %d rounds)", rounds))
	pods := flag.Int("pods", 100, "pods for the CNI ADD latency run")
	bin := flag.String("bin", "bin", "directory of the Lace binaries")
	flag.Parse()
	// An interrupt cancels the run, so that the deferred cleanups (lab,
	// peer namespaces) still happen.
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := run(ctx, *bin, *dur, *pods)
	stop()
	if err != nil {
		fmt.Fprintln(os.Stderr, "bench:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, bin string, dur time.Duration, pods int) error {
	if os.Geteuid() != 0 {
		return fmt.Errorf("the benchmark needs root (network namespaces, eBPF)")
	}
	bin, _ = filepath.Abs(bin)
	suffix := make([]byte, 2)
	_, _ = rand.Read(suffix)
	name := "bench" + hex.EncodeToString(suffix)
	labBin := filepath.Join(bin, "lace-lab")
	up := exec.Command(labBin, "up", "--name", name, "--nodes", "2", "--zones", "1")
	up.Stdout, up.Stderr = os.Stderr, os.Stderr
	// Down even when up fails half-way; it removes what exists.
	defer func() {
		down := exec.Command(labBin, "down", "--name", name)
		down.Stdout, down.Stderr = os.Stderr, os.Stderr
		_ = down.Run()
	}()
	if err := up.Run(); err != nil {
		return fmt.Errorf("lace-lab up: %w", err)
	}
	fmt.Printf("Lace benchmark, %s, kernel %s, %d CPUs\n\n", time.Now().Format(time.RFC3339), kernel(), cpus())
	if err := benchForwarding(ctx, name, dur); err != nil {
		return err
	}
	return benchCNIAdd(ctx, name, pods)
}

func kernel() string {
	b, _ := os.ReadFile("/proc/sys/kernel/osrelease")
	return strings.TrimSpace(string(b))
}

func cpus() int {
	b, _ := os.ReadFile("/proc/cpuinfo")
	return strings.Count(string(b), "processor\t:")
}

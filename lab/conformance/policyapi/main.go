// Command policyapi builds and runs sig-network's network-policy-api
// conformance suite (sigs.k8s.io/network-policy-api/conformance,
// TestConformance: the standard profile, ClusterNetworkPolicy's core tests)
// against a lab, as `make conformance-policy-api` does.
//
//	go run ./lab/conformance/policyapi patch --module DIR --tools hack/tools/policy-api --out OUT
//
// copies the pinned module (DIR, in the module cache) into OUT/src and
// patches the copy for a kernel without SCTP (patch.go says what and why),
// then writes OUT/go.mod (the tools module's, with the module replaced by
// ./src), OUT/go.sum and OUT/deviation.json; `go test -c` in OUT builds the
// suite. Nothing of upstream is committed: the patch is made from the
// module's files at every build.
//
//	go run ./lab/conformance/policyapi run --test-bin BIN --deviation OUT/deviation.json \
//	    --image TAR [--lab npapi] [--keep] [--report-dir DIR]
//
// brings a two-node lab up without cluster DNS (the suite dials pod
// addresses only) unless it runs (it then stays up), loads the suite's
// agnhost image into every node, runs TestConformance (through go tool
// test2json), writes test.json, test.log, summary.txt and deviation.json
// into the report directory, prints the summary, takes down the lab it
// brought up (unless --keep, also on Ctrl-C) and exits non-zero when a test
// failed.
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"syscall"
	"time"

	"github.com/lace-cni/lace/lab/conformance/labrun"
)

func main() {
	if len(os.Args) < 2 {
		fmt.Fprintln(os.Stderr, "usage: policyapi patch|run [flags]")
		os.Exit(2)
	}
	switch os.Args[1] {
	case "patch":
		fs := flag.NewFlagSet("patch", flag.ExitOnError)
		mod := fs.String("module", "", "the pinned sigs.k8s.io/network-policy-api module's directory (go list -m -f '{{.Dir}}')")
		tools := fs.String("tools", "hack/tools/policy-api", "the tools module pinning it (its go.mod and go.sum)")
		out := fs.String("out", "bin/policy-api/build", "the build directory (emptied first)")
		fs.Parse(os.Args[2:])
		if *mod == "" {
			fmt.Fprintln(os.Stderr, "policyapi patch: --module is required")
			os.Exit(2)
		}
		d, err := Patch(*mod, *tools, *out)
		if err != nil {
			fmt.Fprintln(os.Stderr, "policyapi patch:", err)
			os.Exit(1)
		}
		fmt.Print(d.String())
	case "run":
		o := runOptions{}
		fs := flag.NewFlagSet("run", flag.ExitOnError)
		binDir := os.Getenv("LACE_BIN_DIR")
		if binDir == "" {
			binDir = "bin"
		}
		fs.StringVar(&o.lab, "lab", "npapi", "lab name; a lab that already runs is used and left up")
		fs.BoolVar(&o.keep, "keep", false, "leave the lab up when the run brought it up")
		fs.IntVar(&o.nodes, "nodes", 2, "nodes of the lab it brings up")
		fs.StringVar(&o.laceLab, "lace-lab", filepath.Join(binDir, "lace-lab"), "lace-lab binary")
		fs.StringVar(&o.testBin, "test-bin", filepath.Join(binDir, "policy-api", "conformance.test"), "the suite's test binary (make conformance-policy-api builds it)")
		fs.StringVar(&o.deviation, "deviation", filepath.Join(binDir, "policy-api", "build", "deviation.json"), "what the patch changed (policyapi patch writes it)")
		fs.StringVar(&o.image, "image", filepath.Join(binDir, "images", "policy-api-agnhost.tar"), "the suite's agnhost image (mkimages --policy-api)")
		fs.StringVar(&o.kubectl, "kubectl", "", "kubectl, to record the pods when a test fails (optional)")
		fs.StringVar(&o.goCmd, "go", "go", "the go command (go tool test2json)")
		fs.StringVar(&o.reportDir, "report-dir", filepath.Join(binDir, "policy-api", "report"), "where the reports go (emptied first)")
		fs.StringVar(&o.run, "run", "", "-test.run below TestConformance (e.g. CNPAdminTierGress); empty: every test")
		fs.DurationVar(&o.timeout, "timeout", time.Hour, "-test.timeout")
		fs.Parse(os.Args[2:])
		ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
		code, err := run(ctx, o, os.Stdout)
		stop()
		if err != nil {
			fmt.Fprintln(os.Stderr, "policyapi:", err)
			if code == 0 {
				code = 1
			}
		}
		os.Exit(code)
	default:
		fmt.Fprintf(os.Stderr, "policyapi: unknown command %q (patch or run)\n", os.Args[1])
		os.Exit(2)
	}
}

type runOptions struct {
	lab, laceLab, testBin, deviation, image string
	kubectl, goCmd, reportDir, run          string
	nodes                                   int
	timeout                                 time.Duration
	keep                                    bool
}

func run(ctx context.Context, o runOptions, out io.Writer) (int, error) {
	b, err := os.ReadFile(o.deviation)
	if err != nil {
		return 2, fmt.Errorf("%w (make conformance-policy-api writes it)", err)
	}
	var dev Deviation
	if err := json.Unmarshal(b, &dev); err != nil {
		return 2, fmt.Errorf("%s: %w", o.deviation, err)
	}
	for _, p := range []string{o.testBin, o.image, o.laceLab} {
		if _, err := os.Stat(p); err != nil {
			return 2, fmt.Errorf("%w (make conformance-policy-api builds it)", err)
		}
	}
	if err := os.RemoveAll(o.reportDir); err != nil {
		return 1, err
	}
	if err := os.MkdirAll(o.reportDir, 0o755); err != nil {
		return 1, err
	}
	if err := os.WriteFile(filepath.Join(o.reportDir, "deviation.json"), b, 0o644); err != nil {
		return 1, err
	}

	l := labrun.Lab{LaceLab: o.laceLab, Name: o.lab, Out: out}
	// No cluster DNS: the suite dials pod addresses and names nothing.
	kubeconfig, up, err := l.Ensure(ctx, "--nodes", fmt.Sprint(o.nodes), "--dns=false")
	if up && !o.keep {
		defer l.Down()
	}
	if err != nil {
		return 1, err
	}
	fmt.Fprintf(out, "loading %s into every node\n", filepath.Base(o.image))
	if err := l.Load(ctx, o.image); err != nil {
		return 1, err
	}

	events, err := os.Create(filepath.Join(o.reportDir, "test.json"))
	if err != nil {
		return 1, err
	}
	defer events.Close()
	logf, err := os.Create(filepath.Join(o.reportDir, "test.log"))
	if err != nil {
		return 1, err
	}
	defer logf.Close()
	runRE := "^TestConformance$"
	if o.run != "" {
		runRE += "/" + o.run
	}
	args := []string{"tool", "test2json", "-t", "-p", "sigs.k8s.io/network-policy-api/conformance", o.testBin,
		"-test.v=test2json", "-test.run=" + runRE, "-test.timeout=" + o.timeout.String()}
	fmt.Fprintf(out, "running TestConformance (%s; log: %s)\n", dev.Module, logf.Name())
	start := time.Now()
	c := exec.CommandContext(ctx, o.goCmd, args...)
	c.Env = append(os.Environ(), "KUBECONFIG="+kubeconfig)
	pr, pw := io.Pipe()
	c.Stdout, c.Stderr = pw, os.Stderr
	// An interrupt stops the test binary and test2json together.
	c.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	c.Cancel = func() error { return syscall.Kill(-c.Process.Pid, syscall.SIGTERM) }
	c.WaitDelay = 30 * time.Second
	res := make(chan *Results, 1)
	go func() { res <- ReadEvents(io.TeeReader(pr, events), io.MultiWriter(out, logf)) }()
	runErr := c.Run()
	pw.Close()
	r := <-res
	elapsed := time.Since(start)
	fmt.Fprintf(out, "TestConformance ran for %s\n\n", elapsed.Round(time.Second))

	sum, err := os.Create(filepath.Join(o.reportDir, "summary.txt"))
	if err != nil {
		return 1, err
	}
	defer sum.Close()
	failed := r.Summarize(io.MultiWriter(out, sum), dev, elapsed)
	fmt.Fprintf(out, "reports in %s\n", o.reportDir)
	if failed && o.kubectl != "" {
		recordPods(o.kubectl, kubeconfig, filepath.Join(o.reportDir, "pods.txt"))
	}
	if failed {
		return 1, nil
	}
	if runErr != nil {
		return 1, fmt.Errorf("the test binary: %w", runErr)
	}
	return 0, nil
}

// recordPods writes the cluster's pods (where each ran, its state) beside
// the reports, for a failed run.
func recordPods(kubectl, kubeconfig, path string) {
	c := exec.Command(kubectl, "--kubeconfig", kubeconfig, "get", "pods", "-A", "-o", "wide")
	b, err := c.CombinedOutput()
	if err != nil {
		b = append(b, []byte("\n"+err.Error()+"\n")...)
	}
	os.WriteFile(path, b, 0o644)
}

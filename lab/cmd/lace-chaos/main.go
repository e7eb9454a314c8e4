// Command lace-chaos runs the chaos harness (lab/chaos) on a lab: it
// brings the lab up when it does not run (and takes it down after, unless
// --keep), injects faults drawn from --seed for --duration while a
// workload runs, and exits non-zero with the seed and fault sequence when
// an invariant did not hold. `make chaos` runs it.
package main

import (
	"context"
	"flag"
	"fmt"
	"io/fs"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/lace-cni/lace/lab"
	"github.com/lace-cni/lace/lab/chaos"
	"github.com/lace-cni/lace/lab/conformance/labrun"
)

func main() {
	opts := chaos.Options{Lab: lab.DefaultConfig(), Out: os.Stdout}
	seed := flag.Uint64("seed", uint64(time.Now().UnixNano()), "seed of the fault sequence (a failure prints it)")
	flag.StringVar(&opts.Lab.Name, "name", "chaos", "lab to run on (brought up when it does not run)")
	flag.DurationVar(&opts.Duration, "duration", 10*time.Minute, "how long faults are injected")
	flag.DurationVar(&opts.Outage, "outage", 5*time.Minute, "how long the API server, and etcd, stay down")
	flag.IntVar(&opts.Burst, "burst", 300, "pods the burst fault creates and deletes")
	flag.StringVar(&opts.From, "from", chaos.DefaultFrom, "earlier revision the downgrade fault rolls back to (built from --repo)")
	flag.StringVar(&opts.Repo, "repo", ".", "git repository of Lace (the downgrade fault builds --from from it)")
	faults := flag.String("faults", "", "comma-separated fault kinds to draw from (default: all)")
	bin := flag.String("bin", "bin", "directory of lace-lab")
	keep := flag.Bool("keep", false, "keep a lab this run brought up")
	logsTo := flag.String("logs-to", "", "on failure, copy the lab's logs (its components' and Lace's) into this directory before the lab goes down")
	flag.Parse()
	opts.Seed = *seed
	if *faults != "" {
		opts.Faults = strings.Split(*faults, ",")
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	l := labrun.Lab{LaceLab: filepath.Join(*bin, "lace-lab"), Name: opts.Lab.Name, Out: os.Stdout}
	_, up, err := l.Ensure(ctx, "--dns=false")
	if up && !*keep {
		defer l.Down()
	}
	if err == nil {
		err = chaos.Run(ctx, opts)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "lace-chaos:", err)
		stop()
		if *logsTo != "" {
			saveLogs(filepath.Join(opts.Lab.StateDir(), "logs"), *logsTo)
		}
		if up && !*keep {
			l.Down()
		}
		os.Exit(1)
	}
}

// saveLogs copies the lab's logs into a new directory under dir: a failed
// run's lab goes down with them, and make test's run leaves nothing else
// to read. Nothing in dir is removed or overwritten.
func saveLogs(from, dir string) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		fmt.Fprintf(os.Stderr, "lace-chaos: directory for the lab's logs: %v\n", err)
		return
	}
	to, err := os.MkdirTemp(dir, "logs-")
	if err != nil {
		fmt.Fprintf(os.Stderr, "lace-chaos: directory for the lab's logs: %v\n", err)
		return
	}
	// A file that goes between the listing and its copy is left out, not
	// the rest: CopyFS stops at the first error.
	err = filepath.WalkDir(from, func(path string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() || !d.Type().IsRegular() {
			return nil
		}
		rel, _ := filepath.Rel(from, path)
		dst := filepath.Join(to, rel)
		if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
			return err
		}
		b, err := os.ReadFile(path)
		if err != nil {
			return nil
		}
		return os.WriteFile(dst, b, 0o644)
	})
	if err != nil {
		fmt.Fprintf(os.Stderr, "lace-chaos: copy the lab's logs to %s: %v\n", to, err)
		return
	}
	fmt.Fprintf(os.Stderr, "lace-chaos: the lab's logs are in %s\n", to)
}

// Command conformance runs the upstream Kubernetes e2e suite (e2e.test of
// the pinned release, `make conformance` builds it) against a lab: every
// [sig-network] describe that applies to a CNI and a kube-proxy
// replacement by default (DefaultFocus), minus the checked-in skip list
// (skip.txt: what the kernel, the lab or a cloud-less cluster cannot do).
//
// It brings a lab up with cluster DNS (or uses one that runs: it then
// leaves it up), loads the extra images e2e.test asks for (mkimages --e2e)
// into every node, checks that pods resolve names through cluster DNS and
// that the API server reaches pods (preflight.go), runs e2e.test serially,
// writes the reports (junit_01.xml, ginkgo/report.json, e2e.log,
// summary.txt) into --report-dir, prints one line per spec of the focus
// (passed, failed with its first failure line, skipped with the skip list's
// reason or the spec's own) and the totals, takes down the lab it brought
// up (unless --keep) and exits non-zero when a spec failed.
//
//	go run ./lab/conformance [--lab conf] [--keep] [--dry-run] [-- E2E_FLAGS...]
package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"syscall"
	"text/tabwriter"
	"time"

	"github.com/lace-cni/lace/lab/conformance/labrun"
)

// DefaultFocus is every [sig-network] describe that a CNI and a kube-proxy
// replacement answer for: Services, Conntrack, Networking (and its
// Granular Checks), dual-stack, Traffic Distribution and Topology Hints,
// HostPort, Proxy, EndpointSlice(Mirroring), DNS, Service endpoints
// latency, pod connectivity through termination, NoSNAT, Service CIDRs,
// NetworkPolicy (Netpol), and the Ingress/IngressClass/ServiceCIDR API
// specs of [Conformance]. Left out: LoadBalancers and ESIPP (a cloud's load balancer), KubeProxy and
// KubeProxyNFAcct and the kube-proxy migration (kube-proxy itself), the
// [Feature:PerformanceDNS] scale test, and IngressClass [Feature:Ingress]
// (an ingress controller's defaulting).
const DefaultFocus = `\[sig-network\] (Services|Conntrack|Networking|\[Feature:IPv6DualStack\]|Traffic Distribution|Topology Hints|HostPort|Proxy|EndpointSlice|DNS|Service endpoints latency|Connectivity Pod Lifecycle|NoSNAT|Service CIDRs|ServiceCIDR and IPAddress API|Ingress API|IngressClass API|Netpol)`

type options struct {
	lab, laceLab, e2eTest, kubectl, images string
	skipFile, focus, reportDir             string
	timeout                                time.Duration
	nodes, zones                           int
	keep, dryRun                           bool
	extra                                  []string
}

func main() {
	o := options{}
	env := func(k, def string) string {
		if v := os.Getenv(k); v != "" {
			return v
		}
		return def
	}
	home, _ := os.UserHomeDir()
	k8sBin := env("LACE_K8S_BIN", filepath.Join(home, ".cache", "lace", "k8s-v1.34.4"))
	binDir := env("LACE_BIN_DIR", "bin")
	flag.StringVar(&o.lab, "lab", env("LAB_NAME", "conf"), "lab name; a lab that already runs is used and left up")
	flag.BoolVar(&o.keep, "keep", false, "leave the lab up when the run brought it up")
	flag.StringVar(&o.laceLab, "lace-lab", filepath.Join(binDir, "lace-lab"), "lace-lab binary")
	flag.StringVar(&o.e2eTest, "e2e-test", filepath.Join(k8sBin, "e2e.test"), "upstream e2e.test (make conformance builds it)")
	flag.StringVar(&o.kubectl, "kubectl", filepath.Join(k8sBin, "kubectl"), "kubectl e2e.test execs into pods with")
	flag.StringVar(&o.images, "images", env("LACE_IMAGES", filepath.Join(binDir, "images")), "directory of the lab's image tarballs; every e2e-*.tar in it is loaded into the nodes")
	flag.StringVar(&o.skipFile, "skip-file", "lab/conformance/skip.txt", "skip list: one `REGEXP  # REASON` a line")
	flag.StringVar(&o.focus, "focus", DefaultFocus, "--ginkgo.focus")
	flag.StringVar(&o.reportDir, "report-dir", filepath.Join(binDir, "conformance"), "where the reports go (emptied first)")
	flag.IntVar(&o.nodes, "nodes", 6, "nodes of the lab it brings up; three Traffic Distribution specs skip themselves below 6 (two in each of 3 zones)")
	flag.IntVar(&o.zones, "zones", 3, "zones of the lab it brings up; the Traffic Distribution specs skip themselves below 3")
	flag.DurationVar(&o.timeout, "timeout", 3*time.Hour, "--ginkgo.timeout: the whole suite's limit")
	flag.BoolVar(&o.dryRun, "dry-run", false, "list what the focus and skip list select, without a lab")
	flag.Parse()
	o.extra = flag.Args()

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code, err := run(ctx, o, os.Stdout)
	stop()
	if err != nil {
		fmt.Fprintln(os.Stderr, "conformance:", err)
		if code == 0 {
			code = 1
		}
	}
	os.Exit(code)
}

func run(ctx context.Context, o options, out io.Writer) (int, error) {
	f, err := os.Open(o.skipFile)
	if err != nil {
		return 2, err
	}
	skips, err := ParseSkipList(f)
	f.Close()
	if err != nil {
		return 2, fmt.Errorf("%s: %w", o.skipFile, err)
	}
	focus, err := regexp.Compile(o.focus)
	if err != nil {
		return 2, fmt.Errorf("--focus: %w", err)
	}
	for _, p := range []string{o.e2eTest, o.kubectl} {
		if _, err := os.Stat(p); err != nil {
			return 2, fmt.Errorf("%w (make conformance builds it)", err)
		}
	}
	if err := os.RemoveAll(o.reportDir); err != nil {
		return 1, err
	}
	if err := os.MkdirAll(o.reportDir, 0o755); err != nil {
		return 1, err
	}
	args := []string{
		"--ginkgo.focus=" + o.focus,
		"--ginkgo.no-color",
		"--ginkgo.silence-skips",
		"--ginkgo.timeout=" + o.timeout.String(),
		"--report-dir=" + o.reportDir,
		"--report-complete-ginkgo",
		"--provider=local",
		"--kubectl-path=" + o.kubectl,
	}
	if re := SkipRegexp(skips); re != "" {
		args = append(args, "--ginkgo.skip="+re)
	}

	if o.dryRun {
		args = append(args, "--ginkgo.dry-run")
		if err := runE2E(ctx, o, append(args, o.extra...), io.Discard); err != nil {
			return 1, err
		}
		return summarize(o, focus, skips, out, true)
	}

	l := labrun.Lab{LaceLab: o.laceLab, Name: o.lab, Out: out}
	// Cluster DNS: the specs name Services (curl, nc, nslookup). Three
	// zones: Traffic Distribution needs them.
	kubeconfig, up, err := l.Ensure(ctx, "--dns", "--nodes", fmt.Sprint(o.nodes), "--zones", fmt.Sprint(o.zones))
	if up && !o.keep {
		defer l.Down()
	}
	if err != nil {
		return 1, err
	}
	if err := loadImages(ctx, l, o.images, out); err != nil {
		return 1, err
	}
	if err := preflight(ctx, o.kubectl, kubeconfig, out); err != nil {
		return 1, err
	}

	log, err := os.Create(filepath.Join(o.reportDir, "e2e.log"))
	if err != nil {
		return 1, err
	}
	defer log.Close()
	start := time.Now()
	fmt.Fprintf(out, "running e2e.test (focus %q, %d skip entries; log: %s)\n", o.focus, len(skips), log.Name())
	args = append(args, "--kubeconfig="+kubeconfig)
	runErr := runE2E(ctx, o, append(args, o.extra...), io.MultiWriter(out, log))
	fmt.Fprintf(out, "e2e.test ran for %s\n\n", time.Since(start).Round(time.Second))
	code, err := summarize(o, focus, skips, out, false)
	if err != nil {
		if runErr != nil {
			return 1, fmt.Errorf("e2e.test: %v; %w", runErr, err)
		}
		return 1, err
	}
	if code == 0 && runErr != nil {
		// Every spec passed but the suite did not (a ReportAfterSuite or
		// the timeout): say so rather than hide it.
		return 1, fmt.Errorf("e2e.test: %w", runErr)
	}
	return code, nil
}

// loadImages imports every e2e-*.tar of images into every node of l.
func loadImages(ctx context.Context, l labrun.Lab, images string, out io.Writer) error {
	tars, _ := filepath.Glob(filepath.Join(images, "e2e-*.tar"))
	if len(tars) == 0 {
		return fmt.Errorf("no e2e-*.tar in %s: run go run ./lab/mkimages --e2e --out %s --agnhost AGNHOST", images, images)
	}
	for _, t := range tars {
		fmt.Fprintf(out, "loading %s into every node\n", filepath.Base(t))
		if err := l.Load(ctx, t); err != nil {
			return err
		}
	}
	return nil
}

// runE2E runs e2e.test with args; an interrupt reaches it as SIGINT, so
// that Ginkgo runs the specs' cleanup and writes its reports.
func runE2E(ctx context.Context, o options, args []string, w io.Writer) error {
	c := exec.CommandContext(ctx, o.e2eTest, args...)
	c.Stdout, c.Stderr = w, w
	c.Cancel = func() error { return c.Process.Signal(os.Interrupt) }
	c.WaitDelay = 2 * time.Minute
	return c.Run()
}

// SkipEntry is one line of the skip list.
type SkipEntry struct {
	Re     *regexp.Regexp
	Reason string
	Line   int
}

// ParseSkipList reads `REGEXP  # REASON` lines; blank lines and lines
// starting with # are comments. Every entry needs a reason.
func ParseSkipList(r io.Reader) ([]SkipEntry, error) {
	var out []SkipEntry
	sc := bufio.NewScanner(r)
	n := 0
	for sc.Scan() {
		n++
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		re, reason, ok := strings.Cut(line, " # ")
		re, reason = strings.TrimSpace(re), strings.TrimSpace(reason)
		if !ok || re == "" || reason == "" {
			return nil, fmt.Errorf("line %d: want `REGEXP  # REASON`", n)
		}
		c, err := regexp.Compile(re)
		if err != nil {
			return nil, fmt.Errorf("line %d: %w", n, err)
		}
		out = append(out, SkipEntry{Re: c, Reason: reason, Line: n})
	}
	return out, sc.Err()
}

// SkipRegexp joins the entries into one --ginkgo.skip.
func SkipRegexp(skips []SkipEntry) string {
	parts := make([]string, len(skips))
	for i, s := range skips {
		parts[i] = "(?:" + s.Re.String() + ")"
	}
	return strings.Join(parts, "|")
}

// The parts of Ginkgo's JSON report (types.Report) the summary reads.
type report struct {
	SuiteSucceeded bool
	SpecReports    []specReport
}

type specReport struct {
	ContainerHierarchyTexts []string
	LeafNodeText            string
	LeafNodeType            string
	State                   string
	RunTime                 time.Duration
	Failure                 struct {
		Message  string
		Location struct {
			FileName   string
			LineNumber int
		}
	}
}

func (s specReport) text() string {
	return strings.TrimSpace(strings.Join(append(append([]string{}, s.ContainerHierarchyTexts...), s.LeafNodeText), " "))
}

// Result is one spec's outcome in the summary.
type Result struct {
	Name    string
	Outcome string // passed, failed, skipped
	Detail  string // why it failed or was skipped
	RunTime time.Duration
}

// Classify turns the report into one result per spec of the focus, and one
// per suite-level node that failed; a spec the skip list matches carries
// its reason.
func Classify(rep report, focus *regexp.Regexp, skips []SkipEntry) []Result {
	var out []Result
	for _, s := range rep.SpecReports {
		name := s.text()
		if s.LeafNodeType != "It" {
			if failed(s.State) {
				out = append(out, Result{Name: "[" + s.LeafNodeType + "]", Outcome: "failed", Detail: firstLine(s.Failure.Message), RunTime: s.RunTime})
			}
			continue
		}
		if !focus.MatchString(name) {
			continue
		}
		r := Result{Name: name, RunTime: s.RunTime}
		switch {
		case s.State == "passed":
			r.Outcome = "passed"
		case failed(s.State):
			r.Outcome = "failed"
			r.Detail = firstLine(s.Failure.Message)
			if loc := s.Failure.Location; loc.FileName != "" {
				r.Detail += fmt.Sprintf(" (%s:%d)", trimModule(loc.FileName), loc.LineNumber)
			}
		default: // skipped, pending
			r.Outcome = "skipped"
			r.Detail = firstLine(s.Failure.Message)
			for _, e := range skips {
				if e.Re.MatchString(name) {
					r.Detail = "skip list: " + e.Reason
					break
				}
			}
			if r.Detail == "" {
				r.Detail = s.State
			}
		}
		out = append(out, r)
	}
	sort.SliceStable(out, func(i, j int) bool {
		if out[i].Outcome != out[j].Outcome {
			return rank(out[i].Outcome) < rank(out[j].Outcome)
		}
		return out[i].Name < out[j].Name
	})
	return out
}

func failed(state string) bool {
	switch state {
	case "failed", "panicked", "timedout", "interrupted", "aborted":
		return true
	}
	return false
}

func rank(outcome string) int {
	return map[string]int{"failed": 0, "passed": 1, "skipped": 2}[outcome]
}

func firstLine(s string) string {
	s = strings.TrimSpace(s)
	if i := strings.IndexByte(s, '\n'); i >= 0 {
		s = s[:i]
	}
	if len(s) > 200 {
		s = s[:200] + "..."
	}
	return s
}

// trimModule shortens a file of the module cache to its package path.
func trimModule(f string) string {
	const mod = "k8s.io/kubernetes@"
	if i := strings.Index(f, mod); i >= 0 {
		if rest := f[i+len(mod):]; strings.Contains(rest, "/") {
			return rest[strings.IndexByte(rest, '/')+1:]
		}
	}
	return f
}

// summarize reads the JSON report, prints the table and the totals, writes
// them to summary.txt and returns 1 when a spec (or the suite) failed.
func summarize(o options, focus *regexp.Regexp, skips []SkipEntry, out io.Writer, dryRun bool) (int, error) {
	b, err := os.ReadFile(filepath.Join(o.reportDir, "ginkgo", "report.json"))
	if err != nil {
		return 1, fmt.Errorf("no report: %w", err)
	}
	var reps []report
	if err := json.Unmarshal(b, &reps); err != nil {
		return 1, fmt.Errorf("report.json: %w", err)
	}
	if len(reps) != 1 {
		return 1, fmt.Errorf("report.json holds %d reports, want 1", len(reps))
	}
	results := Classify(reps[0], focus, skips)
	sum, err := os.Create(filepath.Join(o.reportDir, "summary.txt"))
	if err != nil {
		return 1, err
	}
	defer sum.Close()
	w := io.MultiWriter(out, sum)
	tw := tabwriter.NewWriter(w, 0, 8, 2, ' ', 0)
	counts := map[string]int{}
	prefix := "[sig-network] "
	for _, r := range results {
		counts[r.Outcome]++
		outcome := r.Outcome
		if dryRun && outcome == "passed" {
			outcome = "would run"
		}
		rt := ""
		if r.RunTime > 0 {
			rt = r.RunTime.Round(time.Second).String()
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\n", outcome, rt, strings.TrimPrefix(r.Name, prefix), r.Detail)
	}
	tw.Flush()
	fmt.Fprintf(w, "\n%d specs match the focus %q; reports in %s\n", len(results), o.focus, o.reportDir)
	if dryRun {
		fmt.Fprintf(w, "dry run: %d would run, %d skipped\n", counts["passed"], counts["skipped"])
		return 0, nil
	}
	fmt.Fprintf(w, "%d passed, %d failed, %d skipped\n", counts["passed"], counts["failed"], counts["skipped"])
	if counts["failed"] > 0 || !reps[0].SuiteSucceeded {
		if counts["failed"] == 0 {
			return 1, errors.New("the suite failed outside any spec: see e2e.log")
		}
		return 1, nil
	}
	return 0, nil
}

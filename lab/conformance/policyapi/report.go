package main

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"slices"
	"strings"
	"text/tabwriter"
	"time"
)

// event is one line of go tool test2json.
type event struct {
	Action  string
	Test    string
	Output  string
	Elapsed float64
}

// TestResult is one test or subtest of the run.
type TestResult struct {
	Name    string
	Action  string // pass, fail, skip; empty when it never ended
	Elapsed time.Duration
	Output  []string
}

// Results are a run's tests in the order they started.
type Results struct {
	Tests map[string]*TestResult
	Order []string
	// Package is the binary's own end (pass or fail) and output outside
	// any test (a panic, the timeout).
	Package string
	Output  []string
}

// ReadEvents reads test2json's events from r until it ends, writing every
// output line to log as it comes.
func ReadEvents(r io.Reader, log io.Writer) *Results {
	res := &Results{Tests: map[string]*TestResult{}}
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 1<<20), 16<<20)
	for sc.Scan() {
		var e event
		if err := json.Unmarshal(sc.Bytes(), &e); err != nil {
			fmt.Fprintln(log, sc.Text()) // not an event: say it as it is
			continue
		}
		if e.Action == "output" {
			io.WriteString(log, e.Output)
		}
		if e.Test == "" {
			switch e.Action {
			case "pass", "fail":
				res.Package = e.Action
			case "output":
				res.Output = append(res.Output, strings.TrimRight(e.Output, "\n"))
			}
			continue
		}
		t := res.Tests[e.Test]
		if t == nil {
			t = &TestResult{Name: e.Test}
			res.Tests[e.Test] = t
			res.Order = append(res.Order, e.Test)
		}
		switch e.Action {
		case "output":
			t.Output = append(t.Output, strings.TrimRight(e.Output, "\n"))
		case "pass", "fail", "skip":
			t.Action = e.Action
			t.Elapsed = time.Duration(e.Elapsed * float64(time.Second))
		}
	}
	io.Copy(io.Discard, r) // let the writer finish whatever happens
	return res
}

const root = "TestConformance"

// Row is one test of the suite in the summary.
type Row struct {
	Name    string
	Outcome string // passed, failed, skipped
	Detail  string
	Elapsed time.Duration
	Sub     map[string]int // subtests by outcome
	// Failures are the failed subtests' (or the test's own) output.
	Failures []string
}

// Rows classifies the suite's tests (TestConformance's children): a test
// that passed without running because SkipTests names it is skipped, as
// is one that skipped itself (a feature outside the standard profile).
func (r *Results) Rows(dev Deviation) []Row {
	var rows []Row
	for _, name := range r.Order {
		short, ok := strings.CutPrefix(name, root+"/")
		if !ok || strings.Contains(short, "/") {
			continue
		}
		t := r.Tests[name]
		row := Row{Name: short, Elapsed: t.Elapsed, Sub: map[string]int{}}
		for _, sub := range r.Order {
			if !strings.HasPrefix(sub, name+"/") {
				continue
			}
			st := r.Tests[sub]
			row.Sub[outcome(st.Action)]++
			if st.Action != "pass" && st.Action != "skip" && !hasChild(r, sub) {
				row.Failures = append(row.Failures, "--- "+strings.TrimPrefix(sub, name+"/"))
				row.Failures = append(row.Failures, failureLines(st.Output)...)
			}
		}
		switch {
		case t.Action == "skip":
			row.Outcome = "skipped"
			row.Detail = skipLine(t.Output)
			if slices.Contains(dev.Experimental, short) {
				row.Detail = "outside the standard profile: " + row.Detail
			}
		case t.Action == "pass" && slices.Contains(dev.SkippedTests, short) && len(row.Sub) == 0:
			row.Outcome = "skipped"
			row.Detail = "SkipTests: every probe is SCTP (no SCTP in this kernel)"
		case t.Action == "pass":
			row.Outcome = "passed"
		default:
			row.Outcome = "failed"
			if len(row.Failures) == 0 {
				row.Failures = failureLines(t.Output)
			}
			if t.Action == "" {
				row.Detail = "did not end (timeout or interrupt)"
			}
		}
		rows = append(rows, row)
	}
	return rows
}

func hasChild(r *Results, name string) bool {
	for _, n := range r.Order {
		if strings.HasPrefix(n, name+"/") {
			return true
		}
	}
	return false
}

func outcome(action string) string {
	switch action {
	case "pass":
		return "passed"
	case "skip":
		return "skipped"
	}
	return "failed"
}

// skipLine is the line a test skipped itself with.
func skipLine(out []string) string {
	for _, l := range out {
		if i := strings.Index(l, "Skipping "); i >= 0 {
			return strings.TrimSpace(l[i:])
		}
	}
	return "skipped"
}

// failureLines are a failed test's own output: its log (the probes that
// failed, testify's Error Trace with file:line), without the runner's
// === and --- lines; at most 60.
func failureLines(out []string) []string {
	var lines []string
	for _, l := range out {
		t := strings.TrimSpace(l)
		if t == "" || strings.HasPrefix(t, "=== ") || strings.HasPrefix(t, "--- ") {
			continue
		}
		lines = append(lines, "    "+t)
	}
	if len(lines) > 60 {
		lines = append(lines[:60], fmt.Sprintf("    ... %d more lines in test.log", len(lines)-60))
	}
	return lines
}

// Summarize writes one line per test, the failures' output, the totals
// and the deviation; it returns true when the run failed.
func (r *Results) Summarize(w io.Writer, dev Deviation, elapsed time.Duration) bool {
	rows := r.Rows(dev)
	tw := tabwriter.NewWriter(w, 0, 8, 2, ' ', 0)
	count := map[string]int{}
	sub := map[string]int{}
	standard, experimental := 0, 0
	for _, row := range rows {
		subs := ""
		if n := row.Sub["passed"] + row.Sub["failed"] + row.Sub["skipped"]; n > 0 {
			subs = fmt.Sprintf("%d/%d subtests passed", row.Sub["passed"], n)
		}
		rt := ""
		if row.Elapsed > 0 {
			rt = row.Elapsed.Round(time.Second).String()
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\n", row.Outcome, rt, row.Name, subs, row.Detail)
		if slices.Contains(dev.Experimental, row.Name) {
			experimental++
			continue
		}
		standard++
		count[row.Outcome]++
		for k, v := range row.Sub {
			sub[k] += v
		}
	}
	tw.Flush()
	failed := false
	for _, row := range rows {
		if row.Outcome != "failed" {
			continue
		}
		failed = true
		fmt.Fprintf(w, "\nFAILED %s %s\n", row.Name, row.Detail)
		for _, l := range row.Failures {
			fmt.Fprintln(w, l)
		}
	}
	top := r.Tests[root]
	switch {
	case top == nil:
		failed = true
		fmt.Fprintln(w, "\nTestConformance did not run")
		for _, l := range failureLines(r.Output) {
			fmt.Fprintln(w, l)
		}
	case top.Action != "pass" && len(rows) == 0:
		// Failed before any test: the suite's setup (base manifests,
		// pods Ready).
		failed = true
		fmt.Fprintln(w, "\nFAILED TestConformance (setup)")
		for _, l := range failureLines(top.Output) {
			fmt.Fprintln(w, l)
		}
	case top.Action != "pass":
		failed = true
	}
	if r.Package != "pass" && !failed {
		failed = true
		fmt.Fprintln(w, "\nthe test binary failed outside any test:")
		for _, l := range failureLines(r.Output) {
			fmt.Fprintln(w, l)
		}
	}
	fmt.Fprintf(w, "\nstandard profile: %d tests, %d passed, %d failed, %d skipped; subtests: %d passed, %d failed, %d skipped\n",
		standard, count["passed"], count["failed"], count["skipped"], sub["passed"], sub["failed"], sub["skipped"])
	fmt.Fprintf(w, "outside the profile (experimental features, skipped themselves): %d tests\n", experimental)
	result := "PASS"
	if failed {
		result = "FAIL"
	}
	fmt.Fprintf(w, "TestConformance: %s in %s\n", result, elapsed.Round(time.Second))
	fmt.Fprint(w, dev.String())
	return failed
}

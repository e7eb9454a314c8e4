package main

import (
	"bytes"
	"encoding/json"
	"reflect"
	"strings"
	"testing"
	"time"
)

// The inputs below are written for these tests, in the shape of the suite's
// files (no upstream file is copied).

const manifest = `apiVersion: v1
kind: Namespace
metadata:
  name: ns-a
---
apiVersion: apps/v1
kind: StatefulSet
metadata:
  name: web
  namespace: ns-a
spec:
  template:
    spec:
      containers:
        - name: web-client
          image: agnhost
        - name: web-9003
          image: agnhost
          command: ["/bin/bash", "-c", "/agnhost porter"]
          env:
          - name: SERVE_SCTP_PORT_9003
            value: "foo"

        - name: web-80
          image: agnhost
          ports:
            - containerPort: 80
      volumes:
        - name: SERVE_SCTP_PORT_is_not_a_container
---
apiVersion: apps/v1
kind: StatefulSet
metadata:
  name: host
spec:
  template:
    spec:
      hostNetwork: true
      containers:
        - name: host-{{ index .HostNetworkPorts 0 }}
          image: agnhost
          ports:
            - containerPort: {{ index .HostNetworkPorts 0 }}
        - name: host-{{ index .HostNetworkPorts 6 }}
          image: agnhost
          env:
          - name: SERVE_SCTP_PORT_{{ index .HostNetworkPorts 6 }}
            value: "foo"
`

func TestRemoveSCTPContainers(t *testing.T) {
	out, removed := RemoveSCTPContainers([]byte(manifest))
	want := []RemovedContainer{{Object: "web", Container: "web-9003"}, {Object: "host", Container: "host-{{ index .HostNetworkPorts 6 }}"}}
	if !reflect.DeepEqual(removed, want) {
		t.Errorf("removed %+v, want %+v", removed, want)
	}
	s := string(out)
	for _, gone := range []string{"web-9003", "SERVE_SCTP_PORT_9003", "/agnhost porter", "HostNetworkPorts 6"} {
		if strings.Contains(s, gone) {
			t.Errorf("%q left:\n%s", gone, s)
		}
	}
	// Everything else stays, byte for byte: the other containers, the
	// volume (no container) whose name says SCTP, the blank line.
	for _, kept := range []string{"        - name: web-client\n          image: agnhost\n\n        - name: web-80\n",
		"        - name: SERVE_SCTP_PORT_is_not_a_container\n", "containerPort: {{ index .HostNetworkPorts 0 }}\n", "  name: ns-a\n"} {
		if !strings.Contains(s, kept) {
			t.Errorf("%q lost:\n%s", kept, s)
		}
	}
	if n := strings.Count(manifest, "\n") - strings.Count(s, "\n"); n != 11 {
		t.Errorf("%d lines removed, want 11", n)
	}
}

const testsFile = `package tests

import (
	"testing"

	"example/kubernetes"
	"example/suite"
)

var Mixed = suite.ConformanceTest{
	ShortName: "Mixed",
	Features:  []suite.SupportedFeature{suite.SupportStd},
	Test: func(t *testing.T, s *suite.ConformanceTestSuite) {
		t.Run("a", func(t *testing.T) {
			kubernetes.PokeServer(t, nil, nil, "ns", "pod-0", "tcp",
				"10.0.0.1", int32(80), s.TimeoutConfig, true)
			// the SCTP probe
			kubernetes.PokeServer(t, nil, nil, "ns", "pod-0", "sctp",
				"10.0.0.1", int32(9003), s.TimeoutConfig, true)
			kubernetes.PokeServer(t, nil, nil, "ns", "pod-1", "udp", "10.0.0.1", int32(53), s.TimeoutConfig, false)
		})
	},
}

var OnlySCTP = suite.ConformanceTest{
	ShortName: "OnlySCTP",
	Features:  []suite.SupportedFeature{suite.SupportStd},
	Test: func(t *testing.T, s *suite.ConformanceTestSuite) {
		kubernetes.PokeServer(t, nil, nil, "ns", "pod-0", "sctp", "10.0.0.1", int32(9003), s.TimeoutConfig, true)
	},
}

var Experimental = suite.ConformanceTest{
	ShortName: "Experimental",
	Features:  []suite.SupportedFeature{suite.SupportStd, suite.SupportNamedPorts},
	Test: func(t *testing.T, s *suite.ConformanceTestSuite) {
		kubernetes.PokeServer(t, nil, nil, "ns", "pod-0", "tcp", "10.0.0.1", int32(80), s.TimeoutConfig, true)
		kubernetes.PokeServer(t, nil, nil, "ns", "pod-0", "sctp", "10.0.0.1", int32(9003), s.TimeoutConfig, true)
	},
}
`

func TestPatchTests(t *testing.T) {
	out, tests, err := PatchTests([]byte(testsFile), []string{"SupportStd"})
	if err != nil {
		t.Fatal(err)
	}
	want := []TestInfo{
		{Name: "Mixed", Standard: true, Probes: map[string]int{"tcp": 1, "udp": 1, "sctp": 1}, Removed: 1},
		{Name: "OnlySCTP", Standard: true, Probes: map[string]int{"sctp": 1}, SCTPOnly: true},
		{Name: "Experimental", Probes: map[string]int{"tcp": 1, "sctp": 1}},
	}
	if !reflect.DeepEqual(tests, want) {
		t.Errorf("tests %+v\nwant %+v", tests, want)
	}
	s := string(out)
	// Lines stay where they were (failures keep upstream's file:line).
	if a, b := strings.Count(testsFile, "\n"), strings.Count(s, "\n"); a != b {
		t.Errorf("%d lines, want %d", b, a)
	}
	for _, l := range []string{
		"\t\t\t// lace (no SCTP in this kernel): kubernetes.PokeServer(t, nil, nil, \"ns\", \"pod-0\", \"sctp\",\n",
		"\t\t\t\t// lace (no SCTP in this kernel): \"10.0.0.1\", int32(9003), s.TimeoutConfig, true)\n",
	} {
		if !strings.Contains(s, l) {
			t.Errorf("no %q in\n%s", l, s)
		}
	}
	// Only Mixed's SCTP probe goes: OnlySCTP is skipped whole, Experimental
	// is outside the profile.
	if n := strings.Count(s, probeCommentPrefix); n != 2 {
		t.Errorf("%d commented lines, want 2", n)
	}
	if _, _, err := PatchTests([]byte(strings.Replace(testsFile, `"udp"`, `proto`, 1)), []string{"SupportStd"}); err == nil {
		t.Error("a protocol that is no literal was accepted")
	}
}

func TestStandardFeatures(t *testing.T) {
	src := "package suite\n\nvar StandardFeatures = sets.New(\n\tSupportA,\n)\n\nvar Other = sets.New(SupportB)\n"
	got, err := StandardFeatures([]byte(src))
	if err != nil || !reflect.DeepEqual(got, []string{"SupportA"}) {
		t.Errorf("got %v, %v", got, err)
	}
}

func TestAddSkipTests(t *testing.T) {
	src := `package conformance_test

func TestConformance(t *testing.T) {
	cSuite := suite.New(suite.Options{
		Client: c,
		Debug:  true,
	})
	cSuite.Run(t, nil)
}

func other() { _ = suite.Options{} }
`
	out, err := AddSkipTests([]byte(src), "laceSkipTests")
	if err != nil {
		t.Fatal(err)
	}
	want := strings.Replace(src, "\t})\n\tcSuite.Run", "\tSkipTests: laceSkipTests, })\n\tcSuite.Run", 1)
	if string(out) != want {
		t.Errorf("got\n%s\nwant\n%s", out, want)
	}
	if _, err := AddSkipTests(out, "x"); err == nil {
		t.Error("SkipTests set twice")
	}
	f := string(SkipTestsFile([]string{"A", "B"}))
	if !strings.Contains(f, "var laceSkipTests = []string{\n\t\"A\",\n\t\"B\",\n}\n") || !strings.HasPrefix(f, "// Code generated") {
		t.Errorf("skip file:\n%s", f)
	}
}

func events(evs ...event) []byte {
	var b bytes.Buffer
	for _, e := range evs {
		j, _ := json.Marshal(e)
		b.Write(append(j, '\n'))
	}
	return b.Bytes()
}

func TestSummarize(t *testing.T) {
	dev := Deviation{Module: "m@v1", SkippedTests: []string{"S"}, Experimental: []string{"E"},
		Probes: map[string]map[string]int{"P": {"tcp": 2}}, RemovedProbes: map[string]int{"P": 1}}
	in := events(
		event{Action: "run", Test: "TestConformance"},
		event{Action: "run", Test: "TestConformance/P"},
		event{Action: "run", Test: "TestConformance/P/a"},
		event{Action: "pass", Test: "TestConformance/P/a", Elapsed: 1},
		event{Action: "run", Test: "TestConformance/P/b"},
		event{Action: "output", Test: "TestConformance/P/b", Output: "    helper.go:70: \n"},
		event{Action: "output", Test: "TestConformance/P/b", Output: "        \tError Trace:\tx-rules.go:52\n"},
		event{Action: "fail", Test: "TestConformance/P/b", Elapsed: 10},
		event{Action: "fail", Test: "TestConformance/P", Elapsed: 11},
		event{Action: "run", Test: "TestConformance/S"},
		event{Action: "output", Test: "TestConformance/S", Output: "    suite.go:1: Skipping S\n"},
		event{Action: "pass", Test: "TestConformance/S"},
		event{Action: "run", Test: "TestConformance/E"},
		event{Action: "output", Test: "TestConformance/E", Output: "    suite.go:2: Skipping E: suite does not support X\n"},
		event{Action: "skip", Test: "TestConformance/E"},
		event{Action: "run", Test: "TestConformance/Q"},
		event{Action: "pass", Test: "TestConformance/Q", Elapsed: 2},
		event{Action: "fail", Test: "TestConformance", Elapsed: 13},
		event{Action: "fail"},
	)
	var log, sum bytes.Buffer
	r := ReadEvents(bytes.NewReader(in), &log)
	if !strings.Contains(log.String(), "Error Trace:\tx-rules.go:52") {
		t.Errorf("log:\n%s", log.String())
	}
	if !r.Summarize(&sum, dev, 13*time.Second) {
		t.Error("a failed run summarized as passed")
	}
	s := sum.String()
	for _, want := range []string{
		"standard profile: 3 tests, 1 passed, 1 failed, 1 skipped; subtests: 1 passed, 1 failed, 0 skipped",
		"outside the profile (experimental features, skipped themselves): 1 tests",
		"FAILED P", "--- b", "Error Trace:\tx-rules.go:52", "SkipTests: every probe is SCTP",
		"outside the standard profile: Skipping E: suite does not support X", "TestConformance: FAIL in 13s",
	} {
		if !strings.Contains(s, want) {
			t.Errorf("no %q in\n%s", want, s)
		}
	}

	// Setup failing: no test ran.
	r = ReadEvents(bytes.NewReader(events(
		event{Action: "run", Test: "TestConformance"},
		event{Action: "output", Test: "TestConformance", Output: "    helper.go:140: pods not ready\n"},
		event{Action: "fail", Test: "TestConformance"},
		event{Action: "fail"},
	)), &log)
	sum.Reset()
	if !r.Summarize(&sum, dev, time.Second) || !strings.Contains(sum.String(), "FAILED TestConformance (setup)\n    helper.go:140: pods not ready") {
		t.Errorf("setup failure:\n%s", sum.String())
	}
}

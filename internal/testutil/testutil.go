// Package testutil holds helpers shared by the test tiers. It is imported
// only from tests.
package testutil

import (
	"os"
	"testing"
	"time"
)

// Eventually polls f every interval until it returns nil, and fails the
// test with f's last error (naming what was awaited) after timeout.
func Eventually(t testing.TB, timeout, interval time.Duration, what string, f func() error) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	var err error
	for time.Now().Before(deadline) {
		if err = f(); err == nil {
			return
		}
		time.Sleep(interval)
	}
	t.Fatalf("%s: not reached within %s: %v", what, timeout, err)
}

// SkipUnit skips, under -short (make unit), a test that needs more than a
// unit test may assume: root, a control plane (etcd and kube-apiserver) or
// a lab; needs names what. make test runs without -short, so it runs them.
func SkipUnit(t testing.TB, needs string) {
	t.Helper()
	if testing.Short() {
		t.Skipf("needs %s: not a unit test (-short, make unit); make test runs it", needs)
	}
}

// NeedRoot skips a test that needs root (needs says for what) under -short
// and where the tests do not run as root, and fails it in CI, where being
// root is the point.
func NeedRoot(t testing.TB, needs string) {
	t.Helper()
	SkipUnit(t, "root ("+needs+")")
	if os.Geteuid() != 0 {
		if os.Getenv("CI") != "" {
			t.Fatalf("needs root (%s)", needs)
		}
		t.Skipf("needs root (%s)", needs)
	}
}

package netutil

import (
	"crypto/rand"
	"encoding/hex"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/lace-cni/lace/internal/testutil"
)

// TestCaptureStopsWhenFDoesNotReturn: f ending its goroutine (a test's
// t.Fatal) still stops the reader. One left behind spun on the closed
// socket for the rest of the run and took a core from the tests after.
func TestCaptureStopsWhenFDoesNotReturn(t *testing.T) {
	name := testNS(t, "lcap")

	before := runtime.NumGoroutine()
	var wg sync.WaitGroup
	var ran atomic.Bool
	wg.Add(1)
	go func() {
		defer wg.Done()
		_, _ = Capture(Path(name), "lo", func() { ran.Store(true); runtime.Goexit() })
	}()
	wg.Wait()
	if !ran.Load() {
		t.Fatal("the capture did not start (f never ran)")
	}
	deadline := time.Now().Add(5 * time.Second)
	for runtime.NumGoroutine() > before {
		if time.Now().After(deadline) {
			buf := make([]byte, 1<<16)
			t.Fatalf("%d goroutines after the capture, %d before: its reader is still running\n%s",
				runtime.NumGoroutine(), before, buf[:runtime.Stack(buf, true)])
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// testNS makes a named network namespace of the test's own (prefix and a
// random suffix), removed at the end, and returns its name.
func testNS(t *testing.T, prefix string) string {
	t.Helper()
	testutil.NeedRoot(t, "network namespaces")
	b := make([]byte, 3)
	_, _ = rand.Read(b)
	name := prefix + hex.EncodeToString(b)
	if err := CreateNamed(name); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = DeleteNamed(name) })
	return name
}

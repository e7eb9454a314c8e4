package cniapi

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// The queue holds at most MaxQueuedDels DELs: the next one is refused
// with ErrQueueFull (lace-cni turns it into "try again later"), while a
// container already queued can still be queued again.
func TestDelQueueIsBounded(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "del-queue")
	for i := range MaxQueuedDels {
		if err := QueueDel(dir, Request{Command: "DEL", ContainerID: fmt.Sprintf("c%05d", i)}); err != nil {
			t.Fatalf("queue DEL %d: %v", i, err)
		}
	}
	err := QueueDel(dir, Request{Command: "DEL", ContainerID: "one-too-many"})
	if !errors.Is(err, ErrQueueFull) {
		t.Fatalf("DEL %d: %v, want ErrQueueFull", MaxQueuedDels+1, err)
	}
	if _, err := os.Stat(filepath.Join(dir, "one-too-many")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the refused DEL was written: %v", err)
	}
	if err := QueueDel(dir, Request{Command: "DEL", ContainerID: "c00007", NetNS: "/again"}); err != nil {
		t.Errorf("re-queueing a queued container: %v", err)
	}
	if n, err := QueueLen(dir); err != nil || n != MaxQueuedDels {
		t.Errorf("QueueLen %d %v, want %d", n, err, MaxQueuedDels)
	}
	q, err := QueuedDels(dir)
	if err != nil || len(q) != MaxQueuedDels {
		t.Fatalf("QueuedDels: %d %v", len(q), err)
	}
	// Replaying one makes room for the next.
	if err := q[0].Done(); err != nil {
		t.Fatal(err)
	}
	if err := QueueDel(dir, Request{Command: "DEL", ContainerID: "one-too-many"}); err != nil {
		t.Errorf("after a replay: %v", err)
	}
}

// A queued file past MaxQueuedDelBytes is dropped, not read whole.
func TestQueuedDelsDropOversizedFiles(t *testing.T) {
	dir := t.TempDir()
	big := `{"command":"DEL","containerID":"big","args":{"x":"` + strings.Repeat("x", MaxQueuedDelBytes) + `"}}`
	if err := os.WriteFile(filepath.Join(dir, "big"), []byte(big), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := QueueDel(dir, Request{Command: "DEL", ContainerID: "ok"}); err != nil {
		t.Fatal(err)
	}
	q, err := QueuedDels(dir)
	if err != nil || len(q) != 1 || q[0].Request.ContainerID != "ok" {
		t.Fatalf("QueuedDels %+v %v, want only ok", q, err)
	}
	if _, err := os.Stat(filepath.Join(dir, "big")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("oversized entry kept: %v", err)
	}
}

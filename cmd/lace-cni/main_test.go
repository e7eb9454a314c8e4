package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/containernetworking/cni/pkg/skel"
	"github.com/containernetworking/cni/pkg/types"

	"github.com/lace-cni/lace/pkg/cniapi"
)

// TestDelWithoutAgentIsQueued: a DEL the agent cannot be reached for is
// queued on the node for the agent to replay (and succeeds); one that
// cannot even be queued fails, so the runtime retries it; other commands
// fail with try-again-later.
func TestDelWithoutAgentIsQueued(t *testing.T) {
	dir := t.TempDir()
	conf := func(queue string) []byte {
		b, _ := json.Marshal(cniapi.NetConf{CNIVersion: "1.0.0", Name: "lace", Type: "lace",
			AgentSocket: filepath.Join(dir, "no-agent.sock"), DelQueueDir: queue})
		return b
	}
	queue := filepath.Join(dir, "del-queue")
	args := &skel.CmdArgs{ContainerID: "0123abcd", Netns: "/run/netns/x", IfName: "eth0",
		Args: "K8S_POD_NAMESPACE=default;K8S_POD_NAME=p1", StdinData: conf(queue)}
	if err := call("DEL", args, false); err != nil {
		t.Fatalf("DEL without an agent: %v", err)
	}
	q, err := cniapi.QueuedDels(queue)
	if err != nil || len(q) != 1 || q[0].Request.ContainerID != "0123abcd" || q[0].Request.Args["K8S_POD_NAME"] != "p1" {
		t.Fatalf("queue: %+v %v", q, err)
	}

	// A queue that cannot be written: the DEL fails.
	blocker := filepath.Join(dir, "file")
	if err := os.WriteFile(blocker, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	args.StdinData = conf(filepath.Join(blocker, "queue"))
	var ce *types.Error
	if err := call("DEL", args, false); !errors.As(err, &ce) || ce.Code != types.ErrTryAgainLater {
		t.Errorf("DEL that cannot be queued: %v, want try again later", err)
	}
	args.StdinData = conf(queue)
	if err := call("ADD", args, false); !errors.As(err, &ce) || ce.Code != types.ErrTryAgainLater {
		t.Errorf("ADD without an agent: %v", err)
	}
}

// TestDelWithFullQueueIsRetried: past cniapi.MaxQueuedDels queued DELs, a
// DEL for a new container fails with try-again-later (the runtime retries
// it) instead of growing the queue.
func TestDelWithFullQueueIsRetried(t *testing.T) {
	dir := t.TempDir()
	queue := filepath.Join(dir, "del-queue")
	if err := os.MkdirAll(queue, 0o700); err != nil {
		t.Fatal(err)
	}
	for i := range cniapi.MaxQueuedDels {
		// Plain files stand for queued DELs: only their count matters here.
		if err := os.WriteFile(filepath.Join(queue, fmt.Sprintf("c%05d", i)), []byte("{}"), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	conf, _ := json.Marshal(cniapi.NetConf{CNIVersion: "1.0.0", Name: "lace", Type: "lace",
		AgentSocket: filepath.Join(dir, "no-agent.sock"), DelQueueDir: queue})
	args := &skel.CmdArgs{ContainerID: "0123abcd", Netns: "/run/netns/x", IfName: "eth0", StdinData: conf}
	var ce *types.Error
	if err := call("DEL", args, false); !errors.As(err, &ce) || ce.Code != types.ErrTryAgainLater ||
		!strings.Contains(ce.Details, "DEL queue is full") {
		t.Fatalf("DEL with a full queue: %v, want try again later naming the full queue", err)
	}
	if _, err := os.Stat(filepath.Join(queue, "0123abcd")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the refused DEL was queued: %v", err)
	}
}

package main

import (
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
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

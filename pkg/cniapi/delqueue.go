package cniapi

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"sort"

	"github.com/lace-cni/lace/internal/fsutil"
)

// DefaultDelQueueDir is where lace-cni queues a DEL it could not deliver
// (the agent's state directory on the node, a hostPath of the agent).
const DefaultDelQueueDir = "/var/lib/lace/del-queue"

// containerIDRe is the CNI spec's container ID: it is also the file name
// of a queued DEL, so nothing else may pass.
var containerIDRe = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9_.\-]*$`)

// QueueDel records a DEL the agent could not be asked for, as one file per
// container in dir, durably (written to a temp file, synced, renamed, the
// directory synced): the agent replays it when it is back. Queueing the
// same container again replaces its file.
func QueueDel(dir string, req Request) error {
	if !containerIDRe.MatchString(req.ContainerID) {
		return fmt.Errorf("container ID %q is not a valid CNI container ID", req.ContainerID)
	}
	req.PluginPID = 0 // meaningless once this process is gone
	b, err := json.Marshal(req)
	if err != nil {
		return err
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return fmt.Errorf("create %s: %w", dir, err)
	}
	return fsutil.WriteAtomic(filepath.Join(dir, req.ContainerID), 0o600, func(w io.Writer) error {
		_, err := w.Write(b)
		return err
	})
}

// QueuedDel is one DEL waiting in the queue; Done removes it.
type QueuedDel struct {
	Request Request
	path    string
}

// Done removes the queued DEL; one already removed is fine.
func (q QueuedDel) Done() error {
	if err := os.Remove(q.path); err != nil && !errors.Is(err, os.ErrNotExist) {
		return err
	}
	return nil
}

// QueuedDels lists the DELs waiting in dir (none when dir does not
// exist), oldest name first. A file that does not parse is removed: it
// cannot be replayed, and the agent also collects endpoints whose pod or
// interface is gone.
func QueuedDels(dir string) ([]QueuedDel, error) {
	ents, err := os.ReadDir(dir)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	var out []QueuedDel
	for _, e := range ents {
		if !e.Type().IsRegular() || !containerIDRe.MatchString(e.Name()) {
			continue // temp files being written
		}
		p := filepath.Join(dir, e.Name())
		b, err := os.ReadFile(p)
		if err != nil {
			continue
		}
		var req Request
		if json.Unmarshal(b, &req) != nil || req.ContainerID != e.Name() || req.Command != "DEL" {
			_ = os.Remove(p)
			continue
		}
		out = append(out, QueuedDel{Request: req, path: p})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].path < out[j].path })
	return out, nil
}

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

// MaxQueuedDels bounds the DEL queue. A node runs at most a few hundred
// pods; past this many DELs waiting for an agent that is gone, one more
// file helps nobody and the next ones would only fill the agent's state
// disk. At the bound QueueDel refuses with ErrQueueFull, lace-cni fails
// the DEL with "try again later", and the runtime retries it: the pod's
// deletion waits for the agent, as it would with no queue at all.
const MaxQueuedDels = 1024

// MaxQueuedDelBytes bounds one queued DEL as read back: what lace-cni
// writes is a CNI request of a few kilobytes (MaxRequestBytes bounds what
// the agent accepts over its socket).
const MaxQueuedDelBytes = MaxRequestBytes

// ErrQueueFull is QueueDel's refusal at MaxQueuedDels.
var ErrQueueFull = errors.New("DEL queue is full")

// containerIDRe is the CNI spec's container ID: it is also the file name
// of a queued DEL, so nothing else may pass.
var containerIDRe = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9_.\-]*$`)

// ValidContainerID tells whether id is a container ID as the CNI spec
// allows it (what skel lets through to lace-cni).
func ValidContainerID(id string) bool { return containerIDRe.MatchString(id) }

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
	if len(b) > MaxQueuedDelBytes {
		return fmt.Errorf("DEL request of %d bytes is over the queue's limit of %d", len(b), MaxQueuedDelBytes)
	}
	// Replacing a container's own entry never grows the queue.
	if _, err := os.Lstat(filepath.Join(dir, req.ContainerID)); errors.Is(err, os.ErrNotExist) {
		n, err := queueLen(dir)
		if err != nil {
			return err
		}
		if n >= MaxQueuedDels {
			return fmt.Errorf("%w: %d DELs wait in %s for the agent", ErrQueueFull, n, dir)
		}
	}
	return fsutil.WriteAtomic(filepath.Join(dir, req.ContainerID), 0o600, func(w io.Writer) error {
		_, err := w.Write(b)
		return err
	})
}

// queueLen counts the queued DELs in dir (temp files being written
// aside).
func queueLen(dir string) (int, error) {
	ents, err := os.ReadDir(dir)
	if err != nil {
		return 0, fmt.Errorf("read %s: %w", dir, err)
	}
	n := 0
	for _, e := range ents {
		if e.Type().IsRegular() && containerIDRe.MatchString(e.Name()) {
			n++
		}
	}
	return n, nil
}

// QueueLen is how many DELs wait in dir (0 when dir does not exist).
func QueueLen(dir string) (int, error) {
	n, err := queueLen(dir)
	if errors.Is(err, os.ErrNotExist) {
		return 0, nil
	}
	return n, err
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
		if len(out) == MaxQueuedDels {
			break // the rest on a later round
		}
		p := filepath.Join(dir, e.Name())
		b, err := readLimited(p, MaxQueuedDelBytes)
		if err != nil && !errors.Is(err, errTooLarge) {
			continue
		}
		var req Request
		if err != nil || json.Unmarshal(b, &req) != nil || req.ContainerID != e.Name() || req.Command != "DEL" {
			_ = os.Remove(p)
			continue
		}
		out = append(out, QueuedDel{Request: req, path: p})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].path < out[j].path })
	return out, nil
}

var errTooLarge = errors.New("file too large")

// readLimited reads path, or fails with errTooLarge past limit bytes.
func readLimited(path string, limit int) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, int64(limit)+1))
	if err != nil {
		return nil, err
	}
	if len(b) > limit {
		return nil, errTooLarge
	}
	return b, nil
}

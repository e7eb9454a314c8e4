package chaos

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/lace-cni/lace/lab"
)

// Lace's own logs over the run: the kubelet removes a container's log
// with its pod (a rolling restart, an upgrade), so the harness copies
// each Lace container's log from the nodes' disks as it is written, and
// a failure prints what the agents said about the VIPs in its window. The
// files are read on the machine, not through the API server, which the
// faults take away.

// logCopyEvery is how often the logs are copied: a deleted pod's last
// lines are kept unless it is removed within this.
const logCopyEvery = time.Second

// logCopier appends each Lace container log file of the lab's nodes to a
// file of the same name under dir.
type logCopier struct {
	cfg lab.Config
	dir string
	mu  sync.Mutex
	// offsets are how far each source file was copied.
	offsets map[string]int64
}

// copyLogs copies until ctx ends, then once more.
func (h *harness) copyLogs(ctx context.Context, wg *sync.WaitGroup) (*logCopier, error) {
	dir := filepath.Join(h.cfg.StateDir(), "logs", "chaos")
	// An earlier run's copies on this lab would be copied again.
	if err := os.RemoveAll(dir); err != nil {
		return nil, fmt.Errorf("directory for Lace's logs: %w", err)
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, fmt.Errorf("directory for Lace's logs: %w", err)
	}
	c := &logCopier{cfg: h.cfg, dir: dir, offsets: map[string]int64{}}
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			c.copyOnce()
			select {
			case <-ctx.Done():
				c.copyOnce()
				return
			case <-time.After(logCopyEvery):
			}
		}
	}()
	return c, nil
}

// vipLines copies what the logs gained now, then returns vipLog's lines.
func (c *logCopier) vipLines(from, to time.Time) []string {
	c.copyOnce()
	return vipLog(c.dir, from, to)
}

func (c *logCopier) copyOnce() {
	c.mu.Lock()
	defer c.mu.Unlock()
	for i := 1; i <= c.cfg.Nodes; i++ {
		root := filepath.Join(c.cfg.NodeRoot(c.cfg.NodeName(i)), "var/log/pods")
		files, _ := filepath.Glob(filepath.Join(root, lab.ReleaseNamespace+"_lace-*", "*", "*.log"))
		for _, f := range files {
			// <ns>_<pod>_<uid>/<container>/<restarts>.log
			rel, _ := filepath.Rel(root, f)
			parts := strings.Split(rel, string(filepath.Separator))
			pod := strings.SplitN(parts[0], "_", 3)
			if len(pod) < 3 || len(parts) != 3 {
				continue
			}
			c.copyFile(f, filepath.Join(c.dir, pod[1]+"."+parts[1]+".log"))
		}
	}
}

// copyFile appends what src gained since the last copy to dst (best
// effort: a file removed meanwhile loses its tail).
func (c *logCopier) copyFile(src, dst string) {
	in, err := os.Open(src)
	if err != nil {
		return
	}
	defer in.Close()
	if st, err := in.Stat(); err == nil && st.Size() < c.offsets[src] {
		c.offsets[src] = 0 // rotated: a new file under the name
	}
	if _, err := in.Seek(c.offsets[src], io.SeekStart); err != nil {
		return
	}
	out, err := os.OpenFile(dst, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return
	}
	defer out.Close()
	n, _ := io.Copy(out, in)
	c.offsets[src] += n
}

// announceLine is what the agents log about the VIPs and their Leases.
var announceLine = regexp.MustCompile(`(?i)announc|lease|cache's view|API server (un)?reachable|restart grace`)

// maxVIPLines bounds what a failure prints of the agents' logs;
// maxMoveLines what it prints again around each move no fault explains.
const (
	maxVIPLines  = 80
	maxMoveLines = 16
)

// vipLog returns the agents' lines about the VIPs written between from
// and to, oldest first, each after the pod's name (at most maxVIPLines,
// the last ones).
func vipLog(dir string, from, to time.Time) []string {
	files, _ := filepath.Glob(filepath.Join(dir, "lace-agent-*.log"))
	type line struct {
		at   time.Time
		text string
	}
	var lines []line
	for _, f := range files {
		pod := strings.SplitN(filepath.Base(f), ".", 2)[0]
		fh, err := os.Open(f)
		if err != nil {
			continue
		}
		sc := bufio.NewScanner(fh)
		sc.Buffer(make([]byte, 64*1024), 1024*1024)
		for sc.Scan() {
			// CRI log lines: <RFC 3339 time> <stream> <tag> <text>.
			fields := strings.SplitN(sc.Text(), " ", 4)
			if len(fields) < 4 {
				continue
			}
			at, err := time.Parse(time.RFC3339Nano, fields[0])
			if err != nil || at.Before(from) || at.After(to) || !announceLine.MatchString(fields[3]) {
				continue
			}
			lines = append(lines, line{at, pod + " " + fields[3]})
		}
		fh.Close()
	}
	slices.SortStableFunc(lines, func(a, b line) int { return a.at.Compare(b.at) })
	if len(lines) > maxVIPLines {
		lines = lines[len(lines)-maxVIPLines:]
	}
	out := make([]string, len(lines))
	for i, l := range lines {
		out[i] = l.text
	}
	return out
}

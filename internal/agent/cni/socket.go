package cni

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"syscall"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/lace-cni/lace/pkg/cniapi"
)

// The CNI socket creates and deletes pod networks on the node: whoever can
// connect to it can attach any network namespace to any network the node
// serves. Only root (the container runtime running lace-cni, and the
// agent) may reach it: the socket is 0600 in a directory of mode 0700
// owned by root.

// listenCNI listens on the unix socket at sock. The directory is made (or
// made again) 0700 before the socket exists, so in the moment between
// bind, which creates the socket with the process's umask, and the
// chmod to 0600 nobody but root can reach it; no process-wide umask is
// touched while other goroutines create files.
func listenCNI(sock string) (net.Listener, error) {
	dir := filepath.Dir(sock)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("create %s: %w", dir, err)
	}
	// The kubelet creates the hostPath directory 0755; a directory that is
	// not ours (a symlink, someone else's) is refused, not reused.
	fi, err := os.Lstat(dir)
	if err != nil {
		return nil, err
	}
	st, ok := fi.Sys().(*syscall.Stat_t)
	if !fi.IsDir() || !ok || int(st.Uid) != os.Geteuid() {
		return nil, fmt.Errorf("%s is not a directory owned by uid %d", dir, os.Geteuid())
	}
	if err := os.Chmod(dir, 0o700); err != nil {
		return nil, fmt.Errorf("restrict %s: %w", dir, err)
	}
	_ = os.Remove(sock)
	ln, err := net.Listen("unix", sock)
	if err != nil {
		return nil, fmt.Errorf("listen on %s: %w", sock, err)
	}
	if err := os.Chmod(sock, 0o600); err != nil {
		ln.Close()
		return nil, fmt.Errorf("restrict %s: %w", sock, err)
	}
	return ln, nil
}

// decodeCNIRequest reads one request of at most cniapi.MaxRequestBytes.
// The body is the request and nothing else: one followed by more (a
// second request, junk) is refused, not served in part.
func decodeCNIRequest(w http.ResponseWriter, r *http.Request, req *cniapi.Request) error {
	r.Body = http.MaxBytesReader(w, r.Body, cniapi.MaxRequestBytes)
	dec := json.NewDecoder(r.Body)
	err := dec.Decode(req)
	if err == nil {
		var tail json.RawMessage
		switch extra := dec.Decode(&tail); {
		case errors.Is(extra, io.EOF):
		case errors.As(extra, new(*http.MaxBytesError)):
			err = extra
		default:
			err = errors.New("data after the request")
		}
	}
	if err != nil {
		var tooBig *http.MaxBytesError
		if errors.As(err, &tooBig) {
			return fmt.Errorf("request larger than the limit of %d bytes", tooBig.Limit)
		}
		return fmt.Errorf("decode request: %w", err)
	}
	return nil
}

// DelQueueGauge reports the DELs waiting in dir, counted at scrape time;
// at cniapi.MaxQueuedDels lace-cni refuses new ones.
func DelQueueGauge(dir string) prometheus.Collector {
	return prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "lace_agent_cni_del_queue_length",
		Help: fmt.Sprintf("DELs lace-cni queued while the agent was unreachable, not replayed yet (refused past %d).", cniapi.MaxQueuedDels)},
		func() float64 {
			n, err := cniapi.QueueLen(dir)
			if err != nil {
				return -1
			}
			return float64(n)
		})
}

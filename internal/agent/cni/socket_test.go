package cni

import (
	"bytes"
	"context"
	"encoding/json"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/lace-cni/lace/internal/testutil"
	"github.com/lace-cni/lace/pkg/cniapi"
)

// serveTestCNI runs a's CNI server on a socket under a directory the
// kubelet made 0755 (a hostPath DirectoryOrCreate), and returns a client.
func serveTestCNI(t *testing.T, a *Server) (string, *http.Client) {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "run-lace")
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	a.opts.CNISocket = filepath.Join(dir, "cni.sock")
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- a.Serve(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Serve: %v", err)
		}
	})
	c := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, "unix", a.opts.CNISocket)
		}}}
	testutil.Eventually(t, 5*time.Second, 20*time.Millisecond, "CNI socket up", func() error {
		conn, err := net.Dial("unix", a.opts.CNISocket)
		if err == nil {
			conn.Close()
		}
		return err
	})
	return dir, c
}

// Only root reaches the socket: 0600 in a 0700 directory, even when the
// directory existed with a wider mode.
func TestCNISocketIsRootOnly(t *testing.T) {
	a := newTestAgent(t, 29)
	dir, _ := serveTestCNI(t, a.Server)
	for path, want := range map[string]os.FileMode{dir: 0o700, a.opts.CNISocket: 0o600} {
		fi, err := os.Stat(path)
		if err != nil {
			t.Fatal(err)
		}
		if got := fi.Mode().Perm(); got != want {
			t.Errorf("%s has mode %#o, want %#o", path, got, want)
		}
	}
}

// A directory that is a symlink (to wherever) is refused, not followed.
func TestCNISocketRefusesASymlinkedDir(t *testing.T) {
	tmp := t.TempDir()
	if err := os.Symlink(t.TempDir(), filepath.Join(tmp, "run-lace")); err != nil {
		t.Fatal(err)
	}
	ln, err := listenCNI(filepath.Join(tmp, "run-lace", "cni.sock"))
	if err == nil {
		ln.Close()
		t.Fatal("listened under a symlinked directory")
	}
}

func postCNI(t *testing.T, c *http.Client, body []byte) cniapi.Response {
	t.Helper()
	resp, err := c.Post("http://lace-agent/cni", "application/json", bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var out cniapi.Response
	if err := json.NewDecoder(resp.Body).Decode(&out); err != nil {
		t.Fatal(err)
	}
	return out
}

// A request past cniapi.MaxRequestBytes is refused with a CNI error that
// says so, without being read to its end; one just under it is served.
func TestCNIRequestSizeIsBounded(t *testing.T) {
	a := newTestAgent(t, 29)
	a.sync.applied = true
	_, c := serveTestCNI(t, a.Server)
	req := func(pad int) []byte {
		b, err := json.Marshal(cniapi.Request{Command: "CHECK", ContainerID: "c1",
			Args: map[string]string{"PAD": strings.Repeat("x", pad)}})
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	small := req(cniapi.MaxRequestBytes - 200)
	if len(small) > cniapi.MaxRequestBytes {
		t.Fatalf("test request of %d bytes", len(small))
	}
	if out := postCNI(t, c, small); out.Error != nil && strings.Contains(out.Error.Msg, "limit") {
		t.Errorf("a request of %d bytes was refused: %+v", len(small), out.Error)
	}
	out := postCNI(t, c, req(cniapi.MaxRequestBytes+1))
	if out.Error == nil || out.Error.Code != errInvalidConfig || !strings.Contains(out.Error.Msg, "larger than the limit") {
		t.Errorf("oversized request answered %+v, want a refusal naming the limit", out.Error)
	}
}

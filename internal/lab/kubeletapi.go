package lab

import (
	"bufio"
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"time"

	"k8s.io/apimachinery/pkg/types"
	remotecommandconsts "k8s.io/apimachinery/pkg/util/remotecommand"
	"k8s.io/client-go/tools/remotecommand"
	"k8s.io/kubelet/pkg/cri/streaming/portforward"
	streamremote "k8s.io/kubelet/pkg/cri/streaming/remotecommand"
	utilexec "k8s.io/utils/exec"

	"github.com/lace-cni/lace/internal/netutil"
)

// kubeletAPI serves the part of the kubelet API the API server proxies to:
// exec, container logs and port-forward. It listens on loopback only and
// accepts only clients with a certificate from the lab CA (the API server).
func (k *kubelet) serveAPI(ctx context.Context, certFile, keyFile, caFile string) error {
	ca, err := os.ReadFile(caFile)
	if err != nil {
		return fmt.Errorf("read lab CA: %w", err)
	}
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(ca)
	cert, err := tls.LoadX509KeyPair(certFile, keyFile)
	if err != nil {
		return fmt.Errorf("load kubelet serving certificate: %w", err)
	}
	mux := http.NewServeMux()
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) { _, _ = io.WriteString(w, "ok") })
	mux.HandleFunc("/exec/{ns}/{pod}/{container}", k.handleExec)
	mux.HandleFunc("/exec/{ns}/{pod}/{uid}/{container}", k.handleExec)
	mux.HandleFunc("/containerLogs/{ns}/{pod}/{container}", k.handleLogs)
	mux.HandleFunc("/portForward/{ns}/{pod}", k.handlePortForward)
	mux.HandleFunc("/portForward/{ns}/{pod}/{uid}", k.handlePortForward)
	srv := &http.Server{
		Handler:           mux,
		ReadHeaderTimeout: 30 * time.Second,
		TLSConfig: &tls.Config{
			Certificates: []tls.Certificate{cert},
			ClientCAs:    pool,
			ClientAuth:   tls.RequireAndVerifyClientCert,
			MinVersion:   tls.VersionTLS12,
		},
	}
	ln, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", k.apiPort))
	if err != nil {
		return fmt.Errorf("listen for kubelet API of %s: %w", k.node, err)
	}
	go func() {
		<-ctx.Done()
		_ = srv.Close()
	}()
	go func() {
		if err := srv.ServeTLS(ln, "", ""); err != nil && !errors.Is(err, http.ErrServerClosed) {
			k.log.Error("kubelet API stopped", "err", err)
		}
	}()
	return nil
}

func (k *kubelet) handleExec(w http.ResponseWriter, r *http.Request) {
	p, err := k.lookup(r.PathValue("ns"), r.PathValue("pod"), types.UID(r.PathValue("uid")))
	if err != nil {
		http.Error(w, err.Error(), http.StatusNotFound)
		return
	}
	ctr := r.PathValue("container")
	if p.containerByName(ctr) == nil {
		http.Error(w, fmt.Sprintf("container %s not found in pod %s", ctr, p.key()), http.StatusNotFound)
		return
	}
	opts, err := streamremote.NewOptions(r)
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	cmd := r.URL.Query()["command"]
	streamremote.ServeExec(w, r, podExecutor{p}, p.key(), types.UID(p.uid), ctr, cmd, opts,
		4*time.Hour, 30*time.Second, remotecommandconsts.SupportedStreamingProtocols)
}

// podExecutor runs exec commands in the pod's network namespace with the
// lab's binaries first on PATH.
type podExecutor struct{ p *pod }

func (e podExecutor) ExecInContainer(ctx context.Context, _ string, _ types.UID, container string, cmd []string,
	in io.Reader, out, errw io.WriteCloser, _ bool, _ <-chan remotecommand.TerminalSize, timeout time.Duration) error {
	if len(cmd) == 0 {
		return errors.New("no command")
	}
	c := e.p.containerByName(container)
	if c == nil {
		return fmt.Errorf("container %s not found", container)
	}
	if timeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, timeout)
		defer cancel()
	}
	argv := e.p.enter(cmd)
	x := exec.CommandContext(ctx, argv[0], argv[1:]...)
	x.Env = processEnv(e.p.k, e.p.snapshot(), &c.spec)
	x.Dir = e.p.dir
	x.Stdin = in
	x.Stdout, x.Stderr = out, errw
	if out == nil {
		x.Stdout = io.Discard
	}
	if errw == nil {
		x.Stderr = io.Discard
	}
	err := x.Run()
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		return utilexec.CodeExitError{Err: err, Code: ee.ExitCode()}
	}
	return err
}

func (k *kubelet) handleLogs(w http.ResponseWriter, r *http.Request) {
	p, err := k.lookup(r.PathValue("ns"), r.PathValue("pod"), "")
	if err != nil {
		http.Error(w, err.Error(), http.StatusNotFound)
		return
	}
	c := p.containerByName(r.PathValue("container"))
	if c == nil {
		http.Error(w, "container not found", http.StatusNotFound)
		return
	}
	q := r.URL.Query()
	f, err := os.Open(c.logPath)
	if err != nil {
		if os.IsNotExist(err) {
			return // started, nothing written yet
		}
		http.Error(w, err.Error(), http.StatusInternalServerError)
		return
	}
	defer f.Close()
	if n, err := strconv.Atoi(q.Get("tailLines")); err == nil && n >= 0 {
		if err := seekTail(f, n); err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
	}
	w.Header().Set("Content-Type", "text/plain")
	if _, err := io.Copy(w, f); err != nil {
		return
	}
	if q.Get("follow") != "true" {
		return
	}
	flusher, _ := w.(http.Flusher)
	rd := bufio.NewReader(f)
	for {
		if flusher != nil {
			flusher.Flush()
		}
		select {
		case <-r.Context().Done():
			return
		case <-time.After(200 * time.Millisecond):
		}
		if _, err := io.Copy(w, rd); err != nil {
			return
		}
		if k.podByKey(p.key()) != p {
			return
		}
	}
}

// seekTail positions f at the start of its last n lines.
func seekTail(f *os.File, n int) error {
	b, err := io.ReadAll(f)
	if err != nil {
		return err
	}
	lines := strings.SplitAfter(string(b), "\n")
	if len(lines) > 0 && lines[len(lines)-1] == "" {
		lines = lines[:len(lines)-1]
	}
	skip := 0
	if len(lines) > n {
		for _, l := range lines[:len(lines)-n] {
			skip += len(l)
		}
	}
	_, err = f.Seek(int64(skip), io.SeekStart)
	return err
}

func (k *kubelet) handlePortForward(w http.ResponseWriter, r *http.Request) {
	p, err := k.lookup(r.PathValue("ns"), r.PathValue("pod"), types.UID(r.PathValue("uid")))
	if err != nil {
		http.Error(w, err.Error(), http.StatusNotFound)
		return
	}
	opts, err := portforward.NewV4Options(r)
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	portforward.ServePortForward(w, r, podForwarder{p}, p.key(), types.UID(p.uid), opts,
		4*time.Hour, 30*time.Second, portforward.SupportedProtocols)
}

// podForwarder connects to a port of the pod from inside its namespace.
type podForwarder struct{ p *pod }

func (f podForwarder) PortForward(ctx context.Context, _ string, _ types.UID, port int32, stream io.ReadWriteCloser) error {
	defer stream.Close()
	conn, err := netutil.DialContext(ctx, netutil.Path(f.p.netns), "tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(int(port))))
	if err != nil {
		return fmt.Errorf("connect to port %d of %s: %w", port, f.p.key(), err)
	}
	defer conn.Close()
	done := make(chan struct{}, 2)
	go func() { _, _ = io.Copy(conn, stream); done <- struct{}{} }()
	go func() { _, _ = io.Copy(stream, conn); done <- struct{}{} }()
	<-done
	return nil
}

package lab

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"os"
	"strconv"
	"sync"
	"time"

	"github.com/lace-cni/lace/internal/netutil"
)

// The API server runs on the machine's loopback; nodes and pods reach it
// where a cluster's API server sits, on the fabric, through a relay that
// listens in the fabric namespace. The API server reaches kubelets the
// other way, through its egress selector: HTTP CONNECT over a unix socket
// to a proxy that dials from the fabric namespace. Neither adds anything to
// the machine's network namespace.

// relayAPIServer accepts connections on port in the fabric namespace (both
// families) and splices each to the API server on loopback.
func relayAPIServer(ctx context.Context, c Config, port int, log *slog.Logger) error {
	ln, err := netutil.Listen(netutil.Path(c.NetNS("fabric")), "tcp", ":"+strconv.Itoa(port))
	if err != nil {
		return fmt.Errorf("API server relay: %w", err)
	}
	target := net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
	go func() {
		<-ctx.Done()
		ln.Close()
	}()
	go func() {
		for {
			in, err := ln.Accept()
			if err != nil {
				if ctx.Err() == nil {
					log.Error("API server relay stopped", "err", err)
				}
				return
			}
			go func() {
				var d net.Dialer
				out, err := d.DialContext(ctx, "tcp", target)
				if err != nil {
					in.Close()
					return
				}
				splice(in, out)
			}()
		}
	}()
	return nil
}

// serveEgress serves the API server's egress selector: CONNECT to a host
// on the fabric, dialled from the fabric namespace. Only fabric addresses
// are allowed, so the API server cannot be turned into a way out.
func serveEgress(ctx context.Context, c Config, log *slog.Logger) error {
	sock := c.EgressSocket()
	_ = os.Remove(sock)
	ln, err := net.Listen("unix", sock)
	if err != nil {
		return fmt.Errorf("egress proxy: %w", err)
	}
	fabric := netutil.Path(c.NetNS("fabric"))
	srv := &http.Server{ReadHeaderTimeout: 10 * time.Second, Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodConnect {
			http.Error(w, "CONNECT only", http.StatusMethodNotAllowed)
			return
		}
		host, _, err := net.SplitHostPort(r.Host)
		a, perr := netip.ParseAddr(host)
		if err != nil || perr != nil || !(UnderlayV4.Contains(a.Unmap()) || UnderlayV6.Contains(a)) {
			http.Error(w, "destination "+r.Host+" is not on the lab fabric", http.StatusForbidden)
			return
		}
		dctx, cancel := context.WithTimeout(r.Context(), 10*time.Second)
		out, err := netutil.DialContext(dctx, fabric, "tcp", r.Host)
		cancel()
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadGateway)
			return
		}
		hj, ok := w.(http.Hijacker)
		if !ok {
			out.Close()
			http.Error(w, "no hijacking", http.StatusInternalServerError)
			return
		}
		in, buf, err := hj.Hijack()
		if err != nil {
			out.Close()
			return
		}
		if _, err := in.Write([]byte("HTTP/1.1 200 Connection established\r\n\r\n")); err != nil {
			in.Close()
			out.Close()
			return
		}
		splice(&bufferedConn{Conn: in, r: buf.Reader}, out)
	})}
	go func() {
		<-ctx.Done()
		srv.Close()
	}()
	go func() {
		if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			log.Error("egress proxy stopped", "err", err)
		}
	}()
	return nil
}

// egressConfig is the API server's EgressSelectorConfiguration: traffic
// to the cluster (kubelets) goes through the lab's proxy.
func egressConfig(sock string) string {
	return fmt.Sprintf(`apiVersion: apiserver.k8s.io/v1beta1
kind: EgressSelectorConfiguration
egressSelections:
- name: cluster
  connection:
    proxyProtocol: HTTPConnect
    transport:
      uds:
        udsName: %s
`, sock)
}

type bufferedConn struct {
	net.Conn
	r *bufio.Reader
}

func (b *bufferedConn) Read(p []byte) (int, error) { return b.r.Read(p) }

// splice copies both ways, passing a half-close on where the connection
// allows it, and closes both once both directions have ended.
func splice(a, b net.Conn) {
	var wg sync.WaitGroup
	wg.Add(2)
	pipe := func(dst, src net.Conn) {
		defer wg.Done()
		_, _ = io.Copy(dst, src)
		if cw, ok := unwrap(dst).(interface{ CloseWrite() error }); ok {
			_ = cw.CloseWrite()
		} else {
			dst.Close()
		}
	}
	go pipe(a, b)
	go pipe(b, a)
	wg.Wait()
	a.Close()
	b.Close()
}

func unwrap(c net.Conn) net.Conn {
	if b, ok := c.(*bufferedConn); ok {
		return b.Conn
	}
	return c
}

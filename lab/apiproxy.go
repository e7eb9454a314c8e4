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
// on the fabric (a kubelet), dialled from the fabric namespace, or to a pod
// (the pods/proxy and services/proxy subresources, which dial an endpoint's
// address), dialled from the external namespace. Nothing else is allowed,
// so the API server cannot be turned into a way out.
func serveEgress(ctx context.Context, c Config, log *slog.Logger) error {
	sock := c.EgressSocket()
	_ = os.Remove(sock)
	ln, err := net.Listen("unix", sock)
	if err != nil {
		return fmt.Errorf("egress proxy: %w", err)
	}
	srv := &http.Server{ReadHeaderTimeout: 10 * time.Second, Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodConnect {
			http.Error(w, "CONNECT only", http.StatusMethodNotAllowed)
			return
		}
		host, _, err := net.SplitHostPort(r.Host)
		a, perr := netip.ParseAddr(host)
		from := ""
		if err == nil && perr == nil {
			from = egressFrom(a)
		}
		if from == "" {
			http.Error(w, "destination "+r.Host+" is neither on the lab fabric nor a pod address", http.StatusForbidden)
			return
		}
		dctx, cancel := context.WithTimeout(r.Context(), 10*time.Second)
		out, err := netutil.DialContext(dctx, netutil.Path(c.NetNS(from)), "tcp", r.Host)
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

// egressFrom returns the lab namespace (role) the egress proxy dials dst
// from, or "" when it refuses dst. Fabric addresses (the nodes, for the
// kubelets' API) are dialled from the fabric namespace. Pod addresses
// (PodRoutesViaNodes) are dialled from the external namespace: it routes
// them via the nodes, as a router beside the cluster would, and the chart's
// world-to-default policy admits it; a node's own namespace would do for
// its own pods only. Service VIPs inside those prefixes are refused: the
// API server's proxies dial endpoints, never a VIP, and a VIP is not
// served to the world.
func egressFrom(dst netip.Addr) string {
	dst = dst.Unmap()
	if UnderlayV4.Contains(dst) || UnderlayV6.Contains(dst) {
		return "fabric"
	}
	for _, p := range serviceRanges {
		if p.Contains(dst) {
			return ""
		}
	}
	for _, p := range PodRoutesViaNodes {
		if p.Contains(dst) {
			return "external"
		}
	}
	return ""
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

package chaos

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/lace-cni/lace/internal/netutil"
)

// The outside: a server on the external host, which pods of the default
// network reach through their node's SNAT (the default network's view
// holds `world`), so the translation's state (lace_snat and the flows it
// belongs to) is held through every fault like the rest.

// Ports of the external host's echo servers, as netexec answers: HTTP
// GET /echo?msg=M with M, UDP "echo M" with M.
const (
	outsideHTTPPort = 18080
	outsideUDPPort  = 18081
)

// serveOutside runs the external host's echo servers until ctx ends.
func serveOutside(ctx context.Context, extNS string, wg *sync.WaitGroup) error {
	var ln net.Listener
	var pc net.PacketConn
	err := netutil.Do(extNS, func() error {
		var err error
		// No keepalive probes: a server that probes resets a connection
		// whose client is gone, and would end the flows of deleted pods
		// that checkSNAT must find forgotten by the node itself (as most
		// servers do, a database included).
		lc := net.ListenConfig{KeepAlive: -1}
		if ln, err = lc.Listen(context.Background(), "tcp", fmt.Sprintf("[::]:%d", outsideHTTPPort)); err != nil {
			return err
		}
		if pc, err = net.ListenPacket("udp", fmt.Sprintf("[::]:%d", outsideUDPPort)); err != nil {
			ln.Close()
			return err
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("the external host's echo servers: %w", err)
	}
	mux := http.NewServeMux()
	mux.HandleFunc("GET /echo", func(w http.ResponseWriter, r *http.Request) {
		_, _ = w.Write([]byte(r.URL.Query().Get("msg")))
	})
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: streamTimeout}
	wg.Add(3)
	go func() {
		defer wg.Done()
		if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) && ctx.Err() == nil {
			fmt.Println("external host's HTTP echo:", err)
		}
	}()
	go func() {
		defer wg.Done()
		buf := make([]byte, 512)
		for {
			n, from, err := pc.ReadFrom(buf)
			if err != nil {
				return
			}
			if msg, ok := strings.CutPrefix(string(buf[:n]), "echo "); ok {
				_, _ = pc.WriteTo([]byte(msg), from)
			}
		}
	}()
	go func() {
		defer wg.Done()
		<-ctx.Done()
		sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = srv.Shutdown(sctx)
		pc.Close()
	}()
	return nil
}

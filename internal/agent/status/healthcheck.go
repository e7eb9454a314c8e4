package status

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/lace-cni/lace/internal/model"
)

// HealthChecks serves the healthCheckNodePorts of the node's
// externalTrafficPolicy Local LoadBalancer services, as kube-proxy does: on
// every address of the node, any path answers 200 with the number of the
// service's ready endpoints on this node, or 503 when there is none (an
// outside load balancer then stops sending there). One listener per port,
// opened when a service asks for it and closed when none does.
type HealthChecks struct {
	log    *slog.Logger
	listen func(port uint16) (net.Listener, error)
	mu     sync.Mutex
	byPort map[uint16]*healthCheckServer
}

type healthCheckServer struct {
	srv   *http.Server
	state atomic.Pointer[model.HealthCheck]
}

func NewHealthChecks(log *slog.Logger) *HealthChecks {
	return &HealthChecks{log: log, byPort: map[uint16]*healthCheckServer{},
		listen: func(port uint16) (net.Listener, error) {
			return net.Listen("tcp", net.JoinHostPort("", strconv.Itoa(int(port))))
		}}
}

// Sync serves want (one per port) and nothing else. A port that cannot be
// opened is reported and tried again at the next sync. A nil h (an agent
// made by a test) serves nothing.
func (h *HealthChecks) Sync(want []model.HealthCheck) error {
	if h == nil {
		return nil
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	keep := map[uint16]bool{}
	var errs []error
	for _, hc := range want {
		keep[hc.Port] = true
		s := h.byPort[hc.Port]
		if s == nil {
			ln, err := h.listen(hc.Port)
			if err != nil {
				errs = append(errs, fmt.Errorf("health check port %d of %s/%s: %w", hc.Port, hc.Namespace, hc.Name, err))
				continue
			}
			s = &healthCheckServer{}
			s.srv = &http.Server{Handler: s, ReadHeaderTimeout: 5 * time.Second}
			go func() { _ = s.srv.Serve(ln) }()
			h.byPort[hc.Port] = s
			h.log.Info("serving health check port", "port", hc.Port, "service", hc.Namespace+"/"+hc.Name)
		}
		s.state.Store(&hc)
	}
	for port, s := range h.byPort {
		if !keep[port] {
			_ = s.srv.Close()
			delete(h.byPort, port)
			h.log.Info("closed health check port", "port", port)
		}
	}
	return errors.Join(errs...)
}

// Close stops every server.
func (h *HealthChecks) Close() {
	if h == nil {
		return
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	for port, s := range h.byPort {
		_ = s.srv.Shutdown(context.Background())
		delete(h.byPort, port)
	}
}

// ServeHTTP answers as kube-proxy's service health server does.
func (s *healthCheckServer) ServeHTTP(w http.ResponseWriter, _ *http.Request) {
	hc := s.state.Load()
	type svc struct {
		Namespace string `json:"namespace"`
		Name      string `json:"name"`
	}
	body, _ := json.Marshal(struct {
		Service             svc  `json:"service"`
		LocalEndpoints      int  `json:"localEndpoints"`
		ServiceProxyHealthy bool `json:"serviceProxyHealthy"`
	}{svc{hc.Namespace, hc.Name}, hc.LocalEndpoints, true})
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("X-Content-Type-Options", "nosniff")
	w.Header().Set("X-Load-Balancing-Endpoint-Weight", strconv.Itoa(hc.LocalEndpoints))
	if hc.LocalEndpoints > 0 {
		w.WriteHeader(http.StatusOK)
	} else {
		w.WriteHeader(http.StatusServiceUnavailable)
	}
	_, _ = w.Write(body)
}

package status

import (
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"testing"

	"github.com/lace-cni/lace/internal/model"
)

// TestHealthChecks: each port answers as kube-proxy's health server (200
// with the local endpoint count, 503 at zero), follows count changes, and
// is closed when no service asks for it any more.
func TestHealthChecks(t *testing.T) {
	h := NewHealthChecks(slog.New(slog.DiscardHandler))
	addrs := map[uint16]string{}
	h.listen = func(port uint16) (net.Listener, error) {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err == nil {
			addrs[port] = ln.Addr().String()
		}
		return ln, err
	}
	defer h.Close()
	get := func(port uint16) (int, map[string]any, error) {
		resp, err := http.Get("http://" + addrs[port] + "/any/path")
		if err != nil {
			return 0, nil, err
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		var body map[string]any
		if err := json.Unmarshal(b, &body); err != nil {
			return 0, nil, fmt.Errorf("body %q: %w", b, err)
		}
		return resp.StatusCode, body, nil
	}
	if err := h.Sync([]model.HealthCheck{{Namespace: "ns", Name: "a", Port: 32000, LocalEndpoints: 2},
		{Namespace: "ns", Name: "b", Port: 32001}}); err != nil {
		t.Fatal(err)
	}
	code, body, err := get(32000)
	if err != nil || code != 200 || body["localEndpoints"] != float64(2) ||
		body["service"].(map[string]any)["name"] != "a" || body["serviceProxyHealthy"] != true {
		t.Errorf("port 32000: %d %v %v, want 200 with 2 local endpoints of ns/a", code, body, err)
	}
	if code, body, err := get(32001); err != nil || code != 503 || body["localEndpoints"] != float64(0) {
		t.Errorf("port 32001: %d %v %v, want 503 with none", code, body, err)
	}
	if err := h.Sync([]model.HealthCheck{{Namespace: "ns", Name: "a", Port: 32000}}); err != nil {
		t.Fatal(err)
	}
	if code, _, err := get(32000); err != nil || code != 503 {
		t.Errorf("port 32000 after its endpoints left: %d %v, want 503", code, err)
	}
	if _, _, err := get(32001); err == nil {
		t.Error("port 32001 still answers after its service stopped asking for it")
	}
}

//go:build revhost

package agent

import (
	"os"
	"path/filepath"
	"testing"
)

// TestNodeListenersUDPServersInEphemeralRange: UDP servers of the node
// whose well-known port lies inside the ephemeral range (WireGuard's
// 51820, Tailscale's 41641) are unconnected sockets like a client's, so
// nodeListeners skips them and a tenant's hostPort on that port takes
// the node's tunnel traffic (to_host's node_flow only keeps connected
// UDP sockets' answers). A server must stay the node's.
func TestNodeListenersUDPServersInEphemeralRange(t *testing.T) {
	dir := t.TempDir()
	hdr := "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode\n"
	body := hdr + "   0: 00000000:CA6C 00000000:0000 07 00000000:00000000 00:00000000 00000000     0        0 0\n" // 0.0.0.0:51820, WireGuard's
	if err := os.WriteFile(filepath.Join(dir, "udp"), []byte(body), 0o644); err != nil {
		t.Fatal(err)
	}
	got, err := nodeListeners(dir)
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range got {
		if r.Proto == 17 && r.Port == 51820 {
			return
		}
	}
	t.Errorf("the node's WireGuard port 51820/UDP is not reserved (got %v): a hostPort may take it", got)
}

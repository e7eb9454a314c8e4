package nodesync

import (
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/lace-cni/lace/internal/model"
)

// TestNodeListeners: TCP listeners and unconnected UDP sockets reserve
// their ports (wildcard binds on every address), a UDP server inside the
// ephemeral range too (WireGuard's 51820: it looks like a client's
// unconnected socket, and would lose its traffic to a hostPort on its
// port); connected sockets and established TCP do not.
func TestNodeListeners(t *testing.T) {
	dir := t.TempDir()
	hdr := "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode\n"
	files := map[string]string{
		"tcp": hdr +
			"   0: 0100007F:0035 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 1\n" + // 127.0.0.1:53 LISTEN
			"   1: 00000000:2814 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 2\n" + // 0.0.0.0:10260 LISTEN
			"   2: 0B1EAC0A:9C40 0100007F:0035 01 00000000:00000000 00:00000000 00000000     0        0 3\n", // established
		"udp": hdr +
			"   0: 0100007F:0035 00000000:0000 07 00000000:00000000 00:00000000 00000000     0        0 4\n" + // 127.0.0.1:53
			"   1: 00000000:CA6C 00000000:0000 07 00000000:00000000 00:00000000 00000000     0        0 5\n" + // :51820, WireGuard's
			"   2: 00000000:0044 0100007F:0035 01 00000000:00000000 00:00000000 00000000     0        0 6\n", // connected
		"tcp6": hdr +
			"   0: 00000000000000000000000001000000:1F90 00000000000000000000000000000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 7\n", // [::1]:8080
	}
	for name, body := range files {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	got, err := nodeListeners(dir)
	if err != nil {
		t.Fatal(err)
	}
	lo := netip.MustParseAddr("127.0.0.1")
	want := []model.ReservedPort{
		{Proto: 6, Port: 53, Addr: lo, What: "listening socket"},
		{Proto: 6, Port: 10260, What: "listening socket"},
		{Proto: 6, Port: 8080, Addr: netip.IPv6Loopback(), What: "listening socket"},
		{Proto: 17, Port: 53, Addr: lo, What: "listening socket"},
		{Proto: 17, Port: 51820, What: "listening socket"},
	}
	if !slices.Equal(got, want) {
		t.Errorf("listeners %v, want %v", got, want)
	}
}

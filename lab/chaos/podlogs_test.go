package chaos

import (
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"
)

// TestVIPLog: the agents' lines about VIPs and Leases in the window, from
// every agent's file, in time order; other lines, other windows and the
// controllers' files are left out.
func TestVIPLog(t *testing.T) {
	dir := t.TempDir()
	write := func(name, text string) {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write("lace-agent-a.agent.log", "2026-11-28T01:00:01Z stderr F {\"msg\":\"announcing LoadBalancer VIP\"}\n"+
		"2026-11-28T01:00:02Z stderr F {\"msg\":\"synced\"}\n"+
		"2026-11-28T01:09:00Z stderr F {\"msg\":\"renew the agent lease\"}\n")
	write("lace-agent-b.agent.log", "2026-11-28T01:00:03Z stderr F {\"msg\":\"API server unreachable: keeping the announcements\"}\n"+
		"garbage\n2026-11-28T00:59:00Z stderr F {\"msg\":\"stopped announcing LoadBalancer VIP\"}\n")
	write("lace-controller-x.controller.log", "2026-11-28T01:00:01Z stderr F {\"msg\":\"lease lost\"}\n")
	from := time.Date(2026, 11, 28, 1, 0, 0, 0, time.UTC)
	got := vipLog(dir, from, from.Add(time.Minute))
	want := []string{
		`lace-agent-a {"msg":"announcing LoadBalancer VIP"}`,
		`lace-agent-b {"msg":"API server unreachable: keeping the announcements"}`,
	}
	if !slices.Equal(got, want) {
		t.Errorf("vipLog = %q, want %q", got, want)
	}
}

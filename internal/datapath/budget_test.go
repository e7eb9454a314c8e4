package datapath

import (
	"crypto/rand"
	"encoding/hex"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/lace-cni/lace/internal/netutil"
	"github.com/lace-cni/lace/internal/testutil"
)

// tempPinDir is a fresh bpffs directory (root only).
func tempPinDir(t *testing.T) string {
	t.Helper()
	testutil.NeedRoot(t, "bpffs")
	suffix := make([]byte, 3)
	_, _ = rand.Read(suffix)
	dir := filepath.Join(os.TempDir(), "lmaps"+hex.EncodeToString(suffix))
	if err := netutil.EnsureBPFFS(dir); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = netutil.UnmountBPFFS(dir) })
	return filepath.Join(dir, "node")
}

func loadSized(t *testing.T, pin string, sizes MapSizes) *Datapath {
	t.Helper()
	d, err := LoadWith(pin, LoadOptions{Sizes: sizes, Migrate: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { d.Close() })
	return d
}

// budgetSvc is service i (a /32 VIP in 10.99.0.0/16, port 80) with n
// backends.
func budgetSvc(i, n int) Service {
	s := Service{VIP: netip.AddrFrom4([4]byte{10, 99, byte(i >> 8), byte(i)}), Proto: 6, Port: 80, NetID: 1}
	for j := range n {
		s.Backends = append(s.Backends, Backend{Addr: netip.AddrFrom4([4]byte{10, 1, byte(j >> 8), byte(j)}), Port: 8080})
	}
	return s
}

// TestServiceTableDeletesBeforeAdds: with lace_services and lace_backends
// full, a sync that removes services and adds as many others, or shrinks
// one service while another grows by as much, succeeds: deletions are
// made before additions. Before, the additions came first and failed
// (E2BIG), and every later sync with them.
func TestServiceTableDeletesBeforeAdds(t *testing.T) {
	d := loadSized(t, tempPinDir(t), MapSizes{Services: 16, Backends: 64})
	if s, b, _ := d.MapCapacity(); s != 16 || b != 64 {
		t.Fatalf("capacity %d/%d, want the sizes asked for, 16/64", s, b)
	}
	table := NewServiceTable(d)
	// 16 services of 4 backends: both maps full.
	var want []Service
	for i := range 16 {
		want = append(want, budgetSvc(i, 4))
	}
	if _, err := table.Apply(want); err != nil {
		t.Fatalf("fill the maps: %v", err)
	}
	// Four go, four others come.
	next := append(slices.Clone(want[4:]), budgetSvc(100, 4), budgetSvc(101, 4), budgetSvc(102, 4), budgetSvc(103, 4))
	if _, err := table.Apply(next); err != nil {
		t.Fatalf("replace four services in full maps: %v", err)
	}
	// One shrinks by 3 backends, another grows by 3.
	next[0], next[1] = budgetSvc(4, 1), budgetSvc(5, 7)
	if _, err := table.Apply(next); err != nil {
		t.Fatalf("move backends between services in a full map: %v", err)
	}
	got, err := d.Services()
	if err != nil {
		t.Fatal(err)
	}
	slices.SortFunc(got, func(a, b Service) int { return a.VIP.Compare(b.VIP) })
	wantSorted := slices.Clone(next)
	slices.SortFunc(wantSorted, func(a, b Service) int { return a.VIP.Compare(b.VIP) })
	if len(got) != len(wantSorted) {
		t.Fatalf("%d services in the map, want %d", len(got), len(wantSorted))
	}
	for i := range got {
		if got[i].VIP != wantSorted[i].VIP || !slices.Equal(got[i].Backends, wantSorted[i].Backends) {
			t.Errorf("service %s: backends %v, want %v", got[i].VIP, got[i].Backends, wantSorted[i].Backends)
		}
	}
	// A fresh table (an agent restart) makes the same change from what
	// the maps hold.
	restart := NewServiceTable(d)
	if _, err := restart.Apply(want); err != nil {
		t.Fatalf("after a restart, go back to the first services: %v", err)
	}
}

// TestLoadAdoptsPinnedSizes: a reader loading without sizes (lacectl, a
// test) adopts the sizes the agent chose, and a new size rewrites the
// derived maps and keeps conntrack's entries.
func TestLoadAdoptsPinnedSizes(t *testing.T) {
	pin := tempPinDir(t)
	d := loadSized(t, pin, MapSizes{Services: 4096, Conntrack: 2048})
	if _, err := NewServiceTable(d).Apply([]Service{budgetSvc(1, 2)}); err != nil {
		t.Fatal(err)
	}
	flow := ctEntry(1)
	if err := d.pod.LaceCt.Put(flow.k, flow.v); err != nil {
		t.Fatal(err)
	}
	reader, err := Load(pin)
	if err != nil {
		t.Fatalf("load without sizes: %v", err)
	}
	defer reader.Close()
	if s, _, _ := reader.MapCapacity(); s != 4096 {
		t.Errorf("a reader sees %d services entries, want the agent's 4096", s)
	}
	if svcs, err := reader.Services(); err != nil || len(svcs) != 1 {
		t.Errorf("a reader sees services %v, %v: want the one written", svcs, err)
	}
	if len(reader.ReplacedMaps()) != 0 {
		t.Errorf("a reader replaced %v", reader.ReplacedMaps())
	}
	d.Close()
	reader.Close()
	// The chart's sizes change: services are recreated (the agent
	// writes them again), conntrack is copied.
	grown := loadSized(t, pin, MapSizes{Services: 8192, Conntrack: 4096})
	if !slices.Contains(grown.ReplacedMaps(), "lace_services") || !slices.Contains(grown.ReplacedMaps(), "lace_ct") {
		t.Errorf("replaced %v, want lace_services and lace_ct", grown.ReplacedMaps())
	}
	if s, _, _ := grown.MapCapacity(); s != 8192 || grown.pod.LaceCt.MaxEntries() != 4096 {
		t.Errorf("sizes %d and %d, want 8192 and 4096", s, grown.pod.LaceCt.MaxEntries())
	}
	var v podCtVal
	if err := grown.pod.LaceCt.Lookup(flow.k, &v); err != nil || v != flow.v {
		t.Errorf("the flow after the resize: %+v, %v; want %+v", v, err, flow.v)
	}
}

type ctPair struct {
	k podCtKey
	v podCtVal
}

func ctEntry(i int) ctPair {
	k := podCtKey{NetId: 7, Proto: 6, Family: 4, Lport: uint16(1000 + i), Rport: 80}
	copy(k.Laddr[:], []byte{10, 70, 1, 2})
	copy(k.Raddr[:], []byte{10, 70, 2, byte(i)})
	return ctPair{k, podCtVal{Flags: ctOriginLocal | ctSeenReply, Expires: 1 << 40, PeerNet: 7}}
}

// TestLayoutMigrationKeepsFlows: a conntrack map pinned at another layout
// version is migrated through the registered Migration (its entries
// converted into a new map that takes the pin), a map without one is
// recreated rather than misread, and the next Load finds the recorded
// version and keeps the map as it is.
func TestLayoutMigrationKeepsFlows(t *testing.T) {
	pin := tempPinDir(t)
	d := loadSized(t, pin, MapSizes{})
	var flows []ctPair
	for i := range 50 {
		f := ctEntry(i)
		flows = append(flows, f)
		if err := d.pod.LaceCt.Put(f.k, f.v); err != nil {
			t.Fatal(err)
		}
	}
	if err := d.pod.LaceSnat.Put(podSnatKey{}, podSnatVal{}); err != nil {
		t.Fatal(err)
	}
	d.Close()
	// A build whose lace_ct is version 2 (same sizes here: a change of
	// meaning only the version tells), and whose lace_snat is version 2
	// with no way from 1.
	converted := 0
	defer BumpLayoutForTest("lace_ct", func(k, v []byte) ([]byte, []byte, bool) {
		converted++
		out := append([]byte(nil), v...)
		out[34] ^= 0xff // pad's low byte: proves the converter wrote the value
		return k, out, true
	})()
	snat, hadSnat := layoutVersions["lace_snat"]
	layoutVersions["lace_snat"] = layoutVersion("lace_snat") + 1 // no Migration
	defer func() {
		if hadSnat {
			layoutVersions["lace_snat"] = snat
		} else {
			delete(layoutVersions, "lace_snat")
		}
	}()
	if r, err := Load(pin); err == nil {
		r.Close()
		t.Error("a reader loaded maps of another layout; want an error, nothing changed")
	}
	up := loadSized(t, pin, MapSizes{})
	if converted != len(flows) {
		t.Errorf("converted %d flows, want %d", converted, len(flows))
	}
	for _, f := range flows {
		var v podCtVal
		want := f.v
		want.Pad ^= 0xff
		if err := up.pod.LaceCt.Lookup(f.k, &v); err != nil || v != want {
			t.Errorf("flow %d after the migration: %+v, %v; want %+v", f.k.Lport, v, err, want)
		}
	}
	if n, _ := up.countEntries(up.pod.LaceSnat); n != 0 {
		t.Errorf("lace_snat of an unconvertible version kept %d entries, want it recreated", n)
	}
	if !slices.Contains(up.ReplacedMaps(), "lace_ct") || !slices.Contains(up.ReplacedMaps(), "lace_snat") {
		t.Errorf("replaced %v, want lace_ct and lace_snat", up.ReplacedMaps())
	}
	up.Close()
	again := loadSized(t, pin, MapSizes{})
	if len(again.ReplacedMaps()) != 0 || converted != len(flows) {
		t.Errorf("a second load of the same build replaced %v (converted %d)", again.ReplacedMaps(), converted)
	}
	var v podCtVal
	if err := again.pod.LaceCt.Lookup(flows[0].k, &v); err != nil {
		t.Errorf("the flows after a second load: %v", err)
	}
}

package datapath

import (
	"net/netip"
	"slices"
	"testing"

	"github.com/lace-cni/lace/internal/tables"
)

// TestProgrammedFrontendsSurviveRestartAndResize: an agent that loads the
// maps again finds what the one before it programmed (each frontend's
// endpoints, ClusterIP reference and source ranges), also when the
// chart's sizes changed and lace_services is recreated empty; a map of
// another layout version is not read (nil: the budget starts from age).
// The agent seeds its services' budget with these (serviceCache).
func TestProgrammedFrontendsSurviveRestartAndResize(t *testing.T) {
	pin := tempPinDir(t)
	d := loadSized(t, pin, MapSizes{Services: 4096})
	if p := d.ProgrammedFrontends(); p != nil {
		t.Errorf("a first load found %v programmed", p)
	}
	ext := budgetSvc(2, 3)
	ext.VIP, ext.Frontend, ext.ClusterIP, ext.ClusterPort = netip.MustParseAddr("192.0.2.7"), tables.FrontendExternalIP,
		netip.MustParseAddr("10.99.0.2"), 80
	ext.SourceRanges = []netip.Prefix{netip.MustParsePrefix("198.51.100.0/24"), netip.MustParsePrefix("203.0.113.0/25")}
	if _, err := NewServiceTable(d).Apply([]Service{budgetSvc(1, 2), budgetSvc(2, 3), ext}); err != nil {
		t.Fatal(err)
	}
	d.Close()
	want := map[ServiceKey]ProgrammedFrontend{
		{VIP: netip.MustParseAddr("10.99.0.1"), Proto: 6, Port: 80}: {Backends: 2},
		{VIP: netip.MustParseAddr("10.99.0.2"), Proto: 6, Port: 80}: {Backends: 3},
		{VIP: netip.MustParseAddr("192.0.2.7"), Proto: 6, Port: 80}: {External: true, Backends: 3, SourceRanges: 2},
	}
	check := func(what string, got map[ServiceKey]ProgrammedFrontend) {
		t.Helper()
		if len(got) != len(want) {
			t.Errorf("%s: programmed %v, want %v", what, got, want)
		}
		for k, w := range want {
			if g, ok := got[k]; !ok || g != w {
				t.Errorf("%s: %v:%d programmed %+v (%v), want %+v", what, k.VIP, k.Port, g, ok, w)
			}
		}
	}
	again := loadSized(t, pin, MapSizes{Services: 4096})
	check("restart", again.ProgrammedFrontends())
	again.Close()

	grown := loadSized(t, pin, MapSizes{Services: 8192})
	if !slices.Contains(grown.ReplacedMaps(), "lace_services") {
		t.Fatalf("replaced %v, want lace_services recreated", grown.ReplacedMaps())
	}
	check("resize", grown.ProgrammedFrontends())
	if n, err := grown.countEntries(grown.pod.LaceServices); err != nil || n != 0 {
		t.Errorf("the resized map holds %d entries (%v), want none until the agent writes", n, err)
	}
	if _, err := NewServiceTable(grown).Apply([]Service{budgetSvc(1, 2)}); err != nil {
		t.Fatal(err)
	}
	grown.Close()

	// A build that reads lace_services in another layout cannot trust
	// the old entries: none are reported.
	defer BumpLayoutForTest("lace_services", nil)()
	other := loadSized(t, pin, MapSizes{Services: 8192})
	if p := other.ProgrammedFrontends(); p != nil {
		t.Errorf("a map of another layout version read as %v", p)
	}
}

package datapath

import (
	"maps"
	"net"
	"net/netip"
	"reflect"
	"slices"
	"testing"

	"github.com/lace-cni/lace/internal/tables"
)

// TestTablesRealMaps: the tables over the kernel's maps (hash, LPM trie,
// array, each with or without batch operations): syncs converge without
// reading back, the periodic check repairs what someone else changed and
// reports it, and a new Datapath over the same pins (an agent restart)
// deletes what its first sync no longer wants.
func TestTablesRealMaps(t *testing.T) {
	d := progDatapath(t)
	mac := net.HardwareAddr{2, 0, 0, 0, 0, 9}
	n := newBenchNode(50)
	routes := []Route{
		{NetID: 1, Prefix: netip.MustParsePrefix("10.244.1.0/24"), SID: netip.MustParseAddr("fc00:0:0:2::"), DstNet: 1},
		{NetID: 1, Prefix: netip.MustParsePrefix("10.96.0.10/32"), Kind: tables.RouteService, DstNet: 1},
		{NetID: 2, Prefix: netip.MustParsePrefix("fd10:0:1::/64"), Kind: tables.RouteLocal, DstNet: 2},
	}
	if err := syncTables(d, n); err != nil {
		t.Fatal(err)
	}
	if err := d.SyncRoutes(routes); err != nil {
		t.Fatal(err)
	}
	eps, err := d.Endpoints()
	if err != nil || len(eps) != 100 {
		t.Fatalf("endpoints after the sync: %d, %v", len(eps), err)
	}
	got, err := d.Routes()
	if err != nil || len(got) != len(routes) {
		t.Fatalf("routes after the sync: %v, %v", got, err)
	}
	if rep, err := d.CheckTables(); err != nil || len(rep) != 0 {
		t.Fatalf("check right after the sync: %v, %v", rep, err)
	}

	// Someone else deletes a route and an endpoint, adds a classifier and
	// changes a port: the check puts it all back, by map.
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	must(d.pod.LaceRoutes.Delete(routeKey(1, routes[0].Prefix)))
	k, _ := endpointEntry(n.eps[3])
	must(d.pod.LaceEndpoints.Delete(k))
	must(d.pod.LaceClassify.Put(classKey(netip.MustParsePrefix("198.51.100.0/24")), uint32(7)))
	must(d.pod.LacePorts.Put(n.ports[0].IfIndex, podPortVal{NetId: 9}))
	rep, err := d.CheckTables()
	must(err)
	want := map[string]int{"lace_routes": 1, "lace_endpoints": 1, "lace_classify": 1, "lace_ports": 1}
	if !maps.Equal(rep, want) {
		t.Errorf("repaired %v, want %v", rep, want)
	}
	cls, _ := d.Classifiers()
	ports, _ := d.Ports()
	if got, _ := d.Routes(); len(got) != len(routes) || len(cls) != len(n.cls) || len(ports) != 50 {
		t.Errorf("after the check: %d routes, %d classifiers, %d ports", len(got), len(cls), len(ports))
	}
	for _, p := range ports {
		if p.IfIndex == n.ports[0].IfIndex && !reflect.DeepEqual(p, n.ports[0]) {
			t.Errorf("port after the check: %+v, want %+v", p, n.ports[0])
		}
	}

	// A restart: a new Datapath over the pins, whose first sync wants
	// fewer pods and one other route.
	d2, err := Load(d.pinDir)
	must(err)
	defer d2.Close()
	small := newBenchNode(2)
	small.eps = append(small.eps, Endpoint{NetID: 2, Addr: netip.MustParseAddr("10.9.9.9"), IfIndex: 7, PodMAC: mac, HostMAC: mac})
	must(syncTables(d2, small))
	must(d2.SyncRoutes(routes[1:]))
	eps, _ = d2.Endpoints()
	ports, _ = d2.Ports()
	got, _ = d2.Routes()
	if len(eps) != 5 || len(ports) != 2 || len(got) != 2 {
		t.Errorf("after the restarted sync: %d endpoints (want 5), %d ports (want 2), %d routes (want 2)", len(eps), len(ports), len(got))
	}
	var netns int
	it := d2.pod.LacePodNetns.Iterate()
	var c uint64
	var ifi uint32
	for it.Next(&c, &ifi) {
		netns++
	}
	if netns != 2 {
		t.Errorf("%d pod namespace entries after the restarted sync, want 2", netns)
	}
}

// TestCheckTablesBesideApplies: the periodic check reads the maps with the
// tables' lock released, while the services are applied over and over
// (an endpoint changing every time): it never reports a repair the
// applies' own writes explain, and when it is done the maps equal the
// last state applied.
func TestCheckTablesBesideApplies(t *testing.T) {
	d := progDatapath(t)
	st := NewServiceTable(d)
	want := make([]Service, 2000)
	for i := range want {
		s := &want[i]
		s.VIP = netip.AddrFrom4([4]byte{10, 96, byte(i >> 8), byte(i)})
		s.Proto, s.Port, s.NetID = 6, 80, 1
		for j := range 5 {
			k := i*5 + j
			s.Backends = append(s.Backends, tables.Backend{Addr: netip.AddrFrom4([4]byte{10, 100, byte(k >> 8), byte(k)}), Port: 8080})
		}
	}
	if _, err := st.Apply(want); err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	applied := make(chan []Service, 1)
	go func() {
		defer close(applied)
		cur := want
		for i := 0; ; i++ {
			select {
			case <-done:
				applied <- cur
				return
			default:
			}
			next := slices.Clone(cur)
			s := &next[i%len(next)]
			s.Backends = slices.Clone(s.Backends)
			s.Backends = s.Backends[:1+i%len(s.Backends)]
			if _, err := st.Apply(next); err != nil {
				t.Error(err)
			}
			cur = next
		}
	}()
	for range 10 {
		repaired, err := d.CheckTables()
		if err != nil {
			t.Fatal(err)
		}
		if len(repaired) > 0 {
			t.Errorf("check beside the applies repaired %v: the applies' writes taken for differences", repaired)
		}
	}
	close(done)
	last := <-applied
	got, err := d.Services()
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != len(last) {
		t.Fatalf("the maps hold %d services, the last apply wanted %d", len(got), len(last))
	}
	if repaired, err := d.CheckTables(); err != nil || len(repaired) > 0 {
		t.Errorf("a quiet check after the applies: repaired %v, %v", repaired, err)
	}
	// The sizes the status reports come from the mirrors: they match the
	// maps.
	sizes, err := d.MapSizes()
	if err != nil {
		t.Fatal(err)
	}
	backends := 0
	for _, s := range got {
		backends += len(s.Backends)
	}
	if sizes["services"] != len(got) || sizes["backends"] != backends {
		t.Errorf("MapSizes: %d services, %d backends; the maps hold %d and %d", sizes["services"], sizes["backends"], len(got), backends)
	}
}

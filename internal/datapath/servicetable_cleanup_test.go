package datapath

import (
	"errors"
	"net/netip"
	"testing"

	"github.com/cilium/ebpf"
)

// TestServiceIDKeptUntilAffinityForgotten: a removed service's ID goes to
// the next new service only once its clients' affinity entries are
// forgotten. When that walk fails (a flood churning the affinity map can
// abort a key-by-key walk), the ID stays taken and the next Apply, which
// has nothing else to do, forgets them: else the new service given the ID
// would send the old one's clients to the old one's endpoint, in the new
// service's network.
func TestServiceIDKeptUntilAffinityForgotten(t *testing.T) {
	d := progPodDatapath(t)
	st := NewServiceTable(d)
	oldID, client := stickyService(t, d, st)
	old := ServiceKey{VIP: netip.MustParseAddr("10.96.0.40"), Proto: 6, Port: 80}
	var sv podSvcVal
	st.forgetHook = func(map[uint32]map[Backend]bool) error { return ebpf.ErrIterationAborted }
	gone, err := st.Apply(nil)
	if !errors.Is(err, ebpf.ErrIterationAborted) {
		t.Fatalf("Apply with a failing affinity walk: %v, want the walk's error", err)
	}
	if len(gone.Left[old]) != 1 || len(gone.Unlisted[old]) != 1 {
		t.Errorf("the failed Apply returned %v: the flows of the endpoint that left would never be forgotten", gone)
	}
	st.forgetHook = nil

	next := nextSticky
	if _, err := st.Apply([]Service{next}); err != nil {
		t.Fatal(err)
	}
	if err := d.pod.LaceServices.Lookup(svcKey(next), &sv); err != nil {
		t.Fatal(err)
	}
	var v podAffinityVal
	stale := d.pod.LaceAffinity.Lookup(client, &v) == nil
	if stale {
		t.Errorf("the old service's client is still sticky to %s after the next Apply", fromAddr16(4, v.Addr))
	}
	if sv.Id == oldID && stale {
		t.Errorf("the new service %s got the old one's ID %d with its clients' affinity: they go to %s", next.VIP, oldID, fromAddr16(4, v.Addr))
	}
	// Forgotten, the ID is free again.
	third := next
	third.VIP = netip.MustParseAddr("10.96.0.42")
	if _, err := st.Apply([]Service{next, third}); err != nil {
		t.Fatal(err)
	}
	if err := d.pod.LaceServices.Lookup(svcKey(third), &sv); err != nil {
		t.Fatal(err)
	}
	if sv.Id != oldID {
		t.Errorf("the freed ID %d was never given again (the third service got %d): IDs leak", oldID, sv.Id)
	}
}

// stickyService applies a service with ClientIP affinity through st and
// gives it a client sticky to its endpoint; it returns the service's ID
// and the client's affinity key.
func stickyService(t *testing.T, d *Datapath, st *ServiceTable) (uint32, podAffinityKey) {
	t.Helper()
	old := Service{VIP: netip.MustParseAddr("10.96.0.40"), Proto: 6, Port: 80, NetID: progNet, AffinitySeconds: 600,
		Backends: []Backend{{Addr: netip.MustParseAddr("10.70.2.5"), Port: 8080}}}
	if _, err := st.Apply([]Service{old}); err != nil {
		t.Fatal(err)
	}
	var sv podSvcVal
	if err := d.pod.LaceServices.Lookup(svcKey(old), &sv); err != nil {
		t.Fatal(err)
	}
	client := podAffinityKey{Id: sv.Id, Family: 4}
	copy(client.Client[:], []byte{198, 51, 100, 7})
	sticky := podAffinityVal{Expires: ^uint64(0) >> 1, Addr: addr16(old.Backends[0].Addr), Port: htons(8080)}
	if err := d.pod.LaceAffinity.Put(client, sticky); err != nil {
		t.Fatal(err)
	}
	return sv.Id, client
}

// noInheritedAffinity fails when service s got oldID while the old
// service's client is still sticky.
func noInheritedAffinity(t *testing.T, d *Datapath, s Service, oldID uint32, client podAffinityKey) {
	t.Helper()
	var sv podSvcVal
	if err := d.pod.LaceServices.Lookup(svcKey(s), &sv); err != nil {
		t.Fatal(err)
	}
	var v podAffinityVal
	if d.pod.LaceAffinity.Lookup(client, &v) == nil && sv.Id == oldID {
		t.Errorf("the new service %s got the old one's ID %d with its clients' affinity: they go to %s", s.VIP, oldID, fromAddr16(4, v.Addr))
	}
}

var nextSticky = Service{VIP: netip.MustParseAddr("10.96.0.41"), Proto: 6, Port: 80, NetID: progNet, AffinitySeconds: 600,
	Backends: []Backend{{Addr: netip.MustParseAddr("10.70.2.6"), Port: 8080}}}

// failingPuts is a map whose writes fail after its deletions (a full map).
type failingPuts struct{ kernelMap }

var errFull = errors.New("map full")

func (failingPuts) Put(any, any) error { return errFull }
func (failingPuts) BatchUpdate(any, any, *ebpf.BatchOptions) (int, error) {
	return 0, errFull
}

// TestServiceIDKeptWhenWriteFails: an Apply that removes a service and
// fails writing the next one (its removal reached the maps) keeps the old
// ID from the retry until its affinity is forgotten.
func TestServiceIDKeptWhenWriteFails(t *testing.T) {
	d := progPodDatapath(t)
	st := NewServiceTable(d)
	oldID, client := stickyService(t, d, st)
	real := d.tab.backends.m
	d.tab.backends.m = failingPuts{real}
	if _, err := st.Apply([]Service{nextSticky}); !errors.Is(err, errFull) {
		t.Fatalf("Apply with a full backends map: %v, want %v", err, errFull)
	}
	d.tab.backends.m = real
	if _, err := st.Apply([]Service{nextSticky}); err != nil {
		t.Fatal(err)
	}
	noInheritedAffinity(t, d, nextSticky, oldID, client)
}

// TestServiceIDKeptAcrossRestart: an agent restarted before the old
// service's affinity was forgotten sweeps entries of IDs no service holds
// before it gives any ID again.
func TestServiceIDKeptAcrossRestart(t *testing.T) {
	d := progPodDatapath(t)
	st := NewServiceTable(d)
	oldID, client := stickyService(t, d, st)
	st.forgetHook = func(map[uint32]map[Backend]bool) error { return ebpf.ErrIterationAborted }
	if _, err := st.Apply(nil); err == nil {
		t.Fatal("the failing walk returned no error")
	}
	restarted := NewServiceTable(d)
	if _, err := restarted.Apply([]Service{nextSticky}); err != nil {
		t.Fatal(err)
	}
	noInheritedAffinity(t, d, nextSticky, oldID, client)
}

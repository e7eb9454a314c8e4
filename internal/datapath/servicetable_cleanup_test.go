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
	old := Service{VIP: netip.MustParseAddr("10.96.0.40"), Proto: 6, Port: 80, NetID: progNet, AffinitySeconds: 600,
		Backends: []Backend{{Addr: netip.MustParseAddr("10.70.2.5"), Port: 8080}}}
	if _, err := st.Apply([]Service{old}); err != nil {
		t.Fatal(err)
	}
	var sv podSvcVal
	if err := d.pod.LaceServices.Lookup(svcKey(old), &sv); err != nil {
		t.Fatal(err)
	}
	oldID := sv.Id
	// A client of the old service, sticky to its endpoint.
	client := podAffinityKey{Id: oldID, Family: 4}
	copy(client.Client[:], []byte{198, 51, 100, 7})
	sticky := podAffinityVal{Expires: ^uint64(0) >> 1, Addr: addr16(old.Backends[0].Addr), Port: htons(8080)}
	if err := d.pod.LaceAffinity.Put(client, sticky); err != nil {
		t.Fatal(err)
	}

	st.forgetHook = func(map[uint32]map[Backend]bool) error { return ebpf.ErrIterationAborted }
	gone, err := st.Apply(nil)
	if !errors.Is(err, ebpf.ErrIterationAborted) {
		t.Fatalf("Apply with a failing affinity walk: %v, want the walk's error", err)
	}
	if len(gone[ServiceKey{old.VIP, old.Proto, old.Port}]) != 1 {
		t.Errorf("the failed Apply returned %v: the flows of the endpoint that left would never be forgotten", gone)
	}
	st.forgetHook = nil

	next := Service{VIP: netip.MustParseAddr("10.96.0.41"), Proto: 6, Port: 80, NetID: progNet, AffinitySeconds: 600,
		Backends: []Backend{{Addr: netip.MustParseAddr("10.70.2.6"), Port: 8080}}}
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

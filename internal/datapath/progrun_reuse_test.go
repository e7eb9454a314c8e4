package datapath

import (
	"net/netip"
	"testing"
)

// TestReusedAddressForgetsFlows: a pod's flows stay while it holds its
// address (a resync writes nothing new and forgets nothing) and go with
// it once it is deleted and its port gone (a TCP flow it never closed
// would otherwise hold its SNAT port for hours), but a local client's flow
// toward the address stays then (an l2 VM that migrated answers it from
// another node). The moment the address is given to a new pod, every flow
// of it goes, toward it included: the new pod's packets are never taken as
// replies of the old one's flows (past its policies and view), nor the
// old peers' as replies to it (past its ingress policy).
func TestReusedAddressForgetsFlows(t *testing.T) {
	d := snatDatapath(t)
	c := netip.MustParseAddrPort("198.51.100.9:53")
	client := netip.MustParseAddr("10.9.9.9")
	count := func() (from, snat, toward int) {
		t.Helper()
		flows, err := d.Conntrack()
		if err != nil {
			t.Fatal(err)
		}
		for _, f := range flows {
			switch {
			case f.NetID == progNet && f.Local.Addr() == progPodV4:
				from++
				if f.SNATPort != 0 {
					snat++
				}
			case f.Local.Addr() == client && f.Remote.Addr() == progPodV4:
				toward++
			}
		}
		return from, snat, toward
	}
	// A local client's flow toward the pod, written as the programs
	// would (conntrack keys the client's side).
	towardKey := podCtKey{NetId: progNet, Family: 4, Proto: 6, Lport: ntohs(40100), Rport: ntohs(80),
		Laddr: addr16(client), Raddr: addr16(progPodV4)}
	open := func() int {
		t.Helper()
		snatOut(t, d, 17, 40000, c)
		snatOut(t, d, 6, 40001, c)
		if err := d.pod.LaceCt.Put(towardKey, podCtVal{Expires: 1 << 62, PeerNet: progNet, Flags: ctOriginLocal}); err != nil {
			t.Fatal(err)
		}
		from, snat, toward := count()
		if from == 0 || snat == 0 || toward != 1 {
			t.Fatalf("flows: %d of the pod, %d translated, %d toward it: the test proves nothing", from, snat, toward)
		}
		return from
	}
	held := open()
	eps, err := d.Endpoints()
	if err != nil {
		t.Fatal(err)
	}
	sync := func(want []Endpoint) {
		t.Helper()
		if err := d.SyncEndpoints(want, nil); err != nil {
			t.Fatal(err)
		}
	}
	sync(eps)
	if err := d.ForgetRemovedFlows(); err != nil {
		t.Fatal(err)
	}
	if from, _, toward := count(); from != held || toward != 1 {
		t.Fatalf("a resync with the same pods left %d of the pod's %d flows, %d toward it", from, held, toward)
	}
	sync(nil)
	if from, _, _ := count(); from != held {
		t.Fatalf("the pod's flows went (%d of %d left) before its port did", from, held)
	}
	if err := d.ForgetRemovedFlows(); err != nil {
		t.Fatal(err)
	}
	if from, _, toward := count(); from != 0 || toward != 1 {
		t.Fatalf("after the pod's delete: %d of its %d flows left, %d toward it (want 0 and 1)", from, held, toward)
	}
	// Packets of the address while no pod holds it (its port is still
	// there): flows the next pod must not inherit.
	open()
	sync(eps)
	if from, _, toward := count(); from != 0 || toward != 0 {
		t.Errorf("the address given to a new pod still has %d of the old pod's flows, %d toward it", from, toward)
	}
}

package datapath

import (
	"net/netip"
	"testing"
)

// TestReusedAddressForgetsFlows: a pod's flows stay while it holds its
// address (a resync writes nothing new and forgets nothing) and go with
// it when it is deleted (a TCP flow it never closed would otherwise hold
// its SNAT port for hours); and flows of an address not held (a local
// pod's toward it, or left behind) are forgotten the moment the address
// is given to a new pod: the new pod's packets are never taken as replies
// of the old one's flows (past its policies and view), nor the old
// peers' as replies to it (past its ingress policy).
func TestReusedAddressForgetsFlows(t *testing.T) {
	d := snatDatapath(t)
	c := netip.MustParseAddrPort("198.51.100.9:53")
	ofPod := func() (n, snat int) {
		t.Helper()
		flows, err := d.Conntrack()
		if err != nil {
			t.Fatal(err)
		}
		for _, f := range flows {
			if f.NetID == progNet && f.Local.Addr() == progPodV4 {
				n++
				if f.SNATPort != 0 {
					snat++
				}
			}
		}
		return n, snat
	}
	open := func() int {
		t.Helper()
		snatOut(t, d, 17, 40000, c)
		snatOut(t, d, 6, 40001, c)
		held, snat := ofPod()
		if held == 0 || snat == 0 {
			t.Fatalf("the pod's packets left %d flows, %d translated: the test proves nothing", held, snat)
		}
		return held
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
	if n, _ := ofPod(); n != held {
		t.Fatalf("a resync with the same pods left %d of the pod's %d flows", n, held)
	}
	sync(nil)
	if n, _ := ofPod(); n != 0 {
		t.Fatalf("the deleted pod's address still has %d of its %d flows", n, held)
	}
	// Packets of the address while no pod holds it (its port is still
	// there): flows the next pod must not inherit.
	open()
	sync(eps)
	if n, _ := ofPod(); n != 0 {
		t.Errorf("the address given to a new pod still has %d of the old pod's flows", n)
	}
}

package datapath

import (
	"net/netip"
	"testing"
)

// TestReusedAddressForgetsFlows: a pod's flows stay while it holds its
// address (a resync writes nothing new and forgets nothing) and after it
// is deleted (the LRU reclaims them), but the moment its address is given
// to a new pod, every flow of the address is forgotten: the new pod's
// packets are never taken as replies of the old one's flows (past its
// policies and view), nor the old peers' as replies to it (past its
// ingress policy).
func TestReusedAddressForgetsFlows(t *testing.T) {
	d := snatDatapath(t)
	c := netip.MustParseAddrPort("198.51.100.9:53")
	snatOut(t, d, 17, 40000, c)
	snatOut(t, d, 6, 40001, c)
	ofPod := func() int {
		t.Helper()
		flows, err := d.Conntrack()
		if err != nil {
			t.Fatal(err)
		}
		n := 0
		for _, f := range flows {
			if f.NetID == progNet && f.Local.Addr() == progPodV4 {
				n++
			}
		}
		return n
	}
	held := ofPod()
	if held == 0 {
		t.Fatal("the pod's packets left no flow: the test proves nothing")
	}
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
	if n := ofPod(); n != held {
		t.Fatalf("a resync with the same pods left %d of the pod's %d flows", n, held)
	}
	sync(nil)
	if n := ofPod(); n != held {
		t.Fatalf("deleting the pod's endpoints left %d of its %d flows (the LRU reclaims them)", n, held)
	}
	sync(eps)
	if n := ofPod(); n != 0 {
		t.Errorf("the address given to a new pod still has %d of the old pod's flows", n)
	}
}

package datapath

import (
	"net/netip"
	"testing"

	"github.com/lace-cni/lace/internal/tables"
)

// A spoofed outside host handshakes blindly with a NodePort whose
// endpoint is on this node; the pod resets the blind ACK; the spoofer
// ignores the reset and sends one more ACK. The pod's reset left this node
// from the pod itself (nobody on the path forged it): the host it was sent
// to speaking on must not revive the flow to the established 6 h in
// lace_ct.
func TestRev17bBlindHandshakeRevivedAfterPodReset(t *testing.T) {
	d := progPodDatapath(t)
	cip := netip.MustParseAddr("10.96.0.10")
	for _, err := range []error{
		d.UpsertNetwork(Network{ID: snatWorld}),
		d.UpsertClassifier(Classifier{NetID: snatWorld, Prefix: netip.MustParsePrefix("0.0.0.0/0")}),
		d.UpsertRoute(Route{NetID: snatWorld, Prefix: netip.MustParsePrefix("0.0.0.0/0"), Kind: tables.RouteExternal, DstNet: snatWorld}),
		d.UpsertRoute(Route{NetID: snatWorld, Prefix: netip.PrefixFrom(cip, 32), Kind: tables.RouteService, DstNet: progNet}),
	} {
		if err != nil {
			t.Fatal(err)
		}
	}
	be := []tables.Backend{{Addr: progPodV4, Port: 8080}}
	if _, err := d.ApplyServices([]Service{
		{VIP: cip, Proto: 6, Port: 80, NetID: progNet, Backends: be},
		{VIP: progNodeV4, Proto: 6, Port: 30080, NetID: progNet, Backends: be, Frontend: tables.FrontendNodePort, ClusterIP: cip, ClusterPort: 80},
	}); err != nil {
		t.Fatal(err)
	}
	c := netip.MustParseAddr("203.0.113.5")
	if v, _ := runUnder(t, d, ether(unicastMAC, 0x0800, ipv4(c, progNodeV4, 6, seg4(5555, 30080, 0x02)))); v != actRedirect {
		t.Fatalf("SYN verdict %d", v)
	}
	runPod(t, d, ether(unicastMAC, 0x0800, ipv4(progPodV4, c, 6, seg4(8080, 5555, 0x12))))     // SYN-ACK (to nobody)
	runUnder(t, d, ether(unicastMAC, 0x0800, ipv4(c, progNodeV4, 6, seg4(5555, 30080, 0x10)))) // blind ACK
	runPod(t, d, ether(unicastMAC, 0x0800, ipv4(progPodV4, c, 6, seg4(8080, 5555, 0x04))))     // the pod resets it
	runUnder(t, d, ether(unicastMAC, 0x0800, ipv4(c, progNodeV4, 6, seg4(5555, 30080, 0x10)))) // the spoofer ignores it
	now, err := monotonicNow()
	if err != nil {
		t.Fatal(err)
	}
	flows, err := d.Conntrack()
	if err != nil {
		t.Fatal(err)
	}
	if len(flows) == 0 {
		t.Fatal("no conntrack entries")
	}
	for _, f := range flows {
		left := (int64(f.ExpiresMonotonicNanos) - int64(now)) / 1e9
		if left > 60 {
			t.Errorf("REVIVED: %+v expires in %ds after the pod reset the blind handshake", f, left)
		}
	}
}

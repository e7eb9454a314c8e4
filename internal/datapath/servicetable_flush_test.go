package datapath

import (
	"net/netip"
	"testing"

	"github.com/lace-cni/lace/internal/tables"
)

// TestServiceFlowsGoWithTheirEndpoint: when an endpoint stops being a
// backend, its datagram flows go at once, while a TCP connection to it
// stays as long as the endpoint lingers in the service's slices (not
// ready, terminating); once it left them altogether, the connection goes
// too: its address may be another pod's next (a client's SYN kept
// retransmitting to a rebooted node's old address reached the pod given
// it after, a pod of no Service).
func TestServiceFlowsGoWithTheirEndpoint(t *testing.T) {
	d := progPodDatapath(t)
	st := NewServiceTable(d)
	vip := netip.MustParseAddr("10.96.0.50")
	ep := Backend{Addr: netip.MustParseAddr("10.70.9.9"), Port: 8080}
	other := Backend{Addr: netip.MustParseAddr("10.70.9.10"), Port: 8080}
	svc := func(proto uint8, backends, lingering []Backend) Service {
		return Service{VIP: vip, Proto: proto, Port: 80, NetID: progNet, Backends: backends, Lingering: lingering}
	}
	apply := func(svcs ...Service) {
		t.Helper()
		gone, err := st.Apply(svcs)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := d.FlushServiceFlows(gone); err != nil {
			t.Fatal(err)
		}
	}
	// The pod's flows to the VIP, translated to ep, as from_pod writes
	// them: keyed from the pod, the endpoint in nat_addr.
	flowKey := func(proto uint8) podCtKey {
		return podCtKey{NetId: progNet, Family: 4, Proto: proto, Lport: ntohs(40000), Rport: ntohs(80),
			Laddr: addr16(progPodV4), Raddr: addr16(vip)}
	}
	open := func(proto uint8) {
		t.Helper()
		v := podCtVal{Expires: 1 << 62, PeerNet: progNet, Flags: ctOriginLocal | ctSeenReply | ctAssured | ctService,
			NatAddr: addr16(ep.Addr), NatPort: ntohs(ep.Port)}
		if err := d.pod.LaceCt.Put(flowKey(proto), v); err != nil {
			t.Fatal(err)
		}
	}
	held := func(proto uint8) bool {
		t.Helper()
		var v podCtVal
		return d.pod.LaceCt.Lookup(flowKey(proto), &v) == nil
	}
	apply(svc(6, []Backend{ep, other}, nil), svc(17, []Backend{ep, other}, nil))
	open(6)
	open(17)
	// ep not ready: still in the slices.
	apply(svc(6, []Backend{other}, []Backend{ep}), svc(17, []Backend{other}, []Backend{ep}))
	if !held(6) {
		t.Error("a connection to an endpoint that stopped being ready was forgotten")
	}
	if held(17) {
		t.Error("a datagram flow to an endpoint that stopped being ready was kept")
	}
	// ep left the slices: its address may be another pod's.
	apply(svc(6, []Backend{other}, nil), svc(17, []Backend{other}, nil))
	if held(6) {
		t.Error("a connection to an endpoint that left the service's slices was kept")
	}
	// Straight from backend to gone, and a service that goes.
	apply(svc(6, []Backend{ep, other}, nil))
	open(6)
	apply(svc(6, []Backend{other}, nil))
	if held(6) {
		t.Error("a connection to an endpoint that left at once was kept")
	}
	apply(svc(6, []Backend{ep}, nil))
	open(6)
	apply()
	if held(6) {
		t.Error("a connection to a service that went was kept")
	}

	// An agent restarted: what lingered is not in the maps, so its first
	// apply sweeps. A connection to an endpoint still listed (lingering)
	// stays; one to an endpoint that left while no agent looked goes.
	apply(svc(6, []Backend{other}, []Backend{ep}))
	open(6)
	st = NewServiceTable(d)
	apply(svc(6, []Backend{other}, []Backend{ep}))
	if !held(6) {
		t.Error("a restarted agent forgot a connection to a lingering endpoint")
	}
	st = NewServiceTable(d)
	apply(svc(6, []Backend{other}, nil))
	if held(6) {
		t.Error("a restarted agent kept a connection to an endpoint that left while it was down")
	}
	// A reload after a failed write keeps what lingered: an endpoint that
	// leaves the slices then still takes its connections.
	apply(svc(6, []Backend{other}, []Backend{ep}))
	open(6)
	st.loaded = false // as a failed Apply leaves it
	apply(svc(6, []Backend{other}, nil))
	if held(6) {
		t.Error("after a reload, a connection to an endpoint that left the slices was kept")
	}

	// An outside client's flow through a NodePort of this node, keyed from
	// the frontend's side as xlb_in writes it: a restarted agent keeps it
	// while its endpoint is listed (the sweep once judged it by the
	// client's address, listed nowhere, and forgot it), and forgets it
	// once the endpoint left.
	np := func(backends []Backend) Service {
		return Service{VIP: progNodeV4, Proto: 6, Port: 30080, NetID: progNet, Backends: backends,
			Frontend: tables.FrontendNodePort, ClusterIP: vip, ClusterPort: 80}
	}
	extKey := podCtKey{NetId: progNet, Family: 4, Proto: 6, Lport: ntohs(30080), Rport: ntohs(40000),
		Laddr: addr16(progNodeV4), Raddr: addr16(netip.MustParseAddr("203.0.113.5"))}
	openExt := func() {
		t.Helper()
		v := podCtVal{Expires: 1 << 62, PeerNet: progNet, Flags: ctSeenReply | ctAssured | ctService,
			NatAddr: addr16(ep.Addr), NatPort: ntohs(ep.Port)}
		if err := d.pod.LaceCt.Put(extKey, v); err != nil {
			t.Fatal(err)
		}
	}
	extHeld := func() bool {
		var v podCtVal
		return d.pod.LaceCt.Lookup(extKey, &v) == nil
	}
	apply(svc(6, []Backend{ep}, nil), np([]Backend{ep}))
	openExt()
	st = NewServiceTable(d)
	apply(svc(6, []Backend{ep}, nil), np([]Backend{ep}))
	if !extHeld() {
		t.Error("a restarted agent forgot an outside client's connection through a NodePort to a listed endpoint")
	}
	st = NewServiceTable(d)
	apply(svc(6, []Backend{other}, nil), np([]Backend{other}))
	if extHeld() {
		t.Error("a restarted agent kept an outside client's connection to an endpoint that left while it was down")
	}
}

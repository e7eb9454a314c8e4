package datapath

import (
	"context"
	"encoding/binary"
	"net"
	"net/netip"
	"testing"
	"time"
)

// A live migration's VM: MAC l2VM, address l2VM4, its port on this node
// (the target's or the source's pod) l2PortVM; a third node (l2ThirdV6,
// locator l2Third) besides the peer.
const l2PortVM = 5004

var (
	l2VM      = net.HardwareAddr{0x52, 0x54, 0, 0xaa, 0xbb, 0xcc}
	l2VM4     = netip.MustParseAddr("10.70.1.50")
	l2ThirdV6 = netip.MustParseAddr("fd00:99::3")
	l2Third   = netip.MustParsePrefix("fd1a:ce:0:3::/64")
)

// progL2MigrateDatapath is progL2NodesDatapath with a third node, the VM's
// address placed at its MAC, and, with port set, the VM's port here.
func progL2MigrateDatapath(t *testing.T, port bool, cluster ...FDBEntry) *Datapath {
	t.Helper()
	d := progL2NodesDatapath(t)
	mustL2(t, d.UpsertNode(l2ThirdV6))
	mustL2(t, d.UpsertNodeLocator(NodeLocator{Addr: l2ThirdV6, Locator: l2Third}))
	local := []FDBEntry{{NetID: progNet, MAC: l2MACA, IfIndex: l2PortA}, {NetID: progNet, MAC: l2MACGw, Gateway: true}}
	neigh := []L2Neighbor{{NetID: progNet, Addr: l2A4, MAC: l2MACA}, {NetID: progNet, Addr: l2Gw4, MAC: l2MACGw, Router: true}}
	if port {
		mustL2(t, d.UpsertPort(Port{IfIndex: l2PortVM, NetID: progNet, V4: l2VM4, L2: true}))
		mustL2(t, d.UpsertEndpoint(Endpoint{NetID: progNet, Addr: l2VM4, IfIndex: l2PortVM, PodMAC: l2VM, HostMAC: l2MACGw}))
		local = append(local, FDBEntry{NetID: progNet, MAC: l2VM, IfIndex: l2PortVM})
		neigh = append(neigh, L2Neighbor{NetID: progNet, Addr: l2VM4, MAC: l2VM})
	}
	mustL2(t, d.SyncL2Local(neigh, local))
	syncMigrateCluster(t, d, cluster...)
	return d
}

// syncMigrateCluster gives the cluster's l2 tables: port C on the peer,
// the VM's address, and the VM's MAC as fdb says.
func syncMigrateCluster(t *testing.T, d *Datapath, fdb ...FDBEntry) {
	t.Helper()
	all := append([]FDBEntry{{NetID: progNet, MAC: l2MACC, SID: SID(progOther, BehaviourL2IP, progNet, progNet)}}, fdb...)
	mustL2(t, d.SyncL2Cluster([]L2Neighbor{{NetID: progNet, Addr: l2C4, MAC: l2MACC}, {NetID: progNet, Addr: l2VM4, MAC: l2VM}}, all,
		[]L2FloodNode{{NetID: progNet, SID: SID(progOther, BehaviourL2Flood, progNet, progNet)}}))
}

func l2SID(loc netip.Prefix) netip.Addr { return SID(loc, BehaviourL2IP, progNet, progNet) }

// rarp is QEMU's announcement of a migrated VM: a broadcast reverse ARP
// request from its MAC.
func rarp(mac net.HardwareAddr) []byte {
	p := make([]byte, 28)
	binary.BigEndian.PutUint16(p[0:], 1)
	binary.BigEndian.PutUint16(p[2:], 0x0800)
	p[4], p[5] = 6, 4
	binary.BigEndian.PutUint16(p[6:], 3)
	copy(p[8:], mac)
	copy(p[18:], mac)
	return fromMAC(mac, ether(net.HardwareAddr{0xff, 0xff, 0xff, 0xff, 0xff, 0xff}, 0x8035, p))
}

// announced is a frame flooded from node src (DT2M) to this node.
func announced(src netip.Addr, frame []byte) []byte {
	return ether(unicastMAC, 0x86dd, ipv6(src, SID(progLocator, BehaviourL2Flood, progNet, progNet), 143, frame))
}

// encapTo says which SID an encapsulated frame goes to.
func encapTo(out []byte) netip.Addr {
	if len(out) < 54 || binary.BigEndian.Uint16(out[12:14]) != 0x86dd {
		return netip.Addr{}
	}
	return netip.AddrFrom16([16]byte(out[14+24 : 14+40]))
}

func vmFDB(t *testing.T, d *Datapath) FDBEntry {
	t.Helper()
	all, err := d.FDB()
	mustL2(t, err)
	for _, e := range all {
		if e.MAC.String() == l2VM.String() {
			return e
		}
	}
	t.Fatal("no FDB entry of the VM")
	return FDBEntry{}
}

// TestProgL2MigrationTarget: on the target's node the VM's MAC lives on the
// source node until it shows up at the target's port; its first frame there
// (QEMU's RARP) moves it here at once, is reported to the agent with the
// entry's sequence, and goes to the other nodes as the announcement. The
// move holds for that sequence only.
func TestProgL2MigrationTarget(t *testing.T) {
	d := progL2MigrateDatapath(t, true, FDBEntry{NetID: progNet, MAC: l2VM, SID: l2SID(progOther), Seq: 3, StandbyHere: true})
	if e := vmFDB(t, d); e.SID != l2SID(progOther) || e.StandbyIfIndex != l2PortVM || e.Seq != 3 {
		t.Fatalf("merged entry %+v: want the source node with this port as standby", e)
	}
	toVM := func() []byte { return fromMAC(l2MACA, ether(l2VM, 0x0800, ipv4(l2A4, l2VM4, 17, udp(1000, 7)))) }
	var out []byte
	onlyDrop(t, d, "no-underlay-route", func() { _, out = runL2(t, d, l2PortA, toVM()) })
	if encapTo(out) != l2SID(progOther) {
		t.Fatalf("before the VM showed up a frame to it went to %v, want the source node", encapTo(out))
	}

	ctx, cancel := context.WithCancel(context.Background())
	events := make(chan L2Learned, 8)
	done := make(chan error, 1)
	go func() { done <- d.ReadL2Learned(ctx, func(l L2Learned) { events <- l }) }()
	t.Cleanup(func() { cancel(); mustL2(t, <-done) })

	// The target pod's own chatter with the MAC moves nothing.
	var ret uint32
	onlyDrop(t, d, "l2-standby", func() {
		runL2(t, d, l2PortVM, fromMAC(l2VM, ether(net.HardwareAddr{0xff, 0xff, 0xff, 0xff, 0xff, 0xff}, 0x0800,
			ipv4(netip.IPv4Unspecified(), netip.MustParseAddr("255.255.255.255"), 17, udp(68, 67)))))
	})
	if moves, err := d.L2Moves(); err != nil || len(moves) != 0 {
		t.Fatalf("moves %v (%v) after the pod's own frame, want none", moves, err)
	}
	onlyForwarded(t, d, "l2-activated", func() {
		onlyDrop(t, d, "no-underlay-route", func() { ret, out = runL2(t, d, l2PortVM, rarp(l2VM)) })
	})
	if ret != actShot || out[14+6] != 143 || encapTo(out) != SID(progOther, BehaviourL2Flood, progNet, progNet) {
		t.Fatalf("the RARP: verdict %d, frame % x: want it carried whole to the other node's DT2M SID", ret, out[:60])
	}
	select {
	case ev := <-events:
		if !ev.Activated || ev.IfIndex != l2PortVM || ev.Seq != 3 || ev.MAC.String() != l2VM.String() {
			t.Errorf("report %+v: want the VM's MAC activated at its port, sequence 3", ev)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("no activation report")
	}
	onlyForwarded(t, d, "switched", func() {
		onlyDrop(t, d, "", func() {
			if ret, _ = runL2(t, d, l2PortA, toVM()); ret != actRedirect {
				t.Errorf("after the move a frame to the VM: verdict %d, want a redirect to its port here", ret)
			}
		})
	})
	// Its frames are its port's now, with no second activation.
	onlyForwarded(t, d, "switched", func() {
		onlyDrop(t, d, "", func() {
			runL2(t, d, l2PortVM, fromMAC(l2VM, ether(l2MACA, 0x0800, ipv4(l2VM4, l2A4, 17, udp(7, 1000)))))
		})
	})

	// lace-controller's next word (another sequence) ends the move.
	syncMigrateCluster(t, d, FDBEntry{NetID: progNet, MAC: l2VM, SID: l2SID(progOther), Seq: 4, StandbyHere: true})
	if moves, err := d.L2Moves(); err != nil || len(moves) != 0 {
		t.Errorf("moves %v (%v) after the sequence changed, want none", moves, err)
	}
	onlyDrop(t, d, "no-underlay-route", func() { _, out = runL2(t, d, l2PortA, toVM()) })
	if encapTo(out) != l2SID(progOther) {
		t.Errorf("a stale move still held: frame to %v", encapTo(out))
	}
	// A port that is no standby cannot take the MAC.
	onlyDrop(t, d, "l2-spoofed-mac", func() { runL2(t, d, l2PortB, rarp(l2VM)) })
	// The announcement lost, the VM's first data moves it, and goes on.
	onlyForwarded(t, d, "l2-activated", func() {
		onlyDrop(t, d, "", func() {
			if ret, _ = runL2(t, d, l2PortVM, fromMAC(l2VM, ether(l2MACA, 0x0800, ipv4(l2VM4, l2A4, 17, udp(7, 1000))))); ret != actRedirect {
				t.Errorf("the VM's first data frame: verdict %d, want switched to its destination", ret)
			}
		})
	})
	if e := vmFDB(t, d); e.Seq != 4 {
		t.Fatalf("entry %+v", e)
	}
	if moves, err := d.L2Moves(); err != nil || len(moves) != 1 || moves[0].Seq != 4 {
		t.Errorf("moves %v (%v), want the VM's at sequence 4", moves, err)
	}
	// A VM whose link came up anew resolves its peer first: its ARP
	// request from its own address moves it, and is answered.
	syncMigrateCluster(t, d, FDBEntry{NetID: progNet, MAC: l2VM, SID: l2SID(progOther), Seq: 5, StandbyHere: true})
	onlyDrop(t, d, "l2-standby", func() {
		runL2(t, d, l2PortVM, fromMAC(l2VM, arpRequest(l2VM, netip.MustParseAddr("10.70.1.51"), l2A4)))
	})
	onlyForwarded(t, d, "l2-activated", func() {
		onlyForwarded(t, d, "l2-answered", func() {
			onlyDrop(t, d, "", func() {
				if ret, _ = runL2(t, d, l2PortVM, fromMAC(l2VM, arpRequest(l2VM, l2VM4, l2A4))); ret != actRedirect {
					t.Errorf("the VM's ARP request: verdict %d, want answered", ret)
				}
			})
		})
	})
}

// TestProgL2MigrationFollower: a third node moves the VM's MAC to its
// standby node on the first frame from there (End.DT2U learning its
// source) or on that node's announcement, and from then on refuses the
// MAC from the node it left; no other node can move it.
func TestProgL2MigrationFollower(t *testing.T) {
	entry := func(seq uint32) FDBEntry {
		return FDBEntry{NetID: progNet, MAC: l2VM, SID: l2SID(progOther), Seq: seq, StandbySID: l2SID(l2Third)}
	}
	d := progL2MigrateDatapath(t, false, entry(1))
	mySID := SID(progLocator, BehaviourL2IP, progNet, progNet)
	fromVM := func(node netip.Addr) []byte { return srv6(node, mySID, ipv4(l2VM4, l2A4, 17, udp(7, 1000)), true) }
	toVM := func() []byte { return fromMAC(l2MACA, ether(l2VM, 0x0800, ipv4(l2A4, l2VM4, 17, udp(1000, 7)))) }

	onlyDrop(t, d, "", func() {
		if ret, _ := runUnderlay(t, d, fromVM(progPeerV6)); ret != actRedirect {
			t.Errorf("from the VM's node: verdict %d, want delivered", ret)
		}
	})
	onlyForwarded(t, d, "l2-moved", func() {
		onlyDrop(t, d, "", func() {
			if ret, _ := runUnderlay(t, d, fromVM(l2ThirdV6)); ret != actRedirect {
				t.Errorf("from the standby node: verdict %d, want delivered", ret)
			}
		})
	})
	var out []byte
	onlyDrop(t, d, "no-underlay-route", func() { _, out = runL2(t, d, l2PortA, toVM()) })
	if encapTo(out) != l2SID(l2Third) {
		t.Errorf("after the move a frame to the VM went to %v, want the standby node", encapTo(out))
	}
	onlyDrop(t, d, "decap-foreign-source", func() { runUnderlay(t, d, fromVM(progPeerV6)) })

	// The announcement alone moves it, and goes to no port.
	syncMigrateCluster(t, d, entry(2))
	onlyForwarded(t, d, "l2-moved", func() {
		onlyDrop(t, d, "", func() {
			if ret, _ := runUnderlay(t, d, announced(l2ThirdV6, rarp(l2VM))); ret != actShot {
				t.Errorf("the announcement: verdict %d, want consumed", ret)
			}
		})
	})
	onlyDrop(t, d, "no-underlay-route", func() { _, out = runL2(t, d, l2PortA, toVM()) })
	if encapTo(out) != l2SID(l2Third) {
		t.Errorf("after the announcement a frame to the VM went to %v, want the standby node", encapTo(out))
	}
	// Nobody else's announcement moves it: the peer's, while it lives on the
	// third node (this sequence) is foreign; a MAC with no standby never moves.
	onlyDrop(t, d, "decap-foreign-source", func() { runUnderlay(t, d, announced(progPeerV6, rarp(l2VM))) })
	syncMigrateCluster(t, d, FDBEntry{NetID: progNet, MAC: l2VM, SID: l2SID(progOther), Seq: 2})
	onlyDrop(t, d, "decap-foreign-source", func() { runUnderlay(t, d, announced(l2ThirdV6, rarp(l2VM))) })
	onlyDrop(t, d, "decap-foreign-source", func() { runUnderlay(t, d, fromVM(l2ThirdV6)) })
}

// TestProgL2MigrationSource: on the source's node the VM lives at its
// port until the target's node announces it; then frames to it go there
// and the old port may no longer send from its MAC.
func TestProgL2MigrationSource(t *testing.T) {
	d := progL2MigrateDatapath(t, true, FDBEntry{NetID: progNet, MAC: l2VM, Seq: 5, Here: true, StandbySID: l2SID(progOther)})
	if e := vmFDB(t, d); e.IfIndex != l2PortVM || e.StandbySID != l2SID(progOther) || e.Seq != 5 {
		t.Fatalf("merged entry %+v: want this port with the peer as standby", e)
	}
	toVM := func() []byte { return fromMAC(l2MACA, ether(l2VM, 0x0800, ipv4(l2A4, l2VM4, 17, udp(1000, 7)))) }
	onlyForwarded(t, d, "switched", func() {
		onlyDrop(t, d, "", func() { runL2(t, d, l2PortA, toVM()) })
	})
	onlyForwarded(t, d, "l2-moved", func() {
		onlyDrop(t, d, "", func() { runUnderlay(t, d, announced(progPeerV6, rarp(l2VM))) })
	})
	var out []byte
	onlyDrop(t, d, "no-underlay-route", func() { _, out = runL2(t, d, l2PortA, toVM()) })
	if encapTo(out) != l2SID(progOther) {
		t.Errorf("after the announcement a frame to the VM went to %v, want the target's node", encapTo(out))
	}
	onlyDrop(t, d, "l2-spoofed-mac", func() {
		runL2(t, d, l2PortVM, fromMAC(l2VM, ether(l2MACA, 0x0800, ipv4(l2VM4, l2A4, 17, udp(7, 1000)))))
	})
}

func mustL2(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

// TestL2ActivateStandby: the agent's move of a MAC to its standby port
// (KubeVirt said the target is ready) is the data plane's own: the MAC
// stands by at that port only (L2Standby), moves for the entry's
// sequence, is then switched to the port here and listed as activated,
// and lace-controller's next sequence ends the move.
func TestL2ActivateStandby(t *testing.T) {
	d := progL2MigrateDatapath(t, true, FDBEntry{NetID: progNet, MAC: l2VM, SID: l2SID(progOther), Seq: 3, StandbyHere: true})
	standby := func(port uint32) (uint32, bool) {
		t.Helper()
		seq, ok, err := d.L2Standby(progNet, l2VM, port)
		mustL2(t, err)
		return seq, ok
	}
	if _, ok := standby(l2PortA); ok {
		t.Fatal("the VM's MAC stands by at another port")
	}
	seq, ok := standby(l2PortVM)
	if !ok || seq != 3 {
		t.Fatalf("standby at its port: %d %v, want sequence 3", seq, ok)
	}
	mustL2(t, d.ActivateStandby(progNet, l2VM, seq))
	if _, ok := standby(l2PortVM); ok {
		t.Error("still standing by after the move")
	}
	acts, err := d.L2Activated()
	mustL2(t, err)
	if len(acts) != 1 || acts[0].IfIndex != l2PortVM || acts[0].Seq != 3 {
		t.Errorf("activated %+v, want the VM at its port, sequence 3", acts)
	}
	toVM := fromMAC(l2MACA, ether(l2VM, 0x0800, ipv4(l2A4, l2VM4, 17, udp(1000, 7))))
	onlyForwarded(t, d, "switched", func() {
		onlyDrop(t, d, "", func() {
			if ret, _ := runL2(t, d, l2PortA, toVM); ret != actRedirect {
				t.Errorf("a frame to the VM after the move: verdict %d, want a redirect to its port here", ret)
			}
		})
	})
	syncMigrateCluster(t, d, FDBEntry{NetID: progNet, MAC: l2VM, SID: l2SID(progOther), Seq: 4, StandbyHere: true})
	if seq, ok := standby(l2PortVM); !ok || seq != 4 {
		t.Errorf("after the next sequence: standby %d %v, want sequence 4 standing by again", seq, ok)
	}
}

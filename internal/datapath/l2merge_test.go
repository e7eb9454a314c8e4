package datapath

import (
	"net"
	"net/netip"
	"testing"
)

// TestMergeFDB: the pods' ports over the cluster's entries, except where
// the cluster names a standby (a live migration): the MAC's node keeps
// its standby, the standby's port is only that, and a third pod of the
// MAC holds nothing.
func TestMergeFDB(t *testing.T) {
	mac := net.HardwareAddr{0x52, 0x54, 0, 0, 0, 1}
	a := netip.MustParseAddr("fd1a:ce:0:2:400:7:0:7")
	b := netip.MustParseAddr("fd1a:ce:0:3:400:7:0:7")
	local := []FDBEntry{{NetID: 7, MAC: mac, IfIndex: 40}}
	for _, c := range []struct {
		name    string
		cluster FDBEntry
		local   []FDBEntry
		want    l2FdbVal
		none    bool
	}{
		{"the standby here", FDBEntry{NetID: 7, MAC: mac, SID: a, Seq: 3, StandbyHere: true}, local,
			l2FdbVal{Flags: fdbRemote | fdbAlt, Sid: a.As16(), AltIfindex: 40, Seq: 3}, false},
		{"here, the standby elsewhere", FDBEntry{NetID: 7, MAC: mac, Here: true, StandbySID: b, Seq: 4}, local,
			l2FdbVal{Flags: fdbLocal | fdbAlt, Ifindex: 40, AltSid: b.As16(), Seq: 4}, false},
		{"a third pod of the MAC", FDBEntry{NetID: 7, MAC: mac, SID: a, StandbySID: b, Seq: 5}, local,
			l2FdbVal{Flags: fdbRemote | fdbAlt, Sid: a.As16(), AltSid: b.As16(), Seq: 5}, false},
		{"no standby: the pod here wins (it just moved here)", FDBEntry{NetID: 7, MAC: mac, SID: a, Seq: 6}, local,
			l2FdbVal{Flags: fdbLocal, Ifindex: 40}, false},
		{"the standby here, its pod gone", FDBEntry{NetID: 7, MAC: mac, SID: a, Seq: 3, StandbyHere: true},
			[]FDBEntry{{NetID: 7, MAC: net.HardwareAddr{2, 0, 0, 0, 0, 9}, IfIndex: 41}},
			l2FdbVal{Flags: fdbRemote, Sid: a.As16(), Seq: 3}, false},
		{"here, its pod gone", FDBEntry{NetID: 7, MAC: mac, Here: true, StandbySID: b, Seq: 4},
			[]FDBEntry{{NetID: 7, MAC: net.HardwareAddr{2, 0, 0, 0, 0, 9}, IfIndex: 41}}, l2FdbVal{}, true},
	} {
		w := &l2Want{clusterFDB: []FDBEntry{c.cluster}, localFDB: c.local}
		got, ok := mergeFDB(w, map[uint32]bool{7: true})[l2FdbKey{NetId: 7, Mac: mac6(mac)}]
		if ok == c.none || (!c.none && got != c.want) {
			t.Errorf("%s: %+v (present %v), want %+v", c.name, got, ok, c.want)
		}
	}
}

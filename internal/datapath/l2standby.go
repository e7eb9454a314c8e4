package datapath

import (
	"errors"
	"fmt"
	"net"

	"github.com/cilium/ebpf"
	"golang.org/x/sys/unix"
)

// A live migration's target is activated by the VM's first frame at its
// standby port (l2_activate in bpf/l2.c), or by its orchestrator saying
// the target is ready (KubeVirt's annotation, read by the agent): the
// agent then makes the same move the data plane would have made.

// standbyKey is the FDB key of mac in network netID.
func standbyKey(netID uint32, mac net.HardwareAddr) (l2FdbKey, error) {
	if len(mac) != 6 {
		return l2FdbKey{}, fmt.Errorf("MAC %q of network %d is no Ethernet MAC", mac, netID)
	}
	return l2FdbKey{NetId: netID, Mac: mac6(mac)}, nil
}

// L2Standby tells whether the MAC of network netID stands by at port
// ifindex on this node (its entry names that port the standby) and has
// not moved there yet; seq is its entry's sequence.
func (d *Datapath) L2Standby(netID uint32, mac net.HardwareAddr, ifindex uint32) (seq uint32, ok bool, err error) {
	k, err := standbyKey(netID, mac)
	if err != nil {
		return 0, false, err
	}
	var v l2FdbVal
	if err := d.l2.LaceFdb.Lookup(k, &v); err != nil {
		if errors.Is(err, ebpf.ErrKeyNotExist) {
			return 0, false, nil
		}
		return 0, false, fmt.Errorf("look up MAC %s of network %d: %w", mac, netID, err)
	}
	if v.Flags&fdbAlt == 0 || v.AltIfindex != ifindex || ifindex == 0 {
		return 0, false, nil
	}
	var m l2L2MoveVal
	if err := d.l2.LaceL2Moves.Lookup(k, &m); err == nil && m.Seq == v.Seq {
		return 0, false, nil
	} else if err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
		return 0, false, fmt.Errorf("look up the move of MAC %s of network %d: %w", mac, netID, err)
	}
	return v.Seq, true, nil
}

// ActivateStandby moves the MAC of network netID to its standby port on
// this node for sequence seq, as the VM's first frame there would
// (l2_move): from then on this node switches the MAC to that port and
// takes its frames. The move holds for seq only (fdb_moved), so one made
// after lace-controller changed the entry is never read.
func (d *Datapath) ActivateStandby(netID uint32, mac net.HardwareAddr, seq uint32) error {
	k, err := standbyKey(netID, mac)
	if err != nil {
		return err
	}
	var ts unix.Timespec
	if err := unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts); err != nil {
		return fmt.Errorf("read the monotonic clock: %w", err)
	}
	if err := d.l2.LaceL2Moves.Put(k, l2L2MoveVal{Seq: seq, At: uint64(ts.Nano())}); err != nil {
		return fmt.Errorf("move MAC %s of network %d to its standby port: %w", mac, netID, err)
	}
	return nil
}

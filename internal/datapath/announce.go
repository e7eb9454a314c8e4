package datapath

import (
	"fmt"
	"net"
	"net/netip"
	"time"

	"golang.org/x/sys/unix"
)

// monotonicNow is bpf_ktime_get_ns()'s clock.
func monotonicNow() (uint64, error) {
	var ts unix.Timespec
	if err := unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts); err != nil {
		return 0, fmt.Errorf("read the monotonic clock: %w", err)
	}
	return uint64(ts.Nano()), nil
}

// SetAnnounced makes the node answer ARP and neighbour solicitations for
// exactly vips, with mac, for ttl from now: the caller renews them well
// within ttl while it announces, and they lapse by themselves when it
// stops (an agent that dies never leaves a stale announcer behind).
func (d *Datapath) SetAnnounced(vips []netip.Addr, mac net.HardwareAddr, ttl time.Duration) error {
	now, err := monotonicNow()
	if err != nil {
		return err
	}
	want := map[podHostKey]underlayAnnounceVal{}
	v := underlayAnnounceVal{Expires: now + uint64(ttl.Nanoseconds()), Mac: mac6(mac)}
	for _, a := range vips {
		want[hostKey(a.Unmap())] = v
	}
	// Every entry is written again (its deadline moves); those no longer
	// wanted go first.
	d.tab.announceMu.Lock()
	defer d.tab.announceMu.Unlock()
	if err := d.tab.announce.sync(want, nil); err != nil {
		return fmt.Errorf("announce: %w", err)
	}
	return nil
}

// Announced lists the VIPs the node answers for now (entries not lapsed).
func (d *Datapath) Announced() ([]netip.Addr, error) {
	now, err := monotonicNow()
	if err != nil {
		return nil, err
	}
	var out []netip.Addr
	var k podHostKey
	var v underlayAnnounceVal
	it := d.underlay.LaceAnnounce.Iterate()
	for it.Next(&k, &v) {
		if v.Expires > now {
			out = append(out, fromAddr16(k.Family, k.Addr))
		}
	}
	return out, it.Err()
}

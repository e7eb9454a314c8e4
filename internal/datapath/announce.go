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
	want := map[podHostKey]bool{}
	v := underlayAnnounceVal{Expires: now + uint64(ttl.Nanoseconds()), Mac: mac6(mac)}
	for _, a := range vips {
		k := hostKey(a.Unmap())
		want[k] = true
		if err := d.underlay.LaceAnnounce.Put(k, v); err != nil {
			return fmt.Errorf("announce %s: %w", a, err)
		}
	}
	var k podHostKey
	var cur underlayAnnounceVal
	var stale []podHostKey
	it := d.underlay.LaceAnnounce.Iterate()
	for it.Next(&k, &cur) {
		if !want[k] {
			stale = append(stale, k)
		}
	}
	if err := it.Err(); err != nil {
		return fmt.Errorf("walk announcements: %w", err)
	}
	for _, k := range stale {
		if err := ignoreMissing(d.underlay.LaceAnnounce.Delete(k)); err != nil {
			return fmt.Errorf("withdraw announcement: %w", err)
		}
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

package datapath

import (
	"fmt"
	"net/netip"
	"time"

	"golang.org/x/sys/unix"
)

// SNATExhaustion is one outside destination (an address, port and
// protocol) toward which the node found no free SNAT port: how many new
// flows failed (each also counted snat-failed) and when the last did.
type SNATExhaustion struct {
	Proto uint8
	Dest  netip.AddrPort
	Count uint64
	// LastMonotonicNanos is the CLOCK_MONOTONIC time of the last failure.
	LastMonotonicNanos uint64
}

// Destination renders the destination as proto/addr:port (ICMP: no port).
func (e SNATExhaustion) Destination() string {
	switch e.Proto {
	case 6:
		return "tcp/" + e.Dest.String()
	case 17:
		return "udp/" + e.Dest.String()
	case 1, 58:
		return "icmp/" + e.Dest.Addr().String()
	}
	return fmt.Sprintf("proto-%d/%s", e.Proto, e.Dest)
}

// Ago is how long before now (CLOCK_MONOTONIC) the last failure was.
func (e SNATExhaustion) Ago() time.Duration {
	var ts unix.Timespec
	if err := unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts); err != nil {
		return 0
	}
	return time.Duration(uint64(ts.Nano()) - e.LastMonotonicNanos)
}

// SNATExhausted lists the destinations that ran out of SNAT ports (the
// data plane keeps the last 1024 of them).
func (d *Datapath) SNATExhausted() ([]SNATExhaustion, error) {
	var out []SNATExhaustion
	var k podSnatKey
	var v podSnatFailVal
	it := d.pod.LaceSnatExhausted.Iterate()
	for it.Next(&k, &v) {
		out = append(out, SNATExhaustion{Proto: k.Proto, Count: v.Count, LastMonotonicNanos: v.Last,
			Dest: netip.AddrPortFrom(fromAddr16(k.Family, k.Raddr), ntohs(k.Rport))})
	}
	if err := it.Err(); err != nil {
		return nil, fmt.Errorf("read SNAT exhaustion: %w", err)
	}
	return out, nil
}

// SNATExhaustedCounts is SNATExhausted as failures by destination, as the
// agent exports them.
func (d *Datapath) SNATExhaustedCounts() (map[string]uint64, error) {
	l, err := d.SNATExhausted()
	if err != nil {
		return nil, err
	}
	out := make(map[string]uint64, len(l))
	for _, e := range l {
		out[e.Destination()] += e.Count
	}
	return out, nil
}

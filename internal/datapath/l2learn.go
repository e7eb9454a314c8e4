package datapath

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"time"

	"github.com/cilium/ebpf/ringbuf"
)

// L2Learned is a source an l2 port of a learning network sent that its
// network did not know (bpf/include/l2.h, struct l2_learn_event): a MAC,
// and the address sent from it when the frame had one.
//
// Activated: instead, the MAC showed up at port IfIndex, its standby (a
// live migration's target), while its FDB entry had sequence Seq; the
// data plane moved it there.
type L2Learned struct {
	IfIndex   uint32
	NetID     uint32
	MAC       net.HardwareAddr
	Addr      netip.Addr // invalid: the MAC alone
	Activated bool
	Seq       uint32
}

// l2_learn_event.kind (bpf/include/l2.h).
const l2EventActivated = 1

// ReadL2Learned hands each learning report of the data plane to f until
// ctx ends. The program sends at most one per port every 50 ms; f runs on
// this goroutine, so a slow f only makes the ring drop reports, which the
// port's next frame repeats.
func (d *Datapath) ReadL2Learned(ctx context.Context, f func(L2Learned)) error {
	rd, err := ringbuf.NewReader(d.l2.LaceL2Learn)
	if err != nil {
		return fmt.Errorf("open the l2 learning ring: %w", err)
	}
	defer rd.Close()
	for {
		if ctx.Err() != nil {
			return nil
		}
		rd.SetDeadline(time.Now().Add(500 * time.Millisecond))
		rec, err := rd.Read()
		switch {
		case errors.Is(err, os.ErrDeadlineExceeded):
			continue
		case errors.Is(err, ringbuf.ErrClosed):
			return nil
		case err != nil:
			return fmt.Errorf("read the l2 learning ring: %w", err)
		}
		var ev l2L2LearnEvent
		// A program of the build before (a rolling upgrade) writes the
		// shorter record of its time: the fields it lacks are zero.
		raw := rec.RawSample
		if n := binary.Size(ev); len(raw) < n {
			raw = append(raw, make([]byte, n-len(raw))...)
		}
		if err := binary.Read(bytes.NewReader(raw), binary.NativeEndian, &ev); err != nil {
			continue // a short record: nothing to learn from it
		}
		l := L2Learned{IfIndex: ev.Ifindex, NetID: ev.NetId, MAC: append(net.HardwareAddr(nil), ev.Mac[:]...),
			Activated: ev.Kind == l2EventActivated, Seq: ev.Seq}
		if ev.Family != 0 {
			l.Addr = fromAddr16(ev.Family, ev.Addr)
		}
		f(l)
	}
}

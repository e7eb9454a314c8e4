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

	"github.com/cilium/ebpf"
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
	return readRing(ctx, d.l2.LaceL2Learn, "the l2 learning ring", func(raw []byte) {
		var ev l2L2LearnEvent
		if !decodeRecord(raw, &ev) {
			return // a short record: nothing to learn from it
		}
		l := L2Learned{IfIndex: ev.Ifindex, NetID: ev.NetId, MAC: append(net.HardwareAddr(nil), ev.Mac[:]...),
			Activated: ev.Kind == l2EventActivated, Seq: ev.Seq}
		if ev.Family != 0 {
			l.Addr = fromAddr16(ev.Family, ev.Addr)
		}
		f(l)
	})
}

// readRing hands each record of ring buffer m to f until ctx ends; f runs
// on this goroutine (a slow f makes the ring drop records).
func readRing(ctx context.Context, m *ebpf.Map, what string, f func([]byte)) error {
	rd, err := ringbuf.NewReader(m)
	if err != nil {
		return fmt.Errorf("open %s: %w", what, err)
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
			return fmt.Errorf("read %s: %w", what, err)
		}
		f(rec.RawSample)
	}
}

// decodeRecord reads a ring record into v. A program of the build before
// (a rolling upgrade) may write the shorter record of its time: the
// fields it lacks are zero.
func decodeRecord(raw []byte, v any) bool {
	if n := binary.Size(v); len(raw) < n {
		raw = append(raw, make([]byte, n-len(raw))...)
	}
	return binary.Read(bytes.NewReader(raw), binary.NativeEndian, v) == nil
}

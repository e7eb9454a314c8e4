package datapath

import (
	"context"
	"encoding/binary"
	"fmt"
	"net/netip"
	"time"

	"github.com/cilium/ebpf"
)

// FlowEvent is one event of the data plane's flow ring
// (bpf/include/flows.h): a pod's new flow leaving its node, a packet a
// network policy refused, or a packet dropped for another reason.
type FlowEvent struct {
	// Boot is when it happened, in nanoseconds since the node booted
	// (CLOCK_MONOTONIC, as bpf_ktime_get_ns).
	Boot           time.Duration
	SrcNet, DstNet uint32 // 0: the network of the pod at IfIndex
	IfIndex        uint32
	Policy         uint32 // the refusing policy's id
	Dropped        bool
	Reason         string // the drop reason's name
	Ingress        bool   // a policy decided at the pod's ingress (else egress)
	// FromPort: the pod at IfIndex sent the packet (whatever its source
	// address says); ToPort: it was for that pod.
	FromPort, ToPort bool
	Proto            uint8
	TCPFlags         uint8
	Src, Dst         netip.AddrPort
	// Service is the frontend (VIP or node address, and port) a pod's
	// flow addressed before it was translated to Dst; invalid if none.
	Service          netip.AddrPort
	PolicyDirDecided bool // the event is a policy's decision
}

// flowEvent mirrors struct flow_event (bpf/include/flows.h), which no map
// names as a type: TestProgFlows checks every field through the program.
type flowEvent struct {
	Ts             uint64
	SrcNet, DstNet uint32
	Ifindex        uint32
	Policy         uint32
	Verdict        uint8
	Reason         uint8
	Dir            uint8
	Family         uint8
	Proto          uint8
	TCPFlags       uint8
	Sport, Dport   [2]byte
	SvcPort        [2]byte
	Saddr, Daddr   [16]byte
	SvcAddr        [16]byte
	_              [4]byte
}

// flow_event.verdict, flow_cfg.
const (
	flowDropped = 2
	polIn       = 1
	polOut      = 2
)

// SetFlows turns the flow events on (at most perSec a second on each CPU)
// or off.
func (d *Datapath) SetFlows(on bool, perSec uint32) error {
	v := podFlowCfg{PerSec: perSec}
	if on {
		v.On = 1
	}
	if err := d.pod.LaceFlowCfg.Put(uint32(0), &v); err != nil {
		return fmt.Errorf("write lace_flow_cfg: %w", err)
	}
	return nil
}

// FlowsLost counts the events the per-CPU budgets (about pods, and about
// packets from the fabric) or a full ring dropped.
func (d *Datapath) FlowsLost() (uint64, error) {
	var n uint64
	for _, m := range []*ebpf.Map{d.pod.LaceFlowRate, d.pod.LaceFlowRateFabric} {
		var per []struct {
			Window uint64
			Sent   uint32
			Lost   uint32
		}
		if err := m.Lookup(uint32(0), &per); err != nil {
			return 0, fmt.Errorf("read flow budget: %w", err)
		}
		for _, r := range per {
			n += uint64(r.Lost)
		}
	}
	return n, nil
}

// ReadFlows hands each flow event to f until ctx ends; f runs on this
// goroutine (a slow f makes the ring drop events, never packets).
func (d *Datapath) ReadFlows(ctx context.Context, f func(FlowEvent)) error {
	return readRing(ctx, d.pod.LaceFlows, "the flow ring", func(raw []byte) {
		if ev, ok := decodeFlow(raw); ok {
			f(ev)
		}
	})
}

func decodeFlow(raw []byte) (FlowEvent, bool) {
	var ev flowEvent
	if !decodeRecord(raw, &ev) {
		return FlowEvent{}, false
	}
	out := FlowEvent{Boot: time.Duration(ev.Ts), SrcNet: ev.SrcNet, DstNet: ev.DstNet, IfIndex: ev.Ifindex,
		Policy: ev.Policy, Dropped: ev.Verdict == flowDropped, Proto: ev.Proto, TCPFlags: ev.TCPFlags,
		Ingress: ev.Dir == polIn, FromPort: ev.Dir == polOut, ToPort: ev.Dir == polIn}
	if out.Dropped && int(ev.Reason) < len(DropReasons) {
		out.Reason = DropReasons[ev.Reason]
	}
	out.PolicyDirDecided = out.Reason == "policy" && ev.Dir != 0
	out.Src = netip.AddrPortFrom(fromAddr16(ev.Family, ev.Saddr), binary.BigEndian.Uint16(ev.Sport[:]))
	out.Dst = netip.AddrPortFrom(fromAddr16(ev.Family, ev.Daddr), binary.BigEndian.Uint16(ev.Dport[:]))
	if port := binary.BigEndian.Uint16(ev.SvcPort[:]); port != 0 {
		out.Service = netip.AddrPortFrom(fromAddr16(ev.Family, ev.SvcAddr), port)
	}
	return out, true
}

package datapath

import (
	"encoding/binary"
	"errors"
	"flag"
	"fmt"
	"slices"
	"sync"
	"testing"

	"github.com/cilium/ebpf"

	"github.com/lace-cni/lace/internal/testutil"
)

// FuzzProgPackets runs random packets through the tc programs (from_pod,
// to_pod, from_underlay, to_underlay, from_l2) with BPF_PROG_RUN, in the
// world of fuzz_prog_world_test.go, and checks what every run must keep
// whatever the packet: the kernel runs it (no error), the verdict is a tc
// action the programs mean (TC_ACT_OK, TC_ACT_SHOT, TC_ACT_REDIRECT), and
// every packet dropped is counted exactly once under a known reason (see
// fzJudge for the runs that take a packet without dropping it, or count a
// drop and send something else).
//
// An input is: a program byte, a template byte (fzTemplates, or the raw
// bytes alone past the last), a context byte (the port the packet comes
// from, the encapsulation mark, whether the template's opener runs), an
// offset and a trim byte, then raw bytes XORed onto the template from the
// offset on (zeros keep the template: every mutation starts from a valid
// packet) and extending it, less trim bytes at the end.
func FuzzProgPackets(f *testing.F) {
	testutil.NeedRoot(f, "BPF_PROG_RUN")
	for i, tm := range fzTemplates {
		f.Add([]byte{byte(tm.run.prog), byte(i), 0, 0, 0})
	}
	f.Add([]byte{fzFromUnderlay, byte(len(fzTemplates)), 0, 0, 0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 0x88, 0xcc})
	f.Cleanup(func() {
		if fzShared.w != nil {
			fzShared.w.d.Close()
		}
	})
	// Loaded before fuzzing, not by the first input: a worker gives each
	// input 10 s before it panics "deadlocked", and the verifier takes
	// seconds on a loaded machine. The coordinator of `go test -fuzz`
	// runs no input and loads nothing.
	if fz := flag.Lookup("test.fuzz"); fz == nil || fz.Value.String() == "" || fzWorker() {
		fzLoad(f)
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		w := fzLoad(t)
		in, ok := fzDecode(data)
		if !ok {
			return
		}
		if err := w.clearState(); err != nil {
			t.Fatal(err)
		}
		var out []byte
		if in.open != nil {
			out = w.run(t, *in.open, true)
		}
		r := in.run
		if r.pkt, ok = in.packet(out); !ok {
			return
		}
		if len(r.pkt) > w.maxData {
			r.pkt = r.pkt[:w.maxData]
		}
		if len(r.pkt) < w.minIP[binary.BigEndian.Uint16(r.pkt[12:14])] {
			return // no test run of it (fzDataLimits)
		}
		w.run(t, r, false)
	})
}

// fzInput is what a fuzz input means.
type fzInput struct {
	open  *fzRun
	reply func(out []byte) []byte
	run   fzRun // the packet's program and context; its template packet
	off   int
	trim  int
	raw   []byte
}

func fzDecode(data []byte) (fzInput, bool) {
	if len(data) < 5 {
		return fzInput{}, false
	}
	prog, tmpl, ctx := int(data[0])%fzProgs, int(data[1])%(len(fzTemplates)+1), data[2]
	in := fzInput{off: int(data[3]), trim: int(data[4]), raw: data[5:]}
	if tmpl < len(fzTemplates) {
		tm := fzTemplates[tmpl]
		in.run, in.reply = tm.run, tm.reply
		if tm.open != nil && ctx&0x10 == 0 {
			in.open = tm.open
		}
	}
	ports := [...]uint32{in.run.ingress, fzPodIf, fzPortA, fzPortB, fzPortL, fzNoPort}
	in.run.prog, in.run.ingress = prog, ports[int(ctx&7)%len(ports)]
	if ctx&8 != 0 {
		in.run.mark ^= laceMarkEncap
	}
	return in, true
}

// packet is the input's packet: its template (or its opener's reply,
// built from what the opener sent, if it ran), with the raw bytes XORed on from the
// offset and past its end, less trim bytes; false when no test run takes
// it (shorter than an Ethernet header: EINVAL).
func (in fzInput) packet(openOut []byte) ([]byte, bool) {
	pkt := slices.Clone(in.run.pkt)
	if in.reply != nil {
		pkt = in.reply(openOut) // without an opener: a reply to no flow
	}
	off := min(in.off, len(pkt))
	for i, b := range in.raw {
		if off+i < len(pkt) {
			pkt[off+i] ^= b
		} else {
			pkt = append(pkt, b)
		}
	}
	pkt = pkt[:len(pkt)-min(in.trim, len(pkt))]
	return pkt, len(pkt) >= ethHeaderLen
}

// fzWorldState is the loaded world and what its counters read after the
// last run.
type fzWorldState struct {
	th      *fzThread
	d       *Datapath
	progs   [fzProgs]*ebpf.Program
	notes   [fzProgs][]*ebpf.Map // the drop notes a run of each program may end with, the last writer first
	state   []*ebpf.Map          // what the programs write: emptied before each input
	maxData int                  // fzDataLimits
	minIP   map[uint16]int       // by ethertype
	ncpu    int
	drops   []uint64 // lace_drops by reason, summed over CPUs
	fwd     []uint64
	pol     uint64 // lace_pol_drops summed over policies and CPUs
}

// fzShared is the world, built once per process.
var fzShared struct {
	once sync.Once
	w    *fzWorldState
	err  error
}

// fzWorker tells whether this process is a worker of `go test -fuzz`.
func fzWorker() bool {
	w := flag.Lookup("test.fuzzworker")
	return w != nil && w.Value.String() == "true"
}

func fzLoad(t testing.TB) *fzWorldState {
	fzShared.once.Do(func() {
		th, underlay, err := fzStartThread()
		if err != nil {
			fzShared.err = err
			return
		}
		d, err := fzBuild(underlay)
		if err != nil {
			fzShared.err = err
			return
		}
		w := &fzWorldState{th: th, d: d}
		w.progs = [fzProgs]*ebpf.Program{d.pod.FromPod, d.pod.ToPod, d.underlay.FromUnderlay, d.underlay.ToUnderlay, d.l2.FromL2}
		// A from_l2 frame to the gateway ends in from_pod (tail call),
		// with that program's note (lace_drop_note is per object).
		w.notes = [fzProgs][]*ebpf.Map{{d.pod.LaceDropNote}, {d.pod.LaceDropNote},
			{d.underlay.LaceDropNote}, {d.underlay.LaceDropNote}, {d.pod.LaceDropNote, d.l2.LaceDropNote}}
		w.state = append(d.ctMaps(), d.pod.LaceSnat, d.pod.LaceSnatExhausted, d.pod.LaceXlbRev, d.pod.LaceAffinity,
			d.pod.LaceFrags, d.l2.LaceL2LearnGap, d.l2.LaceL2Moves)
		if w.ncpu, err = ebpf.PossibleCPU(); err == nil {
			w.maxData, w.minIP, err = fzDataLimits(th, d)
		}
		if err == nil {
			w.drops, w.fwd, w.pol, err = w.counters()
		}
		if err != nil {
			d.Close()
			fzShared.err = err
			return
		}
		fzShared.w = w
	})
	if fzShared.err != nil {
		t.Fatal(fzShared.err)
	}
	return fzShared.w
}

// clearState empties the maps the programs write, so that an input means
// the same in every run (a failure found reproduces from its input alone).
func (w *fzWorldState) clearState() error {
	for _, m := range w.state {
		key := make([]byte, m.KeySize())
		for {
			if err := m.NextKey(nil, key); errors.Is(err, ebpf.ErrKeyNotExist) {
				break
			} else if err != nil {
				return fmt.Errorf("%s: %w", m, err)
			}
			if err := m.Delete(key); err != nil {
				return fmt.Errorf("%s: %w", m, err)
			}
		}
	}
	return nil
}

// fzUnset marks a drop note no run wrote: drop() writes a reason plus one,
// consumed() zero.
const fzUnset = 0xfee1dead

// run runs r, checks it (fzJudge) and, when out, returns the packet as
// the program left it (an opener's, which its reply is built from).
func (w *fzWorldState) run(t *testing.T, r fzRun, out bool) []byte {
	t.Helper()
	unset := make([]uint32, w.ncpu)
	for i := range unset {
		unset[i] = fzUnset
	}
	for _, m := range w.notes[r.prog] {
		if err := m.Update(uint32(0), unset, ebpf.UpdateAny); err != nil {
			t.Fatal(err)
		}
	}
	opts := &ebpf.RunOptions{Data: r.pkt, Context: r.ctx()}
	if out {
		opts.DataOut = make([]byte, len(r.pkt)+256)
	}
	var ret uint32
	var err error
	w.th.call(func() { ret, err = w.progs[r.prog].Run(opts) })
	if err != nil {
		t.Fatalf("%s: BPF_PROG_RUN of %d bytes: %v\npacket % x", fzProgNames[r.prog], len(r.pkt), err, r.pkt)
	}
	drops, fwd, pol, err := w.counters()
	if err != nil {
		t.Fatal(err)
	}
	o := fzOutcome{prog: r.prog, verdict: ret, note: fzUnset}
	o.drops, o.fwd, o.pol = fzDelta(drops, w.drops), fzDelta(fwd, w.fwd), pol-w.pol
	w.drops, w.fwd, w.pol = drops, fwd, pol
	for _, m := range w.notes[r.prog] {
		var per []uint32
		if err := m.Lookup(uint32(0), &per); err != nil {
			t.Fatal(err)
		}
		if n, ok := fzWritten(per); !ok {
			t.Fatalf("%s: drop notes of several CPUs written: %x", fzProgNames[r.prog], per)
		} else if n != fzUnset {
			o.note = n
			break
		}
	}
	reason, msg := fzJudge(o)
	if msg != "" {
		t.Fatalf("%s: %s\npacket (%d bytes, ingress %d, mark %#x) % x", fzProgNames[r.prog], msg, len(r.pkt), r.ingress, r.mark, r.pkt)
	}
	fzCover(o, reason)
	return opts.DataOut
}

// fzWritten is the note a run wrote on its CPU (fzUnset: none); false
// when more than one CPU's changed (a run is on one CPU).
func fzWritten(per []uint32) (uint32, bool) {
	n := uint32(fzUnset)
	for _, v := range per {
		if v != fzUnset {
			if n != fzUnset {
				return 0, false
			}
			n = v
		}
	}
	return n, true
}

func fzDelta(after, before []uint64) []uint64 {
	d := make([]uint64, len(after))
	for i := range after {
		d[i] = after[i] - before[i]
	}
	return d
}

// counters reads every drop and forwarding counter, and the policies'
// drops, each map in one call.
func (w *fzWorldState) counters() (drops, fwd []uint64, pol uint64, err error) {
	sum := func(m *ebpf.Map) ([]uint64, error) {
		n := int(m.MaxEntries())
		keys, vals := make([]uint32, n), make([]uint64, n*w.ncpu)
		var c ebpf.MapBatchCursor
		if got, err := m.BatchLookup(&c, keys, vals, nil); got != n && err != nil {
			return nil, err
		}
		out := make([]uint64, n)
		for i := range vals {
			out[i/w.ncpu] += vals[i]
		}
		return out, nil
	}
	if drops, err = sum(w.d.pod.LaceDrops); err != nil {
		return
	}
	if fwd, err = sum(w.d.pod.LaceForwarded); err != nil {
		return
	}
	var id uint32
	var per []uint64
	it := w.d.pod.LacePolDrops.Iterate()
	for it.Next(&id, &per) {
		for _, v := range per {
			pol += v
		}
	}
	return drops, fwd, pol, it.Err()
}

// fzOutcome is what one run did: its verdict, the drop note it ended with
// (fzUnset: none written) and how far each counter moved.
type fzOutcome struct {
	prog    int
	verdict uint32
	note    uint32
	drops   []uint64
	fwd     []uint64
	pol     uint64
}

var (
	fzFIB    = slices.Index(DropReasons, "no-underlay-route")
	fzPolicy = slices.Index(DropReasons, "policy")
	// The drops counted as the packet is turned into an ICMP error and
	// sent back (icmp_error, too_big_out): counted, and not dropped.
	fzAnswered = []int{slices.Index(DropReasons, "ttl-exceeded"), slices.Index(DropReasons, "too-big"),
		slices.Index(DropReasons, "no-service-port"), slices.Index(DropReasons, "no-endpoints")}
	fzICMPError = slices.Index(ForwardCounters, "icmp-error")
	// A flood: the frame is copied (l2_flood) or delivered by clones
	// (l2_flood_in), or announced (a live migration's, which l2_activate
	// counts), and consumed.
	fzFloods = []int{slices.Index(ForwardCounters, "flooded"), slices.Index(ForwardCounters, "l2-unknown-flooded"),
		slices.Index(ForwardCounters, "l2-activated")}
)

// Outcomes fzJudge gives besides a reason's index.
const (
	fzPassed   = -1
	fzConsumed = -2
)

// fzJudge checks an outcome: a verdict the programs mean, and every drop
// counted once under a known reason. Beside a plain drop (SHOT, one
// reason up by one, the note naming it), three runs are legitimate:
//   - consumed (consumed() in lace.h): SHOT, nothing counted, the note
//     cleared. An l2 flood (from_l2's l2_flood, from_underlay's
//     l2_flood_in) takes the frame so, sending clones; an ARP reply,
//     gratuitous ARP or RARP flooded from another node is a live
//     migration's announcement, done once read. A flood also counts
//     each copy to another node it could not send (no-underlay-route
//     here: the test namespace has no route), and still consumes the
//     frame.
//   - answered (icmp_error, too_big_out): the reason counted, the packet
//     rewritten into an ICMP error and redirected (icmp-error counted);
//     when the error cannot be built, SHOT with the note already told
//     (flow_note_tell clears it).
//   - passed or sent: OK or REDIRECT, nothing counted.
//
// It returns the reason a drop was counted under, fzConsumed or fzPassed,
// and what is wrong ("" when nothing).
func fzJudge(o fzOutcome) (int, string) {
	if o.verdict != actOK && o.verdict != actShot && o.verdict != actRedirect {
		return 0, fmt.Sprintf("verdict %d is no tc action the programs return", o.verdict)
	}
	if o.pol != o.drops[fzPolicy] {
		return 0, fmt.Sprintf("policy counted %d times, the policies' drops moved %d", o.drops[fzPolicy], o.pol)
	}
	flooded := false
	for _, i := range fzFloods {
		flooded = flooded || o.fwd[i] != 0
	}
	rest := slices.Clone(o.drops)
	if flooded && (o.verdict == actRedirect || (o.verdict == actShot && o.note == 0)) {
		rest[fzFIB] -= min(rest[fzFIB], fzRemoteFloods)
	}
	reason, n := fzPassed, uint64(0)
	for i, c := range rest {
		switch {
		case c == 0:
		case i >= len(DropReasons):
			return 0, fmt.Sprintf("counter %d beyond the known reasons moved by %d", i, c)
		case reason != fzPassed:
			return 0, fmt.Sprintf("counted under %s and %s", DropReasons[reason], DropReasons[i])
		default:
			reason, n = i, c
		}
	}
	if reason == fzPassed {
		switch {
		case o.note != fzUnset && o.note != 0:
			return 0, fmt.Sprintf("note %d written, no counter moved", o.note)
		case o.verdict != actShot:
			return fzPassed, ""
		case o.note == 0:
			return fzConsumed, ""
		}
		return 0, "dropped without a count: neither drop() nor consumed() ran"
	}
	if n != 1 {
		return 0, fmt.Sprintf("counted %d times under %s", n, DropReasons[reason])
	}
	answered := slices.Contains(fzAnswered, reason)
	switch {
	case o.verdict == actShot && o.note == uint32(reason)+1:
	case o.verdict == actShot && o.note == 0 && answered:
	case o.verdict == actShot:
		return 0, fmt.Sprintf("dropped under %s with note %d", DropReasons[reason], o.note)
	case !answered || o.verdict != actRedirect || o.fwd[fzICMPError] != 1:
		return 0, fmt.Sprintf("counted under %s, verdict %d", DropReasons[reason], o.verdict)
	}
	return reason, ""
}

package datapath

import (
	"cmp"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"testing"

	"github.com/cilium/ebpf"
)

// fakeMap is a kernel map in memory: it logs every operation (one
// syscall each), refuses batch operations unless batch is set, and
// refuses a new key once it holds max entries (as the kernel does, E2BIG).
type fakeMap struct {
	m       map[uint32]uint32
	max     int
	batch   bool
	ops     []string
	failPut uint32 // a key whose writes fail (0: none)
	readAt  int    // the next BatchLookup's position
}

func newFakeMap(max int, batch bool) *fakeMap {
	return &fakeMap{m: map[uint32]uint32{}, max: max, batch: batch}
}

func (f *fakeMap) log(op string, n int) { f.ops = append(f.ops, fmt.Sprintf("%s %d", op, n)) }

func u32(x any) uint32 {
	switch v := x.(type) {
	case uint32:
		return v
	case *uint32:
		return *v
	}
	panic(fmt.Sprintf("fakeMap: key or value of type %T", x))
}

func (f *fakeMap) write(k, v uint32) error {
	if k == f.failPut {
		return errors.New("write refused")
	}
	if _, ok := f.m[k]; !ok && len(f.m) >= f.max {
		return errors.New("map full")
	}
	f.m[k] = v
	return nil
}

func (f *fakeMap) Put(k, v any) error { f.log("put", 1); return f.write(u32(k), u32(v)) }

func (f *fakeMap) Delete(k any) error {
	f.log("delete", 1)
	if _, ok := f.m[u32(k)]; !ok {
		return ebpf.ErrKeyNotExist
	}
	delete(f.m, u32(k))
	return nil
}

func (f *fakeMap) Lookup(k, out any) error {
	f.log("lookup", 1)
	v, ok := f.m[u32(k)]
	if !ok {
		return ebpf.ErrKeyNotExist
	}
	*out.(*uint32) = v
	return nil
}

func (f *fakeMap) sorted() []uint32 { return slices.Sorted(maps.Keys(f.m)) }

func (f *fakeMap) NextKey(k, out any) error {
	f.log("nextkey", 1)
	keys := f.sorted()
	i := 0
	if k != nil {
		i = slices.Index(keys, u32(k)) + 1 // a missing key restarts the walk
	}
	if i >= len(keys) {
		return ebpf.ErrKeyNotExist
	}
	*out.(*uint32) = keys[i]
	return nil
}

func (f *fakeMap) BatchUpdate(keys, vals any, _ *ebpf.BatchOptions) (int, error) {
	ks, vs := keys.([]uint32), vals.([]uint32)
	f.log("batch-update", len(ks))
	if !f.batch {
		return 0, ebpf.ErrNotSupported
	}
	for i := range ks {
		if err := f.write(ks[i], vs[i]); err != nil {
			return i, err
		}
	}
	return len(ks), nil
}

func (f *fakeMap) BatchDelete(keys any, _ *ebpf.BatchOptions) (int, error) {
	ks := keys.([]uint32)
	f.log("batch-delete", len(ks))
	if !f.batch {
		return 0, ebpf.ErrNotSupported
	}
	for i, k := range ks {
		if _, ok := f.m[k]; !ok {
			return i, ebpf.ErrKeyNotExist
		}
		delete(f.m, k)
	}
	return len(ks), nil
}

func (f *fakeMap) BatchLookup(_ *ebpf.MapBatchCursor, keys, vals any, _ *ebpf.BatchOptions) (int, error) {
	f.log("batch-lookup", 1)
	if !f.batch {
		return 0, ebpf.ErrNotSupported
	}
	ks, vs := keys.([]uint32), vals.([]uint32)
	all := f.sorted()[f.readAt:]
	n := min(len(all), len(ks))
	for i := range n {
		ks[i], vs[i] = all[i], f.m[all[i]]
	}
	f.readAt += n
	if n == len(all) {
		f.readAt = 0
		return n, ebpf.ErrKeyNotExist
	}
	return n, nil
}

func (f *fakeMap) MaxEntries() uint32 { return uint32(f.max) }

// reads and writes count the operations logged since from.
func (f *fakeMap) count(from int, kinds ...string) int {
	n := 0
	for _, op := range f.ops[from:] {
		if slices.Contains(kinds, strings.Fields(op)[0]) {
			n++
		}
	}
	return n
}

var readOps = []string{"lookup", "nextkey", "batch-lookup"}

func entries(kv ...uint32) map[uint32]uint32 {
	out := map[uint32]uint32{}
	for i := 0; i+1 < len(kv); i += 2 {
		out[kv[i]] = kv[i+1]
	}
	return out
}

func mustEqual(t *testing.T, f *fakeMap, want map[uint32]uint32) {
	t.Helper()
	if !maps.Equal(f.m, want) {
		t.Fatalf("map holds %v, want %v", f.m, want)
	}
}

// TestTableDeletesBeforeAdds: a full map takes a change that fits once
// done (two entries replaced by two others), because the entries no
// longer wanted go before any is added; a value that changes is written
// in place.
func TestTableDeletesBeforeAdds(t *testing.T) {
	for _, batch := range []bool{true, false} {
		t.Run(fmt.Sprint("batch=", batch), func(t *testing.T) {
			f := newFakeMap(3, batch)
			tb := newTable[uint32, uint32]("test", f)
			if err := tb.sync(entries(1, 1, 2, 2, 3, 3), nil); err != nil {
				t.Fatal(err)
			}
			from := len(f.ops)
			if err := tb.sync(entries(3, 30, 4, 4, 5, 5), nil); err != nil {
				t.Fatalf("replacing entries of a full map: %v", err)
			}
			mustEqual(t, f, entries(3, 30, 4, 4, 5, 5))
			lastDel, firstPut := -1, len(f.ops)
			for i, op := range f.ops[from:] {
				switch strings.Fields(op)[0] {
				case "delete", "batch-delete":
					lastDel = i
				case "put", "batch-update":
					firstPut = min(firstPut, i)
				}
			}
			if lastDel < 0 || lastDel > firstPut {
				t.Errorf("deletions not all before additions: %v", f.ops[from:])
			}
		})
	}
}

// TestTableBatches: many writes take one batch syscall where the map's
// type has batch operations, and fall back to one per entry (asking the
// kernel once) where it has not.
func TestTableBatches(t *testing.T) {
	want := map[uint32]uint32{}
	for i := range uint32(100) {
		want[i+1] = i
	}
	f := newFakeMap(1000, true)
	tb := newTable[uint32, uint32]("test", f)
	if err := tb.sync(want, nil); err != nil {
		t.Fatal(err)
	}
	if n := f.count(0, "put", "batch-update"); n != 1 {
		t.Errorf("100 entries written in %d syscalls, want 1 batch: %v", n, f.ops)
	}
	from := len(f.ops)
	if err := tb.sync(map[uint32]uint32{}, nil); err != nil {
		t.Fatal(err)
	}
	if n := f.count(from, "delete", "batch-delete"); n != 1 {
		t.Errorf("100 entries deleted in %d syscalls, want 1 batch: %v", n, f.ops[from:])
	}
	mustEqual(t, f, map[uint32]uint32{})

	f = newFakeMap(1000, false)
	tb = newTable[uint32, uint32]("test", f)
	for range 2 {
		if err := tb.sync(want, nil); err != nil {
			t.Fatal(err)
		}
		if err := tb.sync(map[uint32]uint32{}, nil); err != nil {
			t.Fatal(err)
		}
	}
	if n := f.count(0, "batch-update", "batch-delete", "batch-lookup"); n != 3 {
		t.Errorf("batch operations tried %d times on a map without them, want once each: %v", n, f.ops)
	}
	if n := f.count(0, "put"); n != 200 {
		t.Errorf("%d puts, want 200", n)
	}
}

// TestTableNoReadBack: once the mirror is known, a sync reads nothing
// from the kernel, and one that changes nothing writes nothing either.
func TestTableNoReadBack(t *testing.T) {
	f := newFakeMap(100, true)
	tb := newTable[uint32, uint32]("test", f)
	if err := tb.sync(entries(1, 1, 2, 2), nil); err != nil {
		t.Fatal(err)
	}
	from := len(f.ops)
	for range 3 {
		if err := tb.sync(entries(1, 1, 2, 2), nil); err != nil {
			t.Fatal(err)
		}
	}
	if len(f.ops) != from {
		t.Errorf("unchanged syncs made syscalls: %v", f.ops[from:])
	}
	if err := tb.sync(entries(1, 1, 2, 2, 3, 3), nil); err != nil {
		t.Fatal(err)
	}
	if n := f.count(from, readOps...); n != 0 {
		t.Errorf("a sync read the kernel %d times: %v", n, f.ops[from:])
	}
	// Single writes keep the mirror: a sync after them knows the map.
	from = len(f.ops)
	if err := errors.Join(putOne(tb, 9, 9), tb.del([]uint32{1})); err != nil {
		t.Fatal(err)
	}
	if err := tb.sync(entries(2, 2, 3, 3), nil); err != nil {
		t.Fatal(err)
	}
	mustEqual(t, f, entries(2, 2, 3, 3))
	if n := f.count(from, readOps...); n != 0 {
		t.Errorf("a sync after single writes read the kernel: %v", f.ops[from:])
	}
}

// TestTableRestart: a new table (a restarted agent) over a map an earlier
// one filled reads it once, keeps what is still wanted without writing
// it, and deletes the stale entries; keep protects entries from deletion.
func TestTableRestart(t *testing.T) {
	for _, batch := range []bool{true, false} {
		t.Run(fmt.Sprint("batch=", batch), func(t *testing.T) {
			f := newFakeMap(100, batch)
			for k := range uint32(10) {
				f.m[k+1] = k + 1
			}
			tb := newTable[uint32, uint32]("test", f)
			busy := func(k uint32) bool { return k == 7 }
			if err := tb.sync(entries(1, 1, 2, 2, 11, 11), busy); err != nil {
				t.Fatal(err)
			}
			mustEqual(t, f, entries(1, 1, 2, 2, 7, 7, 11, 11))
			if n := f.count(0, "put", "batch-update"); n != 1 {
				t.Errorf("%d writes, want 1 (only the new entry): %v", n, f.ops)
			}
			from := len(f.ops)
			if err := tb.sync(entries(1, 1), nil); err != nil {
				t.Fatal(err)
			}
			mustEqual(t, f, entries(1, 1))
			if n := f.count(from, readOps...); n != 0 {
				t.Errorf("the second sync read the kernel again: %v", f.ops[from:])
			}
		})
	}
}

// TestTableCheckRepairs: the periodic check puts back what someone else
// changed in the map (an entry deleted, one added, one changed), reports
// how many, and finds nothing the next time.
func TestTableCheckRepairs(t *testing.T) {
	for _, batch := range []bool{true, false} {
		t.Run(fmt.Sprint("batch=", batch), func(t *testing.T) {
			f := newFakeMap(100, batch)
			tb := newTable[uint32, uint32]("test", f)
			want := entries(1, 1, 2, 2, 3, 3)
			if err := tb.sync(want, nil); err != nil {
				t.Fatal(err)
			}
			delete(f.m, 1)
			f.m[2] = 20
			f.m[4] = 4
			n, err := tb.check()
			if err != nil {
				t.Fatal(err)
			}
			if n != 3 {
				t.Errorf("repaired %d entries, want 3", n)
			}
			mustEqual(t, f, want)
			if n, err := tb.check(); err != nil || n != 0 {
				t.Errorf("second check: %d repaired, %v", n, err)
			}
			// The mirror is still right: a sync writes only what changed.
			from := len(f.ops)
			if err := tb.sync(want, nil); err != nil || len(f.ops) != from {
				t.Errorf("sync after the check: %v, ops %v", err, f.ops[from:])
			}
		})
	}
}

// TestTableCheckOutside: a check that reads the kernel with the tables'
// lock released repairs what differs when nothing was written meanwhile,
// and is skipped, repairing nothing, when a sync wrote the table during
// its read: the read may show that write or not, and an entry the sync
// had just deleted was "repaired" back.
func TestTableCheckOutside(t *testing.T) {
	f := newFakeMap(100, true)
	tb := newTable[uint32, uint32]("test", f)
	want := entries(1, 1, 2, 2, 3, 3)
	if err := tb.sync(want, nil); err != nil {
		t.Fatal(err)
	}
	f.m[2] = 20
	read := func(r func()) { r() }
	if n, skipped, err := tb.checkOutside(read); err != nil || skipped || n != 1 {
		t.Fatalf("quiet check: %d repaired, skipped %v, %v; want 1 repaired", n, skipped, err)
	}
	mustEqual(t, f, want)
	// A sync removes 3 after the read saw it.
	after := entries(1, 1, 2, 2)
	racing := func(r func()) {
		r()
		if err := tb.sync(after, nil); err != nil {
			t.Fatal(err)
		}
	}
	if n, skipped, err := tb.checkOutside(racing); err != nil || !skipped || n != 0 {
		t.Fatalf("check with a sync during its read: %d repaired, skipped %v, %v; want skipped", n, skipped, err)
	}
	mustEqual(t, f, after)
	// The mirror is still right: the next sync of the same state writes
	// nothing.
	from := len(f.ops)
	if err := tb.sync(after, nil); err != nil || len(f.ops) != from {
		t.Errorf("sync after the skipped check: %v, ops %v", err, f.ops[from:])
	}
}

// TestTableWriteFailure: after a failed write the mirror is unknown, and
// the next sync reads the map before it diffs (whatever the failed batch
// left), then converges.
func TestTableWriteFailure(t *testing.T) {
	f := newFakeMap(100, true)
	tb := newTable[uint32, uint32]("test", f)
	f.failPut = 3
	if err := tb.sync(entries(1, 1, 2, 2, 3, 3, 4, 4), nil); err == nil {
		t.Fatal("a refused write was not reported")
	}
	f.failPut = 0
	from := len(f.ops)
	if err := tb.sync(entries(1, 1, 3, 3), nil); err != nil {
		t.Fatal(err)
	}
	mustEqual(t, f, entries(1, 1, 3, 3))
	if n := f.count(from, readOps...); n == 0 {
		t.Errorf("the sync after a failure did not read the map: %v", f.ops[from:])
	}
}

// TestTableBatchDeleteMissing: a key someone else deleted stops a batch
// delete; the rest of the batch still goes.
func TestTableBatchDeleteMissing(t *testing.T) {
	f := newFakeMap(100, true)
	tb := newTable[uint32, uint32]("test", f)
	if err := tb.sync(entries(1, 1, 2, 2, 3, 3, 4, 4), nil); err != nil {
		t.Fatal(err)
	}
	delete(f.m, 2)
	keys := []uint32{1, 2, 3, 4}
	slices.SortFunc(keys, cmp.Compare)
	if err := tb.del(keys); err != nil {
		t.Fatal(err)
	}
	mustEqual(t, f, map[uint32]uint32{})
	if len(tb.have) != 0 {
		t.Errorf("mirror after deleting everything: %v", tb.have)
	}
}

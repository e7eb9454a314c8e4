package datapath

import (
	"errors"
	"fmt"
	"sync"

	"github.com/cilium/ebpf"
)

// One reconciler writes every map the agent programs from its desired
// state (table): it keeps in memory what it wrote (the mirror), so a sync
// compares the desired entries with that and writes only the difference,
// without reading the kernel. The kernel is read whole only when the
// mirror is unknown: at the first use after a start (what an agent before
// this one left is adopted, and deleted when no longer wanted: the maps
// are pinned and outlive it) and after a write failed, whose effect is
// then unknown. A periodic check (Datapath.CheckTables) reads each map
// and repairs whatever differs from the mirror.
//
// Maps the programs themselves write (conntrack, SNAT, affinity, budgets,
// fragments, the reverse NAT of sockets) are not tables: their entries are
// state, not a desired state, and nothing here reads or writes them.

// kernelMap is the kernel side of a table: *ebpf.Map, or a fake in tests.
type kernelMap interface {
	Put(key, value any) error
	Delete(key any) error
	Lookup(key, valueOut any) error
	NextKey(key, nextKeyOut any) error
	BatchUpdate(keys, values any, opts *ebpf.BatchOptions) (int, error)
	BatchDelete(keys any, opts *ebpf.BatchOptions) (int, error)
	BatchLookup(cursor *ebpf.MapBatchCursor, keys, values any, opts *ebpf.BatchOptions) (int, error)
	MaxEntries() uint32
}

// table is one map written from a desired state: K and V are the map's
// key and value as the kernel holds them, so the mirror compares with
// the kernel byte for byte. It is not safe for concurrent use: the
// Datapath serializes its tables (tablesMu).
type table[K, V comparable] struct {
	name string
	m    kernelMap
	// have is what the map holds as far as this table knows; nil when
	// unknown (read the kernel before the next diff).
	have map[K]V
	// The batch operations the kernel refused on this map's type (each
	// is tried once; the fallback is one syscall per entry).
	noBatchRead, noBatchUpdate, noBatchDelete bool
	// writes counts the writes tried, so that a check that read the
	// kernel outside the tables' lock knows whether one came meanwhile.
	writes uint64
}

func newTable[K, V comparable](name string, m kernelMap) *table[K, V] {
	return &table[K, V]{name: name, m: m}
}

// tableBatch is how many entries one batch syscall reads or writes.
const tableBatch = 4096

// load reads the map whole into the mirror.
func (t *table[K, V]) load() error {
	have, err := t.read()
	if err != nil {
		return fmt.Errorf("read %s: %w", t.name, err)
	}
	t.have = have
	return nil
}

// size is how many entries the map holds, as the mirror knows (false:
// unknown).
func (t *table[K, V]) size() (int, bool) { return len(t.have), t.have != nil }

// known loads the mirror if it is unknown.
func (t *table[K, V]) known() error {
	if t.have != nil {
		return nil
	}
	return t.load()
}

// read returns the map's entries (walk).
func (t *table[K, V]) read() (map[K]V, error) {
	out := map[K]V{}
	if err := walk(t.m, &t.noBatchRead, func(k K, v V) { out[k] = v }); err != nil {
		return nil, err
	}
	return out, nil
}

// walk visits every entry of m: by batches where the kernel supports them
// on the map's type (*noBatch remembers that it does not), else key by
// key. The batch cursor is a hash bucket, not a key: entries deleted or
// evicted under the walk never restart it, where a key-by-key walk
// restarts from the first key each time the key under it goes, and gives
// up (ebpf.ErrIterationAborted) after twice the map's size in steps. So
// the agent's walks of the maps the programs churn (conntrack under a
// flood, affinity) finish.
func walk[K, V any](m kernelMap, noBatch *bool, fn func(K, V)) error {
	return walkInto(m, noBatch, nil, nil, fn)
}

// walkInto is walk reading batches into keys and vals (nil: new ones).
func walkInto[K, V any](m kernelMap, noBatch *bool, keys []K, vals []V, fn func(K, V)) error {
	if !*noBatch {
		if keys == nil {
			keys, vals = make([]K, tableBatch), make([]V, tableBatch)
		}
		var cursor ebpf.MapBatchCursor
		for {
			n, err := m.BatchLookup(&cursor, keys, vals, nil)
			for i := range n {
				fn(keys[i], vals[i])
			}
			if errors.Is(err, ebpf.ErrKeyNotExist) {
				return nil
			}
			if errors.Is(err, ebpf.ErrNotSupported) && n == 0 {
				*noBatch = true
				break
			}
			if err != nil {
				return err
			}
		}
	}
	var k, next K
	var v V
	err := m.NextKey(nil, &next)
	for steps := 0; err == nil; err = m.NextKey(&k, &next) {
		if steps++; steps > 2*int(m.MaxEntries())+1 {
			return ebpf.ErrIterationAborted
		}
		k = next
		switch lerr := m.Lookup(&k, &v); {
		case errors.Is(lerr, ebpf.ErrKeyNotExist):
			continue
		case lerr != nil:
			return lerr
		}
		fn(k, v)
	}
	if !errors.Is(err, ebpf.ErrKeyNotExist) {
		return err
	}
	return nil
}

// diff is what makes the map hold want: the entries to write (missing or
// different) and the keys to delete (not wanted, unless keep says so).
// The mirror must be known.
func (t *table[K, V]) diff(want map[K]V, keep func(K) bool) (puts []K, vals []V, dels []K) {
	for k, v := range want {
		if cur, ok := t.have[k]; !ok || cur != v {
			puts, vals = append(puts, k), append(vals, v)
		}
	}
	for k := range t.have {
		if _, ok := want[k]; !ok && (keep == nil || !keep(k)) {
			dels = append(dels, k)
		}
	}
	return puts, vals, dels
}

// sync makes the map hold want (keys keep says so are left alone when
// not wanted): deletions before additions, so a full map takes a change
// that fits once done.
func (t *table[K, V]) sync(want map[K]V, keep func(K) bool) error {
	if err := t.known(); err != nil {
		return err
	}
	puts, vals, dels := t.diff(want, keep)
	if err := t.del(dels); err != nil {
		return err
	}
	return t.put(puts, vals)
}

// put writes keys[i] = vals[i], by batches where the kernel supports them
// (one syscall per few thousand entries), else one by one. The mirror
// follows; after a failure it is unknown (a batch may have stopped
// anywhere) and the next sync reads the map.
func (t *table[K, V]) put(keys []K, vals []V) (err error) {
	t.writes++
	defer t.settle(&err)
	for len(keys) > 1 && !t.noBatchUpdate {
		n := min(len(keys), tableBatch)
		_, err := t.m.BatchUpdate(keys[:n], vals[:n], nil)
		if errors.Is(err, ebpf.ErrNotSupported) {
			t.noBatchUpdate = true
			break
		}
		if err != nil {
			return fmt.Errorf("write %s: %w", t.name, err)
		}
		t.mirror(keys[:n], vals[:n])
		keys, vals = keys[n:], vals[n:]
	}
	for i := range keys {
		if err := t.m.Put(&keys[i], &vals[i]); err != nil {
			return fmt.Errorf("write %s: %w", t.name, err)
		}
		t.mirror(keys[i:i+1], vals[i:i+1])
	}
	return nil
}

// del deletes keys; a key already gone is fine.
func (t *table[K, V]) del(keys []K) (err error) {
	t.writes++
	defer t.settle(&err)
	for len(keys) > 1 && !t.noBatchDelete {
		n := min(len(keys), tableBatch)
		done, err := t.m.BatchDelete(keys[:n], nil)
		switch {
		case errors.Is(err, ebpf.ErrNotSupported):
			t.noBatchDelete = true
		case errors.Is(err, ebpf.ErrKeyNotExist):
			// The batch stops at the missing key: go on after it.
			n = min(done+1, n)
		case err != nil:
			return fmt.Errorf("delete from %s: %w", t.name, err)
		}
		if t.noBatchDelete {
			break
		}
		t.forget(keys[:n])
		keys = keys[n:]
	}
	for i := range keys {
		if err := t.m.Delete(&keys[i]); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
			return fmt.Errorf("delete from %s: %w", t.name, err)
		}
		t.forget(keys[i : i+1])
	}
	return nil
}

func (t *table[K, V]) settle(err *error) {
	if *err != nil {
		t.have = nil
	}
}

func (t *table[K, V]) mirror(keys []K, vals []V) {
	if t.have == nil {
		return // unknown: read whole at the next sync
	}
	for i, k := range keys {
		t.have[k] = vals[i]
	}
}

func (t *table[K, V]) forget(keys []K) {
	for _, k := range keys {
		delete(t.have, k)
	}
}

// check reads the map and repairs what differs from the mirror: entries
// someone else added or changed go back to what was written, missing ones
// are written again. It returns how many entries it repaired. An unknown
// mirror is loaded instead (nothing to compare with).
func (t *table[K, V]) check() (int, error) {
	if t.have == nil {
		return 0, t.load()
	}
	cur, err := t.read()
	if err != nil {
		return 0, fmt.Errorf("read %s: %w", t.name, err)
	}
	return t.repair(cur)
}

// checkOutside is check with the kernel read while the tables' lock is
// released (unlocked runs its function so): reading a hundred thousand
// backends takes long enough that every sync waiting on the lock was
// late by as much (the 10,000-service change's p99). A write to the table
// meanwhile may or may not show in what was read, so the check is then
// skipped (skipped true) rather than taken for a difference.
func (t *table[K, V]) checkOutside(unlocked func(func())) (n int, skipped bool, err error) {
	if t.have == nil {
		return 0, false, t.load()
	}
	writes, noBatch := t.writes, t.noBatchRead
	var cur map[K]V
	unlocked(func() {
		cur = map[K]V{}
		err = walk(t.m, &noBatch, func(k K, v V) { cur[k] = v })
	})
	t.noBatchRead = t.noBatchRead || noBatch
	if err != nil {
		return 0, false, fmt.Errorf("read %s: %w", t.name, err)
	}
	if t.writes != writes || t.have == nil {
		return 0, true, nil
	}
	n, err = t.repair(cur)
	return n, false, err
}

// repair makes the map, which holds cur, equal to the mirror again.
func (t *table[K, V]) repair(cur map[K]V) (int, error) {
	want := t.have
	// Diff the kernel against the mirror: the kernel's entries are "have".
	t.have = cur
	puts, vals, dels := t.diff(want, nil)
	err := t.del(dels)
	if err == nil {
		err = t.put(puts, vals)
	}
	if err != nil {
		return 0, err
	}
	return len(puts) + len(dels), nil
}

// walkBuf keeps a walk's batch buffers between walks: a walk made per
// change (the flush of the flows of endpoints that left, over every
// conntrack map) would otherwise allocate a batch of keys and values
// each time, a third of an endpoint change's garbage at 10,000 services.
type walkBuf[K, V any] struct {
	mu   sync.Mutex
	keys []K
	vals []V
}

// walk is walk with b's buffers; one walk at a time uses them.
func (b *walkBuf[K, V]) walk(m kernelMap, noBatch *bool, fn func(K, V)) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.keys == nil {
		b.keys, b.vals = make([]K, tableBatch), make([]V, tableBatch)
	}
	return walkInto(m, noBatch, b.keys, b.vals, fn)
}

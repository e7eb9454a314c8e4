package datapath

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"

	"github.com/cilium/ebpf"
)

// Every pinned map has a layout version: what its key and value mean. An
// agent that finds a map pinned by another build compares the version the
// pin was recorded with (lace_layout) and the map's type, key and value
// sizes and size with its own, and on any difference either migrates the
// entries or recreates the map, instead of failing to load (a crash loop)
// or reading bytes of one layout as another.
//
// Whoever changes what a pinned map's key or value means bumps its version
// here, and for a map of state only the kernel has (flows, SNAT mappings,
// affinities) registers a Migration from the previous version; maps the
// agent writes from the API (views, services, endpoints, ports...) are
// recreated empty and written again by its first sync.
var layoutVersions = map[string]uint32{
	// 2: struct xlb_rev_val gained isn and flags (a reset ahead of a SYN
	// given a port whose last flow may be half open at the endpoint).
	// 3: it gained eisn (the endpoint's SYN-ACK, which the client's ACK
	// must acknowledge to end the half open state).
	"lace_xlb_rev": 3,
	// 2: struct fdb_val gained alt_ifindex and alt_sid (a MAC's standby
	// location, a live migration's target).
	"lace_fdb": 2,
}

func init() {
	// Version 1's mappings carry no sequence number: they ask no reset.
	RegisterMigration(Migration{Map: "lace_xlb_rev", From: 1, Convert: func(k, v []byte) ([]byte, []byte, bool) {
		return k, append(append([]byte(nil), v...), make([]byte, 8)...), true
	}})
	// Version 2's mappings carry no SYN-ACK of the endpoint (no
	// XLB_REV_EISN): no client's ACK ends their half open state. A half
	// open one with an assured entry may be a blind client's or an honest
	// connection nobody spoke on yet: it keeps its hold (cut short, it
	// would go first to early drop, which resets it at the endpoint; its
	// next packet cuts it, xlb_hold), and XLB_REV_V2 keeps it from the
	// sweep while its entry lives.
	RegisterMigration(Migration{Map: "lace_xlb_rev", From: 2, Convert: xlbRevFromV2})
}

// statefulMaps hold state only the data plane has: kept across a change
// of size (copied), migrated across a change of version when a Migration
// exists. Without one they are recreated, which resets their flows: a
// loss, never a misreading.
var statefulMaps = map[string]bool{
	"lace_ct": true, "lace_ct_new": true, "lace_ct_local": true, "lace_snat": true, "lace_affinity": true, "lace_sock_rnat": true,
	"lace_xlb_rev": true,
}

// Migration converts the entries of map Map from layout version From to
// From+1. Convert gets one entry's key and value in the old layout and
// returns them in the new one (keep false drops the entry).
type Migration struct {
	Map     string
	From    uint32
	Convert func(key, val []byte) (newKey, newVal []byte, keep bool)
}

var migrations = map[string]map[uint32]Migration{}

// RegisterMigration adds m (at init time, next to the map's layout).
func RegisterMigration(m Migration) {
	if migrations[m.Map] == nil {
		migrations[m.Map] = map[uint32]Migration{}
	}
	migrations[m.Map][m.From] = m
}

// layoutVersion is the version of name's layout in this build (1 unless
// bumped).
func layoutVersion(name string) uint32 {
	if v, ok := layoutVersions[name]; ok {
		return v
	}
	return 1
}

// layoutMapName is the pinned map recording the version of every other.
const layoutMapName = "lace_layout"

type layoutKey [32]byte

func layoutKeyOf(name string) layoutKey {
	var k layoutKey
	copy(k[:], name)
	return k
}

// layoutRecord is lace_layout's value: the layout version of a pinned map
// and the ID of the map it was recorded for. A record is trusted only for
// that very map: a pin replaced by anyone who did not record (a crash
// halfway, a build from before the records) is of the unversioned layout
// (1). The first builds recorded the version alone (4 bytes); their
// records are trusted as they were and converted on the agent's start.
type layoutRecord struct {
	Version uint32
	MapID   uint32
}

// openLayoutMap opens lace_layout, creating it when create is set (else
// a missing one is nil: every map is at version 1). A lace_layout of the
// first builds (versions alone) is converted, its records given the IDs
// of the maps pinned now, when create is set.
func openLayoutMap(pinDir string, create bool) (*ebpf.Map, error) {
	path := filepath.Join(pinDir, layoutMapName)
	m, err := ebpf.LoadPinnedMap(path, nil)
	switch {
	case errors.Is(err, os.ErrNotExist):
		if !create {
			return nil, nil
		}
	case err != nil:
		return nil, fmt.Errorf("open %s: %w", layoutMapName, err)
	case m.ValueSize() == 8 || !create:
		return m, nil
	}
	fresh, err := ebpf.NewMap(&ebpf.MapSpec{Name: layoutMapName, Type: ebpf.Hash, KeySize: 32, ValueSize: 8, MaxEntries: 256})
	if err != nil {
		if m != nil {
			m.Close()
		}
		return nil, fmt.Errorf("create %s: %w", layoutMapName, err)
	}
	if m != nil {
		// The first builds' records: trusted for the maps pinned now.
		var k layoutKey
		var v uint32
		it := m.Iterate()
		for it.Next(&k, &v) {
			id, ok := pinnedMapID(filepath.Join(pinDir, string(bytes.TrimRight(k[:], "\x00"))))
			if !ok {
				continue
			}
			if err := fresh.Put(k, layoutRecord{v, id}); err != nil {
				m.Close()
				fresh.Close()
				return nil, fmt.Errorf("convert %s: %w", layoutMapName, err)
			}
		}
		err := it.Err()
		m.Close()
		if err != nil {
			fresh.Close()
			return nil, fmt.Errorf("read %s: %w", layoutMapName, err)
		}
	}
	if err := pinOver(fresh, path); err != nil {
		fresh.Close()
		return nil, err
	}
	return fresh, nil
}

// pinOver pins m at path in one step: pinned under a temporary name,
// then renamed over whatever path held (bpffs supports rename(2)), so
// that path names the old map or the new one, never none.
func pinOver(m *ebpf.Map, path string) error {
	tmp := path + tmpPinSuffix
	if err := os.Remove(tmp); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("remove stale pin %s: %w", tmp, err)
	}
	if err := m.Pin(tmp); err != nil {
		return fmt.Errorf("pin %s: %w", tmp, err)
	}
	if err := os.Rename(tmp, path); err != nil {
		return fmt.Errorf("pin %s: %w", path, err)
	}
	return nil
}

// tmpPinSuffix names a map being migrated before it takes its pin.
const tmpPinSuffix = "_migrating" // bpffs refuses names with a dot

// pinnedMapID is the kernel ID of the map pinned at path.
func pinnedMapID(path string) (uint32, bool) {
	m, err := ebpf.LoadPinnedMap(path, nil)
	if err != nil {
		return 0, false
	}
	defer m.Close()
	return mapID(m)
}

func mapID(m *ebpf.Map) (uint32, bool) {
	info, err := m.Info()
	if err != nil {
		return 0, false
	}
	id, ok := info.ID()
	return uint32(id), ok
}

// recordedVersion is the layout version of m, pinned as name: the one
// recorded for m itself, else 1.
func recordedVersion(meta *ebpf.Map, name string, m *ebpf.Map) uint32 {
	if meta == nil {
		return 1
	}
	if meta.ValueSize() == 4 { // the first builds' record (a reader)
		var v uint32
		if meta.Lookup(layoutKeyOf(name), &v) == nil {
			return v
		}
		return 1
	}
	var r layoutRecord
	if meta.Lookup(layoutKeyOf(name), &r) != nil {
		return 1
	}
	if id, ok := mapID(m); ok && id == r.MapID {
		return r.Version
	}
	return 1
}

// pinnedSpecs are the pinned maps of specs, once each, by name.
func pinnedSpecs(specs []*ebpf.CollectionSpec) map[string]*ebpf.MapSpec {
	out := map[string]*ebpf.MapSpec{}
	for _, spec := range specs {
		for name, ms := range spec.Maps {
			if ms.Pinning == ebpf.PinByName {
				if _, ok := out[name]; !ok {
					out[name] = ms
				}
			}
		}
	}
	return out
}

// reconcileLayouts makes every map pinned in pinDir match specs: a map of
// the same layout is kept; one of another layout or size is migrated
// (stateful maps, through the registered Migrations) or unpinned, so that
// loading creates it afresh. Pins without a recorded version are version
// 1, the layout before versions were recorded. It returns the maps it
// replaced.
func reconcileLayouts(pinDir string, specs []*ebpf.CollectionSpec, migrate bool, log *slog.Logger) ([]string, error) {
	meta, err := openLayoutMap(pinDir, migrate)
	if err != nil {
		return nil, err
	}
	if meta != nil {
		defer meta.Close()
	}
	var replaced []string
	for name, ms := range pinnedSpecs(specs) {
		path := filepath.Join(pinDir, name)
		if migrate {
			if err := finishSwitch(meta, name, path); err != nil {
				return nil, err
			}
		}
		old, err := ebpf.LoadPinnedMap(path, nil)
		if errors.Is(err, os.ErrNotExist) {
			if migrate {
				// Created here with its record, not by the load:
				// a map is never pinned without a record of it.
				if err := createPinned(meta, name, path, ms); err != nil {
					return nil, err
				}
			}
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("open pinned map %s: %w", name, err)
		}
		have := recordedVersion(meta, name, old)
		want := layoutVersion(name)
		incompatible := ms.Compatible(old)
		if have == want && incompatible == nil {
			old.Close()
			continue
		}
		if !migrate {
			old.Close()
			return nil, fmt.Errorf("pinned map %s has layout version %d (%v), this build reads version %d: %w",
				name, have, incompatible, want, ebpf.ErrMapIncompatible)
		}
		n, dropped, err := migrateMap(meta, name, path, old, ms, have, want)
		old.Close()
		if err == nil && n < 0 {
			err = createPinned(meta, name, path, ms)
		}
		if err != nil {
			return nil, err
		}
		replaced = append(replaced, name)
		if n < 0 {
			log.Warn("recreating a pinned map of another layout", "map", name, "version", have, "now", want,
				"difference", fmt.Sprint(incompatible))
		} else {
			log.Info("migrated a pinned map to this agent's layout", "map", name, "version", have, "now", want,
				"entries", n, "dropped", dropped)
		}
	}
	return replaced, nil
}

// migrateMap replaces the map pinned at path (old, at version have) with
// one of ms's layout (version want) holding old's entries converted, and
// returns how many it copied and dropped; -1 when name has no way from
// have to want and the pin was only removed (loading creates it empty).
//
// The switch is atomic and idempotent: the new map is pinned under a
// temporary name, its {version, ID} recorded in meta, then renamed over
// the old pin. A crash before the rename leaves the old map pinned, its
// record not trusted for it... so the migration runs again from the old
// map, whose entries were never converted; after it the new map and its
// record agree. Converting twice is impossible.
func migrateMap(meta *ebpf.Map, name, path string, old *ebpf.Map, ms *ebpf.MapSpec, have, want uint32) (int, int, error) {
	var steps []func(k, v []byte) ([]byte, []byte, bool)
	ok := statefulMaps[name] && have <= want && copyableType(old.Type(), ms.Type) && !isPerCPU(ms.Type)
	for from := have; ok && from < want; from++ {
		m, found := migrations[name][from]
		if !found {
			ok = false
			break
		}
		steps = append(steps, m.Convert)
	}
	if ok && have == want && (old.KeySize() != ms.KeySize || old.ValueSize() != ms.ValueSize) {
		ok = false // a layout change nobody versioned: nothing to convert with
	}
	if !ok {
		if err := os.Remove(path); err != nil {
			return 0, 0, fmt.Errorf("unpin map %s of another layout: %w", name, err)
		}
		return -1, 0, nil
	}
	fresh := ms.Copy()
	fresh.Pinning = ebpf.PinNone
	m, err := ebpf.NewMap(fresh)
	if err != nil {
		return 0, 0, fmt.Errorf("create map %s in the new layout: %w", name, err)
	}
	defer m.Close()
	k, v := make([]byte, old.KeySize()), make([]byte, old.ValueSize())
	copied, dropped := 0, 0
	it := old.Iterate()
	for it.Next(k, v) {
		nk, nv, keep := append([]byte(nil), k...), append([]byte(nil), v...), true
		for _, step := range steps {
			if nk, nv, keep = step(nk, nv); !keep {
				break
			}
		}
		if !keep || len(nk) != int(ms.KeySize) || len(nv) != int(ms.ValueSize) {
			dropped++
			continue
		}
		if err := m.Update(nk, nv, ebpf.UpdateNoExist); err != nil {
			// A smaller map: what does not fit is lost, as the LRU
			// would have lost it.
			dropped++
			continue
		}
		copied++
	}
	if err := it.Err(); err != nil {
		return 0, 0, fmt.Errorf("read map %s to migrate it: %w", name, err)
	}
	// The new map takes the pin; the old one lives on while the programs
	// attached before hold it, and goes with them.
	id, ok := mapID(m)
	if !ok {
		return 0, 0, fmt.Errorf("migrated map %s has no ID", name)
	}
	tmp := path + tmpPinSuffix
	if err := os.Remove(tmp); err != nil && !errors.Is(err, os.ErrNotExist) {
		return 0, 0, fmt.Errorf("remove stale pin %s: %w", tmp, err)
	}
	if err := m.Pin(tmp); err != nil {
		return 0, 0, fmt.Errorf("pin migrated map %s: %w", name, err)
	}
	if err := meta.Put(layoutKeyOf(name), layoutRecord{want, id}); err != nil {
		_ = os.Remove(tmp)
		return 0, 0, fmt.Errorf("record layout of %s: %w", name, err)
	}
	if afterMigrationRecordForTest != nil {
		if err := afterMigrationRecordForTest(name); err != nil {
			return 0, 0, err // a crash, for a test: the pins stay as they are
		}
	}
	if err := os.Rename(tmp, path); err != nil {
		return 0, 0, fmt.Errorf("pin migrated map %s: %w", name, err)
	}
	return copied, dropped, nil
}

// copyableType tells whether entries of a map of type from can be copied
// as they are into one of type to: the same type, or an LRU hash become a
// plain hash (lace_snat: an eviction there handed a live flow's port away).
func copyableType(from, to ebpf.MapType) bool {
	return from == to || (from == ebpf.LRUHash && to == ebpf.Hash)
}

func isPerCPU(t ebpf.MapType) bool {
	return t == ebpf.PerCPUArray || t == ebpf.PerCPUHash || t == ebpf.LRUCPUHash
}

// unpinned names the pinned maps of specs that have no pin yet.
func unpinned(pinDir string, specs []*ebpf.CollectionSpec) map[string]bool {
	out := map[string]bool{}
	for name := range pinnedSpecs(specs) {
		if _, err := os.Stat(filepath.Join(pinDir, name)); errors.Is(err, os.ErrNotExist) {
			out[name] = true
		}
	}
	return out
}

// recordLayouts records this build's layout version of the pinned maps
// which says, each with the ID of the map pinned now.
func recordLayouts(pinDir string, specs []*ebpf.CollectionSpec, which func(string) bool) error {
	var names []string
	for name := range pinnedSpecs(specs) {
		if which(name) {
			names = append(names, name)
		}
	}
	if len(names) == 0 {
		return nil
	}
	meta, err := openLayoutMap(pinDir, true)
	if err != nil {
		return err
	}
	defer meta.Close()
	for _, name := range names {
		id, ok := pinnedMapID(filepath.Join(pinDir, name))
		if !ok {
			continue
		}
		if err := meta.Put(layoutKeyOf(name), layoutRecord{layoutVersion(name), id}); err != nil {
			return fmt.Errorf("record layout of %s: %w", name, err)
		}
	}
	return nil
}

// finishSwitch completes a switch a crash interrupted: a map pinned under
// the temporary name whose ID the record names is the converted one and
// takes the pin; any other is a leftover and goes.
func finishSwitch(meta *ebpf.Map, name, path string) error {
	tmp := path + tmpPinSuffix
	id, ok := pinnedMapID(tmp)
	if !ok {
		if err := os.Remove(tmp); err != nil && !errors.Is(err, os.ErrNotExist) {
			return fmt.Errorf("remove stale pin %s: %w", tmp, err)
		}
		return nil
	}
	var r layoutRecord
	if meta.Lookup(layoutKeyOf(name), &r) == nil && r.MapID == id {
		if err := os.Rename(tmp, path); err != nil {
			return fmt.Errorf("finish the switch of map %s: %w", name, err)
		}
		return nil
	}
	if err := os.Remove(tmp); err != nil {
		return fmt.Errorf("remove stale pin %s: %w", tmp, err)
	}
	return nil
}

// createPinned creates name's map of ms's layout, records it and pins it
// at path (in that order: a crash leaves no pin without its record).
func createPinned(meta *ebpf.Map, name, path string, ms *ebpf.MapSpec) error {
	fresh := ms.Copy()
	fresh.Pinning = ebpf.PinNone
	m, err := ebpf.NewMap(fresh)
	if err != nil {
		return fmt.Errorf("create map %s: %w", name, err)
	}
	defer m.Close()
	id, ok := mapID(m)
	if !ok {
		return fmt.Errorf("map %s has no ID", name)
	}
	if err := meta.Put(layoutKeyOf(name), layoutRecord{layoutVersion(name), id}); err != nil {
		return fmt.Errorf("record layout of %s: %w", name, err)
	}
	return pinOver(m, path)
}

// afterMigrationRecordForTest, when set, runs between a migration's
// record and its rename (a test crashes there).
var afterMigrationRecordForTest func(name string) error

// xlbRevFromV2 converts a lace_xlb_rev value of layout version 2 (56
// bytes, flags at 52) to version 3.
func xlbRevFromV2(k, v []byte) ([]byte, []byte, bool) {
	nv := append(append([]byte(nil), v...), make([]byte, 8)...)
	if len(v) == 56 && binary.NativeEndian.Uint32(v[52:56])&xlbRevHalfOpen != 0 {
		binary.NativeEndian.PutUint32(nv[52:56], binary.NativeEndian.Uint32(v[52:56])|xlbRevV2)
	}
	return k, nv, true
}

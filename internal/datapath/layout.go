package datapath

import (
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
	// "lace_ct": 2, with a Migration{Map: "lace_ct", From: 1, ...}.
}

// statefulMaps hold state only the data plane has: kept across a change
// of size (copied), migrated across a change of version when a Migration
// exists. Without one they are recreated, which resets their flows: a
// loss, never a misreading.
var statefulMaps = map[string]bool{
	"lace_ct": true, "lace_ct_new": true, "lace_snat": true, "lace_affinity": true, "lace_sock_rnat": true,
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

// openLayoutMap opens lace_layout, creating it when create is set (else
// a missing one is nil: every map is at version 1).
func openLayoutMap(pinDir string, create bool) (*ebpf.Map, error) {
	if !create {
		m, err := ebpf.LoadPinnedMap(filepath.Join(pinDir, layoutMapName), nil)
		if errors.Is(err, os.ErrNotExist) {
			return nil, nil
		}
		return m, err
	}
	m, err := ebpf.NewMapWithOptions(&ebpf.MapSpec{Name: layoutMapName, Type: ebpf.Hash, KeySize: 32, ValueSize: 4,
		MaxEntries: 256, Pinning: ebpf.PinByName}, ebpf.MapOptions{PinPath: pinDir})
	if err != nil {
		return nil, fmt.Errorf("open %s: %w", layoutMapName, err)
	}
	return m, nil
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
		old, err := ebpf.LoadPinnedMap(path, nil)
		if errors.Is(err, os.ErrNotExist) {
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("open pinned map %s: %w", name, err)
		}
		have := uint32(1)
		var v uint32
		if meta != nil && meta.Lookup(layoutKeyOf(name), &v) == nil {
			have = v
		}
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
		n, dropped, err := migrateMap(name, path, old, ms, have, want)
		old.Close()
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
func migrateMap(name, path string, old *ebpf.Map, ms *ebpf.MapSpec, have, want uint32) (int, int, error) {
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
	if err := os.Remove(path); err != nil {
		return 0, 0, fmt.Errorf("unpin map %s: %w", name, err)
	}
	if err := m.Pin(path); err != nil {
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
// which says.
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
		if err := meta.Put(layoutKeyOf(name), layoutVersion(name)); err != nil {
			return fmt.Errorf("record layout of %s: %w", name, err)
		}
	}
	return nil
}

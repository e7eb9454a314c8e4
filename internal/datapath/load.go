package datapath

import (
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"

	"github.com/cilium/ebpf"
)

// MapSizes sets the number of entries of the maps whose size depends on
// the cluster (the chart's values). Zero keeps the size the pinned map
// has, or else the compiled one.
type MapSizes struct {
	// Services is lace_services: one entry per VIP, protocol and port.
	Services uint32
	// Backends is lace_backends: one entry per endpoint of every service
	// port, plus one per external frontend.
	Backends uint32
	// SourceRanges is lace_src_ranges (loadBalancerSourceRanges).
	SourceRanges uint32
	// Conntrack is lace_ct, the flows of the node's pods.
	Conntrack uint32
	// Fragments is lace_frags: the ports of datagrams whose later
	// fragments are still to come (frag.h).
	Fragments uint32
}

func (s MapSizes) of(name string) uint32 {
	switch name {
	case "lace_services":
		return s.Services
	case "lace_backends":
		return s.Backends
	case "lace_src_ranges":
		return s.SourceRanges
	case "lace_ct":
		return s.Conntrack
	case "lace_frags":
		return s.Fragments
	}
	return 0
}

// LoadOptions are the node's choices for Load.
type LoadOptions struct {
	Sizes MapSizes
	// Migrate lets Load migrate or recreate pinned maps of another
	// layout (the agent, the one writer). Without it (lacectl, tests)
	// such a map is an error: a reader never changes what it reads.
	Migrate bool
	// Log receives what is done to pinned maps of another layout (nil:
	// slog's default).
	Log *slog.Logger
}

// Load loads the programs and opens (or creates) the maps pinned in pinDir,
// which must be on a bpffs mount. State already pinned there is kept, at
// the sizes it has; pinned maps of another layout are an error (LoadWith
// with Migrate is the agent's load).
func Load(pinDir string) (*Datapath, error) { return LoadWith(pinDir, LoadOptions{}) }

// LoadWith is Load with the node's map sizes. A pinned map of another
// layout (version, key or value size, or a size the options change) is
// migrated or recreated first (reconcileLayouts), never misread.
func LoadWith(pinDir string, o LoadOptions) (*Datapath, error) {
	if err := os.MkdirAll(filepath.Join(pinDir, "links"), 0o700); err != nil {
		return nil, fmt.Errorf("create pin dir: %w", err)
	}
	log := o.Log
	if log == nil {
		log = slog.Default()
	}
	podSpec, err := loadPod()
	if err != nil {
		return nil, err
	}
	underlaySpec, err := loadUnderlay()
	if err != nil {
		return nil, err
	}
	sockSpec, err := loadSock()
	if err != nil {
		return nil, err
	}
	l2Spec, err := loadL2()
	if err != nil {
		return nil, err
	}
	specs := []*ebpf.CollectionSpec{podSpec, underlaySpec, sockSpec, l2Spec}
	if err := sizeMaps(pinDir, specs, o.Sizes); err != nil {
		return nil, err
	}
	fresh := unpinned(pinDir, specs)
	// What the agent before this one programmed, read before a resize
	// recreates the services map: the services' budget starts from it.
	var programmed map[ServiceKey]ProgrammedFrontend
	if o.Migrate {
		if programmed, err = snapshotFrontends(pinDir, podSpec.Maps, log); err != nil {
			return nil, err
		}
	}
	replaced, err := reconcileLayouts(pinDir, specs, o.Migrate, log)
	if err != nil {
		return nil, err
	}
	d := &Datapath{pinDir: pinDir, replacedMaps: replaced, programmed: programmed}
	opts := &ebpf.CollectionOptions{Maps: ebpf.MapOptions{PinPath: pinDir}}
	if err := podSpec.LoadAndAssign(&d.pod, opts); err != nil {
		return nil, fmt.Errorf("load pod programs: %w", verifierDetail(err))
	}
	if err := underlaySpec.LoadAndAssign(&d.underlay, opts); err != nil {
		d.pod.Close()
		return nil, fmt.Errorf("load underlay programs: %w", verifierDetail(err))
	}
	if err := sockSpec.LoadAndAssign(&d.sock, opts); err != nil {
		d.pod.Close()
		d.underlay.Close()
		return nil, fmt.Errorf("load socket programs: %w", verifierDetail(err))
	}
	if err := l2Spec.LoadAndAssign(&d.l2, opts); err != nil {
		d.pod.Close()
		d.underlay.Close()
		d.sock.Close()
		return nil, fmt.Errorf("load l2 programs: %w", verifierDetail(err))
	}
	// A frame of an l2 port to its gateway continues in this from_pod;
	// ports still running an older from_l2 jump to it too (the slot is
	// pinned).
	if err := d.l2.LaceL2Jump.Update(uint32(0), d.pod.FromPod, ebpf.UpdateAny); err != nil {
		d.Close()
		return nil, fmt.Errorf("set the l2 ports' route to from_pod: %w", err)
	}
	d.newTables()
	// The agent records every map's layout; a reader those it created.
	if err := recordLayouts(pinDir, specs, func(name string) bool { return o.Migrate || fresh[name] }); err != nil {
		d.Close()
		return nil, err
	}
	return d, nil
}

// sizeMaps sets the size of every map: the option's, else the pinned
// map's (a reader such as lacectl or a test, loading without options,
// adopts what the agent chose instead of fighting it), else the compiled
// one.
func sizeMaps(pinDir string, specs []*ebpf.CollectionSpec, sizes MapSizes) error {
	for _, spec := range specs {
		for name, ms := range spec.Maps {
			if n := sizes.of(name); n > 0 {
				ms.MaxEntries = n
				continue
			}
			if ms.Pinning != ebpf.PinByName {
				continue
			}
			m, err := ebpf.LoadPinnedMap(filepath.Join(pinDir, name), nil)
			if errors.Is(err, os.ErrNotExist) {
				continue
			}
			if err != nil {
				return fmt.Errorf("open pinned map %s: %w", name, err)
			}
			// Only the size is adopted: a map of another type or
			// entry size is a layout change, judged by reconcileLayouts.
			if ms.Type != ebpf.Array && ms.Type != ebpf.PerCPUArray && m.Type() == ms.Type &&
				m.KeySize() == ms.KeySize && m.ValueSize() == ms.ValueSize {
				ms.MaxEntries = m.MaxEntries()
			}
			m.Close()
		}
	}
	return nil
}

// MapCapacity is the number of entries lace_services, lace_backends and
// lace_src_ranges hold: the totals of the services' budget.
func (d *Datapath) MapCapacity() (services, backends, sourceRanges int) {
	return int(d.pod.LaceServices.MaxEntries()), int(d.pod.LaceBackends.MaxEntries()), int(d.pod.LaceSrcRanges.MaxEntries())
}

// ReplacedMaps names the pinned maps this Load migrated or recreated: the
// programs attached before it still use the old ones until they are
// attached again (AttachPod, AttachUnderlay, AttachHostSockets).
func (d *Datapath) ReplacedMaps() []string { return d.replacedMaps }

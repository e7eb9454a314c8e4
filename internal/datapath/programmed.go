package datapath

import (
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"

	"github.com/cilium/ebpf"
)

// ProgrammedFrontend is one lace_services entry as the agent before this
// one left it: what it takes of the maps. A restarted agent seeds its
// services' budget with these (what each Service was admitted with), so a
// restart never changes which Services are programmed.
type ProgrammedFrontend struct {
	// External: a NodePort, external IP or load balancer frontend, which
	// also takes a backend entry for its ClusterIP reference.
	External bool
	// Backends is the frontend's count of endpoints.
	Backends int
	// SourceRanges is how many lace_src_ranges entries it has.
	SourceRanges int
}

// ProgrammedFrontends are the frontends lace_services held when this
// Datapath was loaded by the agent (LoadOptions.Migrate), before anything
// was written: read before the maps' layouts were reconciled, so a
// resize by the chart (the map recreated empty) keeps them. Nil when
// there was nothing pinned (a first start, a reboot) or when the pinned
// map is of another layout version, which this build cannot read
// faithfully.
func (d *Datapath) ProgrammedFrontends() map[ServiceKey]ProgrammedFrontend { return d.programmed }

// snapshotFrontends reads the pinned lace_services and lace_src_ranges in
// this build's layout (version, type, key and value sizes; their number
// of entries may differ). A map that is absent or of another layout
// yields nil.
func snapshotFrontends(pinDir string, maps map[string]*ebpf.MapSpec, log *slog.Logger) (map[ServiceKey]ProgrammedFrontend, error) {
	meta, err := openLayoutMap(pinDir, false)
	if err != nil {
		return nil, err
	}
	if meta != nil {
		defer meta.Close()
	}
	open := func(name string) (*ebpf.Map, error) {
		ms := maps[name]
		if ms == nil {
			return nil, fmt.Errorf("no map %s in the programs", name)
		}
		m, err := ebpf.LoadPinnedMap(filepath.Join(pinDir, name), nil)
		if errors.Is(err, os.ErrNotExist) {
			return nil, nil
		}
		if err != nil {
			return nil, fmt.Errorf("open pinned map %s: %w", name, err)
		}
		if v := recordedVersion(meta, name, m); v != layoutVersion(name) || m.Type() != ms.Type ||
			m.KeySize() != ms.KeySize || m.ValueSize() != ms.ValueSize {
			log.Warn("a pinned services map is of another layout: the services' budget starts from their age alone",
				"map", name, "version", v, "now", layoutVersion(name))
			m.Close()
			return nil, nil
		}
		return m, nil
	}
	svcs, err := open("lace_services")
	if err != nil || svcs == nil {
		return nil, err
	}
	defer svcs.Close()
	ranges := map[uint32]int{}
	rm, err := open("lace_src_ranges")
	if err != nil {
		return nil, err
	}
	if rm != nil {
		defer rm.Close()
		if err := readMap(rm, func(k podSrcRangeKey, _ uint32) { ranges[k.Id]++ }); err != nil {
			return nil, fmt.Errorf("read lace_src_ranges: %w", err)
		}
	}
	out := map[ServiceKey]ProgrammedFrontend{}
	err = readMap(svcs, func(k podSvcKey, v podSvcVal) {
		p := ProgrammedFrontend{External: v.Flags&svcExternal != 0, Backends: int(v.Count)}
		if p.External {
			p.SourceRanges = ranges[v.Id]
		}
		out[ServiceKey{VIP: fromAddr16(k.Family, k.Vip), Proto: k.Proto, Port: ntohs(k.Port)}] = p
	})
	if err != nil {
		return nil, fmt.Errorf("read lace_services: %w", err)
	}
	return out, nil
}

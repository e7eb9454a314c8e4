package model

import (
	"slices"

	"github.com/lace-cni/lace/internal/tables"
)

// ServiceChanges says how a merge's Services differ from the merges before
// it, so that the data plane visits what changed instead of every
// frontend. Gen numbers the merge (0: not known, compare everything);
// Log[i] lists the frontends whose entries may differ between merge
// Log[i].Base and the next one in the log, the last one being Gen.
//
// Extra are the keys at which the node's list differs from merge Gen's
// own: the NodePorts the gate changed and the hostPorts. The data plane
// visits them, and those of the list it applied before, beside the log's:
// the gate and the hostPorts change with what the merge does not number
// (the views, the node's pods).
type ServiceChanges struct {
	Gen   uint64
	Log   []ServiceChange
	Extra []tables.FrontendKey
}

// ServiceChange is one merge's step from Base: the frontends (added,
// changed or removed) whose entries may differ, sorted.
type ServiceChange struct {
	Base uint64
	Keys []tables.FrontendKey
}

// maxServiceLog is how many merges back a ServiceChanges reaches: an
// applier that fell further behind compares everything.
const maxServiceLog = 16

// Since are the frontends whose entries may differ between merge gen and
// this one, sorted and each once; ok is false when the log does not
// reach back to gen (the caller compares everything).
func (c ServiceChanges) Since(gen uint64) (keys []tables.FrontendKey, ok bool) {
	if gen == 0 || c.Gen == 0 {
		return nil, false
	}
	if gen == c.Gen {
		return []tables.FrontendKey{}, true
	}
	i := slices.IndexFunc(c.Log, func(ch ServiceChange) bool { return ch.Base == gen })
	if i < 0 {
		return nil, false
	}
	if i == len(c.Log)-1 {
		return c.Log[i].Keys, true
	}
	keys = []tables.FrontendKey{} // steps that changed nothing: none, not "everything"
	for _, ch := range c.Log[i:] {
		keys = append(keys, ch.Keys...)
	}
	slices.SortFunc(keys, tables.FrontendKey.Compare)
	return slices.Compact(keys), true
}

// Next is the changes of the merge after c's, numbered gen: keys when the
// merge was a step from c's (nil: a whole merge, which starts a new log).
func (c ServiceChanges) Next(gen uint64, keys []tables.FrontendKey) ServiceChanges {
	if keys == nil || c.Gen == 0 {
		return ServiceChanges{Gen: gen}
	}
	log := c.Log[max(0, len(c.Log)-(maxServiceLog-1)):]
	// A new array: an earlier state keeps its own log.
	return ServiceChanges{Gen: gen, Log: append(slices.Clip(log), ServiceChange{Base: c.Gen, Keys: keys})}
}

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
// The node's list differs from merge Gen's own at the keys of Gated, the
// NodePorts the gate closed (sorted; their entries are the merge's with
// Closed set), and of HostPorts, the hostPorts' entries: both change
// with what the merge does not number (the views, the node's pods).
type ServiceChanges struct {
	Gen       uint64
	Log       []ServiceChange
	Gated     []tables.FrontendKey
	HostPorts []tables.FrontendKey
}

// Same: the node's list is the one of was, entry for entry (the same
// merge, closed alike, no hostPorts in either).
func (c ServiceChanges) Same(was ServiceChanges) bool {
	return c.Gen != 0 && c.Gen == was.Gen && len(c.HostPorts) == 0 && len(was.HostPorts) == 0 && slices.Equal(c.Gated, was.Gated)
}

// Between are the frontends whose entries may differ between the list
// of was (applied) and this one, each once or more; ok is false when the
// log does not reach back to was's merge (the caller compares
// everything). A NodePort closed in both lists is the same entry unless
// the merge changed it (then the log names it): only one closed in one
// of them is visited, so that closed NodePorts cost nothing while they
// stay closed. A hostPort's entry may change at its key: every one is.
func (c ServiceChanges) Between(was ServiceChanges) (keys []tables.FrontendKey, ok bool) {
	keys, ok = c.Since(was.Gen)
	if !ok {
		return nil, false
	}
	extra := symmetricDifference(c.Gated, was.Gated)
	if len(extra)+len(c.HostPorts)+len(was.HostPorts) == 0 {
		return keys, true
	}
	// Clipped: Since may give the log's own array.
	return append(append(append(slices.Clip(keys), extra...), c.HostPorts...), was.HostPorts...), true
}

// symmetricDifference are the keys in one of a and b (both sorted) only.
func symmetricDifference(a, b []tables.FrontendKey) []tables.FrontendKey {
	var out []tables.FrontendKey
	for len(a) > 0 && len(b) > 0 {
		switch c := a[0].Compare(b[0]); {
		case c < 0:
			out, a = append(out, a[0]), a[1:]
		case c > 0:
			out, b = append(out, b[0]), b[1:]
		default:
			a, b = a[1:], b[1:]
		}
	}
	return append(append(out, a...), b...)
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

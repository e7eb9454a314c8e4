package model

// FirstSet maps each key to a set of values, the first value kept apart:
// most keys have one (a pod address is held by one NetworkEndpoint and
// looked up by one Service), and those cost no set, while a key with many
// values costs no scan to change. The zero value is not usable: use
// NewFirstSet.
type FirstSet[K, V comparable] struct {
	first map[K]V
	more  map[K]map[V]struct{}
}

// NewFirstSet is an empty FirstSet.
func NewFirstSet[K, V comparable]() FirstSet[K, V] {
	return FirstSet[K, V]{first: map[K]V{}, more: map[K]map[V]struct{}{}}
}

// Add puts v in k's set.
func (m FirstSet[K, V]) Add(k K, v V) {
	if f, ok := m.first[k]; !ok {
		m.first[k] = v
	} else if f != v {
		if m.more[k] == nil {
			m.more[k] = map[V]struct{}{}
		}
		m.more[k][v] = struct{}{}
	}
}

// Has tells whether k's set has a value.
func (m FirstSet[K, V]) Has(k K) bool {
	_, ok := m.first[k]
	return ok
}

// Remove takes v out of k's set.
func (m FirstSet[K, V]) Remove(k K, v V) {
	more := m.more[k]
	if _, ok := more[v]; ok {
		delete(more, v)
	} else if f, ok := m.first[k]; ok && f == v {
		delete(m.first, k)
		for next := range more {
			m.first[k] = next
			delete(more, next)
			break
		}
	}
	if len(more) == 0 {
		delete(m.more, k)
	}
}

// Each calls fn with k's values (the first one first, the others in no
// order) until it returns false.
func (m FirstSet[K, V]) Each(k K, fn func(V) bool) {
	f, ok := m.first[k]
	if !ok || !fn(f) {
		return
	}
	for v := range m.more[k] {
		if !fn(v) {
			return
		}
	}
}

package applier

import "errors"

// SyncSet upserts what is wanted and missing and deletes what is extra.
func SyncSet[T comparable](cur, want []T, upsert, del func(T) error) error {
	return SyncListEq(cur, want, func(t T) T { return t }, upsert, del)
}

// SyncListEq is SyncList for items compared with ==.
func SyncListEq[T comparable, K comparable](cur, want []T, key func(T) K, upsert, del func(T) error) error {
	return SyncList(cur, want, key, func(a, b T) bool { return a == b }, upsert, del)
}

// SyncList upserts wanted items that are missing or differ (by eq), and
// deletes current items whose key is not wanted.
func SyncList[T any, K comparable](cur, want []T, key func(T) K, eq func(a, b T) bool, upsert, del func(T) error) error {
	have := make(map[K]T, len(cur))
	for _, c := range cur {
		have[key(c)] = c
	}
	wanted := make(map[K]bool, len(want))
	var errs []error
	for _, w := range want {
		k := key(w)
		wanted[k] = true
		if c, ok := have[k]; ok && eq(c, w) {
			continue
		}
		errs = append(errs, upsert(w))
	}
	for k, c := range have {
		if !wanted[k] {
			errs = append(errs, del(c))
		}
	}
	return errors.Join(errs...)
}

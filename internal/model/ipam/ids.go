package ipam

// NextID picks a network ID in [1, max] that is not in used. It prefers the
// ID after the highest one in use, so that the ID of a recently deleted
// network is not handed out again while stale state may still name it, and
// wraps to the lowest free ID when the top is reached. It returns false when
// every ID is used.
func NextID(used map[int32]bool, max int32) (int32, bool) {
	var hi int32
	for id := range used {
		if id > hi {
			hi = id
		}
	}
	if hi < max {
		return hi + 1, true
	}
	for id := int32(1); id <= max; id++ {
		if !used[id] {
			return id, true
		}
	}
	return 0, false
}

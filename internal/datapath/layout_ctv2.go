//go:build lace_ctv2

package datapath

import "encoding/binary"

// The test build lace_ctv2 (gen.go) has a conntrack value that starts
// with a stamp: version 2 of lace_ct, migrated from the release's
// version 1 by shifting the value and stamping it. It is what a real
// layout change registers.
func init() {
	layoutVersions["lace_ct"] = 2
	RegisterMigration(Migration{Map: "lace_ct", From: 1, Convert: func(k, v []byte) ([]byte, []byte, bool) {
		nv := make([]byte, 8+len(v))
		binary.LittleEndian.PutUint64(nv, CTv2Stamp)
		copy(nv[8:], v)
		return k, nv, true
	}})
}

// CTv2Stamp marks the flows the lace_ctv2 build migrated.
const CTv2Stamp = 0x1ace_c7_02

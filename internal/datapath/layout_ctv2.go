//go:build lace_ctv2

package datapath

// The test build lace_ctv2 (gen.go) has a conntrack value with expires
// moved after the flags: the next version of lace_ct, of the same size as
// the release's, which it would misread without the version. The
// migration moves the bytes. It is what a real layout change registers.
// It is one version past the release's, whatever that is, for both maps
// of struct ct_val.
func init() {
	for _, name := range []string{"lace_ct", "lace_ct_new", "lace_ct_local"} {
		release := layoutVersion(name)
		layoutVersions[name] = release + 1
		RegisterMigration(Migration{Map: name, From: release, Convert: func(k, v []byte) ([]byte, []byte, bool) {
			nv := append([]byte(nil), v...)
			copy(nv[0:8], v[8:16]) // peer_net, flags, snat_port
			copy(nv[8:16], v[0:8]) // expires
			return k, nv, true
		}})
	}
}

package datapath

// BumpLayoutForTest makes this process see map name one layout version
// further, reached from the current one by conv, as a new build would;
// the returned function restores the registry.
func BumpLayoutForTest(name string, conv func(k, v []byte) ([]byte, []byte, bool)) (restore func()) {
	old, had := layoutVersions[name]
	from := layoutVersion(name)
	layoutVersions[name] = from + 1
	RegisterMigration(Migration{Map: name, From: from, Convert: conv})
	return func() {
		if had {
			layoutVersions[name] = old
		} else {
			delete(layoutVersions, name)
		}
		delete(migrations[name], from)
	}
}

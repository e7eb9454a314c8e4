// Package fsutil holds the one way Lace replaces a file on disk that
// someone may read at any moment (the agent's state, queued CNI DELs, the
// CNI plugin and config it installs, image tarballs).
package fsutil

import (
	"fmt"
	"io"
	"os"
	"path/filepath"
)

// WriteAtomic replaces path with what fill writes. A reader sees the old
// file or the complete new one, never a partial one, and a crash leaves one
// of the two: the temp file lives in the same directory (rename does not
// cross filesystems), is synced before the rename, and the directory is
// synced after it. On error the temp file is removed and path is left as
// it was.
func WriteAtomic(path string, mode os.FileMode, fill func(io.Writer) error) (err error) {
	f, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".tmp-*")
	if err != nil {
		return err
	}
	defer func() {
		if err != nil {
			f.Close()
			os.Remove(f.Name())
		}
	}()
	if err := fill(f); err != nil {
		return err
	}
	// CreateTemp makes the file 0600; the mode is set explicitly so the
	// umask does not decide it.
	if err := f.Chmod(mode); err != nil {
		return err
	}
	if err := f.Sync(); err != nil {
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	if err := os.Rename(f.Name(), path); err != nil {
		return err
	}
	d, err := os.Open(filepath.Dir(path))
	if err != nil {
		return fmt.Errorf("open %s to sync the rename: %w", filepath.Dir(path), err)
	}
	defer d.Close()
	return d.Sync()
}

package netutil

import (
	"fmt"
	"os"

	"golang.org/x/sys/unix"
)

// EnsureBPFFS makes sure dir is a bpffs mount, mounting a new instance there
// when it is not. Each mount is its own instance, so a lab or a test can
// keep its pins apart from the machine's /sys/fs/bpf.
func EnsureBPFFS(dir string) error {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return fmt.Errorf("create %s: %w", dir, err)
	}
	var st unix.Statfs_t
	if err := unix.Statfs(dir, &st); err != nil {
		return fmt.Errorf("statfs %s: %w", dir, err)
	}
	if st.Type == unix.BPF_FS_MAGIC {
		return nil
	}
	if err := unix.Mount("bpf", dir, "bpf", 0, "mode=0700"); err != nil {
		return fmt.Errorf("mount bpffs on %s: %w", dir, err)
	}
	return nil
}

// UnmountBPFFS unmounts the bpffs at dir (dropping its pins) and removes
// the directory. A dir that is not mounted or is gone is fine.
func UnmountBPFFS(dir string) error {
	var st unix.Statfs_t
	if err := unix.Statfs(dir, &st); err != nil {
		return nil
	}
	if st.Type == unix.BPF_FS_MAGIC {
		if err := unix.Unmount(dir, unix.MNT_DETACH); err != nil {
			return fmt.Errorf("unmount %s: %w", dir, err)
		}
	}
	return os.Remove(dir)
}

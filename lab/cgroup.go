package lab

import (
	"bufio"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// Each node's kubelet gets its own cgroup root (`cgroupRoot` in its
// config), made here in every cgroup hierarchy of the machine, so that the
// nodes' pods never share a cgroup and `down` can find and kill every
// container process a node ran, whatever state its runtime was left in.

// cgroupMounts lists the mount points of the machine's cgroup hierarchies
// (v1 controllers, named v1 hierarchies and cgroup2).
func cgroupMounts() ([]string, error) {
	f, err := os.Open("/proc/self/mounts")
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var out []string
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) >= 3 && (fields[2] == "cgroup" || fields[2] == "cgroup2") {
			out = append(out, fields[1])
		}
	}
	return out, sc.Err()
}

// createCgroupRoot makes name (a top-level cgroup like /lace-lab-x-n1) in
// every hierarchy.
func createCgroupRoot(name string) error { return createCgroup(name) }

// createCgroup makes the cgroup name (a path from the hierarchies' root,
// its parent existing) in every hierarchy. A cpuset cgroup starts with no
// CPUs and no memory nodes, so it gets its parent's.
func createCgroup(name string) error {
	mounts, err := cgroupMounts()
	if err != nil {
		return err
	}
	for _, m := range mounts {
		dir := filepath.Join(m, name)
		if err := os.Mkdir(dir, 0o755); err != nil && !errors.Is(err, fs.ErrExist) {
			return fmt.Errorf("create cgroup %s: %w", dir, err)
		}
		for _, f := range []string{"cpuset.cpus", "cpuset.mems"} {
			b, err := os.ReadFile(filepath.Join(filepath.Dir(dir), f))
			if err != nil {
				continue // not the cpuset hierarchy
			}
			if err := os.WriteFile(filepath.Join(dir, f), b, 0o644); err != nil {
				return fmt.Errorf("set %s of %s: %w", f, dir, err)
			}
		}
	}
	return nil
}

// cgroupProcsFiles are the cgroup.procs files of the cgroup name, one per
// hierarchy: a PID written to each moves that process into name everywhere.
func cgroupProcsFiles(name string) ([]string, error) {
	mounts, err := cgroupMounts()
	if err != nil {
		return nil, err
	}
	out := make([]string, 0, len(mounts))
	for _, m := range mounts {
		out = append(out, filepath.Join(m, name, "cgroup.procs"))
	}
	return out, nil
}

// nodeExecCgroup is the cgroup of the processes `lace-lab exec node/NODE`
// starts: below the node's cgroup root, beside the kubelet's kubepods, as
// a login session sits beside kubepods on a real node. The agent's socket
// hooks, attached to the root, see them; `down` kills them with the node.
func nodeExecCgroup(c Config, node string) string {
	return "/" + cgroupPrefix(c.Name) + node + "/exec"
}

// removeCgroupRoot kills every process in name's subtree, in every
// hierarchy, and removes the cgroups, deepest first. Removing a root that
// does not exist is a no-op.
func removeCgroupRoot(name string) error {
	mounts, err := cgroupMounts()
	if err != nil {
		return err
	}
	var dirs []string
	for _, m := range mounts {
		root := filepath.Join(m, name)
		_ = filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
			if err == nil && d.IsDir() {
				dirs = append(dirs, p)
			}
			return nil
		})
	}
	// Deepest first: a cgroup can be removed only once its children are.
	sort.Slice(dirs, func(i, j int) bool { return strings.Count(dirs[i], "/") > strings.Count(dirs[j], "/") })
	deadline := time.Now().Add(15 * time.Second)
	var errs []error
	for _, d := range dirs {
		for {
			for _, pid := range cgroupPIDs(d) {
				_ = syscall.Kill(pid, syscall.SIGKILL)
			}
			err := syscall.Rmdir(d)
			if err == nil || errors.Is(err, syscall.ENOENT) {
				break
			}
			if time.Now().After(deadline) {
				errs = append(errs, fmt.Errorf("remove cgroup %s: %w", d, err))
				break
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
	return errors.Join(errs...)
}

func cgroupPIDs(dir string) []int {
	b, err := os.ReadFile(filepath.Join(dir, "cgroup.procs"))
	if err != nil {
		return nil
	}
	var out []int
	for _, f := range strings.Fields(string(b)) {
		if pid, err := strconv.Atoi(f); err == nil {
			out = append(out, pid)
		}
	}
	return out
}

// labCgroupRoots lists the node cgroup roots of lab name (of every lab when
// name is empty) that exist.
func labCgroupRoots(name string) []string {
	mounts, _ := cgroupMounts()
	seen := map[string]bool{}
	var out []string
	for _, m := range mounts {
		ents, _ := os.ReadDir(m)
		for _, e := range ents {
			if e.IsDir() && strings.HasPrefix(e.Name(), cgroupPrefix(name)) && !seen[e.Name()] {
				seen[e.Name()] = true
				out = append(out, "/"+e.Name())
			}
		}
	}
	return out
}

func cgroupPrefix(lab string) string {
	if lab == "" {
		return "lace-lab-"
	}
	return "lace-lab-" + lab + "-"
}

// podProcesses lists the machine's PIDs of the processes named comm in
// the pod whose UID is uid, by the kubelet's pod cgroup (pod<uid>, with
// the cgroupfs driver's dashes or the systemd driver's underscores).
func podProcesses(uid, comm string) ([]int, error) {
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return nil, err
	}
	marks := []string{"/pod" + uid + "/", "pod" + strings.ReplaceAll(uid, "-", "_") + ".slice"}
	var pids []int
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		name, err := os.ReadFile(filepath.Join("/proc", e.Name(), "comm"))
		if err != nil || strings.TrimSpace(string(name)) != comm {
			continue
		}
		cg, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cgroup"))
		if err != nil {
			continue
		}
		for _, m := range marks {
			if strings.Contains(string(cg), m) {
				pids = append(pids, pid)
				break
			}
		}
	}
	return pids, nil
}

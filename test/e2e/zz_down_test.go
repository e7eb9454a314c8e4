package e2e

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/lace-cni/lace/internal/netutil"
	"github.com/lace-cni/lace/lab"
)

// TestZLabDownLeavesNothing runs last (go test runs tests in the order of
// their files' names, then of their declarations; this file sorts last):
// down removes every namespace, process, cgroup, mount and file, a second
// down is a no-op, and the root network namespace (nftables included) and
// the machine's mounts are untouched.
func TestZLabDownLeavesNothing(t *testing.T) {
	needLab(t)
	stateDir := lab.Config{Name: labName, StateRoot: lab.DefaultStateRoot}.StateDir()
	if out, err := labCmd("down").CombinedOutput(); err != nil {
		t.Fatalf("lace-lab down: %v\n%s", err, out)
	}
	out, err := labCmd("down").CombinedOutput()
	if err != nil || !strings.Contains(string(out), "nothing to remove") {
		t.Errorf("second down: %v %q, want a no-op", err, out)
	}
	if nss, _ := netutil.ListNamed(labName + "-"); len(nss) > 0 {
		t.Errorf("namespaces left: %v", nss)
	}
	if _, err := os.Stat(stateDir); !os.IsNotExist(err) {
		t.Errorf("state dir %s left (%v)", stateDir, err)
	}
	if procs := labProcesses(labName); len(procs) > 0 {
		t.Errorf("processes left: %v", procs)
	}
	// Containers carry no lab marker: their cgroups (one root per node in
	// every hierarchy) must be gone, and with them every container process.
	if cgs := labCgroups(labName); len(cgs) > 0 {
		t.Errorf("cgroups left: %v", cgs)
	}
	after, err := snapshotRoot()
	if err != nil {
		t.Fatal(err)
	}
	if d := rootBefore.diff(after); len(d) > 0 {
		t.Errorf("root namespace changed:\n%s", strings.Join(d, "\n"))
	}
}

// labCgroups lists the lab's node cgroup roots left in any hierarchy.
func labCgroups(name string) []string {
	var out []string
	mounts, _ := os.ReadFile("/proc/self/mounts")
	for _, l := range strings.Split(string(mounts), "\n") {
		f := strings.Fields(l)
		if len(f) < 3 || (f[2] != "cgroup" && f[2] != "cgroup2") {
			continue
		}
		ents, _ := os.ReadDir(f[1])
		for _, e := range ents {
			if strings.HasPrefix(e.Name(), "lace-lab-"+name+"-") {
				out = append(out, filepath.Join(f[1], e.Name()))
			}
		}
	}
	return out
}

// labProcesses lists processes carrying the lab's marker variable.
func labProcesses(name string) []string {
	var out []string
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		env, err := os.ReadFile(filepath.Join("/proc", e.Name(), "environ"))
		if err != nil {
			continue
		}
		if strings.Contains("\x00"+string(env), "\x00"+lab.EnvLab+"="+name+"\x00") {
			cmd, _ := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
			out = append(out, e.Name()+":"+strings.ReplaceAll(string(cmd), "\x00", " "))
		}
	}
	return out
}

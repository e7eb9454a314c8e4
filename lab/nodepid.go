package lab

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// Each node has its own PID namespace (RunNodeNS): the PIDs its runtime
// reports are numbered there. The machine, which runs the lab and its
// tests, numbers the same processes differently.

// holderPID is the machine's PID of node's holder, the PID 1 of its
// namespaces, from the NodeRoot link (/proc/<holder>/root).
func holderPID(c Config, node string) (int, error) {
	target, err := os.Readlink(c.NodeRoot(node))
	if err != nil {
		return 0, fmt.Errorf("node %s is not running: %w", node, err)
	}
	return strconv.Atoi(filepath.Base(filepath.Dir(target)))
}

// NodePIDNS is the path of node's PID namespace, from the machine.
func NodePIDNS(c Config, node string) (string, error) {
	h, err := holderPID(c, node)
	if err != nil {
		return "", err
	}
	return fmt.Sprintf("/proc/%d/ns/pid", h), nil
}

// nsPIDs is the NSpid line of /proc/<pid>/status: the process's PID in
// its PID namespace and each ancestor namespace, the machine's first.
func nsPIDs(pid int) ([]int, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return nil, err
	}
	for _, l := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(l, "NSpid:"); ok {
			var out []int
			for _, f := range strings.Fields(v) {
				n, err := strconv.Atoi(f)
				if err != nil {
					return nil, err
				}
				out = append(out, n)
			}
			return out, nil
		}
	}
	return nil, fmt.Errorf("no NSpid in /proc/%d/status", pid)
}

// machinePID translates pid, numbered in node's PID namespace, to the
// machine's number: the process whose NSpid has pid at the node's level
// and whose PID namespace is the node's or one below it (a pod's own).
func machinePID(c Config, node string, pid int) (int, error) {
	h, err := holderPID(c, node)
	if err != nil {
		return 0, err
	}
	hp, err := nsPIDs(h)
	if err != nil {
		return 0, err
	}
	level := len(hp) - 1 // the holder is PID 1 at the node's level
	var nodeNS unix.Stat_t
	if err := unix.Stat(fmt.Sprintf("/proc/%d/ns/pid", h), &nodeNS); err != nil {
		return 0, err
	}
	ents, err := os.ReadDir("/proc")
	if err != nil {
		return 0, err
	}
	for _, e := range ents {
		p, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		ids, err := nsPIDs(p)
		if err != nil || len(ids) <= level || ids[level] != pid {
			continue
		}
		if underNS(p, nodeNS) {
			return p, nil
		}
	}
	return 0, fmt.Errorf("no process of node %s has PID %d there", node, pid)
}

// underNS says whether process p's PID namespace is ns or a descendant.
func underNS(p int, ns unix.Stat_t) bool {
	fd, err := unix.Open(fmt.Sprintf("/proc/%d/ns/pid", p), unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return false
	}
	for {
		var st unix.Stat_t
		if unix.Fstat(fd, &st) != nil {
			unix.Close(fd)
			return false
		}
		if st.Dev == ns.Dev && st.Ino == ns.Ino {
			unix.Close(fd)
			return true
		}
		parent, err := unix.IoctlRetInt(fd, unix.NS_GET_PARENT)
		unix.Close(fd)
		if err != nil {
			return false // the machine's namespace, or one we may not see above
		}
		fd = parent
	}
}

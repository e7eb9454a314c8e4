// Package netutil is the only place Lace makes raw netlink calls or switches
// network namespaces. Namespace switches happen only inside Do, which locks
// the OS thread for the duration and refuses to hand the thread back to the
// Go scheduler if it cannot restore the original namespace.
//
// It must never be used to change the root network namespace: callers pass
// the path of a namespace they created, and helpers that create links,
// addresses or routes take a namespace path, never "the current one".
package netutil

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"sort"
	"strings"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

// NetNSDir is where named namespaces are bound, as iproute2 does.
const NetNSDir = "/run/netns"

// Path is the bind-mount path of the named namespace name.
func Path(name string) string { return filepath.Join(NetNSDir, name) }

// CreateNamed creates the named network namespace name with its loopback
// up. An existing namespace of that name is kept as it is.
func CreateNamed(name string) error {
	if Exists(name) {
		return nil
	}
	// iproute2 owns the /run/netns mount conventions (shared propagation),
	// so namespaces it and we create behave the same under `ip netns`.
	if out, err := exec.Command("ip", "netns", "add", name).CombinedOutput(); err != nil {
		if Exists(name) {
			return nil
		}
		return fmt.Errorf("ip netns add %s: %v: %s", name, err, strings.TrimSpace(string(out)))
	}
	return Do(Path(name), func() error {
		lo, err := netlink.LinkByName("lo")
		if err != nil {
			return fmt.Errorf("find lo: %w", err)
		}
		return netlink.LinkSetUp(lo)
	})
}

// Exists reports whether the named namespace exists.
func Exists(name string) bool {
	var st unix.Statfs_t
	if err := unix.Statfs(Path(name), &st); err != nil {
		return false
	}
	// A bound namespace file lives on nsfs; a leftover plain file does not.
	return st.Type == unix.NSFS_MAGIC
}

// DeleteNamed removes the named namespace. A missing namespace is success.
func DeleteNamed(name string) error {
	p := Path(name)
	if _, err := os.Stat(p); errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if out, err := exec.Command("ip", "netns", "delete", name).CombinedOutput(); err != nil {
		if _, serr := os.Stat(p); errors.Is(serr, os.ErrNotExist) {
			return nil
		}
		// A leftover file that is no longer a mount point.
		_ = unix.Unmount(p, unix.MNT_DETACH)
		if rerr := os.Remove(p); rerr != nil && !errors.Is(rerr, os.ErrNotExist) {
			return fmt.Errorf("ip netns delete %s: %v: %s", name, err, strings.TrimSpace(string(out)))
		}
	}
	return nil
}

// ListNamed returns the named namespaces whose names start with prefix.
func ListNamed(prefix string) ([]string, error) {
	ents, err := os.ReadDir(NetNSDir)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("list %s: %w", NetNSDir, err)
	}
	var out []string
	for _, e := range ents {
		if strings.HasPrefix(e.Name(), prefix) {
			out = append(out, e.Name())
		}
	}
	sort.Strings(out)
	return out, nil
}

// Do runs fn with the calling goroutine's OS thread in the network
// namespace at nsPath, then switches back. Goroutines started by fn do not
// inherit the namespace.
func Do(nsPath string, fn func() error) error {
	target, err := netns.GetFromPath(nsPath)
	if err != nil {
		return fmt.Errorf("open netns %s: %w", nsPath, err)
	}
	defer target.Close()

	runtime.LockOSThread()
	orig, err := netns.Get()
	if err != nil {
		runtime.UnlockOSThread()
		return fmt.Errorf("open current netns: %w", err)
	}
	defer orig.Close()
	if err := netns.Set(target); err != nil {
		runtime.UnlockOSThread()
		return fmt.Errorf("enter netns %s: %w", nsPath, err)
	}
	fnErr := fn()
	if err := netns.Set(orig); err != nil {
		// Leave the thread locked: the runtime discards it when this
		// goroutine exits, so no other goroutine runs in the wrong namespace.
		return errors.Join(fnErr, fmt.Errorf("restore netns: %w", err))
	}
	runtime.UnlockOSThread()
	return fnErr
}

// Handle returns a netlink handle operating in the namespace at nsPath.
func Handle(nsPath string) (*netlink.Handle, error) {
	ns, err := netns.GetFromPath(nsPath)
	if err != nil {
		return nil, fmt.Errorf("open netns %s: %w", nsPath, err)
	}
	defer ns.Close()
	h, err := netlink.NewHandleAt(ns)
	if err != nil {
		return nil, fmt.Errorf("netlink handle in %s: %w", nsPath, err)
	}
	return h, nil
}

// DialContext opens a connection from inside the namespace at nsPath. The
// socket is created in that namespace and stays there; only the socket
// creation runs on the switched thread.
func DialContext(ctx context.Context, nsPath, network, addr string) (net.Conn, error) {
	var conn net.Conn
	err := Do(nsPath, func() error {
		var d net.Dialer
		c, err := d.DialContext(ctx, network, addr)
		conn = c
		return err
	})
	return conn, err
}

// Sysctl writes value to /proc/sys/<key> (dots as separators) inside the
// namespace at nsPath; network sysctls are per namespace.
func Sysctl(nsPath, key, value string) error {
	return Do(nsPath, func() error {
		p := filepath.Join("/proc/sys", strings.ReplaceAll(key, ".", "/"))
		if err := os.WriteFile(p, []byte(value), 0o644); err != nil {
			return fmt.Errorf("sysctl %s=%s: %w", key, value, err)
		}
		return nil
	})
}

// Listen opens a listening socket inside the namespace at nsPath; it keeps
// accepting there whatever thread calls Accept.
func Listen(nsPath, network, addr string) (net.Listener, error) {
	var ln net.Listener
	err := Do(nsPath, func() error {
		l, err := net.Listen(network, addr)
		ln = l
		return err
	})
	return ln, err
}

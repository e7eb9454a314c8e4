package lab

import (
	"errors"
	"fmt"
	"net/netip"
	"strings"

	"github.com/lace-cni/lace/internal/netutil"
)

// fabricBridge joins every host of the lab on one L2 segment.
const fabricBridge = "br0"

// setupNetwork creates the fabric, node and external namespaces and wires
// them. It is idempotent.
func setupNetwork(c Config) error {
	fabric := c.NetNS("fabric")
	if err := netutil.CreateNamed(fabric); err != nil {
		return err
	}
	if err := netutil.EnsureBridge(netutil.Path(fabric), fabricBridge); err != nil {
		return err
	}
	// The fabric namespace is also where the control plane sits on the
	// fabric: the API server's relay listens on these addresses and the
	// API server's connections to kubelets leave from here.
	av4, av6 := APIServerAddrs()
	for _, a := range []netip.Prefix{netip.PrefixFrom(av4, UnderlayV4.Bits()), netip.PrefixFrom(av6, UnderlayV6.Bits())} {
		if err := netutil.EnsureAddr(netutil.Path(fabric), fabricBridge, a); err != nil {
			return fmt.Errorf("fabric address: %w", err)
		}
	}
	attach := func(ns, fabricEnd string, v4, v6 netip.Addr) error {
		if err := netutil.CreateNamed(ns); err != nil {
			return err
		}
		if err := netutil.EnsureVeth(netutil.VethSpec{
			NSPath: netutil.Path(fabric), Name: fabricEnd, Master: fabricBridge,
			PeerNSPath: netutil.Path(ns), PeerName: "eth0",
		}); err != nil {
			return err
		}
		for _, a := range []netip.Prefix{netip.PrefixFrom(v4, UnderlayV4.Bits()), netip.PrefixFrom(v6, UnderlayV6.Bits())} {
			if err := netutil.EnsureAddr(netutil.Path(ns), "eth0", a); err != nil {
				return err
			}
		}
		return nil
	}
	for i := 1; i <= c.Nodes; i++ {
		v4, v6 := NodeUnderlay(i)
		ns := c.NetNS(c.NodeName(i))
		if err := attach(ns, c.NodeName(i), v4, v6); err != nil {
			return fmt.Errorf("node %s: %w", c.NodeName(i), err)
		}
		for _, kv := range [][2]string{
			{"net.ipv4.ip_forward", "1"},
			{"net.ipv6.conf.all.forwarding", "1"},
		} {
			if err := netutil.Sysctl(netutil.Path(ns), kv[0], kv[1]); err != nil {
				return fmt.Errorf("node %s: %w", c.NodeName(i), err)
			}
		}
	}
	v4, v6 := ExternalUnderlay()
	if err := attach(c.NetNS("external"), "ext", v4, v6); err != nil {
		return fmt.Errorf("external host: %w", err)
	}
	return nil
}

// labNamespaces lists the namespaces of lab name that exist.
func labNamespaces(name string) ([]string, error) {
	all, err := netutil.ListNamed(name + "-")
	if err != nil {
		return nil, err
	}
	var out []string
	for _, ns := range all {
		if isLabNetNS(name, ns) {
			out = append(out, ns)
		}
	}
	return out, nil
}

// isLabNetNS tells whether ns is one of the names a lab called name gives
// its namespaces, so that cleanup never removes someone else's namespace.
func isLabNetNS(name, ns string) bool {
	role, ok := strings.CutPrefix(ns, name+"-")
	if !ok {
		return false
	}
	switch {
	case role == "fabric" || role == "external":
		return true
	case strings.HasPrefix(role, "n"):
		for _, r := range role[1:] {
			if r < '0' || r > '9' {
				return false
			}
		}
		return len(role) > 1
	}
	return false
}

// teardownNetwork removes every namespace of the lab.
func teardownNetwork(name string) error {
	nss, err := labNamespaces(name)
	if err != nil {
		return err
	}
	var errs []error
	for _, ns := range nss {
		errs = append(errs, netutil.DeleteNamed(ns))
	}
	return errors.Join(errs...)
}

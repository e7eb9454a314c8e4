package main

import (
	"fmt"
	"net/netip"

	"github.com/lace-cni/lace/internal/netutil"
	"github.com/lace-cni/lace/internal/podnet"
	"github.com/lace-cni/lace/lab"
)

// twin is the peer of the forwarding benchmark: the namespaces and links of
// a lab's pod paths, routed by the kernel without encapsulation.
//
//	pod a ─┐                                          ┌─ pod c
//	pod b ─┴─ node 1 ── eth0 ═ fabric br0 ═ eth0 ── node 2
//
// As in the lab, the nodes are namespaces joined by veths (MTU 1500) to a
// bridge in a fabric namespace, on the lab's underlay IPv4 addresses; the
// pods are wired by podnet.Setup, the code the Lace agent wires its pods
// with (veth of the pod MTU, /32 address, default route via the block's
// gateway, permanent neighbours both ways, a /32 route on the node). What
// differs is only the forwarding: the nodes route with IPv4 forwarding on,
// node 1 sends node 2's block via node 2's fabric address and back, where
// Lace's eBPF encapsulates in SRv6 and redirects.
type twin struct {
	a, b, c      string // pod namespace paths: a and b on node 1, c on node 2
	bAddr, cAddr netip.Addr
	// nodes and fabric are the other namespace paths, for inspection.
	nodes  [2]string
	fabric string
}

// Twin addresses: node i's pods are in 10.250.i.0/24, gateway .1. The
// underlay addresses are the lab's, in namespaces of their own.
var twinBlocks = [2]netip.Prefix{netip.MustParsePrefix("10.250.1.0/24"), netip.MustParsePrefix("10.250.2.0/24")}

// scratch creates namespaces for a peer and removes exactly those it
// created: a name that already exists is an error, never reused, so that
// cleanup cannot remove someone else's namespace.
type scratch struct{ created []string }

func (s *scratch) create(name string) (string, error) {
	if netutil.Exists(name) {
		return "", fmt.Errorf("namespace %s already exists", name)
	}
	s.created = append(s.created, name)
	if err := netutil.CreateNamed(name); err != nil {
		return "", err
	}
	return netutil.Path(name), nil
}

// remove deletes the namespaces, and with them every link in them. It is
// safe to call more than once.
func (s *scratch) remove() {
	for _, n := range s.created {
		_ = netutil.DeleteNamed(n)
	}
	s.created = nil
}

// buildTwin creates the twin in namespaces named prefix-*, with pods of
// MTU podMTU. The returned cleanup removes every namespace it created; on
// error buildTwin has already removed them.
func buildTwin(prefix string, podMTU int) (twin, func(), error) {
	var s scratch
	var t twin
	if err := t.setup(&s, prefix, podMTU); err != nil {
		s.remove()
		return t, nil, fmt.Errorf("kernel-routed twin: %w", err)
	}
	return t, s.remove, nil
}

func (t *twin) setup(s *scratch, prefix string, podMTU int) error {
	paths := map[string]string{}
	for _, role := range []string{"fabric", "n1", "n2", "pa", "pb", "pc"} {
		p, err := s.create(prefix + "-" + role)
		if err != nil {
			return err
		}
		paths[role] = p
	}
	t.a, t.b, t.c = paths["pa"], paths["pb"], paths["pc"]
	t.nodes, t.fabric = [2]string{paths["n1"], paths["n2"]}, paths["fabric"]
	if err := netutil.EnsureBridge(t.fabric, "br0"); err != nil {
		return err
	}
	var under [2]netip.Addr
	for i, node := range t.nodes {
		under[i], _ = lab.NodeUnderlay(i + 1)
		if err := netutil.EnsureVeth(netutil.VethSpec{NSPath: t.fabric, Name: fmt.Sprintf("n%d", i+1), Master: "br0",
			PeerNSPath: node, PeerName: "eth0"}); err != nil {
			return err
		}
		if err := netutil.EnsureAddr(node, "eth0", netip.PrefixFrom(under[i], lab.UnderlayV4.Bits())); err != nil {
			return err
		}
		if err := netutil.Sysctl(node, "net.ipv4.ip_forward", "1"); err != nil {
			return err
		}
	}
	for i, node := range t.nodes {
		other := 1 - i
		if err := netutil.EnsureRoute(node, twinBlocks[other], under[other], "eth0"); err != nil {
			return err
		}
	}
	host := func(block netip.Prefix, n int) netip.Addr {
		a := block.Addr()
		for range n {
			a = a.Next()
		}
		return a
	}
	t.bAddr, t.cAddr = host(twinBlocks[0], 3), host(twinBlocks[1], 2)
	for _, pod := range []struct {
		ns, hostIf string
		node       int
		addr       netip.Addr
	}{
		{t.a, "twa", 0, host(twinBlocks[0], 2)},
		{t.b, "twb", 0, t.bAddr},
		{t.c, "twc", 1, t.cAddr},
	} {
		if _, err := podnet.Setup(podnet.Spec{NodeNS: t.nodes[pod.node], PodNS: pod.ns, HostIf: pod.hostIf, PodIf: "eth0",
			MTU: podMTU, Addrs: []netip.Addr{pod.addr}, Gateways: []netip.Addr{host(twinBlocks[pod.node], 1)}}); err != nil {
			return err
		}
	}
	return nil
}

// vethPair is the former peer, kept as a reference row only: two
// namespaces joined by one veth pair, which is not the path of any pod.
func vethPair(prefix string) (src, dst string, dstAddr netip.Addr, cleanup func(), err error) {
	var s scratch
	dstAddr = netip.MustParseAddr("10.251.0.2")
	err = func() error {
		var err error
		if src, err = s.create(prefix + "-a"); err != nil {
			return err
		}
		if dst, err = s.create(prefix + "-b"); err != nil {
			return err
		}
		if err := netutil.EnsureVeth(netutil.VethSpec{NSPath: src, Name: "eth0", PeerNSPath: dst, PeerName: "eth0"}); err != nil {
			return err
		}
		if err := netutil.EnsureAddr(src, "eth0", netip.MustParsePrefix("10.251.0.1/24")); err != nil {
			return err
		}
		return netutil.EnsureAddr(dst, "eth0", netip.PrefixFrom(dstAddr, 24))
	}()
	if err != nil {
		s.remove()
		return "", "", netip.Addr{}, nil, fmt.Errorf("veth pair: %w", err)
	}
	return src, dst, dstAddr, s.remove, nil
}

// Package podnet wires a pod into the node: the veth pair (host side in the
// node's namespace, eth0 in the pod's), the pod's addresses, its gateway as
// a permanent neighbour (so the pod never resolves it and ARP/ND never
// leave the pod), and the node's route to the pod. A port of an l2 network
// differs (Spec.L2): its addresses are on-link in their subnet and the pod
// resolves its peers and gateway itself (from_l2 answers). It makes no
// eBPF or API calls.
package podnet

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"

	"github.com/lace-cni/lace/internal/netutil"
)

// Spec describes one pod interface.
type Spec struct {
	NodeNS, PodNS string // namespace paths
	HostIf        string // host-side name (see HostIfName)
	PodIf         string // name inside the pod, usually eth0
	MTU           int
	Addrs         []netip.Addr // at most one per family
	Gateways      []netip.Addr // one per family of Addrs
	// L2: a port of an l2 network. Each address carries its subnet's
	// prefix length (PrefixBits, one per address), so the pod's peers are
	// on-link: the pod resolves them and the gateway (from_l2 answers from
	// the network's neighbour table), and no permanent neighbour is set
	// for the gateway. The pod side gets PodMAC (lace-controller's), the
	// host side HostMAC (the network's anycast gateway MAC: frames the pod
	// sends to its gateway are then the host side's own, so replies to the
	// node, kubelet probes, are taken by its stack too).
	L2              bool
	PrefixBits      []int
	PodMAC, HostMAC net.HardwareAddr
}

// Result is what the data plane needs of the created interface.
type Result struct {
	HostIfIndex int
	HostMAC     net.HardwareAddr
	PodMAC      net.HardwareAddr
}

// HostIfName is the host-side interface name for a container: "lace" and
// 11 hex characters of a hash of its ID, within IFNAMSIZ.
func HostIfName(containerID string) string {
	sum := sha256.Sum256([]byte(containerID))
	return "lace" + hex.EncodeToString(sum[:])[:11]
}

// Setup creates the interface. It is idempotent: an existing veth is kept
// and addresses, routes and neighbours are replaced.
func Setup(s Spec) (Result, error) {
	if len(s.Addrs) == 0 || len(s.Addrs) != len(s.Gateways) {
		return Result{}, errors.New("podnet: need one gateway per address")
	}
	if s.L2 && (len(s.PrefixBits) != len(s.Addrs) || len(s.PodMAC) != 6 || len(s.HostMAC) != 6) {
		return Result{}, errors.New("podnet: an l2 port needs a prefix length per address and both MACs")
	}
	if err := netutil.EnsureVeth(netutil.VethSpec{
		NSPath: s.NodeNS, Name: s.HostIf, PeerNSPath: s.PodNS, PeerName: s.PodIf, MTU: s.MTU,
		MAC: s.HostMAC, PeerMAC: s.PodMAC,
	}); err != nil {
		return Result{}, err
	}
	node, err := netutil.OpenNS(s.NodeNS)
	if err != nil {
		return Result{}, err
	}
	defer node.Close()
	podNS, err := netutil.OpenNS(s.PodNS)
	if err != nil {
		return Result{}, err
	}
	defer podNS.Close()
	host, hostLink, err := node.Link(s.HostIf)
	if err != nil {
		return Result{}, err
	}
	pod, podLink, err := podNS.Link(s.PodIf)
	if err != nil {
		return Result{}, err
	}
	if s.L2 {
		// A veth made by an earlier try keeps its MACs: set them again.
		if err := node.SetMAC(hostLink, s.HostMAC); err != nil {
			return Result{}, err
		}
		if err := podNS.SetMAC(podLink, s.PodMAC); err != nil {
			return Result{}, err
		}
		if host, hostLink, err = node.Link(s.HostIf); err != nil {
			return Result{}, err
		}
		if pod, podLink, err = podNS.Link(s.PodIf); err != nil {
			return Result{}, err
		}
	}
	// The pod neither accepts router advertisements nor autoconfigures:
	// its addresses and routes are the ones given here.
	_ = netutil.Do(s.PodNS, func() error {
		for _, k := range []string{"accept_ra", "autoconf"} {
			_ = os.WriteFile("/proc/sys/net/ipv6/conf/"+s.PodIf+"/"+k, []byte("0"), 0o644)
		}
		return nil
	})
	for i, a := range s.Addrs {
		gw := s.Gateways[i]
		def := netip.PrefixFrom(netip.IPv4Unspecified(), 0)
		if a.Is6() {
			def = netip.PrefixFrom(netip.IPv6Unspecified(), 0)
		}
		// The pod: its address, its gateway on the link, a default route
		// and the gateway as a permanent neighbour (the host side's MAC).
		// The node reaches its own pods (probes) and nothing else routes
		// here; the pod's MAC is a permanent neighbour there too, so ARP
		// and ND never cross the veth.
		steps := []func() error{
			func() error { return podNS.ReplaceAddr(podLink, netip.PrefixFrom(a, a.BitLen())) },
			func() error { return podNS.ReplaceRoute(podLink, netip.PrefixFrom(gw, gw.BitLen()), netip.Addr{}) },
			func() error { return podNS.ReplaceRoute(podLink, def, gw) },
			func() error { return podNS.SetNeigh(podLink, gw, host.MAC) },
		}
		if s.L2 {
			// The subnet is on-link (the address's prefix route): the
			// gateway in it needs no route of its own, and is resolved.
			steps = []func() error{
				func() error { return podNS.ReplaceAddr(podLink, netip.PrefixFrom(a, s.PrefixBits[i])) },
				func() error { return podNS.ReplaceRoute(podLink, def, gw) },
			}
		}
		steps = append(steps,
			func() error { return node.ReplaceRoute(hostLink, netip.PrefixFrom(a, a.BitLen()), netip.Addr{}) },
			func() error { return node.SetNeigh(hostLink, a, pod.MAC) })
		for _, step := range steps {
			if err := step(); err != nil {
				return Result{}, err
			}
		}
	}
	return Result{HostIfIndex: host.Index, HostMAC: host.MAC, PodMAC: pod.MAC}, nil
}

// Teardown removes the host side (and with it the pod side) and the node's
// routes to addrs. What is already gone is fine.
func Teardown(nodeNS, hostIf string, addrs []netip.Addr) error {
	var errs []error
	for _, a := range addrs {
		errs = append(errs, netutil.DeleteRoute(nodeNS, netip.PrefixFrom(a, a.BitLen()), hostIf))
	}
	if err := netutil.DeleteLink(nodeNS, hostIf); err != nil {
		errs = append(errs, fmt.Errorf("delete %s: %w", hostIf, err))
	}
	return errors.Join(errs...)
}

// Link identifies a host-side interface: a name alone is not enough, an
// interface index is reused by the kernel once its interface is gone (after
// a reboot, the first new veth may get the index a dead pod's had), so an
// entry is trusted only when name, index and MAC all match.
type Link = netutil.LinkInfo

// HostLinks lists the pod host-side interfaces (names starting with
// prefix) in the node's namespace, by name.
func HostLinks(nodeNS, prefix string) (map[string]Link, error) {
	return netutil.LinksWithPrefix(nodeNS, prefix)
}

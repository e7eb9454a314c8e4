// Package lab runs a whole multi-node Kubernetes cluster on one Linux
// machine: a real control plane as processes on loopback, one network
// namespace per node on a shared fabric, an external host namespace, and a
// lab kubelet per node that runs pods in their own namespaces through the
// node's CNI plugin.
//
// It owns every namespace, process and file it makes, all named after the
// lab so two labs can run side by side, and it never adds a link, address,
// route or rule to the root network namespace: the only things the lab
// opens in the root namespace are listening sockets on loopback.
//
// The lab and its tools live under lab/ (this package, controlplane,
// images, bench, conformance, mkimages, cmd/lace-lab), beside the product:
// the lab imports the product (its chart, model and data plane layout),
// the product never imports the lab (TestProductNeverImportsTheLab).
package lab

import (
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"

	"github.com/lace-cni/lace/lab/controlplane"
	"github.com/lace-cni/lace/lab/images"
)

// Config describes one lab.
type Config struct {
	// Name prefixes every namespace and process of the lab.
	Name string
	// Nodes is the number of worker nodes, Zones the number of zones they
	// are spread over (round robin).
	Nodes, Zones int
	// StateRoot holds one directory per lab.
	StateRoot string
	// K8sBinDir holds etcd, the Kubernetes binaries and agnhost.
	K8sBinDir string
	// CNIBinDir holds the reference CNI plugins (the bridge fallback).
	CNIBinDir string
	// CNI is the lab's pod network: lace (default), bridge, or flannel
	// (the peer cluster: flannel's vxlan backend and kube-proxy in
	// nftables mode on every node; see flannel.go).
	CNI string
	// Flannel is the flanneld binary of a flannel lab (`make flannel`).
	Flannel string
	// ImageDir holds the image tarballs every node imports (`make images`).
	ImageDir string
	// Helm is the helm binary that installs Lace's chart.
	Helm string
	// LaceTag is the tag of the Lace image the chart runs.
	LaceTag string
	// HelmSet are chart values set at install on top of the lab's own
	// (helm --set syntax: a=1,b=2), e.g. a default network with room for
	// a thousand simulated nodes (lab/bench's nodes benchmark).
	HelmSet string
	// DNS runs cluster DNS: CoreDNS behind kube-system/kube-dns (DNSAddrs),
	// as kubeadm deploys it, and kubelets that point pods at it. lace-lab
	// up turns it on unless given --dns=false (or --cni bridge); this
	// zero value is off so that callers building a Config say which.
	DNS bool
}

// CNI choices of a lab.
const (
	CNILace   = "lace"
	CNIBridge = "bridge"
	// CNIFlannel is not Lace at all: the setup k3s ships, which the
	// benchmarks measure Lace against.
	CNIFlannel = "flannel"
)

// DefaultStateRoot is where labs keep their state: on tmpfs, like the
// namespaces, so a reboot leaves no stale lab behind.
const DefaultStateRoot = "/run/lace-lab"

// CNIVersion is the containernetworking/plugins release the tools module pins.
const CNIVersion = "v1.9.1"

// FlannelVersion is the flannel release hack/tools/flannel pins.
const FlannelVersion = "v0.28.10"

// DefaultConfig is the lab `lace-lab up` makes without flags.
func DefaultConfig() Config {
	home, _ := os.UserHomeDir()
	cni := os.Getenv("LACE_CNI_BIN")
	if cni == "" {
		cni = filepath.Join(home, ".cache", "lace", "cni-"+CNIVersion)
	}
	self, _ := os.Executable()
	images := os.Getenv("LACE_IMAGES")
	if images == "" {
		images = filepath.Join(filepath.Dir(self), "images")
	}
	flannel := os.Getenv("LACE_FLANNEL")
	if flannel == "" {
		flannel = filepath.Join(home, ".cache", "lace", "flannel-"+FlannelVersion, "flanneld")
	}
	helm := os.Getenv("LACE_HELM")
	if helm == "" {
		helm = filepath.Join(home, ".cache", "lace", "tools", "helm")
	}
	return Config{
		CNI:       CNILace,
		ImageDir:  images,
		Helm:      helm,
		LaceTag:   "dev",
		Name:      "lace",
		Nodes:     3,
		Zones:     2,
		StateRoot: DefaultStateRoot,
		K8sBinDir: controlplane.DefaultBinDir(),
		CNIBinDir: cni,
		Flannel:   flannel,
	}
}

var nameRE = regexp.MustCompile(`^[a-z][a-z0-9]{0,9}$`)

// Validate checks the configuration.
func (c Config) Validate() error {
	if !nameRE.MatchString(c.Name) {
		return fmt.Errorf("lab name %q: want 1-10 lowercase letters and digits, starting with a letter", c.Name)
	}
	if c.Nodes < 1 || c.Nodes > 50 {
		return fmt.Errorf("--nodes %d: want 1 to 50", c.Nodes)
	}
	if c.CNI != CNILace && c.CNI != CNIBridge && c.CNI != CNIFlannel {
		return fmt.Errorf("--cni %q: want lace, bridge or flannel", c.CNI)
	}
	if c.DNS && c.CNI != CNILace {
		// Cluster DNS is set up and checked for Lace's labs only: the
		// bridge lab has no service proxy, and the flannel lab is a peer
		// for the benchmarks, which resolve nothing.
		return fmt.Errorf("--dns needs --cni lace")
	}
	if c.Zones < 1 || c.Zones > c.Nodes {
		return fmt.Errorf("--zones %d: want 1 to the number of nodes", c.Zones)
	}
	return nil
}

// StateDir is the lab's own directory.
func (c Config) StateDir() string { return filepath.Join(c.StateRoot, c.Name) }

// Kubeconfig is the path of the lab's cluster-admin kubeconfig.
func (c Config) Kubeconfig() string { return filepath.Join(c.StateDir(), "kubeconfig") }

// Socket is the lab daemon's control socket.
func (c Config) Socket() string { return filepath.Join(c.StateDir(), "lab.sock") }

// NodeName is the Kubernetes name of node i (1-based).
func (c Config) NodeName(i int) string { return "n" + strconv.Itoa(i) }

// Zone is the zone of node i (1-based).
func (c Config) Zone(i int) string { return "zone-" + string(rune('a'+(i-1)%c.Zones)) }

// NetNS is the name of the lab namespace for role: fabric, external or a
// node name.
func (c Config) NetNS(role string) string { return c.Name + "-" + role }

// NodeDir is the state directory of a node.
func (c Config) NodeDir(node string) string { return filepath.Join(c.StateDir(), "nodes", node) }

// NodeRoot is a link to the node's filesystem as the node sees it (its
// overlays, /run and bpffs), for reading it from the machine.
func (c Config) NodeRoot(node string) string { return filepath.Join(c.NodeDir(node), "root") }

// ContainerdSocket is the node's containerd (CRI) socket, reached from the
// machine.
func (c Config) ContainerdSocket(node string) string {
	return filepath.Join(c.NodeRoot(node), nodeContainerdSock)
}

// AuditLog is the API server's audit log (JSON lines): one Metadata-level
// event per write request (create, update, patch, delete), nothing for
// reads, so that who writes what at rest can be checked.
func (c Config) AuditLog() string { return filepath.Join(c.StateDir(), "audit.log") }

// EgressSocket is where the lab's CONNECT proxy listens for the API
// server's connections to kubelets.
func (c Config) EgressSocket() string { return filepath.Join(c.StateDir(), "egress.sock") }

// Lab addressing. The fabric is one L2 segment; each node's underlay
// interface eth0 has an IPv4 and an IPv6 (ULA) address on it.
var (
	UnderlayV4 = netip.MustParsePrefix("172.30.0.0/24")
	UnderlayV6 = netip.MustParsePrefix("fd00:30::/64")
)

// NodeUnderlay returns node i's underlay addresses (IPv4, IPv6).
func NodeUnderlay(i int) (netip.Addr, netip.Addr) { return hostAddr(10 + i) }

// APIServerAddrs are the addresses where the API server sits on the fabric
// (IPv4, IPv6), as a cluster's control plane node would.
func APIServerAddrs() (netip.Addr, netip.Addr) { return hostAddr(1) }

// ExternalIPRanges are the addresses the lab allows Services' externalIPs
// to name (the chart's services.externalIPs.allowedCIDRs): fabric
// addresses .248-.251 of each family, which nothing else uses, and the
// two addresses the upstream ExternalIP conformance spec names (no lab
// host holds them).
func ExternalIPRanges() []string {
	v4, v6 := hostAddr(248)
	return []string{netip.PrefixFrom(v4, 30).String(), netip.PrefixFrom(v6, 126).String(),
		"203.0.113.250/32", "2001:db8::cb00:71fa/128"}
}

// ExternalUnderlay returns the external host's addresses (IPv4, IPv6).
func ExternalUnderlay() (netip.Addr, netip.Addr) { return hostAddr(200) }

// ExternalServed are prefixes beyond the fabric that the external host
// serves (documentation ranges, RFC 5737 / RFC 3849), as a site behind a
// router would: the external host holds ExternalServedAddrs on its fabric
// interface and every node routes these prefixes via the external host's
// fabric address. Tests and the demo name them in external networks (a
// "partner" site) distinct from world.
var (
	ExternalServedV4 = netip.MustParsePrefix("198.51.100.0/24")
	ExternalServedV6 = netip.MustParsePrefix("2001:db8:51::/48")
)

// ExternalServedAddrs are the external host's addresses inside
// ExternalServedV4 and ExternalServedV6.
func ExternalServedAddrs() (netip.Addr, netip.Addr) {
	return netip.MustParseAddr("198.51.100.10"), netip.MustParseAddr("2001:db8:51::10")
}

// PodRoutesViaNodes are the prefixes the external host routes via the
// nodes (equal-cost, every node), so that outside traffic to pod networks
// enters the cluster at any node, as a fabric router with routes to the
// cluster would. They cover every pod subnet the chart, the demo and the
// tests use, and nothing on the fabric (more specific on-link routes win).
var PodRoutesViaNodes = []netip.Prefix{
	netip.MustParsePrefix("10.0.0.0/8"),
	netip.MustParsePrefix("fd00::/16"),
}

func hostAddr(n int) (netip.Addr, netip.Addr) {
	v4 := UnderlayV4.Addr().As4()
	v4[3] = byte(n)
	v6 := UnderlayV6.Addr().As16()
	v6[15] = byte(n)
	return netip.AddrFrom4(v4), netip.AddrFrom16(v6)
}

// BridgePodCIDRs are node i's pod ranges under the lab's fallback bridge CNI.
func BridgePodCIDRs(i int) (netip.Prefix, netip.Prefix) {
	v4 := netip.AddrFrom4([4]byte{10, 244, byte(i), 0})
	v6 := netip.MustParseAddr("fd00:244::").As16()
	v6[7] = byte(i)
	return netip.PrefixFrom(v4, 24), netip.PrefixFrom(netip.AddrFrom16(v6), 64)
}

// ServiceCIDRs are the lab's service ranges (dual-stack).
const ServiceCIDRs = "10.96.0.0/16,fd00:96::/108"

// serviceRanges are the prefixes of ServiceCIDRs.
var serviceRanges = func() []netip.Prefix {
	var out []netip.Prefix
	for _, s := range strings.Split(ServiceCIDRs, ",") {
		out = append(out, netip.MustParsePrefix(s))
	}
	return out
}()

// DNSAddrs are the kube-dns Service's cluster IPs, the conventional .10 of
// each service range (10.96.0.10, fd00:96::a), as kubeadm picks them.
func DNSAddrs() []netip.Addr {
	var out []netip.Addr
	for _, p := range serviceRanges {
		a := p.Addr()
		for range 10 {
			a = a.Next()
		}
		out = append(out, a)
	}
	return out
}

// Images are the tarballs every node imports at up.
func (c Config) Images() []string {
	names := []string{images.PauseTar, images.AgnhostTar, images.LaceTar}
	if c.DNS {
		names = append(names, images.CoreDNSTar)
	}
	var out []string
	for _, n := range names {
		out = append(out, filepath.Join(c.ImageDir, n))
	}
	return out
}

package agent

import (
	"net"
	"net/netip"
	"time"

	"github.com/lace-cni/lace/internal/datapath"
	"github.com/lace-cni/lace/internal/netutil"
	"github.com/lace-cni/lace/internal/podnet"
)

// dataplane is what the agent needs of the node's eBPF data plane.
// *datapath.Datapath implements it; tests use a fake.
type dataplane interface {
	SetConfig(datapath.Config) error
	Config() (datapath.Config, error)
	AttachUnderlay(nsPath, ifName string) error
	AttachPod(nsPath, hostIf string) error
	DetachPod(hostIf string) error
	PinnedPodLinks() ([]string, error)
	UpsertEndpoint(datapath.Endpoint) error
	DeleteEndpoint(netID uint32, a netip.Addr) error
	Endpoints() ([]datapath.Endpoint, error)
	UpsertPort(datapath.Port) error
	DeletePort(ifindex uint32) error
	Ports() ([]datapath.Port, error)
	UpsertRoute(datapath.Route) error
	DeleteRoute(netID uint32, p netip.Prefix) error
	Routes() ([]datapath.Route, error)
	UpsertNetwork(datapath.Network) error
	DeleteNetwork(id uint32) error
	Networks() ([]datapath.Network, error)
	UpsertClassifier(datapath.Classifier) error
	DeleteClassifier(p netip.Prefix) error
	Classifiers() ([]datapath.Classifier, error)
	UpsertInside(datapath.Inside) error
	DeleteInside(p netip.Prefix) error
	Insides() ([]datapath.Inside, error)
	AttachHostSockets(cgroupPath string) error
	ApplyServices([]datapath.Service) (map[datapath.ServiceKey][]datapath.Backend, error)
	FlushServiceFlows(map[datapath.ServiceKey][]datapath.Backend) (int, error)
	UpsertNode(netip.Addr) error
	DeleteNode(netip.Addr) error
	Nodes() ([]netip.Addr, error)
	UpsertNodeLocator(datapath.NodeLocator) error
	DeleteNodeLocator(netip.Addr) error
	NodeLocators() ([]datapath.NodeLocator, error)
	UpsertHostAddr(netip.Addr) error
	DeleteHostAddr(netip.Addr) error
	HostAddrs() ([]netip.Addr, error)
	MapSizes() (map[string]int, error)
	// The Sync methods make a table exactly the desired entries, judged
	// against what was written to it (no kernel read-back).
	SyncHostAddrs([]netip.Addr) error
	SyncNodes([]netip.Addr) error
	SyncNodeLocators([]datapath.NodeLocator) error
	SyncNetworks([]datapath.Network) error
	SyncRoutes([]datapath.Route) error
	SyncClassifiers([]datapath.Classifier) error
	SyncInsides([]datapath.Inside) error
	SyncEndpoints(want []datapath.Endpoint, busy func(netID uint32, a netip.Addr) bool) error
	SyncPorts(want []datapath.Port, busy func(ifindex uint32) bool) error
	SetAnnounced(vips []netip.Addr, mac net.HardwareAddr, ttl time.Duration) error
	Drops() (map[string]uint64, error)
	Forwarded() (map[string]uint64, error)
	SNATExhaustedCounts() (map[string]uint64, error)
	Close() error
}

// nodeKernel is what the agent changes in the node's namespace besides the
// eBPF maps: pod interfaces, underlay routes to other nodes' locators, and
// forwarding. linuxNode implements it; tests use a fake.
type nodeKernel interface {
	// UnderlayAddrs are the global addresses of the underlay interface.
	UnderlayAddrs() ([]netip.Addr, error)
	UnderlayIndex() (int, error)
	// UnderlayMTU is the MTU of the underlay interface now.
	UnderlayMTU() (int, error)
	// Reachable says whether the node routes to dst out of the underlay
	// interface (nil) or why not.
	Reachable(dst netip.Addr) error
	EnableForwarding() error
	// NetNSCookie is the node network namespace's cookie.
	NetNSCookie() (uint64, error)
	// PodNetNSCookie is the cookie of a pod's network namespace.
	PodNetNSCookie(nsPath string) (uint64, error)
	OwnedRoutes() (map[netip.Prefix]netip.Addr, error)
	ReplaceOwnedRoute(dst netip.Prefix, via netip.Addr) error
	DeleteRoute(dst netip.Prefix) error
	SetupPod(podnet.Spec) (podnet.Result, error)
	TeardownPod(hostIf string, addrs []netip.Addr) error
	// HostLinks are the pod host-side interfaces on the node, by name.
	HostLinks() (map[string]podnet.Link, error)
}

// linuxNode is nodeKernel on a real namespace.
type linuxNode struct {
	ns       string // path of the node's network namespace
	underlay string // name of the underlay interface
}

func (n linuxNode) UnderlayAddrs() ([]netip.Addr, error) {
	return netutil.GlobalAddrs(n.ns, n.underlay)
}

func (n linuxNode) UnderlayIndex() (int, error) {
	l, err := netutil.GetLink(n.ns, n.underlay)
	return l.Index, err
}

func (n linuxNode) UnderlayMTU() (int, error) {
	l, err := netutil.GetLink(n.ns, n.underlay)
	return l.MTU, err
}

// Reachable asks the node's routing table for dst: a route must exist
// and leave through the underlay interface with a source address of
// dst's family (an IPv6 route without any IPv6 address on the node has
// none).
func (n linuxNode) Reachable(dst netip.Addr) error { return netutil.RouteOut(n.ns, dst, n.underlay) }

// EnableForwarding turns forwarding on: fib lookups answer FWD_DISABLED
// without it.
func (n linuxNode) NetNSCookie() (uint64, error) { return datapath.NetNSCookie(n.ns) }

func (n linuxNode) PodNetNSCookie(nsPath string) (uint64, error) { return datapath.NetNSCookie(nsPath) }

func (n linuxNode) EnableForwarding() error {
	for _, kv := range [][2]string{{"net.ipv4.ip_forward", "1"}, {"net.ipv6.conf.all.forwarding", "1"}} {
		if err := netutil.Sysctl(n.ns, kv[0], kv[1]); err != nil {
			return err
		}
	}
	return nil
}

func (n linuxNode) OwnedRoutes() (map[netip.Prefix]netip.Addr, error) {
	return netutil.OwnedRoutes(n.ns)
}

func (n linuxNode) ReplaceOwnedRoute(dst netip.Prefix, via netip.Addr) error {
	return netutil.ReplaceOwnedRoute(n.ns, dst, via, n.underlay)
}

func (n linuxNode) DeleteRoute(dst netip.Prefix) error { return netutil.DeleteRoute(n.ns, dst, "") }

func (n linuxNode) SetupPod(s podnet.Spec) (podnet.Result, error) { return podnet.Setup(s) }

func (n linuxNode) TeardownPod(hostIf string, addrs []netip.Addr) error {
	return podnet.Teardown(n.ns, hostIf, addrs)
}

func (n linuxNode) HostLinks() (map[string]podnet.Link, error) {
	return podnet.HostLinks(n.ns, datapath.PodIfPrefix)
}

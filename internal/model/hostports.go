package model

import (
	"cmp"
	"fmt"
	"net/netip"
	"slices"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/lace-cni/lace/internal/tables"
)

// SNATPortMin is the first port of the node's SNAT range (SNAT_PORT_MIN in
// ct.h): the data plane never serves a frontend there (its answers would
// be taken for a pod flow's), so no hostPort may ask for one.
const SNATPortMin = 61000

// Reasons of hostPort refusals (Warning Events on the pod).
const (
	HostPortConflict    = "HostPortConflict"    // an older pod (or, for hostIP "::", one naming the address) holds the address, protocol and port
	HostPortTaken       = "HostPortTaken"       // a Service's frontend (NodePort, load balancer, external IP) holds it
	HostPortReserved    = "HostPortReserved"    // a port of the node itself (API server, kubelet, Lace, SNAT range)
	HostPortHostIP      = "HostPortHostIP"      // hostIP is not an address of this node
	HostPortUnsupported = "HostPortUnsupported" // a protocol the data plane does not translate (SCTP), or no address of hostIP's family
	HostPortLimit       = "HostPortLimit"       // past the pod's or the node's share of the service maps
)

// The service maps' room for hostPorts: the node's share (the agent
// takes it out of the Services' budget, so hostPorts never crowd
// Services out, nor Services hostPorts), one pod's part of it (a pod
// may declare thousands of ports; the oldest pods keep theirs) and one
// namespace's: a tenant may pin any number of pods to a node
// (spec.nodeName skips the scheduler) and nothing in Kubernetes counts
// hostPorts per namespace (ResourceQuota counts no ports), so without it
// one namespace's old pods would hold the node's whole share and every
// other namespace's hostPort there would be refused for as long as they
// live.
const (
	MaxHostPortEntries       = 1024
	MaxHostPortEntriesPerPod = 64
	// A quarter of the node's share: four namespaces at their limit
	// leave nothing, but a tenant holds one namespace.
	hostPortNamespaceShareDiv = 4
)

// HostPortPod is a pod of this node as its hostPorts need it.
type HostPortPod struct {
	Namespace, Name string
	UID             types.UID
	Created         metav1.Time
	// NetID is the pod's network; Addrs its addresses (one per family),
	// from the node's own endpoint records.
	NetID uint32
	Addrs []netip.Addr
	Ports []corev1.ContainerPort
}

// ReservedPort is a port of the node's own that no hostPort may take.
type ReservedPort struct {
	Proto uint8
	Port  uint16
	// Addr is the address it is reserved on; invalid for every address.
	Addr netip.Addr
	What string // what listens there, for the Event
}

// HostPortInput is everything a node's hostPorts depend on.
type HostPortInput struct {
	// NodeAddrs are the node's underlay addresses: the addresses an empty
	// hostIP publishes on (with loopback) and the only ones a specific
	// hostIP may name.
	NodeAddrs []netip.Addr
	Reserved  []ReservedPort
	Pods      []HostPortPod
	// MaxEntries bounds the node's hostPort entries (0:
	// MaxHostPortEntries); a namespace's entries on the node are bounded
	// by a quarter of it.
	MaxEntries int
}

// HostPortRefusal is one hostPort of a pod not served, and why.
type HostPortRefusal struct {
	Namespace, Name string
	UID             types.UID
	Reason, Message string
}

var (
	loopback4 = netip.MustParseAddr("127.0.0.1")
	loopback6 = netip.IPv6Loopback()
)

// ComputeHostPorts adds the hostPorts of the node's pods to svcs (sorted
// by address, protocol and port, as MergeServices leaves them) and lists
// what it refuses. A hostPort is a frontend of kind HostPort whose one
// backend is its pod (containerPort) and whose ClusterIP is the pod's
// address: the data plane admits a source when its view reaches the pod.
//
// The addresses a hostIP publishes on follow what the kubelet admits
// (docs/conformance.md, "hostPort"): the scheduler's NodePorts filter and
// the kubelet's admission (framework.HostPortInfo) compare hostIPs as
// strings, "" and "0.0.0.0" alone meaning every address, so two pods
// whose hostIPs are other different strings run side by side on one
// port. Lace must then never give both the same address, or the oldest
// would take the other's clients (a tenant's pod on "::" or
// "::ffff:<node>" squatting another's "<node>" until it is replaced):
//
//   - "" or "0.0.0.0" publishes on each node address of a family the pod
//     has and on that family's loopback (the node's own sockets only:
//     portmap's DNAT of localhost does the same); the kubelet lets no
//     other pod hold that port beside it;
//   - "::" (written so) publishes on the node's IPv6 addresses and ::1
//     only (portmap's rule for "::" is IPv6's), and yields each address a
//     pod names exactly (the kubelet lets both run: the specific address
//     wins, as portmap's hostIP chain comes before its wildcard one);
//   - a loopback hostIP on loopback only; another hostIP only when it is
//     one of NodeAddrs;
//   - a hostIP not written as Go writes the address (another spelling of
//     a node address, "::0", a zone) or a v4-mapped IPv6 address
//     ("::ffff:a.b.c.d") is refused (HostPortHostIP): to the kubelet it
//     is another address than the canonical one, so it could sit beside
//     a pod there. Portmap takes a v4-mapped hostIP for IPv4 and writes
//     it as is into an "ip daddr" rule, which nft cannot parse (by its
//     code: the pod's sandbox would fail); Lace's Event says to write
//     the IPv4 address.
//
// Services own their addresses first: a hostPort never takes the
// address, protocol and port of a NodePort, load balancer or external IP
// (HostPortTaken), nor a port the node reserves for itself (the API
// server, the kubelet, Lace's own, the SNAT range: HostPortReserved).
// Among pods the kubelet would not let run side by side the oldest
// (creation time, then UID) keeps an entry; each loser's refusal names
// the winner when it is of the loser's namespace (another namespace's
// pod names are not the loser's to read).
func ComputeHostPorts(in HostPortInput, svcs []tables.Service) ([]tables.Service, []HostPortRefusal) {
	entries, refused := HostPortEntries(in, svcs)
	return AddHostPorts(svcs, entries), refused
}

// AddHostPorts is svcs with entries (HostPortEntries: sorted, at keys
// svcs does not hold) merged in; svcs itself when there are none.
func AddHostPorts(svcs, entries []tables.Service) []tables.Service {
	if len(entries) == 0 {
		return svcs
	}
	out := make([]tables.Service, 0, len(svcs)+len(entries))
	i := 0
	for _, e := range entries {
		j, _ := tables.FindFrontend(svcs[i:], e.Key())
		out = append(append(out, svcs[i:i+j]...), e)
		i += j
	}
	return append(out, svcs[i:]...)
}

// HostPortEntries are the entries ComputeHostPorts adds to svcs (sorted
// by key as svcs is), and the refusals: each costs what the node's pods
// ask, svcs being only looked up.
func HostPortEntries(in HostPortInput, svcs []tables.Service) ([]tables.Service, []HostPortRefusal) {
	if len(in.Pods) == 0 {
		return nil, nil // nothing to publish: no pass over the services
	}
	pods := slices.Clone(in.Pods)
	slices.SortFunc(pods, func(a, b HostPortPod) int {
		return cmp.Or(a.Created.Time.Compare(b.Created.Time), cmp.Compare(a.UID, b.UID))
	})
	type key struct {
		addr  netip.Addr
		proto uint8
		port  uint16
	}
	type held struct {
		pod    *HostPortPod
		yields bool // published by hostIP "::"
	}
	owner := map[key]held{}
	var out []tables.Service
	var refused []HostPortRefusal
	refuse := func(p *HostPortPod, reason, format string, args ...any) {
		refused = append(refused, HostPortRefusal{Namespace: p.Namespace, Name: p.Name, UID: p.UID, Reason: reason,
			Message: fmt.Sprintf(format, args...)})
	}
	holder := func(p, o *HostPortPod) string {
		if o.Namespace != p.Namespace {
			return "another pod"
		}
		return "pod " + o.Namespace + "/" + o.Name
	}
	limit := in.MaxEntries
	if limit <= 0 {
		limit = MaxHostPortEntries
	}
	nsLimit := max(limit/hostPortNamespaceShareDiv, 1)
	perNamespace := map[string]int{}
	mine := map[types.UID]int{}
	type claim struct {
		p      *HostPortPod
		cp     corev1.ContainerPort
		what   string
		proto  uint8
		port   uint16
		addrs  []netip.Addr
		yields bool
	}
	publish := func(c claim) {
		p, cp, what, proto, port := c.p, c.cp, c.what, c.proto, c.port
	addrs:
		for _, at := range c.addrs {
			for _, r := range in.Reserved {
				if r.Proto == proto && r.Port == port && (!r.Addr.IsValid() || r.Addr == at) {
					refuse(p, HostPortReserved, "%s on %s: the node's %s listens there", what, at, r.What)
					continue addrs
				}
			}
			k := key{at, proto, port}
			if i, ok := tables.FindFrontend(svcs, tables.FrontendKey{VIP: at, Proto: proto, Port: port}); ok {
				refuse(p, HostPortTaken, "%s on %s: a Service's %s holds it", what, at, svcs[i].Frontend)
				continue
			}
			if o := owner[k]; o.pod != nil {
				switch {
				case o.pod.UID == p.UID:
				case c.yields && !o.yields:
					refuse(p, HostPortConflict, "%s on %s: %s names that address (hostIP \"::\" yields it, as the kubelet lets both run)",
						what, at, holder(p, o.pod))
				default:
					refuse(p, HostPortConflict, "%s on %s: %s, older, holds it", what, at, holder(p, o.pod))
				}
				continue
			}
			if mine[p.UID] >= MaxHostPortEntriesPerPod || perNamespace[p.Namespace] >= nsLimit || len(out) >= limit {
				refuse(p, HostPortLimit, "%s on %s: past the %d entries a pod, %d a namespace and %d a node may have", what, at,
					MaxHostPortEntriesPerPod, nsLimit, limit)
				continue
			}
			mine[p.UID]++
			perNamespace[p.Namespace]++
			pod := podAddrOf(p.Addrs, at.Is4())
			owner[k] = held{p, c.yields}
			out = append(out, tables.Service{VIP: at, Proto: proto, Port: port, NetID: p.NetID,
				Backends: []tables.Backend{{Addr: pod, Port: uint16(cp.ContainerPort)}}, Frontend: tables.FrontendHostPort,
				ClusterIP: pod, ClusterPort: uint16(cp.ContainerPort)})
		}
	}
	// hostIP "::" comes last: it takes what no pod naming an address
	// (nor an older "::") holds.
	var yielding []claim
	for i := range pods {
		p := &pods[i]
		for _, cp := range p.Ports {
			if cp.HostPort <= 0 || cp.HostPort > 65535 || cp.ContainerPort <= 0 || cp.ContainerPort > 65535 {
				continue
			}
			what := fmt.Sprintf("hostPort %d/%s", cp.HostPort, hostPortProto(cp.Protocol))
			proto, ok := IPProto(cp.Protocol)
			if !ok || proto == protoSCTP {
				refuse(p, HostPortUnsupported, "%s: the data plane translates TCP and UDP only", what)
				continue
			}
			port := uint16(cp.HostPort)
			if port >= SNATPortMin {
				refuse(p, HostPortReserved, "%s: ports from %d are the node's SNAT range", what, SNATPortMin)
				continue
			}
			addrs, yields, why := hostPortAddrs(cp.HostIP, in.NodeAddrs, p.Addrs)
			if why != "" {
				reason := HostPortHostIP
				if len(addrs) == 0 && why == errNoFamily {
					reason = HostPortUnsupported
				}
				refuse(p, reason, "%s on %q: %s", what, cp.HostIP, why)
				continue
			}
			c := claim{p: p, cp: cp, what: what, proto: proto, port: port, addrs: addrs, yields: yields}
			if yields {
				yielding = append(yielding, c)
				continue
			}
			publish(c)
		}
	}
	for _, c := range yielding {
		publish(c)
	}
	// owner holds each key once: no two entries share one.
	slices.SortFunc(out, func(a, b tables.Service) int { return a.Key().Compare(b.Key()) })
	return out, refused
}

const protoSCTP = 132

const errNoFamily = "the pod has no address of its family"

// hostPortAddrs are the addresses hostIP publishes on (yields: hostIP
// "::", which gives way to a pod naming one of them), or why none
// (ComputeHostPorts tells the rule).
func hostPortAddrs(hostIP string, nodeAddrs, podAddrs []netip.Addr) (addrs []netip.Addr, yields bool, why string) {
	has := func(v4 bool) bool { return podAddrOf(podAddrs, v4).IsValid() }
	if hostIP == "" || hostIP == "0.0.0.0" {
		var out []netip.Addr
		for _, a := range nodeAddrs {
			if has(a.Is4()) && !slices.Contains(out, a) {
				out = append(out, a)
			}
		}
		if has(true) {
			out = append(out, loopback4)
		}
		if has(false) {
			out = append(out, loopback6)
		}
		return out, false, ""
	}
	a, err := netip.ParseAddr(hostIP)
	if err != nil {
		return nil, false, "not an IP address"
	}
	if a.Is4In6() {
		return nil, false, fmt.Sprintf("a v4-mapped IPv6 address: the kubelet tells it from %s (a pod may hold that beside it); write the IPv4 address",
			a.Unmap())
	}
	if a.String() != hostIP {
		return nil, false, fmt.Sprintf("not written as %s: the kubelet compares hostIPs as strings (a pod may hold %s beside it); write it so",
			a, a)
	}
	if a.IsUnspecified() { // "::": the node's IPv6 addresses
		if !has(false) {
			return nil, false, errNoFamily
		}
		var out []netip.Addr
		for _, n := range nodeAddrs {
			if n.Is6() && !slices.Contains(out, n) {
				out = append(out, n)
			}
		}
		return append(out, loopback6), true, ""
	}
	if !a.IsLoopback() && !slices.Contains(nodeAddrs, a) {
		return nil, false, "not an address of this node"
	}
	if !has(a.Is4()) {
		return nil, false, errNoFamily
	}
	return []netip.Addr{a}, false, ""
}

func podAddrOf(addrs []netip.Addr, v4 bool) netip.Addr {
	for _, a := range addrs {
		if a.Is4() == v4 {
			return a
		}
	}
	return netip.Addr{}
}

func hostPortProto(p corev1.Protocol) corev1.Protocol {
	if p == "" {
		return corev1.ProtocolTCP
	}
	return p
}

package datapath

import (
	"crypto/rand"
	"encoding/binary"
	"fmt"
	"net"
	"net/netip"

	"github.com/cilium/ebpf"

	"github.com/lace-cni/lace/internal/tables"
)

// Config is the node-wide configuration of the programs.
type Config struct {
	// UnderlayIP is the outer source of encapsulated packets and of the
	// ICMPv6 errors the node sends its pods.
	UnderlayIP netip.Addr
	// UnderlayIPv4 is the source of the ICMP errors the node sends its
	// pods (none are sent to IPv4 pods without it).
	UnderlayIPv4 netip.Addr
	// Locator is this node's /64 SRv6 locator.
	Locator netip.Prefix
	// UnderlayIfIndex is the underlay interface (for FIB lookups).
	UnderlayIfIndex uint32
	// GuardUnderlay drops plain IP from the underlay that is not addressed
	// to one of the node's own addresses (the host address map): set it
	// only once that map is complete, or the node cuts itself off.
	GuardUnderlay bool
	// HostNetNS is the cookie of the node's host network namespace, whose
	// sockets get connect-time service translation (0: none do).
	HostNetNS uint64
	// HostNet4 and HostNet6 are the networks the node's own addresses
	// classify into: their views say which VIPs node processes reach.
	HostNet4, HostNet6 uint32
}

// lace_config.flags: LACE_CFG_UNDERLAY_GUARD, LACE_CFG_HAS_V4.
const (
	configUnderlayGuard = 1 << 0
	configHasV4         = 1 << 1
)

// Endpoint is a pod address on this node.
type Endpoint struct {
	NetID   uint32
	Addr    netip.Addr
	IfIndex uint32 // host side of the pod's veth
	PodMAC  net.HardwareAddr
	HostMAC net.HardwareAddr
}

// Port is what the programs know of a pod's veth: its network and the
// addresses it may send from.
type Port struct {
	IfIndex uint32
	NetID   uint32
	V4, V6  netip.Addr
	// NetNSCookie is the pod's network namespace when the socket hooks
	// see the pod's processes (AttachHostSockets): they then take the
	// hairpin choice for its sockets. 0: per packet only.
	NetNSCookie uint64
	// L2: a port of an l2 network (from_l2 takes its frames).
	L2 bool
	// Learn: a port of an l2 network that learns (PORT_L2_LEARN).
	Learn bool
}

// Route, Network and Classifier are the values of the routes (views),
// networks and classify maps.
type (
	Route      = tables.Route
	Network    = tables.Network
	Classifier = tables.Classifier
)

// route_val.flags (bpf/include/maps.h): the kind of a view entry.
const (
	routeLocal    = 1
	routeSubnet   = 2
	routeExternal = 4
	routeDeny     = 8
	routeClosed   = 16
	routeService  = 32
)

var routeKindFlags = map[tables.RouteKind]uint32{
	tables.RouteRemote:   0,
	tables.RouteLocal:    routeLocal,
	tables.RouteSubnet:   routeSubnet,
	tables.RouteExternal: routeExternal,
	tables.RouteDeny:     routeDeny,
	tables.RouteService:  routeService,
}

func family(a netip.Addr) uint8 {
	if a.Is4() {
		return 4
	}
	return 6
}

func addr16(a netip.Addr) [16]uint8 {
	var out [16]uint8
	if a.Is4() {
		b := a.As4()
		copy(out[:], b[:])
		return out
	}
	return a.As16()
}

func fromAddr16(fam uint8, b [16]uint8) netip.Addr {
	if fam == 4 {
		return netip.AddrFrom4([4]byte{b[0], b[1], b[2], b[3]})
	}
	return netip.AddrFrom16(b)
}

func mac6(m net.HardwareAddr) [6]uint8 {
	var out [6]uint8
	copy(out[:], m)
	return out
}

// SetConfig writes the node configuration.
func (d *Datapath) SetConfig(c Config) error {
	v := podLaceConfig{UnderlayIp6: c.UnderlayIP.As16(), UnderlayIfindex: c.UnderlayIfIndex}
	if c.GuardUnderlay {
		v.Flags |= configUnderlayGuard
	}
	if c.UnderlayIPv4.Is4() {
		v.Flags |= configHasV4
		v.UnderlayIp4 = c.UnderlayIPv4.As4()
	}
	v.HostNetns, v.HostNet4, v.HostNet6 = c.HostNetNS, c.HostNet4, c.HostNet6
	loc := c.Locator.Masked().Addr().As16()
	copy(v.Locator[:], loc[:8])
	d.tab.mu.Lock()
	defer d.tab.mu.Unlock()
	key, err := d.flowKey()
	if err != nil {
		return err
	}
	v.FlowKey = key
	// Written only when it differs from what was written last.
	if err := d.tab.cfg.sync(map[uint32]podLaceConfig{0: v}, nil); err != nil {
		return fmt.Errorf("write config: %w", err)
	}
	return nil
}

// flowKey is the node's flow hash key (128 bits): the one the pinned
// config holds (an agent before this one drew it), else a new random one.
// Called with d.tab.mu held.
func (d *Datapath) flowKey() ([2]uint64, error) {
	if d.tab.flowKey != [2]uint64{} {
		return d.tab.flowKey, nil
	}
	var cur podLaceConfig
	if err := d.pod.LaceCfg.Lookup(uint32(0), &cur); err != nil {
		return [2]uint64{}, fmt.Errorf("read config: %w", err)
	}
	key := cur.FlowKey
	for key == [2]uint64{} {
		var b [16]byte
		if _, err := rand.Read(b[:]); err != nil {
			return key, fmt.Errorf("draw the flow hash key: %w", err)
		}
		key = [2]uint64{binary.LittleEndian.Uint64(b[:8]), binary.LittleEndian.Uint64(b[8:])}
	}
	d.tab.flowKey = key
	return key, nil
}

// Config reads the node configuration back (the zero Config when none was
// written).
func (d *Datapath) Config() (Config, error) {
	var v podLaceConfig
	if err := d.pod.LaceCfg.Lookup(uint32(0), &v); err != nil {
		return Config{}, fmt.Errorf("read config: %w", err)
	}
	c := Config{UnderlayIfIndex: v.UnderlayIfindex, GuardUnderlay: v.Flags&configUnderlayGuard != 0,
		HostNetNS: v.HostNetns, HostNet4: v.HostNet4, HostNet6: v.HostNet6}
	if ip := netip.AddrFrom16(v.UnderlayIp6); !ip.IsUnspecified() {
		c.UnderlayIP = ip
	}
	if v.Flags&configHasV4 != 0 {
		c.UnderlayIPv4 = netip.AddrFrom4(v.UnderlayIp4)
	}
	var loc [16]byte
	copy(loc[:8], v.Locator[:])
	if l := netip.AddrFrom16(loc); !l.IsUnspecified() {
		c.Locator = netip.PrefixFrom(l, 64)
	}
	return c, nil
}

func endpointKey(netID uint32, a netip.Addr) podEpKey {
	return podEpKey{NetId: netID, Family: family(a), Addr: addr16(a)}
}

func endpointEntry(e Endpoint) (podEpKey, podEpVal) {
	return endpointKey(e.NetID, e.Addr), podEpVal{Ifindex: e.IfIndex, PodMac: mac6(e.PodMAC), HostMac: mac6(e.HostMAC)}
}

// putOne writes one entry through t (the caller holds d.tab.mu).
func putOne[K, V comparable](t *table[K, V], k K, v V) error { return t.put([]K{k}, []V{v}) }

// UpsertEndpoint adds or replaces a local pod address.
func (d *Datapath) UpsertEndpoint(e Endpoint) error {
	k, v := endpointEntry(e)
	d.tab.mu.Lock()
	defer d.tab.mu.Unlock()
	if err := putOne(d.tab.endpoints, k, v); err != nil {
		return fmt.Errorf("put endpoint %s/%d: %w", e.Addr, e.NetID, err)
	}
	return nil
}

// DeleteEndpoint removes a local pod address; a missing one is fine.
func (d *Datapath) DeleteEndpoint(netID uint32, a netip.Addr) error {
	d.tab.mu.Lock()
	defer d.tab.mu.Unlock()
	return d.tab.endpoints.del([]podEpKey{endpointKey(netID, a)})
}

// Endpoints lists the local pod addresses.
func (d *Datapath) Endpoints() ([]Endpoint, error) {
	var out []Endpoint
	var k podEpKey
	var v podEpVal
	it := d.pod.LaceEndpoints.Iterate()
	for it.Next(&k, &v) {
		out = append(out, Endpoint{NetID: k.NetId, Addr: fromAddr16(k.Family, k.Addr), IfIndex: v.Ifindex,
			PodMAC: append(net.HardwareAddr{}, v.PodMac[:]...), HostMAC: append(net.HardwareAddr{}, v.HostMac[:]...)})
	}
	return out, it.Err()
}

// port_val.flags (bpf/include/maps.h).
const (
	portHasV4  = 1
	portHasV6  = 2
	portSockLB = 4
	portL2     = 8
	portLearn  = 16
)

// UpsertPort adds or replaces a pod port. Its namespace's cookie goes in
// first: the port's PORT_SOCK_LB makes from_pod leave the hairpin choice
// to the socket hooks, which must then find the pod.
func (d *Datapath) UpsertPort(p Port) error {
	d.tab.mu.Lock()
	defer d.tab.mu.Unlock()
	if p.NetNSCookie != 0 {
		if err := putOne(d.tab.podNetns, p.NetNSCookie, p.IfIndex); err != nil {
			return fmt.Errorf("record network namespace of port %d: %w", p.IfIndex, err)
		}
	}
	if err := putOne(d.tab.ports, p.IfIndex, portVal(p)); err != nil {
		return err
	}
	return d.forgetNetNS(p.IfIndex, p.NetNSCookie)
}

func portVal(p Port) podPortVal {
	v := podPortVal{NetId: p.NetID}
	if p.V4.IsValid() {
		v.Flags |= portHasV4
		v.Ip4 = p.V4.As4()
	}
	if p.V6.IsValid() {
		v.Flags |= portHasV6
		v.Ip6 = p.V6.As16()
	}
	if p.NetNSCookie != 0 {
		v.Flags |= portSockLB
	}
	if p.L2 {
		v.Flags |= portL2
	}
	if p.L2 && p.Learn {
		v.Flags |= portLearn
	}
	return v
}

// DeletePort removes a pod port (and its namespace's entry); a missing one
// is fine.
func (d *Datapath) DeletePort(ifindex uint32) error {
	d.tab.mu.Lock()
	defer d.tab.mu.Unlock()
	if err := d.tab.ports.del([]uint32{ifindex}); err != nil {
		return err
	}
	// The next pod given this ifindex starts with no policy of the last
	// one: its own come with the next policy sync.
	if err := d.tab.pol.eps.del([]uint32{ifindex}); err != nil {
		return err
	}
	return d.forgetNetNS(ifindex, 0)
}

// forgetNetNS removes the namespace entries of port ifindex other than
// keep, found in the table's mirror (the caller holds d.tab.mu).
func (d *Datapath) forgetNetNS(ifindex uint32, keep uint64) error {
	t := d.tab.podNetns
	if err := t.known(); err != nil {
		return err
	}
	var doomed []uint64
	for k, v := range t.have {
		if v == ifindex && k != keep {
			doomed = append(doomed, k)
		}
	}
	if err := t.del(doomed); err != nil {
		return fmt.Errorf("forget network namespace of port %d: %w", ifindex, err)
	}
	return nil
}

// Ports lists the pod ports.
func (d *Datapath) Ports() ([]Port, error) {
	cookies := map[uint32]uint64{}
	var c uint64
	var ifi uint32
	nit := d.pod.LacePodNetns.Iterate()
	for nit.Next(&c, &ifi) {
		cookies[ifi] = c
	}
	if err := nit.Err(); err != nil {
		return nil, fmt.Errorf("walk pod namespaces: %w", err)
	}
	var out []Port
	var k uint32
	var v podPortVal
	it := d.pod.LacePorts.Iterate()
	for it.Next(&k, &v) {
		p := Port{IfIndex: k, NetID: v.NetId, L2: v.Flags&portL2 != 0, Learn: v.Flags&portLearn != 0}
		if v.Flags&portSockLB != 0 {
			p.NetNSCookie = cookies[k]
		}
		if v.Flags&portHasV4 != 0 {
			p.V4 = netip.AddrFrom4(v.Ip4)
		}
		if v.Flags&portHasV6 != 0 {
			p.V6 = netip.AddrFrom16(v.Ip6)
		}
		out = append(out, p)
	}
	return out, it.Err()
}

func routeKey(netID uint32, p netip.Prefix) podRouteKey {
	return podRouteKey{Prefixlen: uint32(64 + p.Bits()), NetId: netID, Family: family(p.Addr()), Addr: addr16(p.Masked().Addr())}
}

// routeEntry is r's key and value (the key also when r cannot be
// written).
func routeEntry(r Route) (podRouteKey, podRouteVal, error) {
	k := routeKey(r.NetID, r.Prefix)
	flags, ok := routeKindFlags[r.Kind]
	if !ok {
		return k, podRouteVal{}, fmt.Errorf("put route %s/%d: unknown kind %d", r.Prefix, r.NetID, r.Kind)
	}
	v := podRouteVal{Flags: flags, DstNet: r.DstNet}
	if r.Closed {
		v.Flags |= routeClosed
	}
	if r.Kind == tables.RouteRemote {
		v.Sid = r.SID.As16()
	}
	return k, v, nil
}

// UpsertRoute adds or replaces a view entry.
func (d *Datapath) UpsertRoute(r Route) error {
	k, v, err := routeEntry(r)
	if err != nil {
		return err
	}
	d.tab.mu.Lock()
	defer d.tab.mu.Unlock()
	if err := putOne(d.tab.routes, k, v); err != nil {
		return fmt.Errorf("put route %s/%d: %w", r.Prefix, r.NetID, err)
	}
	return nil
}

// DeleteRoute removes a view entry; a missing one is fine.
func (d *Datapath) DeleteRoute(netID uint32, p netip.Prefix) error {
	d.tab.mu.Lock()
	defer d.tab.mu.Unlock()
	return d.tab.routes.del([]podRouteKey{routeKey(netID, p)})
}

// Routes lists the view entries of every network.
func (d *Datapath) Routes() ([]Route, error) {
	var out []Route
	var k podRouteKey
	var v podRouteVal
	it := d.pod.LaceRoutes.Iterate()
	for it.Next(&k, &v) {
		bits := int(k.Prefixlen) - 64
		r := Route{NetID: k.NetId, Prefix: netip.PrefixFrom(fromAddr16(k.Family, k.Addr), bits), DstNet: v.DstNet,
			Closed: v.Flags&routeClosed != 0}
		for kind, f := range routeKindFlags {
			if f != 0 && v.Flags&f != 0 {
				r.Kind = kind
			}
		}
		if r.Kind == tables.RouteRemote {
			r.SID = netip.AddrFrom16(v.Sid)
		}
		out = append(out, r)
	}
	return out, it.Err()
}

func classKey(p netip.Prefix) podClassKey {
	return podClassKey{Prefixlen: uint32(32 + p.Bits()), Family: family(p.Addr()), Addr: addr16(p.Masked().Addr())}
}

// UpsertClassifier classifies plain-IP sources in c.Prefix into c.NetID.
func (d *Datapath) UpsertClassifier(c Classifier) error {
	d.tab.mu.Lock()
	defer d.tab.mu.Unlock()
	if err := putOne(d.tab.classify, classKey(c.Prefix), c.NetID); err != nil {
		return fmt.Errorf("put classifier %s: %w", c.Prefix, err)
	}
	return nil
}

// DeleteClassifier removes the classifier of p; a missing one is fine.
func (d *Datapath) DeleteClassifier(p netip.Prefix) error {
	d.tab.mu.Lock()
	defer d.tab.mu.Unlock()
	return d.tab.classify.del([]podClassKey{classKey(p)})
}

// Classifiers lists the external prefixes that classify sources.
func (d *Datapath) Classifiers() ([]Classifier, error) {
	var out []Classifier
	var k podClassKey
	var v uint32
	it := d.pod.LaceClassify.Iterate()
	for it.Next(&k, &v) {
		out = append(out, Classifier{NetID: v, Prefix: netip.PrefixFrom(fromAddr16(k.Family, k.Addr), int(k.Prefixlen)-32)})
	}
	return out, it.Err()
}

// Inside is a prefix inside the cluster (lace_inside).
type Inside = tables.Inside

// UpsertInside marks sources in in.Prefix as inside the cluster: plain IP
// from the fabric with such a source is dropped (outside-spoofed-source).
func (d *Datapath) UpsertInside(in Inside) error {
	d.tab.mu.Lock()
	defer d.tab.mu.Unlock()
	if err := putOne(d.tab.inside, classKey(in.Prefix), uint32(in.Kind)); err != nil {
		return fmt.Errorf("put inside prefix %s: %w", in.Prefix, err)
	}
	return nil
}

// DeleteInside forgets the inside prefix p; a missing one is fine.
func (d *Datapath) DeleteInside(p netip.Prefix) error {
	d.tab.mu.Lock()
	defer d.tab.mu.Unlock()
	return d.tab.inside.del([]podClassKey{classKey(p)})
}

// Insides lists the prefixes inside the cluster.
func (d *Datapath) Insides() ([]Inside, error) {
	var out []Inside
	var k podClassKey
	var v uint32
	it := d.pod.LaceInside.Iterate()
	for it.Next(&k, &v) {
		out = append(out, Inside{Kind: tables.InsideKind(v), Prefix: netip.PrefixFrom(fromAddr16(k.Family, k.Addr), int(k.Prefixlen)-32)})
	}
	return out, it.Err()
}

// NodeLocator is a node's underlay address and its locator.
type NodeLocator = tables.NodeLocator

// UpsertNodeLocator records that SRv6 from n.Addr speaks for the blocks
// behind n.Locator.
func (d *Datapath) UpsertNodeLocator(n NodeLocator) error {
	k, v := nodeLocEntry(n)
	d.tab.mu.Lock()
	defer d.tab.mu.Unlock()
	if err := putOne(d.tab.nodeLocs, k, v); err != nil {
		return fmt.Errorf("put locator of node %s: %w", n.Addr, err)
	}
	return nil
}

func nodeLocEntry(n NodeLocator) (podHostKey, uint64) {
	loc := n.Locator.Masked().Addr().As16()
	return hostKey(n.Addr), binary.LittleEndian.Uint64(loc[:8])
}

// DeleteNodeLocator forgets the locator of node address a; a missing one
// is fine.
func (d *Datapath) DeleteNodeLocator(a netip.Addr) error {
	d.tab.mu.Lock()
	defer d.tab.mu.Unlock()
	return d.tab.nodeLocs.del([]podHostKey{hostKey(a)})
}

// NodeLocators lists the nodes' addresses with their locators.
func (d *Datapath) NodeLocators() ([]NodeLocator, error) {
	var out []NodeLocator
	var k podHostKey
	var v uint64
	it := d.pod.LaceNodeLocs.Iterate()
	for it.Next(&k, &v) {
		var loc [16]byte
		binary.LittleEndian.PutUint64(loc[:8], v)
		out = append(out, NodeLocator{Addr: fromAddr16(k.Family, k.Addr), Locator: netip.PrefixFrom(netip.AddrFrom16(loc), 64)})
	}
	return out, it.Err()
}

// UpsertNetwork adds or replaces a network.
func (d *Datapath) UpsertNetwork(n Network) error {
	d.tab.mu.Lock()
	defer d.tab.mu.Unlock()
	return putOne(d.tab.networks, n.ID, netVal(n))
}

func netVal(n Network) podNetVal {
	v := podNetVal{}
	if n.Anonymous {
		v.Flags = 1
	}
	return v
}

// DeleteNetwork removes a network; a missing one is fine.
func (d *Datapath) DeleteNetwork(id uint32) error {
	d.tab.mu.Lock()
	defer d.tab.mu.Unlock()
	return d.tab.networks.del([]uint32{id})
}

// Networks lists the networks.
func (d *Datapath) Networks() ([]Network, error) {
	var out []Network
	var k uint32
	var v podNetVal
	it := d.pod.LaceNetworks.Iterate()
	for it.Next(&k, &v) {
		out = append(out, Network{ID: k, Anonymous: v.Flags&1 != 0})
	}
	return out, it.Err()
}

func hostKey(a netip.Addr) podHostKey { return podHostKey{Family: family(a), Addr: addr16(a)} }

func listAddrs(m *ebpf.Map) ([]netip.Addr, error) {
	var out []netip.Addr
	var k podHostKey
	var v uint32
	it := m.Iterate()
	for it.Next(&k, &v) {
		out = append(out, fromAddr16(k.Family, k.Addr))
	}
	return out, it.Err()
}

// UpsertNode marks a as the underlay address of a cluster node: only those
// may send SRv6 packets to this node's pods.
func (d *Datapath) UpsertNode(a netip.Addr) error {
	d.tab.mu.Lock()
	defer d.tab.mu.Unlock()
	return putOne(d.tab.nodes, hostKey(a), 1)
}

// DeleteNode forgets a node address; a missing one is fine.
func (d *Datapath) DeleteNode(a netip.Addr) error {
	d.tab.mu.Lock()
	defer d.tab.mu.Unlock()
	return d.tab.nodes.del([]podHostKey{hostKey(a)})
}

// Nodes lists the known node addresses.
func (d *Datapath) Nodes() ([]netip.Addr, error) { return listAddrs(d.pod.LaceNodes) }

// UpsertHostAddr marks a as an address of this node itself.
func (d *Datapath) UpsertHostAddr(a netip.Addr) error {
	d.tab.mu.Lock()
	defer d.tab.mu.Unlock()
	return putOne(d.tab.hostAddrs, hostKey(a), 1)
}

// DeleteHostAddr forgets a host address; a missing one is fine.
func (d *Datapath) DeleteHostAddr(a netip.Addr) error {
	d.tab.mu.Lock()
	defer d.tab.mu.Unlock()
	return d.tab.hostAddrs.del([]podHostKey{hostKey(a)})
}

// HostAddrs lists this node's own addresses.
func (d *Datapath) HostAddrs() ([]netip.Addr, error) { return listAddrs(d.pod.LaceHostAddrs) }

func sumPerCPU(m *ebpf.Map, names []string) (map[string]uint64, error) {
	out := map[string]uint64{}
	for i, name := range names {
		var per []uint64
		if err := m.Lookup(uint32(i), &per); err != nil {
			return nil, fmt.Errorf("read counter %s: %w", name, err)
		}
		var sum uint64
		for _, v := range per {
			sum += v
		}
		out[name] = sum
	}
	return out, nil
}

// Drops returns the packets dropped, by reason.
func (d *Datapath) Drops() (map[string]uint64, error) { return sumPerCPU(d.pod.LaceDrops, DropReasons) }

// Forwarded returns the packets forwarded, by path.
func (d *Datapath) Forwarded() (map[string]uint64, error) {
	return sumPerCPU(d.pod.LaceForwarded, ForwardCounters)
}

// MapSizes returns the number of entries of the main maps. A map the
// agent programs is counted from its table's mirror when that is known
// (the periodic check keeps the mirror equal to the map): walking the
// 100,000 backends of 10,000 services every few seconds for the node's
// status cost the agent about 6% of its CPU. The maps the programs write
// are walked.
func (d *Datapath) MapSizes() (map[string]int, error) {
	out := map[string]int{}
	t := d.tab
	t.mu.Lock()
	for name, n := range map[string]interface{ size() (int, bool) }{
		"endpoints": t.endpoints, "ports": t.ports, "routes": t.routes, "networks": t.networks, "classify": t.classify,
		"inside": t.inside, "nodes": t.nodes, "services": t.services, "backends": t.backends,
	} {
		if n, ok := n.size(); ok {
			out[name] = n
		}
	}
	t.mu.Unlock()
	for name, m := range map[string]*ebpf.Map{
		"endpoints": d.pod.LaceEndpoints, "ports": d.pod.LacePorts, "routes": d.pod.LaceRoutes,
		"networks": d.pod.LaceNetworks, "classify": d.pod.LaceClassify, "inside": d.pod.LaceInside, "nodes": d.pod.LaceNodes,
		"conntrack": d.pod.LaceCt, "conntrack-new": d.pod.LaceCtNew, "conntrack-local": d.pod.LaceCtLocal, "snat": d.pod.LaceSnat, "services": d.pod.LaceServices, "backends": d.pod.LaceBackends,
		"fragments": d.pod.LaceFrags,
	} {
		if _, ok := out[name]; ok {
			continue
		}
		n, err := d.countEntries(m)
		if err != nil {
			return nil, fmt.Errorf("count %s: %w", name, err)
		}
		out[name] = n
	}
	return out, nil
}

// Flow is one conntrack entry: a flow of a local pod (Local, LocalPort, in
// network NetID) with a remote address, seen from the pod's side.
type Flow struct {
	NetID                 uint32
	Proto                 uint8
	Local, Remote         netip.AddrPort
	PeerNet               uint32
	OpenedLocally         bool
	SeenReply             bool
	FinLocal, FinRemote   bool // FIN seen from the opener / the other side
	Reset                 bool
	SNATPort              uint16 // 0 unless the flow leaves with the node's address
	ExpiresMonotonicNanos uint64 // CLOCK_MONOTONIC deadline
	// Service is set on a client's entry toward a VIP (Remote): NAT is
	// the endpoint chosen. DNAT is set on the translated flow (Remote is
	// the endpoint): NAT is the VIP and port the replies come from.
	Service, DNAT bool
	NAT           netip.AddrPort
	// Assured: the opener spoke again after the reply. A flow waits
	// New until it settles (the other side's: lace_ct_new, short-lived;
	// the pod's, until answered: lace_ct_local; each its own budget).
	Assured, New bool
}

// ct_val.flags (ct.h).
const (
	ctOriginLocal = 1 << iota
	ctSeenReply
	ctFinOrig
	ctFinReply
	ctRST
	ctSNAT
	ctService
	ctDNAT
	ctHairpin
	ctRevNAT
	ctAssured
	ctRSTReply
	ctRSTLocal
	ctFinReplyFirst
)

func ntohs(v uint16) uint16 { return v<<8 | v>>8 }

// ctMaps are the conntrack maps: settled flows, and the pending flows
// opened from the other side and by the node's pods.
func (d *Datapath) ctMaps() []*ebpf.Map {
	return []*ebpf.Map{d.pod.LaceCt, d.pod.LaceCtNew, d.pod.LaceCtLocal}
}

// Conntrack lists the tracked flows, expired ones included (the LRU
// reclaims them; the programs ignore them).
func (d *Datapath) Conntrack() ([]Flow, error) {
	var out []Flow
	for _, m := range d.ctMaps() {
		var k podCtKey
		var v podCtVal
		it := m.Iterate()
		for it.Next(&k, &v) {
			f := Flow{NetID: k.NetId, Proto: k.Proto, PeerNet: v.PeerNet,
				Local:                 netip.AddrPortFrom(fromAddr16(k.Family, k.Laddr), ntohs(k.Lport)),
				Remote:                netip.AddrPortFrom(fromAddr16(k.Family, k.Raddr), ntohs(k.Rport)),
				OpenedLocally:         v.Flags&ctOriginLocal != 0,
				SeenReply:             v.Flags&ctSeenReply != 0,
				Reset:                 v.Flags&ctRST != 0,
				Assured:               v.Flags&ctAssured != 0,
				New:                   m != d.pod.LaceCt,
				ExpiresMonotonicNanos: v.Expires,
			}
			// FIN flags are recorded by direction of the flow's opener.
			fo, fr := v.Flags&ctFinOrig != 0, v.Flags&ctFinReply != 0
			if f.OpenedLocally {
				f.FinLocal, f.FinRemote = fo, fr
			} else {
				f.FinLocal, f.FinRemote = fr, fo
			}
			if v.Flags&ctSNAT != 0 {
				f.SNATPort = ntohs(v.SnatPort)
			}
			f.Service, f.DNAT = v.Flags&ctService != 0, v.Flags&ctDNAT != 0
			if f.Service || f.DNAT {
				f.NAT = netip.AddrPortFrom(fromAddr16(k.Family, v.NatAddr), ntohs(v.NatPort))
			}
			out = append(out, f)
		}
		if err := it.Err(); err != nil {
			return nil, err
		}
	}
	return out, nil
}

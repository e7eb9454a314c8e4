package datapath

import (
	"crypto/rand"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"runtime"
	"time"

	"github.com/cilium/ebpf"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/lace-cni/lace/internal/netpol"
	"github.com/lace-cni/lace/internal/netutil"
	"github.com/lace-cni/lace/internal/tables"
)

// The world FuzzProgPackets runs its packets in: progDatapath's node and
// peer, with network 7's pod at ifindex 1, services, an external network,
// announced VIPs, a NetworkPolicy, and an l2 network (9) with ports here,
// a port on the peer and a migrating MAC.

// The programs a fuzz input picks from.
const (
	fzFromPod = iota
	fzToPod
	fzFromUnderlay
	fzToUnderlay
	fzFromL2
	fzProgs
)

var fzProgNames = [fzProgs]string{"from_pod", "to_pod", "from_underlay", "to_underlay", "from_l2"}

const (
	// fzPodIf is the l3 pod's port and endpoint: ifindex 1, the one
	// device a test run's skb may name (to_pod reads skb->ifindex, which
	// BPF_PROG_RUN sets only to an existing device).
	fzPodIf  = 1
	fzL2Net  = 9
	fzWorld  = 100
	fzPortA  = 5001
	fzPortB  = 5002
	fzPortL  = 5005 // learns
	fzNoPort = 999
	// fzRemoteFloods is how many other nodes an l2 flood copies to.
	fzRemoteFloods = 1
	polFzDeny      = 0x3001
	polFzAllow     = 0x3002
)

var (
	fzRemote4 = netip.MustParseAddr("10.70.2.2")
	fzRemote6 = netip.MustParseAddr("fd00:70:0:2::2")
	fzBackend = netip.MustParseAddr("10.70.2.3")
	fzBack6   = netip.MustParseAddr("fd00:70:0:2::3")
	fzCIP4    = netip.MustParseAddr("10.96.0.10")
	fzCIP6    = netip.MustParseAddr("fd00:96::10")
	fzClient4 = netip.MustParseAddr("203.0.113.5")
	fzClient6 = netip.MustParseAddr("2001:db8::5")
	fzExt4    = netip.MustParseAddr("198.51.100.1")
	fzVIP4    = netip.MustParseAddr("172.31.0.240")
	fzLB4     = netip.MustParseAddr("192.0.2.100")
	fzAnon4   = netip.MustParseAddr("10.111.0.5") // in network 11, anonymous
	fzVIP6    = netip.MustParseAddr("fd00:99::f0")
	fzA4      = netip.MustParseAddr("10.90.1.2")
	fzB4      = netip.MustParseAddr("10.90.1.3")
	fzC4      = netip.MustParseAddr("10.90.1.4")
	fzL4      = netip.MustParseAddr("10.90.1.5")
	fzGw4     = netip.MustParseAddr("10.90.1.1")
	fzA6      = netip.MustParseAddr("fd00:90:0:1::2")
	fzB6      = netip.MustParseAddr("fd00:90:0:1::3")
	fzC6      = netip.MustParseAddr("fd00:90:0:1::4")
	fzL6      = netip.MustParseAddr("fd00:90:0:1::5")
	fzGw6     = netip.MustParseAddr("fd00:90:0:1::1")
	fzPodMAC  = net.HardwareAddr{0x0a, 0x58, 10, 70, 1, 2}
	fzMACA    = net.HardwareAddr{0x0a, 0x58, 10, 90, 1, 2}
	fzMACB    = net.HardwareAddr{0x0a, 0x58, 10, 90, 1, 3}
	fzMACC    = net.HardwareAddr{0x0a, 0x58, 10, 90, 1, 4}
	fzMACL    = net.HardwareAddr{0x0a, 0x58, 10, 90, 1, 5}
	fzMACGw   = net.HardwareAddr{0x0a, 0x5a, 0, 0, 0, 9}
	fzMACVM   = net.HardwareAddr{0x52, 0x54, 0, 0x90, 0, 1} // lives on the peer, standby at port B
)

// fzBuild loads the programs into a bpffs of its own, unmounted again
// once loaded (the programs and maps live on through their descriptors),
// so a fuzz worker that is killed leaves no mount behind. underlay is the
// underlay's ifindex in the namespace the programs run in (fzThread).
func fzBuild(underlay uint32) (*Datapath, error) {
	suffix := make([]byte, 3)
	_, _ = rand.Read(suffix)
	dir := filepath.Join(os.TempDir(), "lfuzz"+hex.EncodeToString(suffix))
	if err := netutil.EnsureBPFFS(dir); err != nil {
		return nil, err
	}
	d, err := Load(filepath.Join(dir, "node"))
	if uerr := netutil.UnmountBPFFS(dir); err == nil && uerr != nil {
		d.Close()
		return nil, uerr
	}
	if err != nil {
		return nil, err
	}
	if err := fzProgram(d, underlay); err != nil {
		d.Close()
		return nil, err
	}
	return d, nil
}

func fzProgram(d *Datapath, underlay uint32) error {
	// A fixed flow hash key: a service picks the same endpoint for an
	// input in every process, so a failure reproduces from the input.
	d.tab.flowKey = [2]uint64{0x1ace, 0xf22}
	p := netip.MustParsePrefix
	host := func(a netip.Addr) netip.Prefix { return netip.PrefixFrom(a, a.BitLen()) }
	remote := func(view uint32, pfx netip.Prefix, dst uint32) Route {
		return Route{NetID: view, Prefix: pfx, DstNet: dst, SID: SID(progOther, BehaviourL3Decap, view, dst)}
	}
	local := func(view uint32, pfx netip.Prefix, dst uint32) Route {
		return Route{NetID: view, Prefix: pfx, Kind: tables.RouteLocal, DstNet: dst}
	}
	ext := func(view uint32, pfx netip.Prefix) Route {
		return Route{NetID: view, Prefix: pfx, Kind: tables.RouteExternal, DstNet: fzWorld}
	}
	svc := func(view uint32, vip netip.Addr) Route {
		return Route{NetID: view, Prefix: host(vip), Kind: tables.RouteService, DstNet: progNet}
	}
	ep := func(net uint32, a netip.Addr, ifindex uint32, mac net.HardwareAddr) Endpoint {
		return Endpoint{NetID: net, Addr: a, IfIndex: ifindex, PodMAC: mac, HostMAC: fzMACGw}
	}
	errs := []error{
		d.SetConfig(Config{UnderlayIP: progNodeV6, UnderlayIPv4: progNodeV4, Locator: progLocator, UnderlayIfIndex: underlay, GuardUnderlay: true}),
		d.UpsertHostAddr(progNodeV4), d.UpsertHostAddr(progNodeV6),
		d.UpsertNode(progNodeV6), d.UpsertNode(progPeerV6),
		d.UpsertNodeLocator(NodeLocator{Addr: progPeerV6, Locator: progOther}),
		d.UpsertNetwork(Network{ID: progNet}), d.UpsertNetwork(Network{ID: fzL2Net}), d.UpsertNetwork(Network{ID: fzWorld}),
		d.UpsertNetwork(Network{ID: tables.NodeNetID}), d.UpsertNetwork(Network{ID: 11, Anonymous: true}),
		d.UpsertClassifier(Classifier{NetID: fzWorld, Prefix: p("203.0.113.0/24")}),
		d.UpsertClassifier(Classifier{NetID: fzWorld, Prefix: p("2001:db8::/32")}),
		d.UpsertPort(Port{IfIndex: fzPodIf, NetID: progNet, V4: progPodV4, V6: progPodV6}),
		d.UpsertPort(Port{IfIndex: fzPortA, NetID: fzL2Net, V4: fzA4, V6: fzA6, L2: true}),
		d.UpsertPort(Port{IfIndex: fzPortB, NetID: fzL2Net, V4: fzB4, V6: fzB6, L2: true}),
		d.UpsertPort(Port{IfIndex: fzPortL, NetID: fzL2Net, V4: fzL4, V6: fzL6, L2: true, Learn: true}),
		d.UpsertEndpoint(ep(progNet, progPodV4, fzPodIf, fzPodMAC)), d.UpsertEndpoint(ep(progNet, progPodV6, fzPodIf, fzPodMAC)),
		d.UpsertEndpoint(ep(fzL2Net, fzA4, fzPortA, fzMACA)), d.UpsertEndpoint(ep(fzL2Net, fzA6, fzPortA, fzMACA)),
		d.UpsertEndpoint(ep(fzL2Net, fzB4, fzPortB, fzMACB)), d.UpsertEndpoint(ep(fzL2Net, fzB6, fzPortB, fzMACB)),
		d.UpsertEndpoint(ep(fzL2Net, fzL4, fzPortL, fzMACL)), d.UpsertEndpoint(ep(fzL2Net, fzL6, fzPortL, fzMACL)),
	}
	for _, in := range []Inside{
		{Prefix: p("10.70.0.0/16"), Kind: tables.InsidePodSubnet}, {Prefix: p("fd00:70::/32"), Kind: tables.InsidePodSubnet},
		{Prefix: p("10.90.0.0/16"), Kind: tables.InsidePodSubnet}, {Prefix: p("fd00:90::/32"), Kind: tables.InsidePodSubnet},
		{Prefix: p("10.96.0.0/16"), Kind: tables.InsideServiceRange}, {Prefix: p("fd00:96::/64"), Kind: tables.InsideServiceRange},
		{Prefix: progLocator, Kind: tables.InsideLocator}, {Prefix: progOther, Kind: tables.InsideLocator},
	} {
		errs = append(errs, d.UpsertInside(in))
	}
	for _, r := range []Route{
		local(progNet, p("10.70.1.0/24"), progNet), local(progNet, p("fd00:70:0:1::/64"), progNet),
		remote(progNet, p("10.70.2.0/24"), progNet), remote(progNet, p("fd00:70:0:2::/64"), progNet),
		svc(progNet, fzCIP4), svc(progNet, fzCIP6), ext(progNet, p("0.0.0.0/0")), ext(progNet, p("::/0")),
		{NetID: progNet, Prefix: p("10.111.0.0/16"), DstNet: 11, Closed: true, SID: SID(progOther, BehaviourL3Decap, progNet, 11)},
		local(fzWorld, p("10.70.1.0/24"), progNet), local(fzWorld, p("fd00:70:0:1::/64"), progNet),
		remote(fzWorld, p("10.70.2.0/24"), progNet), svc(fzWorld, fzCIP4), svc(fzWorld, fzCIP6),
		ext(fzWorld, p("0.0.0.0/0")), ext(fzWorld, p("::/0")),
		local(fzL2Net, p("10.90.1.0/24"), fzL2Net), local(fzL2Net, p("fd00:90:0:1::/64"), fzL2Net),
		remote(fzL2Net, host(fzC4), fzL2Net), remote(fzL2Net, host(fzC6), fzL2Net), svc(fzL2Net, fzCIP4),
	} {
		errs = append(errs, d.UpsertRoute(r))
	}
	be := func(a netip.Addr, port uint16) tables.Backend { return tables.Backend{Addr: a, Port: port} }
	_, err := d.ApplyServices([]Service{
		{VIP: fzCIP4, Proto: 6, Port: 80, NetID: progNet, Backends: []tables.Backend{be(progPodV4, 8080), be(fzBackend, 8080)}},
		{VIP: fzCIP4, Proto: 17, Port: 53, NetID: progNet, Backends: []tables.Backend{be(progPodV4, 53)}},
		{VIP: fzCIP4, Proto: 6, Port: 81, NetID: progNet},
		{VIP: fzCIP4, Proto: 6, Port: 443, NetID: progNet, Backends: []tables.Backend{be(progNodeV4, 8443)}}, // a hostNetwork pod's
		{VIP: fzCIP6, Proto: 6, Port: 80, NetID: progNet, Backends: []tables.Backend{be(fzBack6, 8080)}},
		{VIP: progNodeV4, Proto: 6, Port: 30080, NetID: progNet, Backends: []tables.Backend{be(progPodV4, 8080)},
			Frontend: tables.FrontendNodePort, ClusterIP: fzCIP4, ClusterPort: 80},
		{VIP: progNodeV6, Proto: 6, Port: 30080, NetID: progNet, Backends: []tables.Backend{be(fzBack6, 8080)},
			Frontend: tables.FrontendNodePort, ClusterIP: fzCIP6, ClusterPort: 80},
		{VIP: progNodeV4, Proto: 6, Port: 30081, NetID: progNet, Backends: []tables.Backend{be(progPodV4, 8080)},
			Frontend: tables.FrontendNodePort, ClusterIP: fzCIP4, ClusterPort: 80, Closed: true},
		{VIP: progNodeV4, Proto: 6, Port: 30082, NetID: progNet, Drop: true,
			Frontend: tables.FrontendNodePort, ClusterIP: fzCIP4, ClusterPort: 80, Local: true},
		{VIP: fzLB4, Proto: 6, Port: 80, NetID: progNet, Backends: []tables.Backend{be(progPodV4, 8080), be(fzBackend, 8080)},
			Frontend: tables.FrontendLoadBalancer, ClusterIP: fzCIP4, ClusterPort: 80, AffinitySeconds: 60,
			SourceRanges: []netip.Prefix{p("203.0.113.0/25")}},
		{VIP: progNodeV4, Proto: 17, Port: 5353, NetID: progNet, Backends: []tables.Backend{be(progPodV4, 53)},
			Frontend: tables.FrontendHostPort, ClusterIP: progPodV4, ClusterPort: 53},
	})
	errs = append(errs, err,
		d.SetAnnounced([]netip.Addr{fzVIP4, fzVIP6}, net.HardwareAddr{2, 0, 0, 0, 0, 0x0b}, 24*time.Hour),
		d.SyncL2Local([]L2Neighbor{
			{NetID: fzL2Net, Addr: fzA4, MAC: fzMACA}, {NetID: fzL2Net, Addr: fzA6, MAC: fzMACA},
			{NetID: fzL2Net, Addr: fzB4, MAC: fzMACB}, {NetID: fzL2Net, Addr: fzB6, MAC: fzMACB},
			{NetID: fzL2Net, Addr: fzL4, MAC: fzMACL}, {NetID: fzL2Net, Addr: fzL6, MAC: fzMACL},
			{NetID: fzL2Net, Addr: fzGw4, MAC: fzMACGw, Router: true}, {NetID: fzL2Net, Addr: fzGw6, MAC: fzMACGw, Router: true},
		}, []FDBEntry{
			{NetID: fzL2Net, MAC: fzMACA, IfIndex: fzPortA}, {NetID: fzL2Net, MAC: fzMACB, IfIndex: fzPortB},
			{NetID: fzL2Net, MAC: fzMACL, IfIndex: fzPortL}, {NetID: fzL2Net, MAC: fzMACGw, Gateway: true},
		}),
		d.SyncL2Cluster([]L2Neighbor{{NetID: fzL2Net, Addr: fzC4, MAC: fzMACC}, {NetID: fzL2Net, Addr: fzC6, MAC: fzMACC}},
			[]FDBEntry{
				{NetID: fzL2Net, MAC: fzMACC, SID: SID(progOther, BehaviourL2IP, fzL2Net, fzL2Net)},
				{NetID: fzL2Net, MAC: fzMACVM, SID: SID(progOther, BehaviourL2IP, fzL2Net, fzL2Net), StandbyIfIndex: fzPortB},
			},
			[]L2FloodNode{{NetID: fzL2Net, SID: SID(progOther, BehaviourL2Flood, fzL2Net, fzL2Net)}}),
		// The pod takes TCP 8080 and UDP 53 from the world, the service
		// range (its own flows through its services come from their
		// VIPs) and the l2 network, TCP 8080 from port A, anything from
		// the peer's block; port B UDP 7 from port A. The rest is
		// refused.
		d.SyncPolicies(netpol.Tables{
			Endpoints: map[uint32]netpol.Endpoint{
				fzPodIf: {Lookup: netpol.Ingress, Isolated: netpol.Ingress, DenyIn: polFzDeny},
				fzPortB: {Lookup: netpol.Ingress, Isolated: netpol.Ingress, DenyIn: polFzDeny},
				fzPortL: {Lookup: netpol.Egress, Isolated: netpol.Egress, DenyOut: polFzDeny},
			},
			Peers: map[netpol.PeerKey]uint32{{NetID: fzL2Net, Addr: fzA4}: 5},
			CIDRs: map[netip.Prefix]uint32{p("203.0.113.0/24"): 9, p("10.96.0.0/16"): 9, p("10.90.0.0/16"): 9, p("10.70.2.0/24"): 6},
			Verdicts: map[netpol.VerdictKey]netpol.Verdict{
				{Ifindex: fzPodIf, Class: 9, Dir: netpol.Ingress, Proto: 6, Port: 8080, PrefixLen: 96}: {Policy: polFzAllow, Allow: true},
				{Ifindex: fzPodIf, Class: 9, Dir: netpol.Ingress, Proto: 17, Port: 53, PrefixLen: 96}:  {Policy: polFzAllow, Allow: true},
				{Ifindex: fzPodIf, Class: 5, Dir: netpol.Ingress, Proto: 6, Port: 8080, PrefixLen: 96}: {Policy: polFzAllow, Allow: true},
				{Ifindex: fzPodIf, Class: 6, Dir: netpol.Ingress, PrefixLen: 72}:                       {Policy: polFzAllow, Allow: true},
				{Ifindex: fzPortB, Class: 5, Dir: netpol.Ingress, Proto: 17, Port: 7, PrefixLen: 96}:   {Policy: polFzAllow, Allow: true},
			},
			Policies: map[uint32]netpol.PolicyRef{
				polFzDeny: {Kind: "NetworkPolicy", Namespace: "fz", Name: "deny"}, polFzAllow: {Kind: "NetworkPolicy", Namespace: "fz", Name: "allow"},
			},
		}),
	)
	return errors.Join(errs...)
}

// fzDataLimits finds the packet sizes BPF_PROG_RUN takes, with frames
// to_underlay passes untouched: at most a page less the skb's headroom
// and shared info (3712 bytes on x86-64 with 4 KiB pages), at least an
// Ethernet header, and (since Linux 6.x) the IPv4 or IPv6 header a frame
// of that ethertype announces. Outside them the run fails with EINVAL.
func fzDataLimits(th *fzThread, d *Datapath) (maxData int, minIP map[uint16]int, err error) {
	runs := func(n int, ethertype uint16) bool {
		b := make([]byte, n)
		if n >= ethHeaderLen {
			binary.BigEndian.PutUint16(b[12:14], ethertype)
		}
		var err error
		th.call(func() { _, err = d.underlay.ToUnderlay.Run(&ebpf.RunOptions{Data: b}) })
		return err == nil
	}
	if !runs(ethHeaderLen, 0) || runs(ethHeaderLen-1, 0) {
		return 0, nil, errors.New("BPF_PROG_RUN does not take exactly what holds an Ethernet header")
	}
	lo, hi := ethHeaderLen, 1<<16
	for lo+1 < hi {
		if mid := (lo + hi) / 2; runs(mid, 0) {
			lo = mid
		} else {
			hi = mid
		}
	}
	minIP = map[uint16]int{}
	for _, et := range []uint16{0x0800, 0x86dd} {
		n := ethHeaderLen
		for n < 128 && !runs(n, et) {
			n++
		}
		minIP[et] = n
	}
	return lo, minIP, nil
}

const ethHeaderLen = 14

// fzThread is the one OS thread the programs run on, in a network
// namespace of its own made by unshare (no mount, gone with the process
// however it ends), where the underlay is a veth of MTU 1400 with routes
// and neighbours: a test run executes in its caller's namespace, so
// encapsulation, SNAT and the l2 floods find a next hop there (sent, or
// resolved by the kernel for the IPv6 default route, whose neighbour is
// unknown), and a pod's large packet meets the underlay's MTU. Devices in
// the tests' own namespace would make a fuzz worker's TestMain find it no
// longer fresh (isolated).
type fzThread struct{ do chan func() }

func (th *fzThread) call(f func()) {
	done := make(chan struct{})
	th.do <- func() { f(); close(done) }
	<-done
}

// fzStartThread starts the thread and returns it with the underlay's
// ifindex.
func fzStartThread() (*fzThread, uint32, error) {
	th := &fzThread{do: make(chan func())}
	ready := make(chan error)
	var ifindex uint32
	go func() {
		// Never unlocked: the thread leaves with its namespace when this
		// goroutine ends, and no other goroutine ever runs on it.
		runtime.LockOSThread()
		err := unix.Unshare(unix.CLONE_NEWNET)
		if err == nil {
			ifindex, err = fzUnderlay()
		}
		ready <- err
		if err != nil {
			return
		}
		for f := range th.do {
			f()
		}
	}()
	return th, ifindex, <-ready
}

func fzUnderlay() (uint32, error) {
	mac := func(b byte) net.HardwareAddr { return net.HardwareAddr{2, 0, 0, 0, 0, b} }
	cidr := func(s string) *net.IPNet {
		ip, n, _ := net.ParseCIDR(s)
		n.IP = ip
		return n
	}
	if err := netlink.LinkAdd(&netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: "fz0", MTU: 1400}, PeerName: "fz1"}); err != nil {
		return 0, err
	}
	ul, err := netlink.LinkByName("fz0")
	if err != nil {
		return 0, err
	}
	peer, err := netlink.LinkByName("fz1")
	if err != nil {
		return 0, err
	}
	i := ul.Attrs().Index
	// bpf_fib_lookup answers only where the node forwards. Sysctls are
	// the namespace's of the thread that opens them: this one's.
	sysctl := func(path string) error { return os.WriteFile("/proc/sys/net/"+path, []byte("1"), 0) }
	errs := []error{netlink.LinkSetUp(ul), netlink.LinkSetUp(peer),
		sysctl("ipv4/conf/all/forwarding"), sysctl("ipv4/conf/fz0/forwarding"), sysctl("ipv6/conf/all/forwarding"),
		netlink.AddrAdd(ul, &netlink.Addr{IPNet: cidr("172.31.0.1/24")}),
		netlink.AddrAdd(ul, &netlink.Addr{IPNet: cidr("fd00:99::1/64"), Flags: unix.IFA_F_NODAD}),
		netlink.NeighAdd(&netlink.Neigh{LinkIndex: i, IP: progPeerV6.AsSlice(), HardwareAddr: mac(2), State: netlink.NUD_PERMANENT}),
		netlink.NeighAdd(&netlink.Neigh{LinkIndex: i, IP: net.ParseIP("172.31.0.254"), HardwareAddr: mac(0xfe), State: netlink.NUD_PERMANENT}),
		netlink.RouteAdd(&netlink.Route{LinkIndex: i, Dst: cidr(progOther.String()), Gw: progPeerV6.AsSlice()}),
		netlink.RouteAdd(&netlink.Route{LinkIndex: i, Dst: cidr("0.0.0.0/0"), Gw: net.ParseIP("172.31.0.254")}),
		netlink.RouteAdd(&netlink.Route{LinkIndex: i, Dst: cidr("::/0"), Gw: net.ParseIP("fd00:99::fe")}),
	}
	return uint32(i), errors.Join(errs...)
}

// fzRun is one program run: a packet and the context fields it sets.
type fzRun struct {
	prog    int
	pkt     []byte
	ingress uint32 // __sk_buff.ingress_ifindex: the port of from_pod and from_l2
	mark    uint32
}

func (r fzRun) ctx() []byte {
	b := make([]byte, 44)
	binary.LittleEndian.PutUint32(b[8:12], r.mark)
	binary.LittleEndian.PutUint32(b[36:40], r.ingress)
	binary.LittleEndian.PutUint32(b[40:44], fzPodIf) // to_pod's port
	return b
}

// fzTemplate is a valid packet for one program, which a fuzz input
// mutates. open, when set, runs first (its verdict checked too): it leaves
// the state the packet answers (a flow, a translation, a first
// fragment), and reply, when set, builds the packet from what open sent
// (the node port a translation took; nil when open did not run).
type fzTemplate struct {
	name  string
	run   fzRun
	open  *fzRun
	reply func(out []byte) []byte
}

func fzPod(pkt []byte) fzRun    { return fzRun{prog: fzFromPod, pkt: pkt, ingress: fzPodIf} }
func fzUnder(pkt []byte) fzRun  { return fzRun{prog: fzFromUnderlay, pkt: pkt} }
func fzEgress(pkt []byte) fzRun { return fzRun{prog: fzToUnderlay, pkt: pkt} }
func fzL2(pkt []byte) fzRun     { return fzRun{prog: fzFromL2, pkt: pkt, ingress: fzPortA} }
func fz4(src, dst netip.Addr, proto byte, l4 []byte) []byte {
	return ether(unicastMAC, 0x0800, ipv4(src, dst, proto, l4))
}
func fz6(src, dst netip.Addr, proto byte, l4 []byte) []byte {
	return ether(unicastMAC, 0x86dd, ipv6(src, dst, proto, l4))
}

// fzSRv6 is SRv6 from the peer node to this node's SID for srcNet ->
// dstNet (behaviour b) around inner (next header next).
func fzSRv6(b uint8, srcNet, dstNet uint32, next byte, inner []byte) []byte {
	return ether(unicastMAC, 0x86dd, ipv6(progPeerV6, SID(progLocator, b, srcNet, dstNet), next, inner))
}

// fzTagged puts an 802.1Q (or 802.1ad) tag after the frame's MACs.
func fzTagged(tpid uint16, pkt []byte) []byte {
	out := append([]byte(nil), pkt[:12]...)
	out = binary.BigEndian.AppendUint16(out, tpid)
	out = binary.BigEndian.AppendUint16(out, 42)
	return append(out, pkt[12:]...)
}

// fzL2Frame is an IP frame of the l2 network from port A's MAC to dst.
func fzL2Frame(dst net.HardwareAddr, src, to netip.Addr, proto byte, l4 []byte) []byte {
	if src.Is4() {
		return fromMAC(fzMACA, ether(dst, 0x0800, ipv4(src, to, proto, l4)))
	}
	return fromMAC(fzMACA, ether(dst, 0x86dd, ipv6(src, to, proto, l4)))
}

func fzSynAck(sport, dport uint16) []byte { return seg4(sport, dport, 0x12) }

// fzSNATPort is the node port the pod's packet out left with (IPv4, after
// the Ethernet and IP headers: the UDP source port).
func fzSNATPort(out []byte) uint16 {
	if len(out) < 36 {
		return 0
	}
	return binary.BigEndian.Uint16(out[34:36])
}

// fzTemplates: append new ones at the end only, as inputs (the corpus
// in testdata) name a template by its index.
var fzTemplates = func() []fzTemplate {
	bcast := net.HardwareAddr{0xff, 0xff, 0xff, 0xff, 0xff, 0xff}
	// Padded to Ethernet's shortest frame, as l2_flood_remote sends
	// them (the receiver takes the outer headers off what follows).
	flood := func(frame []byte) []byte {
		frame = append(frame, make([]byte, max(0, 60-len(frame)))...)
		return fzSRv6(BehaviourL2Flood, fzL2Net, fzL2Net, 143, frame)
	}
	fromC := func(pkt []byte) []byte { return fromMAC(fzMACC, pkt) }
	hopByHop := func(next byte, rest []byte) []byte { return append([]byte{next, 0, 1, 4, 0, 0, 0, 0}, rest...) }
	fragHdr := func(next byte, rest []byte) []byte { return append([]byte{next, 0, 0, 1, 0, 0, 0, 9}, rest...) }
	payload := make([]byte, 16)
	snatOpen := fzPod(fz4(progPodV4, fzExt4, 17, udp(1000, 53)))
	return []fzTemplate{
		// from_pod: what the pod at ifindex 1 sends.
		{name: "pod UDP to a remote pod", run: fzPod(fz4(progPodV4, fzRemote4, 17, udp(1000, 7)))},
		{name: "pod TCP SYN to a remote pod (IPv6)", run: fzPod(fz6(progPodV6, fzRemote6, 6, tcpSYN(1000, 7)))},
		{name: "pod TCP SYN to a ClusterIP", run: fzPod(fz4(progPodV4, fzCIP4, 6, tcpSYN(40000, 80)))},
		{name: "pod UDP to its own service (hairpin)", run: fzPod(fz4(progPodV4, fzCIP4, 17, udp(40000, 53)))},
		{name: "pod TCP to a service without endpoints", run: fzPod(fz4(progPodV4, fzCIP4, 6, tcpSYN(40000, 81)))},
		{name: "pod TCP SYN to an IPv6 ClusterIP", run: fzPod(fz6(progPodV6, fzCIP6, 6, tcpSYN(40000, 80)))},
		{name: "pod ICMP echo to the outside (SNAT)", run: fzPod(fz4(progPodV4, fzExt4, 1, icmpEcho(false)))},
		{name: "pod UDP larger than the underlay carries", run: fzPod(fz4(progPodV4, fzRemote4, 17, append(udp(1000, 7), make([]byte, 1400)...)))},
		{name: "pod UDP with TTL 1", run: fzPod(withTTL(fz4(progPodV4, fzRemote4, 17, udp(33434, 33434)), 1))},
		{name: "pod UDP with hop limit 1", run: fzPod(withTTL(fz6(progPodV6, fzRemote6, 17, udp(33434, 33434)), 1))},
		{name: "pod ICMP error about no flow", run: fzPod(fz4(progPodV4, fzRemote4, 1, icmpUnreach(false, ipv4(fzRemote4, progPodV4, 17, udp(7, 1000)))))},
		{name: "pod IPv6 first fragment", run: fzPod(fz6(progPodV6, fzRemote6, 44, fragHdr(17, udp(1000, 7))))},
		{name: "pod later fragment without its first", run: fzPod(fragPkt(progPodV4, fzRemote4, 17, 78, 16, false, payload))},
		{name: "pod TCP SYN to the node", run: fzPod(fz4(progPodV4, progNodeV4, 6, tcpSYN(1000, 22)))},
		{name: "pod SYN-ACK to the node", run: fzPod(fz4(progPodV4, progNodeV4, 6, fzSynAck(8080, 40000)))},
		{name: "pod router solicitation", run: fzPod(fz6(progPodV6, netip.MustParseAddr("ff02::2"), 58, []byte{133, 0, 0, 0}))},
		{name: "pod UDP to an anonymous network", run: fzPod(fz4(progPodV4, fzAnon4, 17, udp(1, 7)))},
		{name: "pod UDP to an absent local pod", run: fzPod(fz4(progPodV4, netip.MustParseAddr("10.70.1.99"), 17, udp(1, 7)))},
		{name: "pod later fragment after its first", open: ptr(fzPod(fragPkt(progPodV4, fzRemote4, 17, 77, 0, true, append(udp(1000, 7), payload...)))),
			run: fzPod(fragPkt(progPodV4, fzRemote4, 17, 77, 24, false, payload))},
		{name: "pod answer to a NodePort client", open: ptr(fzUnder(fz4(fzClient4, progNodeV4, 6, tcpSYN(5555, 30080)))),
			run: fzPod(fz4(progPodV4, fzClient4, 6, fzSynAck(8080, 5555)))},
		// to_pod: what the node's stack sends the pod.
		{name: "node TCP to the pod", run: fzRun{prog: fzToPod, pkt: fz4(progNodeV4, progPodV4, 6, fzSynAck(8080, 40000))}},
		{name: "hostNetwork endpoint's answer to the pod's service flow", open: ptr(fzPod(fz4(progPodV4, fzCIP4, 6, tcpSYN(40000, 443)))),
			run: fzRun{prog: fzToPod, pkt: fz4(progNodeV4, progPodV4, 6, fzSynAck(8443, 40000))}},
		{name: "node UDP to the pod (IPv6)", run: fzRun{prog: fzToPod, pkt: fz6(progNodeV6, progPodV6, 17, udp(53, 40000))}},
		// from_underlay: SRv6 from the peer, plain IP from outside.
		{name: "SRv6 UDP from the peer's pod", run: fzUnder(fzSRv6(BehaviourL3Decap, progNet, progNet, 4, ipv4(fzRemote4, progPodV4, 17, udp(1000, 7))))},
		{name: "SRv6 TCP SYN from the peer's pod (IPv6)", run: fzUnder(fzSRv6(BehaviourL3Decap, progNet, progNet, 41, ipv6(fzRemote6, progPodV6, 6, tcpSYN(1000, 7))))},
		{name: "SRv6 reply to the pod's flow", open: ptr(fzPod(fz4(progPodV4, fzRemote4, 17, udp(1000, 7)))),
			run: fzUnder(fzSRv6(BehaviourL3Decap, progNet, progNet, 4, ipv4(fzRemote4, progPodV4, 17, udp(7, 1000))))},
		{name: "SRv6 endpoint's answer to the pod's service flow", open: ptr(fzPod(fz6(progPodV6, fzCIP6, 6, tcpSYN(40000, 80)))),
			run: fzUnder(fzSRv6(BehaviourL3Decap, progNet, progNet, 41, ipv6(fzBack6, progPodV6, 6, fzSynAck(8080, 40000))))},
		{name: "SRv6 fragment", run: fzUnder(fzSRv6(BehaviourL3Decap, progNet, progNet, 44, fragHdr(4, ipv4(fzRemote4, progPodV4, 17, udp(1, 7)))))},
		{name: "SRv6 hop-by-hop", run: fzUnder(fzSRv6(BehaviourL3Decap, progNet, progNet, 0, hopByHop(4, ipv4(fzRemote4, progPodV4, 17, udp(1, 7)))))},
		{name: "SRv6 ICMP error about no flow", run: fzUnder(fzSRv6(BehaviourL3Decap, progNet, progNet, 4, ipv4(fzRemote4, progPodV4, 1, icmpUnreach(false, ipv4(progPodV4, fzRemote4, 17, udp(1000, 7))))))},
		{name: "SRv6 in the nodes' context", run: fzUnder(fzSRv6(BehaviourL3Decap, progNet, tables.NodeNetID, 4, ipv4(fzBackend, progNodeV4, 6, fzSynAck(8080, 61000))))},
		{name: "SRv6 switched frame to port A", run: fzUnder(fzSRv6(BehaviourL2IP, fzL2Net, fzL2Net, 4, ipv4(fzC4, fzA4, 17, udp(1000, 7))))},
		{name: "SRv6 flooded ARP request", run: fzUnder(flood(fromC(arpRequest(fzMACC, fzC4, netip.MustParseAddr("10.90.1.77")))))},
		{name: "SRv6 flooded gratuitous ARP", run: fzUnder(flood(fromC(arpRequest(fzMACC, fzC4, fzC4))))},
		{name: "SRv6 flooded IPv4 broadcast", run: fzUnder(flood(fromC(ether(bcast, 0x0800, ipv4(fzC4, netip.MustParseAddr("10.90.1.255"), 17, udp(68, 67))))))},
		{name: "SRv6 flooded RARP", run: fzUnder(flood(rarp(fzMACC)))},
		{name: "outside TCP SYN to a NodePort", run: fzUnder(fz4(fzClient4, progNodeV4, 6, tcpSYN(5555, 30080)))},
		{name: "outside TCP SYN to an IPv6 NodePort", run: fzUnder(fz6(fzClient6, progNodeV6, 6, tcpSYN(5555, 30080)))},
		{name: "outside TCP larger than the underlay carries to an IPv6 NodePort", run: fzUnder(fz6(fzClient6, progNodeV6, 6, append(tcpSYN(5555, 30080), make([]byte, 1400)...)))},
		{name: "outside TCP SYN to a LoadBalancer", run: fzUnder(fz4(fzClient4, fzLB4, 6, tcpSYN(5555, 80)))},
		{name: "outside TCP SYN to a LoadBalancer from outside its source ranges", run: fzUnder(fz4(netip.MustParseAddr("203.0.113.200"), fzLB4, 6, tcpSYN(5555, 80)))},
		{name: "outside TCP SYN to a closed NodePort", run: fzUnder(fz4(fzClient4, progNodeV4, 6, tcpSYN(5555, 30081)))},
		{name: "outside TCP SYN to a Local NodePort without local endpoints", run: fzUnder(fz4(fzClient4, progNodeV4, 6, tcpSYN(5555, 30082)))},
		{name: "outside UDP to a hostPort", run: fzUnder(fz4(fzClient4, progNodeV4, 17, udp(5555, 5353)))},
		{name: "outside TCP SYN to the pod", run: fzUnder(fz4(fzClient4, progPodV4, 6, tcpSYN(5555, 8080)))},
		{name: "unclassified UDP to the pod", run: fzUnder(fz4(netip.MustParseAddr("192.0.2.9"), progPodV4, 17, udp(1, 7)))},
		{name: "outside reply to a SNAT port", run: fzUnder(nil), open: &snatOpen, reply: func(out []byte) []byte {
			return fz4(fzExt4, progNodeV4, 17, udp(53, fzSNATPort(out)))
		}},
		{name: "outside ICMP error about a SNAT flow", run: fzUnder(nil), open: &snatOpen, reply: func(out []byte) []byte {
			quote := make([]byte, 28)
			if len(out) >= 14+28 {
				copy(quote, out[14:14+28])
			}
			return fz4(fzExt4, progNodeV4, 1, icmpUnreach(false, quote))
		}},
		{name: "ARP request for an announced VIP", run: fzUnder(arpRequest(unicastMAC, netip.MustParseAddr("172.31.0.9"), fzVIP4))},
		{name: "NS for an announced VIP", run: fzUnder(neighbourSolicitation(netip.MustParseAddr("fd00:99::9"), fzVIP6, unicastMAC))},
		{name: "802.1Q-tagged IPv4 to the node", run: fzUnder(fzTagged(0x8100, fz4(fzClient4, progNodeV4, 17, udp(1, 53))))},
		// to_underlay: what the node sends to the fabric.
		{name: "node's own SRv6 (marked)", run: fzRun{prog: fzToUnderlay, mark: laceMarkEncap,
			pkt: ether(unicastMAC, 0x86dd, ipv6(progNodeV6, SID(progOther, BehaviourL3Decap, progNet, progNet), 4, ipv4(progPodV4, fzRemote4, 17, udp(1000, 7))))}},
		{name: "unmarked SRv6 to a locator", run: fzEgress(ether(unicastMAC, 0x86dd, ipv6(progNodeV6, SID(progOther, BehaviourL3Decap, progNet, progNet), 4, ipv4(progPodV4, fzRemote4, 17, udp(1000, 7)))))},
		{name: "node TCP answer to a client", run: fzEgress(fz4(progNodeV4, fzClient4, 6, fzSynAck(30080, 5555)))},
		{name: "QinQ-tagged IPv6 from the peer's address", run: fzEgress(fzTagged(0x88a8, fzTagged(0x8100, fz6(progPeerV6, fzClient6, 17, udp(1, 2)))))},
		{name: "NA claiming the peer's address", run: fzEgress(fz6(netip.MustParseAddr("fe80::1"), netip.MustParseAddr("ff02::1"), 58,
			append([]byte{136, 0, 0, 0, 0x20, 0, 0, 0}, progPeerV6.AsSlice()...)))},
		// from_l2: what the l2 ports send (port A unless said).
		{name: "l2 ARP request for a peer", run: fzL2(fromMAC(fzMACA, arpRequest(fzMACA, fzA4, fzB4)))},
		{name: "l2 ARP request for an unknown address", run: fzL2(fromMAC(fzMACA, arpRequest(fzMACA, fzA4, netip.MustParseAddr("10.90.1.77"))))},
		{name: "l2 NS for the gateway", run: fzL2(fromMAC(fzMACA, neighbourSolicitation(fzA6, fzGw6, fzMACA)))},
		{name: "l2 UDP 7 to port B", run: fzL2(fzL2Frame(fzMACB, fzA4, fzB4, 17, udp(1000, 7)))},
		{name: "l2 IPv6 UDP to port B", run: fzL2(fzL2Frame(fzMACB, fzA6, fzB6, 17, udp(1000, 7)))},
		{name: "l2 UDP to the peer's port", run: fzL2(fzL2Frame(fzMACC, fzA4, fzC4, 17, udp(1000, 7)))},
		{name: "l2 IPv4 broadcast", run: fzL2(fzL2Frame(bcast, fzA4, netip.MustParseAddr("10.90.1.255"), 17, udp(68, 67)))},
		{name: "l2 TCP SYN to a ClusterIP through the gateway", run: fzL2(fzL2Frame(fzMACGw, fzA4, fzCIP4, 6, tcpSYN(40000, 80)))},
		{name: "l2 IPv6 hop-by-hop carrying ND", run: fzL2(fzL2Frame(fzMACB, fzA6, fzB6, 0, hopByHop(58, []byte{135, 0, 0, 0})))},
		{name: "l2 RARP", run: fzL2(rarp(fzMACA))},
		{name: "l2 learning port ARP for an unknown address", run: fzRun{prog: fzFromL2, ingress: fzPortL,
			pkt: fromMAC(fzMACL, arpRequest(fzMACL, fzL4, netip.MustParseAddr("10.90.1.77")))}},
		{name: "l2 learning port IPv4 broadcast", run: fzRun{prog: fzFromL2, ingress: fzPortL,
			pkt: fromMAC(fzMACL, ether(bcast, 0x0800, ipv4(fzL4, netip.MustParseAddr("10.90.1.255"), 17, udp(68, 67))))}},
		{name: "l2 learning port frame from an unknown MAC", run: fzRun{prog: fzFromL2, ingress: fzPortL,
			pkt: fromMAC(net.HardwareAddr{0x52, 0x54, 0, 1, 2, 3}, ether(fzMACA, 0x0800, ipv4(netip.MustParseAddr("10.90.1.66"), fzA4, 17, udp(1, 7))))}},
		{name: "l2 migrating VM's RARP at its standby port", run: fzRun{prog: fzFromL2, ingress: fzPortB, pkt: rarp(fzMACVM)}},
	}
}()

func ptr[T any](v T) *T { return &v }

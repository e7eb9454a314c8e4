package datapath_test

import (
	"bufio"
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/lace-cni/lace/internal/datapath"
	"github.com/lace-cni/lace/internal/netutil"
	"github.com/lace-cni/lace/internal/podnet"
	"github.com/lace-cni/lace/internal/tables"
	"github.com/lace-cni/lace/internal/testutil"
)

// world is a small cluster made of namespaces: a fabric bridge, nodes with
// eth0 on it, and pods wired by podnet with the data plane attached, as
// the agent does, but without an API server.
type world struct {
	t      *testing.T
	prefix string
	bpffs  string
	fabric string
	nodes  []*node
	nets   map[uint32]net4
}

type net4 struct {
	id        uint32
	v4, v6    netip.Prefix // subnets
	anonymous bool
}

type node struct {
	w       *world
	name    string
	ns      string // namespace name
	index   int
	v6      netip.Addr
	v4      netip.Addr
	locator netip.Prefix
	pinDir  string
	dp      *datapath.Datapath
}

type pod struct {
	name   string
	node   *node
	ns     string
	netID  uint32
	v4, v6 netip.Addr
	hostIf string
}

func needRoot(t *testing.T) {
	t.Helper()
	testutil.NeedRoot(t, "network namespaces, eBPF")
}

func newWorld(t *testing.T, nodes int) *world {
	needRoot(t)
	suffix := make([]byte, 3)
	_, _ = rand.Read(suffix)
	w := &world{t: t, prefix: "ldp" + hex.EncodeToString(suffix), nets: map[uint32]net4{}}
	w.bpffs = filepath.Join(os.TempDir(), w.prefix+"-bpffs")
	t.Cleanup(w.cleanup)
	if err := netutil.EnsureBPFFS(w.bpffs); err != nil {
		t.Fatal(err)
	}
	w.fabric = w.prefix + "-fabric"
	must(t, netutil.CreateNamed(w.fabric))
	must(t, netutil.EnsureBridge(netutil.Path(w.fabric), "br0"))
	for i := 1; i <= nodes; i++ {
		n := &node{w: w, index: i, name: fmt.Sprintf("n%d", i), ns: fmt.Sprintf("%s-n%d", w.prefix, i),
			v6:      netip.MustParseAddr(fmt.Sprintf("fd00:99::%d", i)),
			v4:      netip.MustParseAddr(fmt.Sprintf("172.31.0.%d", i)),
			locator: netip.MustParsePrefix(fmt.Sprintf("fd1a:ce:0:%d::/64", i))}
		must(t, netutil.CreateNamed(n.ns))
		must(t, netutil.EnsureVeth(netutil.VethSpec{NSPath: netutil.Path(w.fabric), Name: n.name, Master: "br0",
			PeerNSPath: netutil.Path(n.ns), PeerName: "eth0"}))
		must(t, netutil.EnsureAddr(netutil.Path(n.ns), "eth0", netip.PrefixFrom(n.v6, 64)))
		must(t, netutil.EnsureAddr(netutil.Path(n.ns), "eth0", netip.PrefixFrom(n.v4, 24)))
		must(t, netutil.Sysctl(netutil.Path(n.ns), "net.ipv6.conf.all.forwarding", "1"))
		w.nodes = append(w.nodes, n)
	}
	for _, n := range w.nodes {
		n.load()
		for _, o := range w.nodes {
			must(t, n.dp.UpsertNode(o.v6))
			if o != n {
				// The other nodes' locators are reached over the underlay.
				must(t, netutil.EnsureRoute(netutil.Path(n.ns), o.locator, o.v6, "eth0"))
			}
		}
	}
	return w
}

func (n *node) load() {
	n.pinDir = filepath.Join(n.w.bpffs, n.name)
	dp, err := datapath.Load(n.pinDir)
	must(n.w.t, err)
	n.dp = dp
	eth, err := netutil.GetLink(netutil.Path(n.ns), "eth0")
	must(n.w.t, err)
	must(n.w.t, dp.UpsertHostAddr(n.v4))
	must(n.w.t, dp.UpsertHostAddr(n.v6))
	must(n.w.t, dp.SetConfig(datapath.Config{UnderlayIP: n.v6, UnderlayIPv4: n.v4, Locator: n.locator, UnderlayIfIndex: uint32(eth.Index), GuardUnderlay: true}))
	must(n.w.t, dp.AttachUnderlay(netutil.Path(n.ns), "eth0"))
}

func (w *world) cleanup() {
	for _, n := range w.nodes {
		if n.dp != nil {
			n.dp.Close()
		}
	}
	nss, _ := netutil.ListNamed(w.prefix + "-")
	for _, ns := range nss {
		_ = netutil.DeleteNamed(ns)
	}
	_ = netutil.UnmountBPFFS(w.bpffs)
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

// block returns node n's block of a subnet: /24 (IPv4) or /64 (IPv6) number n.
func block(subnet netip.Prefix, n int) netip.Prefix {
	b := subnet.Addr().AsSlice()
	if subnet.Addr().Is4() {
		b[2] = byte(n)
		return netip.PrefixFrom(netip.AddrFrom4([4]byte(b)), 24)
	}
	b[7] = byte(n)
	return netip.PrefixFrom(netip.AddrFrom16([16]byte(b)), 64)
}

func nth(p netip.Prefix, i int) netip.Addr {
	a := p.Addr()
	for range i {
		a = a.Next()
	}
	return a
}

// addNetwork programs network id with its blocks on every node, in its
// own view (closed while anonymous, until open).
func (w *world) addNetwork(id uint32, v4, v6 string, anonymous bool) {
	nw := net4{id: id, v4: netip.MustParsePrefix(v4), v6: netip.MustParsePrefix(v6), anonymous: anonymous}
	w.nets[id] = nw
	for _, n := range w.nodes {
		must(w.t, n.dp.UpsertNetwork(datapath.Network{ID: id, Anonymous: anonymous}))
	}
	w.grantClosed(id, id, anonymous)
}

// grant puts network dst's blocks and subnets into the view of src, as a
// NetworkRoutingPolicy src -> dst does.
func (w *world) grant(src, dst uint32) { w.grantClosed(src, dst, false) }

func (w *world) grantClosed(src, dst uint32, closed bool) {
	nw := w.nets[dst]
	for _, n := range w.nodes {
		for _, sub := range []netip.Prefix{nw.v4, nw.v6} {
			must(w.t, n.dp.UpsertRoute(datapath.Route{NetID: src, Prefix: sub, Kind: tables.RouteSubnet, DstNet: dst, Closed: closed}))
			for _, o := range w.nodes {
				r := datapath.Route{NetID: src, Prefix: block(sub, o.index), DstNet: dst, Closed: closed, Kind: tables.RouteLocal}
				if o != n {
					r.Kind = tables.RouteRemote
					r.SID = datapath.SID(o.locator, datapath.BehaviourL3Decap, src, dst)
				}
				must(w.t, n.dp.UpsertRoute(r))
			}
		}
	}
}

// open opens an anonymous network to itself (a self policy).
func (w *world) open(id uint32) { w.grantClosed(id, id, false) }

// addExternal creates external network id on every node: the external
// host (a namespace on the fabric at ext4/ext6) is classified into it and
// it sees nothing until granted.
func (w *world) addExternal(id uint32, prefixes ...netip.Prefix) {
	for _, n := range w.nodes {
		must(w.t, n.dp.UpsertNetwork(datapath.Network{ID: id}))
		for _, p := range prefixes {
			must(w.t, n.dp.UpsertClassifier(datapath.Classifier{NetID: id, Prefix: p}))
			must(w.t, n.dp.UpsertRoute(datapath.Route{NetID: id, Prefix: p, Kind: tables.RouteExternal, DstNet: id}))
		}
	}
}

// grantExternal puts external network ext (prefixes) into the view of src.
func (w *world) grantExternal(src, ext uint32, prefixes ...netip.Prefix) {
	for _, n := range w.nodes {
		for _, p := range prefixes {
			must(w.t, n.dp.UpsertRoute(datapath.Route{NetID: src, Prefix: p, Kind: tables.RouteExternal, DstNet: ext}))
		}
	}
}

// addExternalHost creates a host on the fabric at 172.31.0.200 /
// fd00:99::c8 serving TCP and UDP on port 7 like a pod, with routes to the
// pod subnets via node via.
func (w *world) addExternalHost(via *node, podPrefixes ...netip.Prefix) *pod {
	p := &pod{name: "ext", ns: w.prefix + "-ext", v4: netip.MustParseAddr("172.31.0.200"), v6: netip.MustParseAddr("fd00:99::c8")}
	must(w.t, netutil.CreateNamed(p.ns))
	must(w.t, netutil.EnsureVeth(netutil.VethSpec{NSPath: netutil.Path(w.fabric), Name: "ext", Master: "br0",
		PeerNSPath: netutil.Path(p.ns), PeerName: "eth0"}))
	must(w.t, netutil.EnsureAddr(netutil.Path(p.ns), "eth0", netip.PrefixFrom(p.v6, 64)))
	must(w.t, netutil.EnsureAddr(netutil.Path(p.ns), "eth0", netip.PrefixFrom(p.v4, 24)))
	for _, pp := range podPrefixes {
		gw := via.v6
		if pp.Addr().Is4() {
			gw = via.v4
		}
		must(w.t, netutil.EnsureRoute(netutil.Path(p.ns), pp, gw, "eth0"))
	}
	p.serve(w.t)
	return p
}

// addPod creates pod number i of network id on node n, listening on TCP
// and UDP port 7 and answering with its name.
func (w *world) addPod(name string, n *node, id uint32, i int) *pod {
	nw := w.nets[id]
	b4, b6 := block(nw.v4, n.index), block(nw.v6, n.index)
	p := &pod{name: name, node: n, ns: w.prefix + "-p-" + name, netID: id, v4: nth(b4, i), v6: nth(b6, i),
		hostIf: podnet.HostIfName(w.prefix + name)}
	must(w.t, netutil.CreateNamed(p.ns))
	res, err := podnet.Setup(podnet.Spec{NodeNS: netutil.Path(n.ns), PodNS: netutil.Path(p.ns), HostIf: p.hostIf, PodIf: "eth0",
		MTU: 1460, Addrs: []netip.Addr{p.v4, p.v6}, Gateways: []netip.Addr{nth(b4, 1), nth(b6, 1)}})
	must(w.t, err)
	for _, a := range []netip.Addr{p.v4, p.v6} {
		must(w.t, n.dp.UpsertEndpoint(datapath.Endpoint{NetID: id, Addr: a, IfIndex: uint32(res.HostIfIndex), PodMAC: res.PodMAC, HostMAC: res.HostMAC}))
	}
	must(w.t, n.dp.UpsertPort(datapath.Port{IfIndex: uint32(res.HostIfIndex), NetID: id, V4: p.v4, V6: p.v6}))
	must(w.t, n.dp.AttachPod(netutil.Path(n.ns), p.hostIf, false))
	p.serve(w.t)
	return p
}

// serve runs TCP and UDP servers on port 7 in the pod's namespace: each
// answers a connection with the pod's name, then echoes.
func (p *pod) serve(t *testing.T) {
	for _, a := range []netip.Addr{p.v4, p.v6} {
		var ln net.Listener
		var pc net.PacketConn
		must(t, netutil.Do(netutil.Path(p.ns), func() error {
			var err error
			if ln, err = net.Listen("tcp", netip.AddrPortFrom(a, 7).String()); err != nil {
				return err
			}
			pc, err = net.ListenPacket("udp", netip.AddrPortFrom(a, 7).String())
			return err
		}))
		t.Cleanup(func() { ln.Close(); pc.Close() })
		go func() {
			for {
				c, err := ln.Accept()
				if err != nil {
					return
				}
				go func() {
					defer c.Close()
					fmt.Fprintf(c, "%s\n", p.name)
					_, _ = io.Copy(c, c)
				}()
			}
		}()
		go func() {
			buf := make([]byte, 2048)
			for {
				_, from, err := pc.ReadFrom(buf)
				if err != nil {
					return
				}
				_, _ = pc.WriteTo([]byte(p.name), from)
			}
		}()
	}
}

// serveClientAddr listens on ap in namespace ns and answers each TCP
// connection with prefix followed by the client's address, then closes
// it: the test sees whom the server saw.
func serveClientAddr(t *testing.T, ns string, ap netip.AddrPort, prefix string) {
	var ln net.Listener
	must(t, netutil.Do(netutil.Path(ns), func() error {
		var err error
		ln, err = net.Listen("tcp", ap.String())
		return err
	}))
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			fmt.Fprintf(c, "%s%s\n", prefix, c.RemoteAddr().(*net.TCPAddr).AddrPort().Addr().Unmap())
			c.Close()
		}
	}()
}

// dialTCP connects from pod p to dst:7 and returns the name the server sent.
func (p *pod) dialTCP(dst netip.Addr) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	c, err := netutil.DialContext(ctx, netutil.Path(p.ns), "tcp", netip.AddrPortFrom(dst, 7).String())
	if err != nil {
		return "", err
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(2 * time.Second))
	line, err := bufio.NewReader(c).ReadString('\n')
	return strings.TrimSpace(line), err
}

// dialUDP sends a datagram from pod p to dst:7 and returns the answer.
func (p *pod) dialUDP(dst netip.Addr) (string, error) {
	return dialUDPPort(p, netip.AddrPortFrom(dst, 7))
}

// ping sends ICMP echo requests from pod p to dst with the system ping.
func (p *pod) ping(dst netip.Addr) error {
	out, err := exec.Command("ip", "netns", "exec", p.ns, "ping", "-c", "2", "-i", "0.2", "-W", "1", dst.String()).CombinedOutput()
	if err != nil {
		return fmt.Errorf("ping %s: %v: %s", dst, err, out)
	}
	return nil
}

// capture records the frames seen on a fabric port while f runs.
func (w *world) capture(port string, f func()) [][]byte {
	frames, err := netutil.Capture(netutil.Path(w.fabric), port, f)
	must(w.t, err)
	return frames
}

package datapath

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"testing"

	"github.com/lace-cni/lace/internal/netutil"
	"github.com/lace-cni/lace/internal/tables"
)

// benchNode is the desired state of a node with pods pods, for the
// benchmark of a CNI ADD's table work: the node's tables as the agent's
// sync writes them on every ADD (the views and services are left out:
// both variants skip them when unchanged), and the pods' endpoints and
// ports.
type benchNode struct {
	host, nodes []netip.Addr
	locs        []NodeLocator
	nets        []Network
	cls         []Classifier
	inside      []Inside
	eps         []Endpoint
	ports       []Port
}

func newBenchNode(pods int) *benchNode {
	n := &benchNode{
		host: []netip.Addr{netip.MustParseAddr("10.0.0.1"), netip.MustParseAddr("fd00::1")},
		nets: []Network{{ID: 1}, {ID: 2, Anonymous: true}},
		cls:  []Classifier{{NetID: 3, Prefix: netip.MustParsePrefix("192.0.2.0/24")}},
		inside: []Inside{{Kind: tables.InsidePodSubnet, Prefix: netip.MustParsePrefix("10.244.0.0/16")},
			{Kind: tables.InsidePodSubnet, Prefix: netip.MustParsePrefix("fd10::/48")}},
	}
	for i := range 3 {
		a := netip.AddrFrom16([16]byte{0xfd, 0, 15: byte(i + 1)})
		n.nodes = append(n.nodes, a)
		n.locs = append(n.locs, NodeLocator{Addr: a, Locator: netip.PrefixFrom(netip.AddrFrom16([16]byte{0xfc, 0, 7: byte(i + 1)}), 64)})
	}
	for i := range pods {
		n.addPod(i)
	}
	return n
}

// addPod appends pod i: two addresses, one port.
func (n *benchNode) addPod(i int) {
	mac := net.HardwareAddr{2, 0, 0, 0, byte(i >> 8), byte(i)}
	v4 := netip.AddrFrom4([4]byte{10, 244, byte(i >> 8), byte(i)})
	v6 := netip.AddrFrom16([16]byte{0xfd, 0x10, 14: byte(i >> 8), 15: byte(i)})
	ifi := uint32(100 + i)
	n.eps = append(n.eps, Endpoint{NetID: 1, Addr: v4, IfIndex: ifi, PodMAC: mac, HostMAC: mac},
		Endpoint{NetID: 1, Addr: v6, IfIndex: ifi, PodMAC: mac, HostMAC: mac})
	n.ports = append(n.ports, Port{IfIndex: ifi, NetID: 1, V4: v4, V6: v6, NetNSCookie: uint64(1000 + i)})
}

// syncReadBack is the table work of one sync as the agent did it before
// the tables kept mirrors: every table read back from the kernel and
// compared with the desired state, entry by entry.
func syncReadBack(d *Datapath, n *benchNode) error {
	var errs []error
	cur, err := d.HostAddrs()
	errs = append(errs, err, benchSync(cur, n.host, func(a netip.Addr) netip.Addr { return a }, d.UpsertHostAddr, d.DeleteHostAddr))
	cur, err = d.Nodes()
	errs = append(errs, err, benchSync(cur, n.nodes, func(a netip.Addr) netip.Addr { return a }, d.UpsertNode, d.DeleteNode))
	locs, err := d.NodeLocators()
	errs = append(errs, err, benchSync(locs, n.locs, func(l NodeLocator) netip.Addr { return l.Addr }, d.UpsertNodeLocator,
		func(l NodeLocator) error { return d.DeleteNodeLocator(l.Addr) }))
	nets, err := d.Networks()
	errs = append(errs, err, benchSync(nets, n.nets, func(x Network) uint32 { return x.ID }, d.UpsertNetwork,
		func(x Network) error { return d.DeleteNetwork(x.ID) }))
	cls, err := d.Classifiers()
	errs = append(errs, err, benchSync(cls, n.cls, func(c Classifier) netip.Prefix { return c.Prefix }, d.UpsertClassifier,
		func(c Classifier) error { return d.DeleteClassifier(c.Prefix) }))
	ins, err := d.Insides()
	errs = append(errs, err, benchSync(ins, n.inside, func(c Inside) netip.Prefix { return c.Prefix }, d.UpsertInside,
		func(c Inside) error { return d.DeleteInside(c.Prefix) }))
	type epKey struct {
		net  uint32
		addr netip.Addr
	}
	eps, err := d.Endpoints()
	have := map[epKey]Endpoint{}
	for _, e := range eps {
		have[epKey{e.NetID, e.Addr}] = e
	}
	wanted := map[epKey]bool{}
	errs = append(errs, err)
	for _, e := range n.eps {
		k := epKey{e.NetID, e.Addr}
		wanted[k] = true
		if c, ok := have[k]; ok && c.IfIndex == e.IfIndex && string(c.PodMAC) == string(e.PodMAC) && string(c.HostMAC) == string(e.HostMAC) {
			continue
		}
		errs = append(errs, d.UpsertEndpoint(e))
	}
	for k := range have {
		if !wanted[k] {
			errs = append(errs, d.DeleteEndpoint(k.net, k.addr))
		}
	}
	ports, err := d.Ports()
	errs = append(errs, err, benchSync(ports, n.ports, func(p Port) uint32 { return p.IfIndex }, d.UpsertPort,
		func(p Port) error { return d.DeletePort(p.IfIndex) }))
	return errors.Join(errs...)
}

// benchSync upserts what is wanted and differs, deletes what is not.
func benchSync[T comparable, K comparable](cur, want []T, key func(T) K, upsert, del func(T) error) error {
	have := make(map[K]T, len(cur))
	for _, c := range cur {
		have[key(c)] = c
	}
	wanted := map[K]bool{}
	var errs []error
	for _, w := range want {
		wanted[key(w)] = true
		if c, ok := have[key(w)]; ok && c == w {
			continue
		}
		errs = append(errs, upsert(w))
	}
	for k, c := range have {
		if !wanted[k] {
			errs = append(errs, del(c))
		}
	}
	return errors.Join(errs...)
}

func benchDatapath(b *testing.B) *Datapath { return benchDatapathWith(b, LoadOptions{}) }

// benchDatapathWith is benchDatapath loaded with o.
func benchDatapathWith(b *testing.B, o LoadOptions) *Datapath {
	b.Helper()
	if os.Geteuid() != 0 {
		b.Skip("needs root (eBPF maps)")
	}
	suffix := make([]byte, 3)
	_, _ = rand.Read(suffix)
	dir := filepath.Join(os.TempDir(), "lbench"+hex.EncodeToString(suffix))
	if err := netutil.EnsureBPFFS(dir); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = netutil.UnmountBPFFS(dir) })
	d, err := LoadWith(filepath.Join(dir, "node"), o)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { d.Close() })
	return d
}

// benchmarkCNIAdd measures the table work of one CNI ADD on a node with
// pods pods: the pod's entries written and the node's tables synced, as
// the agent's applier does for every ADD. The pod's DEL, run between ADDs
// to keep the node at pods, is not timed.
func benchmarkCNIAdd(b *testing.B, pods int, sync func(*Datapath, *benchNode) error) {
	d := benchDatapath(b)
	n := newBenchNode(pods)
	if err := sync(d, n); err != nil {
		b.Fatal(err)
	}
	full := *n
	full.addPod(pods)
	b.ResetTimer()
	for range b.N {
		if err := sync(d, &full); err != nil {
			b.Fatal(err)
		}
		b.StopTimer()
		if err := sync(d, n); err != nil {
			b.Fatal(err)
		}
		b.StartTimer()
	}
}

func BenchmarkCNIAddReadBack(b *testing.B) {
	for _, pods := range []int{10, 100, 1000} {
		b.Run(fmt.Sprintf("pods=%d", pods), func(b *testing.B) { benchmarkCNIAdd(b, pods, syncReadBack) })
	}
}

// syncTables is the same work through the tables (what the agent does
// now): each synced against what was written to it, nothing read back.
func syncTables(d *Datapath, n *benchNode) error {
	return errors.Join(d.SyncHostAddrs(n.host), d.SyncNodes(n.nodes), d.SyncNodeLocators(n.locs), d.SyncNetworks(n.nets),
		d.SyncClassifiers(n.cls), d.SyncInsides(n.inside), d.SyncEndpoints(n.eps, nil), d.SyncPorts(n.ports, nil))
}

func BenchmarkCNIAddTables(b *testing.B) {
	for _, pods := range []int{10, 100, 1000} {
		b.Run(fmt.Sprintf("pods=%d", pods), func(b *testing.B) { benchmarkCNIAdd(b, pods, syncTables) })
	}
}

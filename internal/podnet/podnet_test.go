package podnet

import (
	"crypto/rand"
	"encoding/hex"
	"net"
	"net/netip"
	"strconv"
	"testing"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/lace-cni/lace/internal/netutil"
	"github.com/lace-cni/lace/internal/testutil"
)

// namespaces makes a node and a pod namespace of the test's own (never
// the machine's), removed at the end.
func namespaces(t *testing.T) (nodeNS, podNS string) {
	t.Helper()
	testutil.NeedRoot(t, "network namespaces")
	b := make([]byte, 3)
	_, _ = rand.Read(b)
	node, pod := "lpn"+hex.EncodeToString(b)+"-n", "lpn"+hex.EncodeToString(b)+"-p"
	for _, n := range []string{node, pod} {
		if err := netutil.CreateNamed(n); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = netutil.DeleteNamed(n) })
	}
	return netutil.Path(node), netutil.Path(pod)
}

// linkState is what a test reads of an interface in a namespace.
type linkState struct {
	mac    net.HardwareAddr
	mtu    int
	addrs  map[string]bool // "address/bits"
	neighs map[string]string
	routes map[string]string // destination -> gateway ("" on-link)
}

func readLink(t *testing.T, ns, name string) linkState {
	t.Helper()
	st := linkState{addrs: map[string]bool{}, neighs: map[string]string{}, routes: map[string]string{}}
	err := netutil.Do(ns, func() error {
		l, err := netlink.LinkByName(name)
		if err != nil {
			return err
		}
		st.mac, st.mtu = l.Attrs().HardwareAddr, l.Attrs().MTU
		addrs, err := netlink.AddrList(l, netlink.FAMILY_ALL)
		if err != nil {
			return err
		}
		for _, a := range addrs {
			if a.IP.IsGlobalUnicast() {
				ones, _ := a.Mask.Size()
				st.addrs[a.IP.String()+"/"+strconv.Itoa(ones)] = true
			}
		}
		neighs, err := netlink.NeighList(l.Attrs().Index, netlink.FAMILY_ALL)
		if err != nil {
			return err
		}
		for _, n := range neighs {
			if n.State&netlink.NUD_PERMANENT != 0 {
				st.neighs[n.IP.String()] = n.HardwareAddr.String()
			}
		}
		routes, err := netlink.RouteList(l, netlink.FAMILY_ALL)
		if err != nil {
			return err
		}
		for _, r := range routes {
			dst := "default" + strconv.Itoa(r.Family)
			if r.Dst != nil && !r.Dst.IP.IsUnspecified() {
				dst = r.Dst.String()
			}
			gw := ""
			if r.Gw != nil {
				gw = r.Gw.String()
			}
			if r.Dst == nil || r.Dst.IP.IsUnspecified() || r.Dst.IP.IsGlobalUnicast() {
				st.routes[dst] = gw
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return st
}

// The keys of default routes in linkState.routes.
var def4, def6 = "default" + strconv.Itoa(unix.AF_INET), "default" + strconv.Itoa(unix.AF_INET6)

// TestSetupL2Port: an l2 port has its addresses with the subnet's prefix
// length (peers on-link), the MACs asked for on both ends, a default route
// through the gateway and no permanent neighbour for it (the pod resolves
// it; from_l2 answers), while the node keeps its host route and permanent
// neighbour for the pod. Setting it up again changes nothing.
func TestSetupL2Port(t *testing.T) {
	nodeNS, podNS := namespaces(t)
	podMAC := net.HardwareAddr{0x0a, 0x58, 10, 50, 0, 5}
	gwMAC := net.HardwareAddr{0x0a, 0x5a, 0, 0, 0, 7}
	spec := Spec{NodeNS: nodeNS, PodNS: podNS, HostIf: HostIfName("c-l2"), PodIf: "eth0", MTU: 1446,
		Addrs:    []netip.Addr{netip.MustParseAddr("10.50.0.5"), netip.MustParseAddr("fd00:50::5")},
		Gateways: []netip.Addr{netip.MustParseAddr("10.50.0.1"), netip.MustParseAddr("fd00:50::1")},
		L2:       true, PrefixBits: []int{24, 64}, PodMAC: podMAC, HostMAC: gwMAC}
	for range 2 {
		res, err := Setup(spec)
		if err != nil {
			t.Fatal(err)
		}
		if res.PodMAC.String() != podMAC.String() || res.HostMAC.String() != gwMAC.String() {
			t.Errorf("result MACs pod %s host %s, want %s %s", res.PodMAC, res.HostMAC, podMAC, gwMAC)
		}
		pod := readLink(t, podNS, "eth0")
		if pod.mac.String() != podMAC.String() || pod.mtu != 1446 {
			t.Errorf("pod interface MAC %s MTU %d, want %s 1446", pod.mac, pod.mtu, podMAC)
		}
		for _, a := range []string{"10.50.0.5/24", "fd00:50::5/64"} {
			if !pod.addrs[a] {
				t.Errorf("pod lacks %s: %v", a, pod.addrs)
			}
		}
		if pod.routes["10.50.0.0/24"] != "" || pod.routes["fd00:50::/64"] != "" {
			t.Errorf("pod routes %v: want the subnets on-link", pod.routes)
		}
		if _, ok := pod.routes["10.50.0.0/24"]; !ok {
			t.Errorf("pod has no on-link route to its subnet: %v", pod.routes)
		}
		if pod.routes[def4] != "10.50.0.1" || pod.routes[def6] != "fd00:50::1" {
			t.Errorf("pod default route %v", pod.routes)
		}
		if len(pod.neighs) != 0 {
			t.Errorf("pod has permanent neighbours %v: an l2 port resolves its gateway", pod.neighs)
		}
		host := readLink(t, nodeNS, spec.HostIf)
		if host.mac.String() != gwMAC.String() || host.mtu != 1446 {
			t.Errorf("host side MAC %s MTU %d, want the gateway's %s and 1446", host.mac, host.mtu, gwMAC)
		}
		for _, a := range []string{"10.50.0.5", "fd00:50::5"} {
			if host.neighs[a] != podMAC.String() {
				t.Errorf("node neighbour %s = %q, want %s", a, host.neighs[a], podMAC)
			}
		}
		if _, ok := host.routes["10.50.0.5/32"]; !ok {
			t.Errorf("node routes %v: want 10.50.0.5/32", host.routes)
		}
		if _, ok := host.routes["fd00:50::5/128"]; !ok {
			t.Errorf("node routes %v: want fd00:50::5/128", host.routes)
		}
	}
	if err := Teardown(nodeNS, spec.HostIf, spec.Addrs); err != nil {
		t.Fatal(err)
	}
	if _, err := netutil.GetLink(nodeNS, spec.HostIf); err == nil {
		t.Error("host side survived Teardown")
	}
}

// TestSetupL3Port: an l3 port is as before: host addresses, the gateway a
// permanent neighbour at the host side's MAC.
func TestSetupL3Port(t *testing.T) {
	nodeNS, podNS := namespaces(t)
	spec := Spec{NodeNS: nodeNS, PodNS: podNS, HostIf: HostIfName("c-l3"), PodIf: "eth0", MTU: 1460,
		Addrs:    []netip.Addr{netip.MustParseAddr("10.60.0.2")},
		Gateways: []netip.Addr{netip.MustParseAddr("10.60.0.1")}}
	res, err := Setup(spec)
	if err != nil {
		t.Fatal(err)
	}
	pod := readLink(t, podNS, "eth0")
	if !pod.addrs["10.60.0.2/32"] || pod.neighs["10.60.0.1"] != res.HostMAC.String() || pod.routes[def4] != "10.60.0.1" {
		t.Errorf("l3 pod: addrs %v neighbours %v routes %v", pod.addrs, pod.neighs, pod.routes)
	}
}

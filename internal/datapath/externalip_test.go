package datapath_test

import (
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/lace-cni/lace/internal/datapath"
	"github.com/lace-cni/lace/internal/netutil"
	"github.com/lace-cni/lace/internal/tables"
)

// TestHostSocketsSkipExternalIPs: the node's own sockets are never
// translated to an external IP's endpoints (CVE-2020-8554): a node
// process connecting to the address a Service names as an external IP
// (here the outside host's, which serves port 7 itself) reaches the real
// host, over TCP and UDP, while the same hooks still translate the
// Service's load balancer address and ClusterIP for it. A pod reaches the
// admitted external IP's endpoints, per packet, as the ClusterIP's rule
// says.
func TestHostSocketsSkipExternalIPs(t *testing.T) {
	w := newWorld(t, 1)
	n1 := w.nodes[0]
	must(t, netutil.Sysctl(netutil.Path(n1.ns), "net.ipv4.ip_forward", "1"))
	w.addNetwork(7, "10.70.0.0/16", "fd00:70::/48", false)
	b := w.addPod("b", n1, 7, 2)
	a := w.addPod("a", n1, 7, 3)
	ext := w.addExternalHost(n1)
	world4, world6 := netip.MustParsePrefix("172.31.0.0/24"), netip.MustParsePrefix("fd00:99::/64")
	w.addExternal(100, world4, world6)
	w.grantExternal(7, 100, world4, world6)

	web4 := tcpSvc("10.96.0.10", 7, 7, be(b.v4))
	dns4 := udpSvc("10.96.0.10", 7, 7, be(b.v4))
	web6 := tcpSvc("fd00:96::10", 7, 7, be(b.v6))
	// The ClusterIPs are in network 7's view and the node's (world's).
	for _, s := range []datapath.Service{web4, web6} {
		for _, v := range []uint32{7, 100} {
			must(t, n1.dp.UpsertRoute(datapath.Route{NetID: v, Prefix: netip.PrefixFrom(s.VIP, s.VIP.BitLen()),
				Kind: tables.RouteService, DstNet: 7}))
		}
	}
	lb4 := netip.MustParseAddr("172.31.1.10")
	svcs := []datapath.Service{web4, dns4, web6,
		frontend(tables.FrontendExternalIP, ext.v4, 7, web4, false, web4.Backends...),
		frontend(tables.FrontendExternalIP, ext.v4, 7, dns4, false, dns4.Backends...),
		frontend(tables.FrontendExternalIP, ext.v6, 7, web6, false, web6.Backends...),
		frontend(tables.FrontendLoadBalancer, lb4, 7, web4, false, web4.Backends...)}
	_, err := n1.dp.ApplyServices(svcs)
	must(t, err)

	cg := filepath.Join("/sys/fs/cgroup/unified", w.prefix+"-"+n1.name)
	must(t, os.Mkdir(cg, 0o755))
	t.Cleanup(func() { _ = os.Remove(cg) })
	cookie, err := datapath.NetNSCookie(netutil.Path(n1.ns))
	must(t, err)
	cfg, err := n1.dp.Config()
	must(t, err)
	cfg.HostNetNS, cfg.HostNet4, cfg.HostNet6 = cookie, 100, 100
	must(t, n1.dp.SetConfig(cfg))
	must(t, n1.dp.AttachHostSockets(cg))
	node := func(args ...string) string {
		script := fmt.Sprintf("echo $$ > %s/cgroup.procs && exec ip netns exec %s busybox nc %s", cg, n1.ns, strings.Join(args, " "))
		out, _ := exec.Command("sh", "-c", script).CombinedOutput()
		return strings.TrimSpace(string(out))
	}
	for _, c := range []struct {
		dst, want string
	}{
		{ext.v4.String(), "ext"}, // the external IP: the real host
		{ext.v6.String(), "ext"},
		{lb4.String(), "b"}, // the same Service's other frontends translate
		{web4.VIP.String(), "b"},
	} {
		if got := node("-w", "2", c.dst, "7"); !strings.HasPrefix(got, c.want) {
			t.Errorf("node process -> %s:7/TCP answered %q, want %s", c.dst, got, c.want)
		}
	}
	udp := exec.Command("sh", "-c", fmt.Sprintf("echo $$ > %s/cgroup.procs && exec ip netns exec %s %s -test.run='^TestUDPClientHelper$'", cg, n1.ns, os.Args[0]))
	udp.Env = append(os.Environ(), "LACE_UDP_HELPER="+netip.AddrPortFrom(ext.v4, 7).String())
	if out, _ := udp.CombinedOutput(); !strings.Contains(string(out), "answer ext from "+ext.v4.String()) {
		t.Errorf("node process -> %s:7/UDP: %s, want the real host's answer", ext.v4, out)
	}

	// A pod: the external IP is admitted as its ClusterIP, translated per
	// packet.
	for _, dst := range []netip.Addr{ext.v4, ext.v6} {
		if got, err := a.dialTCP(dst); err != nil || got != "b" {
			t.Errorf("pod -> external IP %s:7: %q %v, want b", dst, got, err)
		}
	}
}

package lab

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	lacev1 "github.com/lace-cni/lace/api/v1alpha1"
	"github.com/lace-cni/lace/internal/datapath"
	"github.com/lace-cni/lace/internal/model"
	"github.com/lace-cni/lace/internal/netutil"
)

// Demo services: the default network's pod behind a NodePort and a
// LoadBalancer Service, whose VIPs come from the lab's default
// LoadBalancerClass (addresses .240-.247 of the fabric, both families, so
// the external host reaches them on its link and learns them by ARP/NDP).
const (
	DemoLoadBalancerClass = "lab"
	demoNodePortService   = "demo-nodeport"
	demoLBService         = "demo-lb"
)

// LoadBalancerPool is the lab's default LoadBalancerClass pool.
func LoadBalancerPool() []lacev1.AddressRange {
	f4, f6 := hostAddr(240)
	l4, l6 := hostAddr(247)
	return []lacev1.AddressRange{lacev1.AddressRange(f4.String() + "-" + l4.String()),
		lacev1.AddressRange(f6.String() + "-" + l6.String())}
}

func demoService(name string, typ corev1.ServiceType) *corev1.Service {
	return &corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "default"}, Spec: corev1.ServiceSpec{
		Type:           typ,
		Selector:       map[string]string{"net": demoDefaultNetwork, "demo": "lace"},
		IPFamilyPolicy: ptr.To(corev1.IPFamilyPolicyPreferDualStack),
		Ports:          []corev1.ServicePort{{Name: "http", Port: 80, TargetPort: intstr.FromInt32(demoPort), Protocol: corev1.ProtocolTCP}},
	}}
}

// demoServices exposes the default network's demo pod as a NodePort and a
// LoadBalancer Service and reaches both from the external host: every
// node's NodePort in both families, and each VIP, with the node that
// announces it.
func demoServices(ctx context.Context, cl client.Client, c Config, pod string, out io.Writer) error {
	class := &lacev1.LoadBalancerClass{ObjectMeta: metav1.ObjectMeta{Name: DemoLoadBalancerClass},
		Spec: lacev1.LoadBalancerClassSpec{Default: true, Addresses: LoadBalancerPool()}}
	if err := createAll(ctx, cl, []client.Object{class, demoService(demoNodePortService, corev1.ServiceTypeNodePort),
		demoService(demoLBService, corev1.ServiceTypeLoadBalancer)}); err != nil {
		return err
	}
	var np, lb corev1.Service
	if err := waitFor(ctx, 30*time.Second, "demo Services allocated", func(ctx context.Context) (string, error) {
		if err := cl.Get(ctx, client.ObjectKey{Namespace: "default", Name: demoNodePortService}, &np); err != nil {
			return "", err
		}
		if err := cl.Get(ctx, client.ObjectKey{Namespace: "default", Name: demoLBService}, &lb); err != nil {
			return "", err
		}
		if len(model.IngressAddrs(&lb)) < len(lb.Spec.ClusterIPs) {
			return "load balancer addresses of " + demoLBService, nil
		}
		return "", nil
	}); err != nil {
		return err
	}
	extNS := netutil.Path(c.NetNS("external"))
	reach := func(dst netip.AddrPort) string {
		// The first request may race the nodes' programming.
		deadline := time.Now().Add(20 * time.Second)
		for {
			if demoRequest(ctx, extNS, netip.Addr{}, dst, pod) {
				return "yes"
			}
			if time.Now().After(deadline) || ctx.Err() != nil {
				return "NO"
			}
			time.Sleep(200 * time.Millisecond)
		}
	}
	fmt.Fprintf(out, "\nservices, reached from the external host (world), answered by %s:\n", pod)
	nodePort := uint16(np.Spec.Ports[0].NodePort)
	for i := 1; i <= c.Nodes; i++ {
		v4, v6 := NodeUnderlay(i)
		var cells []string
		for _, a := range []netip.Addr{v4, v6} {
			cells = append(cells, fmt.Sprintf("%s %s", netip.AddrPortFrom(a, nodePort), reach(netip.AddrPortFrom(a, nodePort))))
		}
		fmt.Fprintf(out, "  %s NodePort on %s: %s\n", demoNodePortService, c.NodeName(i), strings.Join(cells, ", "))
	}
	for _, vip := range model.IngressAddrs(&lb) {
		fmt.Fprintf(out, "  %s LoadBalancer %s: %s, announced by %s\n", demoLBService, netip.AddrPortFrom(vip, 80),
			reach(netip.AddrPortFrom(vip, 80)), announcerOf(c, vip))
	}
	return nil
}

// announcerOf names the nodes whose data plane answers ARP/NDP for vip.
func announcerOf(c Config, vip netip.Addr) string {
	who, err := Announcers(c, vip)
	switch {
	case err != nil:
		return "unknown (" + err.Error() + ")"
	case len(who) == 0:
		return "no node"
	}
	return strings.Join(who, ", ")
}

// Announcers lists the lab nodes whose data plane answers ARP/NDP for vip
// now (read from the maps the agents pinned on each node's bpffs).
func Announcers(c Config, vip netip.Addr) ([]string, error) {
	var who []string
	for i := 1; i <= c.Nodes; i++ {
		dp, err := datapath.Load(filepath.Join(c.NodeRoot(c.NodeName(i)), "sys/fs/bpf/lace"))
		if err != nil {
			return nil, err
		}
		vips, err := dp.Announced()
		dp.Close()
		if err != nil {
			return nil, err
		}
		if slices.Contains(vips, vip) {
			who = append(who, c.NodeName(i))
		}
	}
	return who, nil
}

// NodeMAC is the MAC of a lab node's underlay interface.
func NodeMAC(c Config, node string) (string, error) {
	var mac string
	err := netutil.Do(netutil.Path(c.NetNS(node)), func() error {
		i, err := net.InterfaceByName("eth0")
		if err == nil {
			mac = i.HardwareAddr.String()
		}
		return err
	})
	return mac, err
}

// ExternalNeighbour is the MAC the lab's external host holds for addr, ""
// when it holds none.
func ExternalNeighbour(c Config, addr netip.Addr) string {
	out, err := exec.Command("ip", "netns", "exec", c.NetNS("external"), "ip", "-j", "neigh", "show", addr.String()).Output()
	if err != nil {
		return ""
	}
	var entries []struct {
		LLAddr string `json:"lladdr"`
	}
	if json.Unmarshal(out, &entries) != nil || len(entries) == 0 {
		return ""
	}
	return entries[0].LLAddr
}

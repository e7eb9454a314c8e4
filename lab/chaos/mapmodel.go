package chaos

import (
	"context"
	"encoding/binary"
	"fmt"
	"net/netip"
	"path/filepath"
	"slices"
	"strings"

	"github.com/cilium/ebpf"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/lace-cni/lace/internal/model"
)

// checkMaps compares what every node's maps hold with a desired state
// the harness computes itself from the API objects, without the agent's
// model: the agent's own table check (checkRepairs) compares the kernel
// with what the agent meant, and a bug in what it meant would pass it.
//
// The harness decodes the maps' C layouts (bpf/include/maps.h) by hand
// for the same reason. What it computes is what holds for any cluster, not every
// policy: each node's endpoint entries are exactly its pods' addresses;
// every Service's ClusterIP ports are served on every node, and nothing
// else is served that no Service or hostPort accounts for (a leftover of
// a deleted Service); every frontend of the workload's Service balances
// exactly over its ready endpoints; no backend entry outlives its
// frontend.
func checkMaps(ctx context.Context, h *harness) error {
	return until(ctx, settleWindow, "every node's maps matching the objects", func() error {
		want, err := h.desiredMaps(ctx)
		if err != nil {
			return err
		}
		for i := 1; i <= h.cfg.Nodes; i++ {
			node := h.cfg.NodeName(i)
			got, err := readNodeMaps(h.cfg.PinDir(node))
			if err != nil {
				return fmt.Errorf("node %s: %w", node, err)
			}
			if d := want.diff(node, got); d != "" {
				return fmt.Errorf("node %s: %s", node, d)
			}
		}
		return nil
	})
}

// frontKey is a lace_services key: struct svc_key.
type frontKey struct {
	vip   netip.Addr
	proto uint8
	port  uint16
}

func (k frontKey) String() string {
	return fmt.Sprintf("%s/%d:%d", k.vip, k.proto, k.port)
}

// nodeMaps is what the check reads of a node.
type nodeMaps struct {
	endpoints map[netip.Addr]bool
	// fronts are the service frontends with their backends, as
	// "addr:port" sorted.
	fronts map[frontKey][]string
	// orphans are lace_backends entries no frontend counts.
	orphans int
}

// desired is the state computed from the objects.
type desired struct {
	// podAddrs are each node's pods' addresses.
	podAddrs map[string]map[netip.Addr]bool
	// clusterIPs are every Service's ClusterIP ports: on every node.
	clusterIPs map[frontKey]string
	// accounted says whether a frontend on a node is one some object
	// asks for (a Service's frontend or a pod's hostPort).
	accounted func(node string, k frontKey) bool
	// backends are the workload Service's frontends' backends.
	backends map[frontKey][]string
}

// protoNum is p's IP protocol number (the API admits no other protocol).
func protoNum(p corev1.Protocol) uint8 {
	n, _ := model.IPProto(p)
	return n
}

func (h *harness) desiredMaps(ctx context.Context) (*desired, error) {
	pods, err := h.cs.CoreV1().Pods("").List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, err
	}
	svcs, err := h.cs.CoreV1().Services("").List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, err
	}
	d := &desired{podAddrs: map[string]map[netip.Addr]bool{}, clusterIPs: map[frontKey]string{}, backends: map[frontKey][]string{}}
	// hostPorts[node] are the (proto, port) pairs pods open there.
	hostPorts := map[string]map[[2]int]bool{}
	if err := d.addPods(pods.Items); err != nil {
		return nil, err
	}
	for _, p := range pods.Items {
		if p.Spec.NodeName == "" {
			continue
		}
		for _, c := range p.Spec.Containers {
			for _, cp := range c.Ports {
				if cp.HostPort > 0 {
					if hostPorts[p.Spec.NodeName] == nil {
						hostPorts[p.Spec.NodeName] = map[[2]int]bool{}
					}
					hostPorts[p.Spec.NodeName][[2]int{int(protoNum(cp.Protocol)), int(cp.HostPort)}] = true
				}
			}
		}
	}
	// servicePorts[(vip, proto, port)] and nodePorts[(proto, port)] are
	// what some Service asks for.
	servicePorts := map[frontKey]bool{}
	nodePorts := map[[2]int]bool{}
	var web *corev1.Service
	for i := range svcs.Items {
		s := &svcs.Items[i]
		if s.Namespace == Namespace && s.Name == svcName {
			web = s
		}
		vips := addrsOf(s.Spec.ClusterIPs)
		var outside []netip.Addr
		outside = append(outside, addrsOf(s.Spec.ExternalIPs)...)
		for _, ing := range s.Status.LoadBalancer.Ingress {
			outside = append(outside, addrsOf([]string{ing.IP})...)
		}
		for _, sp := range s.Spec.Ports {
			proto := protoNum(sp.Protocol)
			for _, a := range vips {
				k := frontKey{a, proto, uint16(sp.Port)}
				servicePorts[k] = true
				_, headless := s.Labels[corev1.IsHeadlessService]
				_, otherProxy := s.Labels["service.kubernetes.io/service-proxy-name"]
				if s.Spec.Type != corev1.ServiceTypeExternalName && !headless && !otherProxy {
					d.clusterIPs[k] = s.Namespace + "/" + s.Name
				}
			}
			for _, a := range outside {
				servicePorts[frontKey{a, proto, uint16(sp.Port)}] = true
			}
			if sp.NodePort > 0 {
				nodePorts[[2]int{int(proto), int(sp.NodePort)}] = true
			}
		}
	}
	d.accounted = func(node string, k frontKey) bool {
		pp := [2]int{int(k.proto), int(k.port)}
		return servicePorts[k] || nodePorts[pp] || hostPorts[node][pp]
	}
	if web != nil {
		eps, err := h.cs.DiscoveryV1().EndpointSlices(Namespace).List(ctx, metav1.ListOptions{
			LabelSelector: discoveryv1.LabelServiceName + "=" + svcName})
		if err != nil {
			return nil, err
		}
		d.webBackends(web, eps.Items)
	}
	return d, nil
}

// holdsAddrs says whether p's status addresses are its own now: a pod
// that ended has no sandbox, whatever its status says, and a host-network
// pod has the node's.
func holdsAddrs(p *corev1.Pod) bool {
	return !p.Spec.HostNetwork && len(p.Status.PodIPs) > 0 &&
		p.Status.Phase != corev1.PodSucceeded && p.Status.Phase != corev1.PodFailed
}

// addPods adds each scheduled pod's addresses to its node's
// (host-network pods have none of their own).
func (d *desired) addPods(pods []corev1.Pod) error {
	for _, p := range pods {
		if p.Spec.NodeName == "" || !holdsAddrs(&p) {
			continue
		}
		set := d.podAddrs[p.Spec.NodeName]
		if set == nil {
			set = map[netip.Addr]bool{}
			d.podAddrs[p.Spec.NodeName] = set
		}
		for _, ip := range p.Status.PodIPs {
			a, err := netip.ParseAddr(ip.IP)
			if err != nil {
				return fmt.Errorf("pod %s/%s address %q: %w", p.Namespace, p.Name, ip.IP, err)
			}
			set[a] = true
		}
	}
	return nil
}

// webBackends fills d.backends: each frontend of the workload's Service
// (ClusterIP, its NodePorts are left out as they sit on node addresses,
// load balancer addresses) balances over its ready endpoints of the
// frontend's family, at the slice's port of the same name.
func (d *desired) webBackends(web *corev1.Service, eps []discoveryv1.EndpointSlice) {
	var vips []netip.Addr
	vips = append(vips, addrsOf(web.Spec.ClusterIPs)...)
	for _, ing := range web.Status.LoadBalancer.Ingress {
		vips = append(vips, addrsOf([]string{ing.IP})...)
	}
	for _, sp := range web.Spec.Ports {
		for _, vip := range vips {
			var list []string
			for _, sl := range eps {
				var port int32 = -1
				for _, p := range sl.Ports {
					if p.Name != nil && *p.Name == sp.Name && p.Port != nil {
						port = *p.Port
					}
				}
				if port < 0 {
					continue
				}
				for _, ep := range sl.Endpoints {
					if ep.Conditions.Ready != nil && !*ep.Conditions.Ready {
						continue
					}
					// Consumers use an endpoint's first address only.
					if a := addrsOf(ep.Addresses); len(a) > 0 && a[0].Is4() == vip.Is4() {
						list = append(list, netip.AddrPortFrom(a[0], uint16(port)).String())
					}
				}
			}
			slices.Sort(list)
			d.backends[frontKey{vip, protoNum(sp.Protocol), uint16(sp.Port)}] = slices.Compact(list)
		}
	}
}

func addrsOf(ss []string) []netip.Addr {
	var out []netip.Addr
	for _, s := range ss {
		if a, err := netip.ParseAddr(s); err == nil {
			out = append(out, a.Unmap())
		}
	}
	return out
}

// diff says how got differs from what node should hold ("" when not).
func (d *desired) diff(node string, got nodeMaps) string {
	var out []string
	var missing, extra []string
	for a := range d.podAddrs[node] {
		if !got.endpoints[a] {
			missing = append(missing, a.String())
		}
	}
	for a := range got.endpoints {
		if !d.podAddrs[node][a] {
			extra = append(extra, a.String())
		}
	}
	if len(missing)+len(extra) > 0 {
		slices.Sort(missing)
		slices.Sort(extra)
		out = append(out, fmt.Sprintf("lace_endpoints lacks pod addresses %v and holds addresses of no pod %v", missing, extra))
	}
	missing, extra = nil, nil
	for k, svc := range d.clusterIPs {
		if _, ok := got.fronts[k]; !ok {
			missing = append(missing, k.String()+" ("+svc+")")
		}
	}
	for k := range got.fronts {
		if !d.accounted(node, k) {
			extra = append(extra, k.String())
		}
	}
	if len(missing)+len(extra) > 0 {
		slices.Sort(missing)
		slices.Sort(extra)
		out = append(out, fmt.Sprintf("lace_services lacks Service ports %v and serves what no object asks for %v", missing, extra))
	}
	if got.orphans > 0 {
		out = append(out, fmt.Sprintf("lace_backends holds %d entries no frontend counts", got.orphans))
	}
	for k, want := range d.backends {
		if have, ok := got.fronts[k]; !ok {
			out = append(out, fmt.Sprintf("%s of %s is not served", k, svcName))
		} else if !slices.Equal(have, want) {
			out = append(out, fmt.Sprintf("%s of %s balances over %v, its ready endpoints are %v", k, svcName, have, want))
		}
	}
	return strings.Join(out, "; ")
}

// The C layouts (bpf/include/maps.h), read little-endian as the kernel
// stores them on this machine; ports are in network order.
const (
	epKeySize      = 24         // struct ep_key: u32 net_id, u8 family, u8 pad[3], u8 addr[16]
	svcKeySize     = 20         // struct svc_key: u8 family, u8 proto, be16 port, u8 vip[16]
	svcValSize     = 16         // struct svc_val: u32 id, u32 net_id, u16 count, u16 flags, u32 affinity
	backendKeySize = 8          // struct backend_key: u32 id, u32 index
	backendValSize = 20         // struct backend_val: u8 addr[16], be16 port, u16 pad
	clusterRef     = 0xffffffff // BACKEND_CLUSTER_REF
)

func addrFrom(fam uint8, b []byte) netip.Addr {
	if fam == 4 {
		return netip.AddrFrom4([4]byte(b[:4]))
	}
	return netip.AddrFrom16([16]byte(b[:16]))
}

func readNodeMaps(dir string) (nodeMaps, error) {
	got := nodeMaps{endpoints: map[netip.Addr]bool{}, fronts: map[frontKey][]string{}}
	if err := walkMap(dir, "lace_endpoints", epKeySize, 0, func(k, _ []byte) {
		got.endpoints[addrFrom(k[4], k[8:24])] = true
	}); err != nil {
		return got, err
	}
	backends := map[[2]uint32]string{}
	if err := walkMap(dir, "lace_backends", backendKeySize, backendValSize, func(k, v []byte) {
		backends[[2]uint32{binary.LittleEndian.Uint32(k), binary.LittleEndian.Uint32(k[4:])}] = string(v)
	}); err != nil {
		return got, err
	}
	counts := map[uint32]uint32{}
	err := walkMap(dir, "lace_services", svcKeySize, svcValSize, func(k, v []byte) {
		fam := k[0]
		key := frontKey{addrFrom(fam, k[4:20]), k[1], binary.BigEndian.Uint16(k[2:4])}
		id, count := binary.LittleEndian.Uint32(v), binary.LittleEndian.Uint16(v[8:10])
		list := []string{}
		for i := range uint32(count) {
			b, ok := backends[[2]uint32{id, i}]
			if !ok {
				list = append(list, fmt.Sprintf("(backend %d missing)", i))
				continue
			}
			list = append(list, netip.AddrPortFrom(addrFrom(fam, []byte(b[:16])), binary.BigEndian.Uint16([]byte(b[16:18]))).String())
		}
		slices.Sort(list)
		got.fronts[key] = slices.Compact(list)
		counts[id] = uint32(count)
	})
	for k := range backends {
		if c, ok := counts[k[0]]; !ok || (k[1] >= c && k[1] != clusterRef) {
			got.orphans++
		}
	}
	return got, err
}

// walkMap calls f with each entry of the map pinned at dir/name, after
// checking its key and value sizes against the layouts above (valSize 0:
// any).
func walkMap(dir, name string, keySize, valSize uint32, f func(k, v []byte)) error {
	m, err := ebpf.LoadPinnedMap(filepath.Join(dir, name), &ebpf.LoadPinOptions{ReadOnly: true})
	if err != nil {
		return fmt.Errorf("open %s: %w", name, err)
	}
	defer m.Close()
	if m.KeySize() != keySize || (valSize != 0 && m.ValueSize() != valSize) {
		return fmt.Errorf("%s: key %d value %d bytes, the check knows %d and %d", name, m.KeySize(), m.ValueSize(), keySize, valSize)
	}
	var k, v []byte
	it := m.Iterate()
	for it.Next(&k, &v) {
		f(k, v)
	}
	if err := it.Err(); err != nil {
		return fmt.Errorf("read %s: %w", name, err)
	}
	return nil
}

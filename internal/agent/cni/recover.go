package cni

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"sort"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	lacev1 "github.com/lace-cni/lace/api/v1alpha1"
	"github.com/lace-cni/lace/internal/datapath"
	"github.com/lace-cni/lace/internal/model"
	"github.com/lace-cni/lace/internal/model/ipam"
	"github.com/lace-cni/lace/pkg/cniapi"
)

// What survives a crash, a restart or a reboot, and how the agent makes the
// node's state whole again:
//
//   - DELs lace-cni could not deliver are queued on the node
//     (cniapi.QueueDel) and replayed here (ReplayQueuedDels);
//   - an endpoint whose host interface is gone, or is not the one recorded
//     (name, index and MAC: the kernel reuses indexes), is removed before
//     the data plane is written from the checkpoint (DropStaleEndpoints),
//     so a reused index never inherits a dead pod's entries;
//   - a lost checkpoint is rebuilt from the pinned maps, the host
//     interfaces and the API (adoptKernelEndpoints), so running pods keep
//     forwarding and their addresses are not handed out again;
//   - a missing NetworkEndpoint is written again (EnsureNetworkEndpoints).

// ReplayQueuedDels runs the DELs queued while the agent was unreachable.
// One that fails stays queued for the next round.
func (s *Server) ReplayQueuedDels(ctx context.Context) error {
	q, err := cniapi.QueuedDels(s.opts.DelQueueDir)
	if err != nil {
		return fmt.Errorf("read DEL queue: %w", err)
	}
	if len(q) >= cniapi.MaxQueuedDels {
		// lace-cni refuses further DELs ("try again later") until the
		// replays below make room: pod deletions on the node wait.
		s.log.Warn("DEL queue is full: new DELs are refused until queued ones are replayed",
			"dir", s.opts.DelQueueDir, "bound", cniapi.MaxQueuedDels)
	}
	var errs []error
	for _, d := range q {
		if err := s.cmdDel(ctx, d.Request); err != nil {
			errs = append(errs, fmt.Errorf("replay DEL of %s: %w", d.Request.ContainerID, err))
			continue
		}
		s.log.Info("replayed a DEL queued while the agent was unreachable", "container", d.Request.ContainerID,
			"pod", d.Request.Args["K8S_POD_NAMESPACE"]+"/"+d.Request.Args["K8S_POD_NAME"])
		errs = append(errs, d.Done())
	}
	if len(q) > 0 {
		s.health.Kick()
	}
	return errors.Join(errs...)
}

// DropStaleEndpoints removes every ready endpoint whose host interface is
// gone (its pod's network namespace went with it) or is not the recorded
// one. Endpoints are read before the interfaces: one that became ready
// after the listing is not judged by it.
func (s *Server) DropStaleEndpoints(ctx context.Context) error {
	eps := s.cp.all()
	links, err := s.node.HostLinks()
	if err != nil {
		return fmt.Errorf("list pod interfaces: %w", err)
	}
	var errs []error
	for _, e := range eps {
		if !e.Ready {
			continue // an ADD or DEL owns it
		}
		l, ok := links[e.HostIf]
		if ok && l.Index == e.HostIfIndex && l.MAC.String() == e.HostMAC {
			continue
		}
		why := "its host interface is gone"
		if ok {
			why = fmt.Sprintf("its host interface is index %d MAC %s, not the recorded %d %s", l.Index, l.MAC, e.HostIfIndex, e.HostMAC)
		}
		s.log.Info("removing stale endpoint", "pod", e.PodNS+"/"+e.PodName, "interface", e.HostIf, "why", why)
		errs = append(errs, s.teardown(ctx, e))
	}
	return errors.Join(errs...)
}

// adoptKernelEndpoints records the pod attachments the kernel holds and the
// checkpoint does not (it was lost, or is older than the maps): a port in
// the pinned maps whose host interface still exists with the index and MAC
// the maps hold is a running pod. Its pod, network and interface name come
// from its NetworkEndpoint, or from the Pod whose IPs match; one that
// matches no pod is recorded without one and collected as gone. It runs
// under addLock, so no ADD allocates meanwhile, and before the first apply,
// which would otherwise remove what the checkpoint does not name.
func (s *Server) adoptKernelEndpoints(ctx context.Context, st model.NodeState, nets []lacev1.Network) error {
	ports, err := s.dp.Ports()
	if err != nil {
		return err
	}
	dpEps, err := s.dp.Endpoints()
	if err != nil {
		return err
	}
	links, err := s.node.HostLinks()
	if err != nil {
		return fmt.Errorf("list pod interfaces: %w", err)
	}
	known := map[int]bool{}
	for _, e := range s.cp.all() {
		known[e.HostIfIndex] = true
	}
	byIndex := map[int]string{}
	for name, l := range links {
		byIndex[l.Index] = name
	}
	var found []Endpoint
	for _, p := range ports {
		name, ok := byIndex[int(p.IfIndex)]
		if !ok || known[int(p.IfIndex)] {
			continue // a dead pod's entry (apply removes it), or recorded
		}
		l := links[name]
		e := Endpoint{HostIf: name, HostIfIndex: l.Index, HostMAC: l.MAC.String(), NetID: p.NetID, NetNSCookie: p.NetNSCookie, Ready: true, IfName: "eth0"}
		for _, ad := range []netip.Addr{p.V4, p.V6} {
			if ad.IsValid() {
				e.Addrs = append(e.Addrs, ad)
			}
		}
		match := len(e.Addrs) > 0
		for _, ad := range e.Addrs {
			i := slices.IndexFunc(dpEps, func(x datapath.Endpoint) bool { return x.NetID == p.NetID && x.Addr == ad })
			if i < 0 || dpEps[i].IfIndex != p.IfIndex || dpEps[i].HostMAC.String() != e.HostMAC {
				match = false
				break
			}
			e.PodMAC = dpEps[i].PodMAC.String()
		}
		if !match {
			continue
		}
		found = append(found, e)
	}
	if len(found) == 0 {
		return nil
	}
	// Who they are: the API's NetworkEndpoints of this node first, then
	// its Pods by IP. Uncached reads, once per agent start.
	var neps lacev1.NetworkEndpointList
	if err := s.reader.List(ctx, &neps, client.MatchingLabels{lacev1.LabelNode: s.opts.NodeName}); err != nil {
		return fmt.Errorf("list network endpoints: %w", err)
	}
	var pods corev1.PodList
	if err := s.reader.List(ctx, &pods, client.MatchingFields{"spec.nodeName": s.opts.NodeName}); err != nil {
		return fmt.Errorf("list pods: %w", err)
	}
	netName := map[uint32]string{}
	byName := map[string]*lacev1.Network{}
	for i, n := range nets {
		netName[uint32(n.Status.ID)] = n.Name
		byName[n.Name] = &nets[i]
	}
	for i := range found {
		e := &found[i]
		e.Network = netName[e.NetID]
		for _, ne := range neps.Items {
			if ne.Spec.Node == s.opts.NodeName && sameAddrs(ne.Spec.Addresses, e.Addrs) {
				e.PodNS, e.PodName, e.PodUID, e.Network = ne.Namespace, ne.Name, ne.Labels[lacev1.LabelPodUID], ne.Spec.Network
				if ne.Spec.Interface != "" {
					e.IfName = ne.Spec.Interface
				}
				break
			}
		}
		if e.PodName == "" {
			for _, p := range pods.Items {
				if p.Spec.NodeName != s.opts.NodeName || p.Spec.HostNetwork {
					continue
				}
				var ips []lacev1.IPAddress
				for _, ip := range p.Status.PodIPs {
					ips = append(ips, lacev1.IPAddress(ip.IP))
				}
				if sameAddrs(ips, e.Addrs) {
					e.PodNS, e.PodName, e.PodUID = p.Namespace, p.Name, string(p.UID)
					break
				}
			}
		}
		if nw := byName[e.Network]; nw != nil && nw.Spec.Type == lacev1.NetworkTypeL2 {
			// An l2 port: its subnets and gateway are the network's.
			e.L2, e.GatewayMAC = true, ipam.L2GatewayMAC(nw.Status.ID).String()
			for _, ad := range e.Addrs {
				p, _ := l2Subnet(nw, ad.Is4())
				e.PrefixBits = append(e.PrefixBits, p.Bits())
				e.Gateways = append(e.Gateways, ipam.L2Gateway(p))
			}
		} else {
			for _, ad := range e.Addrs {
				gw := netip.Addr{}
				for _, b := range st.Blocks {
					if b.Network == e.Network && b.Prefix.Contains(ad) {
						gw = gateway(b.Prefix)
					}
				}
				e.Gateways = append(e.Gateways, gw)
			}
		}
		s.log.Info("adopted a pod attachment from the kernel", "pod", e.PodNS+"/"+e.PodName, "network", e.Network,
			"addrs", e.Addrs, "interface", e.HostIf)
	}
	return s.cp.putAll(found)
}

// sameAddrs says whether list names exactly the addresses of addrs.
func sameAddrs(list []lacev1.IPAddress, addrs []netip.Addr) bool {
	if len(list) != len(addrs) || len(list) == 0 {
		return false
	}
	want := make([]string, 0, len(addrs))
	for _, ad := range addrs {
		want = append(want, ad.String())
	}
	got := make([]string, 0, len(list))
	for _, x := range list {
		ad, err := netip.ParseAddr(string(x))
		if err != nil {
			return false
		}
		got = append(got, ad.String())
	}
	sort.Strings(want)
	sort.Strings(got)
	return slices.Equal(want, got)
}

// EnsureNetworkEndpoints writes the NetworkEndpoint of every ready endpoint
// whose record is missing or differs (deleted by hand, lost with the API's
// storage, or never written because the agent stopped right after ADD). It
// reads the cache: on a node where nothing changed it writes nothing.
func (s *Server) EnsureNetworkEndpoints(ctx context.Context) error {
	var errs []error
	for _, e := range s.cp.all() {
		if !e.Ready || e.PodName == "" {
			continue
		}
		var ne lacev1.NetworkEndpoint
		err := s.client.Get(ctx, types.NamespacedName{Namespace: e.PodNS, Name: e.PodName}, &ne)
		if err == nil && ne.Labels[lacev1.LabelPodUID] == e.PodUID && equalSpec(ne.Spec, s.networkEndpointSpec(e)) {
			continue
		}
		if err != nil && !apierrors.IsNotFound(err) {
			errs = append(errs, err)
			continue
		}
		var pod corev1.Pod
		if err := s.client.Get(ctx, types.NamespacedName{Namespace: e.PodNS, Name: e.PodName}, &pod); err != nil ||
			string(pod.UID) != e.PodUID || pod.DeletionTimestamp != nil {
			continue // the pod is going: CollectEndpoints deals with it
		}
		if err := s.writeNetworkEndpoint(ctx, &pod, e); err != nil && !apierrors.IsAlreadyExists(err) && !apierrors.IsConflict(err) {
			errs = append(errs, fmt.Errorf("write network endpoint %s/%s: %w", e.PodNS, e.PodName, err))
			continue
		}
		s.log.Info("wrote missing or changed NetworkEndpoint", "pod", e.PodNS+"/"+e.PodName)
	}
	return errors.Join(errs...)
}

func equalSpec(a, b lacev1.NetworkEndpointSpec) bool {
	return a.Network == b.Network && a.Node == b.Node && a.MAC == b.MAC && a.Interface == b.Interface &&
		slices.Equal(a.Addresses, b.Addresses)
}

package cni

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	lacev1 "github.com/lace-cni/lace/api/v1alpha1"
	"github.com/lace-cni/lace/internal/datapath"
	"github.com/lace-cni/lace/internal/model/ipam"
	"github.com/lace-cni/lace/internal/podnet"
	"github.com/lace-cni/lace/pkg/cniapi"
)

// A pod of an l2 network gets its addresses and MAC from lace-controller
// (global IPAM), not from the node's block: at ADD the agent creates the
// pod's NetworkEndpoint with no addresses, lace-controller writes what it
// assigned to its status (condition AddressesAllocated), and the agent
// records them in the spec it owns once the pod is attached.

// l2AddressWait is how long an ADD waits for lace-controller to assign an
// l2 pod's addresses before asking the runtime to try again.
var l2AddressWait = 15 * time.Second

// l2Overhead is what an l2 port's packet carries more than an l3 one's
// between nodes: the Ethernet frame itself travels in SRv6 (next header
// 143), so its 14-byte header counts against the underlay's MTU beside the
// outer IPv6 header.
const l2Overhead = 14

// l2Endpoint makes the endpoint record of pod in l2 network nw: the pod's
// NetworkEndpoint created (or its own adopted), lace-controller's
// assignment awaited, and the record written to the checkpoint before any
// kernel change.
func (s *Server) l2Endpoint(ctx context.Context, req *cniapi.Request, pod *corev1.Pod, nw *lacev1.Network) (Endpoint, error) {
	if err := s.ensureL2NetworkEndpoint(ctx, pod, nw.Name, req.IfName); err != nil {
		return Endpoint{}, err
	}
	addrs, mac, err := s.waitL2Addresses(ctx, pod, nw.Name)
	if err != nil {
		return Endpoint{}, err
	}
	// The network's ID: named before lace-controller assigns anything.
	if nw.Status.ID == 0 {
		if err := s.reader.Get(ctx, types.NamespacedName{Name: nw.Name}, nw); err != nil || nw.Status.ID == 0 {
			return Endpoint{}, cniErr(errTryAgainLater, "network %s has no ID yet (%v)", nw.Name, err)
		}
	}
	e := Endpoint{ContainerID: req.ContainerID, IfName: req.IfName, NetNS: req.NetNS, PodNS: pod.Namespace, PodName: pod.Name,
		PodUID: string(pod.UID), Network: nw.Name, NetID: uint32(nw.Status.ID), HostIf: podnet.HostIfName(req.ContainerID),
		L2: true, PodMAC: mac.String(), GatewayMAC: ipam.L2GatewayMAC(nw.Status.ID).String()}
	for _, ad := range addrs {
		p, ok := l2Subnet(nw, ad.Is4())
		if !ok || !ipam.L2Assignable(p, ad) {
			return Endpoint{}, cniErr(errNoAddress, "lace-controller assigned pod %s/%s address %s, which is not assignable in l2 network %s",
				pod.Namespace, pod.Name, ad, nw.Name)
		}
		e.Addrs = append(e.Addrs, ad)
		e.PrefixBits = append(e.PrefixBits, p.Bits())
		e.Gateways = append(e.Gateways, ipam.L2Gateway(p))
	}
	// Reserved under addLock, written outside it (checkpoint.reserve).
	s.addLock.Lock()
	err = s.l2AddrsFree(pod, nw, e)
	var wait func() error
	if err == nil {
		wait = s.cp.reserve(e)
	}
	s.addLock.Unlock()
	if err != nil {
		return Endpoint{}, err
	}
	return e, wait()
}

// l2AddrsFree says why e's addresses cannot be its pod's on this node, or
// nil. The node reaches each of its pods by its address alone (a host
// route): an address another pod on the node holds, in whatever network,
// or the node's own, cannot be this pod's here. The caller holds addLock.
func (s *Server) l2AddrsFree(pod *corev1.Pod, nw *lacev1.Network, e Endpoint) error {
	taken := map[netip.Addr]string{}
	for _, ad := range s.sync.OwnAddrs() {
		taken[ad] = "the node"
	}
	for _, x := range s.cp.all() {
		if x.HostIf == e.HostIf {
			continue // this ADD's own, from a try that stopped short
		}
		for _, ad := range x.Addrs {
			taken[ad] = "pod " + x.PodNS + "/" + x.PodName
		}
	}
	for _, ad := range e.Addrs {
		if who, ok := taken[ad]; ok {
			// An earlier sandbox of this pod goes with its DEL: try again.
			code := uint(errNoAddress)
			if who == "pod "+e.PodNS+"/"+e.PodName {
				code = errTryAgainLater
			}
			s.recorder.Eventf(pod, corev1.EventTypeWarning, "AddressInUse", "address %s of l2 network %s is in use on node %s by %s", ad, nw.Name, s.opts.NodeName, who)
			return cniErr(code, "address %s of l2 network %s is in use on node %s by %s", ad, nw.Name, s.opts.NodeName, who)
		}
	}
	return nil
}

// l2Subnet is nw's subnet of a family.
func l2Subnet(nw *lacev1.Network, is4 bool) (netip.Prefix, bool) {
	sn := nw.Spec.IPv6Subnet
	if is4 {
		sn = nw.Spec.IPv4Subnet
	}
	if sn == nil {
		return netip.Prefix{}, false
	}
	p, err := netip.ParsePrefix(string(sn.Prefix))
	return p.Masked(), err == nil
}

// ensureL2NetworkEndpoint creates pod's NetworkEndpoint in network with
// no addresses, for lace-controller to assign them. One this pod already
// has there (an earlier ADD's: a retry, a new sandbox) is kept, with what
// lace-controller gave it; one of a namesake pod or of another network on
// this node is replaced (lace-controller then releases what it held).
func (s *Server) ensureL2NetworkEndpoint(ctx context.Context, pod *corev1.Pod, network, ifName string) error {
	want := &lacev1.NetworkEndpoint{ObjectMeta: metav1.ObjectMeta{Namespace: pod.Namespace, Name: pod.Name,
		Labels:          map[string]string{lacev1.LabelPodUID: string(pod.UID), lacev1.LabelNetwork: network, lacev1.LabelNode: s.opts.NodeName},
		OwnerReferences: []metav1.OwnerReference{{APIVersion: "v1", Kind: "Pod", Name: pod.Name, UID: pod.UID, Controller: ptr.To(true)}}},
		Spec: lacev1.NetworkEndpointSpec{Network: network, Node: s.opts.NodeName, Interface: ifName}}
	key := client.ObjectKeyFromObject(want)
	for range 2 {
		err := s.client.Create(ctx, want.DeepCopy())
		if err == nil {
			return nil
		}
		if !apierrors.IsAlreadyExists(err) {
			return cniErr(errTryAgainLater, "create NetworkEndpoint %s: %v", key, err)
		}
		var cur lacev1.NetworkEndpoint
		if err := s.reader.Get(ctx, key, &cur); apierrors.IsNotFound(err) {
			continue
		} else if err != nil {
			return cniErr(errTryAgainLater, "get NetworkEndpoint %s: %v", key, err)
		}
		switch {
		case cur.DeletionTimestamp != nil:
			return cniErr(errTryAgainLater, "NetworkEndpoint %s is being deleted", key)
		case cur.Spec.Node != s.opts.NodeName || cur.Labels[lacev1.LabelNode] != s.opts.NodeName:
			s.recorder.Eventf(pod, corev1.EventTypeWarning, "NetworkEndpointTaken",
				"NetworkEndpoint %s is held by node %q, not %s (the pod's node): left to lace-controller to remove", key, cur.Spec.Node, s.opts.NodeName)
			return cniErr(errTryAgainLater, "NetworkEndpoint %s is held by node %q: %v", key, cur.Spec.Node, errNetworkEndpointTaken)
		case cur.Labels[lacev1.LabelPodUID] == string(pod.UID) && cur.Spec.Network == network:
			return nil
		}
		s.log.Info("replacing a stale NetworkEndpoint", "endpoint", key.String(), "podUID", cur.Labels[lacev1.LabelPodUID], "network", cur.Spec.Network)
		if err := s.client.Delete(ctx, &cur, client.Preconditions{UID: &cur.UID}); client.IgnoreNotFound(err) != nil {
			return cniErr(errTryAgainLater, "delete stale NetworkEndpoint %s: %v", key, err)
		}
	}
	return cniErr(errTryAgainLater, "NetworkEndpoint %s is being replaced", key)
}

// waitL2Addresses waits for lace-controller's answer on pod's
// NetworkEndpoint: its addresses and MAC (AddressesAllocated True), or why
// it has none (False: an ADD error with lace-controller's message, and an
// Event on the pod). The agent's cache holds every NetworkEndpoint and
// follows the status write within milliseconds; the API server is asked
// now and then in case the cache lags.
func (s *Server) waitL2Addresses(ctx context.Context, pod *corev1.Pod, network string) ([]netip.Addr, net.HardwareAddr, error) {
	deadline := time.Now().Add(l2AddressWait)
	key := types.NamespacedName{Namespace: pod.Namespace, Name: pod.Name}
	for i := 1; ; i++ {
		var r client.Reader = s.client
		if i%10 == 0 {
			r = s.reader
		}
		var ne lacev1.NetworkEndpoint
		if err := r.Get(ctx, key, &ne); err == nil && ne.Labels[lacev1.LabelPodUID] == string(pod.UID) && ne.Spec.Network == network {
			c := meta.FindStatusCondition(ne.Status.Conditions, lacev1.ConditionAddressesAllocated)
			switch {
			case c != nil && c.Status == metav1.ConditionTrue:
				addrs, mac, err := parseAssigned(ne.Status)
				if err == nil {
					return addrs, mac, nil
				}
				s.log.Info("unusable l2 assignment", "endpoint", key.String(), "err", err)
			case c != nil && c.Status == metav1.ConditionFalse:
				s.recorder.Eventf(pod, corev1.EventTypeWarning, "NoFreeAddress", "l2 network %s: %s: %s", network, c.Reason, c.Message)
				return nil, nil, cniErr(errNoAddress, "pod %s/%s gets no address in l2 network %s: %s: %s", pod.Namespace, pod.Name, network, c.Reason, c.Message)
			}
		}
		if time.Now().After(deadline) {
			return nil, nil, cniErr(errTryAgainLater, "lace-controller has not assigned pod %s/%s its addresses in l2 network %s yet (NetworkEndpoint %s, condition %s)",
				pod.Namespace, pod.Name, network, key, lacev1.ConditionAddressesAllocated)
		}
		select {
		case <-ctx.Done():
			return nil, nil, ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// parseAssigned reads lace-controller's assignment: an address per family
// at most, and a unicast MAC.
func parseAssigned(st lacev1.NetworkEndpointStatus) ([]netip.Addr, net.HardwareAddr, error) {
	mac, err := net.ParseMAC(string(st.MAC))
	if err != nil || len(mac) != 6 || mac[0]&1 != 0 {
		return nil, nil, fmt.Errorf("MAC %q", st.MAC)
	}
	var out []netip.Addr
	seen := map[bool]bool{}
	for _, x := range st.Addresses {
		ad, err := netip.ParseAddr(string(x))
		if err != nil || seen[ad.Is4()] {
			return nil, nil, fmt.Errorf("addresses %v", st.Addresses)
		}
		seen[ad.Is4()] = true
		out = append(out, ad)
	}
	if len(out) == 0 {
		return nil, nil, fmt.Errorf("no address")
	}
	return out, mac, nil
}

// l2Entries are the l2 networks' neighbour tables and forwarding
// databases for the node's Ready l2 endpoints: each pod's MAC on its host
// interface and its addresses at that MAC, and, for every l2 network with
// a port here, the anycast gateway (its addresses at its MAC, routed by
// from_pod). The addresses and MACs of other nodes (Neighbor and FDBEntry
// objects) are to be merged here, the local ports winning for their own
// MACs.
func l2Entries(eps []Endpoint) ([]datapath.L2Neighbor, []datapath.FDBEntry) {
	var neigh []datapath.L2Neighbor
	var fdb []datapath.FDBEntry
	gateway := map[uint32]bool{}
	for _, e := range eps {
		if !e.Ready || e.Deleting || !e.L2 {
			continue
		}
		pm, err := net.ParseMAC(e.PodMAC)
		if err != nil || e.HostIfIndex == 0 {
			continue
		}
		fdb = append(fdb, datapath.FDBEntry{NetID: e.NetID, MAC: pm, IfIndex: uint32(e.HostIfIndex)})
		for _, ad := range e.Addrs {
			neigh = append(neigh, datapath.L2Neighbor{NetID: e.NetID, Addr: ad, MAC: pm})
		}
		gm, err := net.ParseMAC(e.GatewayMAC)
		if gateway[e.NetID] || err != nil {
			continue
		}
		gateway[e.NetID] = true
		fdb = append(fdb, datapath.FDBEntry{NetID: e.NetID, MAC: gm, Gateway: true})
		for _, gw := range e.Gateways {
			if gw.IsValid() {
				neigh = append(neigh, datapath.L2Neighbor{NetID: e.NetID, Addr: gw, MAC: gm, Router: true})
			}
		}
	}
	return neigh, fdb
}

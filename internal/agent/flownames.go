package agent

import (
	"context"
	"fmt"
	"net/netip"
	"sort"

	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	lacev1 "github.com/lace-cni/lace/api/v1alpha1"
	"github.com/lace-cni/lace/internal/agent/flows"
	"github.com/lace-cni/lace/internal/agent/policy"
	"github.com/lace-cni/lace/internal/model"
	"github.com/lace-cni/lace/internal/netpol"
)

// flowNames are the names a flow's numbers stand for, as the caches hold
// them now (flows.Namer): pods by their NetworkEndpoints, the node's pods
// by port, networks, and the policies the enforcer last wrote.
func flowNames(ctx context.Context, c client.Reader, locals policy.Locals, pol *policy.Enforcer) (flows.Names, error) {
	n := flows.Names{Pods: map[netpol.PeerKey]string{}, Locals: map[uint32]flows.Local{}, Networks: map[uint32]string{},
		Services: map[flows.Frontend]string{}, NodePorts: map[flows.Frontend]string{}, NodeAddrs: map[netip.Addr]bool{}}
	var nets lacev1.NetworkList
	if err := c.List(ctx, &nets); err != nil {
		return n, fmt.Errorf("list networks: %w", err)
	}
	ids := map[string]uint32{}
	for _, nw := range nets.Items {
		if nw.Status.ID > 0 {
			ids[nw.Name] = uint32(nw.Status.ID)
			n.Networks[uint32(nw.Status.ID)] = nw.Name
		}
	}
	var neps lacev1.NetworkEndpointList
	if err := c.List(ctx, &neps); err != nil {
		return n, fmt.Errorf("list network endpoints: %w", err)
	}
	podNet := map[string]uint32{}
	for _, ne := range neps.Items {
		id := ids[ne.Spec.Network]
		key := ne.Namespace + "/" + ne.Name
		podNet[key] = id
		for _, s := range append(append([]lacev1.IPAddress(nil), ne.Spec.Addresses...), ne.Status.Addresses...) {
			if a, err := netip.ParseAddr(string(s)); err == nil {
				n.Pods[netpol.PeerKey{NetID: id, Addr: a.Unmap()}] = key
			}
		}
	}
	locals.EachLocal(func(ns, name string, ifindex uint32) {
		n.Locals[ifindex] = flows.Local{Pod: ns + "/" + name, NetID: podNet[ns+"/"+name]}
	})
	n.Policies = pol.Policies()
	var svcs corev1.ServiceList
	if err := c.List(ctx, &svcs); err != nil {
		return n, fmt.Errorf("list services: %w", err)
	}
	serviceNames(svcs.Items, n.Services, n.NodePorts)
	var nodes corev1.NodeList
	if err := c.List(ctx, &nodes); err != nil {
		return n, fmt.Errorf("list nodes: %w", err)
	}
	for _, nd := range nodes.Items {
		for _, a := range nd.Status.Addresses {
			if ip, err := netip.ParseAddr(a.Address); err == nil {
				n.NodeAddrs[ip.Unmap()] = true
			}
		}
	}
	return n, nil
}

// serviceNames records where each Service is addressed: its ClusterIPs,
// external IPs and load balancer addresses on each port, and its node
// ports. A ClusterIP is the Service's alone (the API server allocates
// it): another Service's external IP never renames it. An external or
// load balancer address two Services claim is named after the older one
// (then by namespace/name). A claim the data plane refused altogether (a
// reserved or disallowed address) may still name a flow to it: the names
// are for people, the decisions the data plane's.
func serviceNames(svcs []corev1.Service, at, nodePorts map[flows.Frontend]string) {
	sort.Slice(svcs, func(i, j int) bool {
		a, b := &svcs[i], &svcs[j]
		if !a.CreationTimestamp.Equal(&b.CreationTimestamp) {
			return a.CreationTimestamp.Before(&b.CreationTimestamp)
		}
		return a.Namespace+"/"+a.Name < b.Namespace+"/"+b.Name
	})
	cluster := map[flows.Frontend]bool{}
	for pass := range 2 {
		for i := range svcs {
			s := &svcs[i]
			name := s.Namespace + "/" + s.Name
			addrs := s.Spec.ClusterIPs
			if pass == 1 {
				addrs = append([]string(nil), s.Spec.ExternalIPs...)
				for _, in := range s.Status.LoadBalancer.Ingress {
					addrs = append(addrs, in.IP)
				}
			}
			for _, sp := range s.Spec.Ports {
				proto, _ := model.IPProto(sp.Protocol)
				for _, a := range addrs {
					ip, err := netip.ParseAddr(a)
					if err != nil {
						continue
					}
					fe := flows.Frontend{Proto: proto, Addr: ip.Unmap(), Port: uint16(sp.Port)}
					if pass == 0 {
						at[fe], cluster[fe] = name, true
					} else if _, taken := at[fe]; !taken {
						at[fe] = name
					}
				}
				if pass == 0 && sp.NodePort != 0 {
					fe := flows.Frontend{Proto: proto, Port: uint16(sp.NodePort)}
					if _, taken := nodePorts[fe]; !taken {
						nodePorts[fe] = name
					}
				}
			}
		}
	}
}

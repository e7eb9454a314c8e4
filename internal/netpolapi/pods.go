package netpolapi

import (
	"net/netip"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"sigs.k8s.io/controller-runtime/pkg/client"

	lacev1 "github.com/lace-cni/lace/api/v1alpha1"
	"github.com/lace-cni/lace/internal/netpol"
)

// ClusterNetworkPolicyListGVK lists ClusterNetworkPolicies.
var ClusterNetworkPolicyListGVK = schema.GroupVersionKind{Group: ClusterNetworkPolicyGVK.Group,
	Version: ClusterNetworkPolicyGVK.Version, Kind: ClusterNetworkPolicyGVK.Kind + "List"}

// PodsOf are the policies' pods: each pod with a NetworkEndpoint of its own
// (same name and UID) in a network that has its ID, at the endpoint's
// addresses. Host-network pods have none: they are their node's addresses.
func PodsOf(pods []corev1.Pod, endpoints []lacev1.NetworkEndpoint, networks []lacev1.Network) []netpol.Pod {
	netID := make(map[string]uint32, len(networks))
	for _, n := range networks {
		if n.Status.ID > 0 {
			netID[n.Name] = uint32(n.Status.ID)
		}
	}
	byName := make(map[client.ObjectKey]*corev1.Pod, len(pods))
	for i := range pods {
		byName[client.ObjectKeyFromObject(&pods[i])] = &pods[i]
	}
	var out []netpol.Pod
	for i := range endpoints {
		ne := &endpoints[i]
		id, ok := netID[ne.Spec.Network]
		pod := byName[client.ObjectKeyFromObject(ne)]
		// A record of another pod of that name (UID) is no peer: its
		// labels are not this one's.
		if !ok || pod == nil || string(pod.UID) != ne.Labels[lacev1.LabelPodUID] {
			continue
		}
		out = append(out, podOf(pod, id, endpointAddrs(ne)))
	}
	return out
}

// NodesOf are the nodes as nodes peers select them: labels and addresses.
func NodesOf(nodes []corev1.Node) []netpol.Node {
	out := make([]netpol.Node, 0, len(nodes))
	for _, n := range nodes {
		nd := netpol.Node{Name: n.Name, Labels: n.Labels}
		for _, a := range n.Status.Addresses {
			if a.Type != corev1.NodeInternalIP && a.Type != corev1.NodeExternalIP {
				continue
			}
			if ip, err := netip.ParseAddr(a.Address); err == nil {
				nd.Addrs = append(nd.Addrs, ip.Unmap())
			}
		}
		out = append(out, nd)
	}
	return out
}

// endpointAddrs are a NetworkEndpoint's addresses: the node's (l3) or
// the controller's (l2).
func endpointAddrs(ne *lacev1.NetworkEndpoint) []netip.Addr {
	var out []netip.Addr
	for _, list := range [][]lacev1.IPAddress{ne.Spec.Addresses, ne.Status.Addresses} {
		for _, s := range list {
			if a, err := netip.ParseAddr(string(s)); err == nil {
				out = append(out, a.Unmap())
			}
		}
	}
	return out
}

func podOf(p *corev1.Pod, netID uint32, addrs []netip.Addr) netpol.Pod {
	out := netpol.Pod{Namespace: p.Namespace, Name: p.Name, Labels: p.Labels, NetID: netID, Addrs: addrs}
	for _, c := range p.Spec.Containers {
		for _, port := range c.Ports {
			if port.Name != "" {
				out.Ports = append(out.Ports, netpol.Port{Name: port.Name, Protocol: port.Protocol, Port: port.ContainerPort})
			}
		}
	}
	return out
}

// TrimPod is the transform of the every-pod cache: what policies read of
// a pod (its name, UID, labels, named ports).
func TrimPod(in any) (any, error) {
	p, ok := in.(*corev1.Pod)
	if !ok {
		return in, nil
	}
	out := &corev1.Pod{}
	out.Name, out.Namespace, out.UID, out.ResourceVersion, out.Labels = p.Name, p.Namespace, p.UID, p.ResourceVersion, p.Labels
	for _, c := range p.Spec.Containers {
		var ports []corev1.ContainerPort
		for _, port := range c.Ports {
			if port.Name != "" {
				ports = append(ports, corev1.ContainerPort{Name: port.Name, Protocol: port.Protocol, ContainerPort: port.ContainerPort})
			}
		}
		if ports != nil {
			out.Spec.Containers = append(out.Spec.Containers, corev1.Container{Ports: ports})
		}
	}
	return out, nil
}

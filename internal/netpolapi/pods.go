package netpolapi

import (
	"net/netip"
	"slices"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
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
func PodsOf(pods []*PeerPod, endpoints []lacev1.NetworkEndpoint, networks []lacev1.Network) []netpol.Pod {
	netID := make(map[string]uint32, len(networks))
	for _, n := range networks {
		if n.Status.ID > 0 {
			netID[n.Name] = uint32(n.Status.ID)
		}
	}
	byName := make(map[client.ObjectKey]*PeerPod, len(pods))
	for _, p := range pods {
		byName[client.ObjectKeyFromObject(p)] = p
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

func podOf(p *PeerPod, netID uint32, addrs []netip.Addr) netpol.Pod {
	return netpol.Pod{Namespace: p.Namespace, Name: p.Name, Labels: p.Labels, NetID: netID, Addrs: addrs, Ports: p.Ports}
}

// PeerPod is what network policies read of a pod: its name, namespace,
// UID, labels and named ports. The agent keeps one for every pod of the
// cluster (the peers policies select), in the store of an informer whose
// transform, TrimPod, makes them: a corev1.Pod value alone is 1,152 bytes,
// nearly all of it fields no policy reads. Its metadata holds only those
// and the resourceVersion (the informer's).
type PeerPod struct {
	metav1.ObjectMeta
	Ports []netpol.Port
}

// GetObjectKind implements runtime.Object: a PeerPod is no API kind.
func (p *PeerPod) GetObjectKind() schema.ObjectKind { return schema.EmptyObjectKind }

// DeepCopyObject implements runtime.Object.
func (p *PeerPod) DeepCopyObject() runtime.Object {
	out := &PeerPod{Ports: slices.Clone(p.Ports)}
	p.ObjectMeta.DeepCopyInto(&out.ObjectMeta)
	return out
}

// PeerOf is what policies read of p.
func PeerOf(p *corev1.Pod) *PeerPod {
	out := &PeerPod{ObjectMeta: metav1.ObjectMeta{Name: p.Name, Namespace: p.Namespace, UID: p.UID,
		ResourceVersion: p.ResourceVersion, Labels: p.Labels}}
	for _, c := range p.Spec.Containers {
		for _, port := range c.Ports {
			if port.Name != "" {
				out.Ports = append(out.Ports, netpol.Port{Name: port.Name, Protocol: port.Protocol, Port: port.ContainerPort})
			}
		}
	}
	return out
}

// PeersOf are PeerOf of each pod.
func PeersOf(pods []corev1.Pod) []*PeerPod {
	out := make([]*PeerPod, len(pods))
	for i := range pods {
		out[i] = PeerOf(&pods[i])
	}
	return out
}

// TrimPod is the transform of the every-pod informer: a pod becomes its
// PeerPod; anything else (a tombstone) stays as it is.
func TrimPod(in any) (any, error) {
	if p, ok := in.(*corev1.Pod); ok {
		return PeerOf(p), nil
	}
	return in, nil
}

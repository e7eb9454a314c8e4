package model

import (
	"cmp"
	"net/netip"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	lacev1 "github.com/lace-cni/lace/api/v1alpha1"
)

// HostEndpoints is what decides whether an endpoint at a node's address
// or at the API server's may be served (docs/security.md, "Endpoints at
// node addresses"). EndpointSlices are written by anyone who may write
// them in a namespace (a selector-less Service's slices by its author),
// and an endpoint there is trusted with the node's address as the source
// of its traffic (a frontend's flow to another node leaves from the entry
// node's address) and with the node's stack as its server. So:
//
//   - an endpoint at a loopback, link-local, unspecified or multicast
//     address is never served (what Endpoints validation refuses);
//   - an endpoint at the API server's address (the kubernetes Service's
//     endpoints) is served for default/kubernetes only;
//   - an endpoint at a node's address is served only when it names
//     (targetRef) a hostNetwork pod of the Service's own namespace running
//     on that very node (and its UID, when the slice gives one): what the
//     endpoint controller writes for a hostNetwork pod, and what a tenant
//     cannot make up for another namespace's or another node's address;
//   - an endpoint at an address more than one node lists in its status
//     (a compromised kubelet may list any) is never served, unless an
//     accepted UnderlayEndpoint names the address's node.
//
// The zero value (Nodes nil) checks nothing: callers that do not read Pods
// (lacectl) show what the slices say.
type HostEndpoints struct {
	// Nodes maps every node's address (Node status.addresses and accepted
	// underlay addresses) to the node's name.
	Nodes map[netip.Addr]string
	// Contested are the addresses more than one node lists in its status
	// (and no accepted underlay address settles), with those nodes: an
	// endpoint there is refused. A node's status is its kubelet's to
	// write, with any addresses (NodeRestriction bounds which Node, not
	// what it says), so a compromised node may list another's address;
	// mapped to either, the gate would serve an endpoint naming the
	// impostor's hostNetwork pod at the victim's address (or refuse the
	// victim's, by informer order). Refusing both costs the contested
	// address's hostNetwork endpoints until an UnderlayEndpoint names
	// its node; it serves the impostor nothing.
	Contested map[netip.Addr][]string
	// APIServer are the kubernetes Service's endpoint addresses.
	APIServer map[netip.Addr]bool
	// Pods are the cluster's hostNetwork pods by namespace/name.
	Pods map[types.NamespacedName]HostPod
}

// HostPod is a hostNetwork pod: its node and UID.
type HostPod struct {
	Node string
	UID  types.UID
}

// NewHostEndpoints builds HostEndpoints from the Nodes, the accepted
// UnderlayEndpoints, the EndpointSlices (the kubernetes Service's) and
// the hostNetwork pods (others are ignored).
func NewHostEndpoints(nodes []corev1.Node, ueps []lacev1.UnderlayEndpoint, epSlices []*discoveryv1.EndpointSlice, pods []corev1.Pod) HostEndpoints {
	h := HostEndpoints{Nodes: map[netip.Addr]string{}, Contested: map[netip.Addr][]string{}, APIServer: map[netip.Addr]bool{},
		Pods: map[types.NamespacedName]HostPod{}}
	// Who claims what, whatever the order the informer lists them in:
	// an address of one node maps to it, one of several to none.
	claim := func(claims map[netip.Addr][]string, a netip.Addr, node string) {
		if !slices.Contains(claims[a], node) {
			claims[a] = append(claims[a], node)
		}
	}
	status, underlay := map[netip.Addr][]string{}, map[netip.Addr][]string{}
	for i := range nodes {
		for _, na := range nodes[i].Status.Addresses {
			if a, ok := parseSloppyIP(na.Address); ok {
				claim(status, a, nodes[i].Name)
			}
		}
	}
	for i := range ueps {
		for _, s := range ueps[i].Spec.Addresses {
			if a, ok := parseSloppyIP(string(s)); ok {
				claim(underlay, a, ueps[i].Spec.Node)
			}
		}
	}
	// Accepted underlay addresses win over any node's status.
	for a, names := range status {
		if _, ok := underlay[a]; !ok {
			underlay[a] = names
		}
	}
	for a, names := range underlay {
		if len(names) == 1 {
			h.Nodes[a] = names[0]
		} else {
			slices.Sort(names)
			h.Contested[a] = names
		}
	}
	for _, sl := range epSlices {
		if !IsKubernetesService(sl.Namespace, sl.Labels[discoveryv1.LabelServiceName]) {
			continue
		}
		for _, ep := range sl.Endpoints {
			for _, s := range ep.Addresses {
				if a, ok := parseSloppyIP(s); ok {
					h.APIServer[a] = true
				}
			}
		}
	}
	for i := range pods {
		p := &pods[i]
		if p.Spec.HostNetwork && p.Spec.NodeName != "" && p.DeletionTimestamp == nil {
			h.Pods[types.NamespacedName{Namespace: p.Namespace, Name: p.Name}] = HostPod{Node: p.Spec.NodeName, UID: p.UID}
		}
	}
	return h
}

// TrimHostPod keeps what NewHostEndpoints reads of a hostNetwork pod
// (name, namespace, UID, deletion, node): the transform of the caches
// that hold them (the agents' and the controller's), so that a cluster's
// hostNetwork pods cost them little.
func TrimHostPod(obj any) (any, error) {
	p, ok := obj.(*corev1.Pod)
	if !ok {
		return obj, nil
	}
	return &corev1.Pod{TypeMeta: p.TypeMeta, ObjectMeta: metav1.ObjectMeta{Name: p.Name, Namespace: p.Namespace, UID: p.UID,
		ResourceVersion: p.ResourceVersion, DeletionTimestamp: p.DeletionTimestamp},
		Spec: corev1.PodSpec{NodeName: p.Spec.NodeName, HostNetwork: p.Spec.HostNetwork}}, nil
}

// IsKubernetesService tells the API server's own Service (its slices
// name the API server's addresses).
func IsKubernetesService(ns, name string) bool {
	return ns == metav1.NamespaceDefault && name == "kubernetes"
}

// Refused tells why the endpoint ep at addr, in a slice of Service
// svc's namespace, is not served ("" when it may be).
func (h HostEndpoints) Refused(svc *corev1.Service, ep *discoveryv1.Endpoint, addr netip.Addr) string {
	if h.Nodes == nil || IsKubernetesService(svc.Namespace, svc.Name) {
		return ""
	}
	// Endpoints (v1) validation refuses these (ValidateNonSpecialIP);
	// EndpointSlice validation does not. Served, one would point the
	// node's own sockets at its loopback services, or a frontend's flow
	// from outside at a link-local server (cloud metadata) from the
	// node's address.
	if addr.IsUnspecified() || addr.IsLoopback() || addr.IsLinkLocalUnicast() || addr.IsLinkLocalMulticast() ||
		addr.IsInterfaceLocalMulticast() || addr.IsMulticast() {
		return "a loopback, link-local, unspecified or multicast address"
	}
	if h.APIServer[addr] {
		return "the API server's address"
	}
	if names := h.Contested[addr]; len(names) > 0 {
		return "an address nodes " + strings.Join(names, ", ") + " all claim (served once an UnderlayEndpoint names its node)"
	}
	node, ok := h.Nodes[addr]
	if !ok {
		return ""
	}
	r := ep.TargetRef
	if r == nil || cmp.Or(r.Kind, "Pod") != "Pod" || cmp.Or(r.Namespace, svc.Namespace) != svc.Namespace {
		return "node " + node + "'s address, naming no hostNetwork pod of the namespace"
	}
	p, ok := h.Pods[types.NamespacedName{Namespace: svc.Namespace, Name: r.Name}]
	if !ok || p.Node != node || (r.UID != "" && r.UID != p.UID) {
		return "node " + node + "'s address, but " + r.Name + " is no hostNetwork pod on " + node
	}
	return ""
}

// Equal tells whether h and o decide alike.
func (h HostEndpoints) Equal(o HostEndpoints) bool {
	if (h.Nodes == nil) != (o.Nodes == nil) || len(h.Nodes) != len(o.Nodes) || len(h.APIServer) != len(o.APIServer) || len(h.Pods) != len(o.Pods) ||
		len(h.Contested) != len(o.Contested) {
		return false
	}
	for k, v := range h.Contested {
		if !slices.Equal(v, o.Contested[k]) {
			return false
		}
	}
	for k, v := range h.Nodes {
		if w, ok := o.Nodes[k]; !ok || w != v {
			return false
		}
	}
	for k := range h.APIServer {
		if !o.APIServer[k] {
			return false
		}
	}
	for k, v := range h.Pods {
		if w, ok := o.Pods[k]; !ok || w != v {
			return false
		}
	}
	return true
}

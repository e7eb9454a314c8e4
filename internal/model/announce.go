package model

import (
	"cmp"
	"hash/fnv"
	"net/netip"
	"slices"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"

	lacev1 "github.com/lace-cni/lace/api/v1alpha1"
)

// AnnounceInput is what decides which node announces each LoadBalancer
// VIP: every agent computes it from the same objects and its view of which
// agents are alive, and so agrees with the others without talking to them.
type AnnounceInput struct {
	Classes  []lacev1.LoadBalancerClass
	Services []*corev1.Service
	Slices   []*discoveryv1.EndpointSlice
	// Nodes are the cluster's nodes (their labels meet the classes'
	// nodeSelectors); Alive says whose agent renews its lease.
	Nodes []*corev1.Node
	Alive map[string]bool
}

// Announcement is the node that answers ARP/NDP for a VIP, "" when no
// node is eligible (then nobody does), with the Service and class it is
// for and how many nodes were eligible.
type Announcement struct {
	VIP      netip.Addr
	Service  ServiceKey
	Class    string
	Node     string
	Eligible int
}

// Announcements decides the announcer of every VIP a Lace LoadBalancer
// Service holds (status.loadBalancer.ingress, in its class's pool): the
// rendezvous hash of the VIP over the eligible nodes, i.e. those alive,
// selected by the class's nodeSelector, and (externalTrafficPolicy Local)
// holding a ready endpoint of the Service. A node that dies moves only its
// own VIPs, each to the node that ranks next for it. Sorted by VIP.
func Announcements(in AnnounceInput) []Announcement {
	pools := map[string][]IPRange{}
	selectors := map[string]labels.Selector{}
	var defaults []string
	for _, c := range in.Classes {
		for _, a := range c.Spec.Addresses {
			if r, err := ParseAddressRange(a); err == nil {
				pools[c.Name] = append(pools[c.Name], r)
			}
		}
		sel := labels.Everything()
		if c.Spec.NodeSelector != nil {
			s, err := metav1.LabelSelectorAsSelector(c.Spec.NodeSelector)
			if err != nil {
				s = labels.Nothing()
			}
			sel = s
		}
		selectors[c.Name] = sel
		if c.Spec.Default {
			defaults = append(defaults, c.Name)
		}
	}
	defaultClass := ""
	if len(defaults) == 1 {
		defaultClass = defaults[0]
	}
	bySvc := map[ServiceKey][]*discoveryv1.EndpointSlice{}
	for _, sl := range in.Slices {
		if k, ok := SliceService(sl); ok {
			bySvc[k] = append(bySvc[k], sl)
		}
	}
	var out []Announcement
	for _, svc := range in.Services {
		if svc.Spec.Type != corev1.ServiceTypeLoadBalancer {
			continue
		}
		class := className(svc, defaultClass)
		sel, ok := selectors[class]
		if class == "" || !ok {
			continue
		}
		key := ServiceKey{svc.Namespace, svc.Name}
		var ready map[string]bool
		if svc.Spec.ExternalTrafficPolicy == corev1.ServiceExternalTrafficPolicyLocal {
			ready = readyNodes(bySvc[key])
		}
		var eligible []string
		for _, n := range in.Nodes {
			// Nodes labelled out of external load balancers (kubeadm's
			// control plane) never announce, as MetalLB's speakers do not.
			if _, out := n.Labels[corev1.LabelNodeExcludeBalancers]; out {
				continue
			}
			if in.Alive[n.Name] && sel.Matches(labels.Set(n.Labels)) && (ready == nil || ready[n.Name]) {
				eligible = append(eligible, n.Name)
			}
		}
		for _, vip := range IngressAddrs(svc) {
			if !slices.ContainsFunc(pools[class], func(r IPRange) bool { return r.Contains(vip) }) {
				continue
			}
			out = append(out, Announcement{VIP: vip, Service: key, Class: class, Node: RendezvousNode(vip, eligible),
				Eligible: len(eligible)})
		}
	}
	slices.SortFunc(out, func(a, b Announcement) int {
		return cmp.Or(a.VIP.Compare(b.VIP), cmp.Compare(a.Service.Namespace, b.Service.Namespace),
			cmp.Compare(a.Service.Name, b.Service.Name))
	})
	// Two Services holding one VIP (an allocation conflict the controller
	// reports): the first announces.
	return slices.CompactFunc(out, func(a, b Announcement) bool { return a.VIP == b.VIP })
}

// readyNodes are the nodes holding a ready endpoint in slices.
func readyNodes(slices []*discoveryv1.EndpointSlice) map[string]bool {
	out := map[string]bool{}
	for _, sl := range slices {
		for _, e := range sl.Endpoints {
			if e.NodeName != nil && (e.Conditions.Ready == nil || *e.Conditions.Ready) {
				out[*e.NodeName] = true
			}
		}
	}
	return out
}

// mix64 is MurmurHash3's finalizer: FNV-1a alone leaves the high bits,
// which decide the comparison, nearly the same for inputs that differ in
// their last bytes (every VIP would go to one node).
func mix64(x uint64) uint64 {
	x ^= x >> 33
	x *= 0xff51afd7ed558ccd
	x ^= x >> 33
	x *= 0xc4ceb9fe1a85ec53
	x ^= x >> 33
	return x
}

// RendezvousNode picks the node of highest weight, FNV-1a of (node, vip)
// mixed:
// the same answer from any node with the same candidates, and removing a
// candidate moves only the VIPs it held. "" without candidates.
func RendezvousNode(vip netip.Addr, nodes []string) string {
	best, bestW := "", uint64(0)
	b := vip.AsSlice()
	for _, n := range nodes {
		h := fnv.New64a()
		_, _ = h.Write([]byte(n))
		_, _ = h.Write([]byte{0})
		_, _ = h.Write(b)
		w := mix64(h.Sum64())
		if best == "" || w > bestW || (w == bestW && n < best) {
			best, bestW = n, w
		}
	}
	return best
}

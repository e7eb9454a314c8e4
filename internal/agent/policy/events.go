package policy

import (
	"maps"
	"slices"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	"sigs.k8s.io/controller-runtime/pkg/client"

	lacev1 "github.com/lace-cni/lace/api/v1alpha1"
	"github.com/lace-cni/lace/internal/netpolapi"
	"github.com/lace-cni/lace/internal/predicates"
)

// changed reports whether an update changes what a compile reads of the
// object. A compile lists every pod of the cluster, and most updates a
// cluster makes change nothing of it: the controller manager rewrites the
// status of every pod on a node that is not Ready, the nodes' status
// carries conditions, and a NetworkEndpoint's its conditions. Kinds not
// named here (policies, namespaces, networks: few and rarely written)
// always count.
func changed(was, is any) bool {
	switch o := was.(type) {
	case *netpolapi.PeerPod:
		n, ok := is.(*netpolapi.PeerPod)
		return !ok || o.UID != n.UID || !maps.Equal(o.Labels, n.Labels) || !slices.Equal(o.Ports, n.Ports)
	case *corev1.Node:
		n, ok := is.(*corev1.Node)
		return !ok || predicates.NodeUpdate(o, n) // labels and addresses: nodes peers
	case *lacev1.NetworkEndpoint:
		n, ok := is.(*lacev1.NetworkEndpoint)
		// Its network, addresses and pod (netpolapi.PodsOf).
		return !ok || !maps.Equal(o.Labels, n.Labels) || !equality.Semantic.DeepEqual(o.Spec, n.Spec) ||
			!slices.Equal(o.Status.Addresses, n.Status.Addresses)
	}
	ob, ok1 := was.(client.Object)
	nb, ok2 := is.(client.Object)
	return !ok1 || !ok2 || ob.GetResourceVersion() != nb.GetResourceVersion() || ob.GetResourceVersion() == ""
}

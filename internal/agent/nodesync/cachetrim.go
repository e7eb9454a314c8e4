package nodesync

import (
	"slices"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"

	lacev1 "github.com/lace-cni/lace/api/v1alpha1"
)

// The agent caches every Service and EndpointSlice of the cluster: tens of
// thousands of objects in a large one, most of whose bytes it never reads.
// The cache transforms below drop those before an object is stored, which
// is most of the agent's memory at scale. Everything the agent reads of
// these objects (the model's services, the watches' predicates, the
// programming latency's trigger time) must stay: a field read here later
// must be kept here too.

// TrimCache is the cache options' transforms: managedFields go from every
// object (the agent writes with server-side apply and merge patches, which
// never need them), and Services and EndpointSlices lose what the agent
// does not read.
func TrimCache(o cache.Options) cache.Options {
	o.DefaultTransform = cache.TransformStripManagedFields()
	if o.ByObject == nil {
		o.ByObject = map[client.Object]cache.ByObject{}
	}
	o.ByObject[&corev1.Service{}] = cache.ByObject{Transform: trimService}
	o.ByObject[&discoveryv1.EndpointSlice{}] = cache.ByObject{Transform: trimEndpointSlice}
	return o
}

// trimMeta keeps what the agent reads of an object's metadata: its name,
// UID, versions, creation time (the older of two Services keeps an address
// both name), labels, deletion and the annotations named.
func trimMeta(m *metav1.ObjectMeta, keep ...string) {
	m.ManagedFields, m.OwnerReferences, m.Finalizers, m.GenerateName = nil, nil, nil, ""
	var ann map[string]string
	for _, k := range keep {
		if v, ok := m.Annotations[k]; ok {
			if ann == nil {
				ann = map[string]string{}
			}
			ann[k] = v
		}
	}
	m.Annotations = ann
}

// trimService keeps what model.ComputeServices and the Service watch's
// predicate read.
func trimService(in any) (any, error) {
	s, ok := in.(*corev1.Service)
	if !ok {
		return in, nil
	}
	trimMeta(&s.ObjectMeta, lacev1.AnnotationTrafficDistribution)
	// The load balancer's addresses and their mode are the frontends'.
	var ingress []corev1.LoadBalancerIngress
	for _, in := range s.Status.LoadBalancer.Ingress {
		if in.IP != "" {
			ingress = append(ingress, corev1.LoadBalancerIngress{IP: in.IP, IPMode: in.IPMode})
		}
	}
	s.Status = corev1.ServiceStatus{LoadBalancer: corev1.LoadBalancerStatus{Ingress: ingress}}
	sp := &s.Spec
	sp.Selector, sp.LoadBalancerIP = nil, ""
	sp.ExternalName, sp.IPFamilies = "", nil
	sp.AllocateLoadBalancerNodePorts, sp.IPFamilyPolicy = nil, nil
	for i := range sp.Ports {
		sp.Ports[i].AppProtocol = nil
	}
	return s, nil
}

// trimEndpointSlice keeps what model.ComputeServices and the programming
// latency read.
func trimEndpointSlice(in any) (any, error) {
	s, ok := in.(*discoveryv1.EndpointSlice)
	if !ok {
		return in, nil
	}
	trimMeta(&s.ObjectMeta, corev1.EndpointsLastChangeTriggerTime)
	// Decoding grows the endpoints by appending: up to twice the room
	// they need, kept as long as the object is.
	s.Endpoints = slices.Clone(s.Endpoints)
	for i := range s.Endpoints {
		e := &s.Endpoints[i]
		e.Hostname, e.DeprecatedTopology = nil, nil
		if r := e.TargetRef; r != nil {
			e.TargetRef = &corev1.ObjectReference{Kind: r.Kind, Namespace: r.Namespace, Name: r.Name, UID: r.UID}
		}
		// Each condition is a pointer to a bool of its own: cached
		// objects are never written, so they can all share two.
		c := &e.Conditions
		c.Ready, c.Serving, c.Terminating = sharedBool(c.Ready), sharedBool(c.Serving), sharedBool(c.Terminating)
	}
	return s, nil
}

var boolTrue, boolFalse = true, false

func sharedBool(b *bool) *bool {
	switch {
	case b == nil:
		return nil
	case *b:
		return &boolTrue
	}
	return &boolFalse
}

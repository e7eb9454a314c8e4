package controller

import (
	"context"
	"fmt"
	"net/netip"
	"strings"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/record"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/manager"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
	"sigs.k8s.io/controller-runtime/pkg/source"

	lacev1 "github.com/lace-cni/lace/api/v1alpha1"
	"github.com/lace-cni/lace/internal/model"
)

// Event reasons on Services.
const (
	ReasonServiceBound           = "NetworkBound"
	ReasonServiceUnbound         = "NoNetwork"
	ReasonEndpointInOtherNetwork = "EndpointInOtherNetwork"
	ReasonEndpointRefused        = "EndpointRefused"
)

// ServiceReconciler makes each Service's binding visible: the network it
// is bound to as an annotation, and Events when the binding changes or
// fails and when endpoints are left out because their pods are in another
// network. It decides nothing the agents do not decide the same way: both
// read model.ComputeServices. It writes only on change, and emits Events
// only on transitions (the annotations are the memory), so an idle cluster
// stays quiet.
type ServiceReconciler struct {
	Client   client.Client
	Recorder record.EventRecorder
	// Allowed is the externalIP allow-list, which the agents' acceptance
	// of underlay addresses (and so the host endpoint gate) reads.
	Allowed []netip.Prefix
	// gate is the host endpoint gate, built again only after a change of
	// what it is built from (SetupWithManager).
	gate *hostEndpointsMemo
}

// neAddrIndex indexes NetworkEndpoints by their node and each address they
// hold (model.NodeAddrKey): a Service's reconcile reads those of its
// endpoints, not every pod's of the cluster (30,000 objects copied out of
// the cache per Service at 1,000 nodes of 30 pods).
const neAddrIndex = "lace.addresses"

// networkEndpointsAt looks NetworkEndpoints up by node and address
// (neAddrIndex).
func (r *ServiceReconciler) networkEndpointsAt(ctx context.Context) func(string, netip.Addr) ([]*lacev1.NetworkEndpoint, error) {
	return func(node string, a netip.Addr) ([]*lacev1.NetworkEndpoint, error) {
		var l lacev1.NetworkEndpointList
		if err := r.Client.List(ctx, &l, client.MatchingFields{neAddrIndex: model.NodeAddrKey(node, a)}); err != nil {
			return nil, fmt.Errorf("network endpoints of node %s at %s: %w", node, a, err)
		}
		out := make([]*lacev1.NetworkEndpoint, len(l.Items))
		for i := range l.Items {
			out[i] = &l.Items[i]
		}
		return out, nil
	}
}

// networkEndpoint gets a pod's NetworkEndpoint (named after it), or nil.
func (r *ServiceReconciler) networkEndpoint(ctx context.Context) func(types.NamespacedName) (*lacev1.NetworkEndpoint, error) {
	return func(n types.NamespacedName) (*lacev1.NetworkEndpoint, error) {
		var ne lacev1.NetworkEndpoint
		if err := r.Client.Get(ctx, n, &ne); err != nil {
			if apierrors.IsNotFound(err) {
				return nil, nil
			}
			return nil, fmt.Errorf("network endpoint %s: %w", n, err)
		}
		return &ne, nil
	}
}

// SetupWithManager registers the reconciler.
func (r *ServiceReconciler) SetupWithManager(mgr ctrl.Manager) error {
	if err := mgr.GetFieldIndexer().IndexField(context.Background(), &lacev1.NetworkEndpoint{}, neAddrIndex, func(o client.Object) []string {
		ne := o.(*lacev1.NetworkEndpoint)
		var out []string
		for _, a := range model.NetworkEndpointAddrs(ne) {
			out = append(out, model.NodeAddrKey(ne.Spec.Node, a))
		}
		return out
	}); err != nil {
		return fmt.Errorf("index NetworkEndpoints by address: %w", err)
	}
	r.gate = &hostEndpointsMemo{}
	if err := r.gate.watch(context.Background(), mgr.GetCache()); err != nil {
		return err
	}
	// A change of the gate reconciles every Service: their refused
	// endpoints may change with it.
	gateChanged := make(chan event.GenericEvent, 1)
	if err := mgr.Add(manager.RunnableFunc(func(ctx context.Context) error {
		return r.gate.watchChanges(ctx, r.Client, r.Allowed, gateCheckEvery, gateChanged)
	})); err != nil {
		return fmt.Errorf("watch the host endpoint gate: %w", err)
	}
	all := handler.EnqueueRequestsFromMapFunc(r.allServices)
	sliceOwner := handler.EnqueueRequestsFromMapFunc(func(_ context.Context, o client.Object) []reconcile.Request {
		name := o.GetLabels()[discoveryv1.LabelServiceName]
		if name == "" {
			return nil
		}
		return []reconcile.Request{{NamespacedName: types.NamespacedName{Namespace: o.GetNamespace(), Name: name}}}
	})
	return ctrl.NewControllerManagedBy(mgr).
		Named("service").
		For(&corev1.Service{}, builder.WithPredicates(predicate.Or(predicate.GenerationChangedPredicate{}, predicate.LabelChangedPredicate{}))).
		Watches(&discoveryv1.EndpointSlice{}, sliceOwner).
		Watches(&lacev1.NetworkBindingPolicy{}, all, builder.WithPredicates(predicate.GenerationChangedPredicate{})).
		// A Network is read by the host endpoint gate too.
		Watches(&lacev1.Network{}, handler.EnqueueRequestsFromMapFunc(func(ctx context.Context, o client.Object) []reconcile.Request {
			r.gate.changed() // as in namespaceServices
			return r.allServices(ctx, o)
		})).
		// A hostNetwork pod (the only ones cached) may make its
		// namespace's endpoints at its node's address served, or not.
		Watches(&corev1.Pod{}, handler.EnqueueRequestsFromMapFunc(r.namespaceServices)).
		WatchesRawSource(source.Channel(gateChanged, all)).
		// A reconcile reads the cache and patches its own Service only:
		// one worker wrote the bindings of 10,000 Services at ~40/s
		// (docs/performance.md), each waiting for its patch's answer.
		WithOptions(controller.Options{MaxConcurrentReconciles: serviceWorkers}).
		Complete(r)
}

// serviceWorkers reconcile Services in parallel (never one Service twice
// at once: the workqueue hands a key to one worker).
const serviceWorkers = 4

func (r *ServiceReconciler) allServices(ctx context.Context, _ client.Object) []reconcile.Request {
	var l corev1.ServiceList
	if err := r.Client.List(ctx, &l); err != nil {
		return nil
	}
	out := make([]reconcile.Request, 0, len(l.Items))
	for _, s := range l.Items {
		out = append(out, reconcile.Request{NamespacedName: types.NamespacedName{Namespace: s.Namespace, Name: s.Name}})
	}
	return out
}

func (r *ServiceReconciler) namespaceServices(ctx context.Context, o client.Object) []reconcile.Request {
	// The gate's own handler may run after the reconciles this enqueues:
	// they must not build on the gate as it was.
	r.gate.changed()
	var l corev1.ServiceList
	if err := r.Client.List(ctx, &l, client.InNamespace(o.GetNamespace())); err != nil {
		return nil
	}
	out := make([]reconcile.Request, 0, len(l.Items))
	for _, s := range l.Items {
		out = append(out, reconcile.Request{NamespacedName: types.NamespacedName{Namespace: s.Namespace, Name: s.Name}})
	}
	return out
}

// Reconcile binds one Service.
func (r *ServiceReconciler) Reconcile(ctx context.Context, req reconcile.Request) (reconcile.Result, error) {
	var svc corev1.Service
	if err := r.Client.Get(ctx, req.NamespacedName, &svc); err != nil {
		return reconcile.Result{}, client.IgnoreNotFound(err)
	}
	var nets lacev1.NetworkList
	var nbps lacev1.NetworkBindingPolicyList
	var slices discoveryv1.EndpointSliceList
	var ns corev1.Namespace
	for _, l := range []client.ObjectList{&nets, &nbps} {
		if err := r.Client.List(ctx, l); err != nil {
			return reconcile.Result{}, fmt.Errorf("list %T: %w", l, err)
		}
	}
	if err := r.Client.List(ctx, &slices, client.InNamespace(svc.Namespace), client.MatchingLabels{discoveryv1.LabelServiceName: svc.Name}); err != nil {
		return reconcile.Result{}, fmt.Errorf("list endpoint slices of %s: %w", req, err)
	}
	pods, err := model.PodIndexOf(slices.Items, r.networkEndpointsAt(ctx), r.networkEndpoint(ctx))
	if err != nil {
		return reconcile.Result{}, fmt.Errorf("network endpoints of %s: %w", req, err)
	}
	if err := r.Client.Get(ctx, types.NamespacedName{Name: svc.Namespace}, &ns); err != nil && !apierrors.IsNotFound(err) {
		return reconcile.Result{}, fmt.Errorf("get namespace %s: %w", svc.Namespace, err)
	}
	hostEPs, err := r.gate.get(ctx, r.Client, r.Allowed)
	if err != nil {
		return reconcile.Result{}, err
	}
	st := model.ComputeServices(model.ServiceInput{Networks: nets.Items, BindingPolicies: nbps.Items,
		Services: []corev1.Service{svc}, EndpointSlices: slices.Items, PodIndex: pods,
		Namespaces: map[string]map[string]string{svc.Namespace: ns.Labels}, HostEndpoints: hostEPs})
	if len(st.Bound) == 0 {
		return reconcile.Result{}, nil // not Lace's: headless, ExternalName, another proxy's
	}
	b := st.Bound[0]
	var excluded, excludedFrom, refused, refusedWhy []string
	for _, e := range st.Excluded {
		if e.Refused != "" {
			refused = append(refused, e.Addr.String())
			refusedWhy = append(refusedWhy, fmt.Sprintf("%s (%s)", e.Addr, e.Refused))
			continue
		}
		excluded = append(excluded, e.Addr.String())
		excludedFrom = append(excludedFrom, fmt.Sprintf("%s (network %s)", e.Addr, e.Network))
	}
	want := map[string]string{lacev1.AnnotationServiceNetwork: b.Network, lacev1.AnnotationBindingError: b.Err,
		lacev1.AnnotationExcludedEndpoints: capList(excluded, ","), lacev1.AnnotationRefusedEndpoints: capList(refused, ",")}
	old := map[string]string{}
	changed := false
	for k, v := range want {
		old[k] = svc.Annotations[k]
		changed = changed || old[k] != v
	}
	if !changed {
		return reconcile.Result{}, nil
	}
	patch := client.MergeFrom(svc.DeepCopy())
	if svc.Annotations == nil {
		svc.Annotations = map[string]string{}
	}
	for k, v := range want {
		setOrDelete(svc.Annotations, k, v)
	}
	if err := r.Client.Patch(ctx, &svc, patch); err != nil {
		return reconcile.Result{}, fmt.Errorf("annotate service %s: %w", req, err)
	}
	if b.Err != "" && b.Err != old[lacev1.AnnotationBindingError] {
		r.Recorder.Eventf(&svc, corev1.EventTypeWarning, ReasonServiceUnbound, "not served: %s", b.Err)
	}
	if b.Network != "" && b.Network != old[lacev1.AnnotationServiceNetwork] {
		r.Recorder.Eventf(&svc, corev1.EventTypeNormal, ReasonServiceBound, "bound to network %s by NetworkBindingPolicy %s", b.Network, b.Policy)
	}
	if ex := want[lacev1.AnnotationExcludedEndpoints]; ex != "" && ex != old[lacev1.AnnotationExcludedEndpoints] {
		r.Recorder.Eventf(&svc, corev1.EventTypeWarning, ReasonEndpointInOtherNetwork,
			"endpoints left out, their pods are not in the service's network %s: %s", b.Network, capList(excludedFrom, ", "))
	}
	if rf := want[lacev1.AnnotationRefusedEndpoints]; rf != "" && rf != old[lacev1.AnnotationRefusedEndpoints] {
		r.Recorder.Eventf(&svc, corev1.EventTypeWarning, ReasonEndpointRefused, "endpoints not served: %s", capList(refusedWhy, ", "))
	}
	return reconcile.Result{}, nil
}

// maxListed bounds the endpoint addresses the controller writes into a
// Service's annotations and Events. The slices are the tenant's to write
// (127/8 alone is 16M distinct refused addresses), Events have no message
// limit on core/v1 and a fresh message per change escapes the recorder's
// spam filter, so an unbounded list turns a tenant's slices into megabytes
// in etcd per change. Twenty addresses say what is wrong; the count says
// how much.
const maxListed = 20

// capList joins the first maxListed items and counts the rest.
func capList(items []string, sep string) string {
	if len(items) <= maxListed {
		return strings.Join(items, sep)
	}
	return fmt.Sprintf("%s%s… and %d more", strings.Join(items[:maxListed], sep), sep, len(items)-maxListed)
}

func setOrDelete(m map[string]string, k, v string) {
	if v == "" {
		delete(m, k)
		return
	}
	m[k] = v
}

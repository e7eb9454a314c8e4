package controller

import (
	"context"
	"errors"
	"fmt"
	"net/netip"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/record"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	lacev1 "github.com/lace-cni/lace/api/v1alpha1"
	"github.com/lace-cni/lace/internal/model"
)

// ExternalIPReconciler reports the external IPs Lace does not serve: the
// AnnotationExternalIPProblem annotation on the Service and a Warning
// Event, once per change of the verdict (the annotation is the memory, so
// an idle cluster stays quiet). It decides nothing the agents do not
// decide the same way: model.ExternalIPProblems runs their computation
// with the same allow-list (the chart gives both the same flag) and the
// same reserved addresses. One pass judges every Service at once, since a
// contest is between Services.
type ExternalIPReconciler struct {
	Client client.Client
	// APIReader lists the Services: a pass must see the annotation the
	// pass before wrote, which the cache may not hold yet (a second
	// Warning Event for one verdict otherwise; passes are frequent, since
	// Node addresses and the API server's slice count).
	APIReader client.Reader
	Recorder  record.EventRecorder
	// Allowed is the operator's allow-list (--allowed-external-ips).
	Allowed []netip.Prefix
}

var externalIPKey = reconcile.Request{NamespacedName: types.NamespacedName{Name: "external-ips"}}

// contender: a Service whose frontends can meet an external IP's address,
// or that carries a verdict to clear.
func contender(s *corev1.Service) bool {
	return len(s.Spec.ExternalIPs) > 0 || len(s.Status.LoadBalancer.Ingress) > 0 ||
		s.Annotations[lacev1.AnnotationExternalIPProblem] != ""
}

// SetupWithManager registers the reconciler.
func (r *ExternalIPReconciler) SetupWithManager(mgr ctrl.Manager) error {
	one := handler.EnqueueRequestsFromMapFunc(func(context.Context, client.Object) []reconcile.Request {
		return []reconcile.Request{externalIPKey}
	})
	svcPred := predicate.Funcs{
		CreateFunc:  func(e event.CreateEvent) bool { return contender(e.Object.(*corev1.Service)) },
		DeleteFunc:  func(e event.DeleteEvent) bool { return contender(e.Object.(*corev1.Service)) },
		GenericFunc: func(e event.GenericEvent) bool { return contender(e.Object.(*corev1.Service)) },
		UpdateFunc: func(e event.UpdateEvent) bool {
			return contender(e.ObjectOld.(*corev1.Service)) || contender(e.ObjectNew.(*corev1.Service))
		},
	}
	b := ctrl.NewControllerManagedBy(mgr).
		Named("externalip").
		Watches(&corev1.Service{}, one, builder.WithPredicates(svcPred)).
		// What binds a Service (a Service bound to no network serves
		// nothing) and what is reserved.
		Watches(&lacev1.Network{}, one).
		Watches(&lacev1.NetworkBindingPolicy{}, one, builder.WithPredicates(predicate.GenerationChangedPredicate{})).
		Watches(&corev1.Namespace{}, one, builder.WithPredicates(predicate.LabelChangedPredicate{})).
		// Underlay acceptance depends on the pools (model.AcceptUnderlays).
		Watches(&lacev1.LoadBalancerClass{}, one, builder.WithPredicates(predicate.GenerationChangedPredicate{}))
	return watchReserved(b, one).Complete(r)
}

// Reconcile judges every Service's external IPs.
func (r *ExternalIPReconciler) Reconcile(ctx context.Context, _ reconcile.Request) (reconcile.Result, error) {
	var nets lacev1.NetworkList
	var nbps lacev1.NetworkBindingPolicyList
	var nss corev1.NamespaceList
	var svcs corev1.ServiceList
	for _, l := range []client.ObjectList{&nets, &nbps, &nss} {
		if err := r.Client.List(ctx, l); err != nil {
			return reconcile.Result{}, fmt.Errorf("list %T: %w", l, err)
		}
	}
	svcReader := client.Reader(r.Client)
	if r.APIReader != nil {
		svcReader = r.APIReader
	}
	if err := svcReader.List(ctx, &svcs); err != nil {
		return reconcile.Result{}, fmt.Errorf("list services: %w", err)
	}
	reserved, err := listReserved(ctx, r.Client, r.Allowed)
	if err != nil {
		return reconcile.Result{}, err
	}
	in := model.ExternalIPInput{Networks: nets.Items, BindingPolicies: nbps.Items, Allowed: r.Allowed,
		Namespaces: make(map[string]map[string]string, len(nss.Items)), Reserved: reserved}
	for _, ns := range nss.Items {
		in.Namespaces[ns.Name] = ns.Labels
	}
	for _, s := range svcs.Items {
		if contender(&s) {
			in.Services = append(in.Services, s)
		}
	}
	problems := model.ExternalIPProblems(in)
	var errs []error
	for i := range in.Services {
		s := &in.Services[i]
		refused := problems[model.ServiceKeyOf(s.Namespace, s.Name)]
		want := model.ExternalIPProblem(refused)
		if s.Annotations[lacev1.AnnotationExternalIPProblem] == want {
			continue
		}
		patch := client.MergeFrom(s.DeepCopy())
		if s.Annotations == nil {
			s.Annotations = map[string]string{}
		}
		setOrDelete(s.Annotations, lacev1.AnnotationExternalIPProblem, want)
		if err := r.Client.Patch(ctx, s, patch); client.IgnoreNotFound(err) != nil {
			errs = append(errs, fmt.Errorf("annotate service %s/%s: %w", s.Namespace, s.Name, err))
			continue
		}
		if want != "" {
			r.Recorder.Event(s, corev1.EventTypeWarning, refused[0].Reason, want)
		}
	}
	return reconcile.Result{}, errors.Join(errs...)
}

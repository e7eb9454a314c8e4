package controller

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
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

// LoadBalancerReconciler hands out LoadBalancer VIPs from LoadBalancerClass
// pools into status.loadBalancer.ingress (model.AllocateLoadBalancers) and
// reports each class's state. One pass decides every Service at once, from
// what the Services hold: there is one writer (the leader), nothing is
// handed out twice, and a restart reads the allocation back from the
// Services themselves. It never touches Services of another class.
type LoadBalancerReconciler struct {
	Client client.Client
	// APIReader lists the Services: a pass must see the addresses the
	// pass before wrote, which the cache may not hold yet (handing one
	// out twice otherwise).
	APIReader client.Reader
	Recorder  record.EventRecorder
	// AllowedExternalIPs is the operator's allow-list
	// (--allowed-external-ips): pools never hand out another Service's
	// admitted external IP.
	AllowedExternalIPs []netip.Prefix
}

// lbKey is the one key every change enqueues: allocation is global.
var lbKey = reconcile.Request{NamespacedName: types.NamespacedName{Name: "load-balancers"}}

// SetupWithManager registers the reconciler.
func (r *LoadBalancerReconciler) SetupWithManager(mgr ctrl.Manager) error {
	one := handler.EnqueueRequestsFromMapFunc(func(context.Context, client.Object) []reconcile.Request {
		return []reconcile.Request{lbKey}
	})
	// Only Services that are or were LoadBalancers (or still hold an
	// address, or name external IPs, which pools avoid) count: ten thousand ClusterIPs changing enqueue nothing.
	lbOnly := predicate.NewPredicateFuncs(func(o client.Object) bool {
		s, ok := o.(*corev1.Service)
		return ok && (s.Spec.Type == corev1.ServiceTypeLoadBalancer || len(s.Status.LoadBalancer.Ingress) > 0 ||
			len(s.Spec.ExternalIPs) > 0)
	})
	b := ctrl.NewControllerManagedBy(mgr).
		Named("loadbalancer").
		Watches(&lacev1.LoadBalancerClass{}, one).
		// Classes select namespaces by their labels.
		Watches(&corev1.Namespace{}, one, builder.WithPredicates(predicate.LabelChangedPredicate{})).
		// Pools never hand out reserved addresses (pod subnets are the
		// Networks').
		Watches(&lacev1.Network{}, one, builder.WithPredicates(predicate.GenerationChangedPredicate{}))
	return watchReserved(b, one).
		Watches(&corev1.Service{}, one, builder.WithPredicates(predicate.Funcs{
			CreateFunc:  func(e event.CreateEvent) bool { return lbOnly.Create(e) },
			DeleteFunc:  func(e event.DeleteEvent) bool { return lbOnly.Delete(e) },
			GenericFunc: func(e event.GenericEvent) bool { return lbOnly.Generic(e) },
			UpdateFunc: func(e event.UpdateEvent) bool {
				return lbOnly.Create(event.CreateEvent{Object: e.ObjectOld}) || lbOnly.Create(event.CreateEvent{Object: e.ObjectNew})
			},
		})).
		Complete(r)
}

// Reconcile allocates every Lace LoadBalancer Service's VIPs.
func (r *LoadBalancerReconciler) Reconcile(ctx context.Context, _ reconcile.Request) (reconcile.Result, error) {
	var classes lacev1.LoadBalancerClassList
	var svcs corev1.ServiceList
	if err := r.Client.List(ctx, &classes); err != nil {
		return reconcile.Result{}, fmt.Errorf("list load balancer classes: %w", err)
	}
	if err := r.APIReader.List(ctx, &svcs); err != nil {
		return reconcile.Result{}, fmt.Errorf("list services: %w", err)
	}
	var nss corev1.NamespaceList
	if err := r.Client.List(ctx, &nss); err != nil {
		return reconcile.Result{}, fmt.Errorf("list namespaces: %w", err)
	}
	nsLabels := make(map[string]map[string]string, len(nss.Items))
	for _, ns := range nss.Items {
		nsLabels[ns.Name] = ns.Labels
	}
	reserved, err := listReserved(ctx, r.Client, r.AllowedExternalIPs)
	if err != nil {
		return reconcile.Result{}, err
	}
	res := model.AllocateLoadBalancers(classes.Items, svcs.Items, nsLabels,
		model.LBAvoid{Reserved: reserved, AllowedExternalIPs: r.AllowedExternalIPs})
	var errs []error
	for i := range svcs.Items {
		s := &svcs.Items[i]
		st, ours := res.Services[s.Namespace+"/"+s.Name]
		if !ours {
			// Released when it stops being a LoadBalancer: only addresses
			// of Lace's pools, never another implementation's.
			if res.Release[s.Namespace+"/"+s.Name] {
				errs = append(errs, r.setIngress(ctx, s, nil))
			}
			if s.Annotations[lacev1.AnnotationLoadBalancerProblem] != "" {
				errs = append(errs, r.setProblem(ctx, s, ""))
			}
			continue
		}
		errs = append(errs, r.apply(ctx, s, st))
	}
	for i := range classes.Items {
		errs = append(errs, r.classStatus(ctx, &classes.Items[i], res.Classes[classes.Items[i].Name]))
	}
	return reconcile.Result{}, errors.Join(errs...)
}

func (r *LoadBalancerReconciler) apply(ctx context.Context, s *corev1.Service, st model.LBServiceState) error {
	before := model.IngressAddrs(s)
	if !slices.Equal(before, st.IPs) {
		if err := r.setIngress(ctx, s, st.IPs); err != nil {
			return err
		}
		if len(st.IPs) > 0 {
			r.Recorder.Eventf(s, corev1.EventTypeNormal, model.LBReasonAllocated, "load balancer addresses %s from LoadBalancerClass %s",
				joinAddrs(st.IPs), st.Class)
		}
	}
	problem := ""
	if st.Reason != "" {
		problem = st.Reason + ": " + st.Message
	}
	if s.Annotations[lacev1.AnnotationLoadBalancerProblem] == problem {
		return nil
	}
	if err := r.setProblem(ctx, s, problem); err != nil {
		return err
	}
	if st.Reason != "" {
		r.Recorder.Event(s, corev1.EventTypeWarning, st.Reason, st.Message)
	}
	return nil
}

func (r *LoadBalancerReconciler) setProblem(ctx context.Context, s *corev1.Service, problem string) error {
	patch := client.MergeFrom(s.DeepCopy())
	if s.Annotations == nil {
		s.Annotations = map[string]string{}
	}
	setOrDelete(s.Annotations, lacev1.AnnotationLoadBalancerProblem, problem)
	if err := r.Client.Patch(ctx, s, patch); client.IgnoreNotFound(err) != nil {
		return fmt.Errorf("annotate service %s/%s: %w", s.Namespace, s.Name, err)
	}
	return nil
}

// setIngress makes the Service's ingress ips, keeping the entries (ports,
// ipMode) of the addresses that stay. The patch is conditional on the
// version read, so it never writes over a newer status.
func (r *LoadBalancerReconciler) setIngress(ctx context.Context, s *corev1.Service, ips []netip.Addr) error {
	patch := client.MergeFromWithOptions(s.DeepCopy(), client.MergeFromWithOptimisticLock{})
	var out []corev1.LoadBalancerIngress
	for _, a := range ips {
		ing := corev1.LoadBalancerIngress{IP: a.String()}
		for _, old := range s.Status.LoadBalancer.Ingress {
			if o, err := netip.ParseAddr(old.IP); err == nil && o.Unmap() == a {
				ing = old
				break
			}
		}
		out = append(out, ing)
	}
	s.Status.LoadBalancer.Ingress = out
	if err := r.Client.Status().Patch(ctx, s, patch); client.IgnoreNotFound(err) != nil {
		return fmt.Errorf("set load balancer status of %s/%s: %w", s.Namespace, s.Name, err)
	}
	return nil
}

func (r *LoadBalancerReconciler) classStatus(ctx context.Context, c *lacev1.LoadBalancerClass, st model.LBClassState) error {
	cond := metav1.Condition{Type: "Ready", Status: metav1.ConditionFalse, Reason: st.Reason, Message: st.Message,
		ObservedGeneration: c.Generation}
	if st.Ready {
		cond.Status = metav1.ConditionTrue
	}
	// What of the pool is never handed out (reserved addresses, other
	// Services' external IPs): said, not fatal.
	excl := metav1.Condition{Type: model.LBConditionAddressesExcluded, Status: metav1.ConditionFalse,
		Reason: model.LBReasonNoneExcluded, Message: "every address of the pool may be handed out", ObservedGeneration: c.Generation}
	if st.Excluded != "" {
		excl.Status, excl.Reason, excl.Message = metav1.ConditionTrue, model.LBReasonReservedOverlap, st.Excluded
	}
	exclChanged := !conditionUnchanged(c.Status.Conditions, excl)
	if c.Status.Allocated == int32(st.Allocated) && conditionUnchanged(c.Status.Conditions, cond) && !exclChanged {
		return nil
	}
	c.Status.Allocated = int32(st.Allocated)
	meta.SetStatusCondition(&c.Status.Conditions, cond)
	meta.SetStatusCondition(&c.Status.Conditions, excl)
	if err := r.Client.Status().Update(ctx, c); err != nil {
		return fmt.Errorf("update status of LoadBalancerClass %s: %w", c.Name, err)
	}
	if !st.Ready {
		r.Recorder.Event(c, corev1.EventTypeWarning, st.Reason, st.Message)
	}
	if exclChanged && st.Excluded != "" {
		r.Recorder.Event(c, corev1.EventTypeWarning, model.LBReasonReservedOverlap, st.Excluded)
	}
	return nil
}

func joinAddrs(as []netip.Addr) string {
	out := make([]string, len(as))
	for i, a := range as {
		out[i] = a.String()
	}
	return strings.Join(out, ", ")
}

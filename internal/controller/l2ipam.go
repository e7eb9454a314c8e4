package controller

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/record"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	lacev1 "github.com/lace-cni/lace/api/v1alpha1"
	"github.com/lace-cni/lace/internal/model/ipam"
)

// endpointIndex indexes Neighbors and FDBEntries by the endpoint they
// were allocated for (AnnotationEndpoint).
const endpointIndex = "lace.endpoint"

// l2ExhaustedRetry is how often an endpoint of an exhausted l2 network
// tries again (an address is freed when another endpoint goes).
const l2ExhaustedRetry = 5 * time.Second

// L2AddressReconciler is the global IPAM of l2 networks: it gives each
// NetworkEndpoint of an l2 network an address per family of the network
// and a MAC, and takes them back when the endpoint goes.
//
// Each address is held by a Neighbor and each MAC by an FDBEntry whose
// name is derived from the address or MAC (ipam.NeighborName,
// ipam.FDBEntryName): creating the object is the claim, and the API
// server's AlreadyExists is the only arbiter. So no address or MAC is ever
// given twice, whatever a stale cache, a restart or a second controller
// believes; the cache only says where to start looking. What was assigned
// goes to the endpoint's status (the agent reads it at CNI ADD and
// records it in the spec it owns), with condition AddressesAllocated.
//
// Neighbors and FDBEntries are cluster-scoped and cannot be owned by a
// namespaced NetworkEndpoint, so they carry its UID (LabelEndpointUID) and
// namespace/name (AnnotationEndpoint), and this reconciler deletes them
// when that endpoint is gone or replaced: every Neighbor and FDBEntry
// event maps to its endpoint, so orphans left while the controller was
// down are swept when it starts.
type L2AddressReconciler struct {
	Client   client.Client
	Recorder record.EventRecorder
}

// SetupWithManager registers the reconciler with one worker: two
// endpoints of one network never search at the same time (the claim would
// still hold; one worker only avoids wasted tries).
func (r *L2AddressReconciler) SetupWithManager(mgr ctrl.Manager) error {
	toEndpoint := handler.EnqueueRequestsFromMapFunc(func(_ context.Context, o client.Object) []reconcile.Request {
		ns, name, ok := strings.Cut(o.GetAnnotations()[lacev1.AnnotationEndpoint], "/")
		if !ok {
			return nil
		}
		return []reconcile.Request{{NamespacedName: types.NamespacedName{Namespace: ns, Name: name}}}
	})
	for _, o := range []client.Object{&lacev1.Neighbor{}, &lacev1.FDBEntry{}} {
		if err := mgr.GetFieldIndexer().IndexField(context.Background(), o, endpointIndex, func(o client.Object) []string {
			if k := o.GetAnnotations()[lacev1.AnnotationEndpoint]; k != "" {
				return []string{k}
			}
			return nil
		}); err != nil {
			return fmt.Errorf("index %T by endpoint: %w", o, err)
		}
	}
	return ctrl.NewControllerManagedBy(mgr).
		Named("l2address").
		For(&lacev1.NetworkEndpoint{}, builder.WithPredicates(predicate.GenerationChangedPredicate{})).
		Watches(&lacev1.Neighbor{}, toEndpoint).
		Watches(&lacev1.FDBEntry{}, toEndpoint).
		WithOptions(controller.Options{MaxConcurrentReconciles: 1}).
		Complete(r)
}

// Reconcile implements reconcile.Reconciler.
func (r *L2AddressReconciler) Reconcile(ctx context.Context, req reconcile.Request) (reconcile.Result, error) {
	var ne lacev1.NetworkEndpoint
	err := r.Client.Get(ctx, req.NamespacedName, &ne)
	if apierrors.IsNotFound(err) || (err == nil && ne.DeletionTimestamp != nil) {
		return reconcile.Result{}, r.release(ctx, req.String(), "")
	}
	if err != nil {
		return reconcile.Result{}, fmt.Errorf("get NetworkEndpoint %s: %w", req, err)
	}
	// What an earlier endpoint of this name held goes first.
	if err := r.release(ctx, req.String(), ne.UID); err != nil {
		return reconcile.Result{}, err
	}
	var nw lacev1.Network
	if err := r.Client.Get(ctx, client.ObjectKey{Name: ne.Spec.Network}, &nw); err != nil {
		// No such network: the agent refuses the pod; nothing to assign.
		return reconcile.Result{}, client.IgnoreNotFound(err)
	}
	if nw.Spec.Type != lacev1.NetworkTypeL2 || nw.DeletionTimestamp != nil {
		return reconcile.Result{}, nil
	}
	if nw.Status.ID == 0 {
		return reconcile.Result{RequeueAfter: time.Second}, nil // the network controller names it first
	}
	return r.assign(ctx, &ne, &nw)
}

// assign makes sure ne holds an address of every family of nw and a MAC,
// and reports them in its status.
func (r *L2AddressReconciler) assign(ctx context.Context, ne *lacev1.NetworkEndpoint, nw *lacev1.Network) (reconcile.Result, error) {
	held, mac, err := r.held(ctx, ne)
	if err != nil {
		return reconcile.Result{}, err
	}
	var prefixes []netip.Prefix
	for _, s := range []*lacev1.Subnet{nw.Spec.IPv4Subnet, nw.Spec.IPv6Subnet} {
		if s == nil {
			continue
		}
		p, err := netip.ParsePrefix(string(s.Prefix))
		if err != nil {
			return reconcile.Result{}, nil // the API's validation refuses it
		}
		prefixes = append(prefixes, p.Masked())
	}
	for _, p := range prefixes {
		if _, ok := held[p.Addr().Is4()]; ok {
			continue
		}
		a, m, err := r.claim(ctx, ne, nw.Name, p, mac)
		if err != nil {
			return reconcile.Result{}, err
		}
		if !a.IsValid() {
			msg := fmt.Sprintf("network %s has no free %s address (%s: all %d assignable addresses are held)", nw.Name, family(p), p, ipam.L2Capacity(p))
			return reconcile.Result{RequeueAfter: l2ExhaustedRetry},
				r.report(ctx, ne, nil, nil, metav1.ConditionFalse, ReasonSubnetExhausted, msg)
		}
		held[p.Addr().Is4()] = a
		mac = m
	}
	var addrs []netip.Addr
	for _, is4 := range []bool{true, false} {
		if a, ok := held[is4]; ok {
			addrs = append(addrs, a)
		}
	}
	if err := r.ensureFDB(ctx, ne, nw.Name, mac); err != nil {
		return reconcile.Result{}, err
	}
	return reconcile.Result{}, r.report(ctx, ne, addrs, mac, metav1.ConditionTrue, ReasonAllocated, "")
}

func family(p netip.Prefix) string {
	if p.Addr().Is4() {
		return "IPv4"
	}
	return "IPv6"
}

// held returns the addresses (by family: true for IPv4) and the MAC the
// Neighbors of ne hold.
func (r *L2AddressReconciler) held(ctx context.Context, ne *lacev1.NetworkEndpoint) (map[bool]netip.Addr, net.HardwareAddr, error) {
	var list lacev1.NeighborList
	if err := r.Client.List(ctx, &list, client.MatchingLabels{lacev1.LabelEndpointUID: string(ne.UID)}); err != nil {
		return nil, nil, fmt.Errorf("list Neighbors of %s/%s: %w", ne.Namespace, ne.Name, err)
	}
	held := map[bool]netip.Addr{}
	var mac net.HardwareAddr
	for _, n := range list.Items {
		a, err := netip.ParseAddr(string(n.Spec.Address))
		if err != nil || n.Spec.Network != ne.Spec.Network || n.DeletionTimestamp != nil {
			continue
		}
		held[a.Is4()] = a
		if m, err := net.ParseMAC(string(n.Spec.MAC)); err == nil {
			mac = m
		}
	}
	return held, mac, nil
}

// claim creates the Neighbor of the lowest free address of p for ne, with
// mac (derived from the address when nil); returns the address (invalid
// when p has none free) and the MAC.
func (r *L2AddressReconciler) claim(ctx context.Context, ne *lacev1.NetworkEndpoint, network string, p netip.Prefix, mac net.HardwareAddr) (netip.Addr, net.HardwareAddr, error) {
	var list lacev1.NeighborList
	if err := r.Client.List(ctx, &list, client.MatchingLabels{lacev1.LabelNetwork: network}); err != nil {
		return netip.Addr{}, nil, fmt.Errorf("list Neighbors of network %s: %w", network, err)
	}
	used := map[netip.Addr]bool{}
	for _, n := range list.Items {
		if a, err := netip.ParseAddr(string(n.Spec.Address)); err == nil {
			used[a] = true
		}
	}
	for a, ok := ipam.L2Next(p, netip.Addr{}); ok; a, ok = ipam.L2Next(p, a) {
		if used[a] {
			continue
		}
		m := mac
		if m == nil {
			var err error
			if m, err = r.freeMAC(ctx, network, a); err != nil {
				return netip.Addr{}, nil, err
			}
		}
		n := &lacev1.Neighbor{
			ObjectMeta: r.claimMeta(ipam.NeighborName(network, a), network, ne),
			Spec: lacev1.NeighborSpec{Network: network, Address: lacev1.IPAddress(a.String()),
				MAC: lacev1.MACAddress(m.String()), Publisher: lacev1.PublisherController},
		}
		err := r.Client.Create(ctx, n)
		if apierrors.IsAlreadyExists(err) {
			continue // taken since the cache saw it
		}
		if err != nil {
			return netip.Addr{}, nil, fmt.Errorf("claim %s in network %s: %w", a, network, err)
		}
		log.FromContext(ctx).Info("assigned an l2 address", "networkEndpoint", ne.Namespace+"/"+ne.Name, "network", network, "address", a, "mac", m)
		return a, m, nil
	}
	return netip.Addr{}, nil, nil
}

// freeMAC returns the MAC derived from a, or a salted one when an
// FDBEntry of another endpoint holds it (an IPv6 address's low 32 bits
// are not unique).
func (r *L2AddressReconciler) freeMAC(ctx context.Context, network string, a netip.Addr) (net.HardwareAddr, error) {
	for salt := uint32(0); salt < 64; salt++ {
		m := ipam.L2MAC(a, salt)
		err := r.Client.Get(ctx, client.ObjectKey{Name: ipam.FDBEntryName(network, m)}, &lacev1.FDBEntry{})
		if apierrors.IsNotFound(err) {
			return m, nil
		}
		if err != nil {
			return nil, fmt.Errorf("look up MAC %s in network %s: %w", m, network, err)
		}
	}
	return nil, fmt.Errorf("no free MAC near %s in network %s", ipam.L2MAC(a, 0), network)
}

// ensureFDB claims mac for ne at ne's node.
func (r *L2AddressReconciler) ensureFDB(ctx context.Context, ne *lacev1.NetworkEndpoint, network string, mac net.HardwareAddr) error {
	name := ipam.FDBEntryName(network, mac)
	var cur lacev1.FDBEntry
	err := r.Client.Get(ctx, client.ObjectKey{Name: name}, &cur)
	if err == nil {
		if cur.Labels[lacev1.LabelEndpointUID] != string(ne.UID) {
			// Taken between freeMAC and here: the endpoint's Neighbors go,
			// and the next pass starts over with another MAC.
			if err := r.release(ctx, ne.Namespace+"/"+ne.Name, ""); err != nil {
				return err
			}
			return fmt.Errorf("MAC %s of network %s was taken by %s meanwhile", mac, network, cur.Annotations[lacev1.AnnotationEndpoint])
		}
		return nil
	}
	if !apierrors.IsNotFound(err) {
		return fmt.Errorf("get FDBEntry %s: %w", name, err)
	}
	f := &lacev1.FDBEntry{
		ObjectMeta: r.claimMeta(name, network, ne),
		Spec: lacev1.FDBEntrySpec{Network: network, MAC: lacev1.MACAddress(mac.String()), Node: ne.Spec.Node,
			Publisher: lacev1.PublisherController},
	}
	if err := r.Client.Create(ctx, f); err != nil && !apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("claim MAC %s in network %s: %w", mac, network, err)
	} else if apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("MAC %s of network %s taken meanwhile: trying again", mac, network)
	}
	return nil
}

func (r *L2AddressReconciler) claimMeta(name, network string, ne *lacev1.NetworkEndpoint) metav1.ObjectMeta {
	return metav1.ObjectMeta{
		Name:        name,
		Labels:      map[string]string{lacev1.LabelNetwork: network, lacev1.LabelEndpointUID: string(ne.UID)},
		Annotations: map[string]string{lacev1.AnnotationEndpoint: ne.Namespace + "/" + ne.Name},
	}
}

// release deletes the Neighbors and FDBEntries allocated for the
// endpoint namespace/name whose UID is not keep (all of them when keep is
// empty).
func (r *L2AddressReconciler) release(ctx context.Context, key string, keep types.UID) error {
	var nbrs lacev1.NeighborList
	if err := r.Client.List(ctx, &nbrs, client.MatchingFields{endpointIndex: key}); err != nil {
		return fmt.Errorf("list Neighbors of %s: %w", key, err)
	}
	var fdbs lacev1.FDBEntryList
	if err := r.Client.List(ctx, &fdbs, client.MatchingFields{endpointIndex: key}); err != nil {
		return fmt.Errorf("list FDBEntries of %s: %w", key, err)
	}
	var stale []client.Object
	for i := range nbrs.Items {
		stale = appendStale(stale, &nbrs.Items[i], key, keep)
	}
	for i := range fdbs.Items {
		stale = appendStale(stale, &fdbs.Items[i], key, keep)
	}
	for _, o := range stale {
		uid := o.GetUID()
		if err := r.Client.Delete(ctx, o, client.Preconditions{UID: &uid}); err != nil && !apierrors.IsNotFound(err) {
			return fmt.Errorf("release %T %s of %s: %w", o, o.GetName(), key, err)
		}
		log.FromContext(ctx).Info("released an l2 claim", "networkEndpoint", key, "object", o.GetName())
	}
	return nil
}

func appendStale(out []client.Object, o client.Object, key string, keep types.UID) []client.Object {
	if o.GetAnnotations()[lacev1.AnnotationEndpoint] != key || o.GetDeletionTimestamp() != nil {
		return out
	}
	if keep != "" && o.GetLabels()[lacev1.LabelEndpointUID] == string(keep) {
		return out
	}
	return append(out, o)
}

// report writes the assignment and condition AddressesAllocated to ne's
// status, with a Warning Event when it turns False.
func (r *L2AddressReconciler) report(ctx context.Context, ne *lacev1.NetworkEndpoint, addrs []netip.Addr, mac net.HardwareAddr,
	status metav1.ConditionStatus, reason, msg string) error {
	next := ne.DeepCopy()
	next.Status.Addresses = nil
	for _, a := range addrs {
		next.Status.Addresses = append(next.Status.Addresses, lacev1.IPAddress(a.String()))
	}
	next.Status.MAC = ""
	if mac != nil {
		next.Status.MAC = lacev1.MACAddress(mac.String())
	}
	if msg == "" {
		msg = fmt.Sprintf("assigned %v and MAC %s", next.Status.Addresses, next.Status.MAC)
	}
	prev := meta.FindStatusCondition(ne.Status.Conditions, lacev1.ConditionAddressesAllocated)
	meta.SetStatusCondition(&next.Status.Conditions, metav1.Condition{
		Type: lacev1.ConditionAddressesAllocated, Status: status, Reason: reason, Message: msg, ObservedGeneration: ne.Generation,
	})
	if status == metav1.ConditionFalse && (prev == nil || prev.Status != status || prev.Reason != reason) {
		r.Recorder.Event(ne, corev1.EventTypeWarning, reason, msg)
	}
	if equalStatus(ne.Status, next.Status) {
		return nil
	}
	if err := r.Client.Status().Patch(ctx, next, client.MergeFrom(ne)); err != nil {
		return fmt.Errorf("report l2 addresses of %s/%s: %w", ne.Namespace, ne.Name, err)
	}
	return nil
}

func equalStatus(a, b lacev1.NetworkEndpointStatus) bool {
	if fmt.Sprint(a.Addresses) != fmt.Sprint(b.Addresses) || a.MAC != b.MAC {
		return false
	}
	ca := meta.FindStatusCondition(a.Conditions, lacev1.ConditionAddressesAllocated)
	cb := meta.FindStatusCondition(b.Conditions, lacev1.ConditionAddressesAllocated)
	return ca != nil && cb != nil && ca.Status == cb.Status && ca.Reason == cb.Reason && ca.Message == cb.Message
}

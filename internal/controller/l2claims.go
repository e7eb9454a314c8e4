package controller

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/validation"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	ipamclaimsv1 "github.com/lace-cni/lace/api/ipamclaims/v1alpha1"
	lacev1 "github.com/lace-cni/lace/api/v1alpha1"
	"github.com/lace-cni/lace/internal/model"
	"github.com/lace-cni/lace/internal/model/ipam"
)

// This file decides who an l2 endpoint's addresses are held for (the
// endpoint, or the IPAMClaim its pod names) and keeps claims' objects.

// holder is who a Neighbor or FDBEntry is kept for: an endpoint (released
// with it) or an IPAMClaim (released with the claim, so the addresses
// outlive the pods that name it).
type holder struct {
	label, annotation string
	uid               types.UID
	key               string // namespace/name
	// claim is the claim as read; owner the pod it is (or, when it had
	// no live owner, now) in use by.
	claim *ipamclaimsv1.IPAMClaim
	owner string
}

func (h holder) meta(name, network string) metav1.ObjectMeta {
	return metav1.ObjectMeta{
		Name:        name,
		Labels:      map[string]string{lacev1.LabelNetwork: network, h.label: string(h.uid)},
		Annotations: map[string]string{h.annotation: h.key},
	}
}

func (h holder) neighbor(network string, a netip.Addr, mac net.HardwareAddr) *lacev1.Neighbor {
	return &lacev1.Neighbor{
		ObjectMeta: h.meta(ipam.NeighborName(network, a), network),
		Spec: lacev1.NeighborSpec{Network: network, Address: lacev1.IPAddress(a.String()),
			MAC: lacev1.MACAddress(mac.String()), Publisher: lacev1.PublisherController},
	}
}

func (h holder) fdbEntry(network string, mac net.HardwareAddr, node string) *lacev1.FDBEntry {
	return &lacev1.FDBEntry{
		ObjectMeta: h.meta(ipam.FDBEntryName(network, mac), network),
		Spec: lacev1.FDBEntrySpec{Network: network, MAC: lacev1.MACAddress(mac.String()), Node: node,
			Publisher: lacev1.PublisherController},
	}
}

// owns tells whether the MAC follows ne's pod: always for an endpoint's
// own; for a claim, when the claim names that pod its owner (another pod
// naming the claim meanwhile, a live migration's target, does not move
// it: the migration does).
func (h holder) owns(ne *lacev1.NetworkEndpoint) bool {
	return h.claim == nil || h.owner == ne.Name
}

func endpointHolder(ne *lacev1.NetworkEndpoint) holder {
	return holder{label: lacev1.LabelEndpointUID, annotation: lacev1.AnnotationEndpoint, uid: ne.UID, key: ne.Namespace + "/" + ne.Name}
}

// claimHolder is claim as the holder of pod's addresses: pod owns it
// unless another live pod does (a live migration's source).
func (r *L2AddressReconciler) claimHolder(ctx context.Context, claim *ipamclaimsv1.IPAMClaim, pod string) holder {
	h := holder{label: lacev1.LabelIPAMClaimUID, annotation: lacev1.AnnotationIPAMClaim, uid: claim.UID,
		key: claim.Namespace + "/" + claim.Name, claim: claim, owner: pod}
	if o := claim.Status.OwnerPod; o != nil && o.Name != pod && r.podExists(ctx, claim.Namespace, o.Name) {
		h.owner = o.Name // still in use there: this pod waits for the move
	}
	return h
}

// holderOf decides who ne's addresses are held for and what its pod
// asked for; a refusal when the claim it names is unusable.
func (r *L2AddressReconciler) holderOf(ctx context.Context, ne *lacev1.NetworkEndpoint, pod *corev1.Pod, nw *lacev1.Network) (holder, request, *refusal, error) {
	name := lacev1.IPAMClaimOf(pod.Annotations)
	if name == "" {
		rq, why := parseRequest(pod, nw, nil)
		return endpointHolder(ne), rq, why, nil
	}
	if errs := validation.IsDNS1123Subdomain(name); len(errs) > 0 {
		return holder{}, request{}, &refusal{ReasonInvalidRequest, fmt.Sprintf("pod %s names IPAMClaim %q, not a valid name: %s", pod.Name, name, strings.Join(errs, "; "))}, nil
	}
	var claim ipamclaimsv1.IPAMClaim
	err := r.APIReader.Get(ctx, client.ObjectKey{Namespace: pod.Namespace, Name: name}, &claim)
	if apierrors.IsNotFound(err) || (err == nil && claim.DeletionTimestamp != nil) {
		return holder{}, request{}, &refusal{ReasonIPAMClaimNotFound, fmt.Sprintf("pod %s names IPAMClaim %s/%s, which does not exist", pod.Name, pod.Namespace, name)}, nil
	}
	if err != nil {
		return holder{}, request{}, nil, fmt.Errorf("get IPAMClaim %s/%s: %w", pod.Namespace, name, err)
	}
	if claim.Spec.Network != nw.Name {
		return holder{}, request{}, &refusal{ReasonIPAMClaimWrongTarget, fmt.Sprintf("IPAMClaim %s/%s is for network %q, the pod is in %q", pod.Namespace, name, claim.Spec.Network, nw.Name)}, nil
	}
	// A node's kubelet may create a mirror pod in any namespace, with any
	// annotation: it must not take a VM's addresses (nor become its
	// migration's target) that way.
	if _, mirror := pod.Annotations[corev1.MirrorPodAnnotationKey]; mirror {
		return holder{}, request{}, &refusal{ReasonInvalidRequest, fmt.Sprintf("pod %s is a static pod (a node's mirror pod): it may not name IPAMClaim %s", pod.Name, name)}, nil
	}
	h := r.claimHolder(ctx, &claim, pod.Name)
	if why, err := r.notSameVM(ctx, h, pod); err != nil || why != nil {
		return holder{}, request{}, why, err
	}
	asked := claim.Status.IPs
	if len(asked) == 0 {
		asked = claim.Spec.IPRequests
	}
	rq, why := parseRequest(pod, nw, asked)
	return h, rq, why, nil
}

// recordClaim writes to h's claim (if any) the addresses it holds, and
// its owner pod when it has none alive.
func (r *L2AddressReconciler) recordClaim(ctx context.Context, h holder, nw *lacev1.Network, addrs []netip.Addr) error {
	if h.claim == nil {
		return nil
	}
	next := h.claim.DeepCopy()
	next.Status.IPs = nil
	for _, a := range addrs {
		p, _ := l2Prefix(nw, a.Is4())
		next.Status.IPs = append(next.Status.IPs, netip.PrefixFrom(a, p.Bits()).String())
	}
	next.Status.OwnerPod = &ipamclaimsv1.OwnerPod{Name: h.owner}
	if o := h.claim.Status.OwnerPod; slices.Equal(next.Status.IPs, h.claim.Status.IPs) && o != nil && o.Name == h.owner {
		return nil
	}
	if err := r.Client.Status().Patch(ctx, next, client.MergeFromWithOptions(h.claim, client.MergeFromWithOptimisticLock{})); err != nil {
		return fmt.Errorf("record addresses in IPAMClaim %s: %w", h.key, err)
	}
	*h.claim = *next
	return nil
}

// notSameVM refuses pod a claim another live pod owns (a live
// migration's source) unless both belong to the same controller (a
// KubeVirt VirtualMachineInstance owns both of its migration's pods), or
// to none.
func (r *L2AddressReconciler) notSameVM(ctx context.Context, h holder, pod *corev1.Pod) (*refusal, error) {
	if h.owner == pod.Name {
		return nil, nil
	}
	var owner corev1.Pod
	err := r.APIReader.Get(ctx, client.ObjectKey{Namespace: pod.Namespace, Name: h.owner}, &owner)
	if apierrors.IsNotFound(err) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("get pod %s/%s: %w", pod.Namespace, h.owner, err)
	}
	a, b := metav1.GetControllerOf(&owner), metav1.GetControllerOf(pod)
	if (a == nil && b == nil) || (a != nil && b != nil && a.UID == b.UID) {
		return nil, nil
	}
	return &refusal{ReasonAddressTaken, fmt.Sprintf("IPAMClaim %s is in use by pod %s, of another owner than pod %s", h.key, h.owner, pod.Name)}, nil
}

// setOwner records pod as the owner of h's claim, its addresses as they
// are: before the MAC moves to it, so that no reconcile in between (or
// after a restart) takes the MAC back to the pod it left.
func (r *L2AddressReconciler) setOwner(ctx context.Context, h *holder, pod string) error {
	h.owner = pod
	if h.claim == nil || (h.claim.Status.OwnerPod != nil && h.claim.Status.OwnerPod.Name == pod) {
		return nil
	}
	next := h.claim.DeepCopy()
	next.Status.OwnerPod = &ipamclaimsv1.OwnerPod{Name: pod}
	if err := r.Client.Status().Patch(ctx, next, client.MergeFromWithOptions(h.claim, client.MergeFromWithOptimisticLock{})); err != nil {
		return fmt.Errorf("record pod %s the owner of IPAMClaim %s: %w", pod, h.key, err)
	}
	*h.claim = *next
	return nil
}

func (r *L2AddressReconciler) podExists(ctx context.Context, ns, name string) bool {
	err := r.APIReader.Get(ctx, client.ObjectKey{Namespace: ns, Name: name}, &corev1.Pod{})
	return !apierrors.IsNotFound(err)
}

// IPAMClaimReconciler releases what an IPAMClaim held (its Neighbors and
// FDBEntries) once the claim is gone, or replaced by another of the same
// name. What a pod still uses is not released but handed to that pod's
// endpoint, and goes with it: freeing an address in use would give it to
// a second pod.
type IPAMClaimReconciler struct {
	Client client.Client
}

// SetupWithManager registers the reconciler. The indexes it lists by are
// L2AddressReconciler's.
func (r *IPAMClaimReconciler) SetupWithManager(mgr ctrl.Manager) error {
	return ctrl.NewControllerManagedBy(mgr).
		Named("ipamclaim").
		For(&ipamclaimsv1.IPAMClaim{}).
		Watches(&lacev1.Neighbor{}, toHolder(lacev1.AnnotationIPAMClaim)).
		Watches(&lacev1.FDBEntry{}, toHolder(lacev1.AnnotationIPAMClaim)).
		WithOptions(controller.Options{MaxConcurrentReconciles: 1}).
		Complete(r)
}

// Reconcile implements reconcile.Reconciler.
func (r *IPAMClaimReconciler) Reconcile(ctx context.Context, req reconcile.Request) (reconcile.Result, error) {
	var claim ipamclaimsv1.IPAMClaim
	err := r.Client.Get(ctx, req.NamespacedName, &claim)
	if apierrors.IsNotFound(err) || (err == nil && claim.DeletionTimestamp != nil) {
		if err := r.handOver(ctx, req.Namespace, req.String(), ""); err != nil {
			return reconcile.Result{}, err
		}
		return reconcile.Result{}, release(ctx, r.Client, claimIndex, req.String(), "")
	}
	if err != nil {
		return reconcile.Result{}, fmt.Errorf("get IPAMClaim %s: %w", req, err)
	}
	// Re-created under the same name: the old claim's objects are the old
	// claim's, handed over or released like a deleted claim's.
	if err := r.handOver(ctx, req.Namespace, req.String(), claim.UID); err != nil {
		return reconcile.Result{}, err
	}
	return reconcile.Result{}, release(ctx, r.Client, claimIndex, req.String(), claim.UID)
}

// handOver moves what the gone claim key held (but claim keep) to the
// endpoint (in ns) that was given it, if one is still there: its
// Neighbors by address, its FDBEntry by MAC.
func (r *IPAMClaimReconciler) handOver(ctx context.Context, ns, key string, keep types.UID) error {
	var nbrs lacev1.NeighborList
	var fdbs lacev1.FDBEntryList
	var eps lacev1.NetworkEndpointList
	for what, l := range map[string]client.ObjectList{"Neighbors": &nbrs, "FDBEntries": &fdbs} {
		if err := r.Client.List(ctx, l, client.MatchingFields{claimIndex: key}); err != nil {
			return fmt.Errorf("list %s of IPAMClaim %s: %w", what, key, err)
		}
	}
	if len(nbrs.Items)+len(fdbs.Items) == 0 {
		return nil
	}
	if err := r.Client.List(ctx, &eps, client.InNamespace(ns)); err != nil {
		return fmt.Errorf("list NetworkEndpoints of %s: %w", ns, err)
	}
	user := func(network string, uses func(st lacev1.NetworkEndpointStatus) bool) *lacev1.NetworkEndpoint {
		for i := range eps.Items {
			if ne := &eps.Items[i]; ne.DeletionTimestamp == nil && ne.Spec.Network == network && uses(ne.Status) {
				return ne
			}
		}
		return nil
	}
	var moves []client.Object
	var to []*lacev1.NetworkEndpoint
	stale := func(o client.Object) bool {
		return keep == "" || o.GetLabels()[lacev1.LabelIPAMClaimUID] != string(keep)
	}
	for i := range nbrs.Items {
		n := &nbrs.Items[i]
		if !stale(n) {
			continue
		}
		if ne := user(n.Spec.Network, func(st lacev1.NetworkEndpointStatus) bool { return slices.Contains(st.Addresses, n.Spec.Address) }); ne != nil {
			moves, to = append(moves, n), append(to, ne)
		}
	}
	for i := range fdbs.Items {
		f := &fdbs.Items[i]
		if !stale(f) {
			continue
		}
		if ne := user(f.Spec.Network, func(st lacev1.NetworkEndpointStatus) bool { return st.MAC == f.Spec.MAC }); ne != nil {
			moves, to = append(moves, f), append(to, ne)
		}
	}
	for i, o := range moves {
		before := o.DeepCopyObject().(client.Object)
		labels, ann := o.GetLabels(), o.GetAnnotations()
		delete(labels, lacev1.LabelIPAMClaimUID)
		delete(ann, lacev1.AnnotationIPAMClaim)
		labels[lacev1.LabelEndpointUID] = string(to[i].UID)
		ann[lacev1.AnnotationEndpoint] = to[i].Namespace + "/" + to[i].Name
		if err := r.Client.Patch(ctx, o, client.MergeFromWithOptions(before, client.MergeFromWithOptimisticLock{})); err != nil && !apierrors.IsNotFound(err) {
			return fmt.Errorf("hand %s of IPAMClaim %s to endpoint %s/%s: %w", o.GetName(), key, to[i].Namespace, to[i].Name, err)
		}
		log.FromContext(ctx).Info("handed an l2 claim's object to the endpoint using it", "ipamClaim", key, "object", o.GetName(), "networkEndpoint", to[i].Namespace+"/"+to[i].Name)
	}
	return nil
}

// firstHolder decides, for an endpoint given nothing yet, who its
// addresses are held for and what its pod asked for: the pod must be
// bound to the endpoint's network (the agent's binding at CNI ADD, which
// a node's agent could misstate).
func (r *L2AddressReconciler) firstHolder(ctx context.Context, ne *lacev1.NetworkEndpoint, pod *corev1.Pod, nw *lacev1.Network) (holder, request, *refusal, error) {
	why, err := notBound(ctx, r.Client, pod, nw.Name)
	if err != nil || why != nil {
		return holder{}, request{}, why, err
	}
	return r.holderOf(ctx, ne, pod, nw)
}

// notBound says why pod is not bound to network (nil: it is).
func notBound(ctx context.Context, c client.Client, pod *corev1.Pod, network string) (*refusal, error) {
	var ns corev1.Namespace
	if err := c.Get(ctx, client.ObjectKey{Name: pod.Namespace}, &ns); err != nil {
		return nil, fmt.Errorf("get namespace %s: %w", pod.Namespace, err)
	}
	var nbps lacev1.NetworkBindingPolicyList
	if err := c.List(ctx, &nbps); err != nil {
		return nil, fmt.Errorf("list binding policies: %w", err)
	}
	if b, err := model.Bind(nbps.Items, lacev1.MatchKindPod, pod.Namespace, pod.Name, pod.Labels, ns.Labels); err != nil || b.Network != network {
		return &refusal{ReasonNotBound, fmt.Sprintf("pod %s/%s is not bound to network %s (%v)", pod.Namespace, pod.Name, network, bindingWord(b, err))}, nil
	}
	return nil, nil
}

func bindingWord(b model.Binding, err error) string {
	if err != nil {
		return err.Error()
	}
	return fmt.Sprintf("policy %s binds it to %s", b.Policy, b.Network)
}

// pinned returns the holder of the addresses ne already has, and a
// request for exactly them and its MAC (a family held meanwhile by
// nobody is claimed again). A zero holder with no refusal: its claim is
// gone and its objects not handed over yet.
func (r *L2AddressReconciler) pinned(ctx context.Context, ne *lacev1.NetworkEndpoint, nw *lacev1.Network) (holder, request, *refusal, error) {
	rq := request{addrs: map[bool]netip.Addr{}}
	for _, s := range ne.Status.Addresses {
		if a, err := netip.ParseAddr(string(s)); err == nil {
			rq.addrs[a.Is4()] = a
		}
	}
	rq.mac, _ = net.ParseMAC(string(ne.Status.MAC))
	own := endpointHolder(ne)
	var n lacev1.Neighbor
	first, _ := netip.ParseAddr(string(ne.Status.Addresses[0]))
	err := r.APIReader.Get(ctx, client.ObjectKey{Name: ipam.NeighborName(nw.Name, first)}, &n)
	if apierrors.IsNotFound(err) {
		return own, rq, nil, nil
	}
	if err != nil {
		return holder{}, rq, nil, fmt.Errorf("get the Neighbor of %s: %w", first, err)
	}
	cuid := n.Labels[lacev1.LabelIPAMClaimUID]
	if cuid == "" {
		return own, rq, nil, nil // its own, or another's: claimFixed says which
	}
	cns, cname, _ := strings.Cut(n.Annotations[lacev1.AnnotationIPAMClaim], "/")
	var claim ipamclaimsv1.IPAMClaim
	err = r.APIReader.Get(ctx, client.ObjectKey{Namespace: cns, Name: cname}, &claim)
	if apierrors.IsNotFound(err) || (err == nil && string(claim.UID) != cuid) {
		return holder{}, rq, nil, nil
	}
	if err != nil {
		return holder{}, rq, nil, fmt.Errorf("get IPAMClaim %s/%s: %w", cns, cname, err)
	}
	if cns != ne.Namespace {
		return holder{}, rq, &refusal{ReasonAddressTaken, fmt.Sprintf("%s of network %s is held by IPAMClaim %s/%s", first, nw.Name, cns, cname)}, nil
	}
	return r.claimHolder(ctx, &claim, ne.Name), rq, nil, nil
}

package controller

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"net/netip"
	"sort"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/record"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	lacev1 "github.com/lace-cni/lace/api/v1alpha1"
	"github.com/lace-cni/lace/internal/model/ipam"
	"github.com/lace-cni/lace/internal/predicates"
	"github.com/lace-cni/lace/internal/tables"
)

// MaxNetworkID is the largest network ID: IDs are carried in 16 bits of the
// SRv6 function, whose largest value is the nodes' own context
// (tables.NodeNetID).
const MaxNetworkID = tables.NodeNetID - 1

// NetworkReconciler gives each Network its ID and each node a block of every
// l3 network, and reports both in the Network's status.
type NetworkReconciler struct {
	// Client reads from the cache and writes to the API server.
	Client client.Client
	// APIReader reads straight from the API server: allocation decisions
	// are made from it so a stale cache cannot double-allocate.
	APIReader client.Reader
	Recorder  record.EventRecorder
	// ReleaseGrace is how long the block of a removed node stays reserved
	// so that every node can withdraw its routes to it first.
	ReleaseGrace time.Duration

	now func() time.Time
}

// SetupWithManager registers the reconciler with one worker.
func (r *NetworkReconciler) SetupWithManager(mgr ctrl.Manager) error {
	if r.now == nil {
		r.now = time.Now
	}
	return ctrl.NewControllerManagedBy(mgr).
		Named("network").
		For(&lacev1.Network{}, builder.WithPredicates(predicate.GenerationChangedPredicate{})).
		Watches(&corev1.Node{}, handler.EnqueueRequestsFromMapFunc(r.allNetworks),
			builder.WithPredicates(nodeMembershipChanged())).
		Watches(&lacev1.Allocation{}, handler.EnqueueRequestsFromMapFunc(func(_ context.Context, o client.Object) []reconcile.Request {
			if n := o.(*lacev1.Allocation).Spec.Network; n != "" {
				return []reconcile.Request{{NamespacedName: types.NamespacedName{Name: n}}}
			}
			return nil
		}), builder.WithPredicates(predicates.SpecOrLifecycleChanged())).
		WithOptions(controller.Options{MaxConcurrentReconciles: 1}).
		Complete(r)
}

// nodeMembershipChanged passes node creation and deletion; node status and
// heartbeat updates do not change who needs a block.
func nodeMembershipChanged() predicate.Predicate {
	return predicate.Funcs{
		CreateFunc: func(event.CreateEvent) bool { return true },
		DeleteFunc: func(event.DeleteEvent) bool { return true },
		UpdateFunc: func(e event.UpdateEvent) bool {
			return (e.ObjectOld.GetDeletionTimestamp() == nil) != (e.ObjectNew.GetDeletionTimestamp() == nil)
		},
		GenericFunc: func(event.GenericEvent) bool { return false },
	}
}

func (r *NetworkReconciler) allNetworks(ctx context.Context, _ client.Object) []reconcile.Request {
	var nets lacev1.NetworkList
	if err := r.Client.List(ctx, &nets); err != nil {
		log.FromContext(ctx).Error(err, "list networks for node event")
		return nil
	}
	out := make([]reconcile.Request, 0, len(nets.Items))
	for _, n := range nets.Items {
		out = append(out, reconcile.Request{NamespacedName: types.NamespacedName{Name: n.Name}})
	}
	return out
}

// Reconcile implements reconcile.Reconciler.
func (r *NetworkReconciler) Reconcile(ctx context.Context, req reconcile.Request) (reconcile.Result, error) {
	logger := log.FromContext(ctx).WithValues("network", req.Name)
	ctx = log.IntoContext(ctx, logger)

	var nw lacev1.Network
	if err := r.Client.Get(ctx, req.NamespacedName, &nw); err != nil {
		if !apierrors.IsNotFound(err) {
			return reconcile.Result{}, fmt.Errorf("get network: %w", err)
		}
		// The network is gone: release its blocks (two-phase).
		return r.releaseAll(ctx, req.Name, "")
	}

	status := nw.Status.DeepCopy()
	status.ObservedGeneration = nw.Generation
	if err := r.ensureID(ctx, &nw, status); err != nil {
		return reconcile.Result{}, err
	}

	var result reconcile.Result
	if nw.Spec.Type == lacev1.NetworkTypeL3 {
		res, err := r.allocateBlocks(ctx, &nw, status)
		if err != nil {
			return reconcile.Result{}, err
		}
		result = res
	} else {
		status.Blocks = nil
		meta.RemoveStatusCondition(&status.Conditions, ConditionBlocksAllocated)
		// Allocations left from an earlier l3 network of the same name.
		res, err := r.releaseAll(ctx, nw.Name, "")
		if err != nil {
			return reconcile.Result{}, err
		}
		result = res
	}

	ready := metav1.Condition{Type: lacev1.ConditionReady, Status: metav1.ConditionTrue, Reason: ReasonIDAssigned,
		Message: fmt.Sprintf("network ID %d", status.ID), ObservedGeneration: nw.Generation}
	switch c := meta.FindStatusCondition(status.Conditions, ConditionBlocksAllocated); {
	case status.ID == 0:
		ready.Status, ready.Reason, ready.Message = metav1.ConditionFalse, ReasonIDsExhausted,
			fmt.Sprintf("all %d network IDs are in use", MaxNetworkID)
	case c != nil && c.Status != metav1.ConditionTrue:
		ready.Status, ready.Reason, ready.Message = metav1.ConditionFalse, c.Reason, c.Message
	}
	meta.SetStatusCondition(&status.Conditions, ready)

	if !equality.Semantic.DeepEqual(&nw.Status, status) {
		nw.Status = *status
		if err := r.Client.Status().Update(ctx, &nw); err != nil {
			return reconcile.Result{}, fmt.Errorf("update network status: %w", err)
		}
	}
	return result, nil
}

// ensureID assigns the network a numeric ID once, and repairs duplicates
// (left by a restore from backup, say): the older network keeps the ID.
func (r *NetworkReconciler) ensureID(ctx context.Context, nw *lacev1.Network, status *lacev1.NetworkStatus) error {
	var nets lacev1.NetworkList
	if err := r.APIReader.List(ctx, &nets); err != nil {
		return fmt.Errorf("list networks: %w", err)
	}
	used := map[int32]bool{}
	for _, other := range nets.Items {
		if other.UID == nw.UID || other.Status.ID == 0 {
			continue
		}
		if other.Status.ID == status.ID && olderThan(&other, nw) {
			r.Recorder.Eventf(nw, corev1.EventTypeWarning, ReasonDuplicateNetworkID,
				"network ID %d is also held by older network %s: assigning a new one", status.ID, other.Name)
			status.ID = 0
		}
		used[other.Status.ID] = true
	}
	if status.ID != 0 {
		return nil
	}
	id, ok := ipam.NextID(used, MaxNetworkID)
	if !ok {
		r.Recorder.Eventf(nw, corev1.EventTypeWarning, ReasonIDsExhausted, "all %d network IDs are in use", MaxNetworkID)
		return nil
	}
	status.ID = id
	log.FromContext(ctx).Info("assigned network ID", "id", id)
	return nil
}

func olderThan(a, b *lacev1.Network) bool {
	if !a.CreationTimestamp.Equal(&b.CreationTimestamp) {
		return a.CreationTimestamp.Before(&b.CreationTimestamp)
	}
	return a.Name < b.Name
}

// pools returns the block pools of an l3 network, IPv4 first.
func pools(nw *lacev1.Network) ([]ipam.Pool, error) {
	var out []ipam.Pool
	for _, s := range []*lacev1.Subnet{nw.Spec.IPv4Subnet, nw.Spec.IPv6Subnet} {
		if s == nil || s.HostLocalPrefixLength == nil {
			continue
		}
		pfx, err := netip.ParsePrefix(string(s.Prefix))
		if err != nil {
			return nil, fmt.Errorf("parse subnet %q: %w", s.Prefix, err)
		}
		p, err := ipam.NewPool(pfx, int(*s.HostLocalPrefixLength))
		if err != nil {
			return nil, fmt.Errorf("subnet %s: %w", s.Prefix, err)
		}
		out = append(out, p)
	}
	return out, nil
}

// AllocationName is the name of the Allocation of network on node. Network
// names are DNS labels (no dots), so the name is unambiguous; it is hashed
// when it would exceed the object name limit.
func AllocationName(network, node string) string {
	name := network + "." + node
	if len(name) <= 253 {
		return name
	}
	sum := sha256.Sum256([]byte(node))
	return network + "." + node[:253-len(network)-18] + "-" + hex.EncodeToString(sum[:])[:16]
}

// allocateBlocks makes sure every node has exactly one Allocation of the
// network, releases those of removed nodes, and fills status.Blocks and the
// BlocksAllocated condition.
func (r *NetworkReconciler) allocateBlocks(ctx context.Context, nw *lacev1.Network, status *lacev1.NetworkStatus) (reconcile.Result, error) {
	logger := log.FromContext(ctx)
	pls, err := pools(nw)
	if err != nil {
		return reconcile.Result{}, err
	}
	nodeByName, err := nodesByName(ctx, r.Client)
	if err != nil {
		return reconcile.Result{}, err
	}
	allocs, err := r.listAllocations(ctx, nw.Name)
	if err != nil {
		return reconcile.Result{}, err
	}

	used := make([]map[uint64]bool, len(pls))
	for i := range used {
		used[i] = map[uint64]bool{}
	}
	// Every allocation of this network name, live or being released, holds
	// its blocks until it is gone.
	for _, a := range allocs {
		for _, s := range a.Spec.Prefixes {
			pfx, err := netip.ParsePrefix(string(s))
			if err != nil {
				continue
			}
			for i, p := range pls {
				if idx, ok := p.Index(pfx); ok {
					used[i][idx] = true
				}
			}
		}
	}

	var requeue time.Duration
	haveBlock := map[string]bool{}
	// Oldest first, so that of two allocations for one node the older stays.
	sort.Slice(allocs, func(i, j int) bool {
		return allocs[i].CreationTimestamp.Before(&allocs[j].CreationTimestamp) ||
			(allocs[i].CreationTimestamp.Equal(&allocs[j].CreationTimestamp) && allocs[i].Name < allocs[j].Name)
	})
	for i := range allocs {
		a := &allocs[i]
		if a.DeletionTimestamp != nil {
			d, err := r.finishRelease(ctx, a)
			if err != nil {
				return reconcile.Result{}, err
			}
			requeue = minPositive(requeue, d)
			continue
		}
		reason := ""
		switch {
		case a.Labels[lacev1.LabelNetworkUID] != string(nw.UID):
			reason = "left by an earlier network of the same name"
		case !fitsPools(a, pls):
			reason = "prefixes do not match the network's subnets"
		case haveBlock[a.Spec.Node]:
			reason = "node already has an allocation of this network"
		case nodeByName[a.Spec.Node] == nil:
			gone, err := nodeGone(ctx, r.APIReader, a.Spec.Node)
			if err != nil {
				return reconcile.Result{}, err
			}
			if gone {
				reason = "node was removed"
			}
		}
		if reason == "" {
			haveBlock[a.Spec.Node] = true
			continue
		}
		logger.Info("releasing allocation", "allocation", a.Name, "node", a.Spec.Node, "reason", reason)
		if err := r.Client.Delete(ctx, a); client.IgnoreNotFound(err) != nil {
			return reconcile.Result{}, fmt.Errorf("release allocation %s: %w", a.Name, err)
		}
		requeue = minPositive(requeue, r.ReleaseGrace+time.Second)
	}

	names := make([]string, 0, len(nodeByName))
	for n, node := range nodeByName {
		if !haveBlock[n] && node.DeletionTimestamp == nil {
			names = append(names, n)
		}
	}
	sort.Strings(names)
	var starved []string
	for _, n := range names {
		prefixes := make([]lacev1.CIDR, 0, len(pls))
		idxs := make([]uint64, len(pls))
		exhausted := false
		for i, p := range pls {
			idx, ok := p.LowestFree(used[i])
			if !ok {
				exhausted = true
				break
			}
			idxs[i] = idx
			prefixes = append(prefixes, lacev1.CIDR(p.Block(idx).String()))
		}
		if exhausted {
			starved = append(starved, n)
			continue
		}
		if err := r.createAllocation(ctx, nw, nodeByName[n], prefixes); err != nil {
			if apierrors.IsAlreadyExists(err) {
				// The previous allocation under this name is still being
				// released; try again when it is gone.
				requeue = minPositive(requeue, time.Second)
				continue
			}
			return reconcile.Result{}, err
		}
		for i := range pls {
			used[i][idxs[i]] = true
		}
		haveBlock[n] = true
		logger.Info("allocated blocks", "node", n, "prefixes", prefixes)
	}

	status.Blocks = status.Blocks[:0]
	for i, p := range pls {
		fam := lacev1.IPv4
		if p.Prefix.Addr().Is6() {
			fam = lacev1.IPv6
		}
		status.Blocks = append(status.Blocks, lacev1.BlockUsage{Family: fam, Allocated: int32(len(used[i])), Capacity: p.Capacity32()})
	}
	cond := metav1.Condition{Type: ConditionBlocksAllocated, Status: metav1.ConditionTrue, Reason: ReasonAllocated,
		Message: fmt.Sprintf("%d node(s) hold a block", len(haveBlock)), ObservedGeneration: nw.Generation}
	if len(starved) > 0 {
		var sizes []string
		for _, p := range pls {
			sizes = append(sizes, fmt.Sprintf("/%d in %s", p.BlockLen, p.Prefix))
		}
		cond.Status, cond.Reason = metav1.ConditionFalse, ReasonSubnetExhausted
		cond.Message = fmt.Sprintf("no free block (%s) for node(s) %s", strings.Join(sizes, ", "), strings.Join(starved, ", "))
		// Warn when the problem appears or changes, not at every
		// reconcile that finds it unchanged: the condition says it still is.
		if !conditionUnchanged(nw.Status.Conditions, cond) {
			for _, n := range starved {
				msg := fmt.Sprintf("network %s has no free block (%s) for node %s", nw.Name, strings.Join(sizes, ", "), n)
				r.Recorder.Event(nw, corev1.EventTypeWarning, ReasonSubnetExhausted, msg)
				r.Recorder.Event(nodeByName[n], corev1.EventTypeWarning, ReasonSubnetExhausted, msg)
			}
		}
		logger.Info("subnet exhausted", "nodes", starved)
	}
	meta.SetStatusCondition(&status.Conditions, cond)
	return reconcile.Result{RequeueAfter: requeue}, nil
}

// conditionUnchanged reports whether conds already hold c with the same
// status, reason and message.
func conditionUnchanged(conds []metav1.Condition, c metav1.Condition) bool {
	old := meta.FindStatusCondition(conds, c.Type)
	return old != nil && old.Status == c.Status && old.Reason == c.Reason && old.Message == c.Message
}

func fitsPools(a *lacev1.Allocation, pls []ipam.Pool) bool {
	if len(a.Spec.Prefixes) != len(pls) {
		return false
	}
	for i, p := range pls {
		pfx, err := netip.ParsePrefix(string(a.Spec.Prefixes[i]))
		if err != nil {
			return false
		}
		if _, ok := p.Index(pfx); !ok {
			return false
		}
	}
	return true
}

func (r *NetworkReconciler) createAllocation(ctx context.Context, nw *lacev1.Network, node *corev1.Node, prefixes []lacev1.CIDR) error {
	a := &lacev1.Allocation{
		ObjectMeta: metav1.ObjectMeta{
			Name: AllocationName(nw.Name, node.Name),
			Labels: map[string]string{
				lacev1.LabelNetwork:    nw.Name,
				lacev1.LabelNetworkUID: string(nw.UID),
				lacev1.LabelNode:       node.Name,
			},
			Finalizers: []string{lacev1.FinalizerBlockRelease},
		},
		Spec: lacev1.AllocationSpec{Network: nw.Name, Node: node.Name, Prefixes: prefixes},
	}
	// Owned by the Node (garbage-collected with it) and by the Network.
	if err := controllerutil.SetControllerReference(node, a, r.Client.Scheme()); err != nil {
		return fmt.Errorf("own allocation by node: %w", err)
	}
	if err := controllerutil.SetOwnerReference(nw, a, r.Client.Scheme()); err != nil {
		return fmt.Errorf("own allocation by network: %w", err)
	}
	for i := range a.OwnerReferences {
		a.OwnerReferences[i].BlockOwnerDeletion = nil
	}
	if err := r.Client.Create(ctx, a); err != nil {
		return fmt.Errorf("create allocation %s: %w", a.Name, err)
	}
	return nil
}

// finishRelease ends the second phase of a release: once the grace period
// since deletion has passed, the finalizer goes and the blocks are free. It
// returns how long to wait otherwise.
func (r *NetworkReconciler) finishRelease(ctx context.Context, a *lacev1.Allocation) (time.Duration, error) {
	if !controllerutil.ContainsFinalizer(a, lacev1.FinalizerBlockRelease) {
		return 0, nil
	}
	left := a.DeletionTimestamp.Add(r.ReleaseGrace).Sub(r.now())
	if left > 0 {
		return left + 100*time.Millisecond, nil
	}
	patch := client.MergeFromWithOptions(a.DeepCopy(), client.MergeFromWithOptimisticLock{})
	controllerutil.RemoveFinalizer(a, lacev1.FinalizerBlockRelease)
	if err := r.Client.Patch(ctx, a, patch); client.IgnoreNotFound(err) != nil {
		return 0, fmt.Errorf("free blocks of %s: %w", a.Name, err)
	}
	log.FromContext(ctx).Info("blocks free for reuse", "allocation", a.Name, "prefixes", a.Spec.Prefixes)
	return 0, nil
}

// releaseAll releases every allocation of a network name whose UID is not
// keep (all of them when keep is empty).
func (r *NetworkReconciler) releaseAll(ctx context.Context, network string, keep types.UID) (reconcile.Result, error) {
	allocs, err := r.listAllocations(ctx, network)
	if err != nil {
		return reconcile.Result{}, err
	}
	var requeue time.Duration
	for i := range allocs {
		a := &allocs[i]
		if keep != "" && a.Labels[lacev1.LabelNetworkUID] == string(keep) {
			continue
		}
		if a.DeletionTimestamp == nil {
			if err := r.Client.Delete(ctx, a); client.IgnoreNotFound(err) != nil {
				return reconcile.Result{}, fmt.Errorf("release allocation %s: %w", a.Name, err)
			}
			requeue = minPositive(requeue, r.ReleaseGrace+time.Second)
			continue
		}
		d, err := r.finishRelease(ctx, a)
		if err != nil {
			return reconcile.Result{}, err
		}
		requeue = minPositive(requeue, d)
	}
	return reconcile.Result{RequeueAfter: requeue}, nil
}

func (r *NetworkReconciler) listAllocations(ctx context.Context, network string) ([]lacev1.Allocation, error) {
	var list lacev1.AllocationList
	if err := r.APIReader.List(ctx, &list, client.MatchingLabels{lacev1.LabelNetwork: network}); err != nil {
		return nil, fmt.Errorf("list allocations of %s: %w", network, err)
	}
	out := list.Items[:0]
	for _, a := range list.Items {
		if a.Spec.Network == network {
			out = append(out, a)
		}
	}
	return out, nil
}

// nodesByName lists the nodes from the cache.
func nodesByName(ctx context.Context, c client.Reader) (map[string]*corev1.Node, error) {
	var nodes corev1.NodeList
	if err := c.List(ctx, &nodes); err != nil {
		return nil, fmt.Errorf("list nodes: %w", err)
	}
	out := make(map[string]*corev1.Node, len(nodes.Items))
	for i := range nodes.Items {
		out[nodes.Items[i].Name] = &nodes.Items[i]
	}
	return out, nil
}

// nodeGone confirms with the API server that a node the cache does not know
// really is gone: blocks are never released because a cache missed a node.
func nodeGone(ctx context.Context, reader client.Reader, name string) (bool, error) {
	var n corev1.Node
	err := reader.Get(ctx, types.NamespacedName{Name: name}, &n)
	switch {
	case apierrors.IsNotFound(err):
		return true, nil
	case err != nil:
		return false, fmt.Errorf("get node %s: %w", name, err)
	}
	return false, nil
}

func minPositive(a, b time.Duration) time.Duration {
	if b <= 0 {
		return a
	}
	if a <= 0 || b < a {
		return b
	}
	return a
}
